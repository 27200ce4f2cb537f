"""Job queries and the compare-and-set status write. Repositories never commit.

``set_status`` is the only code that changes ``jobs.status``: it refuses a transition that is not in
``TRANSITIONS``, writes ``UPDATE jobs ... WHERE id = ? AND status = ?`` and appends a ``job_events``
row in the caller's transaction. It returns False when another writer got there first.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.errors import InvalidInput
from dlts.models import TRANSITIONS, Job, JobEvent, JobStatus, utcnow


class TransitionRefused(Exception):
    """A status write that the lifecycle table does not allow (a programming error, not user input)."""


def set_status(
    session: Session,
    job_id: int,
    current: JobStatus,
    target: JobStatus,
    *,
    actor: str,
    reason: str | None = None,
    message: str | None = None,
    values: dict[str, Any] | None = None,
) -> bool:
    if target not in TRANSITIONS[current]:
        raise TransitionRefused(f"job {job_id}: {current.value} -> {target.value} is not an allowed transition")
    now = utcnow()
    result = session.execute(
        sa.update(Job)
        .where(Job.id == job_id, Job.status == current)
        .values(status=target, updated_at=now, **(values or {}))
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:
        return False
    session.add(JobEvent(job_id=job_id, at=now, kind="transition", from_status=current.value,
                         to_status=target.value, reason=reason, message=message, actor=actor))
    return True


def add_event(session: Session, job_id: int, kind: str, *, reason: str | None = None,
              message: str | None = None, actor: str | None = None) -> None:
    session.add(JobEvent(job_id=job_id, kind=kind, reason=reason, message=(message or "")[:1024] or None, actor=actor))


# -- keyset pagination -------------------------------------------------------------------------

def encode_cursor(last_id: int) -> str:
    return base64.urlsafe_b64encode(f"j:{last_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        kind, value = raw.split(":", 1)
        if kind != "j":
            raise ValueError
        return int(value)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidInput("cursor is not one this API returned; start again without it.",
                           code="invalid_cursor", details={"field": "cursor"}) from None


def list_jobs(
    session: Session,
    *,
    visible_vc_ids: Sequence[int] | None,
    user_id: int | None = None,
    vc_id: int | None = None,
    statuses: Sequence[JobStatus] = (),
    job_type: str | None = None,
    before_id: int | None = None,
    limit: int = 50,
) -> list[Job]:
    """Newest first, ``limit`` rows with id < ``before_id``. ``visible_vc_ids`` None: no VC filter."""
    query = sa.select(Job).order_by(Job.id.desc()).limit(limit)
    if visible_vc_ids is not None:
        query = query.where(Job.vc_id.in_(visible_vc_ids) if visible_vc_ids else sa.false())
    if user_id is not None:
        query = query.where(Job.user_id == user_id)
    if vc_id is not None:
        query = query.where(Job.vc_id == vc_id)
    if statuses:
        query = query.where(Job.status.in_(statuses))
    if job_type:
        query = query.where(Job.type == job_type)
    if before_id is not None:
        query = query.where(Job.id < before_id)
    return list(session.scalars(query))
