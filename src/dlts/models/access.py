"""Per-user access material: SSH public keys, allowed IPs; and storage usage scans."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from dlts.models.base import Base, BigId, Timestamp, utcnow


class SshKey(Base):
    __tablename__ = "ssh_keys"
    __table_args__ = (sa.UniqueConstraint("user_id", "fingerprint"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    user_id: Mapped[int] = mapped_column(sa.ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(sa.String(128))
    key_type: Mapped[str] = mapped_column(sa.String(32))
    bits: Mapped[int | None] = mapped_column(sa.Integer)
    public_key: Mapped[str] = mapped_column(sa.Text)
    fingerprint: Mapped[str] = mapped_column(sa.String(64))  # SHA256:...
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)


class AllowedIp(Base):
    __tablename__ = "allowed_ips"
    __table_args__ = (sa.UniqueConstraint("user_id", "cidr"), sa.Index("ix_allowed_ips_expires_at", "expires_at"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    user_id: Mapped[int] = mapped_column(sa.ForeignKey("users.id", ondelete="CASCADE"), index=True)
    cidr: Mapped[str] = mapped_column(sa.String(64))
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column(Timestamp)


class StorageUsage(Base):
    """One row of the storage manager's scan: bytes and files by mount, VC and user."""

    __tablename__ = "storage_usage"
    __table_args__ = (sa.Index("ix_storage_usage_scanned_at", "scanned_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    scanned_at: Mapped[dt.datetime] = mapped_column(Timestamp)
    mount: Mapped[str] = mapped_column(sa.String(255))
    vc: Mapped[str | None] = mapped_column(sa.String(64))
    user: Mapped[str | None] = mapped_column(sa.String(64))
    bytes_used: Mapped[int] = mapped_column(sa.BigInteger)
    files: Mapped[int | None] = mapped_column(sa.BigInteger)
