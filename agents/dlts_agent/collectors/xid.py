"""XID collector: XID events from the kernel log and from NVML event sets, counted once.

Counts and the kernel-log cursor live together in ``AgentState`` (saved in one atomic write after
each round), so a line is counted exactly once across agent restarts. Recent events (inside the
detection window, from this boot, and after the GPU's last successful reset) go to the detectors.
Each source is labelled: the kernel log and NVML usually both see the same XID, so their counts
must not be added.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

from dlts_agent.kernel_log import (
    JournalSource,
    KmsgSource,
    XidLineParser,
    read_boot_id,
    read_boot_time_s,
)
from dlts_agent.model import XidEvent, XidSample
from dlts_agent.nvml import Nvml, NvmlUnavailable
from dlts_agent.state import AgentState

MAX_RECENT = 2000
UNKNOWN_BUS = "unknown"


class XidCollector:
    name = "xid"

    def __init__(
        self,
        state: AgentState,
        *,
        source: str = "kmsg",
        kmsg_path: str = "/dev/kmsg",
        journalctl: str = "journalctl",
        nvml: Nvml | None = None,
        window_s: float = 7200.0,
        proc_root: str = "/proc",
        max_lines_per_round: int = 20000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self.source = source
        self.kmsg_path = kmsg_path
        self.journalctl = journalctl
        self.nvml = nvml
        self.window_s = window_s
        self.proc_root = proc_root
        self.max_lines = max_lines_per_round
        self.clock = clock
        self.parser = XidLineParser()
        self._kmsg: KmsgSource | None = None
        self._journal: JournalSource | None = None

    def collect(self) -> tuple[XidSample, list[str]]:
        errors: list[str] = []
        now = self.clock()
        boot_id = read_boot_id(self.proc_root)
        new_events: list[XidEvent] = []
        readable = True
        if self.source == "kmsg":
            readable = self._read_kmsg(boot_id, new_events, errors)
        elif self.source == "journal":
            readable = self._read_journal(boot_id, new_events, errors)
        else:
            readable = False
        if self.nvml is not None:
            try:
                self.nvml.start()  # normally the gpu collector has; not if it is switched off
            except NvmlUnavailable:
                pass  # the gpu collector (if on) reports why; the kernel log still works
            for index, bus, xid in self.nvml.poll_xid_events():
                new_events.append(XidEvent(now, bus, xid, "nvml", f"NVML XID event {xid} on GPU {index}", boot_id))
        with self.state.lock:
            for ev in new_events:
                bus = ev.bus_id or UNKNOWN_BUS
                if ev.xid is None:
                    self.state.fell_off_bus_counts[bus] = self.state.fell_off_bus_counts.get(bus, 0) + 1
                else:
                    key = (bus, ev.xid, ev.source)
                    self.state.xid_counts[key] = self.state.xid_counts.get(key, 0) + 1
                self.state.recent_xids.append(_to_dict(ev))
            horizon = now - self.window_s
            self.state.recent_xids = [
                e for e in self.state.recent_xids if e["time_s"] >= horizon and e.get("boot_id") == boot_id
            ][-MAX_RECENT:]
            reset_at = dict(self.state.gpu_reset_at)
            recent = tuple(
                ev
                for ev in (_from_dict(e) for e in self.state.recent_xids)
                if ev.time_s > reset_at.get(ev.bus_id or UNKNOWN_BUS, float("-inf"))
            )
            sample = XidSample(
                recent=recent,
                counts=dict(self.state.xid_counts),
                fell_off_bus_counts=dict(self.state.fell_off_bus_counts),
                kernel_log_readable=readable,
            )
        return sample, errors

    def _read_kmsg(self, boot_id: str, out: list[XidEvent], errors: list[str]) -> bool:
        try:
            if self._kmsg is None:
                self._kmsg = KmsgSource(self.kmsg_path, read_boot_time_s(self.proc_root))
            after = self.state.kmsg_seq if self.state.kmsg_boot_id == boot_id else -1
            before_malformed = self._kmsg.malformed
            last = after
            for rec in self._kmsg.read(after, self.max_lines):
                last = max(last, rec.seq)
                parsed = self.parser.feed(rec.message)
                if parsed is not None:
                    out.append(XidEvent(rec.time_s, parsed.bus_id, parsed.xid, "kernel", parsed.message, boot_id))
            with self.state.lock:
                self.state.kmsg_boot_id = boot_id
                self.state.kmsg_seq = last
            bad = self._kmsg.malformed - before_malformed
            if bad:
                errors.append(f"{self.kmsg_path}: skipped {bad} malformed record(s)")
            return True
        except OSError as e:
            errors.append(f"{self.kmsg_path}: kernel log unreadable ({e.strerror or e}); XIDs from NVML events only")
            if self._kmsg is not None:
                self._kmsg.close()
                self._kmsg = None
            return False

    def _read_journal(self, boot_id: str, out: list[XidEvent], errors: list[str]) -> bool:
        if self._journal is None:
            self._journal = JournalSource(self.journalctl)
        before = self._journal.malformed
        try:
            records = self._journal.read(self.state.journal_cursor, self.max_lines)
        except (OSError, subprocess.SubprocessError) as e:
            errors.append(f"journal unreadable ({e}); XIDs from NVML events only")
            return False
        for rec in records:
            parsed = self.parser.feed(rec.message)
            if parsed is not None:
                out.append(XidEvent(rec.time_s, parsed.bus_id, parsed.xid, "kernel", parsed.message, boot_id))
        if records:
            with self.state.lock:
                self.state.journal_cursor = records[-1].cursor
        bad = self._journal.malformed - before
        if bad:
            errors.append(f"journal: skipped {bad} malformed entr(y/ies)")
        return True

    def close(self) -> None:
        if self._kmsg is not None:
            self._kmsg.close()
            self._kmsg = None


def _to_dict(ev: XidEvent) -> dict:
    return {
        "time_s": ev.time_s,
        "bus_id": ev.bus_id,
        "xid": ev.xid,
        "source": ev.source,
        "message": ev.message[:300],
        "boot_id": ev.boot_id,
    }


def _from_dict(d: dict) -> XidEvent:
    return XidEvent(
        float(d["time_s"]),
        d.get("bus_id"),
        d.get("xid"),
        str(d.get("source", "kernel")),
        str(d.get("message", "")),
        str(d.get("boot_id", "")),
    )
