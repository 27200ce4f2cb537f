"""Lustre usage per user and per VC from the quota accounting, without walking the tree.

Lustre accounts every ID's usage on its targets whether limits are enforced or not, so ``lfs quota -q
-u UID MOUNT`` (a user), ``-p PROJID`` (a VC with a project ID: its directory tree) and ``-g GID`` (a
VC with only a Unix group) answer in milliseconds what a walk of billions of files would take hours
for. ``lustre_usage`` turns those answers, and ``lfs df``'s totals, into the same ``ScanResult`` the
NFS scanner produces (kind ``lustre``), so the storage manager records it as a snapshot and the
Storage tab, its CSV and ``GET /storage/usage`` show it beside the NFS roots.

Sizes are the quota's kbytes (allocated blocks, in KiB), so apparent bytes are not known and are
reported equal to the allocated ones; files are the inode counts. An ID whose query fails is counted
in the snapshot's errors (and named); the others are still recorded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from dlts.storage.scan_result import COMPLETE, FAILED, ScanResult, Totals

KIND = "lustre"


@dataclass(frozen=True)
class VcQuotaId:
    """How a VC's usage is read: its project ID (preferred) or its Unix group, and its directory."""

    vc: str
    project_id: int | None = None
    gid: int | None = None
    directory: str | None = None  # relative to the mount, e.g. vcs/vision


def _totals(report) -> Totals:
    used_kib = report.total.block_used_kib or 0
    return Totals(files=report.total.inode_used or 0, allocated_bytes=used_kib * 1024, apparent_bytes=used_kib * 1024)


def lustre_usage(client, mount: str, *, users: Mapping[int, str], vcs: Iterable[VcQuotaId],
                 now: Callable[[], float] = time.time, clock: Callable[[], float] = time.monotonic) -> ScanResult:
    """One usage reading of the Lustre filesystem mounted at ``mount`` (``client``: a LustreClient)."""
    from dlts_lustre.errors import LustreError
    from dlts_lustre.model import QuotaKind

    result = ScanResult(root=mount, kind=KIND, started_at=now())
    start = clock()
    try:
        blocks = client.df(mount)
        inodes = client.df(mount, inodes=True)
    except LustreError as exc:
        result.status, result.message = FAILED, f"lfs df: {exc}"
        result.duration_s = clock() - start
        return result
    if blocks.summary is not None:
        result.fs_total_bytes = blocks.summary.total * 1024
        result.fs_used_bytes = blocks.summary.used * 1024
        result.total = Totals(files=inodes.summary.used if inodes.summary else 0,
                              allocated_bytes=blocks.summary.used * 1024, apparent_bytes=blocks.summary.used * 1024)
    over: list[str] = []
    for uid, name in sorted(users.items()):
        try:
            report = client.quota(QuotaKind.USER, uid, mount, quiet=True)
        except LustreError as exc:
            result.unreadable.add(f"user {name} (uid {uid})", str(exc))
            continue
        totals = _totals(report)
        if report.total.block_over_limit or report.total.inode_over_limit:
            over.append(name)
        if totals.files or totals.allocated_bytes:
            result.by_owner[(None, name)] = totals
    result.vc_totals = {}
    for vc in vcs:
        if vc.project_id is not None:
            kind, ident = QuotaKind.PROJECT, vc.project_id
        elif vc.gid is not None:
            kind, ident = QuotaKind.GROUP, vc.gid
        else:
            continue
        try:
            report = client.quota(kind, ident, mount, quiet=True)
        except LustreError as exc:
            result.unreadable.add(f"VC {vc.vc} ({kind.name.lower()} {ident})", str(exc))
            continue
        totals = _totals(report)
        result.vc_totals[vc.vc] = totals
        if vc.directory:
            result.by_directory[vc.directory] = totals
            result.directory_vc[vc.directory] = vc.vc
        result.top_dirs.append({"path": f"{mount.rstrip('/')}/{vc.directory}" if vc.directory else mount,
                                "vc": vc.vc, "owner": None, "allocated_bytes": totals.allocated_bytes,
                                "apparent_bytes": totals.apparent_bytes, "files": totals.files,
                                "over_limit": bool(report.total.block_over_limit or report.total.inode_over_limit)})
    result.top_dirs.sort(key=lambda d: -d["allocated_bytes"])
    result.status = COMPLETE
    if over:
        result.message = "over a quota limit: " + ", ".join(over)
    result.duration_s = clock() - start
    return result
