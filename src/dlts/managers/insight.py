"""The insight manager: insight messages on running GPU jobs and the VCs' idle-job policy
(docs/monitoring.md#insight).

Every ``insight.interval_s`` (``dlts managers``, the demo in a thread) a pass reads the running GPU
jobs, their utilisation minutes (the accounting's history, services/accounting.py) and their nodes'
last reports, hands them to the pure rules (dlts.insight.rules) and keeps what they find:

- a finding that appears (or changes its key) writes a ``job_insights`` row and an ``insight`` job
  event with its message; while it holds, the row's message is kept current without new events;
  when it goes away (or the job stops running) the row goes and an ``insight`` event says so
  (reason ``<code>_cleared``);
- the VC's idle-job policy: after ``idle_warn_min`` of idle GPUs the owner is told (an
  ``idle_warning`` event and the ``idle_job_warning`` e-mail); after ``idle_action_min`` more, still
  idle, the job is paused or killed through the same service functions the API uses (reason
  ``idle_gpus``), with an ``idle_action`` event and the ``idle_job_stopped`` e-mail to the owner and
  the VC's admins.

Nothing is decided for a job whose data is older than two ``insight.report_interval_s`` (its
findings stay as they were); a job without reports has no findings, so it is never acted on. Each
job's changes are one transaction, so a crash leaves every job either before or after its step.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from dlts.config import Settings
from dlts.errors import DltsError
from dlts.insight import rules
from dlts.models import EndReason, EventKind, Job, JobAttempt, JobInsight, Node, UtilisationPoint, utcnow
from dlts.repositories import insight as repo
from dlts.repositories import jobs as job_repo
from dlts.services import jobs as job_service
from dlts.services import notify, transaction
from dlts.services.accounting import floor_minute
from dlts.services.auth import Principal
from dlts.services.nodes import reported_gpus

log = logging.getLogger(__name__)

ACTOR = "insight"
# the manager acts as the cluster (pause/kill through services.jobs, which checks who may)
SYSTEM = Principal(user_id=0, name=ACTOR, is_cluster_admin=True)
IDLE_REASON = EndReason.IDLE_GPUS
LOOKBACK_MARGIN_MIN = 5.0


@dataclass
class InsightRun:
    jobs: int = 0
    stale: int = 0  # running GPU jobs whose data was too old to decide anything
    raised: int = 0
    cleared: int = 0
    warned: int = 0
    acted: int = 0


def job_view(job: Job, attempt: JobAttempt, points: Sequence[UtilisationPoint], nodes: Mapping[str, Node]) -> rules.JobView:
    """What the rules get of one job: its minutes (nodes summed), its GPUs in its nodes' last reports."""
    placements = [p for p in attempt.placements or [] if p.get("node")]
    node_names = sorted({p["node"] for p in placements})
    mine = {(p["node"], int(i)) for p in placements for i in p.get("gpu_indices") or []}
    by_minute: dict[dt.datetime, dict] = {}
    for p in points:
        entry = by_minute.setdefault(p.minute, {"gpus": {}, "cpu": None})
        for index, (_n, ratio, memory) in (p.gpus or {}).items():
            entry["gpus"][(p.node, int(index))] = (ratio, int(memory) if memory is not None else None)
        if p.cpu_cores is not None:
            entry["cpu"] = (entry["cpu"] or 0.0) + p.cpu_cores
    minutes = [rules.Minute(at, e["gpus"], e["cpu"]) for at, e in sorted(by_minute.items())]
    memory_total: dict[rules.GpuKey, int] = {}
    latest: dict[rules.GpuKey, float | None] = {}
    reported: list[dt.datetime | None] = []
    for name in node_names:
        node = nodes.get(name)
        if node is None:
            reported.append(None)
            continue
        metrics = node.metrics or {}
        gpus = reported_gpus(metrics)
        named = str(job.id) in {str(j) for j in metrics.get("job_ids") or () if j is not None} or \
            any(g["job_id"] == job.id for g in gpus)
        reported.append(node.last_heartbeat_at if named else None)
        for g in gpus:
            key = (name, g["index"])
            if g["index"] is None or (g["job_id"] != job.id and key not in mine):
                continue
            latest[key] = g["utilization_ratio"]
            total = g.get("memory_total_bytes")
            if isinstance(total, int) and not isinstance(total, bool) and total > 0:
                memory_total[key] = total
    reported_at = None if not reported or any(r is None for r in reported) else min(r for r in reported if r)
    return rules.JobView(job_id=job.id, gpus=job.gpus * max(job.nodes, 1), cpu=job.cpu * max(job.nodes, 1),
                         started_at=attempt.started_at or job.submitted_at, minutes=minutes, preemptible=job.preemptible, sku=job.sku,
                         memory_total=memory_total, latest=latest, reported_at=reported_at)


class InsightManager:
    def __init__(self, session_factory: Callable[[], Session], settings: Settings, *,
                 clock: Callable[[], dt.datetime] = utcnow):
        self.session_factory = session_factory
        self.settings = settings.insight
        self.clock = clock

    def run_once(self) -> InsightRun:
        now = self.clock()
        s = self.settings
        result = InsightRun()
        with self.session_factory() as session:
            running = repo.running_gpu_jobs(session)
            policies = {vc_id: rules.IdlePolicy.from_json(p) for vc_id, p in repo.vc_policies(session).items()}
            longest = max([s.longest_window_min] + [p.warn_min + p.action_min for p in policies.values() if p])
            lookback_start = floor_minute(now - dt.timedelta(minutes=longest + LOOKBACK_MARGIN_MIN))
            points = repo.points_since(session, [a.id for _, a in running], lookback_start)
            nodes = repo.nodes_named(session, [p["node"] for _, a in running for p in a.placements or [] if p.get("node")])
            existing = repo.current_insights(session)
            pressure = repo.sku_pressure(session) if s.preemption_risk else {}
            current = {job.id: attempt.number for job, attempt in running}
            with transaction.step(session):
                for job_id, rows in existing.items():  # the job stopped running (or runs a new attempt)
                    for row in list(rows.values()):
                        if current.get(job_id) != row.attempt:
                            self._clear(session, row, "the job is no longer running" if job_id not in current
                                        else "the job runs a new attempt", now)
                            rows.pop(row.code)
                            result.cleared += 1
            for job, attempt in running:
                result.jobs += 1
                view = job_view(job, attempt, points.get(attempt.id, ()), nodes)
                if not rules.is_fresh(view, now, s.report_interval_s):
                    result.stale += 1
                    continue
                try:
                    with transaction.step(session):  # one job's findings and action: committed, or all rolled back
                        self._job(session, job, attempt, view, existing.get(job.id, {}), policies.get(job.vc_id),
                                  pressure, now, lookback_start, result)
                except DltsError as exc:  # the job changed under us (killed by its owner): the next pass sees it
                    log.info("insight: job %s not acted on: %s", job.id, exc.message)
        if result.raised or result.cleared or result.warned or result.acted:
            log.info("insight: %d running GPU jobs (%d with stale data); %d findings raised, %d cleared; %d owners "
                     "warned, %d jobs stopped for idle GPUs", result.jobs, result.stale, result.raised, result.cleared,
                     result.warned, result.acted)
        return result

    # -- one job ---------------------------------------------------------------------------------
    def _job(self, session: Session, job: Job, attempt: JobAttempt, view: rules.JobView, rows: dict[str, JobInsight],
             policy: rules.IdlePolicy | None, pressure: Mapping[str, tuple[int, int]], now: dt.datetime,
             lookback_start: dt.datetime, result: InsightRun) -> None:
        s = self.settings
        sku_pressure = pressure.get(job.sku or "")
        found = rules.evaluate(view, now, s, rules.Pressure(job.sku or "", *sku_pressure) if sku_pressure else None,
                               idle_min=policy.warn_min if policy else None)
        by_code = {f.code: f for f in found}
        for code, row in list(rows.items()):
            if code not in by_code:
                self._clear(session, row, None, now)
                rows.pop(code)
                result.cleared += 1
        for f in found:
            existing = rows.get(f.code)
            if existing is None:
                row = JobInsight(job_id=job.id, attempt=attempt.number, code=f.code, key=f.key, message=f.message,
                                 since=f.since, raised_at=now, updated_at=now)
                session.add(row)
                rows[f.code] = row
                job_repo.add_event(session, job.id, EventKind.INSIGHT, reason=f.code, message=f.message, actor=ACTOR)
                result.raised += 1
                continue
            row = existing
            if f.code == rules.GPUS_IDLE:
                # the history read starts inside the idle run (its first point can be a report
                # interval or two after the start of the read, when agents report less than once a minute)
                if f.since <= lookback_start + rules.max_step(s):
                    row.since = min(row.since, f.since)
                elif f.since != row.since:
                    if f.since > row.since:  # busy between two passes: a new idle run, the policy starts over
                        row.warned_at = None
                    row.since = f.since
            if f.key != row.key:
                row.key = f.key
                job_repo.add_event(session, job.id, EventKind.INSIGHT, reason=f.code, message=f.message, actor=ACTOR)
                result.raised += 1
            row.message, row.updated_at = f.message, now
        idle = rows.get(rules.GPUS_IDLE)
        exempt = rules.is_exempt(policy, job.type, bool((job.spec or {}).get("idle_exempt")))
        step = rules.idle_step(policy, idle.since if idle else None, idle.warned_at if idle else None,
                               idle.acted_at if idle else None, now, fresh=True, exempt=exempt)
        if step is None:
            return
        assert idle is not None and policy is not None
        if step == "warn":
            self._warn(session, job, attempt, idle, policy, now)
            result.warned += 1
            return
        self._act(session, job, attempt, idle, policy, now)  # its step commits it with the job's status change
        result.acted += 1

    def _clear(self, session: Session, row: JobInsight, why: str | None, now: dt.datetime) -> None:
        message = f"Cleared: {why}." if why else {
            rules.GPUS_IDLE: "Cleared: the job's GPUs are busy again.",
            rules.GPUS_PARTLY_BUSY: "Cleared: the job's GPUs are all busy, or all idle.",
            rules.LOW_UTILISATION: "Cleared: the job's GPU utilisation is up again.",
            rules.GPU_MEMORY_FULL: "Cleared: GPU memory is no longer nearly full.",
            rules.CPU_BOUND: "Cleared: the input pipeline no longer starves the GPUs.",
            rules.PREEMPTION_RISK: "Cleared: no non-preemptible work waits for this job's GPUs now.",
        }.get(row.code, "Cleared.")
        job_repo.add_event(session, row.job_id, EventKind.INSIGHT, reason=f"{row.code}_cleared", message=message, actor=ACTOR)
        session.delete(row)

    def _warn(self, session: Session, job: Job, attempt: JobAttempt, idle: JobInsight, policy: rules.IdlePolicy,
              now: dt.datetime) -> None:
        idle.warned_at = now
        minutes = (now - idle.since).total_seconds() / 60
        deadline = now + dt.timedelta(minutes=policy.action_min)
        if policy.action in ("pause", "kill"):
            verb = "paused" if policy.action == "pause" else "killed"
            message = (f"This job's GPUs have been idle for {minutes:.0f} min (since {idle.since:%H:%M} UTC). VC "
                       f"{job.vc.name}'s idle-job policy: it will be {verb} at {deadline:%H:%M} UTC unless its GPUs get busy "
                       "again. Kill it yourself if it has finished its work; a VC admin can exempt it.")
        else:
            message = (f"This job's GPUs have been idle for {minutes:.0f} min (since {idle.since:%H:%M} UTC). VC "
                       f"{job.vc.name} asks you to release idle GPUs: kill the job if it has finished its work, pause it "
                       "while you are away.")
        job_repo.add_event(session, job.id, EventKind.INSIGHT, reason="idle_warning", message=message, actor=ACTOR)
        notify.enqueue(session, template="idle_job_warning", to=notify.user_emails(session, [job.user.name]),
                       context={"job_id": job.id, "job_name": job.name, "vc": job.vc.name, "user": job.user.name,
                                "message": message, "action": policy.action, "since": f"{idle.since:%Y-%m-%d %H:%M}",
                                "deadline": f"{deadline:%Y-%m-%d %H:%M}"},
                       dedup_key=f"idle-warning:{job.id}:{attempt.number}:{idle.since:%Y%m%dT%H%M%S}")
        log.info("insight: job %s idle since %s: owner %s warned (%s)", job.id, idle.since, job.user.name, policy.action)

    def _act(self, session: Session, job: Job, attempt: JobAttempt, idle: JobInsight, policy: rules.IdlePolicy,
             now: dt.datetime) -> None:
        verb = "paused" if policy.action == "pause" else "killed"
        minutes = (now - idle.since).total_seconds() / 60
        message = (f"{verb.capitalize()} by VC {job.vc.name}'s idle-job policy: its GPUs were idle for {minutes:.0f} min "
                   f"(since {idle.since:%H:%M} UTC), and still were {policy.action_min:g} min after the warning.")
        idle.acted_at = now
        job_repo.add_event(session, job.id, EventKind.INSIGHT, reason="idle_action", message=message, actor=ACTOR)
        notify.enqueue(session, template="idle_job_stopped", to=notify.job_notice_emails(session, job),
                       context={"job_id": job.id, "job_name": job.name, "vc": job.vc.name, "user": job.user.name,
                                "message": message, "action": policy.action, "since": f"{idle.since:%Y-%m-%d %H:%M}",
                                "warned_at": f"{idle.warned_at:%Y-%m-%d %H:%M}" if idle.warned_at else ""},
                       dedup_key=f"idle-action:{job.id}:{attempt.number}")
        stop = job_service.pause if policy.action == "pause" else job_service.kill
        stop(session, SYSTEM, job.id, reason=IDLE_REASON, detail=message)  # within the caller's step: raises on refusal
        log.info("insight: job %s %s: GPUs idle since %s", job.id, verb, idle.since)
