"""Build the scheduler's ``Snapshot`` from the database in a handful of queries.

Also the one place that converts ``JobAttempt.placements`` (JSON) to and from values:
``[{"node", "gpu_indices", "cpu", "memory_bytes", "replica", "retiring"?}, ...]``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.config import Settings
from dlts.models import ACTIVE, Job, JobAttempt, JobStatus, Node, VirtualCluster
from dlts.repositories.cluster import sku_shapes
from dlts.scheduler import model as core


def epoch(value: dt.datetime | None) -> float | None:
    return None if value is None else value.replace(tzinfo=dt.timezone.utc).timestamp()


@dataclass(frozen=True)
class Replica:
    """One entry of ``JobAttempt.placements``: a placement with its stable replica index.

    The index names the backend's per-replica objects (pod ``dlts-J-A-<index>``, the local run
    directory ``replicas/<index>``). ``retiring``: DLTS asked the replica to stop (inference
    scale-down); it holds its resources until the backend shows it gone, then leaves the list.
    """

    index: int
    placement: core.Placement
    retiring: bool = False


def replicas_from_json(rows: list | None) -> tuple[Replica, ...]:
    """The attempt's entries in order; an entry without ``replica`` (older rows) is its position."""
    out = []
    for position, p in enumerate(rows or []):
        placement = core.Placement(p["node"], tuple(p["gpu_indices"]), float(p["cpu"]), int(p["memory_bytes"]))
        out.append(Replica(int(p.get("replica", position)), placement, bool(p.get("retiring", False))))
    return tuple(out)


def replicas_to_json(replicas) -> list[dict]:
    rows = []
    for r in replicas:
        p = r.placement
        row = {"node": p.node, "gpu_indices": list(p.gpu_indices), "cpu": p.cpu, "memory_bytes": p.memory_bytes,
               "replica": r.index}
        if r.retiring:
            row["retiring"] = True
        rows.append(row)
    return rows


def placements_to_json(placements) -> list[dict]:
    """The entries of a new attempt: replica indexes 0, 1, 2, ... in placement order."""
    return replicas_to_json(Replica(i, p) for i, p in enumerate(placements))


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
            user_quota_approved=bool((job.spec or {}).get("approved_by")),
            placements=tuple(r.placement for r in replicas if not r.retiring),
            retiring=tuple(r.placement for r in replicas if r.retiring),
            min_replicas=(job.spec or {}).get("min_replicas", 0), max_replicas=(job.spec or {}).get("max_replicas", 0),
        ))
    return core.Snapshot(skus=sku_shapes(session), nodes=nodes, vcs=vcs, jobs=tuple(jobs),
                         cpu_job_default_cpu=settings.cpu_job_default_cpu,
                         cpu_job_default_memory_bytes=settings.cpu_job_default_memory_bytes,
                         reservation_depth=settings.reservation_depth)
