"""The insight rules: a running job's utilisation history in, findings out. Pure: no database, no
clock (``now`` is an argument), no I/O; the insight manager (managers/insight.py) reads the history
and writes what these return (docs/monitoring.md#insight).

The history is the accounting's minute points (one per attempt, node and minute: the mean of the
agent's samples in that minute). A minute counts as *idle* when every GPU of the job with a reading
is at or under ``idle_ratio``; a minute without GPU readings, or a gap (no point for longer than
two report intervals: the agent was silent), ends an idle run: an idle run is only what the history
shows without a gap. Agents that report less often than once a minute leave minutes without a
point; those are not gaps (``max_step``), and a window needs fewer points (``_window``). On top of the
history, the nodes' last reports say what the job's GPUs do *now*: a job is idle only while those
say so too, and nothing is decided on data older than two report intervals (``is_fresh``).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dlts.insight.settings import InsightSettings

MINUTE = dt.timedelta(minutes=1)
GpuKey = tuple[str, int]  # (node, GPU index)
IDLE_ACTIONS = ("pause", "kill", "none")
JOB_TYPES = ("batch", "interactive", "distributed", "inference")

# finding codes, in the order the job page lists them
GPUS_IDLE = "gpus_idle"
GPUS_PARTLY_BUSY = "gpus_partly_busy"
LOW_UTILISATION = "low_utilisation"
GPU_MEMORY_FULL = "gpu_memory_full"
CPU_BOUND = "cpu_bound"
PREEMPTION_RISK = "preemption_risk"
CODES = (GPUS_IDLE, GPUS_PARTLY_BUSY, LOW_UTILISATION, GPU_MEMORY_FULL, CPU_BOUND, PREEMPTION_RISK)


@dataclass(frozen=True)
class Minute:
    at: dt.datetime  # the minute's start (UTC)
    # (node, index) -> (mean utilisation ratio or None, mean memory used bytes or None)
    gpus: Mapping[GpuKey, tuple[float | None, int | None]] = field(default_factory=dict)
    cpu_cores: float | None = None  # mean cores busy, all the job's nodes together


@dataclass(frozen=True)
class JobView:
    """What the rules know of one running job."""

    job_id: int
    gpus: int  # GPUs allocated, all nodes together
    cpu: float  # cores allotted, all nodes together
    started_at: dt.datetime  # the current attempt's start
    minutes: Sequence[Minute] = ()  # oldest first
    preemptible: bool = False
    sku: str | None = None
    memory_total: Mapping[GpuKey, int] = field(default_factory=dict)  # from the nodes' last reports
    latest: Mapping[GpuKey, float | None] = field(default_factory=dict)  # the job's GPUs in the nodes' last reports
    reported_at: dt.datetime | None = None  # the oldest last report of its nodes that named the job; None: one did not


@dataclass(frozen=True)
class Pressure:
    """Non-preemptible GPUs of one SKU waiting within their VCs' quota, and the SKU's free GPUs."""

    sku: str
    waiting_gpus: int
    free_gpus: int


@dataclass(frozen=True)
class Finding:
    code: str
    key: str  # the same key: the same finding (no new event); its message's numbers may move
    message: str
    since: dt.datetime


@dataclass(frozen=True)
class IdlePolicy:
    """A VC's idle-job policy (``vcs.idle_policy``)."""

    warn_min: float
    action_min: float
    action: str = "none"  # pause | kill | none
    exempt_types: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, value: Mapping[str, Any] | None) -> IdlePolicy | None:
        if not value:
            return None
        return cls(float(value["idle_warn_min"]), float(value["idle_action_min"]), str(value.get("idle_action", "none")),
                   tuple(value.get("exempt_types") or ()))


def _minutes(value: float) -> str:
    return f"{value:g} min" if value < 10 else f"{round(value)} min"


def _pct(ratio: float) -> str:
    return f"{ratio * 100:.0f}%"


def _gpu_names(keys: Sequence[GpuKey]) -> str:
    return ", ".join(f"{node} GPU {index}" for node, index in sorted(keys))


def is_fresh(job: JobView, now: dt.datetime, report_interval_s: float) -> bool:
    """Every node of the job reported it within two report intervals, and the history has a point
    that recent: only then is anything decided about the job."""
    limit = dt.timedelta(seconds=2 * report_interval_s)
    if job.reported_at is None or now - job.reported_at > limit or not job.minutes:
        return False
    return job.minutes[-1].at + MINUTE > now - limit


def max_step(s: InsightSettings) -> dt.timedelta:
    """The longest distance between two points of an unbroken history: the minutes two report
    intervals can span (agents reporting every 15 s: the next minute only; every 60 s: one minute
    may be without a point; every 120 s: three)."""
    return MINUTE * max(1, math.ceil(2 * s.report_interval_s / 60))


def _readings(minute: Minute) -> dict[GpuKey, float]:
    return {k: r for k, (r, _m) in minute.gpus.items() if r is not None}


def idle_since(job: JobView, s: InsightSettings) -> dt.datetime | None:
    """When the job's current idle run began (no later than its start), or None when it is not idle
    now: the last minutes of the history are idle without a gap and the nodes' last reports show
    every GPU of the job idle too."""
    latest = [r for r in job.latest.values() if r is not None]
    if not latest or any(r > s.idle_ratio for r in latest):
        return None
    since: dt.datetime | None = None
    step = max_step(s)
    for minute in reversed(job.minutes):
        readings = _readings(minute)
        if not readings or any(r > s.idle_ratio for r in readings.values()):
            break
        if since is not None and since - minute.at > step:
            break  # a gap: the run ends there
        since = minute.at
    if since is None:
        return None
    return max(since, job.started_at)


def _window(job: JobView, now: dt.datetime, minutes: float, s: InsightSettings) -> list[Minute] | None:
    """The minutes of the last ``minutes`` minutes, or None when the job has not run that long or
    the history holds less than half the points its agents' reports give such a window (one a
    minute, or one a report interval when that is longer)."""
    start = now - dt.timedelta(minutes=minutes)
    if job.started_at > start:
        return None
    points = [m for m in job.minutes if m.at + MINUTE > start]
    if len(points) < max(1.0, minutes / 2 * min(1.0, 60.0 / s.report_interval_s)):
        return None
    return points


def _gpu_means(points: Sequence[Minute]) -> dict[GpuKey, float]:
    sums: dict[GpuKey, list[float]] = {}
    for m in points:
        for k, r in _readings(m).items():
            sums.setdefault(k, []).append(r)
    return {k: sum(v) / len(v) for k, v in sums.items()}


def evaluate(job: JobView, now: dt.datetime, s: InsightSettings, pressure: Pressure | None = None,
             idle_min: float | None = None) -> list[Finding]:
    """The job's findings now, in ``CODES`` order. ``idle_min`` overrides ``s.idle_min`` (the VC's
    idle policy warns earlier). Call it only for a job whose data ``is_fresh``."""
    found: list[Finding] = []
    idle_after = s.idle_min if idle_min is None else min(idle_min, s.idle_min)
    since = idle_since(job, s)
    idle = since is not None and now - since >= dt.timedelta(minutes=idle_after)
    if idle:
        assert since is not None
        gpus = len({k for m in job.minutes for k in _readings(m)}) or job.gpus
        found.append(Finding(GPUS_IDLE, GPUS_IDLE, (
            f"All {gpus} GPUs of this job have been idle (at most {_pct(s.idle_ratio)} busy) since {since:%H:%M} UTC, "
            f"{_minutes((now - since).total_seconds() / 60)}. If it waits for input or has finished its work, kill it so "
            "that others can use the GPUs; pause an interactive job while you are away."), since))
    partly = False
    points = _window(job, now, s.partial_min, s)
    if not idle and points:
        means = _gpu_means(points)
        busy = sorted(k for k, r in means.items() if r >= s.busy_ratio)
        idle_gpus = sorted(k for k, r in means.items() if r <= s.idle_ratio)
        if busy and idle_gpus:
            partly = True
            total = len(means)
            found.append(Finding(GPUS_PARTLY_BUSY, f"{GPUS_PARTLY_BUSY}:{len(busy)}/{total}", (
                f"Only {len(busy)} of this job's {total} GPUs were busy over the last {_minutes(s.partial_min)}; idle: "
                f"{_gpu_names(idle_gpus)}. If the program uses fewer GPUs, ask for gpus: {len(busy)} next time; for "
                f"data-parallel training check that every process took its own GPU (e.g. torchrun "
                f"--nproc_per_node={total})."), max(job.started_at, now - dt.timedelta(minutes=s.partial_min))))
    points = _window(job, now, s.low_min, s)
    if not idle and not partly and points:
        means = _gpu_means(points)
        if means:
            mean = sum(means.values()) / len(means)
            if mean < s.low_ratio:
                found.append(Finding(LOW_UTILISATION, LOW_UTILISATION, (
                    f"This job's GPUs averaged {_pct(mean)} utilisation over the last {_minutes(s.low_min)} (under "
                    f"{_pct(s.low_ratio)}). Profile a few steps: a slow input pipeline, small batches or frequent "
                    "synchronisation keep GPUs waiting; or run it on fewer GPUs."),
                    max(job.started_at, now - dt.timedelta(minutes=s.low_min))))
    points = _window(job, now, s.memory_min, s)
    if points:
        full: list[GpuKey] = []
        ratios: list[float] = []
        for key, total in job.memory_total.items():
            if not total:
                continue
            memory = [m.gpus.get(key, (None, None))[1] for m in points]
            if memory and all(u is not None and u >= s.memory_ratio * total for u in memory):
                full.append(key)
                ratios.append(min(u for u in memory if u is not None) / total)
        if full:
            found.append(Finding(GPU_MEMORY_FULL, f"{GPU_MEMORY_FULL}:{_gpu_names(full)}"[:128], (
                f"GPU memory has been at least {_pct(min(ratios))} full for {_minutes(s.memory_min)} on "
                f"{_gpu_names(full)}: the job is close to running out of GPU memory. Lower the batch size, use mixed "
                "precision or activation checkpointing before it fails."),
                max(job.started_at, now - dt.timedelta(minutes=s.memory_min))))
    points = _window(job, now, s.cpu_min, s)
    if points and job.cpu > 0:
        cores = [m.cpu_cores for m in points if m.cpu_cores is not None]
        means = _gpu_means(points)
        if cores and means:
            busy_cores = sum(cores) / len(cores)
            gpu = sum(means.values()) / len(means)
            if busy_cores >= s.cpu_ratio * job.cpu and gpu < s.starved_ratio:
                found.append(Finding(CPU_BOUND, CPU_BOUND, (
                    f"This job's processes use {busy_cores:.1f} of its {job.cpu:g} cores while its GPUs average {_pct(gpu)} "
                    f"over the last {_minutes(s.cpu_min)}: the input pipeline is CPU-bound and starves the GPUs. Ask for "
                    "more cpu, preprocess or cache the data before training, or move augmentation onto the GPU."),
                    max(job.started_at, now - dt.timedelta(minutes=s.cpu_min))))
    if s.preemption_risk and job.preemptible and pressure is not None and pressure.waiting_gpus > pressure.free_gpus:
        found.append(Finding(PREEMPTION_RISK, PREEMPTION_RISK, (
            f"This job is preemptible, and {pressure.waiting_gpus} non-preemptible {pressure.sku} GPUs are queued within "
            f"their VCs' quota while {pressure.free_gpus} are free: the scheduler stops preemptible jobs to give VCs their "
            "guaranteed share back. Checkpoint now and often; submit it non-preemptible, within your VC's quota, if it "
            "must not be stopped."), now))
    return found


def idle_step(policy: IdlePolicy | None, since: dt.datetime | None, warned_at: dt.datetime | None,
              acted_at: dt.datetime | None, now: dt.datetime, *, fresh: bool, exempt: bool) -> str | None:
    """What the VC's idle policy does now: ``warn`` (the owner is told), ``act`` (the job is paused or
    killed), or None. Never on stale data, never for an exempt job, never twice."""
    if policy is None or not fresh or exempt or since is None or acted_at is not None:
        return None
    if warned_at is None:
        return "warn" if now - since >= dt.timedelta(minutes=policy.warn_min) else None
    if policy.action != "none" and now - warned_at >= dt.timedelta(minutes=policy.action_min) and since <= warned_at:
        return "act"
    return None


def is_exempt(policy: IdlePolicy | None, job_type: str, job_exempt: bool) -> bool:
    return job_exempt or (policy is not None and job_type in policy.exempt_types)
