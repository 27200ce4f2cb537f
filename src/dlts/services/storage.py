"""Storage usage as the storage manager last scanned it, and the scans' records.

``record_scan`` writes one scan of a root as a snapshot (``storage_snapshots``) with its
``storage_usage`` rows (a complete scan only: the root's total, each VC, each (VC, user), each top-level
directory), keeps the newest ``storage.keep_snapshots`` per root and says whether the file system
crossed the root's ``alert_percent``. ``last_scan`` reads, per mount, the rows of its newest scan with
the previous scan's bytes beside them (the trend); ``to_csv`` renders them; ``list_snapshots`` lists
the snapshots (``GET /storage/snapshots``). What each reader sees is ``policy.storage_row_visible``
and ``policy.can_see_storage_paths``: the same rule for the API, the portal and the CSV export.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.models import StorageSnapshot, StorageUsage, iso
from dlts.services import policy
from dlts.services.auth import Principal
from dlts.storage.scan_result import COMPLETE, ScanResult, iter_rows
from dlts.storage.settings import StorageRoot, StorageSettings

CSV_COLUMNS = ("mount", "vc", "user", "directory", "bytes_used", "files", "apparent_bytes", "oldest_at",
               "previous_bytes_used")


@dataclass(frozen=True)
class UsageRow:
    mount: str
    vc: str | None
    user: str | None
    bytes_used: int  # allocated bytes (st_blocks * 512)
    files: int | None
    directory: str | None = None  # a top-level directory's row ("." : the files directly in the mount)
    apparent_bytes: int | None = None
    oldest_at: str | None = None
    previous_bytes_used: int | None = None  # the same row in the mount's scan before (None: not in it)


@dataclass(frozen=True)
class UsageReport:
    scanned_at: str | None  # None: no scan has run yet; else the newest mount's scan
    rows: list[UsageRow]


def _epoch(value: float | None) -> dt.datetime | None:
    if value is None:
        return None
    return dt.datetime.fromtimestamp(value, dt.UTC).replace(tzinfo=None)


def last_scan(session: Session, principal: Principal, *, mount: str | None = None, vc: str | None = None,
              user: str | None = None) -> UsageReport:
    """Per mount, the rows of its newest scan (rows of older scans of other mounts stay visible), those
    ``principal`` may see."""
    times = session.execute(sa.select(StorageUsage.mount, StorageUsage.scanned_at).distinct()
                            .order_by(StorageUsage.mount, StorageUsage.scanned_at.desc())).all()
    newest: dict[str, list[dt.datetime]] = {}
    for m, at in times:
        if len(newest.setdefault(m, [])) < 2:
            newest[m].append(at)
    if mount is not None:
        newest = {m: v for m, v in newest.items() if m == mount}
    if not newest:
        return UsageReport(None, [])

    def rows_at(pairs: list[tuple[str, dt.datetime]]) -> Sequence[StorageUsage]:
        condition = sa.or_(*[sa.and_(StorageUsage.mount == m, StorageUsage.scanned_at == at) for m, at in pairs])
        query = (sa.select(StorageUsage).where(condition)
                 .order_by(StorageUsage.mount, StorageUsage.directory.is_not(None), StorageUsage.directory,
                           StorageUsage.vc, StorageUsage.user, StorageUsage.id))
        for column, value in ((StorageUsage.vc, vc), (StorageUsage.user, user)):
            if value is not None:
                query = query.where(column == value)
        return session.scalars(query).all()

    previous = {(r.mount, r.vc, r.user, r.directory): r.bytes_used
                for r in rows_at([(m, v[1]) for m, v in newest.items() if len(v) > 1])} if any(
        len(v) > 1 for v in newest.values()) else {}
    rows = [UsageRow(r.mount, r.vc, r.user, r.bytes_used, r.files, r.directory, r.apparent_bytes, iso(r.oldest_at),
                     previous.get((r.mount, r.vc, r.user, r.directory)))
            for r in rows_at([(m, v[0]) for m, v in newest.items()])
            if policy.storage_row_visible(principal, r.vc, r.user, r.directory)]
    return UsageReport(iso(max(v[0] for v in newest.values())), rows)


def to_csv(report: UsageReport) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["scanned_at", *CSV_COLUMNS])
    for row in report.rows:
        data = asdict(row)
        writer.writerow([report.scanned_at, *(_safe_cell(data[k]) for k in CSV_COLUMNS)])
    return out.getvalue()


def _safe_cell(value: object) -> object:
    # a cell starting with = + - @ is a formula to a spreadsheet; names come from directory names
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@"):
        return "'" + value
    return "" if value is None else value


# -- writing a scan ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Recorded:
    snapshot: StorageSnapshot
    crossed_alert: bool  # at or above alert_percent now, below it (or unknown) at the scan before


def record_scan(session: Session, result: ScanResult, root: StorageRoot, settings: StorageSettings) -> Recorded:
    """Write one scan (the caller commits). The usage rows of an unfinished scan (hung, timeout,
    failed) are not written: the Storage tab keeps showing the last complete one."""
    previous = session.scalars(sa.select(StorageSnapshot).where(StorageSnapshot.root == result.root)
                               .order_by(StorageSnapshot.scanned_at.desc(), StorageSnapshot.id.desc()).limit(1)).first()
    percent = result.fs_used_percent
    was_over = bool(previous and previous.over_alert)
    if percent is None or root.alert_percent is None:
        over = was_over if percent is None and root.alert_percent is not None else False
    else:
        over = percent >= root.alert_percent
    started_at = dt.datetime.fromtimestamp(result.started_at, dt.UTC).replace(tzinfo=None)
    scanned_at = started_at + dt.timedelta(seconds=result.duration_s)
    if previous is not None and scanned_at <= previous.scanned_at:  # a clock step must not reorder scans
        scanned_at = previous.scanned_at + dt.timedelta(microseconds=1)
    snapshot = StorageSnapshot(
        root=result.root, kind=result.kind, started_at=started_at, scanned_at=scanned_at,
        duration_s=round(result.duration_s, 3), status=result.status, message=(result.message or None) and result.message[:1024],
        errors=result.errors, other_filesystems=result.other_fs.count, dirs=result.dirs, files=result.total.files,
        allocated_bytes=result.total.allocated_bytes, apparent_bytes=result.total.apparent_bytes,
        fs_total_bytes=result.fs_total_bytes, fs_used_bytes=result.fs_used_bytes, over_alert=over,
        detail={"top_dirs": result.top_dirs, "oldest_files": result.oldest_files, "unreadable": result.unreadable.paths,
                "other_filesystem_paths": result.other_fs.paths, "hardlinks_seen_again": result.hardlinks_seen_again,
                "vanished": result.vanished, "used_percent": percent})
    session.add(snapshot)
    session.flush()
    if result.status == COMPLETE:
        session.add_all([StorageUsage(scanned_at=scanned_at, mount=result.root, vc=row["vc"], user=row["user"],
                                      directory=row["directory"], bytes_used=row["allocated_bytes"], files=row["files"],
                                      apparent_bytes=row["apparent_bytes"], oldest_at=_epoch(row["oldest_mtime"]),
                                      snapshot_id=snapshot.id)
                         for row in iter_rows(result)])
    _prune(session, result.root, settings.keep_snapshots)
    return Recorded(snapshot, over and not was_over)


def _prune(session: Session, root: str, keep: int) -> None:
    ids = session.scalars(sa.select(StorageSnapshot.id).where(StorageSnapshot.root == root)
                          .order_by(StorageSnapshot.scanned_at.desc(), StorageSnapshot.id.desc()).offset(keep)).all()
    if ids:  # the rows go with them (and explicitly, where SQLite's foreign keys are off)
        session.execute(sa.delete(StorageUsage).where(StorageUsage.snapshot_id.in_(ids)))
        session.execute(sa.delete(StorageSnapshot).where(StorageSnapshot.id.in_(ids)))


# -- listing snapshots -------------------------------------------------------------------------------

def snapshot_view(s: StorageSnapshot, paths: bool = True) -> dict[str, Any]:
    """``paths``: with the directories and files the scan names, and its message (they may name any VC's)."""
    if not paths:
        return {**snapshot_view(s), "message": None, "top_dirs": [], "oldest_files": []}
    return {"id": s.id, "root": s.root, "kind": s.kind, "started_at": iso(s.started_at), "scanned_at": iso(s.scanned_at),
            "duration_s": s.duration_s, "status": s.status, "message": s.message, "errors": s.errors,
            "other_filesystems": s.other_filesystems, "dirs": s.dirs, "files": s.files,
            "allocated_bytes": s.allocated_bytes, "apparent_bytes": s.apparent_bytes,
            "fs_total_bytes": s.fs_total_bytes, "fs_used_bytes": s.fs_used_bytes,
            "fs_used_percent": (s.detail or {}).get("used_percent"), "over_alert": s.over_alert,
            "top_dirs": (s.detail or {}).get("top_dirs", []), "oldest_files": (s.detail or {}).get("oldest_files", [])}


def list_snapshots(session: Session, principal: Principal, *, root: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    query = sa.select(StorageSnapshot).order_by(StorageSnapshot.scanned_at.desc(), StorageSnapshot.id.desc()).limit(limit)
    if root is not None:
        query = query.where(StorageSnapshot.root == root)
    paths = policy.can_see_storage_paths(principal)
    return [snapshot_view(s, paths) for s in session.scalars(query)]


def latest_snapshots(session: Session, principal: Principal) -> list[dict[str, Any]]:
    """The newest snapshot of each root, whatever its outcome (a hung mount shows), by root."""
    newest = (sa.select(StorageSnapshot.root, sa.func.max(StorageSnapshot.id).label("id"))
              .group_by(StorageSnapshot.root).subquery())
    query = sa.select(StorageSnapshot).join(newest, StorageSnapshot.id == newest.c.id).order_by(StorageSnapshot.root)
    paths = policy.can_see_storage_paths(principal)
    return [snapshot_view(s, paths) for s in session.scalars(query)]
