"""Job queries and the compare-and-set status write. Repositories never commit.

``set_status`` is the only code that changes ``jobs.status``: it refuses a transition that is not in
``TRANSITIONS``, writes ``UPDATE jobs ... WHERE id = ? AND status = ?`` and appends a ``job_events``
row in the caller's transaction. It returns False when another writer got there first.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Sequence
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session, defer

from dlts.errors import InvalidInput
from dlts.models import (
    TRANSITIONS,
    EventKind,
    Job,
    JobAttempt,
    JobEvent,
    JobFavourite,
    JobStatus,
    JobTag,
    SshKey,
    utcnow,
)
from dlts.strict import whole_number


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
    # an UPDATE's result is a CursorResult (Session.execute is typed for any statement)
    result = cast(CursorResult[Any], session.execute(
        sa.update(Job)
        .where(Job.id == job_id, Job.status == current)
        .values(status=target, updated_at=now, **(values or {}))
        .execution_options(synchronize_session=False)
    ))
    if result.rowcount != 1:
        return False
    session.add(JobEvent(job_id=job_id, at=now, kind=EventKind.TRANSITION, from_status=current.value,
                         to_status=target.value, reason=reason, message=message, actor=actor))
    return True


def add_event(session: Session, job_id: int, kind: EventKind, *, reason: str | None = None,
              message: str | None = None, actor: str | None = None) -> None:
    session.add(JobEvent(job_id=job_id, kind=kind, reason=reason, message=(message or "")[:1024] or None, actor=actor))


# -- keyset pagination -------------------------------------------------------------------------

def encode_cursor(last_id: int) -> str:
    return base64.urlsafe_b64encode(f"j:{last_id}".encode()).decode().rstrip("=")


BAD_CURSOR = "cursor is not one this API returned; start again from the first page, without it."


def decode_cursor(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        kind, value = raw.split(":", 1)
        if kind != "j":
            raise ValueError
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidInput(BAD_CURSOR, code="invalid_cursor", details={"field": "cursor"}) from None
    # ASCII digits below 2**62: "²", "-5" or a 20-digit id (an OverflowError on SQLite) are not ours
    return whole_number(value, "cursor", message=BAD_CURSOR, code="invalid_cursor")


def list_jobs(
    session: Session,
    *,
    visible_vc_ids: Sequence[int] | None,
    user_id: int | None = None,
    vc_id: int | None = None,
    statuses: Sequence[JobStatus] = (),
    job_type: str | None = None,
    boundary: int | None = None,
    oldest_first: bool = False,
    limit: int = 50,
    tag: str | None = None,
    favourite_of: int | None = None,
    archived: str = "false",
) -> list[Job]:
    """One keyset page: ``limit`` jobs past ``boundary`` (the last id of the previous page), newest
    first unless ``oldest_first``. ``visible_vc_ids`` None: every VC. ``tag``: jobs with that tag;
    ``favourite_of``: jobs that user starred; ``archived``: "false" (the default lists: not archived),
    "true" (archived only) or "all".

    The rows come without ``spec`` and ``command`` (touching them raises): a page of jobs must not
    carry every job's environment and command line (up to 48 KiB each); ``command_previews`` gives
    the start of each command, the detail route the whole job.

    Two steps: the page's ids from an index alone, then those rows with their user and VC. With the
    joins in one statement MariaDB may read ``(vc_id, id)`` by ``vc_id`` only and filter ``id`` row
    by row (seconds on a deep page of 1M jobs); the ids-only statement is a covered range scan on one
    of the indexes that end in ``id``.
    """
    query = sa.select(Job.id).order_by(Job.id.asc() if oldest_first else Job.id.desc()).limit(limit)
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
    if archived == "false":
        # while no job is archived (one probe of ix_jobs_archived_at) the page stays a covered index scan
        if session.scalar(sa.select(Job.id).where(Job.archived_at.is_not(None)).limit(1)) is not None:
            query = query.where(Job.archived_at.is_(None))
    elif archived == "true":
        query = query.where(Job.archived_at.is_not(None))
    if tag is not None:
        query = query.where(Job.id.in_(sa.select(JobTag.job_id).where(JobTag.tag == tag)))
    if favourite_of is not None:
        query = query.where(Job.id.in_(sa.select(JobFavourite.job_id).where(JobFavourite.user_id == favourite_of)))
    if boundary is not None:
        query = query.where(Job.id > boundary if oldest_first else Job.id < boundary)
    ids = list(session.scalars(query))
    if not ids:
        return []
    summary = sa.select(Job).where(Job.id.in_(ids)).options(defer(Job.spec, raiseload=True),
                                                            defer(Job.command, raiseload=True))
    rows = {job.id: job for job in session.scalars(summary)}
    return [rows[i] for i in ids if i in rows]


def command_previews(session: Session, ids: Sequence[int], chars: int) -> dict[int, str]:
    """The first ``chars + 1`` characters of each job's command (one more tells it was cut)."""
    if not ids:
        return {}
    query = sa.select(Job.id, sa.func.substr(Job.command, 1, chars + 1)).where(Job.id.in_(list(ids)))
    return {job_id: text or "" for job_id, text in session.execute(query)}


def tags_of(session: Session, ids: Sequence[int]) -> dict[int, list[str]]:
    """Each job's tags, sorted (jobs without tags are left out)."""
    if not ids:
        return {}
    out: dict[int, list[str]] = {}
    for job_id, tag in session.execute(sa.select(JobTag.job_id, JobTag.tag).where(JobTag.job_id.in_(list(ids)))
                                       .order_by(JobTag.job_id, JobTag.tag)):
        out.setdefault(job_id, []).append(tag)
    return out


def favourites_of(session: Session, user_id: int, ids: Sequence[int]) -> set[int]:
    """Which of ``ids`` the user starred."""
    if not ids:
        return set()
    return set(session.scalars(sa.select(JobFavourite.job_id).where(JobFavourite.user_id == user_id,
                                                                    JobFavourite.job_id.in_(list(ids)))))


def lock_job(session: Session, job_id: int) -> None:
    """Hold the job's row until the caller's transaction ends (SQLite: the database's write lock)."""
    if session.get_bind().dialect.name == "sqlite":
        session.execute(sa.update(Job).where(Job.id == job_id).values(updated_at=Job.updated_at)
                        .execution_options(synchronize_session=False))
    else:
        session.execute(sa.select(Job.id).where(Job.id == job_id).with_for_update())


def attempts_of(session: Session, job_id: int) -> list[JobAttempt]:
    """Every attempt of a job, oldest first."""
    return list(session.scalars(sa.select(JobAttempt).where(JobAttempt.job_id == job_id).order_by(JobAttempt.number)))


def log_names(session: Session, job_ids: Sequence[int]) -> tuple[set[int], set[tuple[int, int, str | None]]]:
    """Of these job ids, the ones that have a row, and every (job id, attempt number, log key) of
    their attempts: what names a log in the store (``dlts.logstore``)."""
    if not job_ids:
        return set(), set()
    jobs = set(session.scalars(sa.select(Job.id).where(Job.id.in_(job_ids))))
    rows = session.execute(sa.select(JobAttempt.job_id, JobAttempt.number, JobAttempt.log_key)
                           .where(JobAttempt.job_id.in_(job_ids)))
    return jobs, {(job_id, number, key) for job_id, number, key in rows}


def latest_events(session: Session, job_id: int, limit: int) -> list[JobEvent]:
    """The job's newest ``limit`` events, newest first."""
    return list(session.scalars(sa.select(JobEvent).where(JobEvent.job_id == job_id)
                                .order_by(JobEvent.id.desc()).limit(limit)))


def jobs_by_id(session: Session, ids: Sequence[int]) -> dict[int, Job]:
    return {j.id: j for j in session.scalars(sa.select(Job).where(Job.id.in_(list(ids))))}


def has_ssh_key(session: Session, user_id: int) -> bool:
    return session.scalar(sa.select(SshKey.id).where(SshKey.user_id == user_id).limit(1)) is not None


def recent_run_times(session: Session, user_names: Sequence[str], runs: int) -> dict[str, list[float]]:
    """Per user (by name), the run times in seconds of their last ``runs`` finished jobs (status
    finished: the last attempt ran to its own end), oldest first."""
    if runs <= 0 or not user_names:
        return {}
    from dlts.models import User

    rank = sa.func.row_number().over(partition_by=Job.user_id, order_by=(Job.finished_at.desc(), Job.id.desc()))
    ranked = (sa.select(User.name.label("user"), JobAttempt.started_at.label("started"),
                        JobAttempt.ended_at.label("ended"), rank.label("rank"))
              .join(User, User.id == Job.user_id)
              .join(JobAttempt, sa.and_(JobAttempt.job_id == Job.id, JobAttempt.number == Job.attempt))
              .where(Job.status == JobStatus.FINISHED, User.name.in_(list(user_names)),
                     JobAttempt.started_at.is_not(None), JobAttempt.ended_at.is_not(None))
              .subquery())
    out: dict[str, list[float]] = {}
    rows = session.execute(sa.select(ranked.c.user, ranked.c.started, ranked.c.ended)
                           .where(ranked.c.rank <= runs).order_by(ranked.c.user, ranked.c.rank.desc()))
    for user, started, ended in rows:
        out.setdefault(user, []).append(max(0.0, (ended - started).total_seconds()))
    return out


def stored_forecasts(session: Session) -> dict[int, dt.datetime | None]:
    """``forecast_start`` of every queued job, by id."""
    return {job_id: start for job_id, start in
            session.execute(sa.select(Job.id, Job.forecast_start).where(Job.status == JobStatus.QUEUED))}


def set_forecasts(session: Session, changes: Sequence[tuple[int, dt.datetime | None]]) -> None:
    """Set ``forecast_start`` of each (job id, start) whose job is still queued, in one statement
    run for every row (executemany)."""
    if not changes:
        return
    table = cast(sa.Table, Job.__table__)
    stmt = (sa.update(table).where(table.c.id == sa.bindparam("job_id"), table.c.status == JobStatus.QUEUED)
            .values(forecast_start=sa.bindparam("start")))
    session.execute(stmt, [{"job_id": job_id, "start": start} for job_id, start in changes])


def same_second(a: dt.datetime | None, b: dt.datetime | None) -> bool:
    """Two stored times equal to the second (a forecast moves by fractions as ``now`` does)."""
    return _whole_s(a) == _whole_s(b)


def _whole_s(moment: dt.datetime | None) -> int | None:
    return None if moment is None else int(moment.replace(tzinfo=dt.UTC).timestamp())  # stored naive UTC
