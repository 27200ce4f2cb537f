"""What is in use right now, read from jobs and their current attempts. Repositories never commit.

"In use" means the job's status is in ``ACTIVE`` (scheduling, running, pausing, killing): the
backend holds objects for it. GPU counts of distributed jobs are per node, so totals multiply by
``nodes``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.models import ACTIVE, Job, JobAttempt, JobStatus, User, VirtualCluster

TOTAL_GPUS = sa.case((Job.nodes > 0, Job.gpus * Job.nodes), else_=Job.gpus)
TOTAL_CPU = sa.case((Job.nodes > 0, Job.cpu * Job.nodes), else_=Job.cpu)
TOTAL_MEMORY = sa.case((Job.nodes > 0, Job.memory_bytes * Job.nodes), else_=Job.memory_bytes)


@dataclass(frozen=True)
class UseRow:
    vc: str
    user: str
    sku: str | None
    preemptible: bool
    jobs: int
    gpus: int
    cpu: float
    memory_bytes: int


def active_use(session: Session, vc_names: list[str] | None = None) -> list[UseRow]:
    """Resources held by active jobs, grouped by VC, user, SKU and preemptibility."""
    query = (
        sa.select(VirtualCluster.name, User.name, Job.sku, Job.preemptible, sa.func.count(Job.id),
                  sa.func.coalesce(sa.func.sum(TOTAL_GPUS), 0), sa.func.coalesce(sa.func.sum(TOTAL_CPU), 0),
                  sa.func.coalesce(sa.func.sum(TOTAL_MEMORY), 0))
        .join(VirtualCluster, VirtualCluster.id == Job.vc_id)
        .join(User, User.id == Job.user_id)
        .where(Job.status.in_(list(ACTIVE)))
        .group_by(VirtualCluster.name, User.name, Job.sku, Job.preemptible)
    )
    if vc_names is not None:
        query = query.where(VirtualCluster.name.in_(vc_names) if vc_names else sa.false())
    return [UseRow(vc, user, sku, bool(pre), int(n), int(g), float(c), int(m))
            for vc, user, sku, pre, n, g, c, m in session.execute(query)]


def queued_gpus(session: Session, vc_names: list[str] | None = None) -> dict[tuple[str, str | None], int]:
    """GPUs asked by jobs waiting in the queue (queued, unapproved), by (VC, SKU)."""
    query = (
        sa.select(VirtualCluster.name, Job.sku, sa.func.coalesce(sa.func.sum(TOTAL_GPUS), 0))
        .join(VirtualCluster, VirtualCluster.id == Job.vc_id)
        .where(Job.status.in_([JobStatus.QUEUED, JobStatus.UNAPPROVED]))
        .group_by(VirtualCluster.name, Job.sku)
    )
    if vc_names is not None:
        query = query.where(VirtualCluster.name.in_(vc_names) if vc_names else sa.false())
    return {(vc, sku): int(g) for vc, sku, g in session.execute(query)}


@dataclass(frozen=True)
class NodeUse:
    gpu_indices: frozenset[int]
    cpu: float
    memory_bytes: int
    job_ids: tuple[int, ...]


def node_use(session: Session) -> dict[str, NodeUse]:
    """Per node: GPU indices, cores and bytes held by the current attempts of active jobs."""
    rows = session.execute(
        sa.select(Job.id, JobAttempt.placements)
        .join(JobAttempt, sa.and_(JobAttempt.job_id == Job.id, JobAttempt.number == Job.attempt))
        .where(Job.status.in_(list(ACTIVE)))
    )
    gpus: dict[str, set[int]] = defaultdict(set)
    cpu: dict[str, float] = defaultdict(float)
    memory: dict[str, int] = defaultdict(int)
    jobs: dict[str, list[int]] = defaultdict(list)
    for job_id, placements in rows:
        for p in placements or []:
            node = p.get("node")
            if not node:
                continue
            gpus[node].update(int(i) for i in p.get("gpu_indices", []))
            cpu[node] += float(p.get("cpu") or 0)
            memory[node] += int(p.get("memory_bytes") or 0)
            jobs[node].append(job_id)
    return {n: NodeUse(frozenset(gpus[n]), cpu[n], memory[n], tuple(sorted(set(jobs[n])))) for n in jobs}
