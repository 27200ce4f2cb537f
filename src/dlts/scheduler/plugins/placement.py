"""Place plugins: best-fit single-node GPU placement, CPU-only placement, whole-node gangs.

Every plugin searches a VC's own hard-assigned pool before the shared one, so hard-assigned nodes
are used (and count toward the VC's quota) first and never serve another VC. Unschedulable nodes
are in no pool, so they are never chosen.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from dlts.scheduler.model import CPU_SKU, Job, Placement, Rejection, Vc, WaitReason
from dlts.scheduler.state import NodeState, PassState, Pool, Request, best_run, cpu_job_fits

GIB = 1024**3


def _fits_cpu_mem(ns: NodeState, req: Request) -> bool:
    return ns.free_cpu + 1e-9 >= req.cpu and ns.free_memory_bytes >= req.memory_bytes


def _place_units(state: PassState, req: Request, units: int,
                 one: Callable[[bool], Placement | None]) -> list[Placement] | None:
    """Place ``units`` independent single-node units, reserving as it goes; all or nothing."""
    taken: list[Placement] = []
    for i in range(units):
        p = one(i == 0)  # record the first failure only: later failures saw tentatively taken capacity
        if p is None:
            state.unreserve(taken)
            return None
        state.reserve([p])
        taken.append(p)
    return taken


class BestFit:
    """Single-node GPU jobs (and each inference replica): the node where the job fits with the
    fewest free GPUs left, on a contiguous run of GPU indices (the shortest run that fits)."""

    name = "best_fit"

    def handles(self, req: Request) -> bool:
        return req.sku != CPU_SKU and not req.whole_node

    def feasible(self, state: PassState, job: Job, req: Request, vc: Vc) -> Rejection | None:
        pools = state.pools_for(req.sku, job.vc)
        for pool in pools:
            if pool.memo(
                ("fits", req.gpus, req.cpu, req.memory_bytes),
                partial(_any_node_holds, pool, req),
            ):
                return None
        if not pools:
            detail = f"no schedulable {req.sku} node is open to VC {job.vc}"
        else:
            detail = (
                f"no schedulable {req.sku} node open to VC {job.vc} has {req.gpus} GPUs, {req.cpu:g} cores and "
                f"{req.memory_bytes / GIB:.1f} GiB"
            )
        return Rejection(WaitReason.NO_MATCHING_NODES, detail, permanent=True)

    def _one(self, state: PassState, job: Job, req: Request, record_failure: bool) -> Placement | None:
        g = req.gpus
        for pool in state.pools_for(req.sku, job.vc):
            key = ("gpu", pool.sku, pool.vc)
            if state.fail_cache.known_to_fail(key, g, req.cpu, req.memory_bytes):
                continue
            if pool.free_gpus >= g:
                for k in range(g, pool.max_gpus + 1):
                    for ns in pool.buckets[k].values():
                        if not _fits_cpu_mem(ns, req):
                            continue
                        start = best_run(ns.free_mask, ns.node.gpus, g)
                        if start >= 0:
                            return Placement(ns.name, tuple(range(start, start + g)), req.cpu, req.memory_bytes)
            if record_failure:
                state.fail_cache.record(key, g, req.cpu, req.memory_bytes)
        return None

    def place(self, state: PassState, job: Job, req: Request, vc: Vc, units: int) -> list[Placement] | None:
        return _place_units(state, req, units, lambda record_failure: self._one(state, job, req, record_failure))

    def explain(self, state: PassState, job: Job, req: Request, vc: Vc) -> Rejection:
        pools = state.pools_for(req.sku, job.vc)
        # Free capacity only shrinks in a pass: while the pools' totals are unchanged, so is the answer.
        key = ("explain", req, tuple((id(p), p.free_gpus, p.free_cpu, p.free_memory_bytes) for p in pools))
        got = state.explain_cache.get(key)
        if got is None:
            got = state.explain_cache[key] = self._explain(pools, req)
        return got

    def _explain(self, pools: list[Pool], req: Request) -> Rejection:
        free = sum(p.free_gpus for p in pools)
        need = req.total_gpus
        g = req.gpus
        per = f"{g} {req.sku} GPUs on one node" + (f" for each of {req.units} replicas" if req.units > 1 else "")
        # Nodes with a run of g free GPUs: if there are some, cores or memory are what is missing.
        gpu_ok = cores_ok = 0
        best_cpu, best_mem = 0.0, 0
        for pool in pools:
            if pool.free_gpus < g:
                continue
            for k in range(g, pool.max_gpus + 1):
                for ns in pool.buckets[k].values():
                    if best_run(ns.free_mask, ns.node.gpus, g) < 0:
                        continue
                    gpu_ok += 1
                    best_cpu = max(best_cpu, ns.free_cpu)
                    if ns.free_cpu + 1e-9 >= req.cpu:
                        cores_ok += 1
                        best_mem = max(best_mem, ns.free_memory_bytes)
        if gpu_ok and not cores_ok:
            return Rejection(
                WaitReason.CPU,
                f"needs {per} with {req.cpu:g} cores; {_nodes(gpu_ok)} {g} free GPUs but at most "
                f"{max(best_cpu, 0.0):g} free cores",
            )
        if cores_ok:
            return Rejection(
                WaitReason.MEMORY,
                f"needs {per} with {req.memory_bytes / GIB:.1f} GiB; {_nodes(cores_ok)} the GPUs and cores free but "
                f"at most {max(best_mem, 0) / GIB:.1f} GiB of free memory",
            )
        if free >= need:
            return Rejection(
                WaitReason.FRAGMENTATION,
                f"needs {per}; {free} {req.sku} GPUs are free but scattered across nodes",
            )
        return Rejection(WaitReason.CAPACITY, f"needs {per}; only {free} {req.sku} GPUs are free")


def _nodes(n: int) -> str:
    return "1 node has" if n == 1 else f"{n} nodes have"


def cpu_pools(state: PassState, job: Job, vc: Vc) -> list[Pool]:
    """Pools a CPU-only job may use: CPU-only nodes (own, then shared), then, if the VC allows,
    GPU nodes (own hard-assigned first)."""
    pools = state.pools_for(CPU_SKU, job.vc)
    if vc.allow_cpu_jobs_on_gpu_nodes:
        for (sku, owner), pool in sorted(state.pools.items(), key=lambda kv: (kv[0][1] is None, kv[0][0])):
            if sku != CPU_SKU and owner in (None, job.vc):
                pools.append(pool)
    return pools


class CpuOnly:
    """CPU-only jobs: CPU-only nodes first (fewest cores left wins), then GPU nodes' spare cores
    only if the VC allows it, so GPU nodes keep the cores their GPUs need."""

    name = "cpu_only"

    def handles(self, req: Request) -> bool:
        return req.sku == CPU_SKU

    def _pools(self, state: PassState, job: Job, vc: Vc) -> list[Pool]:
        return cpu_pools(state, job, vc)

    def feasible(self, state: PassState, job: Job, req: Request, vc: Vc) -> Rejection | None:
        for pool in self._pools(state, job, vc):
            for ns in pool.nodes:
                if ns.node.cpu >= req.cpu and ns.node.memory_bytes >= req.memory_bytes:
                    return None
        where = "CPU-only node" + ("" if not vc.allow_cpu_jobs_on_gpu_nodes else " or GPU node")
        return Rejection(
            WaitReason.NO_MATCHING_NODES,
            f"no schedulable {where} open to VC {job.vc} has {req.cpu:g} cores and {req.memory_bytes / GIB:.1f} GiB",
            permanent=True,
        )

    def _one(self, state: PassState, job: Job, req: Request, vc: Vc, record_failure: bool) -> Placement | None:
        for pool in self._pools(state, job, vc):
            key = ("cpu", pool.sku, pool.vc)
            if state.fail_cache.known_to_fail(key, 0, req.cpu, req.memory_bytes):
                continue
            best: NodeState | None = None
            gpu_pool = pool.sku != CPU_SKU
            for ns in pool.nodes:
                if gpu_pool:
                    if not cpu_job_fits(ns, ns.free_mask, ns.free_cpu, ns.free_memory_bytes, req):
                        continue
                elif not _fits_cpu_mem(ns, req):
                    continue
                if best is None or ns.free_cpu < best.free_cpu:
                    best = ns
            if best is not None:
                return Placement(best.name, (), req.cpu, req.memory_bytes)
            if record_failure:
                state.fail_cache.record(key, 0, req.cpu, req.memory_bytes)
        return None

    def place(self, state: PassState, job: Job, req: Request, vc: Vc, units: int) -> list[Placement] | None:
        return _place_units(state, req, units, lambda record_failure: self._one(state, job, req, vc, record_failure))

    def explain(self, state: PassState, job: Job, req: Request, vc: Vc) -> Rejection:
        # What CPU-only work may use on each node: everything free on CPU-only nodes, and on GPU
        # nodes what is not kept for their free GPUs.
        free_cpu, free_mem, kept_cpu = 0.0, 0, 0.0
        cores_node = mem_node = False
        for pool in self._pools(state, job, vc):
            for ns in pool.nodes:
                c, m = max(ns.free_cpu, 0.0), max(ns.free_memory_bytes, 0)
                if pool.sku != CPU_SKU:
                    kc = min(c, ns.reserve_cpu * ns.free_gpus)
                    kept_cpu += kc
                    c, m = c - kc, max(0, m - ns.reserve_memory_bytes * ns.free_gpus)
                free_cpu += c
                free_mem += m
                if c + 1e-9 >= req.cpu:
                    cores_node = True
                    mem_node = mem_node or m >= req.memory_bytes
        kept = f" ({kept_cpu:g} more cores on GPU nodes are kept for their free GPUs)" if kept_cpu > 1e-9 else ""
        need = f"needs {req.cpu:g} cores and {req.memory_bytes / GIB:.1f} GiB on one node"
        if req.units > 1:
            need += f" for each of {req.units} replicas"
        if cores_node and not mem_node:
            return Rejection(
                WaitReason.MEMORY,
                f"{need}; nodes with {req.cpu:g} free cores lack the memory ({free_mem / GIB:.1f} GiB free in all)",
            )
        if free_cpu + 1e-9 >= req.cpu * req.units and free_mem >= req.memory_bytes * req.units:
            return Rejection(
                WaitReason.FRAGMENTATION,
                f"{need}; {free_cpu:g} cores and {free_mem / GIB:.1f} GiB are free but scattered across nodes{kept}",
            )
        return Rejection(
            WaitReason.CAPACITY,
            f"{need}; only {free_cpu:g} cores and {free_mem / GIB:.1f} GiB are free to CPU-only jobs{kept}",
        )


def _any_node_holds(pool: Pool, req: Request) -> bool:
    return any(ns.node.gpus >= req.gpus and ns.node.cpu >= req.cpu and ns.node.memory_bytes >= req.memory_bytes
               for ns in pool.nodes)


def _domain_counts(pool: Pool, req: Request) -> dict[str, int]:
    out: dict[str, int] = {}
    for ns in pool.nodes:
        if ns.node.cpu >= req.cpu and ns.node.memory_bytes >= req.memory_bytes:
            out[ns.node.ib_domain] = out.get(ns.node.ib_domain, 0) + 1
    return out


class Gang:
    """Distributed jobs: ``units`` whole nodes of one SKU, all or nothing, inside one IB domain
    unless the job says ``ib_domain: any``. Among domains that can hold the gang, the one with the
    fewest whole free nodes wins (packing keeps big domains whole for big gangs)."""

    name = "gang"

    def handles(self, req: Request) -> bool:
        return req.whole_node

    def _eligible(self, state: PassState, job: Job, req: Request) -> list[Pool]:
        return state.pools_for(req.sku, job.vc)

    def feasible(self, state: PassState, job: Job, req: Request, vc: Vc) -> Rejection | None:
        pools = self._eligible(state, job, req)
        counts = [pool.memo(("domains", req.cpu, req.memory_bytes), partial(_domain_counts, pool, req)) for pool in pools]
        per_domain: dict[str, int]
        if len(counts) == 1:  # one pool (no hard-assigned nodes): its counts as they are, not summed per VC
            per_domain = counts[0]
        else:
            per_domain = {}
            for pool_counts in counts:
                for dom, k in pool_counts.items():
                    per_domain[dom] = per_domain.get(dom, 0) + k
        total = sum(per_domain.values())
        if total < req.units:
            return Rejection(
                WaitReason.NO_MATCHING_NODES,
                f"needs {req.units} whole {req.sku} nodes; only {total} schedulable ones are open to VC {job.vc}",
                permanent=True,
            )
        if req.same_domain and max(per_domain.values()) < req.units:
            return Rejection(
                WaitReason.TOPOLOGY,
                f"needs {req.units} whole {req.sku} nodes in one IB domain; the largest domain open to VC {job.vc} "
                f"has {max(per_domain.values())}; submit with ib_domain: any to span domains",
                permanent=True,
            )
        return None

    def _whole_nodes(self, pools: list[Pool], domain: str, req: Request) -> list[NodeState]:
        out = []
        for pool in pools:
            for ns in pool.whole_by_domain.get(domain, {}).values():
                if _fits_cpu_mem(ns, req):
                    out.append(ns)
        return out

    def place(self, state: PassState, job: Job, req: Request, vc: Vc, units: int) -> list[Placement] | None:
        pools = self._eligible(state, job, req)
        key = ("gang", req.sku, job.vc, req.same_domain)
        if state.fail_cache.known_to_fail(key, units, req.cpu, req.memory_bytes):
            return None
        domains = sorted({d for pool in pools for d in pool.whole_by_domain})
        counts = {d: sum(len(p.whole_by_domain.get(d, ())) for p in pools) for d in domains}
        chosen: list[NodeState] = []
        if req.same_domain:
            for d in sorted((d for d in domains if counts[d] >= units), key=lambda d: (counts[d], d)):
                nodes = self._whole_nodes(pools, d, req)
                if len(nodes) >= units:
                    chosen = nodes[:units]
                    break
        else:
            # Span as few domains as possible: the fullest domains first.
            for d in sorted(domains, key=lambda d: (-counts[d], d)):
                chosen.extend(self._whole_nodes(pools, d, req)[: units - len(chosen)])
                if len(chosen) >= units:
                    break
            if len(chosen) < units:
                chosen = []
        if not chosen:
            state.fail_cache.record(key, units, req.cpu, req.memory_bytes)
            return None
        placements = [
            Placement(ns.name, tuple(range(ns.node.gpus)), req.cpu, req.memory_bytes) for ns in chosen
        ]
        state.reserve(placements)
        return placements

    def explain(self, state: PassState, job: Job, req: Request, vc: Vc) -> Rejection:
        pools = self._eligible(state, job, req)
        key = ("explain", req, tuple((id(p), p.free_gpus, p.free_cpu, p.free_memory_bytes) for p in pools))
        got = state.explain_cache.get(key)
        if got is None:
            got = state.explain_cache[key] = self._explain(pools, req)
        return got

    def _explain(self, pools: list[Pool], req: Request) -> Rejection:
        free = sum(p.free_gpus for p in pools)
        need = f"needs {req.units} whole {req.sku} node{'s' if req.units != 1 else ''}"
        # Wholly free nodes (every GPU free), and those of them that also have the cores and memory.
        whole = fit = cores = 0
        fit_by_domain: dict[str, int] = {}
        best_cpu, best_mem = 0.0, 0
        for pool in pools:
            for dom, members in pool.whole_by_domain.items():
                for ns in members.values():
                    whole += 1
                    best_cpu = max(best_cpu, ns.free_cpu)
                    if ns.free_cpu + 1e-9 < req.cpu:
                        continue
                    cores += 1
                    best_mem = max(best_mem, ns.free_memory_bytes)
                    if ns.free_memory_bytes >= req.memory_bytes:
                        fit += 1
                        fit_by_domain[dom] = fit_by_domain.get(dom, 0) + 1
        if fit >= req.units:
            best = max(fit_by_domain.values(), default=0)
            return Rejection(
                WaitReason.TOPOLOGY,
                f"{need} in one IB domain; {fit} are free but at most {best} in one domain",
            )
        if whole >= req.units and cores < req.units:
            return Rejection(
                WaitReason.CPU,
                f"{need} with {req.cpu:g} cores each; {whole} have all GPUs free but only {cores} of them the cores "
                f"(at most {max(best_cpu, 0.0):g} free cores on one)",
            )
        if whole >= req.units:
            return Rejection(
                WaitReason.MEMORY,
                f"{need} with {req.memory_bytes / GIB:.1f} GiB each; {cores} have all GPUs and the cores free but only "
                f"{fit} the memory (at most {max(best_mem, 0) / GIB:.1f} GiB free on one)",
            )
        if free >= req.units * req.gpus:
            return Rejection(
                WaitReason.FRAGMENTATION,
                f"{need}; {free} {req.sku} GPUs are free but only {whole} nodes are wholly free",
            )
        return Rejection(WaitReason.CAPACITY, f"{need}; {whole} are wholly free, {free} {req.sku} GPUs free in all")
