"""Build the scheduler's ``Snapshot`` from the database in a handful of queries.

``JobAttempt.placements`` (JSON) becomes values in ``dlts.models.placements`` (the metrics read it too).
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import replace
from typing import overload

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.config import Settings
from dlts.models import (
    ACTIVE,
    EndReason,
    EventKind,
    Job,
    JobAttempt,
    JobEvent,
    JobStatus,
    Node,
    User,
    VirtualCluster,
    utcnow,
)
from dlts.models.accounting import UsageTotal
from dlts.models.placements import replicas_from_json
from dlts.repositories.cluster import sku_shapes
from dlts.scheduler import model as core
from dlts.services.vcs import scheduling_of, scheduling_row


def epoch(value: dt.datetime | None) -> float | None:
    return None if value is None else value.replace(tzinfo=dt.UTC).timestamp()


@overload
def from_epoch(value: float) -> dt.datetime: ...


@overload
def from_epoch(value: None) -> None: ...


def from_epoch(value: float | None) -> dt.datetime | None:
    """Epoch seconds as the database stores a time (naive UTC); the inverse of ``epoch``."""
    return None if value is None else dt.datetime.fromtimestamp(value, dt.UTC).replace(tzinfo=None)


def reserved_shapes(shapes: dict[str, core.SkuShape], settings: Settings) -> dict[str, core.SkuShape]:
    """The SKU shapes with the configured ``sku_reserve`` (cores and bytes kept per free GPU); the
    key ``"*"`` is for every GPU SKU not named."""
    out = dict(shapes)
    if not settings.sku_reserve:
        return out
    for sku, shape in shapes.items():
        r = settings.sku_reserve.get(sku) or settings.sku_reserve.get("*")
        if r is not None and shape.gpus > 0:
            out[sku] = replace(shape, cpu_per_gpu=r.cpu_per_gpu, memory_per_gpu_bytes=r.memory_per_gpu_bytes)
    return out


def load_snapshot(session: Session, settings: Settings) -> core.Snapshot:
    vcs = {}
    vc_names = {}
    for vc in session.scalars(sa.select(VirtualCluster)):
        vc_names[vc.id] = vc.name
        vcs[vc.name] = core.Vc(
            name=vc.name, quota={k: int(v) for k, v in (vc.quota or {}).items()},
            policy=core.Policy(vc.policy), max_job_time_s=vc.max_job_time_s,
            max_interactive_gpus=vc.max_interactive_gpus, user_gpu_quota=vc.user_gpu_quota,
            cpu_quota=vc.cpu_quota, memory_quota_bytes=vc.memory_quota_bytes,
            allow_cpu_jobs_on_gpu_nodes=vc.allow_cpu_jobs_on_gpu_nodes,
            default_runtime_estimate_s=vc.default_runtime_estimate_s or settings.default_runtime_estimate_s,
            # fair share and the preemption budget: the VC row's, else vc_scheduling's, else the cluster's
            **{key: e.value for key, e in scheduling_of(settings, vc.name, scheduling_row(vc)).items()},
        )
    nodes = tuple(
        core.Node(n.name, n.sku, n.gpus, n.cpu, n.memory_bytes, n.ib_domain, n.vc, n.schedulable,
                  tuple(i for i in (n.unhealthy_gpus or []) if isinstance(i, int) and 0 <= i < n.gpus))
        for n in session.scalars(sa.select(Node).order_by(Node.name))
    )
    rows = session.execute(
        sa.select(Job, JobAttempt)
        .outerjoin(JobAttempt, sa.and_(JobAttempt.job_id == Job.id, JobAttempt.number == Job.attempt))
        .where(Job.status.in_([JobStatus.QUEUED, *ACTIVE]))
    ).all()
    preempted = preemption_counts(session) if any(v.max_preemptions for v in vcs.values()) else {}
    # only where it can decide something: some VC protects its work (min_runtime_s) and the job's
    # VC lets a long wait for room override that (max_reclaim_delay_s)
    room_since = room_wait_since(session, [
        job.id for job, _ in rows
        if job.status is JobStatus.QUEUED and not job.preemptible and job.reason in ROOM_CODES
        and vcs[vc_names[job.vc_id]].max_reclaim_delay_s is not None
    ]) if any(v.min_runtime_s > 0 for v in vcs.values()) else {}
    jobs = []
    for job, attempt in rows:
        running = job.status in ACTIVE
        replicas = replicas_from_json(attempt.placements) if (running and attempt) else ()
        started = epoch(job.started_at) if job.status is not JobStatus.SCHEDULING else epoch(attempt.created_at if attempt else None)
        jobs.append(core.Job(
            id=job.id, vc=vc_names[job.vc_id], user=job.user.name, type=core.JobType(job.type), sku=job.sku,
            gpus=job.gpus, cpu=job.cpu, memory_bytes=job.memory_bytes, queue_time=epoch(job.queue_time) or 0.0,
            priority=job.priority, preemptible=job.preemptible, nodes=job.nodes,
            ib_domain_any=(job.spec or {}).get("ib_domain") == "any", max_time_s=job.max_time_s,
            running=running, started_at=started if running else None,
            # already on its way out (kill, pause, preemption): never chosen to be stopped again
            stopping=job.status in (JobStatus.KILLING, JobStatus.PAUSING) or bool(attempt and attempt.stop_requested),
            user_quota_approved=job.approved_by is not None,
            placements=tuple(r.placement for r in replicas if not r.retiring),
            retiring=tuple(r.placement for r in replicas if r.retiring),
            min_replicas=(job.spec or {}).get("min_replicas", 0), max_replicas=(job.spec or {}).get("max_replicas", 0),
            preemptions=preempted.get(job.id, 0), room_wait_since=room_since.get(job.id),
            # backfill: it held a reservation at the previous pass (only reservations carry an
            # estimate); the core keeps it until the job starts
            reserved=job.status is JobStatus.QUEUED and job.estimated_start is not None,
        ))
    return core.Snapshot(skus=reserved_shapes(sku_shapes(session), settings), nodes=nodes, vcs=vcs, jobs=tuple(jobs),
                         cpu_job_default_cpu=settings.cpu_job_default_cpu,
                         cpu_job_default_memory_bytes=settings.cpu_job_default_memory_bytes,
                         reservation_depth=settings.reservation_depth,
                         fair_share_usage=fair_share_usage(session, settings, vc_names, utcnow())
                         if any(v.fair_share for v in vcs.values()) else {})


ROOM_CODES = frozenset(r.value for r in core.ROOM_REASONS)


def room_wait_since(session: Session, job_ids: list[int]) -> dict[int, float]:
    """Job id -> since when it has waited for room (``core.Job.room_wait_since``), for queued jobs
    whose stored reason is one of ``ROOM_REASONS``.

    A reason event is written only when a job's reason changes, so the wait began at the oldest
    event of the unbroken run of room-reason events at the end of its history; where that run is
    empty (the job kept its stored reason across a requeue, so no new event was written), at its
    latest event."""
    if not job_ids:
        return {}
    rows = session.execute(
        sa.select(JobEvent.job_id, JobEvent.kind, JobEvent.reason, JobEvent.at)
        .where(JobEvent.job_id.in_(job_ids))
        .order_by(JobEvent.job_id, JobEvent.id.desc())
    ).all()
    out: dict[int, float] = {}
    ended: set[int] = set()  # jobs whose run was read to its start
    for job_id, kind, reason, at in rows:
        if job_id in ended:
            continue
        if kind == EventKind.REASON and reason in ROOM_CODES:
            out[job_id] = epoch(at) or 0.0
            continue
        if job_id not in out:
            out[job_id] = epoch(at) or 0.0
        ended.add(job_id)
    return out


def preemption_counts(session: Session) -> dict[int, int]:
    """Job id -> attempts that ended preempted, for the waiting and running preemptible jobs."""
    rows = session.execute(
        sa.select(JobAttempt.job_id, sa.func.count())
        .join(Job, Job.id == JobAttempt.job_id)
        .where(Job.preemptible.is_(True), Job.status.in_([JobStatus.QUEUED, *ACTIVE]),
               JobAttempt.end_reason == EndReason.PREEMPTED)
        .group_by(JobAttempt.job_id)
    ).all()
    return {int(job_id): int(n) for job_id, n in rows}


def fair_share_usage(session: Session, settings: Settings, vc_names: dict[int, str],
                     now: dt.datetime) -> dict[tuple[str, str], float]:
    """(vc, user) -> decayed GPU-seconds from the accounting rollup (``usage_totals``, per UTC day).

    A day's GPU time counts as if used at its middle and weighs ``0.5 ** (age / half-life)``; days
    older than ten half-lives (under 0.1 %) are not read. Running attempts are booked into the
    rollup every ``accounting_interval_s``, so work that runs now adds to its owner's use."""
    half_life_h = settings.fair_share_half_life_h
    if half_life_h <= 0:
        return {}
    days = min(3660, math.ceil(half_life_h * 10 / 24)) + 1
    today = now.date()
    rows = session.execute(
        sa.select(UsageTotal.start, UsageTotal.user_id, UsageTotal.vc_id, sa.func.sum(UsageTotal.gpu_ms))
        .where(UsageTotal.period == "day", UsageTotal.start >= today - dt.timedelta(days=days))
        .group_by(UsageTotal.start, UsageTotal.user_id, UsageTotal.vc_id)
    ).all()
    if not rows:
        return {}
    users = dict(session.execute(sa.select(User.id, User.name).where(User.id.in_({r[1] for r in rows}))).all())
    out: dict[tuple[str, str], float] = {}
    for day, user_id, vc_id, gpu_ms in rows:
        vc, user = vc_names.get(vc_id), users.get(user_id)
        if vc is None or user is None or not gpu_ms:
            continue
        middle = dt.datetime.combine(day, dt.time(12))
        age_h = max(0.0, (now.replace(tzinfo=None) - middle).total_seconds() / 3600)
        out[(vc, user)] = out.get((vc, user), 0.0) + int(gpu_ms) / 1000 * 0.5 ** (age_h / half_life_h)
    return out
