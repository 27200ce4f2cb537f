"""The ``vc_events`` table (revision 0002) and its queries: an append-only record of VC changes.

Each row is one changed setting of one VC (quota, policy, limits), with who changed it, the old and
the new value. Rows name the VC rather than reference it, so the history outlives a deleted VC.
(The table is declared here because models/ belongs to the foundation; it may move there.)
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, Session, mapped_column

from dlts.models.base import Base, BigId, Timestamp, utcnow


class VcEvent(Base):
    __tablename__ = "vc_events"
    __table_args__ = (sa.Index("ix_vc_events_vc_id", "vc", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    vc: Mapped[str] = mapped_column(sa.String(64))
    at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    actor: Mapped[str] = mapped_column(sa.String(64))
    field: Mapped[str] = mapped_column(sa.String(64))  # quota, policy, max_job_time_s, ..., created, deleted
    old_value: Mapped[Any] = mapped_column(sa.JSON, nullable=True)
    new_value: Mapped[Any] = mapped_column(sa.JSON, nullable=True)


def record(session: Session, vc: str, actor: str, field: str, old: Any, new: Any) -> None:
    session.add(VcEvent(vc=vc, at=utcnow(), actor=actor, field=field, old_value=old, new_value=new))


def list_events(session: Session, vc: str, *, before_id: int | None = None, limit: int = 50) -> list[VcEvent]:
    query = sa.select(VcEvent).where(VcEvent.vc == vc).order_by(VcEvent.id.desc()).limit(limit)
    if before_id is not None:
        query = query.where(VcEvent.id < before_id)
    return list(session.scalars(query))
