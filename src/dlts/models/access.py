"""Per-user access material: SSH public keys, allowed IPs, registry credentials; and storage usage scans."""

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
    """One row of the storage manager's scan: bytes and files by mount, VC and user, or of one
    top-level directory (``directory`` set). Rows of a scan since revision 0011 belong to its
    snapshot (``storage_snapshots``); ``bytes_used`` is allocated bytes (st_blocks * 512)."""

    __tablename__ = "storage_usage"
    __table_args__ = (sa.Index("ix_storage_usage_scanned_at", "scanned_at"),
                      sa.Index("ix_storage_usage_snapshot_id", "snapshot_id"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    scanned_at: Mapped[dt.datetime] = mapped_column(Timestamp)
    mount: Mapped[str] = mapped_column(sa.String(255))
    vc: Mapped[str | None] = mapped_column(sa.String(64))
    user: Mapped[str | None] = mapped_column(sa.String(64))
    bytes_used: Mapped[int] = mapped_column(sa.BigInteger)
    files: Mapped[int | None] = mapped_column(sa.BigInteger)
    snapshot_id: Mapped[int | None] = mapped_column(sa.ForeignKey("storage_snapshots.id", ondelete="CASCADE"))
    directory: Mapped[str | None] = mapped_column(sa.String(255))
    apparent_bytes: Mapped[int | None] = mapped_column(sa.BigInteger)
    oldest_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)  # the oldest file's mtime


class RegistryCredential(Base):
    """A private image registry login of a user or of a VC (revision 0005).

    The password is stored encrypted (Fernet, key derived from ``secret_key``; see
    ``services.registry_credentials``) and never leaves the control plane except to the cluster, as
    the image pull secret of a job of that user or VC.
    """

    __tablename__ = "registry_credentials"
    __table_args__ = (
        sa.CheckConstraint("(scope = 'user' AND user_id IS NOT NULL AND vc_id IS NULL) OR "
                           "(scope = 'vc' AND vc_id IS NOT NULL AND user_id IS NULL)", name="one_owner"),
        sa.Index("ix_registry_credentials_user_id", "user_id"),
        sa.Index("ix_registry_credentials_vc_id", "vc_id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    scope: Mapped[str] = mapped_column(sa.String(8))  # user | vc
    user_id: Mapped[int | None] = mapped_column(sa.ForeignKey("users.id", ondelete="CASCADE"))
    vc_id: Mapped[int | None] = mapped_column(sa.ForeignKey("vcs.id", ondelete="CASCADE"))
    server: Mapped[str] = mapped_column(sa.String(255))
    username: Mapped[str] = mapped_column(sa.String(255))
    password_encrypted: Mapped[str] = mapped_column(sa.Text)  # a Fernet token
    created_by: Mapped[str] = mapped_column(sa.String(64))
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
