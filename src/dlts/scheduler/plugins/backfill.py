"""Backfill: RF plus reservations for the jobs at the head of the order that cannot start.

``policy: backfill`` on a VC. The pass walks the order as RF does; the first
``Snapshot.reservation_depth`` non-preemptible jobs of backfill VCs that cannot start (in the
pass's order, across VCs) get a *reservation*: the earliest time at which, by the time model of
``dlts.scheduler.reservations``, their VC's quotas admit them and nodes hold them, and the
placements they would take then. Every job considered after a reservation (any VC, preemptible
jobs and extra inference replicas too) starts only if it ends, by its limit, before the
reservation starts, or takes none of the reserved resources (GPU indices, cores, bytes, quota);
else it waits with reason ``reservation:<id>``.

Jobs of backfill VCs are placed first fit in a fixed node order (own pool, then shared, snapshot
order; gangs: the first IB domain by name), now and in reservations alike, so the model that
computes an estimate is the one that places the job when its time comes. Jobs of other VCs keep
their best-fit placement until a reservation exists in the pass; after that they are placed by
the same first-fit rule so they can step around reserved resources.

The effective duration of a job is its limit (``max_time_s``, else the VC's ``max_job_time_s``),
else its VC's ``default_runtime_estimate_s``, else unbounded (its reservation, if any, never ends;
an estimate that depends on it is unknown).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

from dlts.scheduler.framework import ReclaimPlan, VcQueue
from dlts.scheduler.model import Job, Placement, Policy, Rejection, Reservation, Vc, WaitReason
from dlts.scheduler.plugins.placement import _fits_cpu_mem, cpu_pools
from dlts.scheduler.plugins.walltime import effective_limit_s
from dlts.scheduler.reservations import INF, Item, Timeline, first_run, mask_of
from dlts.scheduler.state import Holding, NodeState, PassState, Pool, Request, cpu_job_fits

T = TypeVar("T")
_BACKFILL = Policy.BACKFILL  # read once: a member read off its enum class is slow on 3.11 (state.py)

RESERVABLE = frozenset(
    {
        WaitReason.CAPACITY,
        WaitReason.FRAGMENTATION,
        WaitReason.TOPOLOGY,
        WaitReason.CPU,  # sched2: GPUs free but not the cores / memory there
        WaitReason.MEMORY,
        WaitReason.VC_QUOTA,
        WaitReason.USER_QUOTA,
        WaitReason.INTERACTIVE_CAP,
        WaitReason.RESERVATION,
    }
)



def _keeps_gpu_reserve(ns: NodeState, req: Request) -> bool:
    """A CPU-only unit on ``ns`` leaves the cores and bytes the node keeps for its free GPUs."""
    return cpu_job_fits(ns, ns.free_mask, ns.free_cpu, ns.free_memory_bytes, req)


class BackfillPolicy:
    """Like RF for the queue walk (nothing is blocked); reservations are kept by ``BackfillPass``."""

    name = Policy.BACKFILL.value

    def blocked_by(self, queue: VcQueue, job: Job) -> int | None:
        return None

    def on_wait(self, queue: VcQueue, job: Job, rejection: Rejection) -> None:
        return None


def duration_s(job: Job, vc: Vc | None) -> float:
    """How long ``job`` holds what it takes, for reservations: limit, else the VC's estimate."""
    limit = effective_limit_s(job, vc)
    if limit is not None:
        return float(limit)
    if vc is not None and vc.default_runtime_estimate_s is not None and vc.default_runtime_estimate_s > 0:
        return float(vc.default_runtime_estimate_s)
    return INF


class Durations:
    """``duration_s`` of a job, computed once per (limit, VC) in a pass. A value of its own (not a
    method of ``BackfillPass``) so that the time model holding it does not make the pass a
    reference cycle."""

    __slots__ = ("_per_vc", "_seen", "_vcs")

    def __init__(self, vcs: Mapping[str, Vc]) -> None:
        self._vcs = vcs
        self._seen: dict[tuple[float | None, str], float] = {}
        self._per_vc: dict[str, float] = {}  # jobs without a limit of their own (most): the VC's

    def __call__(self, job: Job) -> float:
        if job.max_time_s is None:
            got = self._per_vc.get(job.vc)
            if got is None:
                got = self._per_vc[job.vc] = duration_s(job, self._vcs.get(job.vc))
            return got
        key = (job.max_time_s, job.vc)
        got = self._seen.get(key)
        if got is None:
            got = self._seen[key] = duration_s(job, self._vcs.get(job.vc))
        return got


class BackfillPass:
    """Per-pass backfill bookkeeping; created by the core only when some VC is on backfill."""

    def __init__(self, state: PassState, now: float, starts: dict[int, list[Placement]]) -> None:
        self.state = state
        self.now = now
        self.starts = starts
        # Reservations are kept: a waiting job that held one at the previous pass (``Job.reserved``)
        # gets it again wherever it stands in the order, and the rest of ``reservation_depth`` goes to
        # the first other waiting jobs, so a job's estimate does not come and go as jobs ahead of it
        # in other VCs start and stop fitting.
        depth = max(0, int(state.snapshot.reservation_depth))
        self._held_waiting = {j.id for j in state.snapshot.jobs if j.reserved and not j.running} if depth else set()
        self.depth = max(0, depth - len(self._held_waiting))  # how many new ones
        self.timeline: Timeline | None = None
        self.reservations: list[Reservation] = []
        self._gang_now_index: dict[tuple[int, ...], dict[str, int]] = {}  # per pool list: node -> position
        self._first_reservation: dict[int, Reservation] = {}  # job id -> its first in ``reservations``
        self.tried = 0
        self.reserving = True  # some reservation may still be given (``on_wait``): ``_update_reserving``
        self._update_reserving()
        self._pointers: dict[tuple[object, ...], int] = {}
        self._indexes: dict[int, dict[str, int]] = {}  # per node order (pool): node -> position
        self._pool_lists: dict[tuple[bool, str, str], list[Pool]] = {}
        # per shape of ``_one_now``: (reserved log read, reserved nodes in order, nodes too full for it)
        self._dead_now: dict[tuple[object, ...], tuple[int, list[tuple[int, str]], set[str]]] = {}
        self._refused_plans: dict[tuple[object, ...], list[tuple[int, float, int, float]]] = {}
        self._details: dict[tuple[int, str, float], Rejection] = {}
        self._no_slot: dict[int, tuple[Rejection, Rejection]] = {}  # id(rejection) -> (it, with the cause)
        self.duration = Durations(state.vcs)
        self._orders: dict[tuple[int, ...], list[NodeState]] = {}
        self._held: dict[str, int] = {}
        self._rev: dict[int, _Reversed] = {}
        self._conflicts: list[int] = []
        self._pointer_pools: dict[tuple[object, ...], NodeOrder] = {}
        # per shape of ``_native_one``: (reserved log read, reserved nodes in order it may use, the
        # ones it cannot use); a reclaim's nodes come back
        self._dead: dict[tuple[object, ...], tuple[int, list[tuple[int, str]], set[str]]] = {}
        self.held_now: set[int] = set()  # jobs holding reclaimed room from now (``_native_now``)
        self._reserved_lists: dict[int, tuple[int, list[tuple[int, str]]]] = {}
        self._gang_groups: dict[tuple[int, bool], list[list[tuple[int, NodeState]]]] = {}  # per order: nodes by domain
        self._jobs: dict[int, Job] | None = None

    # -- helpers ---------------------------------------------------------------------------------

    def _update_reserving(self) -> None:
        """Whether a later wait may still get a reservation: a new one is left, or a held one waits."""
        self.reserving = self.tried < self.depth or bool(self._held_waiting)

    def handles(self, job: Job, vc: Vc | None) -> bool:
        return bool(self.reservations) or (vc is not None and vc.policy is _BACKFILL)

    @staticmethod
    def native(job: Job, vc: Vc | None) -> bool:
        """A non-preemptible job of a backfill VC: placed (and reclaims) by the time model."""
        return vc is not None and vc.policy is _BACKFILL and not job.preemptible

    def _pools(self, job: Job, req: Request, vc: Vc) -> list[Pool]:
        """The pools a job may use, in the fixed order; kept per (kind, SKU, VC) for the pass (the
        lists are only read)."""
        cpu = req.gpus == 0 and not req.whole_node
        key = (cpu, req.sku, job.vc)
        got = self._pool_lists.get(key)
        if got is None:
            got = self._pool_lists[key] = cpu_pools(self.state, job, vc) if cpu else self.state.pools_for(req.sku, job.vc)
        return got

    def _tl(self) -> Timeline:
        if self.timeline is None:
            jobs = {j.id: j for j in self.state.snapshot.jobs}
            self.timeline = Timeline(self.state, self.now, self.duration, self.starts, jobs)
        return self.timeline

    # -- placing now -----------------------------------------------------------------------------

    def place_now(self, job: Job, req: Request, vc: Vc, units: int,
                  extra: bool = False) -> list[Placement] | ReclaimPlan | Rejection | None:
        """First-fit placement now that keeps every reservation; reserves it in the pass state.
        A backfill VC's own job may instead get a ``ReclaimPlan`` (room to make by reclaiming);
        ``extra`` (an inference job's replicas beyond ``min_replicas``) is opportunistic work like
        a preemptible job: placed from the other end, never by reclaiming.

        None: no room by the pass state (the caller explains why); a ``Rejection`` with reason
        ``reservation``: there is room, but only on resources (or quota) reserved for a job ahead."""
        duration = self.duration(job)
        end = self.now + duration
        tl = self.timeline if self.reservations else None
        if tl is not None:
            rid = tl.counters_fit(job, units, self.now, end, only_reserved=True)
            if rid is not None:
                return self._reserved(rid, "its VC's quota", duration)
        pools = self._pools(job, req, vc)
        if self.native(job, vc) and not extra:
            return self._native_now(job, req, pools, units, end)
        if job.preemptible or extra:  # opportunistic work fills the cluster from the other end
            order: Sequence[NodeOrder] = [self._reversed(p) for p in reversed(pools)]
        else:
            order = pools
        conflict: list[int] = []
        if req.whole_node:
            got = self._gang_now(order, req, end, tl, conflict)
            if got is not None:
                self.state.reserve(got)
                return got
        else:
            got = self._units_now(order, req, units, end, tl, conflict)
            if got is not None:
                return got
        if conflict:
            return self._reserved(conflict[0], "resources", duration)
        return None

    def _reserve(self, r: Reservation) -> None:
        self.reservations.append(r)
        self._first_reservation.setdefault(r.job_id, r)

    def _reserved(self, rid: int, what: str, limit: float) -> Rejection:
        """The wait of a job that holds resources (or quota) reserved for job ``rid`` for ``limit``
        seconds (its ``duration_s``)."""
        key = (rid, what, limit)
        got = self._details.get(key)
        if got is None:
            got = self._details[key] = self._reserved_detail(rid, what, limit)
        return got

    def _reserved_detail(self, rid: int, what: str, limit: float) -> Rejection:
        res = self._first_reservation.get(rid)
        when = f" from {res.start - self.now:.0f} s from now" if res is not None else ""
        nodes = f" on {', '.join(sorted({p.node for p in res.placements}))}" if res is not None and res.placements else ""
        runs = f"its limit of {limit:.0f} s" if limit < INF else "it has no time limit"
        return Rejection(
            WaitReason.RESERVATION,
            f"it would hold {what} reserved for job {rid}{nodes}{when} ({runs}); it starts when it fits "
            f"without delaying that job",
            blocked_by=rid,
        )

    def _units_now(self, pools: Sequence[NodeOrder], req: Request, units: int, end: float, tl: Timeline | None,
                   conflict: list[int]) -> list[Placement] | None:
        st = self.state
        taken: list[Placement] = []
        temp: list[tuple[str, Item]] = []
        try:
            for _ in range(units):
                p = self._one_now(pools, req, end, tl, conflict, advance=units == 1)
                if p is None:
                    st.unreserve(taken)
                    return None
                st.reserve([p])
                taken.append(p)
                if tl is not None and units > 1:
                    it = Item(self.now, end, mask_of(p.gpu_indices), p.cpu, p.memory_bytes, -2, False)
                    tl.items[p.node].append(it)
                    tl.node_version[p.node] += 1
                    temp.append((p.node, it))
            return taken
        finally:
            if tl is not None:
                for name, it in temp:
                    tl.items[name].remove(it)
                    tl.node_version[name] += 1

    def _index(self, pool: NodeOrder) -> dict[str, int]:
        """Node name -> position in ``pool``'s order (asked for every reservation a shape's list
        catches up with: kept here by the pool's id, which lives for the pass)."""
        got = self._indexes.get(id(pool))
        if got is None:
            got = self._indexes[id(pool)] = _positions(pool.nodes)
        return got

    def _one_now(self, pools: Sequence[NodeOrder], req: Request, end: float, tl: Timeline | None, conflict: list[int],
                 advance: bool) -> Placement | None:
        """The first node (fixed order) that fits now and keeps every reservation.

        Nodes without reservations are scanned from a per-shape pointer that only moves past nodes
        that cannot fit this shape by the pass state (free capacity only shrinks in a pass) or hold
        a reservation; the few nodes with reservations are checked one by one."""
        g = req.gpus
        reserved = tl.reserved_nodes if tl is not None else None
        for pool in pools:
            key = (id(pool), g, req.cpu, req.memory_bytes)
            ptr = self._pointers.get(key, 0)
            nodes = pool.nodes
            n = len(nodes)
            i = ptr
            found = -1
            while i < n:
                ns = nodes[i]
                if reserved and reserved.get(ns.name):
                    if advance and i == ptr:
                        ptr += 1
                    i += 1
                    continue
                if not _fits_cpu_mem(ns, req) or (g and (ns.free_gpus < g or first_run(ns.free_mask, ns.node.gpus, g) < 0)):
                    if advance and i == ptr:
                        ptr += 1
                    i += 1
                    continue
                if not g and not _keeps_gpu_reserve(ns, req):
                    i += 1  # the cores a GPU node keeps for its free GPUs (quota.py); GPU starts may free them
                    continue
                found = i
                break
            if advance:
                self._pointers[key] = ptr
            if reserved and tl is not None:
                best = None
                # Reserved nodes whose free cores, memory or GPUs are too few for this shape stay
                # so for the rest of the pass (the pass state only shrinks outside a multi-unit
                # placement's tentative units, when ``advance`` is False): skipped from then on.
                live, dead = self._live_reserved(self._dead_now, key, pool, tl)
                died: list[tuple[int, str]] = []
                for k, name in live:
                    if (found >= 0 and k > found) or best is not None:
                        break
                    ns = nodes[k]
                    if not _fits_cpu_mem(ns, req) or (g and ns.free_gpus < g):
                        if advance and dead is not None:
                            died.append((k, name))
                        continue
                    if not g and not _keeps_gpu_reserve(ns, req):
                        continue
                    idx = tl.fits(ns, req, self.now, end, free_now=ns.free_mask)
                    if idx is None:
                        c = tl.conflict(ns.name, self.now, end)
                        if c is not None:
                            conflict.append(c)
                        continue
                    best = (k, idx)
                if died:
                    assert dead is not None
                    self._bury(died, live, dead)
                if best is not None:
                    return Placement(nodes[best[0]].name, best[1], req.cpu, req.memory_bytes)
            if found >= 0:
                ns = nodes[found]
                start = first_run(ns.free_mask, ns.node.gpus, g) if g else 0
                return Placement(ns.name, tuple(range(start, start + g)), req.cpu, req.memory_bytes)
        return None

    def _gang_now(self, pools: Sequence[NodeOrder], req: Request, end: float, tl: Timeline | None,
                  conflict: list[int]) -> list[Placement] | None:
        reserved = tl.reserved_nodes if tl is not None else None
        index = self._gang_now_index.get(tuple(id(p) for p in pools))  # pools keep their order in a pass
        if index is None:
            index = {}
            k = 0
            for pool in pools:
                for ns in pool.nodes:
                    index[ns.name] = k
                    k += 1
            self._gang_now_index[tuple(id(p) for p in pools)] = index
        cands: list[NodeState] = []
        for pool in pools:
            for domain_nodes in pool.whole_by_domain.values():
                for ns in domain_nodes.values():
                    if not _fits_cpu_mem(ns, req):
                        continue
                    if tl is not None and reserved and reserved.get(ns.name):
                        if tl.fits(ns, req, self.now, end, free_now=ns.free_mask) is None:
                            c = tl.conflict(ns.name, self.now, end)
                            if c is not None:
                                conflict.append(c)
                            continue
                    cands.append(ns)
        cands.sort(key=lambda ns: index[ns.name])
        groups: dict[str, list[NodeState]] = {}
        for ns in cands:
            groups.setdefault(ns.node.ib_domain if req.same_domain else "*", []).append(ns)
        for dom in sorted(groups):
            if len(groups[dom]) >= req.units:
                return [Placement(ns.name, tuple(range(ns.node.gpus)), req.cpu, req.memory_bytes)
                        for ns in groups[dom][: req.units]]
        return None

    # -- the pass's hooks --------------------------------------------------------------------------

    def on_start(self, job: Job, placements: list[Placement]) -> None:
        if self.timeline is not None:
            self.timeline.add_start(job, placements)
        if job.id in self._held_waiting:
            # a held reservation came due and started; its slot stays spent for this pass (given to
            # the next waiting job instead, replays waited longer on average: docs/benchmarks.md)
            self._held_waiting.discard(job.id)
            self._update_reserving()

    def on_reclaimed(self, victims: list[Holding]) -> None:
        """Victims of a reclaim are on their way out: gone in the time model."""
        tl = self.timeline
        if tl is None:
            return
        names: set[str] = set()
        for h in victims:
            names.update(p.node for p in h.placements)
            if h.replica:
                tl.end_now(h.job.id, {(p.node, mask_of(p.gpu_indices)) for p in h.placements})
            else:
                tl.end_now(h.job.id)
        for key, (_cursor, live, dead) in self._dead.items():
            for name in names:
                if name in dead:
                    dead.remove(name)
                    bisect.insort(live, (self._index(self._pointer_pools[key])[name], name))
        # nodes with reservations are checked one by one anyway (the pointers skip them)
        self._rewind({n for n in names if not tl.reserved_nodes.get(n)})

    def _reserved_in(self, pool: NodeOrder, tl: Timeline) -> list[tuple[int, str]]:
        """The pool's nodes that hold reservations, in the fixed order (kept per reservation count)."""
        key = id(pool)
        got = self._reserved_lists.get(key)
        if got is None:
            got = self._reserved_lists[key] = (0, [])
        cursor, items = got
        if cursor < len(tl.reserved_log):
            index = self._index(pool)
            for name in tl.reserved_log[cursor:]:
                k = index.get(name)
                if k is not None:
                    bisect.insort(items, (k, name))
            self._reserved_lists[key] = (len(tl.reserved_log), items)
        return items

    def _live_reserved(self, store: dict[tuple[object, ...], tuple[int, list[tuple[int, str]], set[str]]],
                       key: tuple[object, ...], pool: NodeOrder,
                       tl: Timeline) -> tuple[list[tuple[int, str]], set[str] | None]:
        """``_reserved_in`` for one shape (``key`` in ``store``), less the nodes found unusable for
        it (``dead``, see ``_bury``; None with the memos off, when the plain list is returned)."""
        if not tl.memoise:
            return self._reserved_in(pool, tl), None
        got = store.get(key)
        if got is None:
            got = store[key] = (0, [], set())
        cursor, items, dead = got
        if cursor < len(tl.reserved_log):
            index = self._index(pool)
            for name in tl.reserved_log[cursor:]:
                k = index.get(name)
                if k is not None and name not in dead:
                    bisect.insort(items, (k, name))
            store[key] = (len(tl.reserved_log), items, dead)
        return items, dead

    @staticmethod
    def _bury(died: list[tuple[int, str]], live: list[tuple[int, str]], dead: set[str]) -> None:
        """Move ``died`` (entries of the sorted list ``live``) to ``dead``."""
        for item in died:
            dead.add(item[1])
            del live[bisect.bisect_left(live, item)]

    def _rewind(self, names: set[str]) -> None:
        """Room that comes free in the model (reclaimed work): first-fit pointers of the time model
        move back to the first such node so it is seen again."""
        if not names:
            return
        for key, pool in self._pointer_pools.items():
            index = self._index(pool)
            ks = [index[n] for n in names if n in index]
            if ks and self._pointers.get(key, 0) > min(ks):
                self._pointers[key] = min(ks)

    def skip_reclaim(self, job: Job, req: Request) -> bool:
        """A reclaim for this shape and end was already refused for taking reserved resources."""
        if not self.reservations:
            return False
        key = ("plan", req.sku, job.vc, req.whole_node, req.same_domain, req.units)
        end = self.now + self.duration(job)
        return any(g <= req.gpus and c <= req.cpu + 1e-9 and m <= req.memory_bytes and e <= end
                   for g, c, m, e in self._refused_plans.get(key, ()))

    def _refuse_plan(self, job: Job, req: Request) -> None:
        key = ("plan", req.sku, job.vc, req.whole_node, req.same_domain, req.units)
        entries = self._refused_plans.setdefault(key, [])
        if len(entries) < 16:
            entries.append((req.gpus, req.cpu, req.memory_bytes, self.now + self.duration(job)))

    def plan_ok(self, job: Job, req: Request, placements: list[Placement], victims: list[Holding]) -> bool:
        """A reclaim plan may not take reserved resources the job would hold past a reservation."""
        if not self.reservations or self.timeline is None:
            return True
        tl = self.timeline
        end = self.now + self.duration(job)
        if tl.counters_fit(job, req.units, self.now, end, only_reserved=True) is not None:
            return False
        ignore = {h.job.id for h in victims if not h.replica}
        for p in placements:
            if tl.reserved_nodes.get(p.node):
                if not tl.fits_exact(self.state.nodes[p.node], p, self.now, end, ignore):
                    self._refuse_plan(job, req)
                    return False
        return True

    def on_wait(self, job: Job, req: Request | None, vc: Vc | None, rej: Rejection) -> tuple[Rejection, float | None]:
        """Give a waiting job of a backfill VC its reservation: a job that held one at the previous
        pass (``Job.reserved``) keeps it, and the first waiting jobs in the pass's order get the
        ``reservation_depth`` slots the held ones leave."""
        held = job.id in self._held_waiting
        if held:
            self._held_waiting.discard(job.id)
            self._update_reserving()
        if job.id in self.held_now:
            # reclaimed room, held from now on (its reservation starts now): it starts as soon as
            # the preempted work has exited (within the grace period), and keeps its place meanwhile,
            # whether or not the pass's new reservations are all given
            return rej, self.now
        if not held and self.tried >= self.depth:  # every new reservation is given: most waits stop here
            return self.no_slot(job, vc, rej), None
        if (
            vc is None
            or req is None
            or vc.policy is not _BACKFILL
            or job.preemptible
            or not job.approved
            or rej.permanent
            or rej.reason not in RESERVABLE
        ):
            return rej, None
        if not held:
            self.tried += 1
            self._update_reserving()
        tl = self._tl()
        duration = self.duration(job)
        got = tl.earliest(job, req, self._pools(job, req, vc), duration)
        if got is None:
            return rej, None
        start, placements = got
        end = start + duration if duration < INF else INF
        tl.add_reservation(job, start, end, placements)
        self._reserve(Reservation(job.id, start, end, tuple(placements)))
        detail = f"{rej.detail}; reserved {', '.join(sorted({p.node for p in placements}))} from {start - self.now:.0f} s from now"
        return Rejection(rej.reason, detail, rej.permanent, rej.blocked_by), start

    def no_slot(self, job: Job, vc: Vc | None, rej: Rejection) -> Rejection:
        """The wait of a job that would have been given a reservation had one been left: its detail
        says why it has no estimated start (kept per rejection: most waits of a pass share a few)."""
        if job.preemptible or not job.approved or vc is None or vc.policy is not _BACKFILL:
            return rej
        # by identity (the entry keeps ``rej`` alive, so its id is not reused): a pass's waits share
        # a few thousand rejections at 20k jobs
        seen = self._no_slot.get(id(rej))
        if seen is not None and seen[0] is rej:
            return seen[1]
        got = rej
        if not rej.permanent and rej.reason in RESERVABLE:
            depth = self.state.snapshot.reservation_depth
            why = (f"this pass's reservations (reservation_depth {depth}) went to jobs ahead of it" if depth > 0
                   else "reservation_depth is 0")
            got = Rejection(rej.reason, f"{rej.detail}; no estimated start: {why}", rej.permanent, rej.blocked_by)
        self._no_slot[id(rej)] = (rej, got)
        return got

    # -- backfill VCs' own jobs: the time model places them (and reclaims for them) ------------------

    def _native_now(self, job: Job, req: Request, pools: list[Pool], units: int,
                    end: float) -> list[Placement] | ReclaimPlan | Rejection | None:
        """The first placement in the fixed order that fits once reclaimable work (preemptible
        jobs, extra replicas) and work on its way out are gone, keeping every reservation: exactly
        what a reservation for this job would be at ``now``. If the pass state holds it already,
        start; else reclaim what is in the way (the job starts when it has exited)."""
        tl = self._tl()
        st = self.state
        order = self._order(pools)
        got: list[Placement] | None
        self._conflicts = []
        got = None
        for skip in (False, True):  # free room first; only where there is none, reclaim
            if req.whole_node:
                got = self._native_gang(order, req, end, tl, skip)
            else:
                got = self._native_units(pools, req, units, end, tl, skip)
            if got is not None:
                break
        if got is None:
            if self._conflicts and self.reservations:
                return self._reserved(self._conflicts[0], "resources", self.duration(job))
            return None
        if self._all_free_now(got):
            st.reserve(got)
            return got
        victims = self._victims(got)
        if victims is None:
            return None
        # The room is this job's from now on (in the model too), so later jobs neither count on it
        # nor reclaim it again; the job starts there once what is in the way has exited.
        tl.add_reservation(job, self.now, end, got)
        self._reserve(Reservation(job.id, self.now, end, tuple(got)))
        self.held_now.add(job.id)
        return ReclaimPlan(victims, got)

    def _reversed(self, pool: Pool) -> _Reversed:
        got = self._rev.get(id(pool))
        if got is None:
            got = self._rev[id(pool)] = _Reversed(pool)
        return got

    def _order(self, pools: list[Pool]) -> list[NodeState]:
        key = tuple(id(p) for p in pools)
        got = self._orders.get(key)
        if got is None:
            got = self._orders[key] = [ns for pool in pools for ns in pool.nodes]
        return got

    def _all_free_now(self, got: list[Placement]) -> bool:
        """The pass state holds all of ``got`` now (several units on one node counted together)."""
        for name, (want, cpu, mem) in _per_node(got).items():
            ns = self.state.nodes[name]
            if not _room(ns, want, cpu, mem, ns.free_mask, ns.free_cpu, ns.free_memory_bytes):
                return False
        return True

    def _maybe(self, ns: NodeState, g: int) -> bool:
        """Cheap bound: free GPUs plus everything any holding has here could hold ``g``."""
        held = self._held.get(ns.name)
        if held is None:
            held = self._held[ns.name] = sum(len(p.gpu_indices) for h in ns.holdings for p in h.placements
                                             if p.node == ns.name)
        return ns.free_gpus + held >= g

    def _native_units(self, pools: list[Pool], req: Request, units: int, end: float,
                      tl: Timeline, skip: bool) -> list[Placement] | None:
        st = self.state
        out: list[Placement] = []
        temp: list[tuple[str, Item]] = []
        took: list[tuple[NodeState, int]] = []  # GPU bits taken in the pass state for later units
        try:
            for _ in range(units):
                p = self._native_one(pools, req, end, tl, skip, advance=units == 1)
                if p is None:
                    return None
                out.append(p)
                if units > 1:  # later units see this one, in the time model and the pass state
                    it = Item(self.now, end, mask_of(p.gpu_indices), p.cpu, p.memory_bytes, -2, True)
                    tl.items[p.node].append(it)
                    tl.node_version[p.node] += 1
                    temp.append((p.node, it))
                    ns = st.nodes[p.node]
                    bits = mask_of(p.gpu_indices) & ns.free_mask
                    st.take(ns, bits, p.cpu, p.memory_bytes)
                    took.append((ns, bits))
            return out
        finally:
            for name, it in temp:
                tl.items[name].remove(it)
                tl.node_version[name] += 1
            for (ns, bits), (_n, it) in zip(took, temp):
                st.give(ns, bits, it.cpu, it.mem)

    def _native_one(self, pools: list[Pool], req: Request, end: float, tl: Timeline, skip: bool,
                    advance: bool) -> Placement | None:
        g = req.gpus
        reserved = tl.reserved_nodes
        for pool in pools:
            key = ("native", id(pool), skip, g, req.cpu, req.memory_bytes)
            self._pointer_pools[key] = pool
            ptr = self._pointers.get(key, 0)
            nodes = pool.nodes
            n = len(nodes)
            i = ptr
            found: tuple[int, tuple[int, ...]] | None = None
            while i < n:
                ns = nodes[i]
                if reserved.get(ns.name):
                    if advance and i == ptr:
                        ptr += 1
                    i += 1
                    continue
                idx: tuple[int, ...] | None
                if not ns.holdings:
                    # nothing reclaimable or leaving here: the pass state is the time model now
                    if not _fits_cpu_mem(ns, req) or (g and (ns.free_gpus < g or first_run(ns.free_mask, ns.node.gpus, g) < 0)):
                        idx = None
                    elif not g and not _keeps_gpu_reserve(ns, req):
                        i += 1  # cores kept for the node's free GPUs; a GPU start may free them
                        continue
                    else:
                        start = first_run(ns.free_mask, ns.node.gpus, g) if g else 0
                        idx = tuple(range(start, start + g))
                elif g and not self._maybe(ns, g):
                    idx = None
                else:
                    idx = tl.fits(ns, req, self.now, end, None, None, skip)
                if idx is None:
                    if advance and i == ptr:
                        ptr += 1
                    i += 1
                    continue
                found = (i, idx)
                break
            if advance:
                self._pointers[key] = ptr
            limit = found[0] if found is not None else n
            maybe, fits, now, conflicts = self._maybe, tl.fits, self.now, self._conflicts
            instant = math.nextafter(now, INF)  # the shortest window that starts now
            # Reserved nodes where this shape fits neither the pass state nor the model: the pass
            # state only shrinks, and the model grows only where a reclaim ends work
            # (``on_reclaimed`` takes those nodes out again), so they are skipped from then on.
            live, dead = self._live_reserved(self._dead, key, pool, tl)
            died: list[tuple[int, str]] = []
            for k, name in live:
                if k > limit:
                    break
                ns = nodes[k]
                if g and not maybe(ns, g):
                    if advance and dead is not None:
                        died.append((k, name))
                    continue
                idx = fits(ns, req, now, end, None, None, skip)
                if idx is not None:
                    if found is None or k < found[0]:
                        found = (k, idx)
                        limit = k
                elif _fits_cpu_mem(ns, req) and (not g or first_run(ns.free_mask, ns.node.gpus, g) >= 0):
                    c = tl.conflict(name, now, end)
                    if c is not None:
                        conflicts.append(c)
                elif advance and dead is not None and (not skip or fits(ns, req, now, instant, None, None, True) is None):
                    # With ``skip`` (room a reclaim would make) the fit also depends on how long
                    # the job holds the room (its end against the reservations here), which the
                    # list's key does not know: the node leaves it only if even a job that held
                    # it for an instant would not fit.
                    died.append((k, name))
            if died:
                assert dead is not None
                self._bury(died, live, dead)
            if found is not None:
                return Placement(nodes[found[0]].name, found[1], req.cpu, req.memory_bytes)
        return None

    def _native_gang(self, order: list[NodeState], req: Request, end: float, tl: Timeline,
                     skip: bool) -> list[Placement] | None:
        """The first IB domain (by name) with ``req.units`` whole nodes that fit, the first of them
        in the fixed order (``ib_domain: any``: the first such nodes of ``order``). Each domain's
        nodes are checked in order only until enough fit; the domains after the one found are not
        looked at.

        A node with nothing reclaimable that is not wholly free cannot be whole in the model either
        (reservations only add to it), and stays so for the rest of the pass: the pass state only
        shrinks, and holdings are all made when it is built. Such nodes leave the domain lists."""
        conflicts: list[tuple[int, int]] = []  # (position in ``order``, reservation in the way)
        reserved = tl.reserved_nodes
        for members in self._gang_domains(order, req.same_domain):
            ok: list[NodeState] = []
            busy = 0
            for k, ns in members:
                if not ns.holdings and not ns.whole_free:
                    busy += 1
                    continue
                if ns.node.cpu + 1e-9 < req.cpu or ns.node.memory_bytes < req.memory_bytes:
                    continue
                if not ns.holdings and not reserved.get(ns.name):
                    fit = _fits_cpu_mem(ns, req)
                elif not self._maybe(ns, ns.node.gpus):
                    fit = False
                else:
                    fit = tl.fits(ns, req, self.now, end, skip_reclaimable=skip) is not None
                    if not fit and ns.whole_free and reserved.get(ns.name):
                        c = tl.conflict(ns.name, self.now, end)
                        if c is not None:
                            conflicts.append((k, c))
                if fit:
                    ok.append(ns)
                    if len(ok) == req.units:
                        break
            if busy and tl.memoise:
                members[:] = [(k, ns) for k, ns in members if ns.holdings or ns.whole_free]
            if len(ok) == req.units:
                return [Placement(n.name, tuple(range(n.node.gpus)), req.cpu, req.memory_bytes) for n in ok]
        # nothing fits: the reservations in the way, in the fixed order (the first explains the wait)
        self._conflicts.extend(c for _k, c in sorted(conflicts))
        return None

    def _gang_domains(self, order: list[NodeState], same_domain: bool) -> list[list[tuple[int, NodeState]]]:
        """The nodes of ``order`` with their positions, per IB domain in name order (one group
        for ``ib_domain: any``); kept per order for the pass, less the nodes ``_native_gang`` finds
        can never be whole."""
        key = (id(order), same_domain)
        got = self._gang_groups.get(key)
        if got is None:
            groups: dict[str, list[tuple[int, NodeState]]] = {}
            for k, ns in enumerate(order):
                groups.setdefault(ns.node.ib_domain if same_domain else "*", []).append((k, ns))
            got = self._gang_groups[key] = [groups[dom] for dom in sorted(groups)]
        return got

    def _victims(self, placements: list[Placement]) -> list[Holding] | None:
        """Holdings on the chosen nodes that stand in the way: those on the chosen GPU indices, then
        (victim order) as many more as the cores and bytes need. None if that is not enough."""
        from dlts.scheduler.plugins.reclaim import _ordered, _share

        st = self.state
        chosen: dict[int, Holding] = {}
        for name, (want, cpu, mem) in _per_node(placements).items():
            ns = st.nodes[name]
            mask, c, m = ns.free_mask, ns.free_cpu, ns.free_memory_bytes
            order = _ordered(ns)
            picked = []
            for h in order:
                hm, hc, hb = _share(h, ns)
                if (hm & want or h.claimed or h.stopping) and (h.stopping or h.claimed or not h.protect):
                    picked.append(h)
                    mask, c, m = mask | hm, c + hc, m + hb
                elif hm & want:
                    return None  # inside its preemption budget (min_runtime_s): not a victim
            for h in order:
                if _room(ns, want, cpu, mem, mask, c, m):
                    break
                if h in picked or (h.protect and not h.stopping):
                    continue
                hm, hc, hb = _share(h, ns)
                picked.append(h)
                mask, c, m = mask | hm, c + hc, m + hb
            if not _room(ns, want, cpu, mem, mask, c, m):
                return None
            for h in picked:
                chosen[id(h)] = h
        return list(chosen.values())


def _per_node(placements: list[Placement]) -> dict[str, tuple[int, float, int]]:
    """Per node: the GPU mask, cores and bytes ``placements`` take there together."""
    out: dict[str, tuple[int, float, int]] = {}
    for p in placements:
        mask, cpu, mem = out.get(p.node, (0, 0.0, 0))
        out[p.node] = (mask | mask_of(p.gpu_indices), cpu + p.cpu, mem + p.memory_bytes)
    return out


def _room(ns: NodeState, want: int, cpu: float, mem: int, free_mask: int, free_cpu: float, free_mem: int) -> bool:
    """Whether free (mask, cores, bytes) of ``ns`` hold GPU indices ``want`` and ``cpu``/``mem``;
    CPU-only units (``want`` 0) on a GPU node must also leave the cores and bytes the node keeps for
    its free GPUs (quota.py), as every other placement path checks."""
    if (free_mask & want) != want or free_cpu + 1e-9 < cpu or free_mem < mem:
        return False
    if want or ns.node.gpus <= 0 or not (ns.reserve_cpu or ns.reserve_memory_bytes):
        return True
    free_gpus = bin(free_mask & ns.usable_mask).count("1")
    return (free_cpu - cpu + 1e-9 >= ns.reserve_cpu * free_gpus
            and free_mem - mem >= ns.reserve_memory_bytes * free_gpus)


def _positions(nodes: list[NodeState]) -> dict[str, int]:
    return {ns.name: i for i, ns in enumerate(nodes)}


class NodeOrder(Protocol):
    """Nodes in the fixed order first fit scans: a pool, or a pool seen from its last node."""

    @property
    def nodes(self) -> list[NodeState]: ...

    @property
    def whole_by_domain(self) -> dict[str, dict[str, NodeState]]: ...

    def memo(self, key: tuple[object, ...], compute: Callable[[], T]) -> T: ...


class _Reversed:
    """A pool seen from its last node: preemptible work fills the cluster from the other end, so
    non-preemptible first-fit rarely has to reclaim it."""

    __slots__ = ("nodes", "pool", "whole_by_domain")

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.nodes = pool.memo(("bf_reversed",), lambda: list(reversed(pool.nodes)))
        self.whole_by_domain = pool.whole_by_domain

    def memo(self, key: tuple[object, ...], compute: Callable[[], T]) -> T:
        return self.pool.memo(("rev",) + key, compute)

    def __hash__(self) -> int:
        return id(self.pool) ^ 1
