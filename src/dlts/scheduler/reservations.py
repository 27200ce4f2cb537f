"""The time model behind backfill: what every node and every quota counter holds, from now on.

A ``Timeline`` is built once per pass (only when a backfill VC has a job that cannot start) from
the pass state: every running job that is not on its way out holds its placements until its end
(``started_at`` + effective limit, else its VC's ``default_runtime_estimate_s``, else forever),
every start of the pass from now until now + its limit, and every reservation from its start to
its end. Work already told to stop (preempted, past wall time, retiring replicas) is counted as
gone: it keeps its resources only until it exits.

Items are exact intervals ``[start, end)``. A new item fits a node when, at its start and at
every later item start inside its window, the GPU indices it takes are free and the cores and
bytes in use stay within the node; quota counters (VC GPUs per SKU, CPU-only cores and bytes,
per-user GPUs, interactive GPUs) are checked the same way. Reservations are found and backfill
candidates are checked with the same two predicates, so a reservation is free at its start in the
model whenever every item ends by its end. Nothing here reads a clock.

Placement rule: the first node in a fixed order (the VC's own hard-assigned pool, then the shared
pool, each in snapshot order) that fits; now on the lowest free run of GPU indices, in the future
on the free run whose GPUs were freed latest (so GPUs free earlier stay for what counted on
them); gangs take the first IB domain (by name) with enough fitting whole nodes (``ib_domain:
any``: the first nodes in order). A fixed order makes a reservation stable: other work only ever
removes free capacity, so the first fitting node stays the first.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import cache

from dlts.scheduler.model import CPU_SKU, Job, JobType, Placement, Vc
from dlts.scheduler.state import NodeState, PassState, Pool, Request

INF = math.inf
MEMOISE = True  # memoised fits and counter checks (decisions are the same without; tests compare)
EPS = 1e-9
_INFERENCE, _INTERACTIVE = JobType.INFERENCE, JobType.INTERACTIVE  # read once (state.py)


@cache
def first_run(free_mask: int, n_gpus: int, want: int) -> int:
    """Start index of the lowest run of ``want`` contiguous free GPUs, or -1."""
    run = 0
    for i in range(n_gpus):
        if free_mask >> i & 1:
            run += 1
            if run == want:
                return i - want + 1
        else:
            run = 0
    return -1


def mask_of(indices: Iterable[int]) -> int:
    m = 0
    for i in indices:
        m |= 1 << i
    return m


@dataclass(slots=True)
class Item:
    start: float
    end: float
    mask: int
    cpu: float
    mem: int
    job: int
    future: bool  # a reservation (held against later jobs, even one that starts now)
    reclaimable: bool = False  # preemptible work or an extra replica: a reserved job may reclaim it
    node: str = ""
    # reclaimable work inside its preemption budget (``Vc.min_runtime_s``) may be reclaimed only
    # from this time on; until then it holds what it holds like any other work
    reclaim_from: float = 0.0

    def end_for(self, reclaiming: bool) -> float:
        """When this item stops holding its resources for a job that may reclaim (``reclaiming``):
        reclaimable work as soon as its budget allows, everything else at its end."""
        return min(self.end, self.reclaim_from) if reclaiming and self.reclaimable else self.end


# a quota counter: ("q", vc, sku) VC GPUs, ("u", vc, user) a user's GPUs, ("i", vc) interactive GPUs,
# ("cpu", vc) / ("mem", vc) CPU-only cores and bytes
CounterKey = tuple[str, ...]


@dataclass(slots=True)
class Counted:
    start: float
    end: float
    amount: float
    job: int
    future: bool = False
    key: CounterKey = ()  # the counter it is part of (to invalidate what is memoised for that counter)


@dataclass(slots=True, eq=False)
class Counter:
    """One quota counter of the model: its cap, its items, how many of them are reservations, and
    the overload checks answered for its current items (``checked``: (amount, start, end) -> the
    answer of ``Timeline._overload``), dropped whenever an item is added or ended early. One
    object per counter, so a check is a few attribute reads rather than a lookup per dict keyed
    by the counter's tuple."""

    key: CounterKey
    cap: float | None
    items: list[Counted] = field(default_factory=list)
    reserved: int = 0
    checked: dict[tuple[float, float, float], int | None] = field(default_factory=dict)


def window_overlaps(a_start: float, a_end: float, b_start: float, b_end: float) -> bool:
    return a_start < b_end and b_start < a_end


class Timeline:
    def __init__(self, state: PassState, now: float, duration_of: Callable[[Job], float],
                 starts: dict[int, list[Placement]], jobs: dict[int, Job]) -> None:
        self.state = state
        self.now = now
        self.duration_of = duration_of
        self.items: dict[str, list[Item]] = defaultdict(list)
        self.reserved_nodes: dict[str, int] = defaultdict(int)  # node -> future items on it
        self.reserved_log: list[str] = []  # nodes in the order they first got a reservation
        self.counters: dict[CounterKey, Counter] = {}
        self.by_job: dict[int, list[Item | Counted]] = defaultdict(list)  # to end a job's items early
        self.reserved_vcs: set[str] = set()  # VCs with a reserved counter
        self.version = 0  # bumped on every change
        self._demand: dict[tuple[object, ...], list[tuple[Counter | None, float, bool]]] = {}
        self.node_version: dict[str, int] = defaultdict(int)  # per node: memoised fits are valid for one
        self._fits_memo: dict[tuple[object, ...], tuple[int, ...] | None] = {}
        self.memoise = MEMOISE  # tests compare decisions with and without the memos
        self.budgets = False  # some reclaimable work is inside its preemption budget (``Item.reclaim_from``)
        gone: set[tuple[str, tuple[int, ...]]] = set()
        for h in state.holdings:
            if h.claimed and h.replica and not h.retiring:
                for p in h.placements:
                    gone.add((p.node, p.gpu_indices))
        # sched2's preemption budget: work inside its min_runtime_s is reclaimable in the model only
        # from the end of its budget (``reclaimable_from``), as ``_victims`` takes it then
        for job in state.snapshot.jobs:
            if not job.running or job.stopping or job.id in state.stopped:
                continue
            started = job.started_at
            end = self.end_of(job, started if started is not None else now)
            held = job.placements
            core = max(1, job.min_replicas) if job.type is _INFERENCE else len(held)
            reclaimable = [job.preemptible or i >= core for i in range(len(held))]
            if gone:  # replicas a reclaim took are gone from the model
                kept = [i for i, p in enumerate(held) if (p.node, p.gpu_indices) not in gone]
                held = tuple(held[i] for i in kept)
                reclaimable = [reclaimable[i] for i in kept]
            # the first ``core`` placements (never gone) carry the budget; extra replicas have none
            self._add_job(job, now if started is None else started, end, held, False,
                          len(reclaimable) if job.preemptible else reclaimable.count(False), reclaimable,
                          self.reclaimable_from(job, started) if started is not None else 0.0, core)
        for job_id, placements in starts.items():
            job = jobs[job_id]
            self.add_start(job, placements)

    # -- building ------------------------------------------------------------------------------

    def end_of(self, job: Job, start: float) -> float:
        d = self.duration_of(job)
        return start + d if d < INF else INF

    def _add_job(self, job: Job, start: float, end: float, placements: Iterable[Placement], future: bool,
                 units: int, reclaimable: list[bool] | None = None, reclaim_from: float = 0.0,
                 budgeted: int | None = None) -> None:
        """``reclaimable`` per placement; ``reclaim_from``: the end of the preemption budget of the
        first ``budgeted`` placements (all when None). An inference job's extra replicas, after its
        ``max(1, min_replicas)`` core, have no budget, as ``PassState._add_holding`` gives them none."""
        mine = self.by_job[job.id]
        self.version += 1
        for k, p in enumerate(placements):
            budget_end = reclaim_from if budgeted is None or k < budgeted else 0.0
            it = Item(start, end, mask_of(p.gpu_indices), p.cpu, p.memory_bytes, job.id, future,
                      bool(reclaimable and reclaimable[k]), p.node, budget_end)
            if it.reclaimable and budget_end > self.now:
                self.budgets = True
            self.node_version[p.node] += 1
            self.items[p.node].append(it)
            mine.append(it)
            if future:
                if not self.reserved_nodes.get(p.node):
                    self.reserved_log.append(p.node)
                self.reserved_nodes[p.node] += 1
        for maybe_counter, amount, _check in self._shape_demand(job, units):
            counter = maybe_counter if maybe_counter is not None else self._user_counter(job)
            c = Counted(start, end, amount, job.id, future, counter.key)
            counter.items.append(c)
            counter.checked.clear()
            mine.append(c)
            if future:
                counter.reserved += 1
                self.reserved_vcs.add(counter.key[1])

    def end_now(self, job_id: int, masks: set[tuple[str, int]] | None = None) -> None:
        """A job (or, with ``masks``, some of its replicas) told to stop: gone from now on."""
        for it in self.by_job.get(job_id, ()):
            if it.future or it.start > self.now:
                continue
            if masks is not None and (not isinstance(it, Item) or (it.node, it.mask) not in masks):
                continue
            it.end = min(it.end, self.now)
            self.version += 1
            if isinstance(it, Item):
                self.node_version[it.node] += 1
            else:
                self.counters[it.key].checked.clear()

    def add_start(self, job: Job, placements: Iterable[Placement]) -> None:
        placements = list(placements)
        if job.running:  # extra inference replicas: counted only where they hold resources, no budget
            self._add_job(job, self.now, self.end_of(job, self.now), placements, future=False, units=0,
                          reclaimable=[True] * len(placements))
            return
        core = max(1, job.min_replicas) if job.type is _INFERENCE else len(placements)
        self._add_job(job, self.now, self.end_of(job, self.now), placements, future=False, units=len(placements),
                      reclaimable=[job.preemptible or i >= core for i in range(len(placements))],
                      reclaim_from=self.reclaimable_from(job, self.now), budgeted=core)

    def reclaimable_from(self, job: Job, started: float) -> float:
        """When work of ``job`` that started at ``started`` may first be reclaimed: the end of its
        preemption budget (``min_runtime_s`` of its VC), the rule of ``state.PassState._budget``;
        a time already past means now."""
        vc = self.state.vcs.get(job.vc)
        return started + vc.min_runtime_s if vc is not None and vc.min_runtime_s > 0 else 0.0

    def add_reservation(self, job: Job, start: float, end: float, placements: list[Placement]) -> None:
        self._add_job(job, start, end, placements, future=True, units=len(placements))

    # -- quota counters ------------------------------------------------------------------------

    def demand(self, job: Job, units: int) -> list[tuple[Counter, float, bool]]:
        """(counter, amount, enforced) for ``units`` placements of ``job``; mirrors the filters."""
        return [(c if c is not None else self._user_counter(job), a, e) for c, a, e in self._shape_demand(job, units)]

    def _shape_demand(self, job: Job, units: int) -> list[tuple[Counter | None, float, bool]]:
        """``demand`` with the job's per-user counter left as None: memoised per shape and VC (the
        request stands for the job's type and replicas too). Not per user as well: at 100k pending
        jobs three in four (shape, VC, user) are asked once, and a list kept per user cost more
        than it saved."""
        req = self.state.request(job)
        key = (id(req), job.vc, job.preemptible, job.user_quota_approved, units)
        got = self._demand.get(key)
        if got is None:
            got = self._demand[key] = [(None if k[0] == "u" else self.counter(k), a, e)
                                       for k, a, e in self._compute_demand(job, req, units)]
        return got

    def _user_counter(self, job: Job) -> Counter:
        return self.counter(("u", job.vc, job.user))

    def _compute_demand(self, job: Job, req: Request | None, units: int) -> list[tuple[CounterKey, float, bool]]:
        st = self.state
        vc = st.vcs.get(job.vc)
        if req is None or vc is None:
            return []
        out: list[tuple[CounterKey, float, bool]] = []
        core = st.core_units(job, units)
        if core:
            if req.sku == CPU_SKU:
                out.append((("cpu", job.vc), req.cpu * core, True))
                out.append((("mem", job.vc), float(req.memory_bytes * core), True))
            else:
                out.append((("q", job.vc, req.sku), float(req.gpus * core), True))
                out.append((("u", job.vc, job.user), float(req.gpus * core), not job.user_quota_approved))
        if job.type is _INTERACTIVE and req.gpus:
            out.append((("i", job.vc), float(req.gpus * units), True))
        return out

    def counter(self, key: CounterKey) -> Counter:
        """The counter ``key``, made (with its cap) on first use."""
        got = self.counters.get(key)
        if got is None:
            got = self.counters[key] = Counter(key, self.cap(key))
        return got

    def cap(self, key: CounterKey) -> float | None:
        vc: Vc | None = self.state.vcs.get(key[1])
        cap: float | None = None
        if vc is not None:
            if key[0] == "q":
                cap = float(vc.quota.get(key[2], 0))
            elif key[0] == "u":
                cap = None if vc.user_gpu_quota is None else float(vc.user_gpu_quota)
            elif key[0] == "i":
                cap = None if vc.max_interactive_gpus is None else float(vc.max_interactive_gpus)
            elif key[0] == "cpu":  # the effective CPU-only quota (quota.py), enforced like the filter
                cap = float(self.state.cpu_quota(vc)[0])
            elif key[0] == "mem":
                cap = float(self.state.cpu_quota(vc)[1])
        return cap

    def counters_fit(self, job: Job, units: int, start: float, end: float, only_reserved: bool = False) -> int | None:
        """None when every counter of ``job`` stays within its cap over [start, end); else the id
        of a job whose item is part of the overload (the latest-starting one), or -1."""
        if only_reserved and job.vc not in self.reserved_vcs:
            return None
        memoise = self.memoise
        for maybe_counter, amount, enforced in self._shape_demand(job, units):
            if not enforced:
                continue
            # the per-user counter is looked up only when it is checked (most checks stop before it)
            if maybe_counter is not None:
                counter = maybe_counter
            elif only_reserved:  # one never made holds no reservation
                user_counter = self.counters.get(("u", job.vc, job.user))
                if user_counter is None:
                    continue
                counter = user_counter
            else:
                counter = self._user_counter(job)
            if counter.cap is None or (only_reserved and not counter.reserved):
                continue
            if memoise:
                checked, asked = counter.checked, (amount, start, end)
                if asked in checked:
                    got = checked[asked]
                else:
                    if len(checked) > 4096:
                        checked.clear()
                    got = checked[asked] = self._overload(counter, amount, start, end)
            else:
                got = self._overload(counter, amount, start, end)
            if got is not None:
                return got
        return None

    def _overload(self, counter: Counter, amount: float, start: float, end: float) -> int | None:
        """None when ``amount`` more stays within the counter's cap over [start, end); else the id
        of the latest-starting reservation in the overload, or -1."""
        cap = counter.cap
        assert cap is not None
        # ``start`` first, in one walk over the items: most checks start now and no item starts
        # later inside the window, so this is the whole answer
        used = 0.0
        last = None
        later = False
        for c in counter.items:
            if c.end > start and c.start < end:
                if c.start <= start:
                    used += c.amount
                    if c.future and (last is None or c.start >= last.start):
                        last = c
                else:
                    later = True
        if used + amount > cap + EPS:
            return last.job if last is not None else -1
        if not later:
            return None
        # then every later item start inside the window
        items = [c for c in counter.items if c.end > start and c.start < end]
        for t in [c.start for c in items if c.start > start]:
            used = 0.0
            last = None
            for c in items:
                if c.start <= t < c.end:
                    used += c.amount
                    if c.future and (last is None or c.start >= last.start):
                        last = c
            if used + amount > cap + EPS:
                return last.job if last is not None else -1
        return None

    def counters_free_from(self, job: Job, units: int, start: float, duration: float) -> float:
        """The earliest time >= ``start`` at which ``job``'s counters fit for ``duration``."""
        times = {start}
        for counter, _a, enforced in self.demand(job, units):
            if enforced:
                for c in counter.items:
                    if c.end > start and c.end < INF:
                        times.add(c.end)
        for t in sorted(times):
            if self.counters_fit(job, units, t, t + duration if duration < INF else INF) is None:
                return t
        return INF

    # -- nodes ---------------------------------------------------------------------------------

    def window_free(self, ns: NodeState, start: float, end: float, ignore: set[int] | None = None,
                    skip_reclaimable: bool = False) -> tuple[int, list[tuple[float, float, float]]]:
        """(GPU mask free throughout [start, end), [(checkpoint, cores used, bytes used)]);
        ``skip_reclaimable``: as if preemptible work and extra replicas were gone (reclaimed) from
        the end of their preemption budget (``Item.reclaim_from``)."""
        busy = 0
        items = [it for it in self.items.get(ns.name, ()) if it.end > start and it.start < end
                 and not (ignore and it.job in ignore)
                 and not (skip_reclaimable and it.reclaimable and it.reclaim_from <= start)]
        if skip_reclaimable and self.budgets:
            # rare: reclaimable work inside its preemption budget holds until the budget ends
            items = [replace(it, end=e) if (e := it.end_for(True)) < it.end else it for it in items]
        for it in items:
            busy |= it.mask
        points = [start] + sorted({it.start for it in items if it.start > start})
        use = []
        for t in points:
            c = m = 0.0
            for it in items:
                if it.start <= t < it.end:
                    c += it.cpu
                    m += it.mem
            use.append((t, c, m))
        return ns.usable_mask & ns.full_mask & ~busy, use

    def fits(self, ns: NodeState, req: Request, start: float, end: float, free_now: int | None = None,
             ignore: set[int] | None = None, skip_reclaimable: bool = False) -> tuple[int, ...] | None:
        """GPU indices ``req`` takes on ``ns`` for [start, end), or None; ``free_now`` narrows the
        mask to what the pass state has free (placing now)."""
        if ignore is None and self.memoise:
            key = (ns.name, id(req), start, end, free_now, skip_reclaimable, self.node_version[ns.name])
            if key in self._fits_memo:
                return self._fits_memo[key]
            got = self._fits(ns, req, start, end, free_now, None, skip_reclaimable)
            if len(self._fits_memo) > 100_000:
                self._fits_memo.clear()
            self._fits_memo[key] = got
            return got
        return self._fits(ns, req, start, end, free_now, ignore, skip_reclaimable)

    def _fits(self, ns: NodeState, req: Request, start: float, end: float, free_now: int | None,
              ignore: set[int] | None, skip_reclaimable: bool = False) -> tuple[int, ...] | None:
        mask, use = self.window_free(ns, start, end, ignore, skip_reclaimable)
        if free_now is not None:
            mask &= free_now
        node = ns.node
        for _t, c, m in use:
            if node.cpu - c + EPS < req.cpu or node.memory_bytes - m < req.memory_bytes:
                return None
        if req.gpus == 0 and not req.whole_node and not self._keeps_gpu_reserve(ns, start, use, req.cpu,
                                                                                  req.memory_bytes, free_now,
                                                                                  ignore, skip_reclaimable):
            return None
        if req.whole_node:
            return tuple(range(node.gpus)) if mask == ns.full_mask else None
        if req.gpus == 0:
            return ()
        if start > self.now + EPS and free_now is None:
            i = self._latest_freed_run(ns, mask, req.gpus, start, ignore, skip_reclaimable)
        else:
            i = first_run(mask, node.gpus, req.gpus)
        return None if i < 0 else tuple(range(i, i + req.gpus))

    def _latest_freed_run(self, ns: NodeState, mask: int, want: int, start: float, ignore: set[int] | None,
                          skip_reclaimable: bool) -> int:
        """Start index of the run of ``want`` free GPUs a future item takes: the run whose GPUs were
        freed latest before ``start`` (the largest "freed at" of its earliest-freed GPU), the lowest
        such run on a tie. GPUs free earlier stay for what can use them earlier: a reservation that
        took them would push back a reservation or a start that counted on them, though another run
        was free at its start."""
        n = ns.node.gpus
        first = first_run(mask, n, want)
        if first < 0 or mask.bit_count() == want:
            return first
        freed = [-INF] * n
        for it in self.items.get(ns.name, ()):
            end = it.end_for(skip_reclaimable)
            if end <= start + EPS and not (ignore and it.job in ignore):
                m = it.mask
                while m:
                    low = m & -m
                    i = low.bit_length() - 1
                    if i < n and end > freed[i]:
                        freed[i] = end
                    m ^= low
        best, best_at = first, min(freed[first:first + want])
        for i in range(first + 1, n - want + 1):
            run = ((1 << want) - 1) << i
            if mask & run == run:
                at = min(freed[i:i + want])
                if at > best_at:
                    best, best_at = i, at
        return best

    def fits_exact(self, ns: NodeState, p: Placement, start: float, end: float, ignore: set[int]) -> bool:
        mask, use = self.window_free(ns, start, end, ignore)
        want = mask_of(p.gpu_indices)
        if want & ~mask:
            return False
        node = ns.node
        if not all(node.cpu - c + EPS >= p.cpu and node.memory_bytes - m >= p.memory_bytes for _t, c, m in use):
            return False
        return bool(p.gpu_indices) or self._keeps_gpu_reserve(ns, start, use, p.cpu, p.memory_bytes, None, ignore)

    def _keeps_gpu_reserve(self, ns: NodeState, start: float, use: list[tuple[float, float, float]], cpu: float,
                           memory_bytes: int, free_now: int | None, ignore: set[int] | None,
                           skip_reclaimable: bool = False) -> bool:
        """sched2's rule (quota.py) for a CPU-only unit on a GPU node, at the time it would start:
        afterwards the node keeps ``cpu_per_gpu``/``memory_per_gpu`` for each GPU free then."""
        if not (ns.reserve_cpu or ns.reserve_memory_bytes) or ns.node.gpus <= 0:
            return True
        busy = 0
        for it in self.items.get(ns.name, ()):
            if it.start <= start < it.end_for(skip_reclaimable) and not (ignore and it.job in ignore):
                busy |= it.mask
        free = ns.usable_mask & ns.full_mask & ~busy
        if free_now is not None:
            free &= free_now
        free_gpus = bin(free).count("1")
        _t, c, m = use[0]  # use[0] is the checkpoint at ``start``
        left_cpu = ns.node.cpu - c - cpu
        left_mem = ns.node.memory_bytes - m - memory_bytes
        return left_cpu + EPS >= ns.reserve_cpu * free_gpus and left_mem >= ns.reserve_memory_bytes * free_gpus

    def conflict(self, name: str, start: float, end: float) -> int | None:
        """The reservation on node ``name`` overlapping [start, end) that starts first, if any."""
        best = None
        for it in self.items.get(name, ()):
            if it.future and it.start < end and it.end > start and (best is None or it.start < best.start):
                best = it
        return None if best is None else best.job

    def breakpoints(self, nodes: Iterable[NodeState], start: float) -> list[float]:
        out = {start}
        for ns in nodes:
            for it in self.items.get(ns.name, ()):
                if start < it.end < INF:
                    out.add(it.end)
                if it.reclaimable and start < it.reclaim_from < it.end:
                    out.add(it.reclaim_from)  # its preemption budget ends: a reserved job may reclaim it
        return sorted(out)

    # -- finding a reservation -------------------------------------------------------------------

    def earliest(self, job: Job, req: Request, pools: list[Pool], duration: float,
                 limit_points: int = 4096, skip_reclaimable: bool = True) -> tuple[float, list[Placement]] | None:
        """The earliest start at which ``job`` fits nodes and counters for ``duration``, with the
        placements it would get then; None when nothing bounds it (held forever) or too many steps."""
        order = [ns for pool in pools for ns in pool.nodes]
        t0 = self.now
        times = self.breakpoints(order, t0)
        counter_times: list[float] = []
        for counter, _a, enforced in self.demand(job, req.units):
            if enforced:
                counter_times.extend(c.end for c in counter.items if t0 < c.end < INF)
        times = sorted(set(times) | set(counter_times))
        for t in times[:limit_points]:
            end = t + duration if duration < INF else INF
            if self.counters_fit(job, req.units, t, end) is not None:
                continue
            # free room first; only where there is none, room that reclaiming would make
            got = self.place_at(order, req, t, end, False)
            if got is None and skip_reclaimable:
                got = self.place_at(order, req, t, end, True)
            if got is not None:
                return t, got
        return None

    def place_at(self, order: list[NodeState], req: Request, start: float, end: float,
                 skip_reclaimable: bool = False) -> list[Placement] | None:
        """First-fit placement of all of ``req`` for [start, end) in the fixed order, or None."""
        if req.whole_node:
            # the first IB domain by name with enough fitting nodes, the first of them in order:
            # each domain's nodes are checked in order only until enough fit, and the domains after
            # the one found are not checked (``BackfillPass._native_gang`` does the same now)
            domains: dict[str, list[NodeState]] = {}
            for ns in order:
                domains.setdefault(ns.node.ib_domain if req.same_domain else "*", []).append(ns)
            for dom in sorted(domains):
                fitting = []
                for ns in domains[dom]:
                    if self.fits(ns, req, start, end, skip_reclaimable=skip_reclaimable) is not None:
                        fitting.append(ns)
                        if len(fitting) == req.units:
                            return [Placement(n.name, tuple(range(n.node.gpus)), req.cpu, req.memory_bytes)
                                    for n in fitting]
            return None
        taken: list[tuple[str, Item]] = []
        out: list[Placement] = []
        try:
            for _ in range(req.units):
                for ns in order:
                    idx = self.fits(ns, req, start, end, skip_reclaimable=skip_reclaimable)
                    if idx is not None:
                        out.append(Placement(ns.name, idx, req.cpu, req.memory_bytes))
                        if req.units > 1:  # later units of the same job see this one
                            it = Item(start, end, mask_of(idx), req.cpu, req.memory_bytes, -2, True)
                            self.items[ns.name].append(it)
                            self.node_version[ns.name] += 1
                            taken.append((ns.name, it))
                        break
                else:
                    return None
            return out
        finally:
            for name, it in taken:
                self.items[name].remove(it)
                self.node_version[name] += 1
