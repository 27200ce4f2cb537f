"""Cluster status: capacity and use per SKU and per VC, and the GPU fragmentation histogram.

Everybody sees the capacity per SKU; the per-VC rows only for the VCs the caller belongs to.

The histogram counts, per SKU, how many schedulable nodes have 0, 1, ..., N GPUs free: a cluster
with 40 free GPUs spread one per node cannot start an 8-GPU job, and this is where that shows.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts import db_faults
from dlts.models import Node, VirtualCluster, iso, utcnow
from dlts.repositories import cluster as cluster_repo
from dlts.repositories import usage as usage_repo
from dlts.scheduler.model import CPU_SKU, SkuShape
from dlts.services.auth import Principal
from dlts.services.transaction import best_effort_write, transaction


@dataclass(frozen=True)
class SkuStatus:
    sku: str
    nodes: int
    nodes_schedulable: int
    gpus: int
    gpus_schedulable: int
    gpus_used: int
    gpus_free: int  # on schedulable nodes
    # GPUs that neither run a job nor can take one: idle GPUs of cordoned/unhealthy/in-repair/lost
    # nodes. Used GPUs on such nodes are in gpus_used, so used + free + unschedulable = gpus.
    gpus_unschedulable: int
    cpu: float
    cpu_used: float
    memory_bytes: int
    memory_used_bytes: int
    # free GPUs per node -> number of schedulable nodes; keys "0".."N"
    fragmentation: dict[str, int]


@dataclass(frozen=True)
class VcStatus:
    vc: str
    quota: dict[str, int]
    gpus_used: dict[str, int]  # non-preemptible, by SKU
    preemptible_gpus_used: dict[str, int]
    gpus_queued: dict[str, int]
    jobs_running: int


@dataclass(frozen=True)
class ClusterStatus:
    at: str | None
    skus: list[SkuStatus]
    vcs: list[VcStatus]


def status(session: Session, principal: Principal | None = None) -> ClusterStatus:
    """Capacity per SKU for everybody; per VC only the VCs ``principal`` belongs to (cluster admins,
    and callers inside the system that pass no principal: every VC). Another VC's name and quota
    are not shown, as its pages answer 404."""
    nodes = list(session.scalars(sa.select(Node).order_by(Node.name)))
    used = usage_repo.node_use(session)
    skus: list[SkuStatus] = []
    for sku in sorted({n.sku for n in nodes}):
        of_sku = [n for n in nodes if n.sku == sku]
        schedulable = [n for n in of_sku if n.schedulable]
        gpus_per_node = max((n.gpus for n in of_sku), default=0)
        histogram = {str(i): 0 for i in range(gpus_per_node + 1)} if sku != CPU_SKU else {}
        free_total = 0
        idle_unschedulable = sum(max(0, n.gpus - (len(used[n.name].gpu_indices) if n.name in used else 0))
                                 for n in of_sku if not n.schedulable)
        for n in schedulable:
            free = max(0, n.gpus - len(used[n.name].gpu_indices) if n.name in used else n.gpus)
            free_total += free
            if sku != CPU_SKU:
                histogram[str(free)] = histogram.get(str(free), 0) + 1
        skus.append(SkuStatus(
            sku=sku, nodes=len(of_sku), nodes_schedulable=len(schedulable), gpus=sum(n.gpus for n in of_sku),
            gpus_schedulable=sum(n.gpus for n in schedulable),
            gpus_used=sum(len(used[n.name].gpu_indices) for n in of_sku if n.name in used), gpus_free=free_total,
            gpus_unschedulable=idle_unschedulable,
            cpu=sum(n.cpu for n in of_sku), cpu_used=round(sum(used[n.name].cpu for n in of_sku if n.name in used), 3),
            memory_bytes=sum(n.memory_bytes for n in of_sku),
            memory_used_bytes=sum(used[n.name].memory_bytes for n in of_sku if n.name in used),
            fragmentation=histogram,
        ))
    use = usage_repo.active_use(session)
    queued = usage_repo.queued_gpus(session)
    vcs = []
    query = sa.select(VirtualCluster).order_by(VirtualCluster.name)
    if principal is not None and not principal.is_cluster_admin:
        query = query.where(VirtualCluster.name.in_(principal.vcs) if principal.vcs else sa.false())
    for vc in session.scalars(query):
        rows = [r for r in use if r.vc == vc.name]
        plain: dict[str, int] = {}
        pre: dict[str, int] = {}
        for r in rows:
            target = pre if r.preemptible else plain
            key = r.sku or CPU_SKU
            target[key] = target.get(key, 0) + r.gpus
        vcs.append(VcStatus(vc.name, {k: int(v) for k, v in (vc.quota or {}).items()}, plain, pre,
                            {sku or CPU_SKU: g for (name, sku), g in queued.items() if name == vc.name},
                            sum(r.jobs for r in rows)))
    return ClusterStatus(iso(utcnow()), skus, vcs)


def database_answers(session: Session) -> bool:
    """Whether the database answers a trivial query now (``/readyz``); the session is left unused."""
    try:
        with transaction(session):  # an error rolls back
            session.execute(sa.text("SELECT 1"))
    except sa.exc.SQLAlchemyError:
        return False
    finally:
        session.close()
    return True


def write_fault(session: Session) -> db_faults.WriteFault | None:
    """Why the database refuses writes now, as this process last saw (``db_faults``); while it does,
    a write is tried at most every ``WriteHealth.PROBE_EVERY_S`` (a no-op UPDATE of the schema
    version's row) so that readiness comes back by itself. None: writes go through."""
    health = db_faults.health_of(session.get_bind().engine)
    if health.probe_due():
        version = sa.table("alembic_version", sa.column("version_num"))
        try:
            best_effort_write(session, sa.update(version).values(version_num=version.c.version_num))
        except sa.exc.SQLAlchemyError:
            pass  # unreachable: database_answers says so
        finally:
            session.close()
    return health.fault


def sku_shapes(session: Session) -> dict[str, SkuShape]:
    """The usual node shape of each SKU (what the submit form sizes a job against)."""
    return cluster_repo.sku_shapes(session)
