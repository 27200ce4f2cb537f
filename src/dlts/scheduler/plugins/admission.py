"""Filter plugins: approval, node match, VC quota, user quota, interactive cap.

Each checks one rule against the pass state and returns a ``Rejection`` with numbers a person can
act on, or None. Quotas count only non-preemptible work (preemptible jobs are opportunistic);
an inference job's non-preemptible part is its ``min_replicas``.
"""

from __future__ import annotations

from dlts.scheduler.framework import PluginHandle
from dlts.scheduler.model import CPU_SKU, Job, JobType, Rejection, Vc, WaitReason
from dlts.scheduler.state import PassState, Request

GIB = 1024**3
_INTERACTIVE = JobType.INTERACTIVE  # read once: a member read off its enum class is slow on 3.11 (state.py)


_SOURCE = {"derived": "derived from its GPU quota", "cpu_sku": "its cpu quota"}


class Approval:
    name = "approval"

    def check(self, state: PassState, job: Job, req: Request | None, vc: Vc | None) -> Rejection | None:
        if job.approved:
            return None
        return Rejection(WaitReason.APPROVAL, "waiting for a VC admin to approve this job", permanent=True)


class NodeMatch:
    """Rejects jobs no schedulable node could ever hold as asked (unknown VC or SKU, a request
    larger than any node, a VC with no node of the SKU). Cached per shape: the answer depends on
    the inventory only, not on what is running."""

    name = "node_match"

    def __init__(self, plugins: PluginHandle) -> None:
        self.plugins = plugins

    def check(self, state: PassState, job: Job, req: Request | None, vc: Vc | None) -> Rejection | None:
        if vc is None:
            return Rejection(WaitReason.NO_MATCHING_NODES, f"VC {job.vc!r} does not exist", permanent=True)
        if req is None:
            return Rejection(
                WaitReason.NO_MATCHING_NODES,
                f"SKU {job.sku!r} is not defined in this cluster (known: {', '.join(sorted(state.snapshot.skus))})",
                permanent=True,
            )
        cache = state.node_match_cache
        key = (job.vc, id(req))  # requests are interned per shape for the pass
        try:  # one lookup: every job asks, a few dozen shapes per VC miss
            return cache[key]
        except KeyError:
            pass
        placer = self.plugins.placer_for(req)
        result = placer.feasible(state, job, req, vc) if placer is not None else Rejection(
            WaitReason.NO_MATCHING_NODES, "no placement rule handles this request", permanent=True
        )
        cache[key] = result
        return result


class VcQuota:
    """Guarantee: a VC's non-preemptible jobs together never use more than its quota per SKU."""

    name = "vc_quota"

    def __init__(self) -> None:
        # the "VC uses X of Y" rejection per (VC, SKU, used, quota, ask): the 37,000 jobs over their
        # VC's quota in a 100k-pending pass share about 4,400 of them
        self._over: dict[tuple[str, str, float, int, int], Rejection] = {}

    def check(self, state: PassState, job: Job, req: Request | None, vc: Vc | None) -> Rejection | None:
        assert req is not None and vc is not None
        core = state.core_units(job, req.units)
        if core == 0:
            return None
        used = state.vc_used[job.vc]
        if req.sku == CPU_SKU:
            cores, mem_quota, cores_src, mem_src = state.cpu_quota(vc)
            ask = req.cpu * core
            ask_mem = req.memory_bytes * core
            mem = state.vc_used_memory[job.vc]
            for asked, quota_v, used_v, what, src in (
                (ask, cores, used[CPU_SKU], "cores", cores_src),
                (ask_mem, mem_quota, mem, "GiB", mem_src),
            ):
                scale = GIB if what == "GiB" else 1
                how = "" if src == "override" else f" ({_SOURCE[src]})"
                if asked > quota_v + 1e-9:
                    return Rejection(
                        WaitReason.VC_QUOTA,
                        f"this job asks {asked / scale:g} {what} for non-preemptible CPU-only work, more than VC "
                        f"{vc.name}'s whole quota of {quota_v / scale:g}{how}; ask for less, submit it preemptible, "
                        "or have the quota raised",
                        permanent=True,
                    )
                if used_v + asked > quota_v + 1e-9:
                    return Rejection(
                        WaitReason.VC_QUOTA,
                        f"VC {vc.name} uses {used_v / scale:g} of {quota_v / scale:g} {what} of CPU-only quota{how}; "
                        f"this job asks {asked / scale:g}",
                    )
            return None
        quota = vc.quota.get(req.sku, 0)
        ask = req.gpus * core
        if ask > quota:
            # Larger than the whole quota: no amount of waiting helps until the quota grows, so
            # it must not stall a FIFO queue behind it.
            return Rejection(
                WaitReason.VC_QUOTA,
                f"this job asks {ask} non-preemptible {req.sku} GPUs, more than VC {vc.name}'s whole quota of "
                f"{quota}; ask for fewer, submit it preemptible, or have the quota raised",
                permanent=True,
            )
        used_gpus = used[req.sku]
        if used_gpus + ask > quota:
            key = (vc.name, req.sku, used_gpus, quota, ask)
            got = self._over.get(key)
            if got is None:
                got = self._over[key] = Rejection(
                    WaitReason.VC_QUOTA,
                    f"VC {vc.name} uses {used_gpus:g} of {quota} {req.sku} GPUs; this job asks {ask}",
                )
            return got
        return None


class UserQuota:
    """A user's non-preemptible GPUs in a VC above ``user_gpu_quota`` need a VC admin's approval.

    The submit service marks such jobs ``unapproved`` when they arrive; this rule catches a job
    that was under quota at submit time but would go over now, and lets through a job a VC admin
    approved above quota (``user_quota_approved``)."""

    name = "user_quota"

    def check(self, state: PassState, job: Job, req: Request | None, vc: Vc | None) -> Rejection | None:
        assert req is not None and vc is not None
        if vc.user_gpu_quota is None or job.user_quota_approved or req.sku == CPU_SKU:
            return None
        ask = req.gpus * state.core_units(job, req.units)
        if ask == 0:
            return None
        used = state.user_used[(job.vc, job.user)]
        if used + ask > vc.user_gpu_quota:
            return Rejection(
                WaitReason.USER_QUOTA,
                f"user {job.user} holds {used} of {vc.user_gpu_quota} non-preemptible GPUs allowed per user in "
                f"VC {vc.name}; this job asks {ask}; a VC admin can approve it",
            )
        return None


class InteractiveCap:
    """Running interactive jobs of a VC never hold more than ``max_interactive_gpus``."""

    name = "interactive_cap"

    def check(self, state: PassState, job: Job, req: Request | None, vc: Vc | None) -> Rejection | None:
        assert req is not None and vc is not None
        if job.type is not _INTERACTIVE or vc.max_interactive_gpus is None:
            return None
        used = state.interactive_used[job.vc]
        ask = req.total_gpus
        if used + ask > vc.max_interactive_gpus:
            return Rejection(
                WaitReason.INTERACTIVE_CAP,
                f"interactive jobs of VC {vc.name} hold {used} of {vc.max_interactive_gpus} GPUs; this job asks {ask}",
            )
        return None
