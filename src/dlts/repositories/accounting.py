"""Queries and increments of the accounting tables (models/accounting.py). Repositories never commit.

The increments are upserts (``INSERT ... ON CONFLICT DO UPDATE`` on SQLite, ``ON DUPLICATE KEY
UPDATE`` on MariaDB/MySQL) that add to the row's counters: booking never reads a total to rewrite it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.models import Job, JobAttempt, UsageJobDay, UsageTotal, UtilisationPoint

COUNTERS = ("gpu_ms", "busy_gpu_ms", "sampled_gpu_ms")


def _upsert(session: Session, table: Any, keys: Sequence[str], rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    if session.get_bind().dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        stmt: Any = sqlite_insert(table)
        stmt = stmt.on_conflict_do_update(index_elements=list(keys),
                                          set_={c: table.c[c] + stmt.excluded[c] for c in COUNTERS})
    else:
        from sqlalchemy.dialects.mysql import insert as mysql_insert

        stmt = mysql_insert(table)
        stmt = stmt.on_duplicate_key_update({c: table.c[c] + stmt.inserted[c] for c in COUNTERS})
    session.execute(stmt, rows)


def add_totals(session: Session, rows: list[dict[str, Any]]) -> None:
    """Rows: period, start, user_id, vc_id, sku, preemptible and the counters' deltas."""
    _upsert(session, UsageTotal.__table__, ("period", "start", "user_id", "vc_id", "sku", "preemptible"), rows)


def add_job_days(session: Session, rows: list[dict[str, Any]]) -> None:
    _upsert(session, UsageJobDay.__table__, ("job_id", "day"), rows)


def open_attempts(session: Session, after_id: int, limit: int) -> list[sa.Row]:
    """Attempts not fully booked yet, by id, with what booking needs of their job."""
    return list(session.execute(
        sa.select(JobAttempt.id, JobAttempt.job_id, JobAttempt.placements, JobAttempt.started_at, JobAttempt.ended_at,
                  JobAttempt.booked_until, JobAttempt.utilisation_booked_until, Job.user_id, Job.vc_id, Job.sku,
                  Job.preemptible, Job.gpus, Job.nodes)
        .join(Job, Job.id == JobAttempt.job_id)
        .where(JobAttempt.accounting_open == sa.true(), JobAttempt.id > after_id)
        .order_by(JobAttempt.id).limit(limit)))


def points_between(session: Session, attempt_ids: Iterable[int], start: dt.datetime | None,
                   end: dt.datetime | None) -> list[UtilisationPoint]:
    query = sa.select(UtilisationPoint).where(UtilisationPoint.attempt_id.in_(list(attempt_ids)))
    if start is not None:
        query = query.where(UtilisationPoint.minute >= start)
    if end is not None:
        query = query.where(UtilisationPoint.minute < end)
    return list(session.scalars(query.order_by(UtilisationPoint.minute, UtilisationPoint.node)))


@dataclass(frozen=True)
class Booking:
    """What one pass books for one attempt: its marks as read (``was``) and as they become."""

    attempt_id: int
    was: dt.datetime | None
    until: dt.datetime | None
    utilisation_until: dt.datetime | None
    close: bool
    gpu_ms: int = 0
    busy_gpu_ms: int = 0
    sampled_gpu_ms: int = 0


MARK_CHUNK = 500


def mark_booked(session: Session, bookings: Sequence[Booking]) -> bool:
    """Move the attempts' marks and add to their counters, in statements of ``MARK_CHUNK`` attempts
    (one round trip each, not one per attempt), each a compare-and-set on ``booked_until``: False
    when another booker moved a mark since it was read (the caller rolls the batch back).

    Sent as driver SQL: per-row CASEs built as SQLAlchemy expressions (or parsed from text) cost more
    than the database does."""
    sqlite = session.get_bind().dialect.name == "sqlite"
    ph, same = ("?", "IS") if sqlite else ("%s", "<=>")  # the driver's placeholder; null-safe equality
    connection = session.connection()
    for i in range(0, len(bookings), MARK_CHUNK):
        chunk = bookings[i:i + MARK_CHUNK]
        params: list[Any] = []
        whens = f"WHEN {ph} THEN {ph} " * len(chunk)
        ids = [b.attempt_id for b in chunk]

        def case(values: Iterable[Any], ids: list[int] = ids, params: list[Any] = params, whens: str = whens) -> str:
            for attempt_id, value in zip(ids, values):
                params.extend((attempt_id, value))
            return f"CASE id {whens}END"

        sql = (f"UPDATE job_attempts SET booked_until = {case(b.until for b in chunk)}, "
               f"utilisation_booked_until = {case(b.utilisation_until for b in chunk)}, "
               f"accounting_open = {case(not b.close for b in chunk)}, "
               f"gpu_ms = gpu_ms + {case(b.gpu_ms for b in chunk)}, "
               f"busy_gpu_ms = busy_gpu_ms + {case(b.busy_gpu_ms for b in chunk)}, "
               f"sampled_gpu_ms = sampled_gpu_ms + {case(b.sampled_gpu_ms for b in chunk)} "
               f"WHERE id IN ({', '.join([ph] * len(chunk))}) ")
        params.extend(ids)
        sql += f"AND booked_until {same} {case(b.was for b in chunk)}"
        result = connection.exec_driver_sql(sql, tuple(_driver_value(p, sqlite) for p in params))
        if result.rowcount != len(chunk):
            return False
    return True


def _driver_value(value: Any, sqlite: bool) -> Any:
    # SQLAlchemy stores SQLite datetimes as ISO text with microseconds; keep the same form, or the
    # compare-and-set would compare text that differs in format only
    if sqlite and isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    return value


def current_attempts(session: Session, job_ids: Sequence[int], statuses: Sequence[Any]) -> dict[int, int]:
    """job id -> id of its current attempt, for the jobs among ``job_ids`` in ``statuses``."""
    if not job_ids:
        return {}
    rows = session.execute(
        sa.select(Job.id, JobAttempt.id)
        .join(JobAttempt, sa.and_(JobAttempt.job_id == Job.id, JobAttempt.number == Job.attempt))
        .where(Job.id.in_(list(job_ids)), Job.status.in_(list(statuses))))
    return {job_id: attempt_id for job_id, attempt_id in rows}


def delete_points_before(session: Session, cutoff: dt.datetime, limit: int) -> int:
    ids = list(session.scalars(sa.select(UtilisationPoint.id).where(UtilisationPoint.minute < cutoff)
                               .order_by(UtilisationPoint.minute).limit(limit)))
    if not ids:
        return 0
    session.execute(sa.delete(UtilisationPoint).where(UtilisationPoint.id.in_(ids)))
    return len(ids)
