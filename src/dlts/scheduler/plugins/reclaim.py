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

from dlts.scheduler.framework import ReclaimPlan, register
from dlts.scheduler.model import CPU_SKU, Job, Placement, Vc
from dlts.scheduler.plugins.placement import CpuOnly
from dlts.scheduler.state import Holding, NodeState, PassState, Pool, Request, best_run, mask_of

Free = list  # [gpu mask, cores, bytes]


def _share(h: Holding, node: str) -> tuple[int, float, int]:
    """What holding ``h`` holds on ``node``."""
    m, c, b = 0, 0.0, 0
    for p in h.placements:
        if p.node == node:
            m |= mask_of(p.gpu_indices)
            c += p.cpu
            b += p.memory_bytes
    return m, c, b


def _victim_order(h: Holding) -> tuple:
    # Stopping work first (free), then lowest priority, then most recently started.
    started = h.job.started_at if h.job.started_at is not None else 0.0
    return (not h.stopping, h.job.priority, -started, h.job.id)


def _set_cost(new: list[Holding]) -> tuple:
    if not new:
        return (0, 0, 0.0)
    started = min(h.job.started_at or 0.0 for h in new)
    return (len(new), max(h.job.priority for h in new), -started)


@register("preempt", "reclaim")
class Reclaim:
    name = "reclaim"

    def find(self, state: PassState, job: Job, req: Request, vc: Vc) -> ReclaimPlan | None:
        key = ("reclaim", req.sku, job.vc, req.whole_node, req.same_domain, req.units)
        if state.reclaim_fail_cache.known_to_fail(key, req.gpus, req.cpu, req.memory_bytes):
            return None
        if req.sku == CPU_SKU:
            pools = CpuOnly()._pools(state, job, vc)
        else:
            pools = state.pools_for(req.sku, job.vc)
        found = self._gang(state, pools, req) if req.whole_node else self._units(state, pools, req)
        if found is None:
            state.reclaim_fail_cache.record(key, req.gpus, req.cpu, req.memory_bytes)
        return found

    # -- helpers ---------------------------------------------------------------------------------

    @staticmethod
    def _free(overlay: dict[str, Free], ns: NodeState) -> Free:
        v = overlay.get(ns.name)
        return v if v is not None else [ns.free_mask, ns.free_cpu, ns.free_memory_bytes]

    @staticmethod
    def _fits(ns: NodeState, free: Free, req: Request) -> bool:
        if free[1] + 1e-9 < req.cpu or free[2] < req.memory_bytes:
            return False
        return req.gpus == 0 or best_run(free[0], ns.node.gpus, req.gpus) >= 0

    # -- single-node units (jobs, replicas, CPU-only) ----------------------------------------------

    def _units(self, state: PassState, pools: list[Pool], req: Request) -> ReclaimPlan | None:
        overlay: dict[str, Free] = {}
        chosen: list[Holding] = []
        plan: list[Placement] = []
        chosen_ids: set[int] = set()
        all_nodes = [ns for pool in pools for ns in pool.nodes]
        with_holdings = [ns for ns in all_nodes if ns.holdings]
        for unit in range(req.units):
            best: tuple | None = None
            if unit > 0:  # earlier units may have left room that needs no victim
                for ns in all_nodes:
                    if self._fits(ns, self._free(overlay, ns), req):
                        best = ((0, 0, 0.0), ns.node.gpus, ns.name, ns, [])
                        break
            if best is None:
                for ns in with_holdings:
                    option = self._node_option(ns, self._free(overlay, ns), req, chosen_ids)
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
                    m, c, b = _share(h, p.node)
                    overlay[p.node] = [f[0] | m, f[1] + c, f[2] + b]
            f = self._free(overlay, ns)
            start = best_run(f[0], ns.node.gpus, req.gpus) if req.gpus else 0
            used = ((1 << req.gpus) - 1) << start if req.gpus else 0
            overlay[ns.name] = [f[0] & ~used, f[1] - req.cpu, f[2] - req.memory_bytes]
            plan.append(Placement(ns.name, tuple(range(start, start + req.gpus)), req.cpu, req.memory_bytes))
        return ReclaimPlan(chosen, plan)

    def _node_option(
        self, ns: NodeState, free: Free, req: Request, taken: set[int]
    ) -> tuple[tuple, list[Holding]] | None:
        cands = sorted((h for h in ns.holdings if not h.claimed and id(h) not in taken), key=_victim_order)
        if not cands:
            return None
        mask, cpu, mem = free
        picked: list[Holding] = []
        ok = False
        for h in cands:
            m, c, b = _share(h, ns.name)
            mask, cpu, mem = mask | m, cpu + c, mem + b
            picked.append(h)
            if self._fits(ns, [mask, cpu, mem], req):
                ok = True
                break
        if not ok:
            return None
        # Drop victims the room turned out not to need (contiguity or cores can make the greedy
        # prefix larger than necessary); try the costliest first.
        for h in sorted([h for h in picked if not h.stopping], key=_victim_order, reverse=True):
            m, c, b = _share(h, ns.name)
            rest = [x for x in picked if x is not h]
            rm, rc, rb = free[0], free[1], free[2]
            for x in rest:
                xm, xc, xb = _share(x, ns.name)
                rm, rc, rb = rm | xm, rc + xc, rb + xb
            if self._fits(ns, [rm, rc, rb], req):
                picked = rest
        new = [h for h in picked if not h.stopping]
        left = bin(mask).count("1") - req.gpus
        return (_set_cost(new) + (left,)), picked

    # -- gangs of whole nodes ------------------------------------------------------------------

    def _gang(self, state: PassState, pools: list[Pool], req: Request) -> ReclaimPlan | None:
        groups: dict[str, list[tuple[tuple, NodeState, list[Holding]]]] = {}
        for pool in pools:
            for ns in pool.nodes:
                mask, cpu, mem = ns.free_mask, ns.free_cpu, ns.free_memory_bytes
                hs = [h for h in ns.holdings if not h.claimed]
                for h in hs:
                    m, c, b = _share(h, ns.name)
                    mask, cpu, mem = mask | m, cpu + c, mem + b
                if mask != ns.full_mask or cpu + 1e-9 < req.cpu or mem < req.memory_bytes:
                    continue  # something non-preemptible stays on this node
                new = [h for h in hs if not h.stopping]
                group = ns.node.ib_domain if req.same_domain else "*"
                groups.setdefault(group, []).append((_set_cost(new), ns, hs))
        best: tuple | None = None
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
