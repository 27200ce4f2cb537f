"""The storage manager's records (revision 0011): one snapshot per scan of a root (its
``storage_usage`` rows hang off it), and what expiry warned about and deleted, per owner."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from dlts.models.base import Base, BigId, Timestamp


class StorageSnapshot(Base):
    """One scan of one root: when, how long, how it ended, what it found in total."""

    __tablename__ = "storage_snapshots"
    __table_args__ = (sa.Index("ix_storage_snapshots_root_scanned_at", "root", "scanned_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    root: Mapped[str] = mapped_column(sa.String(255))
    kind: Mapped[str] = mapped_column(sa.String(16))  # nfs | local
    started_at: Mapped[dt.datetime] = mapped_column(Timestamp)
    scanned_at: Mapped[dt.datetime] = mapped_column(Timestamp)  # when it ended; its rows' scanned_at
    duration_s: Mapped[float] = mapped_column(sa.Float)
    status: Mapped[str] = mapped_column(sa.String(16))  # complete | hung | timeout | failed
    message: Mapped[str | None] = mapped_column(sa.String(1024))
    errors: Mapped[int] = mapped_column(sa.Integer, default=0)  # paths it could not read
    other_filesystems: Mapped[int] = mapped_column(sa.Integer, default=0)  # mount points not entered
    dirs: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    files: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    allocated_bytes: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    apparent_bytes: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    fs_total_bytes: Mapped[int | None] = mapped_column(sa.BigInteger)
    fs_used_bytes: Mapped[int | None] = mapped_column(sa.BigInteger)
    # the file system was at or above the root's alert_percent (the alert goes out on the crossing)
    over_alert: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    # {"top_dirs": [...], "oldest_files": [...], "unreadable": [...], "other_filesystem_paths": [...]}
    detail: Mapped[dict] = mapped_column(sa.JSON, default=dict)


class StorageExpiryLog(Base):
    """Per expiry pass, root and owner: what the owner was warned about, or what was deleted."""

    __tablename__ = "storage_expiry_log"
    __table_args__ = (sa.Index("ix_storage_expiry_log_root_owner_action", "root", "owner", "action", "at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    root: Mapped[str] = mapped_column(sa.String(255))
    owner: Mapped[str] = mapped_column(sa.String(64))
    action: Mapped[str] = mapped_column(sa.String(16))  # warned | deleted
    at: Mapped[dt.datetime] = mapped_column(Timestamp)
    files: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    dirs: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    bytes: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    paths: Mapped[list] = mapped_column(sa.JSON, default=list)  # the first paths (warned)
