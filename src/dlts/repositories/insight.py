"""Queries of the insight manager (managers/insight.py): running GPU jobs with their current
attempt, their utilisation minutes, their nodes' last reports, and the queue pressure on each SKU.
Repositories never commit."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.models import (
    ACTIVE,
    Job,
    JobAttempt,
    JobInsight,
    JobStatus,
    Node,
    UtilisationPoint,
    VirtualCluster,
)
from dlts.repositories.usage import TOTAL_GPUS

CHUNK = 500


def running_gpu_jobs(session: Session) -> list[tuple[Job, JobAttempt]]:
    """Running jobs that hold GPUs, with their current attempt (started)."""
    rows = session.execute(
        sa.select(Job, JobAttempt)
        .join(JobAttempt, sa.and_(JobAttempt.job_id == Job.id, JobAttempt.number == Job.attempt))
        .where(Job.status == JobStatus.RUNNING, Job.gpus > 0, JobAttempt.started_at.is_not(None))
        .order_by(Job.id))
    return [(job, attempt) for job, attempt in rows]


def points_since(session: Session, attempt_ids: Sequence[int], since: dt.datetime) -> dict[int, list[UtilisationPoint]]:
    out: dict[int, list[UtilisationPoint]] = defaultdict(list)
    ids = list(attempt_ids)
    for i in range(0, len(ids), CHUNK):
        for p in session.scalars(sa.select(UtilisationPoint).where(
                UtilisationPoint.attempt_id.in_(ids[i:i + CHUNK]), UtilisationPoint.minute >= since)
                .order_by(UtilisationPoint.minute, UtilisationPoint.node)):
            out[p.attempt_id].append(p)
    return out


def nodes_named(session: Session, names: Sequence[str]) -> dict[str, Node]:
    out: dict[str, Node] = {}
    names = sorted(set(names))
    for i in range(0, len(names), CHUNK):
        out.update({n.name: n for n in session.scalars(sa.select(Node).where(Node.name.in_(names[i:i + CHUNK])))})
    return out


def current_insights(session: Session) -> dict[int, dict[str, JobInsight]]:
    """job id -> code -> row, for every job with a finding (only running jobs keep them)."""
    out: dict[int, dict[str, JobInsight]] = defaultdict(dict)
    for row in session.scalars(sa.select(JobInsight).order_by(JobInsight.job_id, JobInsight.id)):
        out[row.job_id][row.code] = row
    return out


def insights_of(session: Session, job_id: int) -> list[JobInsight]:
    return list(session.scalars(sa.select(JobInsight).where(JobInsight.job_id == job_id).order_by(JobInsight.id)))


def vc_policies(session: Session) -> dict[int, dict]:
    return {vc_id: policy for vc_id, policy in session.execute(
        sa.select(VirtualCluster.id, VirtualCluster.idle_policy).where(VirtualCluster.idle_policy.is_not(None)))
        if policy}


def sku_pressure(session: Session) -> dict[str, tuple[int, int]]:
    """SKU -> (non-preemptible GPUs queued within their VC's quota, free GPUs). A VC's queued demand
    counts up to what its quota still guarantees it (quota minus its non-preemptible GPUs in use):
    the part the scheduler would take back from preemptible work."""
    capacity = {sku: int(total or 0) for sku, total in session.execute(
        sa.select(Node.sku, sa.func.sum(Node.gpus)).where(Node.ready.is_(True), Node.cordoned_by.is_(None))
        .group_by(Node.sku))}
    used: dict[str, int] = defaultdict(int)
    guaranteed_used: dict[tuple[int, str], int] = defaultdict(int)
    for vc_id, sku, preemptible, gpus in session.execute(
            sa.select(Job.vc_id, Job.sku, Job.preemptible, sa.func.coalesce(sa.func.sum(TOTAL_GPUS), 0))
            .where(Job.status.in_(list(ACTIVE)), Job.sku.is_not(None)).group_by(Job.vc_id, Job.sku, Job.preemptible)):
        used[sku] += int(gpus)
        if not preemptible:
            guaranteed_used[(vc_id, sku)] += int(gpus)
    quotas: dict[int, dict] = {vc_id: quota for vc_id, quota in session.execute(
        sa.select(VirtualCluster.id, VirtualCluster.quota))}
    waiting: dict[str, int] = defaultdict(int)
    for vc_id, sku, gpus in session.execute(
            sa.select(Job.vc_id, Job.sku, sa.func.coalesce(sa.func.sum(TOTAL_GPUS), 0))
            .where(Job.status == JobStatus.QUEUED, Job.preemptible.is_(False), Job.sku.is_not(None))
            .group_by(Job.vc_id, Job.sku)):
        room = max(0, int((quotas.get(vc_id) or {}).get(sku, 0)) - guaranteed_used[(vc_id, sku)])
        waiting[sku] += min(int(gpus), room)
    return {sku: (waiting.get(sku, 0), max(0, capacity.get(sku, 0) - used.get(sku, 0)))
            for sku in set(capacity) | set(waiting)}
