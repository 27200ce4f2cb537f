"""Assigned-but-idle GPUs now, per user (the portal's usage page). (GPU hours come
from the accounting rollup, services/accounting.py.)"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.models import ACTIVE, Job, Node, User, VirtualCluster
from dlts.services.nodes import reported_gpus

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
