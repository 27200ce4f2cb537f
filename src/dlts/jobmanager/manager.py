"""One job manager tick: sync nodes, observe the backend, reconcile, carry out requests, schedule,
apply.

Only this module (and the backends it drives) touches the cluster. Every step is safe to repeat:
status writes are compare-and-set, backend objects are named from (job id, attempt), so a crash
between any two steps is finished by the next tick.

    0 nodes     backend.nodes() -> node rows (capacity, SKU, IB domain, ready)
    1 observe   backend.observe() once: phases and exit codes of every attempt it holds
    2 reconcile attempts that started or ended -> job transitions; orphans removed; a pending
                attempt's reason (image pull, unschedulable, ...) onto its job; an attempt not
                started within start_timeout_s ended with that reason (a retry spent)
    2b logs     every log_sync_s: backend.sync_logs(running attempts) (Kubernetes copies pod logs)
    3 requests  jobs users put in killing/pausing -> backend.terminate(grace)
    3b endpoints running jobs whose endpoints are pending, closing or of an earlier attempt ->
                backend.expose(the job's whole wanted set) -> rows ready/failed/pending, closing rows
                deleted; closing rows of jobs not running deleted (one query when nothing needs work)
    4 decide    snapshot -> scheduler core -> starts, stops, waits
    5 apply     starts -> attempt rows (one commit), then the launches, at most the backend's
                ``launch_parallelism`` at once in a thread pool, their outcomes recorded here (the
                session is not thread-safe); stops -> terminate; waits -> reason + queue position;
                inference scale-up -> new replicas in the attempt row + launch (creates the missing
                ones); scale-down -> replicas marked retiring + backend.remove_replicas
    6 garbage   every GC_INTERVAL_S: backend.collect_garbage(live attempts) removes the objects a
                crash or a restored database left behind

Times of attempts (created, started) come from the manager's clock, never from the backend's
(a process's or container's start time is rounded and may precede the submission).

A refusal about one attempt (``BackendRefused``: its log cannot be read, a deletion or a stop is
forbidden) costs that attempt's step and never the tick: the refusal goes on the job as a
``cluster`` event in words (once per distinct message), the step is tried again next tick, and the
other jobs are observed, stopped and scheduled as usual. Only a cluster that does not answer at all
(``BackendUnavailable``), or whose nodes or pods cannot be listed, skips a tick.

Full volumes (``disk_pressure``): every tick (at most every ``disk_pressure.interval_s``) reads the
room left on the log, run and SQLite volumes; below a hard threshold the pass's starts are held and
the jobs wait with the reason. A launch the backend could not make for want of room
(``VolumeFull``) leaves the job ``scheduling`` with the reason, launched again next tick. A database
that refuses writes (a full disk, read-only: ``db_faults``) skips the tick: one log line when that
starts and one when writes go through again, the ticks between backing off up to
``DB_BACKOFF_MAX_S``.
"""

from __future__ import annotations

import datetime as dt
import logging
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts import db_faults, logstore, metrics
from dlts.backends.base import (
    BackendRefused,
    BackendUnavailable,
    ClusterBackend,
    EndpointSpec,
    EndpointState,
    LaunchSpec,
    Observed,
    RunPhase,
)
from dlts.config import Settings
from dlts.jobmanager.disk_pressure import DiskPressure, Reading, hold_launches, watched_volumes
from dlts.jobmanager.launch_spec import build_launch_spec
from dlts.jobmanager.snapshot import from_epoch, load_snapshot
from dlts.managers.lease import LeaseLost
from dlts.models import (
    ACTIVE,
    EndpointKind,
    EndpointStatus,
    EndReason,
    EventKind,
    Job,
    JobAttempt,
    JobEndpoint,
    JobStatus,
    JobType,
    Node,
    SshKey,
    utcnow,
)
from dlts.models.placements import Replica, placements_to_json, replicas_from_json, replicas_to_json
from dlts.repair.cordon import repair_cordon
from dlts.repositories import jobs as job_repo
from dlts.scheduler import decide, profile_named
from dlts.scheduler.explain import moved_later
from dlts.scheduler.model import Decisions, Placement, Snapshot, Stop, StopReason
from dlts.services.transaction import discard, rowcount, step

log = logging.getLogger(__name__)
S = JobStatus
E = EndpointStatus
ACTOR = "jobmanager"
GC_INTERVAL_S = 60.0  # how often the backend's objects are checked against the database's live attempts
START_TIMEOUT = EndReason.START_TIMEOUT  # reason of an attempt that had not started after start_timeout_s
IDENTITY = "identity"  # reason of the event a backend's launch note becomes (e.g. not run as the owner)
REPAIR_STOPS = (EndReason.NODE_REPAIR, EndReason.NODE_LOST)  # stop_requested by the repair manager: requeue at the head
# the steps a refusal can cost (``JobManager._attempt_step``): the reason of the job's ``cluster`` event
CLEANUP, STOP, SCALE_DOWN = "cleanup", "stop", "scale_down"
STEP_WORDS = {CLEANUP: "the ended attempt's pods are kept until their output is copied and they can be deleted",
              STOP: "the cluster did not stop the attempt's pods yet", SCALE_DOWN: "replicas not removed yet"}
KEPT_PAUSE_REASONS = (EndReason.IDLE_GPUS,)  # a PAUSING job with this reason keeps it (and its detail) once paused
LOG_CUT = "log_cut"  # reason of the cluster event saying how much of an attempt's output a full volume cost
DB_BACKOFF_MAX_S = 10.0  # while the database refuses writes, a tick is tried at most this far apart


def _epoch(moment: dt.datetime) -> float:
    return moment.replace(tzinfo=dt.UTC).timestamp()


def launch_all(backend: ClusterBackend, specs: Sequence[LaunchSpec]) -> list[tuple[object, BaseException | None]]:
    """``backend.launch`` for each spec, at most ``backend.launch_parallelism`` at once (1 when the
    backend does not say); (its result, its exception) per spec, in order."""
    def one(spec: LaunchSpec) -> tuple[object, BaseException | None]:
        try:
            return backend.launch(spec), None
        except Exception as exc:  # noqa: BLE001 - any failure is the caller's to record, in its thread
            return None, exc

    workers = min(max(1, int(getattr(backend, "launch_parallelism", 1) or 1)), len(specs))
    if workers <= 1:
        return [one(spec) for spec in specs]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="launch") as pool:
        return list(pool.map(one, specs))


class JobManager:
    def __init__(self, session_factory: Callable[[], Session], backend: ClusterBackend, settings: Settings,
                 clock: Callable[[], float] = time.time, pressure: DiskPressure | None = None):
        self.session_factory = session_factory
        self.backend = backend
        self.settings = settings
        self.clock = clock
        self.last_decisions: Decisions | None = None
        self._next_gc = 0.0
        self._next_log_sync = 0.0
        self._refusals: dict[tuple[int, int, str], str] = {}  # the refusal last noted per (job, attempt, step)
        self._cutting: set[tuple[int, int]] = set()  # running attempts whose output is being dropped (said once)
        self.pressure = pressure or DiskPressure(watched_volumes(settings, backend), settings.disk_pressure,
                                                 socket.gethostname().split(".")[0] or "localhost")
        self._db_faults = db_faults.FaultLog("job manager", log)
        self._db_backoff_s = 0.0
        self._db_retry_at = float("-inf")

    # -- the tick -------------------------------------------------------------------------------
    def tick(self) -> Decisions:
        if self.clock() < self._db_retry_at:
            return Decisions()  # the database refused the last tick's writes: back off
        metrics.TICKS.inc()
        t0 = time.perf_counter()
        session = self.session_factory()
        try:
            self.pressure.check(self.clock())
            self.sync_nodes(session)
            observed = {(o.job_id, o.attempt): o for o in self.backend.observe()}
            self.reconcile(session, observed)
            self.sync_logs(observed)
            self.carry_out_requests(session, observed)
            self._reconcile_endpoints(session)
            snapshot = load_snapshot(session, self.settings)
            decisions = decide(snapshot, self.clock(), profile_named(self.settings.scheduler_profile))
            held = self.pressure.hold()
            if held is not None:
                decisions = hold_launches(decisions, snapshot, held)
            metrics.observe_decisions(decisions)
            self.apply(session, decisions, snapshot)
            self.last_decisions = decisions
            if self.clock() >= self._next_gc:
                self.collect_garbage(session)
            self._notice_pressure(session)
            self._db_writes_ok(session)
            return decisions
        except sa.exc.DBAPIError as exc:
            fault = db_faults.write_fault(exc)
            if fault is None:
                metrics.TICK_ERRORS.labels("exception").inc()
                raise
            metrics.TICK_ERRORS.labels("database_refuses_writes").inc()
            self._db_faults.failed(fault)  # one line when it starts, none while it lasts
            self._db_backoff_s = min(DB_BACKOFF_MAX_S, max(self.settings.tick_s, 2 * self._db_backoff_s))
            self._db_retry_at = self.clock() + self._db_backoff_s
            return Decisions()
        except BackendUnavailable as exc:  # the step it broke rolled back; close() ends the rest
            metrics.TICK_ERRORS.labels("backend_unavailable").inc()
            log.warning("cluster unavailable, tick skipped: %s", exc)
            return Decisions()
        except BackendRefused as exc:  # the nodes or the pods themselves cannot be read: nothing to go on
            metrics.TICK_ERRORS.labels("backend_refused").inc()
            log.error("the cluster refused to list its nodes or pods, tick skipped: %s", exc)
            return Decisions()
        except Exception:
            metrics.TICK_ERRORS.labels("exception").inc()
            raise
        finally:
            session.close()
            metrics.TICK_DURATION.observe(time.perf_counter() - t0)

    def _db_writes_ok(self, session: Session) -> None:
        """A tick went through: ticks come at their pace again; writes are known to work again once
        one is committed (this tick's or another thread's), and then that is said once."""
        self._db_backoff_s, self._db_retry_at = 0.0, float("-inf")
        self._db_faults.succeeded(session.get_bind())

    def _notice_pressure(self, session: Session) -> None:
        """One notice to the cluster admins each time a volume falls below a threshold (a notice
        the database cannot take now is queued at a later tick)."""
        from dlts.services import notify

        for reading in self.pressure.to_notice():
            try:
                with step(session):
                    notify.enqueue(session, template="disk_pressure", to=notify.cluster_admin_emails(session),
                                   context=self._notice_context(reading),
                                   dedup_key=f"disk_pressure:{self.pressure.host}:{reading.volume.role}:"
                                             f"{reading.level.name.lower()}")
            except sa.exc.DBAPIError as exc:
                if db_faults.write_fault(exc) is None:
                    raise
                return
            self.pressure.noticed(reading)

    def _notice_context(self, reading: Reading) -> dict[str, Any]:
        cfg = self.settings.disk_pressure
        return {"host": self.pressure.host, "volume": reading.volume.role, "path": str(reading.volume.path),
                "level": reading.level.name.lower(), "why": reading.why,
                "soft_free_bytes": cfg.soft_free_bytes, "hard_free_bytes": cfg.hard_free_bytes}

    # -- nodes ------------------------------------------------------------------------------------
    def sync_nodes(self, session: Session) -> None:
        with step(session):  # the node rows before the rest of the tick reads them
            known = {n.name: n for n in session.scalars(sa.select(Node))}
            seen = set()
            for info in self.backend.nodes():
                seen.add(info.name)
                node = known.get(info.name)
                if node is None:
                    session.add(Node(name=info.name, sku=info.sku, gpus=info.gpus, cpu=info.cpu, memory_bytes=info.memory_bytes,
                                     ib_domain=info.ib_domain, vc=info.vc, ready=info.ready, backend=self.backend.name,
                                     labels={}, metrics={}))
                    continue
                # a cordon DLTS set for a repair is the node's state, not "not ready"
                changes = {"sku": info.sku, "gpus": info.gpus, "cpu": info.cpu, "memory_bytes": info.memory_bytes,
                           "ib_domain": info.ib_domain, "vc": info.vc,
                           "ready": info.ready and (not info.unschedulable or info.cordoned_by_dlts)}
                for key, value in changes.items():
                    if getattr(node, key) != value:
                        setattr(node, key, value)
                cordon = repair_cordon(node, info)
                if cordon is not None and hasattr(self.backend, "cordon") and hasattr(self.backend, "uncordon"):
                    try:
                        if cordon:
                            self.backend.cordon(node.name, node.state_reason or node.state.value)
                        else:
                            self.backend.uncordon(node.name)
                    except BackendRefused as exc:  # costs this node's cordon, tried again next tick
                        log.warning("node %s: the cluster refused to %s it: %s", node.name,
                                    "cordon" if cordon else "uncordon", exc)
            for name, node in known.items():
                if name not in seen and node.backend == self.backend.name and node.ready:
                    node.ready = False

    # -- reconcile ------------------------------------------------------------------------------
    def reconcile(self, session: Session, observed: dict[tuple[int, int], Observed]) -> None:
        # every live job with its current attempt in one query (not one query per job and tick)
        active = session.execute(
            sa.select(Job, JobAttempt).where(Job.status.in_(ACTIVE))
            .outerjoin(JobAttempt, sa.and_(JobAttempt.job_id == Job.id, JobAttempt.number == Job.attempt))
        ).all()
        live = set()
        for job, attempt in active:
            key = (job.id, job.attempt)
            live.add(key)
            seen = observed.get(key)
            if seen is None:
                if job.status is S.SCHEDULING and attempt is not None and self._start_timed_out(attempt) \
                        and attempt.stop_requested not in REPAIR_STOPS:
                    self._ended(session, job, attempt, None, timed_out=True)  # its launches never got through
                elif job.status is S.SCHEDULING and attempt is not None and attempt.stop_requested not in REPAIR_STOPS:
                    self._launch(session, job, attempt)  # the launch was lost (crash after the decision)
                elif job.status in (S.KILLING, S.PAUSING) or (attempt is not None and attempt.stop_requested in REPAIR_STOPS):
                    self._ended(session, job, attempt, None)
                elif job.status is S.RUNNING:
                    self._ended(session, job, attempt, Observed(job.id, job.attempt, RunPhase.GONE, message="the backend lost the job"))
                continue
            if seen.phase is RunPhase.RUNNING and job.status is S.SCHEDULING:
                started = self._now()
                if attempt is not None and attempt.created_at is not None:
                    started = max(started, attempt.created_at)
                values = {"started_at": started, "reason": None, "reason_detail": None}
                with step(session):
                    if job_repo.set_status(session, job.id, S.SCHEDULING, S.RUNNING, actor=ACTOR, values=values) \
                            and attempt is not None:
                        attempt.started_at = started
                        if seen.image_id:  # what the image reference meant on the node, for the record
                            job_repo.add_event(session, job.id, EventKind.IMAGE, actor=ACTOR, reason="resolved",
                                               message=f"attempt {job.attempt}: {job.image} is {seen.image_id}")
            elif seen.phase is RunPhase.PENDING and job.status is S.SCHEDULING and attempt is not None:
                if self._start_timed_out(attempt):
                    self._ended(session, job, attempt, seen, timed_out=True)
                    continue
                self._pending_reason(session, job, seen)
            elif seen.phase in (RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.GONE):
                self._ended(session, job, attempt, seen)
                continue
            if seen.phase is RunPhase.RUNNING:
                self._say_cut(key, seen.log_cut)
            if job.type == JobType.INFERENCE and attempt is not None:
                self._reconcile_replicas(session, job, attempt, seen)
        # objects the backend holds that no live attempt explains: a crash left them, the DB moved on,
        # or an ended attempt whose objects the cluster refused to let go of on an earlier tick
        for key, seen in observed.items():
            if key not in live:
                if seen.phase in (RunPhase.PENDING, RunPhase.RUNNING):
                    self._attempt_step(session, key, STOP, self.backend.terminate, key[0], key[1], 0)
                else:
                    self._attempt_step(session, key, CLEANUP, self.backend.forget, *key)

    def _say_cut(self, key: tuple[int, int], cut: str) -> None:
        """A line in this log when a running attempt starts and stops losing output to a full log
        volume (the init's own words may be on that volume); the count comes when it ends."""
        if cut and key not in self._cutting:
            self._cutting.add(key)
            log.warning("job %s attempt %s: %s", key[0], key[1], cut)
        elif not cut and key in self._cutting:
            self._cutting.discard(key)
            log.warning("job %s attempt %s: its output is stored again", key[0], key[1])

    def _attempt_step(self, session: Session, key: tuple[int, int], what: str, fn: Callable[..., object],
                      *args: object) -> bool:
        """One backend call for one attempt (``forget``, ``terminate``, ``remove_replicas``). A refusal
        costs this step only: it is logged, put on the job as a ``cluster`` event (once per distinct
        message), and the call is made again on a later tick. True when it went through."""
        try:
            fn(*args)
        except BackendRefused as exc:
            message = f"{STEP_WORDS[what]}: {exc}"[:1024]
            log.warning("job %s attempt %s: %s", key[0], key[1], message)
            if self._refusals.get((*key, what)) != message:
                self._refusals[(*key, what)] = message
                with step(session):
                    if session.get(Job, key[0]) is not None:
                        job_repo.add_event(session, key[0], EventKind.CLUSTER, reason=what, message=message, actor=ACTOR)
            return False
        self._refusals.pop((*key, what), None)
        return True

    def _now(self) -> dt.datetime:
        return from_epoch(self.clock())

    def _start_timed_out(self, attempt: JobAttempt) -> bool:
        created = attempt.created_at
        return created is not None and self.clock() - _epoch(created) > self.settings.start_timeout_s

    def _pending_reason(self, session: Session, job: Job, seen: Observed) -> None:
        """Show why the attempt has not started on the job (``reason``/``reason_detail``); an event
        when the reason changes. A reason that went away (the image is pulled) is cleared."""
        code = seen.reason or None
        detail = (seen.message or "")[:512] or None if code else None
        if (job.reason, job.reason_detail) == (code, detail):
            return
        with step(session):
            done = session.execute(
                sa.update(Job).where(Job.id == job.id, Job.status == S.SCHEDULING)
                .values(reason=code, reason_detail=detail, updated_at=utcnow()).execution_options(synchronize_session=False))
            if rowcount(done) and code is not None and code != job.reason:
                job_repo.add_event(session, job.id, EventKind.REASON, reason=code, message=detail, actor=ACTOR)

    def sync_logs(self, observed: dict[tuple[int, int], Observed]) -> None:
        """Every ``kubernetes.log_sync_s``: the backend copies the running attempts' new output into
        the log store (a no-op where jobs write there themselves)."""
        now = self.clock()
        if now < self._next_log_sync:
            return
        self._next_log_sync = now + self.settings.kubernetes.log_sync_s
        running = sorted(key for key, seen in observed.items() if seen.phase is RunPhase.RUNNING)
        if not running:
            return
        try:
            self.backend.sync_logs(running)
        except BackendUnavailable as exc:
            log.warning("logs not copied, the cluster is unavailable: %s", exc)
        except Exception:  # a log copy never stops the tick
            log.exception("copying the logs of %d running attempt(s) failed", len(running))

    def _reconcile_replicas(self, session: Session, job: Job, attempt: JobAttempt, seen: Observed) -> None:
        """Bring an inference attempt's replicas in the backend in line with its row.

        A retiring replica the backend no longer has has exited: it leaves the row, and its
        resources are free for the next pass. One the backend has not been told to stop yet (a
        crash between the commit and the call) is told again. A replica of the row the backend
        does not have (a crash between the commit of a scale-up and the create) is created."""
        replicas = replicas_from_json(attempt.placements)
        exited = [r.index for r in replicas if r.retiring and r.index not in seen.replicas]
        if exited:
            with step(session):
                attempt.placements = replicas_to_json(r for r in replicas if r.index not in exited)
            log.info("job %s attempt %s: retired replicas %s exited", job.id, attempt.number, _list(exited))
            replicas = replicas_from_json(attempt.placements)
        unsignalled = [r.index for r in replicas if r.retiring and r.index not in seen.retiring]
        if unsignalled:
            self._attempt_step(session, (job.id, attempt.number), SCALE_DOWN, self.backend.remove_replicas, job.id,
                               attempt.number, unsignalled, self.settings.preempt_grace_s)
        missing = [r.index for r in replicas if not r.retiring and r.index not in seen.replicas]
        if missing and job.status in (S.SCHEDULING, S.RUNNING) and attempt.stop_requested is None:
            log.info("job %s attempt %s: creating missing replicas %s", job.id, attempt.number, _list(missing))
            self._launch(session, job, attempt)

    def _ended(self, session: Session, job: Job, attempt: JobAttempt | None, seen: Observed | None,
               timed_out: bool = False) -> None:
        """The attempt is over: decide what the job becomes, record the attempt, release the backend.
        ``timed_out``: it had not started after ``start_timeout_s``; it ends with the reason it was
        waiting for and spends a retry."""
        now = utcnow()
        code = seen.exit_code if seen else None
        ended_at = (from_epoch(seen.finished_at) if seen and seen.finished_at else None) or now
        if job.started_at is not None and ended_at < job.started_at:
            ended_at = job.started_at  # the manager's clock saw it start after the backend's clock saw it end
        requested = attempt.stop_requested if attempt else None
        values: dict[str, Any] = {"exit_code": code, "queue_position": None, "estimated_start": None, "forecast_start": None,
                                  "estimate_note": None}
        spends_retry = False
        if job.status is S.KILLING:
            target, reason = S.KILLED, job.reason or EndReason.KILLED
            values |= {"finished_at": now}
        elif job.status is S.PAUSING:
            target, reason = S.PAUSED, EndReason.PAUSED
            if job.reason in KEPT_PAUSE_REASONS:  # paused by a policy, not a person: the job says which and why
                values |= {"reason": job.reason, "reason_detail": job.reason_detail}
            else:
                values |= {"reason": EndReason.PAUSED, "reason_detail": None}
        elif requested == EndReason.PREEMPTED:
            target, reason = S.QUEUED, EndReason.PREEMPTED  # queue_time kept: back to the head of the queue
            values |= {"reason": EndReason.PREEMPTED, "reason_detail": "preempted to make room for a non-preemptible job"}
        elif requested in REPAIR_STOPS:  # the repair manager drained it: back to the head, no retry spent
            target, reason = S.QUEUED, requested
            values |= {"reason": requested, "reason_detail": "stopped for a node repair; requeued at the head of its queue"}
        elif timed_out:
            limit = self.settings.start_timeout_s
            if seen is not None and seen.reason:
                cause = f"{seen.reason}: {seen.message}"
            elif job.reason:  # what the launches met (a full run volume) while nothing was observed
                cause = f"{job.reason}: {job.reason_detail or ''}"
            else:
                cause = f"the cluster did not start it within {limit:g} s"
            code = None
            ended_at = self._now()
            if job.retries_used < job.max_retries:
                target, reason, spends_retry = S.QUEUED, START_TIMEOUT, True
                values |= {"retries_used": job.retries_used + 1, "reason": START_TIMEOUT, "reason_detail": cause[:512]}
                said = f"not started within {limit:g} s ({cause}); retry {job.retries_used + 1} of {job.max_retries}"
            else:
                target, reason = S.FAILED, START_TIMEOUT
                values |= {"finished_at": ended_at, "reason": START_TIMEOUT, "reason_detail": cause[:512]}
                said = f"not started within {limit:g} s ({cause})"
            seen = Observed(job.id, job.attempt, RunPhase.FAILED, message=said[:1024])
            self._attempt_step(session, (job.id, job.attempt), STOP, self.backend.terminate, job.id, job.attempt, 0)
        elif seen is not None and seen.node_lost:
            target, reason = S.QUEUED, EndReason.NODE_LOST
            values |= {"reason": EndReason.NODE_LOST, "reason_detail": seen.message or "the node was lost"}
        elif seen is not None and seen.phase is RunPhase.SUCCEEDED:
            target, reason = S.FINISHED, EndReason.FINISHED
            values |= {"finished_at": ended_at, "reason": None, "reason_detail": None}
        elif job.retries_used < job.max_retries:
            target, reason, spends_retry = S.QUEUED, EndReason.RETRY, True
            detail = f"attempt {job.attempt} failed (exit code {code}); retry {job.retries_used + 1} of {job.max_retries}"
            values |= {"retries_used": job.retries_used + 1, "reason": EndReason.RETRY, "reason_detail": detail}
        else:
            target, reason = S.FAILED, EndReason.FAILED
            why = seen.message if seen and seen.message else f"exit code {code}"
            values |= {"finished_at": ended_at, "reason": EndReason.FAILED, "reason_detail": why[:512]}
        if job.started_at is None and seen is not None and seen.started_at:
            values["started_at"] = self._started_before_seen(job, attempt, seen, ended_at)
        with step(session):
            if not job_repo.set_status(session, job.id, job.status, target, actor=ACTOR, reason=reason,
                                       message=seen.message if seen else None, values=values):
                discard(session)
                return
            if attempt is not None:
                attempt.ended_at = ended_at
                attempt.exit_code = code
                attempt.end_reason = requested or reason
                attempt.spends_retry = spends_retry
                if attempt.started_at is None and seen is not None and seen.started_at:
                    attempt.started_at = self._started_before_seen(job, attempt, seen, ended_at)
            cut = f"attempt {job.attempt}: {seen.log_cut}"[:1024] if seen is not None and seen.log_cut else ""
            if cut:
                job_repo.add_event(session, job.id, EventKind.CLUSTER, reason=LOG_CUT, message=cut, actor=ACTOR)
        self._cutting.discard((job.id, job.attempt))
        if cut:  # committed: said once, in the manager's log too (the log volume may have no room for it)
            log.warning("job %s %s", job.id, cut)
        # refused (its log cannot be read yet): the objects stay, and the orphan pass of a later tick
        # tries again; the job has ended either way
        self._attempt_step(session, (job.id, job.attempt), CLEANUP, self.backend.forget, job.id, job.attempt)

    @staticmethod
    def _started_before_seen(job: Job, attempt: JobAttempt | None, seen: Observed, ended_at: dt.datetime) -> dt.datetime:
        """An attempt that ended before a tick saw it running: the backend's start time, but never
        before the attempt was made (nor the submission) and never after it ended."""
        started = from_epoch(seen.started_at)
        assert started is not None
        floor = max(t for t in (job.submitted_at, attempt.created_at if attempt else None) if t is not None)
        return min(max(started, floor), max(ended_at, floor))

    def collect_garbage(self, session: Session) -> None:
        """Objects a crash or a restored database left behind (services, secrets, run records)."""
        live = {(job_id, attempt) for job_id, attempt in session.execute(
            sa.select(Job.id, Job.attempt).where(Job.status.in_(ACTIVE)))}
        removed = self.backend.collect_garbage(live)
        if removed:
            log.info("removed backend objects of %d orphaned attempt(s): %s", len(removed), sorted(removed)[:20])
        self._next_gc = self.clock() + GC_INTERVAL_S

    # -- user requests ----------------------------------------------------------------------------
    def carry_out_requests(self, session: Session, observed: dict[tuple[int, int], Observed]) -> None:
        stopping = list(session.execute(sa.select(Job.id, Job.attempt).where(Job.status.in_([S.KILLING, S.PAUSING]))))
        # jobs the repair manager drains (managers/repair.py writes stop_requested; only we touch the cluster)
        stopping += session.execute(sa.select(JobAttempt.job_id, JobAttempt.number).join(
            Job, sa.and_(Job.id == JobAttempt.job_id, Job.attempt == JobAttempt.number)).where(
            Job.status.in_([S.SCHEDULING, S.RUNNING]), JobAttempt.stop_requested.in_(REPAIR_STOPS))).all()
        for job_id, number in stopping:
            if (job_id, number) in observed:
                self._attempt_step(session, (job_id, number), STOP, self.backend.terminate, job_id, number,
                                   self.settings.preempt_grace_s)

    # -- endpoints --------------------------------------------------------------------------------
    def _reconcile_endpoints(self, session: Session) -> None:
        """Expose the endpoints of running jobs that need it; delete closing rows.

        One query (every tick) finds the jobs with work: a running job with an endpoint that is
        pending, closing or exposed for an earlier attempt, or any job with a closing endpoint. It
        returns all endpoint rows of those jobs, since ``expose`` takes a job's whole wanted set."""
        ep = JobEndpoint
        work = sa.union(
            sa.select(ep.job_id).join(Job, Job.id == ep.job_id).where(
                Job.status == S.RUNNING,
                sa.or_(ep.status.in_([E.PENDING, E.CLOSING]), ep.attempt.is_(None), ep.attempt != Job.attempt)),
            sa.select(ep.job_id).where(ep.status == E.CLOSING),
        ).subquery()
        # populate_existing: this tick's earlier steps changed jobs with compare-and-set updates
        # that leave the objects already loaded in this session as they were
        rows = session.execute(sa.select(ep, Job).join(work, work.c.job_id == ep.job_id)
                               .join(Job, Job.id == ep.job_id).order_by(ep.job_id, ep.id)
                               .execution_options(populate_existing=True)).all()
        if not rows:
            return
        by_job: dict[int, tuple[Job, list[JobEndpoint]]] = {}
        for row, job in rows:
            by_job.setdefault(job.id, (job, []))[1].append(row)
        owners = {job.user_id for job, endpoints in by_job.values()
                  if job.status is S.RUNNING and any(r.kind is EndpointKind.SSH for r in endpoints)}
        keys: dict[int, list[str]] = {}
        if owners:
            for user_id, key in session.execute(sa.select(SshKey.user_id, SshKey.public_key)
                                                .where(SshKey.user_id.in_(owners)).order_by(SshKey.id)):
                keys.setdefault(user_id, []).append(key)
        for job, endpoints in by_job.values():
            closing = [r.id for r in endpoints if r.status is E.CLOSING]
            if job.status is not S.RUNNING:
                self._delete_closing(session, closing)  # nothing of it is exposed
                continue
            wanted = [r for r in endpoints if r.status is not E.CLOSING]
            specs = [EndpointSpec(r.id, r.kind.value, r.port, r.secret_hash or "") for r in wanted]
            try:
                states = self.backend.expose(job.id, job.attempt, specs, tuple(keys.get(job.user_id, ())))
            except BackendUnavailable as exc:
                log.warning("endpoints not exposed, the cluster is unavailable: %s", exc)
                return  # every job would get the same answer: next tick
            except Exception as exc:  # the backend refused this job's endpoints: say so on them
                log.exception("exposing the endpoints of job %s attempt %s failed", job.id, job.attempt)
                failed = EndpointState(0, E.FAILED.value, message=f"the cluster could not expose it: {exc}")
                with step(session):
                    for row in wanted:
                        if row.status is not E.READY or row.attempt != job.attempt:
                            self._record_endpoint(session, job, row, failed)
                continue
            by_id = {s.id: s for s in states}
            with step(session):  # the endpoints' states and the closing rows' deletion: one commit
                for row in wanted:
                    state = by_id.get(row.id) or EndpointState(row.id, E.PENDING.value, message="the cluster did not report it")
                    self._record_endpoint(session, job, row, state)
                self._delete_closing(session, closing)

    def _record_endpoint(self, session: Session, job: Job, row: JobEndpoint, state: EndpointState) -> None:
        """Store what the backend reports on one endpoint, compare-and-set on its status (a user may
        close it meanwhile), with an event when it becomes ready or fails."""
        try:
            status = EndpointStatus(state.status)
        except ValueError:
            status, state = E.FAILED, EndpointState(row.id, "failed", message=f"the cluster reported {state.status!r}")
        if status is E.CLOSING:
            status = E.PENDING
        ready = status is E.READY
        values = {"status": status, "attempt": job.attempt, "host": (state.host or None) if ready else None,
                  "host_port": state.host_port if ready else None, "message": (state.message or "")[:512] or None}
        if all(getattr(row, key) == value for key, value in values.items()):
            return
        done = session.execute(
            sa.update(JobEndpoint).where(JobEndpoint.id == row.id, JobEndpoint.status == row.status)
            .values(**values, updated_at=utcnow()).execution_options(synchronize_session=False))
        if not rowcount(done):
            return  # closed or deleted meanwhile: the next tick sees it
        changed = row.status is not status or row.attempt != job.attempt
        if ready and (changed or (row.host, row.host_port) != (values["host"], values["host_port"])):
            job_repo.add_event(session, job.id, EventKind.ENDPOINT, reason="ready", actor=ACTOR,
                               message=f"{row.name} ready at {values['host']}:{values['host_port']}")
        elif status is E.FAILED and changed:
            job_repo.add_event(session, job.id, EventKind.ENDPOINT, reason="failed", actor=ACTOR,
                               message=f"{row.name}: {values['message'] or 'failed'}")

    @staticmethod
    def _delete_closing(session: Session, ids: list[int]) -> None:
        with step(session):
            if ids:
                session.execute(sa.delete(JobEndpoint).where(JobEndpoint.id.in_(ids), JobEndpoint.status == E.CLOSING)
                                .execution_options(synchronize_session=False))

    # -- apply decisions ----------------------------------------------------------------------------
    def apply(self, session: Session, decisions: Decisions, snapshot: Snapshot | None = None) -> None:
        for stop in decisions.stops:
            if stop.placements:
                self._scale_down(session, stop)
            else:
                self._stop(session, stop.job_id, stop.reason)
        started = []
        with step(session):  # every start's attempt row, in one commit, before any launch
            for start in decisions.starts:
                if not start.scale_up:
                    made = self._start(session, start.job_id, start.placements)
                    if made is not None:
                        started.append(made)
        for start in decisions.starts:  # each commits its replicas, then launches them
            if start.scale_up:
                self._scale_up(session, start.job_id, start.placements)
        self._launch_many(session, [(job, attempt, None, True) for job, attempt in started])
        self._record_waits(session, decisions, snapshot)

    def _current_attempt(self, session: Session, job: Job) -> JobAttempt | None:
        return session.scalar(sa.select(JobAttempt).where(JobAttempt.job_id == job.id, JobAttempt.number == job.attempt))

    def _scale_up(self, session: Session, job_id: int, placements: tuple[Placement, ...]) -> None:
        """Add replicas to a running inference job: into the attempt row first, then the backend."""
        job = session.get(Job, job_id)
        if job is None or job.status not in (S.SCHEDULING, S.RUNNING) or job.type != JobType.INFERENCE or not placements:
            return
        attempt = self._current_attempt(session, job)
        if attempt is None or attempt.stop_requested is not None:
            return
        replicas = replicas_from_json(attempt.placements)
        first = max((r.index for r in replicas), default=-1) + 1
        added = tuple(Replica(first + i, p) for i, p in enumerate(placements))
        with step(session):
            attempt.placements = replicas_to_json(replicas + added)
            job_repo.add_event(session, job.id, EventKind.SCALED, reason="scale_up", actor="scheduler",
                               message=f"added {_replicas_on(added)}")
        self._launch(session, job, attempt, added=[r.index for r in added])

    def _scale_down(self, session: Session, stop: Stop) -> None:
        """Remove the replicas a scale-down names: marked retiring in the attempt row (they hold
        their resources until they have exited), then SIGTERM and the grace period. The job keeps
        running, its status and retries untouched."""
        job = session.get(Job, stop.job_id)
        if job is None or job.status not in (S.SCHEDULING, S.RUNNING) or stop.reason is not StopReason.SCALE_DOWN:
            return
        attempt = self._current_attempt(session, job)
        if attempt is None or attempt.stop_requested is not None:
            return
        replicas = list(replicas_from_json(attempt.placements))
        chosen: list[Replica] = []
        for placement in stop.placements:
            # The core removes replicas above min_replicas, which come last: match from the end.
            for r in reversed(replicas):
                if not r.retiring and r.placement == placement and r not in chosen:
                    chosen.append(r)
                    break
        if not chosen:
            return
        indexes = {r.index for r in chosen}
        why = f" to make room for job {stop.for_job}" if stop.for_job is not None else ""
        with step(session):
            attempt.placements = replicas_to_json(
                Replica(r.index, r.placement, True) if r.index in indexes else r for r in replicas)
            job_repo.add_event(session, job.id, EventKind.SCALED, reason="scale_down", actor="scheduler",
                               message=f"removing {_replicas_on(chosen)}{why}")
        self._attempt_step(session, (job.id, attempt.number), SCALE_DOWN, self.backend.remove_replicas, job.id,
                           attempt.number, sorted(indexes), self.settings.preempt_grace_s)

    def _start(self, session: Session, job_id: int, placements) -> tuple[Job, JobAttempt] | None:
        """The start decision in the rows (the caller commits, then launches): the job scheduling,
        its new attempt made now by the manager's clock."""
        job = session.get(Job, job_id)
        if job is None or job.status is not S.QUEUED:
            return None
        number = job.attempt + 1
        if not job_repo.set_status(session, job.id, S.QUEUED, S.SCHEDULING, actor="scheduler", reason="started",
                                   message="placed on " + ", ".join(p.node for p in placements),
                                   values={"attempt": number, "reason": None, "reason_detail": None, "queue_position": None,
                                           "estimated_start": None, "forecast_start": None, "estimate_note": None}):
            return None  # changed meanwhile (killed): nothing was written
        attempt = JobAttempt(job_id=job.id, number=number, placements=placements_to_json(placements),
                             created_at=max(self._now(), job.submitted_at or self._now()), log_key=logstore.new_key())
        session.add(attempt)
        metrics.observe_queue_wait(job.vc.name if job.vc is not None else "", job.type, job.queue_time, attempt.created_at)
        return job, attempt

    def _launch(self, session: Session, job: Job, attempt: JobAttempt, added: list[int] | None = None) -> None:
        """Create the attempt's objects in the backend (only those missing there). ``added``: the
        replicas a scale-up adds to a running inference job; if the backend refuses them, only
        they go (the job keeps running)."""
        self._launch_many(session, [(job, attempt, added, False)])

    def _launch_many(self, session: Session, items: list[tuple[Job, JobAttempt, list[int] | None, bool]]) -> None:
        """Launch attempts (job, attempt, added replicas, first launch): the specs are built and the
        outcomes recorded in this thread, the backend calls run in ``launch_all``'s pool."""
        ready: list[tuple[Job, JobAttempt, list[int] | None, bool, LaunchSpec]] = []
        for job, attempt, added, first in items:
            try:
                spec = build_launch_spec(session, self.settings, job, attempt)
            except Exception as exc:  # noqa: BLE001 - the job cannot be launched as it is (no uid, bad storage): say so
                log.warning("job %s attempt %s cannot be launched: %s", job.id, attempt.number, exc)
                self._launch_failed(session, job, attempt, added, exc)
                continue
            ready.append((job, attempt, added, first, spec))
        if not ready:
            return
        results = launch_all(self.backend, [item[-1] for item in ready])
        for (job, attempt, added, first, _spec), (note, error) in zip(ready, results):
            if error is None:
                if first and isinstance(note, str) and note:
                    with step(session):
                        job_repo.add_event(session, job.id, EventKind.REASON, reason=IDENTITY, message=note, actor=ACTOR)
            elif isinstance(error, LeaseLost):
                raise error  # another managers process acts now: record nothing
            elif isinstance(error, BackendUnavailable):
                # transient: the job stays scheduling and the next tick launches it again (idempotent)
                reason = getattr(error, "reason", "")
                if not reason or (job.reason, job.reason_detail) != (reason, str(error)[:512]):
                    log.warning("launch of job %s attempt %s deferred: %s", job.id, attempt.number, error)
                if reason and not added:  # on the job, with an event when it changes (a full run volume)
                    self._pending_reason(session, job, Observed(job.id, attempt.number, RunPhase.PENDING,
                                                                message=str(error), reason=reason))
            else:  # the backend refused: record it on the job, never lose it silently
                log.error("launch of job %s attempt %s failed", job.id, attempt.number, exc_info=error)
                self._launch_failed(session, job, attempt, added, error)

    def _launch_failed(self, session: Session, job: Job, attempt: JobAttempt, added: list[int] | None,
                       exc: BaseException) -> None:
        if added and job.status in (S.SCHEDULING, S.RUNNING):
            self._refused_replicas(session, job, attempt, added, exc)
            return
        with step(session):
            if job_repo.set_status(session, job.id, S.SCHEDULING, S.ERROR, actor=ACTOR, reason=EndReason.LAUNCH_ERROR,
                                   message=str(exc)[:1024], values={"finished_at": utcnow(), "reason": EndReason.LAUNCH_ERROR,
                                                                    "reason_detail": str(exc)[:512]}):
                attempt.end_reason, attempt.ended_at = EndReason.LAUNCH_ERROR, utcnow()

    def _refused_replicas(self, session: Session, job: Job, attempt: JobAttempt, added: list[int],
                          exc: BaseException) -> None:
        """The backend refused new replicas of a running inference job: the job keeps running with
        the replicas it has; the refused ones are retired (and whatever of them got created removed)."""
        replicas = replicas_from_json(attempt.placements)
        with step(session):
            attempt.placements = replicas_to_json(Replica(r.index, r.placement, True) if r.index in added else r
                                                  for r in replicas)
            job_repo.add_event(session, job.id, EventKind.SCALED, reason=EndReason.LAUNCH_ERROR, actor=ACTOR,
                               message=f"could not add replicas {_list(added)}: {exc}")
        self._attempt_step(session, (job.id, attempt.number), SCALE_DOWN, self.backend.remove_replicas, job.id,
                           attempt.number, added, 0)

    def _stop(self, session: Session, job_id: int, reason: StopReason) -> None:
        job = session.get(Job, job_id)
        if job is None or job.status not in (S.SCHEDULING, S.RUNNING):
            return
        with step(session):
            attempt = self._current_attempt(session, job)
            if reason is StopReason.WALL_TIME:
                limit = job.max_time_s or job.vc.max_job_time_s
                said = f"ran past its time limit of {limit} s"
                if not job_repo.set_status(session, job.id, job.status, S.KILLING, actor="scheduler",
                                           reason=EndReason.WALL_TIME, message=said,
                                           values={"reason": EndReason.WALL_TIME, "reason_detail": said}):
                    discard(session)
                    return
            elif attempt is not None and attempt.stop_requested is None:
                job_repo.add_event(session, job.id, EventKind.REASON, reason=reason.value, actor="scheduler",
                                   message="preempted to make room for a non-preemptible job")
            if attempt is not None and attempt.stop_requested is None:
                attempt.stop_requested = reason.value
        # refused: stop_requested is recorded, so carry_out_requests and reconcile try again next tick
        self._attempt_step(session, (job.id, job.attempt), STOP, self.backend.terminate, job.id, job.attempt,
                           self.settings.preempt_grace_s)

    def _record_waits(self, session: Session, decisions: Decisions, snapshot: Snapshot | None = None) -> None:
        """Store each waiting job's reason and position; an event when the reason changes, and one
        saying why when its estimated start moves later by more than a tick (``_estimates_moved``),
        whose message the job keeps as its ``estimate_note`` until it holds no reservation any more."""
        if not decisions.waits:
            return
        with step(session):
            waits = {w.job_id: w for w in decisions.waits}
            current = session.execute(sa.select(Job.id, Job.reason, Job.reason_detail, Job.queue_position,
                                                Job.estimated_start)
                                      .where(Job.id.in_(list(waits)), Job.status == S.QUEUED)).all()
            notes = self._estimates_moved(session, decisions, snapshot, current) if snapshot is not None else {}
            for job_id, reason, detail, position, estimate in current:
                wait = waits[job_id]
                code = wait.reason_code
                new_detail = (wait.detail or None) and wait.detail[:512]
                new_estimate = from_epoch(wait.estimated_start)
                # an estimate to the second: a pass's estimate moves by fractions as ``now`` does
                if (reason, detail, position) == (code, new_detail, wait.queue_position) \
                        and job_repo.same_second(estimate, new_estimate) and job_id not in notes:
                    continue
                values: dict[str, Any] = {"reason": code, "reason_detail": new_detail,
                                          "queue_position": wait.queue_position, "estimated_start": new_estimate}
                if job_id in notes:
                    values["estimate_note"] = notes[job_id]  # the estimate_moved event's message
                elif new_estimate is None:
                    values["estimate_note"] = None  # no reservation any more: nothing left that moved
                session.execute(sa.update(Job).where(Job.id == job_id, Job.status == S.QUEUED).values(**values))
                if reason != code:
                    job_repo.add_event(session, job_id, EventKind.REASON, reason=code, message=new_detail, actor="scheduler")


    def _estimates_moved(self, session: Session, decisions: Decisions, snapshot: Snapshot,
                         current: Sequence) -> dict[int, str]:
        """An ``estimate_moved`` event on each waiting job whose estimated start this pass puts more
        than a tick later than the stored one, naming the jobs of its VC that came ahead of it since
        the last pass (new in the order, or behind it before) and why (``scheduler.explain``). Its
        messages by job id: ``_record_waits`` stores each as the job's ``estimate_note`` in the
        update it makes of the job's row anyway (its estimate moved)."""
        before = {row[0]: row for row in current}
        notes: dict[int, str] = {}
        moved = []
        for wait in decisions.waits:
            row = before.get(wait.job_id)
            old = _epoch(row[4]) if row is not None and row[4] is not None else None
            if old is not None and wait.estimated_start is not None and wait.estimated_start - old > self.settings.tick_s:
                moved.append((wait, old))
        if not moved:
            return notes
        jobs = {j.id: j for j in snapshot.jobs}
        by_vc: dict[str, list[tuple[int, int]]] = {}
        for wait in decisions.waits:
            job = jobs.get(wait.job_id)
            if job is not None and wait.queue_position is not None:
                by_vc.setdefault(job.vc, []).append((wait.queue_position, wait.job_id))
        for wait, old in moved:
            job = jobs.get(wait.job_id)
            if job is None or wait.queue_position is None:
                continue
            was = before[wait.job_id][3]
            came_ahead = []
            for position, other in sorted(by_vc.get(job.vc, ())):
                if position >= wait.queue_position or other not in jobs:
                    continue
                other_was = before[other][3] if other in before else None
                if other_was is None or (was is not None and other_was > was):
                    came_ahead.append(jobs[other])
            message = moved_later(job, old, wait.estimated_start or old, came_ahead, snapshot.vcs.get(job.vc),
                                  snapshot.fair_share_usage)
            notes[job.id] = message[:1024]
            job_repo.add_event(session, job.id, EventKind.REASON, reason="estimate_moved", message=notes[job.id],
                               actor="scheduler")
        return notes


def _list(indexes) -> str:
    return ", ".join(str(i) for i in sorted(indexes))


def _replicas_on(replicas) -> str:
    """'replicas 3, 4 on node-x' / 'replica 2 on a, b' for events."""
    nodes = sorted({r.placement.node for r in replicas})
    noun = "replica" if len(replicas) == 1 else "replicas"
    return f"{noun} {_list(r.index for r in replicas)} on {', '.join(nodes)}"
