"""Expiry of old data under a root's ``expire_paths``: what is expired, what to warn about, deletion.

A file is expired when the newest of its mtime and ctime (and atime with ``use_atime``) is older than
``expire_after_days``; a directory when everything under it is (an empty one by its own times). A
path matching ``keep`` or a directory holding ``.dlts-keep`` is never expired, nor anything under it.

The walk holds each directory open (``O_NOFOLLOW``) and works relative to that descriptor, so a
symlink swapped in for a directory is never followed: a symlink is a file (the link goes, never its
target). It does not enter another file system (``st_dev``). Deletion goes deepest first, at most
``delete_ops_per_s`` unlinks and rmdirs a second, and each file is stat'ed again just before its
unlink: one that changed (new times, another inode) stays. ``may_delete(owner)`` says whether an
owner's files may go yet (the storage manager allows it only ``warn_days`` after it warned them); the
others are reported as warnings. Nothing here touches the database.
"""

from __future__ import annotations

import fnmatch
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dlts.storage.scan_result import Owners, shown
from dlts.storage.settings import StorageRoot

KEEP_FILE = ".dlts-keep"
MAX_DEPTH = 400  # deeper directories are left alone (counted), Python's recursion stays bounded
DAY_S = 86400.0


@dataclass
class OwnerTotals:
    files: int = 0
    dirs: int = 0
    bytes: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"files": self.files, "dirs": self.dirs, "bytes": self.bytes}


@dataclass
class Warning:
    files: int = 0
    bytes: int = 0
    paths: list[str] = field(default_factory=list)
    first_due: float | None = None  # when the first of them is due (epoch seconds)


@dataclass
class ExpireReport:
    root: str
    dry_run: bool
    older_than_days: float
    deleted: dict[str, OwnerTotals] = field(default_factory=dict)  # owner -> totals (dry run: would go)
    warnings: dict[str, Warning] = field(default_factory=dict)  # owner -> what goes soon
    held: dict[str, OwnerTotals] = field(default_factory=dict)  # expired, but the owner's warning is too recent
    kept: int = 0  # paths kept by keep / .dlts-keep
    changed: int = 0  # expired when seen, changed before the unlink: left
    other_fs: int = 0
    errors: list[str] = field(default_factory=list)
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"root": self.root, "dry_run": self.dry_run, "older_than_days": self.older_than_days,
                "deleted": {o: t.to_dict() for o, t in sorted(self.deleted.items())},
                "held": {o: t.to_dict() for o, t in sorted(self.held.items())},
                "warnings": {o: {"files": w.files, "bytes": w.bytes, "paths": w.paths, "first_due": w.first_due}
                             for o, w in sorted(self.warnings.items())},
                "kept": self.kept, "changed": self.changed, "other_filesystems": self.other_fs,
                "errors": self.errors, "duration_s": round(self.duration_s, 3)}


class _Kept(Exception):
    """A directory above an expire_paths match holds .dlts-keep."""


class RateLimit:
    """At most ``per_s`` operations a second (the clock and the sleep are the seams)."""

    def __init__(self, per_s: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.interval_s = 1.0 / per_s
        self.clock, self.sleep = clock, sleep
        self.next_at: float | None = None

    def wait(self) -> None:
        now = self.clock()
        if self.next_at is not None and now < self.next_at:
            self.sleep(self.next_at - now)
            now = self.next_at
        self.next_at = now + self.interval_s


def newest_time(st: os.stat_result, use_atime: bool) -> float:
    times = [st.st_mtime, st.st_ctime] + ([st.st_atime] if use_atime else [])
    return max(times)


class _Walk:
    def __init__(self, root: StorageRoot, owners: Owners, report: ExpireReport, *, now: float, limit_s: float,
                 warn_s: float, dry_run: bool, may_delete: Callable[[str], bool], limiter: RateLimit,
                 on_item: Callable[[str, str, int, str], None] | None, max_warn_paths: int, clock: Callable[[], float]):
        self.root, self.owners, self.report = root, owners, report
        self.now, self.limit_s, self.warn_s = now, limit_s, warn_s
        self.dry_run, self.may_delete, self.limiter = dry_run, may_delete, limiter
        self.on_item, self.max_warn_paths, self.clock = on_item, max_warn_paths, clock
        self.base = str(root.path)
        self.dev = 0

    # -- what is what ------------------------------------------------------------------------------
    def kept(self, rel: str) -> bool:
        return any(fnmatch.fnmatchcase(rel, pattern) or rel.startswith(pattern.rstrip("/") + "/")
                   for pattern in self.root.keep)

    def expired(self, st: os.stat_result) -> bool:
        return newest_time(st, self.root.use_atime) < self.now - self.limit_s

    def owner(self, rel: str, st: os.stat_result) -> str:
        top = rel.split("/", 1)[0] if "/" in rel or stat.S_ISDIR(st.st_mode) else None
        return shown(self.owners.user(top, st.st_uid))  # a directory's name when owners are by directory

    def warn(self, owner: str, rel: str, st: os.stat_result) -> None:
        w = self.report.warnings.setdefault(owner, Warning())
        w.files += 1
        w.bytes += st.st_blocks * 512
        if len(w.paths) < self.max_warn_paths:
            w.paths.append(shown(os.path.join(self.base, rel)))
        due = max(newest_time(st, self.root.use_atime) + self.limit_s, self.now)
        w.first_due = due if w.first_due is None else min(w.first_due, due)

    # -- the walk ----------------------------------------------------------------------------------
    def top(self, rel: str) -> None:
        """One path matched by expire_paths (relative to the root)."""
        parent_rel, _, name = rel.rpartition("/")
        try:
            parent_fd = self.open_dir_chain(parent_rel)
        except _Kept:
            self.report.kept += 1
            return
        except OSError as exc:
            self.report.errors.append(f"{shown(os.path.join(self.base, rel))}: {exc.strerror or exc}")
            return
        try:
            self.entry(parent_fd, parent_rel, name, 0)
        finally:
            os.close(parent_fd)

    def open_dir_chain(self, rel: str) -> int:
        """The root's directory ``rel`` opened one component at a time, never through a symlink;
        _Kept when one of the directories on the way holds .dlts-keep (everything under it stays)."""
        fd = os.open(self.base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        self.dev = os.fstat(fd).st_dev
        for part in [""] + [p for p in rel.split("/") if p]:
            if part:
                try:
                    nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                finally:
                    os.close(fd)
                fd = nfd
                if os.fstat(fd).st_dev != self.dev:
                    os.close(fd)
                    raise OSError(0, "another file system")
            try:
                os.stat(KEEP_FILE, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            except OSError:
                pass  # cannot tell: keep, to be safe
            os.close(fd)
            raise _Kept()
        return fd

    def entry(self, parent_fd: int, parent_rel: str, name: str, depth: int) -> tuple[bool, bool]:
        """Handle one entry of an open directory. Returns (expired, gone): whether everything in it
        was expired, and whether it was deleted (or would be, in a dry run)."""
        rel = f"{parent_rel}/{name}" if parent_rel else name
        try:
            st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            return True, True
        except OSError as exc:
            self.report.errors.append(f"{shown(os.path.join(self.base, rel))}: {exc.strerror or exc}")
            return False, False
        if self.kept(rel) or name == KEEP_FILE:
            self.report.kept += 1
            return False, False
        if stat.S_ISDIR(st.st_mode):
            return self.directory(parent_fd, rel, name, st, depth)
        owner = self.owner(rel, st)
        if not self.expired(st):
            if newest_time(st, self.root.use_atime) < self.now - self.limit_s + self.warn_s:
                self.warn(owner, rel, st)
            return False, False
        if not self.may_delete(owner):
            held = self.report.held.setdefault(owner, OwnerTotals())
            held.files += 1
            held.bytes += st.st_blocks * 512
            self.warn(owner, rel, st)
            return True, False
        if self.dry_run:
            self.record(owner, rel, "file", st.st_blocks * 512)
            return True, True
        self.limiter.wait()
        try:  # stat'ed again just before the unlink: a file used or replaced since stays
            again = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            return True, True
        if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) or not self.expired(again) \
                or stat.S_ISDIR(again.st_mode):
            self.report.changed += 1
            return False, False
        try:
            os.unlink(name, dir_fd=parent_fd)
        except FileNotFoundError:
            return True, True
        except OSError as exc:
            self.report.errors.append(f"{shown(os.path.join(self.base, rel))}: {exc.strerror or exc}")
            return True, False
        self.record(owner, rel, "file", again.st_blocks * 512)
        return True, True

    def directory(self, parent_fd: int, rel: str, name: str, st: os.stat_result, depth: int) -> tuple[bool, bool]:
        if st.st_dev != self.dev:
            self.report.other_fs += 1  # a mount point: the other file system is none of ours
            return False, False
        if depth >= MAX_DEPTH:
            self.report.errors.append(f"{shown(os.path.join(self.base, rel))}: deeper than {MAX_DEPTH} levels, left")
            return False, False
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
        except OSError as exc:
            self.report.errors.append(f"{shown(os.path.join(self.base, rel))}: {exc.strerror or exc}")
            return False, False
        try:
            opened = os.fstat(fd)
            if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
                self.report.changed += 1  # replaced between the stat and the open
                return False, False
            with os.scandir(fd) as it:
                entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
            names = {n for n, _ in entries}
            if KEEP_FILE in names:
                self.report.kept += 1
                return False, False
            all_expired, all_gone = True, True
            # deepest first: the subdirectories, then the files here, then this directory
            for child, _is_dir in sorted(entries, key=lambda e: (not e[1], e[0])):
                expired, gone = self.entry(fd, rel, child, depth + 1)
                all_expired &= expired
                all_gone &= gone
        except OSError as exc:
            self.report.errors.append(f"{shown(os.path.join(self.base, rel))}: {exc.strerror or exc}")
            return False, False
        finally:
            os.close(fd)
        if not entries:
            all_expired = self.expired(st)
        if not all_expired:
            return False, False
        owner = self.owner(rel, st)
        if not all_gone:
            return True, False
        if not self.may_delete(owner):
            return True, False
        if self.dry_run:
            self.record(owner, rel, "dir", 0)
            return True, True
        self.limiter.wait()
        try:
            os.rmdir(name, dir_fd=parent_fd)
        except FileNotFoundError:
            return True, True
        except OSError as exc:  # not empty any more (a file arrived): it stays
            self.report.changed += 1
            self.report.errors.append(f"{shown(os.path.join(self.base, rel))}: {exc.strerror or exc}")
            return False, False
        self.record(owner, rel, "dir", 0)
        return True, True

    def record(self, owner: str, rel: str, kind: str, size: int) -> None:
        totals = self.report.deleted.setdefault(owner, OwnerTotals())
        if kind == "dir":
            totals.dirs += 1
        else:
            totals.files += 1
            totals.bytes += size
        if self.on_item is not None:
            self.on_item(os.path.join(self.base, rel), kind, size, owner)


def matching_paths(root: StorageRoot) -> list[str]:
    """The paths (relative to the root) that ``expire_paths`` match, found without following a
    symlink or leaving the root's file system; hidden names only match a pattern that starts with '.'."""
    base = str(root.path)
    base_dev = os.lstat(base).st_dev
    found: list[str] = []
    for pattern in root.expire_paths:
        level = [""]
        parts = pattern.split("/")
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            following = []
            for rel in level:
                try:
                    with os.scandir(os.path.join(base, rel) if rel else base) as it:
                        for e in it:
                            if not fnmatch.fnmatchcase(e.name, part) or (e.name.startswith(".") and not part.startswith(".")):
                                continue
                            child = f"{rel}/{e.name}" if rel else e.name
                            if last or (e.is_dir(follow_symlinks=False) and e.stat(follow_symlinks=False).st_dev == base_dev):
                                following.append(child)
                except OSError:
                    continue
            level = following
        found.extend(level)
    return sorted(set(found))


def expire_root(root: StorageRoot, *, older_than_days: float | None = None, dry_run: bool = False,
                uid_names: dict[int, str] | None = None, may_delete: Callable[[str], bool] = lambda owner: True,
                now: float | None = None, clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep,
                on_item: Callable[[str, str, int, str], None] | None = None, max_warn_paths: int = 20) -> ExpireReport:
    """Expire (or, with ``dry_run``, list) what is older than ``older_than_days`` (default: the
    root's ``expire_after_days``) under the root's ``expire_paths``."""
    days = older_than_days if older_than_days is not None else root.expire_after_days
    if days is None:
        raise ValueError(f"{root.path}: no expire_after_days configured; give --older-than-days")
    if not root.expire_paths:
        raise ValueError(f"{root.path}: no expire_paths configured (globs under the root)")
    started = clock()
    report = ExpireReport(str(root.path), dry_run, days)
    walk = _Walk(root, Owners(root, uid_names), report, now=time.time() if now is None else now,
                 limit_s=days * DAY_S, warn_s=min(root.warn_days, days) * DAY_S, dry_run=dry_run,
                 may_delete=may_delete, limiter=RateLimit(root.delete_ops_per_s, clock, sleep),
                 on_item=on_item, max_warn_paths=max_warn_paths, clock=clock)
    for rel in matching_paths(root):
        walk.top(rel)
    report.duration_s = clock() - started
    return report
