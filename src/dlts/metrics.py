"""Prometheus metrics of the control plane (docs/monitoring.md lists every one).

The instruments below live in prometheus_client's default registry, as client_python intends:
declaring one touches nothing outside the process. Under gunicorn the API runs them in
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set before the workers import anything;
``dlts.gunicorn_conf`` marks a dead worker's files), so a scrape of any worker sums all workers.

State that lives in the database (jobs by status, GPUs allocated, nodes) is read at scrape time by
``ClusterMetrics``, a custom collector, served by ``dlts managers`` (and by the demo, which has no
managers process): the API workers do not repeat it.

Labels are bounded: endpoints are URL rules without converters (``/api/v1/jobs/<job_id>``), never paths; no job
id appears on a control-plane metric.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import sqlalchemy as sa
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

log = logging.getLogger(__name__)

_FAST = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_SLOW = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
_WAIT = (10, 30, 60, 300, 900, 1800, 3600, 7200, 14400, 43200, 86400, 172800, 604800)

# -- API ------------------------------------------------------------------------------------------
HTTP_REQUESTS = Counter("dlts_http_requests", "HTTP requests answered, by method, URL rule and status code.",
                        ["method", "endpoint", "status"])
HTTP_DURATION = Histogram("dlts_http_request_duration_seconds", "Time to answer an HTTP request, by method and URL rule.",
                          ["method", "endpoint"], buckets=_FAST)
# -- database (every process) ----------------------------------------------------------------------
DB_QUERY_DURATION = Histogram("dlts_db_query_duration_seconds", "Time of one SQL statement, by kind of statement.",
                              ["operation"], buckets=_FAST)
DB_POOL_IN_USE = Gauge("dlts_db_pool_connections_in_use", "Database connections checked out of the pool(s) now.",
                       multiprocess_mode="livesum")
DB_POOL_MAX = Gauge("dlts_db_pool_connections_max", "Connections the pool(s) may open (pool size plus overflow).",
                    multiprocess_mode="livesum")
# -- job manager and scheduler (the managers process, or the demo) ---------------------------------
TICKS = Counter("dlts_jobmanager_ticks", "Job manager ticks begun.")
TICK_DURATION = Histogram("dlts_jobmanager_tick_duration_seconds", "Duration of a job manager tick.", buckets=_SLOW)
TICK_ERRORS = Counter("dlts_jobmanager_tick_errors", "Job manager ticks that failed, by error "
                      "(backend_unavailable: the cluster did not answer; database_refuses_writes: a full disk or a "
                      "read-only database; exception: anything else).", ["error"])
PASS_DURATION = Histogram("dlts_scheduler_pass_duration_seconds", "Duration of one scheduling pass (decide).",
                          buckets=_FAST)
PHASE_DURATION = Histogram("dlts_scheduler_phase_duration_seconds", "Duration of each phase of a scheduling pass.",
                           ["phase"], buckets=_FAST)
PLACEMENTS = Counter("dlts_scheduler_placements", "Start decisions (a job placed, or inference replicas added).", ["kind"])
STOPS = Counter("dlts_scheduler_stops", "Stop decisions, by reason (preempted, wall_time, scale_down).", ["reason"])
PASS_PLACEMENTS = Gauge("dlts_scheduler_pass_placements", "Start decisions of the last pass.")
PASS_PREEMPTIONS = Gauge("dlts_scheduler_pass_preemptions", "Preemptions decided in the last pass.")
PASS_WAITS = Gauge("dlts_scheduler_pass_waiting_jobs", "Jobs the last pass left waiting, by reason.", ["reason"])
QUEUE_WAIT = Histogram("dlts_job_queue_wait_seconds", "Time a job waited in the queue before it was started, by VC "
                       "and job type.", ["vc", "type"], buckets=_WAIT)
FORECAST_JOBS = Gauge("dlts_forecast_waiting_jobs", "Waiting jobs of the last forecast, by outcome (forecast: it "
                      "gives them a start; unknown: none).", ["outcome"])
FORECAST_PASSES = Gauge("dlts_forecast_passes", "Scheduling passes the last forecast ran.")
# -- volumes the job manager writes (jobmanager/disk_pressure.py) ----------------------------------
VOLUME_FREE_BYTES = Gauge("dlts_volume_free_bytes", "Bytes a user may still write on each volume the job manager "
                          "writes (volume: log, run, database).", ["volume", "path"])
VOLUME_SIZE_BYTES = Gauge("dlts_volume_size_bytes", "Size of each volume the job manager writes.", ["volume", "path"])
VOLUME_FREE_INODES = Gauge("dlts_volume_free_inodes", "Inodes a user may still take on each volume the job manager "
                           "writes (absent where the file system reports none).", ["volume", "path"])
VOLUME_PRESSURE = Gauge("dlts_volume_pressure", "Disk pressure of each volume the job manager writes: 0 ok, 1 below "
                        "the soft threshold (a warning), 2 below the hard one (no new job is launched).",
                        ["volume", "path"])
# -- Kubernetes backend --------------------------------------------------------------------------
K8S_REQUESTS = Counter("dlts_kubernetes_requests", "Requests to the Kubernetes API, by verb and HTTP status code "
                       "(code 'error': no answer).", ["verb", "code"])
K8S_DURATION = Histogram("dlts_kubernetes_request_duration_seconds", "Time of a Kubernetes API request, by verb.",
                         ["verb"], buckets=_FAST)
# -- periodic managers -----------------------------------------------------------------------------
MANAGER_RUNS = Counter("dlts_manager_runs", "Runs of each periodic manager, by result (ok, error).", ["manager", "result"])
MANAGER_DURATION = Histogram("dlts_manager_run_duration_seconds", "Duration of a periodic manager's run.", ["manager"],
                             buckets=_SLOW)
MANAGER_LAST_SUCCESS = Gauge("dlts_manager_last_success_timestamp_seconds", "When each periodic manager last ran "
                             "without an error.", ["manager"], multiprocess_mode="max")
JANITOR_ROWS = Counter("dlts_janitor_deleted_rows", "Rows the DB janitor deleted, by table.", ["table"])
NOTIFY_MESSAGES = Counter("dlts_notify_messages", "Notification e-mails handled by the notifier, by outcome "
                          "(sent, rate_limited, retried, failed, duplicate).", ["outcome"])
NOTIFY_UNREACHABLE = Counter("dlts_notify_smtp_unreachable", "Notifier runs that could not use the mail server.")
REPAIR_NODE_DECISIONS = Counter("dlts_repair_node_decisions", "Node decisions of the repair manager, by result "
                                "(applied, failed).", ["result"])




def _known_label_values() -> None:
    """Series for every known label value from the start (0 until it happens), so a rate() or an
    alert sees the first event, and dashboards show 0 rather than nothing."""
    from dlts.scheduler.model import StopReason

    for kind in ("start", "scale_up"):
        PLACEMENTS.labels(kind)
    for reason in StopReason:
        STOPS.labels(reason.value)
    for error in ("backend_unavailable", "database_refuses_writes", "exception"):
        TICK_ERRORS.labels(error)


_known_label_values()


# -- Flask ----------------------------------------------------------------------------------------
def init_app(app) -> None:
    """Count and time every request (the URL rule is the label: bounded), and time its SQL."""
    from flask import g, request

    @app.before_request
    def _start_timer() -> None:
        g.dlts_metrics_t0 = time.perf_counter()

    @app.after_request
    def _observe(response):
        t0 = g.pop("dlts_metrics_t0", None)
        if t0 is not None:
            rule = _endpoint(request.url_rule.rule) if request.url_rule is not None else "unmatched"
            method = request.method if request.method in _METHODS else "other"
            HTTP_REQUESTS.labels(method, rule, str(response.status_code)).inc()
            HTTP_DURATION.labels(method, rule).observe(time.perf_counter() - t0)
        return response


@functools.lru_cache(maxsize=1024)
def _endpoint(rule: str) -> str:
    """``/api/v1/jobs/<int(max=...):job_id>`` -> ``/api/v1/jobs/<job_id>``."""
    return _CONVERTER.sub(r"<\1>", rule)


_CONVERTER = re.compile(r"<(?:[^:<>]+:)?([^:<>]+)>")
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_OPERATION = re.compile(r"\s*(\w+)")
_OPERATIONS = frozenset({"select", "insert", "update", "delete", "begin", "commit", "rollback", "pragma"})


def instrument_engine(engine: sa.engine.Engine) -> None:
    """Time every statement (label: its first keyword) and follow the pool's check-outs."""
    from sqlalchemy import event

    @event.listens_for(engine, "before_cursor_execute")
    def _before(conn, _cursor, _statement, _params, _context, _many) -> None:
        conn.info.setdefault("dlts_t0", []).append(time.perf_counter())

    @event.listens_for(engine, "after_cursor_execute")
    def _after(conn, _cursor, statement, _params, _context, _many) -> None:
        starts = conn.info.get("dlts_t0")
        if starts:
            DB_QUERY_DURATION.labels(_operation(statement)).observe(time.perf_counter() - starts.pop())

    @event.listens_for(engine, "handle_error")
    def _error(context) -> None:
        starts = context.connection.info.get("dlts_t0") if context.connection is not None else None
        if starts:
            starts.pop()

    pool = engine.pool
    size = getattr(pool, "size", None)
    overflow = getattr(pool, "_max_overflow", 0)
    if callable(size):
        DB_POOL_MAX.inc(size() + max(0, overflow))

    @event.listens_for(pool, "checkout")
    def _checkout(*_args) -> None:
        DB_POOL_IN_USE.inc()

    @event.listens_for(pool, "checkin")
    def _checkin(*_args) -> None:
        DB_POOL_IN_USE.dec()


def _operation(statement: str) -> str:
    match = _OPERATION.match(statement or "")
    word = match.group(1).lower() if match else ""
    return word if word in _OPERATIONS else "other"


# -- job manager ------------------------------------------------------------------------------------
def observe_decisions(decisions: Any) -> None:
    """One scheduling pass: its phase times, placements, stops and wait reasons."""
    from dlts.scheduler.model import StopReason, WaitReason

    timings = dict(decisions.timings_s or {})
    total = timings.pop("total", None)
    if total is not None:
        PASS_DURATION.observe(total)
    for phase, seconds in timings.items():
        PHASE_DURATION.labels(phase).observe(seconds)
    for start in decisions.starts:
        PLACEMENTS.labels("scale_up" if start.scale_up else "start").inc()
    preempted = 0
    for stop in decisions.stops:
        STOPS.labels(stop.reason.value if isinstance(stop.reason, StopReason) else str(stop.reason)).inc()
        preempted += stop.reason == StopReason.PREEMPTED
    PASS_PLACEMENTS.set(len(decisions.starts))
    PASS_PREEMPTIONS.set(preempted)
    waiting = {reason.value: 0 for reason in WaitReason}
    for wait in decisions.waits:
        waiting[wait.reason.value] = waiting.get(wait.reason.value, 0) + 1
    for reason, count in waiting.items():
        PASS_WAITS.labels(reason).set(count)


def observe_queue_wait(vc: str, job_type: str, queued_at: dt.datetime | None, started_at: dt.datetime) -> None:
    if queued_at is not None:
        QUEUE_WAIT.labels(vc, job_type).observe(max(0.0, (started_at - queued_at).total_seconds()))


# -- Kubernetes -------------------------------------------------------------------------------------
def instrument_kubernetes(api_client: Any) -> None:
    """Count and time every request the client's REST layer sends (watches included)."""
    rest = api_client.rest_client
    if getattr(rest, "_dlts_instrumented", False):
        return
    send = rest.request

    @functools.wraps(send)
    def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        verb = _k8s_verb(method, url, kwargs.get("query_params"))
        t0 = time.perf_counter()
        code = "error"
        try:
            response = send(method, url, *args, **kwargs)
            code = str(getattr(response, "status", "") or "error")
            return response
        except Exception as exc:
            status = getattr(exc, "status", None)
            code = str(status) if status else "error"
            raise
        finally:
            K8S_REQUESTS.labels(verb, code).inc()
            K8S_DURATION.labels(verb).observe(time.perf_counter() - t0)

    rest.request = request
    rest._dlts_instrumented = True


def _k8s_verb(method: str, url: str, query: Any) -> str:
    method = (method or "").upper()
    if method == "GET":
        params = dict(query or ())
        if str(params.get("watch", "")).lower() in ("true", "1"):
            return "watch"
        return "get"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, "other")


# -- periodic managers ------------------------------------------------------------------------------
def instrumented(manager: str, run: Callable[[], object]) -> Callable[[], object]:
    """``run`` counted, timed and its result's numbers recorded; its exception passes on."""
    MANAGER_RUNS.labels(manager, "ok")
    MANAGER_RUNS.labels(manager, "error")

    @functools.wraps(run)
    def wrapper() -> object:
        t0 = time.perf_counter()
        try:
            result = run()
        except Exception:
            MANAGER_RUNS.labels(manager, "error").inc()
            raise
        finally:
            MANAGER_DURATION.labels(manager).observe(time.perf_counter() - t0)
        MANAGER_RUNS.labels(manager, "ok").inc()
        MANAGER_LAST_SUCCESS.labels(manager).set(time.time())
        record_result(result)
        return result

    return wrapper


def record_result(result: object) -> None:
    """The numbers a manager's run returns (janitor, notifier, repair) as counters."""
    name = type(result).__name__
    if name == "PurgeResult":
        for table in ("jobs", "attempts", "events", "endpoints", "sessions", "rate_counters", "idempotency_keys"):
            JANITOR_ROWS.labels(table).inc(getattr(result, table, 0) or 0)
    elif name == "NotifyRun":
        for outcome, attr in (("sent", "sent"), ("rate_limited", "rate_limited"), ("retried", "retried"),
                              ("failed", "failed"), ("duplicate", "duplicates")):
            NOTIFY_MESSAGES.labels(outcome).inc(getattr(result, attr, 0) or 0)
        if getattr(result, "unreachable", None):
            NOTIFY_UNREACHABLE.inc()
    elif name == "TickResult":
        REPAIR_NODE_DECISIONS.labels("applied").inc(len(getattr(result, "applied", ()) or ()))
        REPAIR_NODE_DECISIONS.labels("failed").inc(len(getattr(result, "failed", ()) or ()))


# -- state in the database, read at scrape time ---------------------------------------------------
class ClusterMetrics:
    """Jobs, GPU allocation and node capacity from the database at scrape time.

        dlts_jobs{status,vc}                                 jobs per status (terminal ones until purged)
        dlts_jobs_oldest_queued_age_seconds{vc}              age of the longest-waiting queued job
        dlts_gpus_allocated{vc,user,sku,preemptible}         GPUs held by active jobs
        dlts_node_capacity_gpus{node,sku}                    GPUs of each node
        dlts_node_allocated_gpus{node,sku}                   GPUs of each node held by active jobs
        dlts_vc_gpu_quota{vc,sku}                            each VC's quota
        dlts_node_state{node,state}                          1 for each node's current repair state, 0 for the rest
        dlts_node_last_heartbeat_timestamp_seconds{node}     its agent's last report
    """

    def __init__(self, session_factory: Callable[[], Any], clock: Callable[[], float] = time.time):
        self.session_factory = session_factory
        self.clock = clock

    def describe(self) -> list[Metric]:
        return []  # no query when registered

    def collect(self) -> Iterator[Metric]:
        from dlts.models import (
            ACTIVE,
            Job,
            JobAttempt,
            JobStatus,
            Node,
            NodeState,
            User,
            VirtualCluster,
        )
        from dlts.models.placements import replicas_from_json

        now = dt.datetime.fromtimestamp(self.clock(), dt.UTC).replace(tzinfo=None)
        with self.session_factory() as s:
            vcs = dict(s.execute(sa.select(VirtualCluster.id, VirtualCluster.name)).all())
            jobs = GaugeMetricFamily("dlts_jobs", "Jobs per status and VC.", labels=["status", "vc"])
            counts = {(status, vc_id): n for status, vc_id, n in s.execute(
                sa.select(Job.status, Job.vc_id, sa.func.count(Job.id)).group_by(Job.status, Job.vc_id))}
            for vc_id, vc in sorted(vcs.items(), key=lambda kv: kv[1]):
                for status in JobStatus:
                    jobs.add_metric([status.value, vc], counts.get((status, vc_id), 0))
            yield jobs
            oldest = GaugeMetricFamily("dlts_jobs_oldest_queued_age_seconds",
                                       "Seconds the longest-waiting queued job of each VC has waited (0: none queued).",
                                       labels=["vc"])
            first = dict(s.execute(sa.select(Job.vc_id, sa.func.min(Job.queue_time))
                                   .where(Job.status == JobStatus.QUEUED).group_by(Job.vc_id)).all())
            for vc_id, vc in sorted(vcs.items(), key=lambda kv: kv[1]):
                since = first.get(vc_id)
                oldest.add_metric([vc], max(0.0, (now - since).total_seconds()) if since is not None else 0.0)
            yield oldest

            node_rows = s.execute(sa.select(Node.name, Node.sku, Node.gpus, Node.state, Node.last_heartbeat_at)).all()
            nodes = {name: (sku, gpus) for name, sku, gpus, _, _ in node_rows}
            state = GaugeMetricFamily("dlts_node_state", "Each node's repair state: 1 for the current one, 0 for the others.",
                                      labels=["node", "state"])
            heartbeat = GaugeMetricFamily("dlts_node_last_heartbeat_timestamp_seconds",
                                          "When each node's agent last reported (absent: never).", labels=["node"])
            for name, _, _, current, beat in sorted(node_rows, key=lambda row: row[0]):
                for known in NodeState:
                    state.add_metric([name, known.value], 1 if known == current else 0)
                if beat is not None:
                    heartbeat.add_metric([name], beat.replace(tzinfo=dt.UTC).timestamp())
            yield state
            yield heartbeat
            users = dict(s.execute(sa.select(User.id, User.name)).all())
            held: dict[tuple[str, str, str, str], int] = {}
            on_node: dict[str, int] = {}
            rows = s.execute(sa.select(Job.vc_id, Job.user_id, Job.preemptible, JobAttempt.placements)
                             .join(JobAttempt, sa.and_(JobAttempt.job_id == Job.id, JobAttempt.number == Job.attempt))
                             .where(Job.status.in_(list(ACTIVE))))
            for vc_id, user_id, preemptible, placements in rows:
                for replica in replicas_from_json(placements):
                    placement = replica.placement
                    count = len(placement.gpu_indices)
                    if not count:
                        continue
                    sku = nodes.get(placement.node, ("unknown", 0))[0]
                    key = (vcs.get(vc_id, ""), users.get(user_id, ""), sku, "true" if preemptible else "false")
                    held[key] = held.get(key, 0) + count
                    on_node[placement.node] = on_node.get(placement.node, 0) + count
            allocated = GaugeMetricFamily("dlts_gpus_allocated", "GPUs held by active jobs.",
                                          labels=["vc", "user", "sku", "preemptible"])
            for key, count in sorted(held.items()):
                allocated.add_metric(list(key), count)
            yield allocated
            capacity = GaugeMetricFamily("dlts_node_capacity_gpus", "GPUs of each node, as the backend reports them.",
                                         labels=["node", "sku"])
            used = GaugeMetricFamily("dlts_node_allocated_gpus", "GPUs of each node held by active jobs.",
                                     labels=["node", "sku"])
            for name, (sku, gpus) in sorted(nodes.items()):
                capacity.add_metric([name, sku], gpus)
                used.add_metric([name, sku], on_node.get(name, 0))
            yield capacity
            yield used
            quota = GaugeMetricFamily("dlts_vc_gpu_quota", "GPU quota of each VC, per SKU.", labels=["vc", "sku"])
            for name, q in sorted(s.execute(sa.select(VirtualCluster.name, VirtualCluster.quota)).all()):
                for sku, gpus in sorted((q or {}).items()):
                    if isinstance(gpus, (int, float)):
                        quota.add_metric([name, str(sku)], gpus)
            yield quota


class Include:
    """Another registry's metrics inside this one (the process's default registry on a served one)."""

    def __init__(self, registry: Any):
        self.registry = registry

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self.registry.collect()
