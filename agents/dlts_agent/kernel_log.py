"""Reading the kernel log and recognising NVIDIA XID and fallen-off-the-bus messages.

Two sources, each with a cursor that the caller persists so every line is seen once across
restarts: ``/dev/kmsg`` (cursor = boot id + record sequence number) and the systemd journal
(cursor = the journal's ``__CURSOR``). ``XidLineParser`` is pure apart from the small state that
joins the multi-line fallen-off-bus message.

/dev/kmsg records look like ``6,1234,5678901,-;NVRM: Xid (PCI:0000:65:00): 79, pid=..., ...``
(priority, sequence, microseconds since boot, flags; then the text). Lines that start with a
space are key=value continuations of the previous record.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

from dlts_agent.nvml import normalize_bus_id


@dataclass(frozen=True)
class KernelRecord:
    seq: int  # kmsg sequence number, or a running index for the journal
    time_s: float  # wall clock
    message: str
    cursor: str = ""  # journal cursor; "" for kmsg


@dataclass(frozen=True)
class ParsedXid:
    bus_id: str | None
    xid: int | None  # None: fallen off the bus without an XID
    message: str


_XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]+:[0-9a-fA-F]+:[0-9a-fA-F]+(?:\.[0-9a-fA-F])?)\): (\d+)\b")
_BUS = r"([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?)"
_FELL_WITH_BUS_RE = re.compile(r"NVRM: .*GPU (?:at )?(?:PCI:)?" + _BUS + r"\b.*fallen off the bus")
_FELL_START_RE = re.compile(r"NVRM: The NVIDIA GPU (?:at )?(?:PCI:)?" + _BUS)
_FELL_RE = re.compile(r"fallen off the bus", re.IGNORECASE)


class XidLineParser:
    """Feed kernel messages in order; get ParsedXid for XID lines and fallen-off-bus messages."""

    # The multi-line message ("The NVIDIA GPU 0000:3b:00.0" / "(PCI ID: ...) installed in this
    # system has" / "fallen off the bus and is not responding to commands.") is split into separate
    # kmsg records; remember the bus id for this many records.
    JOIN_WINDOW = 4

    def __init__(self) -> None:
        self._pending_bus: str | None = None
        self._pending_age = 0

    def feed(self, message: str) -> ParsedXid | None:
        if "NVRM" not in message and "fallen off the bus" not in message:
            self._age()
            return None
        m = _XID_RE.search(message)
        if m:
            self._pending_bus = None
            return ParsedXid(normalize_bus_id(m.group(1)), int(m.group(2)), message.strip())
        m = _FELL_WITH_BUS_RE.search(message)
        if m:
            self._pending_bus = None
            return ParsedXid(normalize_bus_id(m.group(1)), None, message.strip())
        m = _FELL_START_RE.search(message)
        if m and not _FELL_RE.search(message):
            self._pending_bus = normalize_bus_id(m.group(1))
            self._pending_age = 0
            return None
        if _FELL_RE.search(message):
            bus = self._pending_bus
            self._pending_bus = None
            return ParsedXid(bus, None, message.strip())
        self._age()
        return None

    def _age(self) -> None:
        if self._pending_bus is not None:
            self._pending_age += 1
            if self._pending_age > self.JOIN_WINDOW:
                self._pending_bus = None


def parse_kmsg_record(line: str, boot_time_s: float) -> KernelRecord | None:
    """One /dev/kmsg line -> KernelRecord; None for continuation lines and malformed ones."""
    if not line or line[0] == " ":
        return None
    head, sep, text = line.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    if len(fields) < 3:
        return None
    try:
        seq = int(fields[1])
        ts_us = int(fields[2])
    except ValueError:
        return None
    if seq < 0 or ts_us < 0:
        return None
    return KernelRecord(seq=seq, time_s=boot_time_s + ts_us / 1e6, message=text.rstrip("\n"))


class KmsgSource:
    """Reads /dev/kmsg (or a file in the same format) without blocking; keeps the fd open."""

    def __init__(self, path: str, boot_time_s: float) -> None:
        self.path = path
        self.boot_time_s = boot_time_s
        self._fd: int | None = None
        self._buf = b""
        self.malformed = 0

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        return self._fd

    def read(self, after_seq: int, max_records: int) -> Iterator[KernelRecord]:
        """Records with seq > after_seq that are available now (at most max_records)."""
        fd = self._open()
        produced = 0
        while produced < max_records:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break  # /dev/kmsg: nothing more right now
            except OSError as e:
                if e.errno == errno.EPIPE:
                    continue  # records were overwritten before we read them; the next read goes on
                raise
            if not chunk:
                break  # regular file: end of what is written so far
            self._buf += chunk
            *lines, self._buf = self._buf.split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace")
                if not line or line[0] == " ":
                    continue
                rec = parse_kmsg_record(line, self.boot_time_s)
                if rec is None:
                    self.malformed += 1
                    continue
                if rec.seq <= after_seq:
                    continue
                produced += 1
                yield rec

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class JournalSource:
    """``journalctl -k -o json`` after a saved cursor; each entry once."""

    def __init__(self, journalctl: str = "journalctl", timeout_s: float = 10.0) -> None:
        self.journalctl = journalctl
        self.timeout_s = timeout_s
        self.malformed = 0

    def read(self, after_cursor: str, max_records: int) -> list[KernelRecord]:
        argv = [self.journalctl, "-k", "-o", "json", "--no-pager", "-q"]
        argv += [f"--after-cursor={after_cursor}"] if after_cursor else ["-b"]
        proc = subprocess.run(argv, capture_output=True, timeout=self.timeout_s, check=False)
        if proc.returncode != 0:
            raise OSError(
                f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode(errors='replace').strip()[:300]}"
            )
        out: list[KernelRecord] = []
        for i, raw in enumerate(proc.stdout.splitlines()):
            if len(out) >= max_records:
                break
            try:
                entry = json.loads(raw)
                msg = entry.get("MESSAGE", "")
                if isinstance(msg, list):  # journald emits non-UTF-8 messages as byte arrays
                    msg = bytes(msg).decode("utf-8", "replace")
                out.append(
                    KernelRecord(
                        seq=i,
                        time_s=int(entry["__REALTIME_TIMESTAMP"]) / 1e6,
                        message=str(msg),
                        cursor=str(entry["__CURSOR"]),
                    )
                )
            except (ValueError, KeyError, TypeError):
                self.malformed += 1
        return out


def read_boot_id(proc_root: str) -> str:
    with open(os.path.join(proc_root, "sys/kernel/random/boot_id"), encoding="ascii") as f:
        return f.read().strip()


def read_boot_time_s(proc_root: str) -> float:
    with open(os.path.join(proc_root, "stat"), encoding="ascii") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise ValueError(f"{proc_root}/stat has no btime line")
