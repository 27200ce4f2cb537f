"""The scan of one root by worker processes (``dlts.storage.walk``), merged into a ``ScanResult``.

The scanning process starts ``settings.scan_processes()`` workers (``fork`` when it runs a single
thread, as ``dlts storage scan`` does, else ``spawn``, safe from the threaded managers process: see
``start_method``), hands the root to one of them and, while a worker is idle and
nothing is queued, lets the busy ones hand back part of their directories, so the tree is split by
subdirectory as it is found. It counts every hard-linked inode once across the workers (their
candidates, by ``(st_dev, st_ino)``: the only per-file memory, and only for ``st_nlink > 1``), adds the
workers' sums at the end, and checks each worker's current directory against ``dir_timeout_s`` and
the whole scan against ``scan_timeout_s``. A worker stuck in the file system is killed where the
kernel lets it and otherwise left behind (``still_hung`` reports the root while it lives), so the
caller never waits past its deadlines.
"""

from __future__ import annotations

import contextlib
import heapq
import multiprocessing
import multiprocessing.connection
import os
import stat
import sys
import threading
import time
import types
from collections import deque
from collections.abc import Callable, Iterator
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any, TypeAlias

from dlts.storage import walk
from dlts.storage.scan_result import (
    COMPLETE,
    FAILED,
    HUNG,
    MAX_LISTED_ERRORS,
    TIMEOUT,
    Owners,
    ScanResult,
    Totals,
    finish,
    leave_behind,
)
from dlts.storage.settings import StorageRoot, StorageSettings

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.context import ForkContext, SpawnContext

POLL_S = 0.05  # how often the deadlines are checked while the workers are busy

# the scanning process's end of a worker's pipe: ("kind", value) each way
# (a string: Connection is generic only in the type stubs)
_Conn: TypeAlias = "Connection[tuple[str, Any], tuple[str, Any]]"


def scan(root: StorageRoot, settings: StorageSettings, owners: Owners, result: ScanResult, statvfs: Callable,
         clock: Callable[[], float], started: float, before_dir: Callable[[str], None] | None) -> ScanResult | None:
    """The scan by worker processes; None when they cannot be started (the caller walks with threads)."""
    base = str(root.path)
    count = settings.scan_processes()
    method = start_method()  # before _root's thread: a thread that has just ended may still be leaving
    ctx: ForkContext | SpawnContext = (multiprocessing.get_context("fork") if method == "fork"
                                       else multiprocessing.get_context("spawn"))
    try:
        slots_started = ctx.RawArray("d", count)
        slots_paths = ctx.RawArray("c", count * walk.PATH_SLOT)
        hungry = ctx.RawValue("i", 0)
    except (OSError, ImportError):  # this user may not read the standard library's files (dropped privileges)
        return None
    procs: list[BaseProcess] = []
    conns: list[_Conn] = []
    try:
        root_st = _root(base, settings, result, statvfs, clock, started)
        if root_st is None:
            return result
        for slot in range(count):
            mine, theirs = ctx.Pipe()
            # a forked worker closes its copies of this process's ends of the pipes: were the scanning
            # process to die, the worker's next message then fails and it ends, instead of waiting
            inherited = tuple(c.fileno() for c in [*conns, mine]) if method == "fork" else None
            proc = ctx.Process(target=walk.work, name=f"storage-scan{base.replace('/', '-')}-{slot}", daemon=True,
                               args=(theirs, slot, slots_started, slots_paths, hungry, root_st.st_dev,
                                     settings.top_dirs_depth, settings.oldest_files, before_dir, inherited))
            try:
                with _no_main_module() if method == "spawn" else contextlib.nullcontext():
                    proc.start()
            except (OSError, ImportError):  # this user may not run the interpreter (e.g. dropped privileges)
                mine.close()
                theirs.close()
                return None
            theirs.close()
            procs.append(proc)
            conns.append(mine)
        if not _ready(conns, settings):
            return None  # a worker died on its way up: this user may not run the interpreter
        result.worker_start = method
        _run(base, settings, owners, result, procs, conns, slots_started, slots_paths, hungry, clock, started)
    finally:
        stuck = _stop(procs, conns, result.status == COMPLETE)
        if stuck:
            leave_behind(base, stuck)
        result.duration_s = clock() - started
    return result


def start_method() -> str:
    """``fork`` when this process runs one thread, else ``spawn``.

    A forked worker starts in a few milliseconds and imports nothing (a spawned one starts a new
    interpreter: ~0.1 s of CPU and more on a busy machine, which is most of a small scan's time). Fork
    is unsafe only when another thread may hold a lock (of the interpreter, the allocator, logging, a
    database pool) at the moment of the fork: the child would inherit it held, forever. With one
    thread there is no such lock; ``dlts storage scan`` on an unconfigured path runs one. The threads
    are counted in /proc/self/task (every thread of the process, those a C library started as well),
    else by ``threading``. The managers process runs many threads: it spawns. The forked worker runs
    only ``dlts.storage.walk.work`` and leaves by ``os._exit`` (no atexit handlers, no finalizers on
    inherited database connections or files)."""
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        threads = threading.active_count()
    if threads == 1 and "fork" in multiprocessing.get_all_start_methods():
        return "fork"
    return "spawn"


@contextlib.contextmanager
def _no_main_module() -> Iterator[None]:
    """While a worker is started: ``spawn`` would run the script that started this process again in
    the worker (the ``dlts`` console script: all of dlts.cli, ~0.3 s of CPU and ~25 MiB per worker,
    for nothing: the worker needs only dlts.storage.walk). An empty ``__main__`` has no path to run."""
    real = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = real


def _root(base: str, settings: StorageSettings, result: ScanResult, statvfs: Callable, clock: Callable[[], float],
          started: float) -> os.stat_result | None:
    """The root's lstat and statvfs, in a daemon thread: a hung mount costs dir_timeout_s, not the caller."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = statvfs(base)
        except Exception as exc:  # noqa: BLE001  (the scan's outcome: failed, with the message)
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"storage-statvfs{base.replace('/', '-')}", daemon=True)
    thread.start()
    thread.join(min(settings.dir_timeout_s, max(0.0, started + settings.scan_timeout_s - clock())))
    if thread.is_alive():
        leave_behind(base, [thread])
        result.status = HUNG
        result.message = f"{base}: no answer within dir_timeout_s ({settings.dir_timeout_s:g} s); mount {base} hung"
        return None
    if "error" in box:
        exc = box["error"]
        result.status, result.message = FAILED, f"{base}: {getattr(exc, 'strerror', None) or exc}"
        return None
    st, vfs = box["value"]
    if not stat.S_ISDIR(st.st_mode):
        result.status, result.message = FAILED, f"{base}: not a directory"
        return None
    result.fs_total_bytes = vfs.f_blocks * vfs.f_frsize
    result.fs_used_bytes = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
    return st


def _ready(conns: list[_Conn], settings: StorageSettings) -> bool:
    """Whether every worker process came up (said "ready") within dir_timeout_s."""
    deadline = time.monotonic() + min(settings.dir_timeout_s, 60.0)
    waiting = {id(conn): conn for conn in conns}
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        for ready in multiprocessing.connection.wait(list(waiting.values()), timeout=left):
            conn = waiting.pop(id(ready))
            try:
                kind, _pid = conn.recv()
            except (EOFError, OSError):
                return False
            if kind != "ready":
                return False
    return True


class _Merge:
    """The scanning process's side: hard-link candidates counted once, then the workers' sums."""

    def __init__(self, settings: StorageSettings):
        self.keep_oldest = settings.oldest_files
        self.seen_links: set[tuple[int, int]] = set()
        self.seen_again = 0
        self.sums: dict[tuple[tuple[str, ...], int], list] = {}
        self.dir_uids: dict[tuple[str, ...], int] = {}
        self.oldest: list[tuple[float, str]] = []

    def add(self, key: tuple[tuple[str, ...], int], files: int, allocated: int, apparent: int, mtime: float) -> None:
        acc = self.sums.get(key)
        if acc is None:
            self.sums[key] = [files, allocated, apparent, mtime]
        else:
            acc[0] += files
            acc[1] += allocated
            acc[2] += apparent
            if mtime < acc[3]:
                acc[3] = mtime

    def old(self, mtime: float, path: str) -> None:
        if not self.keep_oldest:
            return
        item = (-mtime, path)
        if len(self.oldest) < self.keep_oldest:
            heapq.heappush(self.oldest, item)
        elif item > self.oldest[0]:
            heapq.heapreplace(self.oldest, item)

    def links(self, candidates: list[tuple]) -> None:
        for key, uid, allocated, apparent, mtime, prefix, path in candidates:
            if key in self.seen_links:
                self.seen_again += 1
                continue
            self.seen_links.add(key)
            self.add((prefix, uid), 1, allocated, apparent, mtime)
            self.old(mtime, path)

    def worker(self, payload: dict[str, Any], result: ScanResult) -> None:
        self.links(payload["links"])
        for key, (files, allocated, apparent, mtime) in payload["sums"].items():
            self.add(key, files, allocated, apparent, mtime)
        self.dir_uids.update(payload["dir_uids"])
        for negated, path in payload["oldest"]:
            self.old(-negated, path)
        self.seen_again += payload["seen_again"]
        result.worker_peak_rss_kib.append(payload["peak_rss_kib"])
        result.worker_cpu_s.append(round(payload["cpu_s"], 3))
        result.dirs += payload["dirs"]
        result.vanished += payload["vanished"]
        for problems, paths, count in ((result.unreadable, payload["unreadable"], payload["unreadable_count"]),
                                       (result.other_fs, payload["other_fs"], payload["other_fs_count"])):
            problems.count += count
            problems.paths.extend(paths[: max(0, MAX_LISTED_ERRORS - len(problems.paths))])

    def into(self, result: ScanResult, owners: Owners, settings: StorageSettings) -> None:
        result.hardlinks_seen_again = self.seen_again
        dir_sizes: dict[tuple[str, ...], list[int]] = {parts: [0, 0, 0] for parts in self.dir_uids}
        dir_owner = {parts: owners.user(parts[0], uid) for parts, uid in self.dir_uids.items()}
        by_owner_key: dict[tuple[str | None, int], tuple[str | None, str]] = {}
        for (prefix, uid), (files, allocated, apparent, mtime) in self.sums.items():
            top = prefix[0] if prefix else None
            result.total.merge(files, allocated, apparent, mtime)
            who = by_owner_key.get((top, uid))
            if who is None:
                who = by_owner_key[(top, uid)] = (owners.vc(top), owners.user(top, uid))
            result.by_owner.setdefault(who, Totals()).merge(files, allocated, apparent, mtime)
            result.by_directory.setdefault(top if top is not None else ".", Totals()).merge(
                files, allocated, apparent, mtime)
            for n in range(1, len(prefix) + 1):
                sizes = dir_sizes.setdefault(prefix[:n], [0, 0, 0])
                sizes[0] += allocated
                sizes[1] += apparent
                sizes[2] += files
        finish(result, owners, settings, dir_sizes, dir_owner, self.oldest)


def _run(base: str, settings: StorageSettings, owners: Owners, result: ScanResult, procs: list[BaseProcess],
         conns: list[_Conn],
         slots_started: Any, slots_paths: Any, hungry: Any, clock: Callable[[], float], started: float) -> None:
    merge = _Merge(settings)
    scan_deadline = started + settings.scan_timeout_s
    tasks: deque[tuple[str, tuple[str, ...]]] = deque([(base, ())])
    idle = list(range(len(conns)))
    busy: set[int] = set()
    slot_of = {id(conn): slot for slot, conn in enumerate(conns)}

    def expired() -> bool:
        if clock() >= scan_deadline:
            result.status, result.message = TIMEOUT, f"{base}: scan stopped after scan_timeout_s ({settings.scan_timeout_s:g} s)"
            return True
        now = time.monotonic()
        for slot in busy:
            began = slots_started[slot]
            if began and now - began >= settings.dir_timeout_s:
                result.status = HUNG
                result.message = (f"{walk.slot_path(slots_paths, slot)}: no answer within dir_timeout_s "
                                  f"({settings.dir_timeout_s:g} s); mount {base} hung")
                return True
        return False

    while True:
        while tasks and idle:
            slot = idle.pop()
            conns[slot].send(("walk", [tasks.popleft()]))  # the oldest queued: the shallowest, the biggest
            busy.add(slot)
        if not busy:
            break
        hungry.value = 1 if idle and not tasks else 0
        if expired():
            return
        ready = multiprocessing.connection.wait([conns[s] for s in busy], timeout=POLL_S)
        for conn in ready:
            slot = slot_of[id(conn)]
            try:
                kind, value = conns[slot].recv()
            except (EOFError, OSError):
                result.status = FAILED
                result.message = f"{base}: scan worker {slot} ended unexpectedly (exit code {procs[slot].exitcode})"
                return
            if kind == "more":
                tasks.extend(value)
            elif kind == "links":
                merge.links(value)
            elif kind == "idle":
                merge.links(value)
                busy.discard(slot)
                idle.append(slot)
    hungry.value = 0
    for conn in conns:
        conn.send(("end", None))
    for slot, conn in enumerate(conns):
        waited_since = time.monotonic()
        while True:
            if not conn.poll(POLL_S):
                if clock() >= scan_deadline:
                    result.status = TIMEOUT
                    result.message = f"{base}: scan stopped after scan_timeout_s ({settings.scan_timeout_s:g} s)"
                    return
                if time.monotonic() - waited_since >= settings.dir_timeout_s:
                    result.status, result.message = FAILED, f"{base}: scan worker {slot} sent no result"
                    return
                continue
            try:
                kind, value = conn.recv()
            except (EOFError, OSError):
                result.status = FAILED
                result.message = f"{base}: scan worker {slot} ended unexpectedly (exit code {procs[slot].exitcode})"
                return
            if kind == "result":
                merge.worker(value, result)
                break
            merge.links(value)  # a batch sent before the end
    merge.into(result, owners, settings)


def _stop(procs: list[BaseProcess], conns: list[_Conn], finished: bool) -> list[BaseProcess]:
    """Ends the workers; returns those that would not end (stuck in the file system)."""
    for proc in procs:
        if not finished and proc.is_alive():
            proc.kill()
    deadline = time.monotonic() + 2.0  # a killed worker dies at once unless the kernel holds it
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for conn in conns:
        conn.close()
    stuck = [proc for proc in procs if proc.is_alive()]
    for proc in procs:
        if not proc.is_alive():
            proc.close()
    return stuck
