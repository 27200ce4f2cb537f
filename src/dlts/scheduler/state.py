"""The mutable working copy of the cluster that one scheduling pass reads and updates.

``PassState`` is built from a ``Snapshot`` at the start of ``decide`` and thrown away at the end;
nothing outside the pass ever sees it. It owns:

* per-node free GPUs (a bit mask of stable indices), cores and bytes;
* *pools*: the schedulable nodes of one SKU open to one VC (hard-assigned) or to every VC, with
  nodes bucketed by free GPU count (best fit is "lowest bucket that fits") and, per IB domain, the
  nodes whose GPUs are all free (gangs take whole nodes);
* usage counters the admission rules read (VC non-preemptible use per SKU, per user, interactive);
* *holdings*: what running jobs hold, as units the reclaim rule may free (a preemptible job, or one
  extra replica of an inference job); inference replicas being removed (``Job.retiring``) are
  holdings that are already stopping.

Free capacity only ever shrinks during a pass (stops keep their resources until the job exits), so
a request that failed once fails again for anything at least as large: ``FailureCache`` relies on
that to keep a pass over 20,000 pending jobs fast.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import TypeVar, cast

from dlts.scheduler.model import CPU_SKU, Job, JobType, Node, Placement, Rejection, Snapshot, Vc
from dlts.scheduler.quota import effective_cpu_memory_quota, gpu_reserve

T = TypeVar("T")

# Enum members the per-job code compares against, read once: on Python 3.11 reading a member off
# its class (``JobType.INFERENCE``) takes ~0.1-0.2 us (``EnumType`` defines ``__getattr__``, which
# sends every class attribute read through the slow path), and a pass does it ~500,000 times.
_INFERENCE, _INTERACTIVE = JobType.INFERENCE, JobType.INTERACTIVE

# the last job's request kept (``PassState.request``); decisions are the same without (tests compare)
MEMOISE = True


def cpu_job_fits(ns: NodeState, mask: int, cpu: float, memory_bytes: int, req: Request) -> bool:
    """Whether a CPU-only unit fits free (mask, cores, bytes) of ``ns`` without the cores and bytes
    reserved for the node's free GPUs."""
    left_cpu = cpu - req.cpu
    left_mem = memory_bytes - req.memory_bytes
    if left_cpu < -1e-9 or left_mem < 0:
        return False
    if ns.reserve_cpu or ns.reserve_memory_bytes:
        free_gpus = bin(mask & ns.usable_mask).count("1")
        return left_cpu + 1e-9 >= ns.reserve_cpu * free_gpus and left_mem >= ns.reserve_memory_bytes * free_gpus
    return True


@cache
def best_run(free_mask: int, n_gpus: int, want: int) -> int:
    """Start index of the shortest run of >= ``want`` contiguous free GPUs, or -1.

    Taking the shortest run that fits keeps longer runs whole for larger jobs (best fit inside a
    node); ties go to the lowest index so placements are stable.
    """
    best_start, best_len = -1, n_gpus + 1
    i = 0
    while i < n_gpus:
        if free_mask >> i & 1:
            j = i
            while j < n_gpus and free_mask >> j & 1:
                j += 1
            run = j - i
            if want <= run < best_len:
                best_start, best_len = i, run
            i = j
        else:
            i += 1
    return best_start


def mask_of(indices: tuple[int, ...]) -> int:
    m = 0
    for i in indices:
        m |= 1 << i
    return m


def indices_of(mask: int) -> tuple[int, ...]:
    out = []
    i = 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return tuple(out)


@dataclass(eq=False, slots=True)
class NodeState:
    node: Node
    full_mask: int
    free_mask: int
    free_gpus: int
    free_cpu: float
    free_memory_bytes: int
    holdings: list[Holding] = field(default_factory=list)
    # GPUs on this node held by unclaimed holdings: with ``free_gpus`` an upper bound on what
    # reclaim could free here, so most nodes are ruled out without looking at their jobs.
    reclaim_gpus: int = 0
    victim_order: list[Holding] | None = None  # holdings sorted for reclaim, built on first use
    # reclaim's lower bound on this node's cost per protection level allowed (``reclaim.py``),
    # dropped whenever one of its holdings is added, claimed or told to stop
    bounds: dict[int, tuple[float, ...] | None] | None = None
    # reclaim's whole-node option per protection level allowed, with the free capacity it was
    # computed for (``reclaim.py``); dropped with ``bounds``
    gang: dict[int, tuple[tuple[int, float, int], tuple[tuple[float, ...], list[Holding], float, int] | None]] | None = None
    name: str = ""  # the node's name, copied for the hot loops
    # the GPUs that may ever be free here: all but ``Node.unhealthy_gpus`` (-1: all)
    usable_mask: int = -1
    # cores and bytes kept for each free GPU; CPU-only jobs may not take them (``quota.py``)
    reserve_cpu: float = 0.0
    reserve_memory_bytes: int = 0

    def __post_init__(self) -> None:
        self.name = self.node.name

    @property
    def whole_free(self) -> bool:
        return self.free_mask == self.full_mask


@dataclass(eq=False, slots=True)
class Pool:
    """Schedulable nodes of one SKU open to one VC (``vc`` set) or to every VC (``vc`` None)."""

    sku: str
    vc: str | None
    max_gpus: int = 0
    nodes: list[NodeState] = field(default_factory=list)
    buckets: list[dict[str, NodeState]] = field(default_factory=list)
    whole_by_domain: dict[str, dict[str, NodeState]] = field(default_factory=dict)
    nodes_by_domain: dict[str, int] = field(default_factory=dict)
    free_gpus: int = 0
    free_cpu: float = 0.0
    free_memory_bytes: int = 0
    _memo: dict[tuple[object, ...], object] = field(default_factory=dict)

    def memo(self, key: tuple[object, ...], compute: Callable[[], T]) -> T:
        """Per-pass memo of answers that depend on the pool's inventory only (not on use); one
        key always holds what its ``compute`` returns."""
        if key not in self._memo:
            self._memo[key] = compute()
        return cast(T, self._memo[key])

    def add(self, ns: NodeState) -> None:
        self.nodes.append(ns)
        self.max_gpus = max(self.max_gpus, ns.node.gpus)
        while len(self.buckets) <= self.max_gpus:
            self.buckets.append({})
        self.buckets[ns.free_gpus][ns.name] = ns
        dom = ns.node.ib_domain
        self.nodes_by_domain[dom] = self.nodes_by_domain.get(dom, 0) + 1
        self.whole_by_domain.setdefault(dom, {})
        if ns.whole_free:
            self.whole_by_domain[dom][ns.name] = ns
        self.free_gpus += ns.free_gpus
        self.free_cpu += ns.free_cpu
        self.free_memory_bytes += ns.free_memory_bytes


@dataclass(eq=False, slots=True)
class Holding:
    """What one reclaimable unit holds: a whole running job, or one extra inference replica."""

    job: Job
    placements: tuple[Placement, ...]
    replica: bool  # True: an inference replica above min_replicas (stopped as scale_down)
    stopping: bool  # already told to stop: frees at no extra cost
    claimed: bool = False  # taken by a reclaim earlier in this pass
    shares: dict[str, tuple[int, float, int]] | None = None  # per node (mask, cores, bytes), lazily
    retiring: bool = False  # a replica already being removed (``Job.retiring``), not one of its replicas
    # preemption budget: 0 may be preempted; 1 ran less than its VC's min_runtime_s (a job waiting
    # longer than its VC's max_reclaim_delay_s may still take it); 2 also preempted max_preemptions
    # times already (protected for min_runtime_s without exception)
    protect: int = 0
    protected_until: float = 0.0


class FailureCache:
    """Remembers requests that found no room in a pool during this pass.

    Valid because free capacity never grows inside a pass: if (gpus, cpu, memory) did not fit,
    nothing at least as large fits later in the same pass.
    """

    def __init__(self) -> None:
        self._failed: dict[tuple[object, ...], list[tuple[int, float, int]]] = defaultdict(list)

    def known_to_fail(self, key: tuple[object, ...], gpus: int, cpu: float, memory_bytes: int) -> bool:
        # a loop, not any(generator): 3.5x faster on a miss (timeit, three entries), and a pass asks often
        for g, c, m in self._failed.get(key, ()):  # noqa: SIM110
            if g <= gpus and c <= cpu and m <= memory_bytes:
                return True
        return False

    def record(self, key: tuple[object, ...], gpus: int, cpu: float, memory_bytes: int) -> None:
        entries = self._failed[key]
        if len(entries) < 16:  # a handful of shapes covers real queues; keep the check cheap
            entries.append((gpus, cpu, memory_bytes))


@dataclass(frozen=True, slots=True)
class Request:
    """The resolved shape of one placement unit of a job."""

    sku: str  # CPU_SKU for CPU-only requests
    gpus: int  # per unit (per node for gangs, per replica for inference)
    cpu: float
    memory_bytes: int
    units: int  # placements needed together (gang nodes, inference min replicas, else 1)
    whole_node: bool  # gangs take whole nodes
    same_domain: bool  # gangs stay inside one IB domain unless the job says ``ib_domain: any``

    @property
    def total_gpus(self) -> int:
        return self.gpus * self.units


class PassState:
    """Everything one pass of ``decide`` reads and mutates."""

    def __init__(self, snapshot: Snapshot, now: float) -> None:
        self.snapshot = snapshot
        self.now = now
        self.vcs: dict[str, Vc] = dict(snapshot.vcs)
        self.nodes: dict[str, NodeState] = {}
        self.pools: dict[tuple[str, str | None], Pool] = {}
        # node name -> its pool (none for nodes that take no new work). Kept here, not on the
        # node: a node and its pool referring to each other would make every pass's state a
        # reference cycle, left for the cyclic collector to walk after the pass.
        self.pool_of: dict[str, Pool] = {}
        # VC -> SKU -> non-preemptible GPUs (cores for CPU_SKU) held
        self.vc_used: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.vc_used_memory: dict[str, int] = defaultdict(int)  # CPU-only non-preemptible bytes
        self.user_used: dict[tuple[str, str], int] = defaultdict(int)  # (vc, user) -> GPUs
        self.interactive_used: dict[str, int] = defaultdict(int)  # vc -> GPUs
        self.holdings: list[Holding] = []
        self.holdings_by_job: dict[int, list[Holding]] = defaultdict(list)
        self.stopped: set[int] = set()  # jobs told to stop in this pass
        self.node_match_cache: dict[tuple[str, int], Rejection | None] = {}  # (vc, id(request))
        self.explain_cache: dict[tuple[object, ...], Rejection] = {}  # (request, pools' free totals) -> Rejection
        self.fail_cache = FailureCache()
        self.reclaim_fail_cache = FailureCache()
        self._request_cache: dict[tuple[object, ...], Request | None] = {}
        self._keep_last = MEMOISE
        self._last_job: Job | None = None
        self._last_request: Request | None = None
        self._cpu_quota: dict[str, tuple[float, int, str, str]] = {}
        self.any_protected = False  # some holding is inside its preemption budget (min_runtime_s)
        self._build_nodes()
        self._apply_running()

    # -- building ------------------------------------------------------------------------------

    def _build_nodes(self) -> None:
        for node in self.snapshot.nodes:
            full = (1 << node.gpus) - 1
            free = full & ~mask_of(node.unhealthy_gpus)  # a faulty GPU is never free, so never placed
            ns = NodeState(node, full, free, bin(free).count("1"), float(node.cpu), int(node.memory_bytes), usable_mask=free)
            ns.reserve_cpu, ns.reserve_memory_bytes = gpu_reserve(node, self.snapshot.skus)
            self.nodes[node.name] = ns

    def _apply_running(self) -> None:
        for job in self.snapshot.jobs:
            if not job.running:
                continue
            for p in job.placements + job.retiring:
                ns = self.nodes.get(p.node)
                if ns is None:  # node gone from the inventory: nothing left to account on it
                    continue
                m = mask_of(p.gpu_indices) & ns.full_mask & ns.free_mask
                ns.free_mask &= ~m
                ns.free_gpus = bin(ns.free_mask).count("1")
                ns.free_cpu = ns.free_cpu - p.cpu
                ns.free_memory_bytes = ns.free_memory_bytes - p.memory_bytes
            self._count_usage(job, len(job.placements), sign=1)
            self._add_holdings(job)
        # Pools are built after running work is subtracted so buckets start right.
        for ns in self.nodes.values():
            if not ns.node.schedulable:
                continue
            key = (ns.node.sku, ns.node.vc)
            pool = self.pools.get(key)
            if pool is None:
                pool = self.pools[key] = Pool(ns.node.sku, ns.node.vc)
            pool.add(ns)
            self.pool_of[ns.name] = pool

    def _add_holdings(self, job: Job) -> None:
        for p in job.retiring:  # replicas on their way out: room that comes free by itself
            self._add_holding(Holding(job, (p,), True, True, retiring=True))
        if job.type is JobType.INFERENCE:
            core = max(1, job.min_replicas)
            if len(job.placements) > core:
                for p in job.placements[core:]:
                    self._add_holding(Holding(job, (p,), True, job.stopping))
            if job.preemptible or job.stopping:
                self._add_holding(Holding(job, job.placements[:core], False, job.stopping))
            return
        if job.preemptible or job.stopping:
            self._add_holding(Holding(job, job.placements, False, job.stopping))

    def mark_stopping(self, job: Job) -> None:
        """A stop decided in this pass: the job keeps its resources until it exits, but reclaim
        may count them as coming free and it is never picked as a victim again."""
        self.stopped.add(job.id)
        found = self.holdings_by_job.get(job.id, ())
        rest = list(job.placements)
        for h in found:
            h.stopping = True
            self._touch(h)
            if h.retiring:
                continue
            for p in h.placements:
                if p in rest:
                    rest.remove(p)
        if rest:  # placements no holding covered (the non-preemptible core of the job)
            self._add_holding(Holding(job, tuple(rest), False, True))

    def _add_holding(self, h: Holding) -> None:
        if not h.stopping and not h.replica:
            self._budget(h)
        self.holdings.append(h)
        self.holdings_by_job[h.job.id].append(h)
        listed: set[str] = set()
        for p in h.placements:
            ns = self.nodes.get(p.node)
            if ns is not None:
                if p.node not in listed:  # once per node, however many of its placements are there
                    # (an inference job's core replicas often share a node: listed twice, reclaim
                    # counted its share twice and preempted it for room that never came)
                    ns.holdings.append(h)
                    listed.add(p.node)
                ns.reclaim_gpus += len(p.gpu_indices)
                ns.bounds = ns.gang = None

    def _budget(self, h: Holding) -> None:
        """Set ``h.protect`` from the preemption budget of the job's VC (``Vc.min_runtime_s``)."""
        job = h.job
        vc = self.vcs.get(job.vc)
        if vc is None or vc.min_runtime_s <= 0 or job.started_at is None:
            return
        until = job.started_at + vc.min_runtime_s
        if self.now >= until:
            return
        h.protected_until = until
        h.protect = 2 if vc.max_preemptions and job.preemptions >= vc.max_preemptions else 1
        self.any_protected = True

    def claim(self, h: Holding) -> None:
        """Reserve a holding for one reclaim; nobody else may count on it this pass."""
        if h.claimed:
            return
        h.claimed = True
        for p in h.placements:
            ns = self.nodes.get(p.node)
            if ns is not None:
                ns.reclaim_gpus -= len(p.gpu_indices)
                ns.bounds = ns.gang = None

    def _touch(self, h: Holding) -> None:
        """A holding changed: the reclaim bounds cached on its nodes are stale."""
        for p in h.placements:
            ns = self.nodes.get(p.node)
            if ns is not None:
                ns.bounds = ns.gang = None

    # -- usage ---------------------------------------------------------------------------------

    def cpu_quota(self, vc: Vc) -> tuple[float, int, str, str]:
        """The VC's effective CPU-only quota (cores, bytes, sources); see ``quota.py``."""
        got = self._cpu_quota.get(vc.name)
        if got is None:
            got = self._cpu_quota[vc.name] = effective_cpu_memory_quota(vc, self.snapshot.skus)
        return got

    def core_units(self, job: Job, units: int) -> int:
        """How many of ``units`` placements count as non-preemptible for quota."""
        if job.preemptible:
            return 0
        if job.type is _INFERENCE:
            return min(units, max(1, job.min_replicas))
        return units

    def _count_usage(self, job: Job, units: int, sign: int) -> None:
        req = self.request(job)
        if req is None:
            return
        core = self.core_units(job, units)
        if core:
            if req.sku == CPU_SKU:
                self.vc_used[job.vc][CPU_SKU] += sign * req.cpu * core
                self.vc_used_memory[job.vc] += sign * req.memory_bytes * core
            else:
                self.vc_used[job.vc][req.sku] += sign * req.gpus * core
                self.user_used[(job.vc, job.user)] += sign * req.gpus * core
        if job.type is _INTERACTIVE:
            self.interactive_used[job.vc] += sign * req.gpus * units

    def count_start(self, job: Job, units: int) -> None:
        self._count_usage(job, units, sign=1)

    # -- requests ------------------------------------------------------------------------------

    def request(self, job: Job) -> Request | None:
        """Resolve a job's shape (defaults for unset cpu/memory); None when its SKU is unknown.

        Cached by shape, not by job: 20,000 pending jobs come in a few dozen shapes. The last job's
        answer is kept too: the pass asks for one job's request several times in a row (its
        filters, the time model's quota counters, its start)."""
        if job is self._last_job:
            return self._last_request
        key = (job.type, job.sku, job.gpus, job.cpu, job.memory_bytes, job.nodes, job.ib_domain_any, job.min_replicas)
        try:  # one lookup (the key hashes eight fields): a few dozen shapes miss, every job asks
            req = self._request_cache[key]
        except KeyError:
            req = self._request_cache[key] = self._resolve(job)
        if self._keep_last:
            self._last_job, self._last_request = job, req
        return req

    def _resolve(self, job: Job) -> Request | None:
        snap = self.snapshot
        cpu_only = job.gpus <= 0 or job.sku in (None, CPU_SKU)
        if cpu_only and job.type is not JobType.DISTRIBUTED:
            cpu = job.cpu if job.cpu > 0 else snap.cpu_job_default_cpu
            mem = job.memory_bytes if job.memory_bytes > 0 else snap.cpu_job_default_memory_bytes
            units = max(1, job.min_replicas) if job.type is JobType.INFERENCE else 1
            return Request(CPU_SKU, 0, cpu, mem, units, False, False)
        shape = snap.skus.get(job.sku or "")
        if shape is None:
            return None
        if job.type is JobType.DISTRIBUTED or job.nodes > 0:
            gpus = shape.gpus  # a gang takes whole nodes, whatever per-node count was asked
            cpu = job.cpu if job.cpu > 0 else shape.cpu
            mem = job.memory_bytes if job.memory_bytes > 0 else shape.memory_bytes
            return Request(shape.name, gpus, cpu, mem, max(1, job.nodes), True, not job.ib_domain_any)
        share = job.gpus / shape.gpus if shape.gpus else 1.0
        cpu = job.cpu if job.cpu > 0 else shape.cpu * share
        mem = job.memory_bytes if job.memory_bytes > 0 else int(shape.memory_bytes * share)
        units = max(1, job.min_replicas) if job.type is JobType.INFERENCE else 1
        return Request(shape.name, job.gpus, cpu, mem, units, False, False)

    # -- pools ---------------------------------------------------------------------------------

    def pools_for(self, sku: str, vc: str) -> list[Pool]:
        """Pools a job of ``vc`` may use, its own hard-assigned nodes first."""
        out = []
        own = self.pools.get((sku, vc))
        if own is not None:
            out.append(own)
        shared = self.pools.get((sku, None))
        if shared is not None:
            out.append(shared)
        return out

    # -- taking and giving back ----------------------------------------------------------------

    def take(self, ns: NodeState, mask: int, cpu: float, memory_bytes: int) -> None:
        self._move(ns, ns.free_mask & ~mask, ns.free_cpu - cpu, ns.free_memory_bytes - memory_bytes)

    def give(self, ns: NodeState, mask: int, cpu: float, memory_bytes: int) -> None:
        self._move(ns, ns.free_mask | (mask & ns.usable_mask), ns.free_cpu + cpu, ns.free_memory_bytes + memory_bytes)

    def _move(self, ns: NodeState, new_mask: int, new_cpu: float, new_mem: int) -> None:
        pool = self.pool_of.get(ns.name)
        old_free = ns.free_gpus
        was_whole = ns.whole_free
        new_free = bin(new_mask).count("1")
        if pool is not None:
            pool.free_gpus += new_free - old_free
            pool.free_cpu += new_cpu - ns.free_cpu
            pool.free_memory_bytes += new_mem - ns.free_memory_bytes
            if new_free != old_free:
                del pool.buckets[old_free][ns.name]
                pool.buckets[new_free][ns.name] = ns
        ns.free_mask, ns.free_gpus, ns.free_cpu, ns.free_memory_bytes = (
            new_mask,
            new_free,
            new_cpu,
            new_mem,
        )
        if pool is not None and was_whole != ns.whole_free:
            dom = pool.whole_by_domain[ns.node.ib_domain]
            if ns.whole_free:
                dom[ns.name] = ns
            else:
                del dom[ns.name]

    def reserve(self, placements: list[Placement]) -> None:
        for p in placements:
            self.take(self.nodes[p.node], mask_of(p.gpu_indices), p.cpu, p.memory_bytes)

    def reserve_free_part(self, placements: list[Placement]) -> None:
        """Take what is free now of planned placements whose rest is still held by victims."""
        for p in placements:
            ns = self.nodes[p.node]
            cpu = min(p.cpu, max(ns.free_cpu, 0.0))
            mem = min(p.memory_bytes, max(ns.free_memory_bytes, 0))
            self.take(ns, mask_of(p.gpu_indices) & ns.free_mask, cpu, mem)

    def unreserve(self, placements: list[Placement]) -> None:
        for p in placements:
            self.give(self.nodes[p.node], mask_of(p.gpu_indices), p.cpu, p.memory_bytes)
