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
This module holds the interfaces only; ``dlts.scheduler.plugins.registry`` lists the built-in
plugins by name and the profiles (which plugins a pass runs) a config may choose.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from dlts.scheduler.model import Job, Placement, Rejection, Stop, Vc, Wait
from dlts.scheduler.state import Holding, PassState, Request

# what a sort plugin orders by: priority, queue time, id, and the like (smaller first)
SortKey = tuple[float, ...]


@dataclass
class VcQueue:
    """Per-VC bookkeeping of one pass that policy plugins read and write."""

    name: str
    blocker: int | None = None  # FIFO: the first non-preemptible job that did not fit (any pool)
    # FIFO blocks per resource pool: pool (``resource_pool(job)``) -> the first job there that did not fit
    blockers: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ReclaimPlan:
    """What a preempt plugin found: the holdings to free (already-stopping ones included) and
    the placements the job will take once they have exited. The free part of those placements is
    reserved for the rest of the pass so opportunistic work cannot take it meanwhile."""

    victims: list[Holding]
    placements: list[Placement]


@runtime_checkable
class SortPlugin(Protocol):
    name: str

    def sort_key(self, job: Job) -> SortKey: ...


@runtime_checkable
class OrderingSortPlugin(SortPlugin, Protocol):
    """A sort plugin that orders a whole list (fair share re-ranks inside each VC) and may revise
    the reasons of jobs that waited because of that order."""

    def order(self, state: PassState, jobs: list[Job], phase: int = 0) -> list[Job]: ...

    def revise_waits(self, state: PassState, waits: list[Wait], started: set[int],
                     making_room: set[int]) -> list[Wait]:
        """The pass's waits, re-labelled by what the order decided (``started``: jobs started this
        pass; ``making_room``: jobs this pass preempts or scales down for, whose waits stand)."""
        ...


@runtime_checkable
class StopPlugin(Protocol):
    name: str

    def stops(self, state: PassState) -> list[Stop]: ...


@runtime_checkable
class FilterPlugin(Protocol):
    name: str

    def check(self, state: PassState, job: Job, req: Request | None, vc: Vc | None) -> Rejection | None: ...


@runtime_checkable
class PolicyPlugin(Protocol):
    name: str

    def blocked_by(self, queue: VcQueue, job: Job) -> int | None: ...

    def on_wait(self, queue: VcQueue, job: Job, rejection: Rejection) -> None: ...


@runtime_checkable
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


@runtime_checkable
class PreemptPlugin(Protocol):
    name: str

    def find(self, state: PassState, job: Job, req: Request, vc: Vc) -> ReclaimPlan | None:
        """The room to make, or None when no set of reclaimable work makes room."""
        ...

    def blocked_note(self, state: PassState, job: Job, req: Request, vc: Vc) -> str | None:
        """When ``find`` made no room although reclaimable work could (e.g. the preemption budget
        protects it): why, in words for the wait reason; else None."""
        ...


@runtime_checkable
class PluginHandle(Protocol):
    """What a plugin factory receives besides its arguments: the pass's other plugins it may ask."""

    def placer_for(self, req: Request) -> PlacePlugin | None: ...
