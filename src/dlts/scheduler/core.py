"""``decide(snapshot, now)``: one scheduling pass, written as timed phases.

1. ``snapshot``  build the pass state (free capacity, pools, usage, reclaimable holdings)
2. ``stop``      stop plugins (wall time) ask running jobs to stop
3. ``order``     sort pending jobs; number each VC's queue (non-preemptible first, then preemptible)
4. ``assign``    non-preemptible jobs of every VC in order: policy, filters, place, else reclaim
5. ``opportunistic``  preemptible jobs and extra inference replicas, in the same order rules
6. ``finalize``  merge per-job decisions into ``Decisions``

Decisions are values; nothing here performs them. A preemption does not start the job it makes
room for in the same pass: victims get SIGTERM and a grace period, so the job waits (reason
``capacity``, with the victims in the detail) and starts on a later pass once they have exited.
``time.perf_counter`` only measures phases for ``Decisions.timings_s``; no decision reads a clock.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from dlts.scheduler.framework import OrderingSortPlugin, PlacePlugin, PolicyPlugin, ReclaimPlan, VcQueue
from dlts.scheduler.model import (
    CPU_SKU,
    Decisions,
    Job,
    JobType,
    Placement,
    Policy,
    Rejection,
    Snapshot,
    Start,
    Stop,
    StopReason,
    Vc,
    Wait,
    WaitReason,
    resource_pool,
)
from dlts.scheduler.plugins.registry import BUILTIN, DEFAULT_PROFILE, Profile, Registry, resolve
from dlts.scheduler.state import Holding, PassState, Request


class _Pass:
    def __init__(self, snapshot: Snapshot, now: float, profile: Profile, registry: Registry) -> None:
        self.timings_s: dict[str, float] = {}
        self.fw = resolve(profile, registry)
        with self._phase("snapshot"):
            self.state = PassState(snapshot, now)
        self.starts: dict[int, list[Placement]] = {}
        self.scale_up: set[int] = set()
        self.stops: list[Stop] = []
        self.waits: list[Wait] = []
        self.queues: dict[str, VcQueue] = {}
        self.positions: dict[int, int] = {}
        self._queue_cache: dict[str, tuple[Vc | None, VcQueue, PolicyPlugin | None]] = {}
        self._blocked: dict[int, Rejection] = {}
        self._checks = [f.check for f in self.fw.filter]  # every job runs them: bound once
        # -- backfill (plugins/backfill.py): only when some VC is on backfill --
        self.bf = None
        if any(v.policy is Policy.BACKFILL for v in snapshot.vcs.values()):
            from dlts.scheduler.plugins.backfill import BackfillPass

            self.bf = BackfillPass(self.state, now, self.starts)

    @contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timings_s[name] = self.timings_s.get(name, 0.0) + time.perf_counter() - t0

    def run(self) -> Decisions:
        snap, st, fw = self.state.snapshot, self.state, self.fw
        with self._phase("stop"):
            for plugin in fw.stop:
                self.stops.extend(plugin.stops(st))
        with self._phase("order"):
            sorter = fw.sort

            def order(st_: PassState, jobs: list[Job], phase: int = 0) -> list[Job]:
                # a sort plugin may order a whole list (fair share re-ranks inside each VC)
                if isinstance(sorter, OrderingSortPlugin):
                    return sorter.order(st_, jobs, phase)
                return sorted(jobs, key=sorter.sort_key)
            firm: list[Job] = []
            preemptible: list[Job] = []
            for j in snap.jobs:
                if not j.running:
                    (preemptible if j.preemptible else firm).append(j)
            core = order(st, firm, 0)
            opportunistic = order(st, preemptible, 1)
            counters: dict[str, int] = {}
            positions = self.positions
            for j in core + opportunistic:
                if j.approved:
                    positions[j.id] = counters[j.vc] = counters.get(j.vc, 0) + 1
        with self._phase("assign"):
            for job in core:
                self._assign(job)
        with self._phase("opportunistic"):
            # Extra inference replicas are opportunistic like preemptible jobs and compete with
            # them in the same order; a pending preemptible job and a running service that wants
            # more replicas are both just "more preemptible work".
            inference = JobType.INFERENCE  # read once: a member read off its enum class is slow (state.py)
            extras = [
                j
                for j in snap.jobs
                if j.type is inference
                and j.max_replicas > max(1, j.min_replicas)
                and ((j.running and not j.stopping and j.id not in st.stopped) or j.id in self.starts)
            ]
            for job in (order(st, opportunistic + extras, 1) if extras else opportunistic):
                if job.running or job.id in self.starts:
                    self._grow(job)
                else:
                    self._assign(job)
        t0 = time.perf_counter()
        if isinstance(fw.sort, OrderingSortPlugin):
            making_room = {s.for_job for s in self.stops if s.for_job is not None}
            self.waits = fw.sort.revise_waits(st, self.waits, set(self.starts), making_room)
        out = self._finalize()
        return replace(out, timings_s={**out.timings_s, "finalize": time.perf_counter() - t0})

    # -- one pending job -------------------------------------------------------------------------

    def _wait(self, job: Job, rej: Rejection, req: Request | None = None, vc: Vc | None = None) -> None:
        estimate = None
        # backfill: maybe a reservation (and an estimated start)
        if self.bf is not None:
            if self.bf.reserving or job.id in self.bf.held_now:
                rej, estimate = self.bf.on_wait(job, req, vc, rej)
            else:  # every reservation of the pass is given: say so where one could have been
                rej = self.bf.no_slot(job, vc, rej)
        self.waits.append(
            Wait(job.id, rej.reason, rej.detail, rej.blocked_by, self.positions.get(job.id), rej.permanent, estimate)
        )

    def _queue(self, vc_name: str) -> tuple[Vc | None, VcQueue, PolicyPlugin | None]:
        """The VC's queue state and policy plugin, resolved once per pass."""
        got = self._queue_cache.get(vc_name)
        if got is None:
            vc = self.state.vcs.get(vc_name)
            policy = self.fw.policy.get(vc.policy.value if vc is not None else "", self.fw.policy.get("RF"))
            got = self._queue_cache[vc_name] = (vc, self.queues.setdefault(vc_name, VcQueue(vc_name)), policy)
        return got

    def _assign(self, job: Job) -> None:
        st = self.state
        cached = self._queue_cache.get(job.vc)  # every job asks: the cached answer without a call
        vc, queue, policy = cached if cached is not None else self._queue(job.vc)
        if policy is not None and job.approved:
            blocker = policy.blocked_by(queue, job)
            if blocker is not None:
                rej = self._blocked.get(blocker)
                if rej is None:  # one value per blocker: thousands of jobs can queue behind one
                    rej = self._blocked[blocker] = Rejection(
                        WaitReason.BLOCKED_BY,
                        f"VC {job.vc} is FIFO and job {blocker}, ahead in its queue for "
                        f"{_pool_words(resource_pool(job))}, cannot start yet",
                        blocked_by=blocker,
                    )
                self._wait(job, rej)
                return
        req = st.request(job)
        for check in self._checks:
            rej = check(st, job, req, vc)
            if rej is not None:
                if policy is not None and job.approved:
                    policy.on_wait(queue, job, rej)
                self._wait(job, rej, req, vc)
                return
        assert req is not None and vc is not None  # node_match rejected both cases
        placer: PlacePlugin | None = None  # backfill places by itself: its placer only explains a failure
        held: Rejection | None = None
        plan: ReclaimPlan | None = None
        native = False  # a backfill VC's own job: its room (and reclaim) come from the time model
        placements: list[Placement] | None = None
        if self.bf is not None and self.bf.handles(job, vc):
            native = self.bf.native(job, vc)
            got = self.bf.place_now(job, req, vc, req.units)
            if isinstance(got, list):
                placements = got
            elif isinstance(got, Rejection):
                held = got
            elif got is not None:
                plan = got
        else:
            placer = self._placer(req)
            placements = placer.place(st, job, req, vc, req.units)
        if placements is not None:
            st.count_start(job, len(placements))
            self.starts[job.id] = list(placements)
            if self.bf is not None:
                self.bf.on_start(job, placements)
            return
        if held is not None:
            rej = held
        else:
            rej = (placer if placer is not None else self._placer(req)).explain(st, job, req, vc)
        if plan is not None:
            rej = self._apply_plan(job, plan, rej)
        elif not job.preemptible and not native:
            rej = self._reclaim(job, req, vc, rej)
        if policy is not None:
            policy.on_wait(queue, job, rej)
        self._wait(job, rej, req, vc)

    def _placer(self, req: Request) -> PlacePlugin:
        placer = self.fw.placer_for(req)
        assert placer is not None  # node_match rejected requests no placer handles
        return placer

    def _reclaim(self, job: Job, req: Request, vc: Vc, rej: Rejection) -> Rejection:
        if self.bf is not None and self.bf.skip_reclaim(job, req):
            return rej
        for plugin in self.fw.preempt:
            plan = plugin.find(self.state, job, req, vc)
            if plan is None:
                continue
            if self.bf is not None and not self.bf.plan_ok(job, req, plan.placements, plan.victims):
                continue  # the room would take resources reserved for a job ahead
            return self._apply_plan(job, plan, rej)
        for plugin in self.fw.preempt:  # the preemption budget may be what keeps the room
            text = plugin.blocked_note(self.state, job, req, vc)
            if text:
                return Rejection(rej.reason, f"{rej.detail}; {text}", rej.permanent, rej.blocked_by)
        return rej

    def _apply_plan(self, job: Job, plan: ReclaimPlan, rej: Rejection) -> Rejection:
        victims = plan.victims
        self.state.reserve_free_part(plan.placements)
        for h in victims:
            self.state.claim(h)
        new = [h for h in victims if not h.stopping]
        for h in new:
            if h.replica:
                self.stops.append(Stop(h.job.id, StopReason.SCALE_DOWN, job.id, h.placements))
            else:
                self.stops.append(Stop(h.job.id, StopReason.PREEMPTED, job.id))
                self.state.mark_stopping(h.job)
            h.stopping = True
        if self.bf is not None:
            self.bf.on_reclaimed(victims)
        old = [h for h in victims if h not in new]
        parts = []
        if [h for h in new if not h.replica]:
            parts.append(f"preempting {_ids([h for h in new if not h.replica])} to make room")
        if [h for h in new if h.replica]:
            parts.append(f"removing {_replicas([h for h in new if h.replica])} to make room")
        if old:
            parts.append(f"waiting for {_exiting(old)} to exit")
        return Rejection(WaitReason.CAPACITY, f"{rej.detail}; " + "; ".join(parts) + "; starts when they exit")

    # -- extra inference replicas ------------------------------------------------------------

    def _grow(self, job: Job) -> None:
        st = self.state
        vc = st.vcs.get(job.vc)
        req = st.request(job)
        if vc is None or req is None:
            return
        placer = self.fw.placer_for(req)
        if placer is None:
            return
        have = len(job.placements) if job.running else 0
        have += len(self.starts.get(job.id, ()))
        added: list[Placement] = []
        while have + len(added) < job.max_replicas:
            if self.bf is not None and self.bf.handles(job, vc):
                placed = self.bf.place_now(job, req, vc, 1, extra=True)
                got = placed if isinstance(placed, list) else None
            else:
                got = placer.place(st, job, req, vc, 1)
            if got is None:
                break
            added.extend(got)
        if not added:
            return
        if self.bf is not None:
            self.bf.on_start(job, added)
        self.starts.setdefault(job.id, []).extend(added)
        if job.running:
            self.scale_up.add(job.id)

    # -- output ------------------------------------------------------------------------------

    def _finalize(self) -> Decisions:
        whole = {s.job_id for s in self.stops if not s.placements}
        merged: dict[tuple[int, StopReason], Stop] = {}
        for s in self.stops:
            if s.placements and s.job_id in whole:
                continue  # the whole job stops anyway
            k = (s.job_id, s.reason)
            if k in merged and s.placements:
                prev = merged[k]
                merged[k] = Stop(s.job_id, s.reason, prev.for_job, prev.placements + s.placements)
            elif k not in merged:
                merged[k] = s
        starts = tuple(
            Start(job_id, tuple(pl), scale_up=job_id in self.scale_up) for job_id, pl in self.starts.items()
        )
        reservations = tuple(self.bf.reservations) if self.bf is not None else ()
        return Decisions(starts, tuple(merged.values()), tuple(self.waits), dict(self.timings_s), reservations)


def _pool_words(pool: str) -> str:
    return "CPU-only work" if pool == CPU_SKU else f"{pool} GPUs"


def _ids(holdings: list[Holding]) -> str:
    return _ids_of(sorted({h.job.id for h in holdings}))


def _replicas(holdings: list[Holding]) -> str:
    """'2 replicas of job 7', '1 replica of job 7 and 3 replicas of job 9'."""
    per_job: dict[int, int] = {}
    for h in holdings:
        per_job[h.job.id] = per_job.get(h.job.id, 0) + len(h.placements)
    return " and ".join(f"{n} replica{'s' if n != 1 else ''} of job {job_id}" for job_id, n in sorted(per_job.items()))


def _exiting(holdings: list[Holding]) -> str:
    """What is already on its way out: whole jobs, and replicas of inference jobs."""
    whole = [h for h in holdings if not h.replica]
    stopping_jobs = {h.job.id for h in whole}
    replicas = [h for h in holdings if h.replica and h.job.id not in stopping_jobs]  # a whole job covers its replicas
    return " and ".join(([_ids(whole)] if whole else []) + ([_replicas(replicas)] if replicas else []))


def _ids_of(ids: list[int]) -> str:
    return ("job " if len(ids) == 1 else "jobs ") + ", ".join(str(i) for i in ids)


def decide(snapshot: Snapshot, now: float, profile: Profile = DEFAULT_PROFILE,
           registry: Registry = BUILTIN) -> Decisions:
    """One scheduling pass over ``snapshot`` at time ``now`` (seconds, same clock as the
    snapshot's ``queue_time`` and ``started_at``), running ``profile``'s plugins from ``registry``."""
    t0 = time.perf_counter()
    # A pass allocates many small objects and frees them by reference counting; the cyclic
    # collector, triggered by those allocations, would walk the whole snapshot again and again
    # (a quarter of a 20k-job backfill pass). It is paused for the pass and restored as it was.
    collecting = gc.isenabled()
    gc.disable()
    try:
        out = _Pass(snapshot, now, profile, registry).run()
    finally:
        if collecting:
            gc.enable()
    timings = dict(out.timings_s)
    timings["total"] = time.perf_counter() - t0
    return Decisions(out.starts, out.stops, out.waits, timings, out.reservations)
