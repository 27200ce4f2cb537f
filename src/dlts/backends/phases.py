"""One attempt's phase from the phases of its members (pods, processes): the rule both backends use.

An attempt runs as members: the pods of a distributed job (one per node), the replicas of an
inference job, or a single pod / process. Each backend turns what it sees of one member into a
``MemberState``; ``attempt_state`` decides the attempt's phase, in this order:

1. a member FAILED: the attempt FAILED (the first failed member, by index, is the cause);
2. every member SUCCEEDED: SUCCEEDED (a finished attempt stays finished when a node goes later);
3. a member is GONE (its node lost, its process vanished): GONE;
4. a gang (``all_must_run``: every type but inference): PENDING while any member has not started
   (the first one with a waiting reason is the cause), else RUNNING; members that finished
   successfully while others still run count as running;
   inference replicas are independent: RUNNING while any replica runs, else PENDING.

An attempt with no member yet is PENDING. (An inference attempt whose only replicas are on their
way out is the caller's case: such replicas are not members, and the attempt runs on.)

Pure: no clock, no I/O. The callers add what is theirs (missing pods, terminating, messages).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dlts.backends.base import RunPhase


@dataclass(frozen=True)
class MemberState:
    """One pod or process of an attempt, as its backend sees it."""

    index: int
    phase: RunPhase
    exit_code: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    message: str = ""
    reason: str = ""  # PENDING (or a failure before the start): a short code, see Observed.reason
    node_lost: bool = False


@dataclass(frozen=True)
class AttemptState:
    phase: RunPhase
    cause: MemberState | None  # the member that decided a FAILED, GONE or PENDING phase
    started_at: float | None  # when the first member started
    finished_at: float | None  # when the last member that finished did


def attempt_state(members: Sequence[MemberState], *, all_must_run: bool) -> AttemptState:
    """The attempt's phase from its members' (see the module docstring for the rule)."""
    ordered = sorted(members, key=lambda m: m.index)
    starts = [m.started_at for m in ordered if m.started_at is not None]
    finishes = [m.finished_at for m in ordered if m.finished_at is not None]
    started_at = min(starts) if starts else None
    finished_at = max(finishes) if finishes else None

    def state(phase: RunPhase, cause: MemberState | None = None) -> AttemptState:
        return AttemptState(phase, cause, started_at, finished_at)

    if not ordered:
        return state(RunPhase.PENDING)
    phases = [m.phase for m in ordered]
    for member in ordered:
        if member.phase is RunPhase.FAILED:
            return state(RunPhase.FAILED, member)
    if all(p is RunPhase.SUCCEEDED for p in phases):
        return state(RunPhase.SUCCEEDED)
    for member in ordered:
        if member.phase is RunPhase.GONE:
            return state(RunPhase.GONE, member)
    pending = [m for m in ordered if m.phase is RunPhase.PENDING]
    waiting = next((m for m in pending if m.reason), pending[0] if pending else None)
    if all_must_run:
        return state(RunPhase.PENDING, waiting) if pending else state(RunPhase.RUNNING)
    if RunPhase.RUNNING in phases:
        return state(RunPhase.RUNNING)
    return state(RunPhase.PENDING, waiting)
