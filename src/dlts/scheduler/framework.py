"""Extension points of the scheduling pass, the plugin registry, and profiles.

Modelled on the kube-scheduler framework: a pass has fixed extension points and each rule of
SCHEDULING.md is a small named plugin implementing only the points it needs.

========== ============================================================================
point      what a plugin there does
========== ============================================================================
sort       gives the order key of pending jobs (one plugin)
stop       looks at running jobs before assignment and asks for some to stop (wall time)
filter     admits or rejects a pending job before placement (quota, caps, approval, ...)
policy     per VC queue discipline: whether a job is blocked by an earlier one (RF, FIFO)
place      finds placements for one kind of request, and explains a failure (reserve is the
           pass state's ``reserve``; score is inside ``place``: best fit)
preempt    picks running work to free room for a non-preemptible job (reclaim)
========== ============================================================================

A rejection is a value (``Rejection``) carrying the reason users see; faults are exceptions.
``REGISTRY`` maps (point, name) to a factory; a ``Profile`` names the plugins a pass uses, so a
test or an operator can switch rules on and off by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, cast

from dlts.scheduler.model import CPU_SKU, Job, JobType, Placement, Stop, Vc, WaitReason
from dlts.scheduler.state import Holding, PassState, Request


@dataclass(frozen=True)
class Rejection:
    """Why a job cannot start now. ``permanent`` rejections (nothing in the cluster could ever
    hold the job as asked) never block a FIFO queue, or the VC would stall forever."""

    reason: WaitReason
    detail: str
    permanent: bool = False
    blocked_by: int | None = None


@dataclass
class VcQueue:
    """Per-VC bookkeeping of one pass that policy plugins read and write."""

    name: str
    blocker: int | None = None  # FIFO: the first non-preemptible job that did not fit (any pool)
    # FIFO blocks per resource pool: pool (``resource_pool(job)``) -> the first job there that did not fit
    blockers: dict[str, int] = field(default_factory=dict)


def resource_pool(job: Job) -> str:
    """The pool a job competes in for FIFO: its GPU SKU, or ``cpu`` for CPU-only jobs."""
    if job.gpus <= 0 or job.sku in (None, CPU_SKU):
        return job.sku if job.type is JobType.DISTRIBUTED and job.sku else CPU_SKU
    return job.sku


@dataclass(frozen=True)
class ReclaimPlan:
    """What a preempt plugin found: the holdings to free (already-stopping ones included) and
    the placements the job will take once they have exited. The free part of those placements is
    reserved for the rest of the pass so opportunistic work cannot take it meanwhile."""

    victims: list[Holding]
    placements: list[Placement]


class SortPlugin(Protocol):
    name: str

    def sort_key(self, job: Job) -> tuple: ...


class StopPlugin(Protocol):
    name: str

    def stops(self, state: PassState) -> list[Stop]: ...


class FilterPlugin(Protocol):
    name: str

    def check(self, state: PassState, job: Job, req: Request | None, vc: Vc | None) -> Rejection | None: ...


class PolicyPlugin(Protocol):
    name: str

    def blocked_by(self, queue: VcQueue, job: Job) -> int | None: ...

    def on_wait(self, queue: VcQueue, job: Job, rejection: Rejection) -> None: ...


class PlacePlugin(Protocol):
    name: str

    def handles(self, req: Request) -> bool: ...

    def feasible(self, state: PassState, job: Job, req: Request, vc: Vc) -> Rejection | None:
        """Static check over schedulable nodes, ignoring what is in use."""
        ...

    def place(self, state: PassState, job: Job, req: Request, vc: Vc, units: int) -> list[Placement] | None:
        """Find and reserve ``units`` placements; all or nothing."""
        ...

    def explain(self, state: PassState, job: Job, req: Request, vc: Vc) -> Rejection: ...


class PreemptPlugin(Protocol):
    name: str

    def find(self, state: PassState, job: Job, req: Request, vc: Vc) -> ReclaimPlan | None:
        """The room to make, or None when no set of reclaimable work makes room."""
        ...


EXTENSION_POINTS = ("sort", "stop", "filter", "policy", "place", "preempt")

REGISTRY: dict[str, dict[str, Callable[[], object]]] = {p: {} for p in EXTENSION_POINTS}


def register(point: str, name: str) -> Callable[[Callable[[], object]], Callable[[], object]]:
    """Class decorator: make a plugin available to profiles under ``name``."""
    if point not in REGISTRY:
        raise ValueError(f"unknown extension point {point!r}; expected one of {EXTENSION_POINTS}")

    def deco(factory: Callable[[], object]) -> Callable[[], object]:
        if name in REGISTRY[point]:
            raise ValueError(f"plugin {name!r} already registered at {point!r}")
        REGISTRY[point][name] = factory
        return factory

    return deco


@dataclass(frozen=True)
class Profile:
    """Which plugins one pass runs, by registered name, in order."""

    sort: str = "fair_share"  # priority_queue_time, re-ranked inside each VC by recent use
    stop: tuple[str, ...] = ("wall_time",)
    filter: tuple[str, ...] = ("approval", "node_match", "vc_quota", "user_quota", "interactive_cap")
    policy: tuple[str, ...] = ("RF", "FIFO", "backfill")
    place: tuple[str, ...] = ("gang", "cpu_only", "best_fit")
    preempt: tuple[str, ...] = ("reclaim",)


DEFAULT_PROFILE = Profile()


@dataclass
class Framework:
    """A profile resolved to plugin instances."""

    sort: SortPlugin
    stop: list[StopPlugin]
    filter: list[FilterPlugin]
    policy: dict[str, PolicyPlugin]
    place: list[PlacePlugin]
    preempt: list[PreemptPlugin]
    timings_s: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_profile(cls, profile: Profile) -> Framework:
        import dlts.scheduler.plugins  # noqa: F401  (registers the built-in plugins)

        def make(point: str, name: str) -> Any:
            try:
                return REGISTRY[point][name]()
            except KeyError:
                known = ", ".join(sorted(REGISTRY[point])) or "none"
                raise ValueError(f"profile names unknown {point} plugin {name!r} (known: {known})") from None

        policies = [cast(PolicyPlugin, make("policy", n)) for n in profile.policy]
        return cls(
            sort=make("sort", profile.sort),
            stop=[make("stop", n) for n in profile.stop],
            filter=[make("filter", n) for n in profile.filter],
            policy={p.name: p for p in policies},
            place=[make("place", n) for n in profile.place],
            preempt=[make("preempt", n) for n in profile.preempt],
        )

    def placer_for(self, req: Request) -> PlacePlugin | None:
        for p in self.place:
            if p.handles(req):
                return p
        return None
