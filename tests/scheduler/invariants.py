"""Invariants every pass of ``decide`` must keep, checked on (snapshot, decisions, now) alone."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from dlts.scheduler import CPU_SKU, Decisions, Job, JobType, Policy, Snapshot, StopReason, WaitReason
from dlts.scheduler.model import Vc, resource_pool
from dlts.scheduler.plugins.walltime import effective_limit_s
from dlts.scheduler.quota import gpu_reserve

WEEK_S = 7 * 86400  # the most of a limit ``Vc.limit_weight`` counts, and what no limit counts


def check_pass(snap: Snapshot, d: Decisions, now: float) -> None:
    jobs = {j.id: j for j in snap.jobs}
    nodes = {n.name: n for n in snap.nodes}
    pending = [j for j in snap.jobs if not j.running]
    starts = {s.job_id: s for s in d.starts}
    waits = {w.job_id: w for w in d.waits}

    # Every pending job either starts or gets exactly one reason; nothing else starts.
    assert len(starts) == len(d.starts) and len(waits) == len(d.waits)
    for j in pending:
        assert (j.id in starts) != (j.id in waits), f"job {j.id}: start xor wait"
    for s in d.starts:
        j = jobs[s.job_id]
        assert s.scale_up == j.running, f"job {j.id}: scale_up only for running jobs"
        if j.running:
            assert j.type is JobType.INFERENCE

    # Holdings after the pass: running placements (stops keep theirs until exit) plus starts.
    held: dict[str, list[tuple[int, tuple[int, ...], float, int]]] = defaultdict(list)
    for j in snap.jobs:
        for p in j.placements + j.retiring:  # retiring replicas hold theirs until they exit too
            held[p.node].append((j.id, p.gpu_indices, p.cpu, p.memory_bytes))
    for s in d.starts:
        j = jobs[s.job_id]
        for p in s.placements:
            n = nodes[p.node]
            assert n.schedulable, f"job {j.id} placed on unschedulable node {n.name}"
            assert n.vc in (None, j.vc), f"job {j.id} of VC {j.vc} on node {n.name} of VC {n.vc}"
            if j.gpus > 0 and j.sku not in (None, CPU_SKU):
                assert n.sku == j.sku, f"job {j.id} asked {j.sku}, got {n.sku}"
            idx = p.gpu_indices
            if idx:
                assert list(idx) == list(range(idx[0], idx[0] + len(idx))), f"job {j.id}: indices not contiguous"
            held[p.node].append((j.id, idx, p.cpu, p.memory_bytes))
        if j.type is JobType.DISTRIBUTED and not j.running:
            assert len({p.node for p in s.placements}) == j.nodes == len(s.placements)
            for p in s.placements:
                assert p.gpu_indices == tuple(range(nodes[p.node].gpus)), f"gang {j.id} holds part of {p.node}"
            if not j.ib_domain_any:
                assert len({nodes[p.node].ib_domain for p in s.placements}) == 1, f"gang {j.id} spans domains"
        if j.type is JobType.INFERENCE and not j.running:
            assert len(s.placements) >= max(1, j.min_replicas)
        if j.type is JobType.INFERENCE:
            assert len(s.placements) + len(j.placements) <= max(j.max_replicas, max(1, j.min_replicas))
    for name, items in held.items():
        n = nodes.get(name)
        if n is None:
            continue
        seen: set[int] = set()
        for jid, idx, _, _ in items:
            assert all(0 <= i < n.gpus for i in idx), f"job {jid}: index beyond node {name}"
            assert not seen & set(idx), f"node {name}: GPU {sorted(seen & set(idx))} held twice"
            seen |= set(idx)
        assert sum(c for _, _, c, _ in items) <= n.cpu + 1e-6, f"node {name} cores over capacity"
        assert sum(m for _, _, _, m in items) <= n.memory_bytes, f"node {name} memory over capacity"

    # Cores kept for GPUs: on a GPU node where no GPU work started in this pass, CPU-only starts
    # left the cores and bytes the node keeps per free GPU (each was checked when placed, and
    # CPU-only starts do not change the free GPUs; a GPU start could take more than it keeps).
    gpu_started = {p.node for s in d.starts for p in s.placements if p.gpu_indices}
    for s in d.starts:
        j = jobs[s.job_id]
        if j.gpus > 0 or j.type is JobType.DISTRIBUTED:
            continue
        for p in s.placements:
            n = nodes[p.node]
            if n.gpus == 0 or p.node in gpu_started:
                continue
            used_gpus = {i for _, idx, _, _ in held[p.node] for i in idx} | set(n.unhealthy_gpus)
            free_gpus = n.gpus - len(used_gpus)
            cores_after = n.cpu - sum(c for _, _, c, _ in held[p.node])
            mem_after = n.memory_bytes - sum(m for _, _, _, m in held[p.node])
            cpg, mpg = gpu_reserve(n, snap.skus)
            assert cores_after + 1e-6 >= cpg * free_gpus, f"CPU-only job {j.id} took cores node {n.name} keeps for its GPUs"
            assert mem_after >= mpg * free_gpus, f"CPU-only job {j.id} took memory node {n.name} keeps for its GPUs"

    # VC guarantee and interactive cap, counted after the pass.
    core_use: dict[tuple[str, str], int] = defaultdict(int)
    interactive: dict[str, int] = defaultdict(int)
    for j in snap.jobs:
        placements = list(j.placements) + list(starts[j.id].placements if j.id in starts else ())
        gpus = [len(p.gpu_indices) for p in placements]
        if not j.preemptible and j.sku and j.gpus > 0:
            core = gpus[: max(1, j.min_replicas)] if j.type is JobType.INFERENCE else gpus
            core_use[(j.vc, j.sku)] += sum(core)
        if j.type is JobType.INTERACTIVE:
            interactive[j.vc] += sum(gpus)
    for (vc, sku), used in core_use.items():
        assert used <= snap.vcs[vc].quota.get(sku, 0), f"VC {vc} non-preemptible {sku} GPUs {used} over quota"
    for vc, used in interactive.items():
        cap = snap.vcs[vc].max_interactive_gpus
        assert cap is None or used <= cap, f"VC {vc} interactive GPUs {used} over cap {cap}"

    # FIFO: after the first non-preemptible job that waits for a non-permanent reason, every later
    # non-preemptible job of that VC in the same resource pool (SKU; CPU-only) waits blocked by it,
    # and nothing blocks a job across pools.
    for vc in snap.vcs.values():
        if vc.policy is not Policy.FIFO:
            continue
        # the VC's order: priority, then (fair share) the owner's recent use (a ratio to the VC's
        # equal share, so the use orders alike; none once a job has waited fair_share_max_wait_s),
        # then queue time plus limit_weight x the job's limit (its own, else the VC's; a week at most,
        # and a week without one)
        use = snap.fair_share_usage if vc.fair_share else {}
        bound = vc.fair_share_max_wait_s

        def ranked_at(j: Job, vc: Vc = vc) -> float:
            limit = j.max_time_s or vc.max_job_time_s or WEEK_S
            return j.queue_time + vc.limit_weight * min(limit, WEEK_S)

        def used(j: Job, use: Mapping[tuple[str, str], float] = use, bound: float | None = bound) -> float:
            if bound is not None and now - j.queue_time >= bound:
                return 0.0
            return max(use.get((j.vc, j.user), 0.0), 0.0)
        order = sorted(
            (j for j in pending if j.vc == vc.name and not j.preemptible and j.approved),
            key=lambda j: (-j.priority, used(j), ranked_at(j), j.id),
        )
        blockers: dict[str, int] = {}
        for j in order:
            pool = resource_pool(j)
            blocker = blockers.get(pool)
            if blocker is not None:
                assert j.id in waits and waits[j.id].blocked_by == blocker, f"FIFO: job {j.id} not blocked by {blocker}"
            elif j.id in waits and not waits[j.id].permanent:
                blockers[pool] = j.id
            if j.id in waits and waits[j.id].reason is WaitReason.BLOCKED_BY:
                b = jobs[waits[j.id].blocked_by]
                assert resource_pool(b) == pool, f"FIFO: job {j.id} ({pool}) blocked across pools by job {b.id}"

    # Stops: wall time exactly when due; preemption only of preemptible work, for a waiting
    # non-preemptible job; scale-down only of replicas above min_replicas.
    stopped = defaultdict(set)
    for s in d.stops:
        j = jobs[s.job_id]
        assert j.running and not j.stopping, f"stop of job {j.id} that is not running or already stopping"
        stopped[j.id].add(s.reason)
        if s.reason is StopReason.PREEMPTED:
            assert j.preemptible, f"non-preemptible job {j.id} preempted"
            # preemption budget: inside min_runtime_s only when the target waited past its VC's
            # max_reclaim_delay_s, and never once the victim was preempted max_preemptions times
            own = snap.vcs[j.vc]
            if own.min_runtime_s > 0 and j.started_at is not None and now - j.started_at < own.min_runtime_s:
                target_vc = snap.vcs[jobs[s.for_job].vc]
                delay = target_vc.max_reclaim_delay_s
                since = jobs[s.for_job].room_wait_since
                assert delay is not None and since is not None and now - since >= delay, (
                    f"job {j.id} preempted after {now - j.started_at}s, inside min_runtime_s {own.min_runtime_s}")
                assert not (own.max_preemptions and j.preemptions >= own.max_preemptions), (
                    f"job {j.id} preempted {j.preemptions} times already, inside min_runtime_s")
        if s.reason is StopReason.SCALE_DOWN:
            core = max(1, j.min_replicas)
            for p in s.placements:
                assert p in j.placements[core:], f"scale-down of job {j.id} touches a min_replicas replica"
        if s.reason in (StopReason.PREEMPTED, StopReason.SCALE_DOWN):
            target = jobs[s.for_job]
            assert not target.preemptible and not target.running
            assert waits[s.for_job].reason is WaitReason.CAPACITY
    for j in snap.jobs:
        if not j.running or j.stopping or j.started_at is None:
            continue
        limit = effective_limit_s(j, snap.vcs.get(j.vc))
        due = limit is not None and now - j.started_at >= limit
        assert due == (StopReason.WALL_TIME in stopped[j.id]), f"job {j.id}: wall-time stop iff due"

    # Queue positions are 1..n per VC.
    per_vc: dict[str, list[int]] = defaultdict(list)
    for w in d.waits:
        if w.queue_position is not None:
            per_vc[jobs[w.job_id].vc].append(w.queue_position)
    for vc, positions in per_vc.items():
        assert len(positions) == len(set(positions)), f"VC {vc}: duplicate queue positions"
