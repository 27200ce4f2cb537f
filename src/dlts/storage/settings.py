"""The typed ``storage:`` section of dlts.yaml: the file systems the storage manager scans and expires
(docs/storage.md, docs/configuration.md#storage). Every key has exactly one default, here."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _top_name(value: str, what: str) -> str:
    if not value or "/" in value or value in (".", "..") or "\x00" in value:
        raise ValueError(f"{what} {value!r} must be one directory name directly under the root (no '/')")
    return value


def _relative_glob(value: str, what: str) -> str:
    if not value or value.startswith("/") or "\x00" in value:
        raise ValueError(f"{what} {value!r} must be a path relative to the root (no leading '/')")
    if ".." in value.split("/"):
        raise ValueError(f"{what} {value!r} must stay under the root (no '..')")
    normal = posixpath.normpath(value)
    if normal == ".":
        raise ValueError(f"{what} {value!r} names the root itself")
    return normal


class StorageRoot(BaseModel):
    """One scanned directory tree (an NFS export's mount point, a local disk)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path
    kind: Literal["nfs", "local"] = "nfs"
    # whose a file is: "uid" (the user whose uid owns it: users' uid in the database, then uid_owners)
    # or "directory" (the name of the top-level directory it is under, e.g. /home/alice/...)
    owner_by: Literal["uid", "directory"] = "uid"
    uid_owners: dict[int, str] = Field(default_factory=dict)
    dir_owners: dict[str, str] = Field(default_factory=dict)  # top-level directory -> user, before owner_by
    # the VC the whole root belongs to (a per-VC root), or per top-level directory
    vc: str | None = Field(None, min_length=1, max_length=64)
    vc_dirs: dict[str, str] = Field(default_factory=dict)
    # tell cluster admins and the owners of the biggest paths when the file system is this full
    alert_percent: float | None = Field(None, gt=0, le=100)
    # expiry (off without expire_after_days): files under expire_paths (globs relative to the root)
    # whose newest time is older than this many days are deleted, their owners warned warn_days before
    expire_after_days: float | None = Field(None, gt=0)
    expire_paths: tuple[str, ...] = ()
    warn_days: float = Field(7.0, ge=0)
    use_atime: bool = False  # count the access time as a use too
    delete_ops_per_s: float = Field(50.0, gt=0, le=100_000)
    # never expired: paths relative to the root (globs); a directory holding a .dlts-keep file neither
    keep: tuple[str, ...] = ()

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError("must be an absolute path (the mount point)")
        return Path(posixpath.normpath(str(value)))

    @field_validator("dir_owners", "vc_dirs")
    @classmethod
    def _top_level(cls, value: dict[str, str]) -> dict[str, str]:
        for key, name in value.items():
            _top_name(key, "directory")
            if not name or len(name) > 64:
                raise ValueError(f"{key}: must map to a name of 1-64 characters")
        return value

    @field_validator("uid_owners")
    @classmethod
    def _uids(cls, value: dict[int, str]) -> dict[int, str]:
        for uid, name in value.items():
            if not 0 <= uid < 2**32 or not name or len(name) > 64:
                raise ValueError(f"{uid}: a uid 0..2^32-1 mapping to a user name of 1-64 characters")
        return value

    @field_validator("expire_paths", "keep")
    @classmethod
    def _globs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_relative_glob(v, "path") for v in value)

    @model_validator(mode="after")
    def _expiry(self) -> StorageRoot:
        if self.expire_after_days is not None and not self.expire_paths:
            raise ValueError("expire_after_days needs expire_paths (globs under the root, e.g. scratch/*); "
                             "DLTS never expires a whole root")
        if self.expire_after_days is not None and self.warn_days >= self.expire_after_days:
            raise ValueError(f"warn_days ({self.warn_days}) must be less than expire_after_days ({self.expire_after_days})")
        return self


class StorageSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    roots: tuple[StorageRoot, ...] = ()
    # dlts managers scans every root this often (storage.scan) and expires this often (storage.expire)
    scan_interval_s: float = Field(3600.0, ge=10)
    expire_interval_s: float = Field(86400.0, ge=60)
    # worker processes walking one root, each its own part of the tree (they bypass the GIL, and on
    # NFS each waits on its own round trips); 0: one per CPU, at least 2 and at most 8; 1: no worker
    # process, the scanning process lists with threads_per_root threads
    processes_per_root: int = Field(0, ge=0, le=64)
    # directories listed at once per root when processes_per_root is 1
    threads_per_root: int = Field(4, ge=1, le=64)
    # listing one directory (and stat-ing its entries) longer than this: the mount is reported hung
    dir_timeout_s: float = Field(60.0, gt=0, le=3600)
    # a whole scan of one root stops after this (snapshot status timeout)
    scan_timeout_s: float = Field(6 * 3600.0, gt=0)
    # snapshots kept per root (the newest and the ones before it, for trends)
    keep_snapshots: int = Field(10, ge=2, le=10_000)
    # the biggest directories kept per snapshot, down to this many levels under the root
    top_dirs: int = Field(20, ge=1, le=1000)
    top_dirs_depth: int = Field(3, ge=1, le=16)
    # the oldest files kept per snapshot
    oldest_files: int = Field(20, ge=0, le=1000)
    # at most this many paths per alert or warning mail
    mail_paths: int = Field(20, ge=1, le=1000)

    @field_validator("roots", mode="before")
    @classmethod
    def _none(cls, value: object) -> object:
        return () if value is None else value

    @field_validator("roots")
    @classmethod
    def _distinct(cls, value: tuple[StorageRoot, ...]) -> tuple[StorageRoot, ...]:
        paths = [str(r.path) for r in value]
        for path in paths:
            if paths.count(path) > 1:
                raise ValueError(f"root {path} is listed twice")
        return value

    def scan_processes(self) -> int:
        if self.processes_per_root:
            return self.processes_per_root
        return max(2, min(8, os.cpu_count() or 1))

    def root(self, path: str | Path) -> StorageRoot | None:
        wanted = posixpath.normpath(str(path))
        return next((r for r in self.roots if str(r.path) == wanted), None)
