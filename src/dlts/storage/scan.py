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

``ScanResult.to_dict()`` is the document ``dlts storage scan --json`` prints and the storage manager
records (docs/storage.md).
"""

from __future__ import annotations

import heapq
import os
import queue
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from dlts.storage.settings import StorageRoot, StorageSettings

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

COMPLETE, HUNG, TIMEOUT, FAILED = "complete", "hung", "timeout", "failed"
MAX_LISTED_ERRORS = 50  # paths kept per kind of problem (all are counted)

# roots whose earlier scan left a worker stuck in the kernel: {root path: the stuck threads or processes}
_stuck: dict[str, list[threading.Thread | BaseProcess]] = {}
_stuck_lock = threading.Lock()


@dataclass
class Totals:
    files: int = 0
    allocated_bytes: int = 0
    apparent_bytes: int = 0
    oldest_mtime: float | None = None

    def add(self, allocated: int, apparent: int, mtime: float) -> None:
        self.files += 1
        self.allocated_bytes += allocated
        self.apparent_bytes += apparent
        if self.oldest_mtime is None or mtime < self.oldest_mtime:
            self.oldest_mtime = mtime

    def merge(self, files: int, allocated: int, apparent: int, oldest_mtime: float) -> None:
        """Adds one directory's sums (files, bytes, the oldest mtime) at once."""
        self.files += files
        self.allocated_bytes += allocated
        self.apparent_bytes += apparent
        if self.oldest_mtime is None or oldest_mtime < self.oldest_mtime:
            self.oldest_mtime = oldest_mtime

    def to_dict(self) -> dict[str, Any]:
        return {"files": self.files, "allocated_bytes": self.allocated_bytes,
                "apparent_bytes": self.apparent_bytes, "oldest_mtime": self.oldest_mtime}


class Owners:
    """Who owns a file and which VC it counts for, from the root's mapping and the users' uids."""

    def __init__(self, root: StorageRoot, uid_names: Mapping[int, str] | None = None):
        self.root = root
        self.uid_names = {**(uid_names or {}), **root.uid_owners}  # the file's mapping wins

    def user(self, top: str | None, uid: int) -> str:
        if top is not None and top in self.root.dir_owners:
            return self.root.dir_owners[top]
        if top is not None and self.root.owner_by == "directory":
            return top
        return self.uid_names.get(uid, f"uid:{uid}")

    def vc(self, top: str | None) -> str | None:
        if top is not None and top in self.root.vc_dirs:
            return self.root.vc_dirs[top]
        return self.root.vc


def shown(name: str) -> str:
    """A file name as text that a database, a JSON reader and a mail all accept: the bytes of a name
    that is not UTF-8 (which ``os.fsdecode`` keeps as lone surrogates, refused by every encoder) are
    written ``\\xNN``, as ``ls -b`` shows them, so an operator can still find the file."""
    if name.isascii():
        return name
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


@dataclass
class Problems:
    count: int = 0
    paths: list[str] = field(default_factory=list)

    def add(self, path: str, why: str = "") -> None:
        self.count += 1
        if len(self.paths) < MAX_LISTED_ERRORS:
            self.paths.append(shown(f"{path}: {why}" if why else path))


@dataclass
class ScanResult:
    root: str
    kind: str
    started_at: float
    duration_s: float = 0.0
    status: str = COMPLETE
    message: str = ""
    dirs: int = 0
    total: Totals = field(default_factory=Totals)
    by_owner: dict[tuple[str | None, str], Totals] = field(default_factory=dict)  # (vc, user)
    by_directory: dict[str, Totals] = field(default_factory=dict)  # top-level directory ("." : the root's files)
    directory_owner: dict[str, str] = field(default_factory=dict)
    directory_vc: dict[str, str | None] = field(default_factory=dict)
    top_dirs: list[dict[str, Any]] = field(default_factory=list)
    oldest_files: list[dict[str, Any]] = field(default_factory=list)
    hardlinks_seen_again: int = 0
    unreadable: Problems = field(default_factory=Problems)
    other_fs: Problems = field(default_factory=Problems)
    vanished: int = 0
    fs_total_bytes: int | None = None
    fs_used_bytes: int | None = None
    # per-VC totals measured directly (Lustre project or group quotas); None: summed from by_owner
    vc_totals: dict[str, Totals] | None = None
    # each worker process's peak resident size and CPU seconds (user + system); empty when threads walked
    worker_peak_rss_kib: list[int] = field(default_factory=list)
    worker_cpu_s: list[float] = field(default_factory=list)
    worker_start: str | None = None  # how the worker processes started: "fork" or "spawn"; None: threads

    @property
    def errors(self) -> int:
        return self.unreadable.count

    @property
    def fs_used_percent(self) -> float | None:
        if not self.fs_total_bytes or self.fs_used_bytes is None:
            return None
        return round(100.0 * self.fs_used_bytes / self.fs_total_bytes, 2)

    def by_vc(self) -> dict[str | None, Totals]:
        if self.vc_totals is not None:
            return dict(self.vc_totals.items())
        out: dict[str | None, Totals] = {}
        for (vc, _user), t in self.by_owner.items():
            agg = out.setdefault(vc, Totals())
            agg.files += t.files
            agg.allocated_bytes += t.allocated_bytes
            agg.apparent_bytes += t.apparent_bytes
            if t.oldest_mtime is not None and (agg.oldest_mtime is None or t.oldest_mtime < agg.oldest_mtime):
                agg.oldest_mtime = t.oldest_mtime
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root, "kind": self.kind, "started_at": self.started_at, "duration_s": round(self.duration_s, 3),
            "status": self.status, "message": self.message, "dirs": self.dirs, **self.total.to_dict(),
            "hardlinks_seen_again": self.hardlinks_seen_again,
            "errors": self.errors, "unreadable": self.unreadable.paths, "other_filesystems": self.other_fs.count,
            "other_filesystem_paths": self.other_fs.paths, "vanished": self.vanished,
            "filesystem": {"total_bytes": self.fs_total_bytes, "used_bytes": self.fs_used_bytes,
                           "used_percent": self.fs_used_percent},
            "by_user": [{"vc": vc, "user": user, **t.to_dict()} for (vc, user), t in sorted(
                self.by_owner.items(), key=lambda kv: (-kv[1].allocated_bytes, kv[0][1]))],
            "by_vc": [{"vc": vc, **t.to_dict()} for vc, t in sorted(
                self.by_vc().items(), key=lambda kv: (-kv[1].allocated_bytes, kv[0] or ""))],
            "by_directory": [{"directory": d, "owner": self.directory_owner.get(d) or None,
                              "vc": self.directory_vc.get(d), **t.to_dict()} for d, t in sorted(
                self.by_directory.items(), key=lambda kv: (-kv[1].allocated_bytes, kv[0]))],
            "top_dirs": self.top_dirs, "oldest_files": self.oldest_files,
            "worker_peak_rss_kib": self.worker_peak_rss_kib, "worker_cpu_s": self.worker_cpu_s,
            "worker_start": self.worker_start,
        }


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


def still_hung(root: str) -> bool:
    with _stuck_lock:
        alive = [t for t in _stuck.get(root, []) if t.is_alive()]
        if alive:
            _stuck[root] = alive
        else:
            _stuck.pop(root, None)
        return bool(alive)


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
            with _stuck_lock:
                _stuck.setdefault(base, []).extend(stuck)
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


def finish(result: ScanResult, owners: Owners, settings: StorageSettings, dir_sizes: dict[tuple[str, ...], list[int]],
           dir_owner: dict[tuple[str, ...], str], oldest: list[tuple[float, str]]) -> None:
    """The directories' owners and VCs, the biggest directories and the oldest files, from the sums."""
    base = result.root
    for parts in dir_sizes:
        if len(parts) == 1 and parts[0] not in result.by_directory:
            result.by_directory[parts[0]] = Totals()
    result.directory_owner = {parts[0]: dir_owner[parts] for parts in dir_sizes if len(parts) == 1}
    if "." in result.by_directory:
        result.directory_owner["."] = ""
    result.directory_vc = {d: owners.vc(None if d == "." else d) for d in result.by_directory}
    biggest = heapq.nlargest(settings.top_dirs, dir_sizes.items(), key=lambda kv: (kv[1][0], kv[1][1]))
    result.top_dirs = [{"path": shown(os.path.join(base, *parts)), "owner": _shown_or_none(dir_owner.get(parts)),
                        "vc": owners.vc(parts[0]), "allocated_bytes": s[0], "apparent_bytes": s[1], "files": s[2]}
                       for parts, s in biggest]
    result.oldest_files = [{"path": shown(p), "mtime": -m} for m, p in sorted(oldest, reverse=True)]
    # the names the sums are kept under, as they are shown (owners by directory are directory names)
    if not all(d.isascii() for d in result.by_directory) or not all(u.isascii() for _, u in result.by_owner):
        result.by_directory = _rekeyed(result.by_directory, shown)
        result.by_owner = _rekeyed(result.by_owner, lambda key: (key[0], shown(key[1])))
        result.directory_owner = {shown(d): shown(o) for d, o in result.directory_owner.items()}
        result.directory_vc = {shown(d): vc for d, vc in result.directory_vc.items()}


def _shown_or_none(name: str | None) -> str | None:
    return None if name is None else shown(name)


_K = TypeVar("_K")


def _rekeyed(sums: dict[_K, Totals], key: Callable[[_K], _K]) -> dict[_K, Totals]:
    """``sums`` under the keys ``key`` gives; two names shown alike (a name that is the text of
    another's escapes) add up."""
    out: dict[_K, Totals] = {}
    for k, t in sums.items():
        into = out.setdefault(key(k), Totals())
        if t.files:
            into.merge(t.files, t.allocated_bytes, t.apparent_bytes, t.oldest_mtime or 0.0)
    return out


def scan_path(path: str, settings: StorageSettings | None = None, **kwargs: Any) -> ScanResult:
    """Scan a path by hand (``dlts storage scan``): the configured root's mapping when it is one."""
    settings = settings or StorageSettings.model_validate({})
    root = settings.root(path) or StorageRoot.model_validate({"path": os.path.abspath(path), "kind": "local"})
    return scan_root(root, settings, **kwargs)


def iter_rows(result: ScanResult) -> Iterator[dict[str, Any]]:
    """The storage_usage rows of a complete scan: the root's total, each VC, each (VC, user), each
    top-level directory."""
    yield {"vc": None, "user": None, "directory": None, **result.total.to_dict()}
    for vc, t in result.by_vc().items():
        if vc is not None:
            yield {"vc": vc, "user": None, "directory": None, **t.to_dict()}
    for (vc, user), t in result.by_owner.items():
        yield {"vc": vc, "user": user, "directory": None, **t.to_dict()}
    for directory, t in result.by_directory.items():
        owner = result.directory_owner.get(directory) or None
        yield {"vc": result.directory_vc.get(directory), "user": owner, "directory": directory, **t.to_dict()}


# the walk by worker processes, last: it uses the names above
from dlts.storage import parallel  # noqa: E402 - it imports this module's names
