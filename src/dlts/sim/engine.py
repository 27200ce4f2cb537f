"""The discrete-event replay behind ``dlts sim``.

Simulated time advances from event to event (a submit, a job's end, a wall-time deadline, the end
of a preemption grace period). Passes of the real core (``dlts.scheduler.decide``) run at multiples
of ``tick_s``: the first tick at or after each event, never in between, exactly as the live job
manager only acts on its ticks. A job runs for its ``duration_s``; a preempted job loses its work
and is requeued keeping its queue time (its submit time), so it sorts back to the head.

With ``preempt_grace_s`` 0 a stop takes effect at once and the pass is repeated at the same instant
(so the job a preemption made room for starts in the same tick); with a grace period the victims
hold their resources, marked ``stopping``, until the grace ends.

With ``forecast_every_s`` (``dlts sim --forecast-every``) the replay also runs the forecast the
forecast manager runs (``scheduler/forecast.py``, with each user's last completed run times) at a
pass every that many simulated seconds, keeps each job's first forecast start, and reports how
close those came to the starts the replay then made (``summary.forecast``).

The result is the RESULT.json document of SCHEDULING.md, plus what a reader needs to re-check
every rule from it alone: the cluster itself, each job's request, and for inference jobs one row per
replica.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from dlts.scheduler import Decisions, Job, JobType, Placement, Snapshot, StopReason, decide
from dlts.scheduler.forecast import UserRuntimes, forecast
from dlts.scheduler.model import ROOM_REASONS
from dlts.scheduler.plugins.walltime import effective_limit_s
from dlts.scheduler.quota import effective_cpu_memory_quota
from dlts.sim.fairshare import DecayedUse
from dlts.sim.inputs import Cluster, TraceJob

PassHook = Callable[[Snapshot, Decisions, float], None]
MAX_ROUNDS_PER_TICK = 4  # repeated passes at one instant after immediate stops


@dataclass
class SimJob:
    spec: TraceJob
    job: Job  # the core's view, rebuilt only when something changed
    state: str = "submitted"  # submitted -> queued -> running -> finished | killed (queued again if preempted)
    start_s: float | None = None
    end_s: float | None = None
    attempts: list[dict] = field(default_factory=list)
    replicas: list[dict] = field(default_factory=list)  # inference: one row per replica lifetime
    wait_reasons: Counter = field(default_factory=Counter)
    placements: list[Placement] = field(default_factory=list)
    started_at: float | None = None
    stopping_until: float | None = None
    stop_reason: str | None = None
    attempt_no: int = 0
    # backfill: the first and the latest estimated start a pass gave it while it waited
    first_estimate_s: float | None = None
    last_estimate_s: float | None = None
    # --forecast-every: when the first forecast that reached the job was made, and its start
    forecast_made_s: float | None = None
    forecast_start_s: float | None = None

    @property
    def id(self) -> int:
        return self.spec.id


class Simulation:
    def __init__(self, cluster: Cluster, trace: list[TraceJob], on_pass: PassHook | None = None,
                 forecast_every_s: float | None = None, forecast_history_runs: int = 2) -> None:
        self.cluster = cluster
        self.forecast_every_s = forecast_every_s
        self.next_forecast_s = 0.0
        self.forecasts = 0
        # each user's last finished run times, as the forecast manager reads them (forecast.history_runs;
        # 0: the forecast assumes every job runs to its limit)
        self.runtimes = UserRuntimes(max(1, forecast_history_runs)) if forecast_history_runs > 0 else None
        self.trace = sorted(trace, key=lambda j: (j.submit_s, j.id))
        self.jobs: dict[int, SimJob] = {t.id: SimJob(t, pending_job(t)) for t in self.trace}
        self.on_pass = on_pass
        self.pending: dict[int, SimJob] = {}
        self.running: dict[int, SimJob] = {}
        self.events: list[tuple[float, int, str, int, int]] = []  # (time, seq, kind, job, attempt)
        self._seq = 0
        self.passes = 0
        self.preemptions = 0
        self.scale_downs = 0
        self.last_event_s = 0.0
        self.completed = 0  # jobs finished or killed
        # fair share: every user's decayed GPU-seconds per VC, handed to the core as the live job
        # manager hands it (None: fair_share_half_life_h 0, or no VC orders by fair share)
        h = cluster.fair_share_half_life_h
        self.use = DecayedUse(h * 3600) if h > 0 and any(v.fair_share for v in cluster.vcs.values()) else None

    # -- events ----------------------------------------------------------------------------------

    def _push(self, t: float, kind: str, job_id: int, attempt: int) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, job_id, attempt))

    def run(self, progress: Callable[[int], None] | None = None) -> dict:
        tick = self.cluster.tick_s
        submit_i = 0
        n = len(self.trace)
        done_before = 0
        while True:
            nxt = math.inf
            if submit_i < n:
                nxt = self.trace[submit_i].submit_s
            while self.events and self._stale(self.events[0]):
                heapq.heappop(self.events)
            if self.events:
                nxt = min(nxt, self.events[0][0])
            if nxt == math.inf:
                break
            now = math.ceil(nxt / tick - 1e-9) * tick
            # Events up to the pass, in time order, at their own instants.
            while self.events and self.events[0][0] <= now:
                t, _, kind, job_id, attempt = heapq.heappop(self.events)
                if not self._stale((t, 0, kind, job_id, attempt)):
                    self._event(t, kind, job_id)
            while submit_i < n and self.trace[submit_i].submit_s <= now:
                sj = self.jobs[self.trace[submit_i].id]
                sj.state = "queued"
                self.pending[sj.id] = sj
                submit_i += 1
            for _ in range(MAX_ROUNDS_PER_TICK):
                if not self._pass(now):
                    break
            if progress is not None and self.completed != done_before:
                progress(self.completed - done_before)
                done_before = self.completed
        return self.result()

    def _stale(self, ev: tuple) -> bool:
        _, _, kind, job_id, attempt = ev
        sj = self.jobs[job_id]
        if kind == "room":  # a waiting job's max_reclaim_delay_s runs out: due while it still waits
            return sj.attempt_no != attempt or sj.state != "queued"
        return sj.attempt_no != attempt or sj.state != "running"

    def _event(self, t: float, kind: str, job_id: int) -> None:
        sj = self.jobs[job_id]
        self.last_event_s = max(self.last_event_s, t)
        if kind == "end":
            self._end(sj, t, "finished", "finished")
        elif kind in ("wake", "room"):  # a preemption budget or a reclaim delay ran out: only a pass is due
            return
        elif kind == "stopped":  # a grace period ran out
            reason = sj.stop_reason or "preempted"
            if reason == "wall_time":
                self._end(sj, t, "killed", "wall_time")
            else:
                self._requeue(sj, t)

    # -- one pass --------------------------------------------------------------------------------

    def _snapshot(self, now: float) -> Snapshot:
        jobs = [sj.job for sj in self.pending.values()] + [sj.job for sj in self.running.values()]
        c = self.cluster
        usage = self.use.at_time(now) if self.use is not None else {}
        return Snapshot(c.skus, c.nodes, c.vcs, tuple(jobs), reservation_depth=c.reservation_depth,
                        fair_share_usage=usage)

    def _hold(self, sj: SimJob, placements: list[Placement] | tuple[Placement, ...], sign: int, t: float) -> None:
        """Tell the fair-share use that ``sj`` holds (``sign`` 1) or gave back (-1) ``placements``' GPUs."""
        if self.use is not None:
            self.use.hold((sj.spec.vc, sj.spec.user), sign * sum(len(p.gpu_indices) for p in placements), t)

    def _pass(self, now: float) -> bool:
        """One pass; True when it stopped something at once (so another pass at ``now`` may start
        the job the room was made for)."""
        if not self.pending and not any(self._may_grow(sj) for sj in self.running.values()):
            if not self._deadline_due(now):
                return False
        snap = self._snapshot(now)
        d = decide(snap, now)
        self.passes += 1
        if self.on_pass is not None:
            self.on_pass(snap, d, now)
        if self.forecast_every_s is not None and now >= self.next_forecast_s:
            self._forecast(snap, d, now)
        immediate = False
        for stop in d.stops:
            sj = self.running[stop.job_id]
            if stop.reason is StopReason.SCALE_DOWN and stop.placements:
                self.scale_downs += 1
                self._scale_down(sj, now, stop.placements)
                immediate = True
                continue
            reason = stop.reason.value
            if stop.reason is StopReason.PREEMPTED:
                self.preemptions += 1
            if self.cluster.preempt_grace_s > 0:
                sj.stop_reason = reason
                sj.stopping_until = now + self.cluster.preempt_grace_s
                sj.job = replace(sj.job, stopping=True)
                self._push(sj.stopping_until, "stopped", sj.id, sj.attempt_no)
            elif reason == "wall_time":
                self._end(sj, now, "killed", "wall_time")
                immediate = True
            else:
                self._requeue(sj, now)
                immediate = True
        for start in d.starts:
            if start.scale_up:
                self._scale_up(self.running[start.job_id], now, start.placements)
            else:
                self._start(self.pending.pop(start.job_id), now, start.placements)
        started = {s.job_id for s in d.starts}
        for w in d.waits:
            if w.job_id not in started:
                sj = self.jobs[w.job_id]
                sj.wait_reasons[w.reason.value] += 1
                self._room_wait(sj, w.reason in ROOM_REASONS, now)
                reserved = w.estimated_start is not None  # as the job manager reads jobs.estimated_start
                if sj.job.reserved is not reserved:
                    sj.job = replace(sj.job, reserved=reserved)
                if reserved:
                    if sj.first_estimate_s is None and sj.start_s is None:
                        sj.first_estimate_s = w.estimated_start
                    sj.last_estimate_s = w.estimated_start
        return immediate and bool(self.pending)

    def _forecast(self, snap: Snapshot, d: Decisions, now: float) -> None:
        """The forecast manager's forecast from this pass's snapshot; each job keeps its first one."""
        assert self.forecast_every_s is not None
        self.next_forecast_s = now + self.forecast_every_s
        self.forecasts += 1
        started = {s.job_id for s in d.starts}
        for job_id, at in forecast(snap, now, runtime=self.runtimes).starts.items():
            sj = self.jobs[job_id]
            if job_id not in started and sj.forecast_made_s is None and sj.start_s is None:
                sj.forecast_made_s, sj.forecast_start_s = now, at

    def _room_wait(self, sj: SimJob, for_room: bool, now: float) -> None:
        """Keep ``Job.room_wait_since`` as the job manager reads it from reason events: set at the
        first pass of an unbroken run of waits for room, cleared by any other wait. Where the job's
        VC has a ``max_reclaim_delay_s``, a pass is due when that runs out."""
        since = sj.job.room_wait_since
        if for_room and since is None:
            sj.job = replace(sj.job, room_wait_since=now)
            vc = self.cluster.vcs.get(sj.spec.vc)
            if vc is not None and vc.max_reclaim_delay_s is not None and not sj.spec.preemptible:
                self._push(now + vc.max_reclaim_delay_s, "room", sj.id, sj.attempt_no)
        elif not for_room and since is not None:
            sj.job = replace(sj.job, room_wait_since=None)

    def _may_grow(self, sj: SimJob) -> bool:
        s = sj.spec
        return s.type is JobType.INFERENCE and len(sj.placements) < s.max_replicas and sj.stopping_until is None

    def _deadline_due(self, now: float) -> bool:
        for sj in self.running.values():
            limit = effective_limit_s(sj.job, self.cluster.vcs.get(sj.spec.vc))
            if limit is not None and sj.stopping_until is None and now - (sj.started_at or 0) >= limit:
                return True
        return False

    # -- applying decisions ---------------------------------------------------------------------

    def _pending_job(self, sj: SimJob) -> Job:
        # the preemption budget reads how often the job was preempted
        return replace(pending_job(sj.spec), preemptions=sum(1 for a in sj.attempts if a["reason"] == "preempted"))

    def _start(self, sj: SimJob, now: float, placements: tuple[Placement, ...]) -> None:
        sj.state = "running"
        sj.attempt_no += 1
        sj.started_at = now
        sj.stopping_until = None
        sj.stop_reason = None
        if sj.start_s is None:
            sj.start_s = now
        sj.placements = list(placements)
        self._hold(sj, placements, 1, now)
        sj.job = replace(sj.job, running=True, started_at=now, placements=tuple(placements), stopping=False,
                         reserved=False)
        vc = self.cluster.vcs.get(sj.spec.vc)
        if sj.spec.preemptible and vc is not None and vc.min_runtime_s > 0:
            self._push(now + vc.min_runtime_s, "wake", sj.id, sj.attempt_no)  # reclaim may take it from then
        sj.attempts.append(
            {
                "start_s": now,
                "end_s": None,
                "nodes": _nodes_of(placements),
                "gpus": _gpus_of(placements),
                "reason": None,
            }
        )
        if sj.spec.type is JobType.INFERENCE:
            core = max(1, sj.spec.min_replicas)
            for i, p in enumerate(placements):
                sj.replicas.append(_replica(p, now, core=i < core and not sj.spec.preemptible))
        self.running[sj.id] = sj
        self._push(now + sj.spec.duration_s, "end", sj.id, sj.attempt_no)
        limit = effective_limit_s(sj.job, self.cluster.vcs.get(sj.spec.vc))
        if limit is not None and limit < sj.spec.duration_s:
            # Wake the loop for the pass that kills it (the core decides; this only schedules a pass).
            self._push(now + limit, "deadline", sj.id, sj.attempt_no)

    def _scale_up(self, sj: SimJob, now: float, placements: tuple[Placement, ...]) -> None:
        sj.placements.extend(placements)
        self._hold(sj, placements, 1, now)
        sj.job = replace(sj.job, placements=tuple(sj.placements))
        for p in placements:
            sj.replicas.append(_replica(p, now, core=False))

    def _scale_down(self, sj: SimJob, now: float, placements: tuple[Placement, ...]) -> None:
        self._hold(sj, placements, -1, now)
        for p in placements:
            sj.placements.remove(p)
            for r in sj.replicas:
                if r["end_s"] is None and r["node"] == p.node and r["gpus"] == list(p.gpu_indices) and not r["core"]:
                    r["end_s"], r["reason"] = now, "scale_down"
                    break
        sj.job = replace(sj.job, placements=tuple(sj.placements))

    def _close(self, sj: SimJob, t: float, reason: str) -> None:
        att = sj.attempts[-1]
        att["end_s"], att["reason"] = t, reason
        for r in sj.replicas:
            if r["end_s"] is None:
                r["end_s"], r["reason"] = t, reason
        del self.running[sj.id]
        self._hold(sj, sj.placements, -1, t)
        sj.placements = []
        sj.started_at = None
        sj.stopping_until = None
        self.last_event_s = max(self.last_event_s, t)

    def _end(self, sj: SimJob, t: float, state: str, reason: str) -> None:
        if state == "finished" and sj.started_at is not None and self.runtimes is not None:
            self.runtimes.add(sj.spec.user, t - sj.started_at)
        self._close(sj, t, reason)
        sj.state = state
        sj.end_s = t
        self.completed += 1
        sj.attempt_no += 1  # invalidates its pending events

    def _requeue(self, sj: SimJob, t: float) -> None:
        self._close(sj, t, "preempted")
        sj.state = "queued"
        sj.attempt_no += 1
        sj.job = self._pending_job(sj)
        self.pending[sj.id] = sj

    # -- result ----------------------------------------------------------------------------------

    def result(self) -> dict:
        return build_result(self)


def pending_job(s: TraceJob) -> Job:
    """The core's view of a trace job waiting in the queue."""
    return Job(
        id=s.id,
        vc=s.vc,
        user=s.user,
        type=s.type,
        sku=s.sku,
        gpus=s.gpus,
        cpu=0.0,
        memory_bytes=0,
        queue_time=s.submit_s,  # kept across preemptions: a requeued job goes back to the head
        priority=s.priority,
        preemptible=s.preemptible,
        nodes=s.nodes,
        ib_domain_any=False,
        max_time_s=s.max_time_s,
        min_replicas=s.min_replicas,
        max_replicas=s.max_replicas,
    )


def _nodes_of(placements) -> list[str]:
    out: list[str] = []
    for p in placements:
        if p.node not in out:
            out.append(p.node)
    return out


def _gpus_of(placements) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for p in placements:
        out.setdefault(p.node, []).extend(p.gpu_indices)
    return {k: sorted(v) for k, v in out.items()}


def _replica(p: Placement, now: float, core: bool) -> dict:
    return {"start_s": now, "end_s": None, "node": p.node, "gpus": list(p.gpu_indices), "core": core, "reason": None}


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    k = max(0, math.ceil(q * len(values)) - 1)
    return values[k]


def _gpu_seconds(sj: SimJob) -> float:
    if sj.spec.type is JobType.INFERENCE:
        return sum(len(r["gpus"]) * (r["end_s"] - r["start_s"]) for r in sj.replicas if r["end_s"] is not None)
    total = 0.0
    for a in sj.attempts:
        if a["end_s"] is not None:
            total += sum(len(v) for v in a["gpus"].values()) * (a["end_s"] - a["start_s"])
    return total


BIG_JOB_GPUS = 16


def _total_gpus(row: dict) -> int:
    if row["type"] == "distributed":
        return int(row["gpus"]) * max(1, int(row["nodes"]))
    if row["type"] == "inference":
        return int(row["gpus"]) * max(1, int(row.get("min_replicas") or 1))
    return int(row["gpus"])


def build_result(sim: Simulation) -> dict[str, Any]:
    c = sim.cluster
    jobs_out = []
    waits: list[float] = []
    jcts: list[float] = []
    by_vc: dict[str, dict[str, Any]] = {
        name: {"jobs": 0, "started": 0, "finished": 0, "killed": 0, "waits": [], "gpu_seconds": 0.0, "preemptions": 0}
        for name in c.vcs
    }
    makespan = 0.0
    big_flags: list[bool] = []
    guaranteed_flags: list[bool] = []  # non-preemptible: the VC guarantee covers it
    for sj in sorted(sim.jobs.values(), key=lambda j: j.id):
        s = sj.spec
        limit = effective_limit_s(sj.job, c.vcs.get(s.vc))
        row: dict[str, Any] = {
            "id": s.trace_id,
            "vc": s.vc,
            "user": s.user,
            "type": s.type.value,
            "sku": s.sku,
            "gpus": s.gpus,
            "nodes": s.nodes,
            "priority": s.priority,
            "preemptible": s.preemptible,
            "duration_s": s.duration_s,
            "max_time_s": s.max_time_s,
            "effective_max_time_s": limit,
            "submit_s": s.submit_s,
            "start_s": sj.start_s,
            "end_s": sj.end_s,
            "state": sj.state if sj.state != "submitted" else "queued",
            "attempts": sj.attempts,
            "wait_reasons": dict(sorted(sj.wait_reasons.items())),
            # backfill: the first estimated start given while it waited, and the last one
            "estimated_start_s": sj.first_estimate_s,
            "last_estimated_start_s": sj.last_estimate_s,
        }
        if sim.forecast_every_s is not None:  # the first forecast that reached it while it waited
            row["forecast_made_s"], row["forecast_start_s"] = sj.forecast_made_s, sj.forecast_start_s
        if s.type is JobType.INFERENCE:
            row["min_replicas"], row["max_replicas"] = s.min_replicas, s.max_replicas
            row["replicas"] = sj.replicas
        jobs_out.append(row)
        v = by_vc[s.vc]
        v["jobs"] += 1
        v["preemptions"] += sum(1 for a in sj.attempts if a["reason"] == "preempted")
        v["gpu_seconds"] += _gpu_seconds(sj)
        if sj.start_s is not None:
            v["started"] += 1
            waits.append(sj.start_s - s.submit_s)
            big_flags.append(_total_gpus(row) >= BIG_JOB_GPUS)
            guaranteed_flags.append(not s.preemptible)
            v["waits"].append(sj.start_s - s.submit_s)
        if sj.end_s is not None:
            jcts.append(sj.end_s - s.submit_s)
            makespan = max(makespan, sj.end_s)
            v["finished" if sj.state == "finished" else "killed"] += 1
    total_gpus = sum(n.gpus for n in c.nodes)
    gpu_seconds = sum(v["gpu_seconds"] for v in by_vc.values())
    for v in by_vc.values():
        w = v.pop("waits")
        v["avg_wait_s"] = sum(w) / len(w) if w else 0.0
        v["p95_wait_s"] = _percentile(w, 0.95)
        v["gpu_hours"] = round(v.pop("gpu_seconds") / 3600, 3)
    big = [w for w, g in zip(waits, big_flags) if g]
    big_guaranteed = [w for w, g, np in zip(waits, big_flags, guaranteed_flags) if g and np]
    summary = {
        "makespan_s": makespan,
        "avg_wait_s": sum(waits) / len(waits) if waits else 0.0,
        "p50_wait_s": _percentile(waits, 0.50),
        "p95_wait_s": _percentile(waits, 0.95),
        "max_wait_s": max(waits) if waits else 0.0,
        # jobs asking >= BIG_JOB_GPUS GPUs in all: the ones RF starves
        "big_jobs": sum(1 for j in jobs_out if _total_gpus(j) >= BIG_JOB_GPUS),
        "big_job_avg_wait_s": sum(big) / len(big) if big else 0.0,
        "big_job_max_wait_s": max(big) if big else 0.0,
        # the same for non-preemptible big jobs only (preemptible ones live on idle capacity)
        "big_job_max_wait_guaranteed_s": max(big_guaranteed) if big_guaranteed else 0.0,
        "avg_jct_s": sum(jcts) / len(jcts) if jcts else 0.0,
        "gpu_utilization": gpu_seconds / (total_gpus * makespan) if total_gpus and makespan else 0.0,
        "preemptions": sim.preemptions,
        "scale_downs": sim.scale_downs,
        "jobs": len(jobs_out),
        "finished": sum(1 for j in jobs_out if j["state"] == "finished"),
        "killed": sum(1 for j in jobs_out if j["state"] == "killed"),
        "never_finished": sum(1 for j in jobs_out if j["state"] not in ("finished", "killed")),
        "passes": sim.passes,
        # backfill: jobs that were given an estimated start, and how many started by their first one
        "estimated_jobs": sum(1 for j in jobs_out if j["estimated_start_s"] is not None),
        "started_by_estimate": sum(
            1 for j in jobs_out
            if j["estimated_start_s"] is not None and j["start_s"] is not None and j["start_s"] <= j["estimated_start_s"]
        ),
        "by_vc": by_vc,
    }
    if sim.forecast_every_s is not None:
        summary["forecast"] = forecast_accuracy(jobs_out, sim.forecast_every_s, sim.forecasts,
                                                sim.runtimes.keep if sim.runtimes is not None else 0)
    cluster = {
        "tick_s": c.tick_s,
        "preempt_grace_s": c.preempt_grace_s,
        "fair_share_half_life_h": c.fair_share_half_life_h,
        "skus": {k: {"gpus": v.gpus, "cpu": v.cpu, "memory_bytes": v.memory_bytes} for k, v in c.skus.items()},
        "nodes": [
            {"name": n.name, "sku": n.sku, "gpus": n.gpus, "ib_domain": n.ib_domain, "vc": n.vc, "schedulable": n.schedulable}
            for n in c.nodes
        ],
        "vcs": {
            k: {
                "quota": dict(v.quota),
                "policy": v.policy.value,
                "max_job_time_s": v.max_job_time_s,
                "max_interactive_gpus": v.max_interactive_gpus,
                "user_gpu_quota": v.user_gpu_quota,
                "fair_share": v.fair_share,
                "fair_share_max_wait_s": v.fair_share_max_wait_s,
                "limit_weight": v.limit_weight,
                # the CPU-only quota the core enforces (override, quota.cpu, else derived)
                "cpu_quota": effective_cpu_memory_quota(v, c.skus)[0],
                "memory_quota_bytes": effective_cpu_memory_quota(v, c.skus)[1],
            }
            for k, v in c.vcs.items()
        },
    }
    return {"jobs": jobs_out, "summary": summary, "cluster": cluster}


def forecast_accuracy(jobs_out: list[dict[str, Any]], every_s: float, forecasts: int, history_runs: int) -> dict[str, Any]:
    """How close each job's first forecast came to its start in the replay: absolute error in
    hours, and relative to how far ahead the forecast was made (0.5: off by half the lead time)."""
    abs_h: list[float] = []
    rel: list[float] = []
    early = 0
    for j in jobs_out:
        made, at, start = j.get("forecast_made_s"), j.get("forecast_start_s"), j["start_s"]
        if made is None or at is None or start is None or start <= made:
            continue
        abs_h.append(abs(at - start) / 3600)
        rel.append(abs(at - start) / (start - made))
        early += at < start
    return {
        "every_s": every_s,
        "forecasts": forecasts,
        "history_runs": history_runs,  # run times predicted from each user's last N runs (0: limits)
        "jobs": len(rel),  # jobs a forecast reached before they started
        "abs_error_h_p50": _percentile(abs_h, 0.50),
        "abs_error_h_p90": _percentile(abs_h, 0.90),
        "rel_error_p50": _percentile(rel, 0.50),
        "rel_error_p90": _percentile(rel, 0.90),
        "early_share": early / len(rel) if rel else 0.0,  # forecast before the real start
    }
