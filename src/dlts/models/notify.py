"""The notifier's outbox: one row per notice, queued by ``services.notify.enqueue`` in the caller's
transaction and sent by ``managers.notify`` (revision 0007).

A row is never deleted because sending failed: it stays ``queued`` through a mail server outage and
ends ``failed`` (kept, with ``last_error``) only when the server keeps refusing that message. Only
finished rows older than ``notify.keep_days`` are purged.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from dlts.models.base import Base, BigId, Timestamp, str_enum, utcnow


class OutboxStatus(str, enum.Enum):
    QUEUED = "queued"  # waiting to be sent (due at next_attempt_at)
    SENT = "sent"
    FAILED = "failed"  # the server refused it for good (5xx) or max_attempts times; kept
    DUPLICATE = "duplicate"  # not sent: another notice with its dedup_key was queued or sent in the window


class OutboxMessage(Base):
    __tablename__ = "notify_outbox"
    __table_args__ = (
        sa.Index("ix_notify_outbox_status_next_attempt_at", "status", "next_attempt_at"),  # what is due
        sa.Index("ix_notify_outbox_status_sent_at", "status", "sent_at"),  # rate limit window
        sa.Index("ix_notify_outbox_created_at", "created_at"),  # purge
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    template: Mapped[str] = mapped_column(sa.String(64))  # templates/email/<template>.txt.j2
    recipients: Mapped[list] = mapped_column(sa.JSON, default=list)  # plain addresses
    context: Mapped[dict[str, Any]] = mapped_column(sa.JSON, default=dict)  # the template's values
    dedup_key: Mapped[str | None] = mapped_column(sa.String(255), index=True)
    status: Mapped[OutboxStatus] = mapped_column(str_enum(OutboxStatus, 16), default=OutboxStatus.QUEUED)
    attempts: Mapped[int] = mapped_column(sa.Integer, default=0)
    next_attempt_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    last_error: Mapped[str | None] = mapped_column(sa.String(512))
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    sent_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
