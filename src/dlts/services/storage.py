"""Storage usage as the storage manager last scanned it: bytes and files by mount, VC and user.

Reads the ``storage_usage`` rows of the newest ``scanned_at``; renders them as JSON rows or CSV.
"""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.models import StorageUsage, iso


@dataclass(frozen=True)
class UsageRow:
    mount: str
    vc: str | None
    user: str | None
    bytes_used: int
    files: int | None


@dataclass(frozen=True)
class UsageReport:
    scanned_at: str | None  # None: no scan has run yet
    rows: list[UsageRow]


def last_scan(session: Session, *, mount: str | None = None, vc: str | None = None, user: str | None = None) -> UsageReport:
    latest = session.scalar(sa.select(sa.func.max(StorageUsage.scanned_at)))
    if latest is None:
        return UsageReport(None, [])
    query = (sa.select(StorageUsage).where(StorageUsage.scanned_at == latest)
             .order_by(StorageUsage.mount, StorageUsage.vc, StorageUsage.user, StorageUsage.id))
    for column, value in ((StorageUsage.mount, mount), (StorageUsage.vc, vc), (StorageUsage.user, user)):
        if value is not None:
            query = query.where(column == value)
    rows = [UsageRow(r.mount, r.vc, r.user, r.bytes_used, r.files) for r in session.scalars(query)]
    return UsageReport(iso(latest), rows)


def to_csv(report: UsageReport) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["scanned_at", "mount", "vc", "user", "bytes_used", "files"])
    for row in report.rows:
        data = asdict(row)
        writer.writerow([report.scanned_at, *(_safe_cell(data[k]) for k in ("mount", "vc", "user", "bytes_used", "files"))])
    return out.getvalue()


def _safe_cell(value: object) -> object:
    # a cell starting with = + - @ is a formula to a spreadsheet; names come from directory names
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@"):
        return "'" + value
    return "" if value is None else value
