"""Read queries of portal pages that no service offers: booked GPU-hours per user for a month, and
assigned-but-idle GPUs now."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql import expression

from dlts.models import ACTIVE, Job, JobAttempt, Node, User, VirtualCluster
from dlts.models.base import Timestamp
from dlts.repositories.usage import TOTAL_GPUS
from dlts.services.nodes import reported_gpus


@dataclass(frozen=True)
class GpuHours:
    user: str
    vc: str
    jobs: int
    booked_gpu_h: float  # GPUs held x hours, inside the month


class seconds_between(expression.FunctionElement):
    """``b - a`` in seconds for two DATETIME columns or values, on SQLite and MariaDB/MySQL."""

    type = sa.Float()
    inherit_cache = True


@compiles(seconds_between, "sqlite")
def _seconds_sqlite(element, compiler, **kw):
    a, b = list(element.clauses)
    return f"((julianday({compiler.process(b, **kw)}) - julianday({compiler.process(a, **kw)})) * 86400.0)"


@compiles(seconds_between, "mysql")
@compiles(seconds_between, "mariadb")
def _seconds_mysql(element, compiler, **kw):
    a, b = list(element.clauses)
    return f"(TIMESTAMPDIFF(MICROSECOND, {compiler.process(a, **kw)}, {compiler.process(b, **kw)}) / 1000000.0)"


def gpu_hours(session: Session, month_start: dt.datetime, *, vc_names: Sequence[str] | None, user_id: int | None,
              now: dt.datetime) -> list[GpuHours]:
    """GPU-hours booked per user and VC in the month: each attempt's GPUs x its time inside the month.

    Booked time comes from ``job_attempts`` (start and end) and the GPUs the job holds; an attempt
    still running counts up to ``now``. Summed in the database; one user's month is fast, a whole VC's
    or cluster's reads every attempt that ended in the month (seconds at a million jobs: an accounting
    table kept by the monitoring managers should replace this). Idle time needs GPU utilisation
    samples over time, which nothing stores yet.
    """
    month_end = min((month_start.replace(day=28) + dt.timedelta(days=4)).replace(day=1), now)
    begin = sa.case((JobAttempt.started_at > month_start, JobAttempt.started_at), else_=sa.literal(month_start, Timestamp))
    ended = sa.func.coalesce(JobAttempt.ended_at, sa.literal(now, Timestamp))
    end = sa.case((ended < month_end, ended), else_=sa.literal(month_end, Timestamp))
    gpu_seconds = sa.func.sum(TOTAL_GPUS * seconds_between(begin, end))
    query = (sa.select(User.name, VirtualCluster.name, sa.func.count(sa.distinct(Job.id)), gpu_seconds)
             .select_from(JobAttempt).join(Job, Job.id == JobAttempt.job_id).join(User, User.id == Job.user_id)
             .join(VirtualCluster, VirtualCluster.id == Job.vc_id)
             .where(JobAttempt.started_at.is_not(None), JobAttempt.started_at < month_end,
                    sa.or_(JobAttempt.ended_at.is_(None), JobAttempt.ended_at > month_start))
             .group_by(User.name, VirtualCluster.name).order_by(User.name, VirtualCluster.name))
    if vc_names is not None:
        query = query.where(VirtualCluster.name.in_(vc_names) if vc_names else sa.false())
    if user_id is not None:  # one user's jobs by (user_id, id), their attempts by (job_id, number)
        query = query.where(Job.user_id == user_id)
    # a job that ended before the month has no attempt in it: skip looking its attempts up
    query = query.where(sa.or_(Job.finished_at.is_(None), Job.finished_at > month_start))
    return [GpuHours(user, vc, int(jobs), round(max(0.0, float(seconds or 0)) / 3600, 2))
            for user, vc, jobs, seconds in session.execute(query)]


IDLE_UTILISATION = 0.05  # an assigned GPU below 5 % busy counts as idle


@dataclass(frozen=True)
class IdleGpus:
    user: str
    vc: str
    assigned: int  # GPUs of running jobs that the agents reported on
    idle: int


def idle_gpus_now(session: Session, *, vc_names: Sequence[str] | None) -> list[IdleGpus] | None:
    """Assigned and idle GPUs per user, from the node agents' last reports (``nodes.metrics.gpus``).

    None when no agent has reported GPU samples yet (the demo and fresh clusters): nothing is known.
    """
    per_job: dict[int, list[float]] = {}
    reported = False
    for (metrics,) in session.execute(sa.select(Node.metrics)):
        for gpu in reported_gpus(metrics):
            reported = True
            job_id, ratio = gpu["job_id"], gpu["utilization_ratio"]
            if job_id and ratio is not None:
                per_job.setdefault(job_id, []).append(ratio)
    if not reported:
        return None
    query = (sa.select(Job.id, User.name, VirtualCluster.name).join(User, User.id == Job.user_id)
             .join(VirtualCluster, VirtualCluster.id == Job.vc_id).where(Job.id.in_(list(per_job)), Job.status.in_(list(ACTIVE))))
    if vc_names is not None:
        query = query.where(VirtualCluster.name.in_(vc_names) if vc_names else sa.false())
    totals: dict[tuple[str, str], list[int]] = {}
    for job_id, user, vc in session.execute(query):
        entry = totals.setdefault((user, vc), [0, 0])
        entry[0] += len(per_job[job_id])
        entry[1] += sum(1 for r in per_job[job_id] if r < IDLE_UTILISATION)
    return [IdleGpus(user, vc, a, i) for (user, vc), (a, i) in sorted(totals.items())]
