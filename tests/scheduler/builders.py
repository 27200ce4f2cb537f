"""Small builders for scheduler tests: a cluster in a line, a job in a line."""

from __future__ import annotations

from dataclasses import replace

from dlts.scheduler import (
    CPU_SKU,
    Decisions,
    Job,
    JobType,
    Node,
    Placement,
    Policy,
    SkuShape,
    Snapshot,
    Vc,
)

GIB = 1024**3

SKUS = {
    "a100": SkuShape("a100", 8, 96.0, 900 * GIB),
    "v100": SkuShape("v100", 4, 48.0, 400 * GIB),
    CPU_SKU: SkuShape(CPU_SKU, 0, 64.0, 256 * GIB),
}


# a100 nodes keep 10 cores and 100 GiB per free GPU, so 16 cores and 100 GiB are open to CPU-only jobs
LEAN_SKUS = {**SKUS, "a100": replace(SKUS["a100"], cpu_per_gpu=10.0, memory_per_gpu_bytes=100 * GIB)}


def node(name: str, sku: str = "a100", domain: str = "p1", vc: str | None = None, schedulable: bool = True) -> Node:
    shape = SKUS[sku]
    return Node(name, sku, shape.gpus, shape.cpu, shape.memory_bytes, domain, vc, schedulable)


def nodes(prefix: str, count: int, sku: str = "a100", domain: str = "p1", vc: str | None = None) -> list[Node]:
    return [node(f"{prefix}{i}", sku, domain, vc) for i in range(count)]


def vc(name: str = "v", policy: Policy = Policy.RF, **kw) -> Vc:
    quota = kw.pop("quota", {"a100": 64, "v100": 64})
    return Vc(name, quota, policy, **kw)


def job(
    id: int,
    gpus: int = 1,
    *,
    vc: str = "v",
    user: str = "alice",
    type: JobType = JobType.BATCH,
    sku: str | None = "a100",
    queue_time: float | None = None,
    **kw,
) -> Job:
    if gpus == 0 and sku == "a100":
        sku = None
    return Job(
        id=id,
        vc=vc,
        user=user,
        type=type,
        sku=sku,
        gpus=gpus,
        cpu=kw.pop("cpu", 0.0),
        memory_bytes=kw.pop("memory_bytes", 0),
        queue_time=float(id) if queue_time is None else queue_time,
        **kw,
    )


def placement(j: Job, name: str, idx: tuple[int, ...]) -> Placement:
    """One placement of ``j`` on node ``name`` with GPU indices ``idx``; cores/bytes proportional."""
    shape = SKUS[j.sku or CPU_SKU]
    share = len(idx) / shape.gpus if shape.gpus else 0
    cpu = j.cpu if j.cpu > 0 else (shape.cpu * share if idx else 1.0)
    mem = j.memory_bytes if j.memory_bytes > 0 else (int(shape.memory_bytes * share) if idx else 2 * GIB)
    return Placement(name, tuple(idx), cpu, mem)


def running(j: Job, *where: tuple[str, tuple[int, ...]], started_at: float = 0.0,
            retiring: tuple[tuple[str, tuple[int, ...]], ...] = (), **kw) -> Job:
    """``j`` running on ``where``: (node, gpu indices) per placement; ``retiring``: inference
    replicas being removed, given the same way."""
    placements = tuple(placement(j, name, idx) for name, idx in where)
    gone = tuple(placement(j, name, idx) for name, idx in retiring)
    return replace(j, running=True, started_at=started_at, placements=placements, retiring=gone, **kw)


def snap(node_list, vcs, jobs, skus=None, **kw) -> Snapshot:
    vcs = vcs if isinstance(vcs, (list, tuple)) else [vcs]
    return Snapshot(skus or SKUS, tuple(node_list), {v.name: v for v in vcs}, tuple(jobs), **kw)


def summary(d: Decisions) -> dict:
    """Decisions as plain data that reads well in a failed assert."""
    return {
        "starts": {s.job_id: [(p.node, p.gpu_indices) for p in s.placements] for s in d.starts},
        "stops": {s.job_id: s.reason.value for s in d.stops},
        "waits": {w.job_id: w.reason_code for w in d.waits},
    }
