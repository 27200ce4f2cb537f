"""Users, groups, role bindings and API tokens (the identity aggregate)."""

from __future__ import annotations

import datetime as dt
import enum

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column, relationship

from dlts.models.base import Base, BigId, Timestamp, str_enum, utcnow


class Role(str, enum.Enum):
    CLUSTER_ADMIN = "cluster_admin"
    VC_ADMIN = "vc_admin"
    VC_MEMBER = "vc_member"


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(64), unique=True)
    # POSIX identity the user's jobs run as (revision 0005); NULL: none yet, such jobs are refused at
    # launch unless their VC lets them run as root
    uid: Mapped[int | None] = mapped_column(sa.Integer, unique=True)
    gid: Mapped[int | None] = mapped_column(sa.Integer)
    email: Mapped[str | None] = mapped_column(sa.String(254))
    # werkzeug/scrypt hash for the portal login; NULL: no password login
    password_hash: Mapped[str | None] = mapped_column(sa.String(255))
    # portal preferences (chosen job list columns, ...)
    preferences: Mapped[dict] = mapped_column(sa.JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    disabled_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    # why (revision 0013): "by admin", "missing from the directory" (the sync enables only those it disabled)
    disabled_reason: Mapped[str | None] = mapped_column(sa.String(255))
    # NULL: made by a person; "directory": made or adopted by the directory sync (revision 0013)
    source: Mapped[str | None] = mapped_column(sa.String(16))

    tokens: Mapped[list[ApiToken]] = relationship(back_populates="user", cascade="all, delete-orphan")


class Group(Base):
    __tablename__ = "groups"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(64), unique=True)
    # NULL: made by a person; "directory": its members come from the directory sync (revision 0013)
    source: Mapped[str | None] = mapped_column(sa.String(16))


class GroupMember(Base):
    __tablename__ = "group_members"

    group_id: Mapped[int] = mapped_column(sa.ForeignKey("groups.id", ondelete="CASCADE"), primary_key=True)
    user_id: Mapped[int] = mapped_column(sa.ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)


class RoleBinding(Base):
    """Grants ``role`` to a user or a group, on one VC (VC roles) or the cluster (vc_id NULL)."""

    __tablename__ = "role_bindings"
    __table_args__ = (
        sa.UniqueConstraint("role", "vc_id", "user_id", "group_id"),
        sa.CheckConstraint("(user_id IS NULL) <> (group_id IS NULL)", name="one_subject"),
        sa.Index("ix_role_bindings_user", "user_id"),
        sa.Index("ix_role_bindings_group", "group_id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    role: Mapped[Role] = mapped_column(str_enum(Role, 32))
    vc_id: Mapped[int | None] = mapped_column(sa.ForeignKey("vcs.id", ondelete="CASCADE"))
    user_id: Mapped[int | None] = mapped_column(sa.ForeignKey("users.id", ondelete="CASCADE"))
    group_id: Mapped[int | None] = mapped_column(sa.ForeignKey("groups.id", ondelete="CASCADE"))
    # NULL: made by a person; "directory": a group -> VC role mapping of the directory settings (revision 0013)
    source: Mapped[str | None] = mapped_column(sa.String(16))


class ApiToken(Base):
    """A bearer token. Only its SHA-256 is stored; the token itself is shown once."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    user_id: Mapped[int] = mapped_column(sa.ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(sa.String(64), default="default")
    token_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    prefix: Mapped[str] = mapped_column(sa.String(12))  # shown in lists so users can tell tokens apart
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    expires_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    last_used_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)

    user: Mapped[User] = relationship(back_populates="tokens")


class PortalSession(Base):
    """A logged-in portal session (revision 0008). The browser's cookie carries a random id; only its
    SHA-256 is stored, so a database reader cannot take over a session. Logout deletes the row, a
    password change deletes every row of the user: the cookie stops working at once, wherever it went."""

    __tablename__ = "portal_sessions"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    token_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    user_id: Mapped[int] = mapped_column(sa.ForeignKey("users.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column(Timestamp, index=True)  # the janitor's purge (revision 0014)
    last_seen_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)


class RateCounter(Base):
    """One fixed-window counter shared by every API worker (revision 0008): failed and pending portal
    logins per user name and per client address, job submissions per user and VC. ``key`` names it
    (``login-user:alice``, ``login-ip:10.0.0.9``, ``submit:3:17``); ``n`` counts within the window that
    began at ``window_start``. Writers change ``n`` only with one atomic UPDATE (``repositories.limits``)."""

    __tablename__ = "rate_counters"

    key: Mapped[str] = mapped_column(sa.String(191), primary_key=True)
    window_start: Mapped[dt.datetime] = mapped_column(Timestamp, index=True)
    n: Mapped[int] = mapped_column(sa.Integer, default=0)
