"""Jobs, their attempts and events, and the one table of allowed status transitions.

Typed columns hold what is queried (status, VC, user, type, GPUs, SKU, priority, preemptible, queue
time, timestamps); the rest of the submitted spec (env, ports, ssh, ...) is JSON in ``spec``.
"""

from __future__ import annotations

import datetime as dt
import enum

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column, relationship

from dlts.models.base import Base, BigId, Timestamp, str_enum, utcnow
from dlts.scheduler.model import JobType  # the scheduler's own enum: one list of job types


class JobStatus(str, enum.Enum):
    UNAPPROVED = "unapproved"
    QUEUED = "queued"
    SCHEDULING = "scheduling"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    KILLING = "killing"
    KILLED = "killed"
    FINISHED = "finished"
    FAILED = "failed"
    ERROR = "error"


S = JobStatus
TERMINAL = frozenset({S.KILLED, S.FINISHED, S.FAILED, S.ERROR})
# statuses whose job holds (or may hold) cluster resources: the backend has objects for it
ACTIVE = frozenset({S.SCHEDULING, S.RUNNING, S.PAUSING, S.KILLING})

# from -> allowed targets. Every status write goes through this table (SCHEDULING.md lifecycle).
TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    S.UNAPPROVED: frozenset({S.QUEUED, S.PAUSED, S.KILLED}),
    S.QUEUED: frozenset({S.SCHEDULING, S.UNAPPROVED, S.PAUSED, S.KILLED, S.ERROR}),
    # scheduling: the start decision is recorded, the backend is creating objects
    S.SCHEDULING: frozenset({S.RUNNING, S.QUEUED, S.FINISHED, S.FAILED, S.KILLING, S.PAUSING, S.ERROR}),
    S.RUNNING: frozenset({S.FINISHED, S.FAILED, S.QUEUED, S.KILLING, S.PAUSING, S.ERROR}),
    S.PAUSING: frozenset({S.PAUSED, S.KILLING, S.ERROR}),
    S.PAUSED: frozenset({S.QUEUED, S.UNAPPROVED, S.KILLED}),
    S.KILLING: frozenset({S.KILLED, S.ERROR}),
    S.KILLED: frozenset(),
    S.FINISHED: frozenset(),
    S.FAILED: frozenset(),
    S.ERROR: frozenset(),
}


class EventKind(enum.StrEnum):
    """What a ``job_events`` row records (stored as the value; the column stays a string, so rows of
    kinds no longer written still read)."""

    TRANSITION = "transition"  # a status change (from_status -> to_status), or the submission
    REASON = "reason"  # why a waiting job waits (a scheduler reason, an identity problem)
    SCALED = "scaled"  # an inference job's replicas changed (reason scale_up / scale_down / launch_error)
    ENDPOINT = "endpoint"  # an endpoint opened, closed, became ready or failed
    CHANGE = "change"  # its owner or an admin changed it: priority, max time, tags, archived, idle exemption
    INSIGHT = "insight"  # an insight finding (idle GPUs, ...) raised, cleared or acted on
    REPAIR = "repair"  # the repair loop stopped the job to take its node out of service
    CLUSTER = "cluster"  # the cluster refused a step for the job (its log copy, a deletion, a stop), in words
    IMAGE = "image"  # the image an attempt started with, as the node's runtime resolved it (a tag's digest)


class EndReason(enum.StrEnum):
    """Why an attempt ended (``job_attempts.end_reason``); the same words are an ended or requeued
    job's ``reason``. Stored as the value in a string column; a kill's reason may also be one a
    service names (``services.jobs.kill(reason=...)``)."""

    FINISHED = "finished"
    FAILED = "failed"
    RETRY = "retry"  # failed, and a retry was left: requeued
    KILLED = "killed"
    KILLED_BY_USER = "killed_by_user"
    IDLE_GPUS = "idle_gpus"  # the VC's idle-job policy stopped it
    PAUSED = "paused"
    PAUSED_BY_USER = "paused_by_user"  # the reason of a pause its owner or an admin asked for (the paused job says "paused")
    PREEMPTED = "preempted"  # requeued at the head of its queue
    WALL_TIME = "wall_time"
    SCALE_DOWN = "scale_down"
    NODE_LOST = "node_lost"
    NODE_REPAIR = "node_repair"  # drained for a repair: requeued at the head, no retry spent
    START_TIMEOUT = "start_timeout"
    LAUNCH_ERROR = "launch_error"


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        # keyset listing: newest first, optionally filtered by one of these columns
        sa.Index("ix_jobs_status_id", "status", "id"),
        sa.Index("ix_jobs_vc_id", "vc_id", "id"),
        sa.Index("ix_jobs_user_id", "user_id", "id"),
        sa.Index("ix_jobs_vc_status_id", "vc_id", "status", "id"),
        sa.Index("ix_jobs_vc_user_id", "vc_id", "user_id", "id"),  # revision 0003
        sa.Index("ix_jobs_finished_at", "finished_at"),
        sa.Index("ix_jobs_archived_at", "archived_at"),  # revision 0014
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(128))
    user_id: Mapped[int] = mapped_column(sa.ForeignKey("users.id"))
    vc_id: Mapped[int] = mapped_column(sa.ForeignKey("vcs.id"))
    type: Mapped[JobType] = mapped_column(str_enum(JobType, 16))
    status: Mapped[JobStatus] = mapped_column(str_enum(JobStatus, 16), default=S.QUEUED)
    # why the job waits (scheduler reason code) or why it ended (wall_time, killed_by_user, ...)
    reason: Mapped[str | None] = mapped_column(sa.String(64))
    reason_detail: Mapped[str | None] = mapped_column(sa.String(512))
    queue_position: Mapped[int | None] = mapped_column(sa.Integer)
    # backfill: when the scheduler's last pass expects the waiting job to start (its reservation);
    # NULL: unknown (no reservation, or nothing bounds the running work) (revision 0015)
    estimated_start: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    # every waiting job: when the forecast manager's last forecast (scheduler/forecast.py) starts it;
    # NULL: not reached (revision 0019). Never read by the scheduler: a forecast holds nothing
    forecast_start: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    # why estimated_start last moved later (the estimate_moved event's message: the jobs that came
    # ahead of it and why); NULL: it has not moved, or no reservation any more / not waiting (revision 0021)
    estimate_note: Mapped[str | None] = mapped_column(sa.String(1024))
    image: Mapped[str] = mapped_column(sa.String(512))
    command: Mapped[str] = mapped_column(sa.Text)
    sku: Mapped[str | None] = mapped_column(sa.String(64))
    gpus: Mapped[int] = mapped_column(sa.Integer, default=0)  # per node for distributed jobs
    nodes: Mapped[int] = mapped_column(sa.Integer, default=0)  # distributed jobs only
    cpu: Mapped[float] = mapped_column(sa.Float)
    memory_bytes: Mapped[int] = mapped_column(sa.BigInteger)
    priority: Mapped[int] = mapped_column(sa.Integer, default=100)
    preemptible: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    max_retries: Mapped[int] = mapped_column(sa.Integer, default=3)
    retries_used: Mapped[int] = mapped_column(sa.Integer, default=0)
    max_time_s: Mapped[int | None] = mapped_column(sa.Integer)
    # the order key; kept on preemption and node loss so the job returns to the head of its queue
    queue_time: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    submitted_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    finished_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    exit_code: Mapped[int | None] = mapped_column(sa.Integer)
    attempt: Mapped[int] = mapped_column(sa.Integer, default=0)  # current (or last) attempt number
    # the rest of the submitted spec: env, ports, ssh, ib_domain, replicas, ...
    spec: Mapped[dict] = mapped_column(sa.JSON, default=dict)
    updated_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow, onupdate=utcnow)
    # set by its owner once the job has ended (revision 0014): hidden from the default lists, still
    # counted in usage (accounting reads its own rollup)
    archived_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    # the VC admin who approved the job past its user quota (revision 0016); the scheduler no longer
    # holds an approved job to that quota
    approved_by: Mapped[str | None] = mapped_column(sa.String(64))

    user = relationship("User", lazy="joined")
    vc = relationship("VirtualCluster", lazy="joined")

    def estimate(self) -> tuple[dt.datetime | None, str | None]:
        """A queued job's estimated start and where it comes from: its backfill reservation
        (``"reservation"``), else the forecast manager's last forecast (``"forecast"``); (None, None)
        when neither has one or the job is not queued."""
        if self.status is not JobStatus.QUEUED:
            return None, None
        if self.estimated_start is not None:
            return self.estimated_start, "reservation"
        if self.forecast_start is not None:
            return self.forecast_start, "forecast"
        return None, None

class JobAttempt(Base):
    """One run of a job: where it ran, how it ended, whether it spent a retry."""

    __tablename__ = "job_attempts"
    __table_args__ = (sa.UniqueConstraint("job_id", "number"),
                      sa.Index("ix_job_attempts_accounting_open", "accounting_open"))  # revision 0010

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(sa.Integer)
    # [{"node": ..., "gpu_indices": [...], "cpu": ..., "memory_bytes": ..., "replica": 0, "retiring"?: true}]
    # (read and written by jobmanager/snapshot.py only; "retiring": an inference replica being removed)
    placements: Mapped[list] = mapped_column(sa.JSON, default=list)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    ended_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    exit_code: Mapped[int | None] = mapped_column(sa.Integer)
    # an EndReason value
    end_reason: Mapped[str | None] = mapped_column(sa.String(64))
    # set when the job manager asked the backend to stop this attempt (kill, pause, preemption)
    stop_requested: Mapped[str | None] = mapped_column(sa.String(64))
    spends_retry: Mapped[bool | None] = mapped_column(sa.Boolean)
    # where the attempt's log is in the log store (dlts.logstore: ``<job id>/attempt-<n>-<log_key>.log``),
    # random, made with the row (revision 0022): restored with the row from a backup, so a job id
    # handed out again after a restore never names the discarded job's log. NULL: an attempt from
    # before 0022, whose log is ``attempt-<n>.log``
    log_key: Mapped[str | None] = mapped_column(sa.String(16))
    # accounting (services/accounting.py): GPU-milliseconds booked into the usage rollup so far, and
    # up to when; ``accounting_open`` until the attempt has ended and everything is booked
    accounting_open: Mapped[bool] = mapped_column(sa.Boolean, default=True, server_default=sa.true())
    booked_until: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    utilisation_booked_until: Mapped[dt.datetime | None] = mapped_column(Timestamp)  # a minute boundary
    gpu_ms: Mapped[int] = mapped_column(sa.BigInteger, default=0, server_default="0")
    busy_gpu_ms: Mapped[int] = mapped_column(sa.BigInteger, default=0, server_default="0")
    sampled_gpu_ms: Mapped[int] = mapped_column(sa.BigInteger, default=0, server_default="0")


class JobEvent(Base):
    """Append-only history: transitions, scheduler reasons, repair and insight messages."""

    __tablename__ = "job_events"
    __table_args__ = (sa.Index("ix_job_events_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"))
    at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    kind: Mapped[str] = mapped_column(sa.String(16))  # an EventKind value
    from_status: Mapped[str | None] = mapped_column(sa.String(16))
    to_status: Mapped[str | None] = mapped_column(sa.String(16))
    reason: Mapped[str | None] = mapped_column(sa.String(64))
    message: Mapped[str | None] = mapped_column(sa.String(1024))
    actor: Mapped[str | None] = mapped_column(sa.String(64))  # user name, or "scheduler"/"jobmanager"


class EndpointKind(str, enum.Enum):
    SSH = "ssh"  # sshd with the owner's SSH keys, container port 22
    JUPYTER = "jupyter"  # Jupyter server, container port 8888, password = the endpoint's token
    VSCODE = "vscode"  # code-server, container port 8080, password = the endpoint's token
    PORT = "port"  # a port the job itself listens on


class EndpointStatus(str, enum.Enum):
    PENDING = "pending"  # asked for; the job manager has not exposed it for the current attempt yet
    READY = "ready"  # exposed: ``host``:``host_port`` reaches the container's ``port``
    FAILED = "failed"  # the cluster could not expose it (``message`` says why); retried on the next attempt
    CLOSING = "closing"  # deleted by a user; the job manager removes it from the cluster, then the row


class JobEndpoint(Base):
    """A way into a running job (ssh, Jupyter, VS Code, a port), asked for through the API.

    Rows hold what users asked for; the job manager exposes them for the job's current attempt and
    records where they are reachable (``attempt``, ``host``, ``host_port``). An address belongs to one
    attempt: when the job runs again, the endpoint is pending until it is exposed anew. ``secret_hash``
    is the SHA-256 of the token shown once to the user (Jupyter and VS Code passwords); the token
    itself is never stored.
    """

    __tablename__ = "job_endpoints"
    __table_args__ = (sa.UniqueConstraint("job_id", "port"), sa.UniqueConstraint("job_id", "name"),
                      sa.Index("ix_job_endpoints_status", "status"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"))
    kind: Mapped[EndpointKind] = mapped_column(str_enum(EndpointKind, 16))
    name: Mapped[str] = mapped_column(sa.String(32))
    port: Mapped[int] = mapped_column(sa.Integer)  # in the container
    status: Mapped[EndpointStatus] = mapped_column(str_enum(EndpointStatus, 16), default=EndpointStatus.PENDING)
    attempt: Mapped[int | None] = mapped_column(sa.Integer)  # the attempt host/host_port belong to
    host: Mapped[str | None] = mapped_column(sa.String(255))
    host_port: Mapped[int | None] = mapped_column(sa.Integer)
    message: Mapped[str | None] = mapped_column(sa.String(512))
    secret_hash: Mapped[str | None] = mapped_column(sa.String(64))
    created_by: Mapped[str] = mapped_column(sa.String(64))
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow, onupdate=utcnow)


class JobTemplate(Base):
    """A saved job spec a user reuses (personal, or shared with a VC)."""

    __tablename__ = "job_templates"
    __table_args__ = (sa.UniqueConstraint("user_id", "vc_id", "name"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    user_id: Mapped[int] = mapped_column(sa.ForeignKey("users.id", ondelete="CASCADE"))
    vc_id: Mapped[int | None] = mapped_column(sa.ForeignKey("vcs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(sa.String(64))
    spec: Mapped[dict] = mapped_column(sa.JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)


class JobTag(Base):
    """A label its owner (or a VC admin) put on a job (revision 0014): ``tag=`` filters lists by it."""

    __tablename__ = "job_tags"
    __table_args__ = (sa.Index("ix_job_tags_tag_job_id", "tag", "job_id"),)

    job_id: Mapped[int] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(sa.String(32), primary_key=True)


class JobFavourite(Base):
    """A job a user starred (revision 0014); per user, for any job they can see."""

    __tablename__ = "job_favourites"
    __table_args__ = (sa.Index("ix_job_favourites_job_id", "job_id"),)

    user_id: Mapped[int] = mapped_column(sa.ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    job_id: Mapped[int] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)


class IdempotencyKey(Base):
    """An ``Idempotency-Key`` a user sent with ``POST /jobs`` (revision 0014), written in the job's own
    transaction: a retry with the same key answers this job instead of making another. The unique
    (user_id, key) makes two parallel requests with one key make one job. ``body_hash`` is the
    SHA-256 of the canonical request body: the same key with another body is refused. Purged by the
    janitor after ``idempotency_key_ttl_h``."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (sa.UniqueConstraint("user_id", "key"), sa.Index("ix_idempotency_keys_created_at", "created_at"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    user_id: Mapped[int] = mapped_column(sa.ForeignKey("users.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(sa.String(128))
    body_hash: Mapped[str] = mapped_column(sa.String(64))
    job_id: Mapped[int] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
