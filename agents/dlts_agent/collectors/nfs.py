"""NFS collector: each configured mount must be mounted and answer a stat() within a timeout.

A hung NFS server leaves stat() blocked in the kernel (uninterruptible), so the stat runs in a
daemon thread and we stop waiting after ``timeout_s``. While a stat of a mount is still stuck we do
not start another one for it: the mount is reported hung again without piling up threads.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from dlts_agent.model import NfsMountSample


class NfsCollector:
    name = "nfs"

    def __init__(
        self,
        mounts: tuple[str, ...],
        timeout_s: float = 5.0,
        proc_root: str = "/proc",
        stat: Callable[[str], object] = os.stat,
    ) -> None:
        self.mounts = mounts
        self.timeout_s = timeout_s
        self.proc_root = proc_root
        self._stat = stat
        self._inflight: dict[str, threading.Thread] = {}

    def collect(self) -> tuple[tuple[NfsMountSample, ...], list[str]]:
        errors: list[str] = []
        table = self._mount_table(errors)
        out = []
        for mount in self.mounts:
            mount_norm = os.path.normpath(mount)
            fstype = table.get(mount_norm)
            if fstype is None:
                out.append(NfsMountSample(mount, mounted=False, responsive=False, stat_duration_s=None))
                continue
            responsive, duration = self._probe(mount_norm)
            out.append(NfsMountSample(mount, True, responsive, duration, fstype))
        return tuple(out), errors

    def _mount_table(self, errors: list[str]) -> dict[str, str]:
        table: dict[str, str] = {}
        with open(os.path.join(self.proc_root, "mounts"), encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                parts = line.split()
                if len(parts) < 3:
                    errors.append(f"{self.proc_root}/mounts line {n}: malformed {line.strip()!r}")
                    continue
                # mount points escape spaces as \040 in /proc/mounts
                table[parts[1].replace("\\040", " ")] = parts[2]
        return table

    def _probe(self, mount: str) -> tuple[bool, float | None]:
        stuck = self._inflight.get(mount)
        if stuck is not None and stuck.is_alive():
            return False, None
        done = threading.Event()
        failed: list[BaseException] = []

        def worker() -> None:
            try:
                self._stat(mount)
            except OSError as e:
                failed.append(e)
            finally:
                done.set()

        t = threading.Thread(target=worker, name=f"nfs-stat:{mount}", daemon=True)
        start = time.monotonic()
        t.start()
        if not done.wait(self.timeout_s):
            self._inflight[mount] = t
            return False, None
        self._inflight.pop(mount, None)
        duration = time.monotonic() - start
        return (not failed), duration

    def close(self) -> None:
        pass
