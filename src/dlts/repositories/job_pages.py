"""One page of the jobs list for the API, newest first, keyset on the primary key. Never commits.

Two steps: the page's ids from an index alone, then those rows with their user and VC. With the
joins in the same statement MariaDB may read ``(vc_id, id)`` by ``vc_id`` only and filter ``id``
row by row (seconds on a deep page of 1M jobs); the ids-only statement is a covered range scan on
one of the indexes that end in ``id`` (``(status, id)``, ``(vc_id, id)``, ``(vc_id, status, id)``,
``(user_id, id)``).
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.models import Job, JobStatus


def page(session: Session, *, visible_vc_ids: Sequence[int] | None, user_id: int | None = None, vc_id: int | None = None,
         statuses: Sequence[JobStatus] = (), job_type: str | None = None, before_id: int | None = None,
         limit: int = 50) -> list[Job]:
    """Up to ``limit`` jobs with id < ``before_id``, newest first. ``visible_vc_ids`` None: every VC."""
    query = sa.select(Job.id).order_by(Job.id.desc()).limit(limit)
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
    ids = list(session.scalars(query))
    if not ids:
        return []
    rows = {job.id: job for job in session.scalars(sa.select(Job).where(Job.id.in_(ids)))}
    return [rows[i] for i in ids if i in rows]
