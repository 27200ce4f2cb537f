"""A forecast of when every waiting job starts: the scheduler's own passes, run forward in time.

Backfill's reservations give an estimate to the first ``reservation_depth`` jobs that cannot
start; this gives one to every waiting job, in every VC and under every policy. It replays the
snapshot forward with the same ``decide`` the job manager runs, assuming that

- every job runs for its predicted run time (``runtime``, below) where there is one, else to its
  limit (``max_time_s``, else its VC's ``max_job_time_s``, else its VC's
  ``default_runtime_estimate_s``: backfill's ``duration_s``); one with neither never ends. A
  running job that has already run longer than predicted runs to its limit;
- nothing new is submitted, no node changes and fair-share use stays as it is now;
- a preempted job goes back to the queue at once, and work already told to stop is gone.

The forecast start of a job is the time of the first forecast pass that starts it. Passes run
where the job manager's ticks would decide something new: when running work ends, and when a
preemption budget (``min_runtime_s``) or a wait for room (``max_reclaim_delay_s``) runs out. To
keep the number of passes small, the times that fall within ``precision`` × (time from now) of
the next one are taken together, and the pass runs at the last of them: each pass is late by at
most that share of the time ahead (5 % by default: 30 minutes for a pass 10 hours ahead). A job's
start moves by more only where the late pass changes the order of starts (another job fits
first). With ``precision`` 0, when jobs run exactly to their limits and nothing arrives, the
forecast starts each job when ``dlts sim`` does (tests/scheduler/test_forecast.py).

It is a forecast, not a promise: unlike a reservation nothing holds the resources for the job,
and new jobs of higher priority or of lighter users (fair share) go ahead of it. The job
manager stores it apart from the reservation (``jobs.forecast_start``), so it never makes a job
reserved. Jobs it does not reach get none: they wait for something that does not end by a limit
(``horizon`` is then infinite), for an approval, for nodes that do not exist, or beyond the
``max_passes`` passes it may run (``horizon`` is then the time it had reached).

Users' limits are generous guesses (production_28d's are 1.2-3x the run, rounded up), so a
forecast from limits alone starts jobs late. ``UserRuntimes`` predicts a job's run time as the mean
of its owner's last two completed runs (Tsafrir, Etsion and Feitelson's predictor for backfill),
capped by the job's limit; the job manager and ``dlts sim --forecast-every`` pass it in.
Reservations keep using limits: they must hold, a forecast should be close.

Pure, like the rest of the scheduler: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from dlts.scheduler.core import decide
from dlts.scheduler.model import ROOM_REASONS, Job, Snapshot, StopReason
from dlts.scheduler.plugins.backfill import Durations
from dlts.scheduler.plugins.registry import DEFAULT_PROFILE, Profile
from dlts.scheduler.reservations import INF

MAX_PASSES = 200
PRECISION = 0.05
MIN_STEP_S = 60.0


class UserRuntimes:
    """Each user's last ``keep`` completed run times (seconds); a job's predicted run time is
    their mean (None: its owner has completed nothing yet)."""

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self._last: dict[str, list[float]] = {}
        self._mean: dict[str, float] = {}

    def add(self, user: str, seconds: float) -> None:
        """Record a completed run of ``user``'s, oldest first."""
        runs = self._last.setdefault(user, [])
        runs.append(max(0.0, float(seconds)))
        del runs[:-self.keep]
        self._mean[user] = sum(runs) / len(runs)

    def __call__(self, job: Job) -> float | None:
        return self._mean.get(job.user)

    def __len__(self) -> int:
        return len(self._last)


@dataclass(frozen=True)
class Forecast:
    now: float
    starts: dict[int, float] = field(default_factory=dict)  # waiting job id -> forecast start
    # how far the forecast got: jobs not in ``starts`` start after this, or (INF) nothing ending
    # by a limit lets them start
    horizon: float = INF
    passes: int = 0


def forecast(snapshot: Snapshot, now: float, profile: Profile = DEFAULT_PROFILE, *,
             runtime: Callable[[Job], float | None] | None = None, max_passes: int = MAX_PASSES,
             precision: float = PRECISION, min_step_s: float = MIN_STEP_S) -> Forecast:
    """When each waiting job of ``snapshot`` starts if every job runs for its predicted run time, else
    to its limit (module doc); ``runtime``: a predicted run time per job (None: none), used where it
    is below the limit and the job has not yet run longer."""
    limit = Durations(snapshot.vcs)

    def duration(j: Job, elapsed: float = 0.0) -> float:
        bound = limit(j)
        guess = runtime(j) if runtime is not None else None
        # a job already running longer than predicted is expected to run to its limit
        return bound if guess is None or guess >= bound or guess <= elapsed else guess

    jobs: dict[int, Job] = {j.id: j for j in snapshot.jobs}
    waiting = {j.id for j in snapshot.jobs if not j.running}
    vcs = snapshot.vcs
    ends: dict[int, float] = {}
    # times at which a pass may decide differently though nothing ends: a preemptible job's
    # preemption budget runs out (reclaim may take it), a job's wait for room reaches its VC's
    # max_reclaim_delay_s (reclaim may override budgets for it); as the job manager's ticks see them
    wakes: set[float] = set()

    def budget_end(j: Job, started: float) -> None:
        vc = vcs.get(j.vc)
        if j.preemptible and vc is not None and vc.min_runtime_s > 0:
            wakes.add(started + vc.min_runtime_s)

    for j in snapshot.jobs:
        if j.running:
            started = j.started_at if j.started_at is not None else now
            # work told to stop is gone; work past its limit is stopped at the first pass
            ends[j.id] = now if j.stopping else max(now, started + duration(j, now - started))
            budget_end(j, started)
    starts: dict[int, float] = {}
    t = now
    passes = 0
    while passes < max_passes and any(not j.running for j in jobs.values()):
        for job_id in [i for i, e in ends.items() if e <= t]:
            del ends[job_id], jobs[job_id]
        d = decide(replace(snapshot, jobs=tuple(jobs.values())), t, profile)
        passes += 1
        for stop in d.stops:
            j = jobs[stop.job_id]
            if stop.reason is StopReason.SCALE_DOWN and stop.placements:
                jobs[j.id] = replace(j, placements=tuple(p for p in j.placements if p not in stop.placements))
            elif stop.reason is StopReason.PREEMPTED:
                jobs[j.id] = replace(j, running=False, started_at=None, placements=(), retiring=(), stopping=False,
                                     preemptions=j.preemptions + 1, reserved=False, room_wait_since=None)
                del ends[j.id]
            else:  # wall time
                del ends[j.id], jobs[j.id]
        for s in d.starts:
            j = jobs[s.job_id]
            if s.scale_up:
                jobs[j.id] = replace(j, placements=j.placements + s.placements)
                continue
            jobs[j.id] = j = replace(j, running=True, started_at=t, placements=s.placements, reserved=False,
                                     room_wait_since=None)
            ends[j.id] = t + duration(j)
            budget_end(j, t)
            if j.id in waiting:
                starts.setdefault(j.id, t)
        for w in d.waits:
            j = jobs[w.job_id]
            if j.running:
                continue
            reserved = w.estimated_start is not None  # as the job manager reads jobs.estimated_start
            since = (j.room_wait_since if j.room_wait_since is not None else t) if w.reason in ROOM_REASONS else None
            if (reserved, since) != (j.reserved, j.room_wait_since):
                jobs[j.id] = replace(j, reserved=reserved, room_wait_since=since)
                vc = vcs.get(j.vc)
                if since == t and vc is not None and vc.max_reclaim_delay_s is not None and not j.preemptible:
                    wakes.add(t + vc.max_reclaim_delay_s)
        if d.stops:
            continue  # the room a stop made is there at once: another pass now
        later = [e for e in ends.values() if e > t] + [w for w in wakes if w > t]
        nxt = min(later, default=INF)
        if nxt == INF:
            return Forecast(now, starts, INF, passes)
        reach = nxt + max(min_step_s, precision * (nxt - now))
        t = max(e for e in later if e <= reach)
        wakes = {w for w in wakes if w > t}
    left = any(not j.running for j in jobs.values())
    return Forecast(now, starts, t if left else INF, passes)
