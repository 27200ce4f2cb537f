"""Preempt plugin: reclaim room for a non-preemptible job that fits its VC's quota but not the
free capacity.

Victims are *holdings*: a running preemptible job (any VC), or one inference replica above
``min_replicas``. The rule picks the smallest set that frees one placement of the job; among sets
of equal size, the lowest priority, then the most recently started (least work lost). Work that is
already stopping (preempted earlier, past wall time) frees at no cost, so a job waiting for its
victims to exit does not preempt again. Chosen holdings are *claimed* for the rest of the pass so
two jobs never count on the same room.
"""

from __future__ import annotations

from heapq import heapify, heappop

from dlts.scheduler import reservations
from dlts.scheduler.framework import ReclaimPlan
from dlts.scheduler.model import CPU_SKU, Job, Placement, Vc
from dlts.scheduler.plugins.placement import cpu_pools
from dlts.scheduler.state import Holding, NodeState, PassState, Pool, Request, best_run, cpu_job_fits, mask_of

Free = tuple[int, float, int]  # (gpu mask, cores, bytes)
Cost = tuple[float, ...]  # smaller is cheaper: (victims, their highest priority, -earliest start)


def _share(h: Holding, ns: NodeState) -> tuple[int, float, int]:
    """What holding ``h`` holds on node ``ns`` and would free there (computed once per holding and
    pass): a faulty GPU a job holds does not come free when the job stops."""
    shares = h.shares
    if shares is None:
        shares = {}
        for p in h.placements:
            m, c, b = shares.get(p.node, (0, 0.0, 0))
            shares[p.node] = (m | mask_of(p.gpu_indices), c + p.cpu, b + p.memory_bytes)
        h.shares = shares
    m, c, b = shares.get(ns.name, (0, 0.0, 0))
    return m & ns.usable_mask, c, b


def _ordered(ns: NodeState) -> list[Holding]:
    """The node's holdings in victim order, sorted once per pass: stopping flags only change
    before assignment (wall time) or on holdings that are then claimed and skipped anyway."""
    if ns.victim_order is None:
        ns.victim_order = sorted(ns.holdings, key=_victim_order)
    return ns.victim_order


def _victim_order(h: Holding) -> tuple[bool, int, float, int]:
    # Stopping work first (free), then lowest priority, then most recently started.
    started = h.job.started_at if h.job.started_at is not None else 0.0
    return (not h.stopping, h.job.priority, -started, h.job.id)


def _set_cost(new: list[Holding]) -> Cost:
    if not new:
        return (0, 0, 0.0)
    started = min(h.job.started_at or 0.0 for h in new)
    return (len(new), max(h.job.priority for h in new), -started)


def _lower_bound(ns: NodeState, taken: set[int], allowed: int = 0) -> Cost | None:
    """The least cost any option on ``ns`` can have; None when nothing here is reclaimable.

    Greedy takes holdings in victim order, so an option with one new victim costs at least the
    first non-stopping candidate's (1, priority, -started); more victims cost more. Unclaimed
    stopping work may make room for free, so such a node is bounded by (0,)."""
    for h in _ordered(ns):
        if h.claimed or (taken and id(h) in taken) or h.protect > allowed:
            continue
        if h.stopping:
            return (0,)
        return (1, h.job.priority, -(h.job.started_at or 0.0))
    return None


WholeOption = tuple[Cost, list[Holding], float, int]  # cost, unclaimed holdings, cores and bytes once freed


def _whole_option(ns: NodeState, allowed: int, memo: bool) -> WholeOption | None:
    """What freeing the whole node would take: None when work that cannot be reclaimed stays.
    Cached on the node for its free capacity until one of its holdings changes."""
    free = (ns.free_mask, ns.free_cpu, ns.free_memory_bytes)
    if memo and ns.gang is not None:
        got = ns.gang.get(allowed)
        if got is not None and got[0] == free:
            return got[1]
    out: WholeOption | None = None
    mask, cpu, mem = free
    hs = [h for h in ns.holdings if not h.claimed]
    if not any(h.protect > allowed for h in hs):  # work inside its preemption budget stays
        for h in hs:
            m, c, b = _share(h, ns)
            mask, cpu, mem = mask | m, cpu + c, mem + b
        if mask == ns.full_mask:
            out = (_set_cost([h for h in hs if not h.stopping]), hs, cpu, mem)
    if memo:
        if ns.gang is None:
            ns.gang = {}
        ns.gang[allowed] = (free, out)
    return out


class Reclaim:
    name = "reclaim"

    def find(self, state: PassState, job: Job, req: Request, vc: Vc, allowed: int | None = None) -> ReclaimPlan | None:
        if allowed is None:
            allowed = self.allowed(state, job, vc)
        key = ("reclaim", req.sku, job.vc, req.whole_node, req.same_domain, req.units, allowed)
        if state.reclaim_fail_cache.known_to_fail(key, req.gpus, req.cpu, req.memory_bytes):
            return None
        if req.sku == CPU_SKU:
            pools = cpu_pools(state, job, vc)
        else:
            pools = state.pools_for(req.sku, job.vc)
        found = self._gang(state, pools, req, allowed) if req.whole_node else self._units(state, pools, req, allowed)
        if found is None:
            state.reclaim_fail_cache.record(key, req.gpus, req.cpu, req.memory_bytes)
        return found

    @staticmethod
    def allowed(state: PassState, job: Job, vc: Vc) -> int:
        """The protection level reclaim may override for ``job``: 1 once it has waited for room
        (``Job.room_wait_since``: its VC's guarantee not met) longer than its VC's
        ``max_reclaim_delay_s``, else 0."""
        delay, since = vc.max_reclaim_delay_s, job.room_wait_since
        if delay is not None and since is not None and state.now - since >= delay:
            return 1
        return 0

    def blocked_note(self, state: PassState, job: Job, req: Request, vc: Vc) -> str | None:
        """Why no room was made although preemptible work could make it: the preemption budget."""
        if not state.any_protected:
            return None
        allowed = self.allowed(state, job, vc)
        if allowed >= 2:
            return None
        plan = self.find(state, job, req, vc, allowed=2)
        if plan is None:
            return None
        held = [h for h in plan.victims if h.protect > allowed]
        if not held:
            return None
        until = min(h.protected_until for h in held)
        ids = sorted({h.job.id for h in held})
        names = ("job " if len(ids) == 1 else "jobs ") + ", ".join(str(i) for i in ids)
        note = (f"preempting {names} would make room, but they are inside their preemption budget "
                f"(min_runtime_s) for {max(0.0, until - state.now):.0f} s more")
        if any(h.protect == 2 for h in held):
            note += " (preempted max_preemptions times already: no exception)"
        elif vc.max_reclaim_delay_s is not None:
            since = job.room_wait_since if job.room_wait_since is not None else state.now
            wait_more = since + vc.max_reclaim_delay_s - state.now
            note += f", or until this job has waited for room max_reclaim_delay_s ({max(0.0, wait_more):.0f} s more)"
        return note

    # -- helpers ---------------------------------------------------------------------------------

    @staticmethod
    def _free(overlay: dict[str, Free], ns: NodeState) -> Free:
        v = overlay.get(ns.name)
        return v if v is not None else (ns.free_mask, ns.free_cpu, ns.free_memory_bytes)

    @staticmethod
    def _fits(ns: NodeState, free: Free, req: Request) -> bool:
        if req.gpus == 0 and ns.node.gpus:  # a CPU-only unit on a GPU node
            return cpu_job_fits(ns, free[0], free[1], free[2], req)
        if free[1] + 1e-9 < req.cpu or free[2] < req.memory_bytes:
            return False
        return req.gpus == 0 or best_run(free[0], ns.node.gpus, req.gpus) >= 0

    # -- single-node units (jobs, replicas, CPU-only) ----------------------------------------------

    def _units(self, state: PassState, pools: list[Pool], req: Request, allowed: int = 0) -> ReclaimPlan | None:
        overlay: dict[str, Free] = {}
        chosen: list[Holding] = []
        plan: list[Placement] = []
        chosen_ids: set[int] = set()
        all_nodes = [ns for pool in pools for ns in pool.nodes]
        with_holdings = [ns for pool in pools  # memo calls the lambda at once (or not at all)
                         for ns in pool.memo(("with_holdings",), lambda: [n for n in pool.nodes if n.holdings])]  # noqa: B023
        for unit in range(req.units):
            best: tuple[Cost, int, str, NodeState, list[Holding]] | None = None
            if unit > 0:  # earlier units may have left room that needs no victim
                for ns in all_nodes:
                    if self._fits(ns, self._free(overlay, ns), req):
                        best = ((0, 0, 0.0), ns.node.gpus, ns.name, ns, [])
                        break
            if best is None:
                # Visit nodes by a lower bound on their cost (the first victim they would give
                # up) and stop once no remaining node can beat the best option found: the same
                # answer as scanning every node, for a fraction of the work.
                # Without victims taken for earlier units, a node's bound is cached on it until
                # one of its holdings changes. Node names are unique, so the heap orders by
                # (bound, name) as a sort would and never compares the rest.
                scored: list[tuple[Cost, str, NodeState, Free]] = []
                gpus, memo = req.gpus, reservations.MEMOISE
                for ns in with_holdings:
                    f = overlay.get(ns.name)
                    if f is None:
                        if ns.free_gpus + ns.reclaim_gpus < gpus:
                            continue  # even freeing everything reclaimable here leaves too few GPUs
                        f = (ns.free_mask, ns.free_cpu, ns.free_memory_bytes)
                    if chosen_ids or not memo:
                        bound = _lower_bound(ns, chosen_ids, allowed)
                    else:
                        cache = ns.bounds
                        if cache is None:
                            cache = ns.bounds = {}
                        if allowed in cache:
                            bound = cache[allowed]
                        else:
                            bound = cache[allowed] = _lower_bound(ns, chosen_ids, allowed)
                    if bound is not None:
                        scored.append((bound, ns.name, ns, f))
                heapify(scored)
                while scored:
                    bound, _, ns, f = heappop(scored)
                    if best is not None and best[0][:3] < bound:
                        break
                    option = self._node_option(ns, f, req, chosen_ids, allowed)
                    if option is None:
                        continue
                    cost, new_set = option
                    cand = (cost, 0, ns.name, ns, new_set)
                    if best is None or cand[:3] < best[:3]:
                        best = cand
            if best is None:
                return None
            ns, picked = best[3], best[4]
            for h in picked:
                chosen.append(h)
                chosen_ids.add(id(h))
                for p in h.placements:
                    other = state.nodes.get(p.node)
                    if other is None:
                        continue
                    f = self._free(overlay, other)
                    m, c, b = _share(h, other)
                    overlay[p.node] = (f[0] | m, f[1] + c, f[2] + b)
            f = self._free(overlay, ns)
            start = best_run(f[0], ns.node.gpus, req.gpus) if req.gpus else 0
            used = ((1 << req.gpus) - 1) << start if req.gpus else 0
            overlay[ns.name] = (f[0] & ~used, f[1] - req.cpu, int(f[2] - req.memory_bytes))
            plan.append(Placement(ns.name, tuple(range(start, start + req.gpus)), req.cpu, req.memory_bytes))
        return ReclaimPlan(chosen, plan)

    def _node_option(
        self, ns: NodeState, free: Free, req: Request, taken: set[int], allowed: int = 0
    ) -> tuple[Cost, list[Holding]] | None:
        g, n_gpus = req.gpus, ns.node.gpus
        need_cpu, need_mem = req.cpu - 1e-9, req.memory_bytes
        mask, cpu, mem = free
        picked: list[Holding] = []
        for h in _ordered(ns):
            if h.claimed or (taken and id(h) in taken) or h.protect > allowed:
                continue
            m, c, b = _share(h, ns)
            mask, cpu, mem = mask | m, cpu + c, mem + b
            picked.append(h)
            if g == 0 and n_gpus:
                if cpu_job_fits(ns, mask, cpu, mem, req):
                    break
            elif cpu >= need_cpu and mem >= need_mem and (g == 0 or best_run(mask, n_gpus, g) >= 0):
                break
        else:
            return None
        if len(picked) > 1:
            # Drop victims the room turned out not to need (contiguity or cores can make the
            # greedy prefix larger than necessary); try the costliest first.
            for h in sorted([h for h in picked if not h.stopping], key=_victim_order, reverse=True):
                rest = [x for x in picked if x is not h]
                rm, rc, rb = free
                for x in rest:
                    xm, xc, xb = _share(x, ns)
                    rm, rc, rb = rm | xm, rc + xc, rb + xb
                if g == 0 and n_gpus:
                    if cpu_job_fits(ns, rm, rc, rb, req):
                        picked = rest
                elif rc >= need_cpu and rb >= need_mem and (g == 0 or best_run(rm, n_gpus, g) >= 0):
                    picked = rest
        new = [h for h in picked if not h.stopping]
        left = bin(mask).count("1") - g
        if len(new) == 1:  # the common case, without the generic helper
            h = new[0]
            return (1, h.job.priority, -(h.job.started_at or 0.0), left), picked
        return (_set_cost(new) + (left,)), picked

    # -- gangs of whole nodes ------------------------------------------------------------------

    def _gang(self, state: PassState, pools: list[Pool], req: Request, allowed: int = 0) -> ReclaimPlan | None:
        groups: dict[str, list[tuple[Cost, NodeState, list[Holding]]]] = {}
        memo = reservations.MEMOISE
        for pool in pools:
            for ns in pool.nodes:
                opt = _whole_option(ns, allowed, memo)
                if opt is None:
                    continue
                cost, hs, cpu, mem = opt
                if cpu + 1e-9 < req.cpu or mem < req.memory_bytes:
                    continue  # something non-preemptible stays on this node
                group = ns.node.ib_domain if req.same_domain else "*"
                groups.setdefault(group, []).append((cost, ns, hs))
        best: tuple[Cost, str, ReclaimPlan] | None = None
        for group in sorted(groups):
            options = sorted(groups[group], key=lambda o: (o[0], o[1].name))
            if len(options) < req.units:
                continue
            picked: dict[int, Holding] = {}
            for _, _, hs in options[: req.units]:
                for h in hs:
                    picked[id(h)] = h
            victims = list(picked.values())
            cost = _set_cost([h for h in victims if not h.stopping])
            if best is None or (cost, group) < best[:2]:
                plan = [
                    Placement(ns.name, tuple(range(ns.node.gpus)), req.cpu, req.memory_bytes)
                    for _, ns, _ in options[: req.units]
                ]
                best = (cost, group, ReclaimPlan(victims, plan))
        return None if best is None else best[2]
