"""What a storage scan finds, whoever walked the tree (``dlts.storage.scan``'s threads or
``dlts.storage.parallel``'s worker processes): the sums (``Totals``) by owner, VC and directory, the
``ScanResult`` they add up to, its statuses, the rows the storage manager records, and the roots
whose earlier scan left a worker stuck in the file system.
"""

from __future__ import annotations

import heapq
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from dlts.storage.settings import StorageRoot, StorageSettings

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

COMPLETE, HUNG, TIMEOUT, FAILED = "complete", "hung", "timeout", "failed"
MAX_LISTED_ERRORS = 50  # paths kept per kind of problem (all are counted)

# roots whose earlier scan left a worker stuck in the kernel: {root path: the stuck threads or processes}
_stuck: dict[str, list[threading.Thread | BaseProcess]] = {}
_stuck_lock = threading.Lock()


def leave_behind(root: str, stuck: Iterable[threading.Thread | BaseProcess]) -> None:
    """Remember workers a scan of ``root`` left stuck in the file system (threads or processes)."""
    with _stuck_lock:
        _stuck.setdefault(root, []).extend(stuck)




def still_hung(root: str) -> bool:
    with _stuck_lock:
        alive = [t for t in _stuck.get(root, []) if t.is_alive()]
        if alive:
            _stuck[root] = alive
        else:
            _stuck.pop(root, None)
        return bool(alive)


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
