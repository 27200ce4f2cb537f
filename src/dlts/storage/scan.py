"""The storage scanner: walks one root and aggregates what it holds by user, VC and top-level directory.

``scan_root`` lists directories with ``os.scandir`` in a few daemon worker threads and aggregates in the
calling thread, so memory is bounded by the aggregates (users, VCs, the directories down to
``top_dirs_depth``) and the directories still to list, never by the number of files; only files with
more than one hard link are remembered, by ``(st_dev, st_ino)``, so each is counted once. It never
follows a symlink (a link counts as the small file it is), never crosses into another file system
(``st_dev``), and counts what it may not read. Every file-system call runs in a worker: a directory
whose listing takes longer than ``dir_timeout_s`` makes the scan stop with status ``hung`` (the stuck
worker is left behind, and the next scan of that root reports it hung at once while it still is), so
the caller is never blocked past its deadlines.

What a scan finds (``ScanResult``, its sums and statuses) is ``dlts.storage.scan_result``'s, shared
with the walk by worker processes (``dlts.storage.parallel``); ``ScanResult.to_dict()`` is the
document ``dlts storage scan --json`` prints and the storage manager records (docs/storage.md).
"""

from __future__ import annotations

import heapq
import os
import queue
import stat
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from dlts.storage import parallel
from dlts.storage.scan_result import (
    FAILED,
    HUNG,
    TIMEOUT,
    Owners,
    ScanResult,
    Totals,
    finish,
    leave_behind,
    still_hung,
)
from dlts.storage.settings import StorageRoot, StorageSettings

# -- the file-system side: one directory listed by a worker -------------------------------------------

class _Entry(NamedTuple):  # a tuple, not a dataclass: one is made per file, and cheaply
    name: str
    is_dir: bool
    uid: int
    dev: int
    ino: int
    nlink: int
    allocated: int
    apparent: int
    mtime: float


def _list_dir(path: str) -> tuple[list[_Entry], list[tuple[str, str]]]:
    """The entries of one directory (lstat'ed, symlinks not followed) and the (name, why) of those
    that could not be stat'ed."""
    entries, failed = [], []
    with os.scandir(path) as it:
        for entry in it:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while we looked
            except OSError as exc:
                failed.append((entry.name, exc.strerror or str(exc)))
                continue
            entries.append(_Entry(entry.name, stat.S_ISDIR(st.st_mode), st.st_uid, st.st_dev, st.st_ino, st.st_nlink,
                                  st.st_blocks * 512, st.st_size, st.st_mtime))
    return entries, failed


def _statvfs(path: str) -> tuple[os.stat_result, os.statvfs_result]:
    return os.lstat(path), os.statvfs(path)


class _Workers:
    """Daemon threads running file-system calls; a stuck one never holds up the process or its exit."""

    def __init__(self, count: int, name: str):
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.results: queue.SimpleQueue = queue.SimpleQueue()
        self.threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(count)]
        for thread in self.threads:
            thread.start()

    def _work(self) -> None:
        while True:
            task = self.tasks.get()
            if task is None:
                return
            key, fn, arg = task
            try:
                self.results.put((key, fn(arg), None))
            except BaseException as exc:  # noqa: BLE001 - whatever the call raised is the caller's to report
                self.results.put((key, None, exc))

    def submit(self, key: Any, fn: Callable[[str], Any], arg: str) -> None:
        self.tasks.put((key, fn, arg))

    def stop(self) -> list[threading.Thread]:
        for _ in self.threads:
            self.tasks.put(None)
        deadline = time.monotonic() + 0.5
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t for t in self.threads if t.is_alive()]


# -- the scan ---------------------------------------------------------------------------------------

def scan_root(root: StorageRoot, settings: StorageSettings, *, uid_names: Mapping[int, str] | None = None,
              list_dir: Callable[[str], tuple[list[_Entry], list[tuple[str, str]]]] | None = None,
              statvfs: Callable[[str], tuple[Any, Any]] = _statvfs,
              clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time,
              before_dir: Callable[[str], None] | None = None) -> ScanResult:
    """Scan one root; never raises for what it finds (the result's status and message say it).

    The tree is walked by ``settings.scan_processes()`` worker processes (``dlts.storage.walk``);
    with one, or with a ``list_dir`` given (tests: a directory that hangs), by threads in this
    process. ``before_dir``, a module-level function, is called in the worker with each directory's
    path before it is listed (tests: a directory that hangs or fails in a worker process)."""
    base = str(root.path)
    result = ScanResult(base, root.kind, wall_clock())
    started = clock()
    if still_hung(base):
        result.status, result.message = HUNG, f"{base}: an earlier scan is still stuck in the file system; mount hung"
        return result
    owners = Owners(root, uid_names)
    if list_dir is None and settings.scan_processes() > 1:
        done = parallel.scan(root, settings, owners, result, statvfs, clock, started, before_dir)
        if done is not None:
            return done
        result = ScanResult(base, root.kind, result.started_at)
    workers = _Workers(settings.threads_per_root, f"storage-scan{base.replace('/', '-')}")
    try:
        _coordinate(root, settings, owners, workers, result, list_dir or _list_dir, statvfs, clock, started)
    finally:
        stuck = workers.stop()
        if stuck:
            leave_behind(base, stuck)
        result.duration_s = clock() - started
    return result


def _coordinate(root: StorageRoot, settings: StorageSettings, owners: Owners, workers: _Workers, result: ScanResult,
                list_dir, statvfs, clock, started: float) -> None:
    base = str(root.path)
    scan_deadline = started + settings.scan_timeout_s
    inflight: dict[int, tuple[str, float, tuple[str, ...]]] = {}  # task id -> (path, started, parts)
    next_id = 0

    def wait_one() -> tuple[Any, Any, Any] | None:
        """The next finished task, or None after setting status hung/timeout."""
        while True:
            now = clock()
            oldest_key = min(inflight, key=lambda k: inflight[k][1])
            dir_deadline = inflight[oldest_key][1] + settings.dir_timeout_s
            if now >= scan_deadline:
                result.status, result.message = TIMEOUT, f"{base}: scan stopped after scan_timeout_s ({settings.scan_timeout_s:g} s)"
                return None
            if now >= dir_deadline:
                path = inflight[oldest_key][0]
                result.status = HUNG
                result.message = f"{path}: no answer within dir_timeout_s ({settings.dir_timeout_s:g} s); mount {base} hung"
                return None
            try:
                return workers.results.get(timeout=max(0.01, min(dir_deadline, scan_deadline) - now))
            except queue.Empty:
                continue

    # the root itself: its device and the file system's size (statvfs), in a worker like everything else
    inflight[next_id] = (base, clock(), ())
    workers.submit(next_id, statvfs, base)
    next_id += 1
    got = wait_one()
    if got is None:
        return
    _key, value, exc = got
    inflight.clear()
    if exc is not None:
        result.status, result.message = FAILED, f"{base}: {getattr(exc, 'strerror', None) or exc}"
        return
    st, vfs = value
    if not stat.S_ISDIR(st.st_mode):
        result.status, result.message = FAILED, f"{base}: not a directory"
        return
    root_dev = st.st_dev
    result.fs_total_bytes = vfs.f_blocks * vfs.f_frsize
    result.fs_used_bytes = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize

    seen_links: set[tuple[int, int]] = set()
    dir_sizes: dict[tuple[str, ...], list[int]] = {}  # parts -> [allocated, apparent, files]
    dir_owner: dict[tuple[str, ...], str] = {}
    oldest: list[tuple[float, str]] = []  # a max-heap on mtime (negated) of the N oldest files
    pending: list[tuple[str, tuple[str, ...]]] = [(base, ())]
    depth = settings.top_dirs_depth
    keep_oldest = settings.oldest_files

    while pending or inflight:
        while pending and len(inflight) < settings.threads_per_root:
            path, parts = pending.pop()  # depth first: the frontier stays small
            inflight[next_id] = (path, clock(), parts)
            workers.submit(next_id, list_dir, path)
            next_id += 1
        got = wait_one()
        if got is None:
            return
        key, value, exc = got
        path, _t, parts = inflight.pop(key)
        if exc is not None:
            if isinstance(exc, FileNotFoundError):
                result.vanished += 1
            elif isinstance(exc, OSError):
                result.unreadable.add(path, exc.strerror or str(exc))
            else:
                result.unreadable.add(path, repr(exc))
            continue
        result.dirs += 1
        entries, failed = value
        for name, why in failed:
            result.unreadable.add(os.path.join(path, name), why)
        top = parts[0] if parts else None
        chain = [dir_sizes[parts[:n]] for n in range(1, min(len(parts), depth) + 1)]
        sums: dict[int, list] = {}  # this directory's files by uid: [files, allocated, apparent, oldest mtime]
        for e in entries:
            if e.is_dir:
                child = os.path.join(path, e.name)
                if e.dev != root_dev:
                    result.other_fs.add(child)
                    continue
                child_parts = parts + (e.name,)
                if len(child_parts) <= depth:
                    dir_sizes.setdefault(child_parts, [0, 0, 0])
                    dir_owner[child_parts] = owners.user(child_parts[0], e.uid)
                pending.append((child, child_parts))
                continue
            if e.nlink > 1:
                link = (e.dev, e.ino)
                if link in seen_links:
                    result.hardlinks_seen_again += 1
                    continue
                seen_links.add(link)
            mtime = e.mtime
            acc = sums.get(e.uid)
            if acc is None:
                sums[e.uid] = [1, e.allocated, e.apparent, mtime]
            else:
                acc[0] += 1
                acc[1] += e.allocated
                acc[2] += e.apparent
                if mtime < acc[3]:
                    acc[3] = mtime
            if keep_oldest:
                if len(oldest) < keep_oldest:
                    heapq.heappush(oldest, (-mtime, os.path.join(path, e.name)))
                elif -mtime >= oldest[0][0]:  # the path is made only for a file that may get in
                    item = (-mtime, os.path.join(path, e.name))
                    if item > oldest[0]:
                        heapq.heapreplace(oldest, item)
        if sums:
            vc = owners.vc(top)
            by_dir = result.by_directory.setdefault(top if top is not None else ".", Totals())
            for uid, (files, allocated, apparent, oldest_mtime) in sums.items():
                result.total.merge(files, allocated, apparent, oldest_mtime)
                result.by_owner.setdefault((vc, owners.user(top, uid)), Totals()).merge(
                    files, allocated, apparent, oldest_mtime)
                by_dir.merge(files, allocated, apparent, oldest_mtime)
                for sizes in chain:
                    sizes[0] += allocated
                    sizes[1] += apparent
                    sizes[2] += files

    finish(result, owners, settings, dir_sizes, dir_owner, oldest)


def scan_path(path: str, settings: StorageSettings | None = None, **kwargs: Any) -> ScanResult:
    """Scan a path by hand (``dlts storage scan``): the configured root's mapping when it is one."""
    settings = settings or StorageSettings.model_validate({})
    root = settings.root(path) or StorageRoot.model_validate({"path": os.path.abspath(path), "kind": "local"})
    return scan_root(root, settings, **kwargs)
