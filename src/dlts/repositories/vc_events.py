"""Queries of the ``vc_events`` table (``models.vc.VcEvent``): an append-only record of VC changes."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.models import VcEvent, utcnow


def record(session: Session, vc: str, actor: str, field: str, old: Any, new: Any) -> None:
    session.add(VcEvent(vc=vc, at=utcnow(), actor=actor, field=field, old_value=old, new_value=new))


def list_events(session: Session, vc: str, *, before_id: int | None = None, limit: int = 50) -> list[VcEvent]:
    query = sa.select(VcEvent).where(VcEvent.vc == vc).order_by(VcEvent.id.desc()).limit(limit)
    if before_id is not None:
        query = query.where(VcEvent.id < before_id)
    return list(session.scalars(query))
