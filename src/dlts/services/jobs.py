"""Job use-cases: submit, kill, pause, resume, approve, read. No Flask; each owns its transaction.

They validate (with actionable messages that state the numbers), check the rules in
``services.policy`` and write rows. They never call the cluster backend: the job manager acts on
what they write at its next tick.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts import logstore
from dlts.config import Settings
from dlts.errors import InvalidInput, NotFound, RateLimited, Refused, WrongState
from dlts.models import (
    ACTIVE,
    TERMINAL,
    EndpointKind,
    EndReason,
    EventKind,
    IdempotencyKey,
    Job,
    JobAttempt,
    JobEvent,
    JobInsight,
    JobStatus,
    JobTag,
    JobType,
    Node,
    User,
    VirtualCluster,
    utcnow,
)
from dlts.repositories import cluster as cluster_repo
from dlts.repositories import jobs as job_repo
from dlts.repositories import limits as limits_repo
from dlts.repositories.cluster import sku_shapes, vc_and_user
from dlts.scheduler.model import CPU_SKU, SkuShape
from dlts.services import endpoints as endpoint_service
from dlts.services import policy
from dlts.services.auth import Principal
from dlts.services.transaction import rowcount, transaction, transactional

log = logging.getLogger(__name__)
LOG_DOWNLOAD_CHUNK = 256 * 1024

S = JobStatus
JOB_TYPES = tuple(t.value for t in JobType)
# What one job may carry (UTF-8 bytes): every list and page loads jobs by the hundred, so a job's
# user-supplied text is bounded here; the list routes return summaries without env or command.
MAX_COMMAND_BYTES = 16384
MAX_ENV_VARS = 100
MAX_ENV_VALUE_BYTES = 4096
MAX_ENV_BYTES = 32768  # names and values of all variables together
# statuses whose non-preemptible GPUs count against a user's quota inside a VC
HOLDS_USER_QUOTA = (S.QUEUED, S.SCHEDULING, S.RUNNING, S.PAUSING, S.KILLING)


@dataclass(frozen=True)
class JobRequest:
    """A validated ``POST /jobs`` body (shape and types checked by the API schema)."""

    vc: str
    image: str
    command: str
    name: str = ""
    type: JobType = JobType.BATCH
    gpus: int = 0
    sku: str | None = None
    cpu: float | None = None
    memory_bytes: int | None = None
    nodes: int = 0
    preemptible: bool = False
    max_retries: int | None = None
    max_time_s: int | None = None
    priority: int = 100
    env: Mapping[str, str] = field(default_factory=dict)
    ports: tuple[int, ...] = ()
    ssh: bool = False
    ib_domain: str | None = None  # "any": a distributed job may span IB domains
    min_replicas: int = 0
    max_replicas: int = 0
    ephemeral_storage_bytes: int | None = None  # None: the VC's default
    run_as_root: bool = False
    tags: tuple[str, ...] = ()


# job tags: what ``tags=[...]`` on submit and PUT /jobs/{id}/tags take (lowercased, each once)
MAX_TAGS = 16
MAX_TAG_CHARS = 32
TAG_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]{0,31}$", re.ASCII)
TAG_RULE = (f"at most {MAX_TAGS} tags, each 1-{MAX_TAG_CHARS} characters: lowercase letters, digits, '.', '_' "
            "or '-', starting with a letter or digit")


def clean_tags(tags: object, field_name: str = "tags") -> tuple[str, ...]:
    """Tags as stored: stripped, lowercased, each once, in the order given; InvalidInput naming the
    field (and the tag) for anything else."""
    if not isinstance(tags, (list, tuple)):
        raise InvalidInput(f"{field_name} is a list of tags ({TAG_RULE}).", code="invalid_tags", details={"field": field_name})
    out: list[str] = []
    for tag in tags:
        if not isinstance(tag, str):
            raise InvalidInput(f"{field_name}: every tag is a string ({TAG_RULE}).", code="invalid_tags",
                               details={"field": field_name})
        clean = tag.strip().lower()
        if not TAG_PATTERN.match(clean):
            raise InvalidInput(f"{field_name}: tag {tag[:40]!r} is not allowed: {TAG_RULE}.", code="invalid_tags",
                               details={"field": field_name})
        if clean not in out:
            out.append(clean)
    if len(out) > MAX_TAGS:
        raise InvalidInput(f"{field_name} has {len(out)} tags; {TAG_RULE}.", code="invalid_tags",
                           details={"field": field_name, "max": MAX_TAGS})
    return tuple(out)


def _check_identity_asks(req: JobRequest, vc: VirtualCluster, settings: Settings) -> None:
    """Scratch space up to the VC's default, and root only where the VC's policy allows it."""
    if req.ephemeral_storage_bytes is not None:
        limit = vc.ephemeral_storage_bytes or settings.kubernetes.default_ephemeral_storage_bytes
        source = f"VC {vc.name}'s" if vc.ephemeral_storage_bytes else "the cluster's default"
        if req.ephemeral_storage_bytes > limit:
            raise Refused(f"This job asks {req.ephemeral_storage_bytes} bytes of ephemeral storage; {source} limit is "
                          f"{limit}. Ask for at most {limit}, or leave ephemeral_storage_bytes out to get it.",
                          code="ephemeral_storage_exceeds_vc",
                          details={"field": "ephemeral_storage_bytes", "max": limit, "asked": req.ephemeral_storage_bytes})
    if req.run_as_root and not root_allowed(settings, vc):
        raise Refused(f"VC {vc.name} does not let jobs run as root; leave run_as_root out (jobs run as your uid), or ask "
                      "a cluster admin to allow run_as_root in the VC's pod_policy.",
                      code="run_as_root_not_allowed", details={"field": "run_as_root"})


def root_allowed(settings: Settings, vc: VirtualCluster) -> bool:
    """The VC's pod policy or the cluster's ``kubernetes.privileged_policy`` allows ``run_as_root``."""
    from dlts.backends.k8s_settings import PrivilegedFeature

    return bool((vc.pod_policy or {}).get(PrivilegedFeature.RUN_AS_ROOT.value)) or \
        PrivilegedFeature.RUN_AS_ROOT in settings.kubernetes.features_for(vc.name)


def _choose_sku(req: JobRequest, quota: Mapping[str, int], shapes: Mapping[str, SkuShape]) -> str:
    gpu_skus = sorted(s for s, shape in shapes.items() if shape.gpus > 0)
    if req.sku:
        if req.sku not in shapes:
            known = ", ".join(sorted(shapes)) or "none yet"
            raise InvalidInput(f"SKU {req.sku!r} does not exist in this cluster; known SKUs: {known}.",
                               code="unknown_sku", details={"field": "sku"})
        return req.sku
    if req.gpus == 0 and req.type != JobType.DISTRIBUTED:
        return CPU_SKU
    in_quota = [s for s in gpu_skus if quota.get(s, 0) > 0]
    candidates = in_quota or gpu_skus
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise Refused("This cluster has no GPU nodes; submit with gpus: 0 for a CPU-only job.",
                      code="no_gpu_nodes", details={"field": "gpus"})
    raise InvalidInput(f"Say which GPU type with sku: one of {', '.join(candidates)}.",
                       code="sku_required", details={"field": "sku"})


def _resources(req: JobRequest, sku: str, shape: SkuShape | None, settings: Settings) -> tuple[int, float, int]:
    """GPUs (per node for distributed jobs), cores and bytes, with SCHEDULING.md's defaults."""
    gpus = req.gpus
    if req.type == JobType.DISTRIBUTED:
        if req.nodes < 1:
            raise InvalidInput("A distributed job needs nodes >= 1 (whole nodes).", code="nodes_required", details={"field": "nodes"})
        if shape is None or shape.gpus == 0:
            raise InvalidInput("A distributed job takes whole GPU nodes; name a GPU sku.", details={"field": "sku"})
        if gpus not in (0, shape.gpus):
            raise InvalidInput(f"A distributed job takes whole nodes: gpus is per node and must be {shape.gpus} on "
                               f"{sku} nodes (or leave it out).",
                               code="gpus_not_whole_node", details={"field": "gpus", "expected": shape.gpus})
        return shape.gpus, req.cpu or shape.cpu, req.memory_bytes or shape.memory_bytes
    if req.nodes:
        raise InvalidInput("nodes is only for distributed jobs; leave it out or use type: distributed.", details={"field": "nodes"})
    if sku == CPU_SKU or gpus == 0:
        if gpus:
            raise InvalidInput("CPU-only nodes have no GPUs; set gpus: 0 or pick a GPU sku.", details={"field": "gpus"})
        return 0, req.cpu or settings.cpu_job_default_cpu, req.memory_bytes or settings.cpu_job_default_memory_bytes
    assert shape is not None
    if gpus > shape.gpus:
        raise Refused(f"A {sku} node has {shape.gpus} GPUs; this job asks {gpus} on one node. Ask for at most "
                      f"{shape.gpus}, or use type: distributed with whole nodes.",
                      code="gpus_exceed_node", details={"field": "gpus", "max": shape.gpus})
    share = gpus / shape.gpus
    cpu = req.cpu if req.cpu is not None else round(shape.cpu * share, 3)
    memory = req.memory_bytes if req.memory_bytes is not None else int(shape.memory_bytes * share)
    if cpu > shape.cpu or memory > shape.memory_bytes:
        raise Refused(f"A {sku} node has {shape.cpu:g} cores and {shape.memory_bytes} bytes of memory; this job asks "
                      f"{cpu:g} cores and {memory} bytes.",
                      code="resources_exceed_node", details={"field": "cpu" if cpu > shape.cpu else "memory"})
    return gpus, cpu, memory


def user_gpus_in_vc(session: Session, user_id: int, vc_id: int, exclude_job: int | None = None) -> int:
    total = sa.func.coalesce(sa.func.sum(sa.case((Job.nodes > 0, Job.gpus * Job.nodes), else_=Job.gpus)), 0)
    query = sa.select(total).where(Job.user_id == user_id, Job.vc_id == vc_id, Job.preemptible.is_(False),
                                   Job.status.in_(HOLDS_USER_QUOTA))
    if exclude_job is not None:
        query = query.where(Job.id != exclude_job)
    return int(session.scalar(query) or 0)


def _needs_approval(session: Session, job: Job, user_gpu_quota: int | None) -> str | None:
    if job.preemptible or user_gpu_quota is None:
        return None
    asked = job.gpus * max(job.nodes, 1)
    used = user_gpus_in_vc(session, job.user_id, job.vc_id, exclude_job=job.id)
    if used + asked <= user_gpu_quota:
        return None
    return (f"{job.user.name} already holds {used} non-preemptible GPUs in VC {job.vc.name}; with this job's {asked} "
            f"that is above the per-user quota of {user_gpu_quota}. A VC admin must approve it.")


def _submitted_endpoints(req: JobRequest) -> list[tuple[EndpointKind, int]]:
    """``ssh: true`` and ``ports`` of a submission: the endpoint rows made with the job."""
    if not req.ssh and not req.ports:
        return []
    for port in req.ports:
        endpoint_service.check_port(port, "ports")
    if len(set(req.ports)) != len(req.ports):
        twice = next(p for p in req.ports if req.ports.count(p) > 1)
        raise InvalidInput(f"ports lists {twice} more than once; list each port once.", details={"field": "ports"})
    wanted = [(EndpointKind.SSH, endpoint_service.FIXED_PORTS[EndpointKind.SSH])] if req.ssh else []
    wanted += [(EndpointKind.PORT, port) for port in req.ports]
    if len(wanted) > endpoint_service.MAX_ENDPOINTS_PER_JOB:
        raise Refused(f"This job asks for {len(wanted)} endpoints (ssh and ports); at most "
                      f"{endpoint_service.MAX_ENDPOINTS_PER_JOB} are allowed per job.",
                      code="too_many_endpoints", details={"field": "ports", "max": endpoint_service.MAX_ENDPOINTS_PER_JOB})
    return wanted


def _over_quota(session: Session, vc: VirtualCluster, req: JobRequest, sku: str, gpus: int, cpu: float, memory: int, quota: int,
                total_gpus: int) -> Refused:
    """The 422 for a non-preemptible job above the VC's whole quota. It suggests marking the job
    preemptible only when the cluster's nodes could ever hold it as asked (enough nodes of the SKU
    open to the VC, with the cores and memory, in one IB domain for a gang); otherwise a
    preemptible job would wait forever (``no_matching_nodes`` / ``topology``), so it says why not."""
    rows = session.execute(sa.select(Node.gpus, Node.cpu, Node.memory_bytes, Node.ib_domain).where(
        Node.sku == sku, sa.or_(Node.vc.is_(None), Node.vc == vc.name))).all()
    fit = [r for r in rows if r.gpus >= gpus and r.cpu >= cpu and r.memory_bytes >= memory]
    message = f"VC {vc.name} has {quota} {sku} GPUs; this job asks {total_gpus}. Ask for at most {quota}"
    details: dict[str, Any] = {"field": "gpus", "quota": quota, "asked": total_gpus, "sku": sku}
    if req.type == JobType.DISTRIBUTED:
        per_domain: dict[str, int] = {}
        for r in fit:
            per_domain[r.ib_domain] = per_domain.get(r.ib_domain, 0) + 1
        most = len(fit) if req.ib_domain == "any" else max(per_domain.values(), default=0)
        runnable = most >= req.nodes
        if not runnable:
            where = "" if req.ib_domain == "any" or len(fit) < req.nodes else " in one IB domain"
            message += (f"; marking it preemptible would not help: only {most} {sku} node(s) open to VC {vc.name}{where} "
                        f"can hold one of its {req.nodes} parts.")
            details["nodes_available"] = most
    else:
        runnable = bool(fit)
        if not runnable:
            message += (f"; marking it preemptible would not help: no {sku} node open to VC {vc.name} has {gpus} GPUs, "
                        f"{cpu:g} cores and {memory} bytes.")
    if runnable:
        message += ", or mark it preemptible (it then runs on idle GPUs and may be preempted)."
    details["preemptible_could_run"] = runnable
    return Refused(message, code="quota_exceeds_vc", details=details)


def check_sizes(req: JobRequest) -> None:
    """The command and the environment within the limits above: a 422 naming the field and the limit."""
    def too_large(field_name: str, limit: int, what: str, size: int) -> Refused:
        return Refused(f"{field_name} is {size} {what}; the limit is {limit}. Put large settings in a file in your "
                       "home or the VC's storage and pass its path instead.",
                       code="field_too_large", details={"field": field_name, "limit": limit, "size": size})

    command_bytes = len(req.command.encode("utf-8", "surrogatepass"))
    if command_bytes > MAX_COMMAND_BYTES:
        raise too_large("command", MAX_COMMAND_BYTES, "bytes", command_bytes)
    if len(req.env) > MAX_ENV_VARS:
        raise too_large("env", MAX_ENV_VARS, "variables", len(req.env))
    total = 0
    for name, value in req.env.items():
        value_bytes = len(value.encode("utf-8", "surrogatepass"))
        if value_bytes > MAX_ENV_VALUE_BYTES:
            raise too_large(f"env.{name}", MAX_ENV_VALUE_BYTES, "bytes", value_bytes)
        total += len(name.encode("utf-8", "surrogatepass")) + value_bytes
    if total > MAX_ENV_BYTES:
        raise too_large("env", MAX_ENV_BYTES, "bytes (names and values together)", total)


# what counts against max_queued_jobs_per_user: jobs that wait to start
WAITING = (S.UNAPPROVED, S.QUEUED)
SUBMIT_WINDOW_S = 60


def abuse_limits(settings: Settings, vc: VirtualCluster) -> tuple[int, int]:
    """(queued jobs per user, submissions per user and minute) in ``vc``: the VC's own value, else the
    cluster default; 0 is no limit."""
    queued = vc.max_queued_jobs_per_user if vc.max_queued_jobs_per_user is not None else settings.max_queued_jobs_per_user
    rate = vc.max_submissions_per_minute if vc.max_submissions_per_minute is not None else settings.max_submissions_per_minute
    return queued, rate


def _check_abuse_limits(session: Session, settings: Settings, vc: VirtualCluster, user: User, now: dt.datetime) -> None:
    """Refuse a submission over the user's submissions per minute (429) or queued-jobs cap (422) in the VC.

    The submission counter is one atomic upsert whose row stays locked until this transaction ends, so
    the same user's parallel submissions to the VC (in any API worker) are counted and checked one
    after the other; without a rate limit the user's row is locked instead. A refused submission
    rolls back, so it does not count."""
    max_queued, max_rate = abuse_limits(settings, vc)
    if max_rate:
        count = limits_repo.hit(session, f"submit:{vc.id}:{user.id}", SUBMIT_WINDOW_S, now)
        if count.n > max_rate:
            wait_s = count.retry_after_s(SUBMIT_WINDOW_S, now)
            raise RateLimited(f"You may submit at most {max_rate} jobs a minute to VC {vc.name}, and have submitted "
                              f"{max_rate} in this minute; wait {wait_s} s and submit again.",
                              code="submission_rate_exceeded", retry_after_s=wait_s,
                              details={"max_per_minute": max_rate, "vc": vc.name})
    if not max_queued:
        return
    if not max_rate:
        limits_repo.lock(session, User.id, user.id, touch=User.created_at)
    waiting = session.scalar(sa.select(sa.func.count(Job.id)).where(
        Job.user_id == user.id, Job.vc_id == vc.id, Job.status.in_(WAITING))) or 0
    if waiting >= max_queued:
        raise Refused(f"You have {waiting} jobs waiting in VC {vc.name}; at most {max_queued} may wait per user. Let some "
                      "start, or kill some, then submit again.", code="queued_jobs_cap_exceeded",
                      details={"queued": int(waiting), "max": max_queued, "vc": vc.name})


@transactional(keep_loaded=True)  # every column is set here: the job is not read again, unless set_status changed it
def submit(session: Session, settings: Settings, principal: Principal, req: JobRequest,
           idempotency: tuple[str, str] | None = None) -> Job:
    """Validate, check the rules and write the job (queued, or unapproved over the user quota).
    ``idempotency``: (key, body hash) stored with the job in its transaction (``job_keeping.submit``)."""
    policy.require_vc_member(principal, req.vc)
    check_sizes(req)
    tags = clean_tags(list(req.tags))
    vc, user = vc_and_user(session, req.vc, principal.user_id)
    if vc is None or user is None:  # a cluster admin naming a VC that does not exist
        raise NotFound(f"VC {req.vc!r} does not exist.", code="vc_not_found", details={"field": "vc"})
    if req.type not in JOB_TYPES:
        raise InvalidInput(f"type must be one of {', '.join(JOB_TYPES)}.", details={"field": "type"})
    policy.check_priority(principal, vc.name, req.priority)
    policy.check_max_time(principal, vc.name, req.max_time_s, vc.max_job_time_s)
    wanted_endpoints = _submitted_endpoints(req)
    _check_identity_asks(req, vc, settings)
    # A CPU-only job that names no SKU takes the configured defaults: the node shapes (a query
    # over the nodes) are read only when a SKU must be chosen, checked or sized.
    needs_shapes = bool(req.sku) or req.gpus > 0 or req.type == JobType.DISTRIBUTED
    shapes = sku_shapes(session) if needs_shapes else {}
    sku = _choose_sku(req, vc.quota or {}, shapes)
    gpus, cpu, memory = _resources(req, sku, shapes.get(sku), settings)
    total_gpus = gpus * max(req.nodes, 1)
    quota = int((vc.quota or {}).get(sku, 0))
    if sku != CPU_SKU and not req.preemptible and total_gpus > quota:
        raise _over_quota(session, vc, req, sku, gpus, cpu, memory, quota, total_gpus)
    if req.type == JobType.INTERACTIVE and vc.max_interactive_gpus is not None and total_gpus > vc.max_interactive_gpus:
        raise Refused(f"VC {vc.name} allows at most {vc.max_interactive_gpus} GPUs for interactive jobs; this job asks {total_gpus}.",
                      code="interactive_cap_exceeded", details={"field": "gpus", "max": vc.max_interactive_gpus})
    spec = {"env": dict(req.env), "ports": list(req.ports), "ssh": req.ssh}
    if req.ib_domain:
        spec["ib_domain"] = req.ib_domain
    if req.ephemeral_storage_bytes is not None:
        spec["ephemeral_storage_bytes"] = req.ephemeral_storage_bytes
    if req.run_as_root:
        spec["run_as_root"] = True
    if req.type == JobType.INFERENCE:
        spec["min_replicas"], spec["max_replicas"] = req.min_replicas, max(req.max_replicas, req.min_replicas)
    now = utcnow()
    _check_abuse_limits(session, settings, vc, user, now)
    job = Job(
        # no name given: "<type>-<id>" below, never text of the command (which may start TOKEN=...)
        name=req.name or req.type,
        user=user, vc=vc, type=req.type, status=S.QUEUED, image=req.image,
        command=req.command, sku=None if sku == CPU_SKU and gpus == 0 else sku, gpus=gpus, nodes=req.nodes,
        cpu=cpu, memory_bytes=memory, priority=req.priority, preemptible=req.preemptible,
        max_retries=settings.default_max_retries if req.max_retries is None else req.max_retries,
        max_time_s=req.max_time_s, queue_time=now, submitted_at=now, spec=spec,
    )
    session.add(job)
    session.flush()
    if not req.name:
        job.name = f"{req.type}-{job.id}"
    for tag in tags:
        session.add(JobTag(job_id=job.id, tag=tag))
    if idempotency is not None:  # the unique (user, key): a parallel request with this key fails here or at commit
        session.add(IdempotencyKey(user_id=user.id, key=idempotency[0], body_hash=idempotency[1], job_id=job.id, created_at=now))
    job_repo.add_event(session, job.id, EventKind.TRANSITION, message="submitted", actor=principal.name)
    if wanted_endpoints:  # written with the job, in its transaction; nothing is read for them
        endpoint_service.add_for_submit(session, job.id, wanted_endpoints, principal.name)
    why = _needs_approval(session, job, vc.user_gpu_quota)
    if why:
        job_repo.set_status(session, job.id, S.QUEUED, S.UNAPPROVED, actor="policy", reason="user_quota", message=why,
                            values={"reason": "user_quota", "reason_detail": why[:512]})
        session.flush()
        session.expire(job)  # the status changed in SQL: the job is read again (after the commit)
    return job


def visible_vc_ids(principal: Principal) -> list[int] | None:
    """Ids of the VCs whose jobs ``principal`` may list; None: every VC (cluster admins)."""
    if principal.is_cluster_admin:
        return None
    return sorted(principal.vc_ids.values())  # resolved with the principal's roles: no query


def get(session: Session, principal: Principal, job_id: int) -> tuple[Job, policy.Visibility]:
    job = session.get(Job, job_id)
    return job, policy.require_visible(principal, job, job_id)  # type: ignore[return-value]


# -- reads shared by the API and the portal --------------------------------------------------------

KILLABLE = frozenset({S.UNAPPROVED, S.QUEUED, S.PAUSED, S.SCHEDULING, S.RUNNING, S.PAUSING})
PAUSABLE = frozenset({S.UNAPPROVED, S.QUEUED, S.SCHEDULING, S.RUNNING})
SCOPES = ("mine", "vc", "all")
COMMAND_PREVIEW_CHARS = 200  # of each command in an API job list (the whole job: GET /jobs/{id})


@dataclass(frozen=True)
class JobFilter:
    """What a job list shows. ``scope``: ``mine`` (the caller's own jobs), ``vc`` (the VCs the caller
    belongs to, even for a cluster admin), ``all`` (every job the caller may see).
    ``before``: the keyset boundary (a decoded cursor). ``command_preview_chars``: how much of each
    command to read (0: none)."""

    scope: str = "all"
    vc: str | None = None
    user: str | None = None
    statuses: tuple[JobStatus, ...] = ()
    job_type: str | None = None
    before: int | None = None
    oldest_first: bool = False
    limit: int = 50
    tag: str | None = None
    favourite: bool = False
    archived: str = "false"
    command_preview_chars: int = 0


@dataclass(frozen=True)
class JobListItem:
    job: Job
    visibility: policy.Visibility
    time_left_s: float | None
    tags: list[str]
    favourite: bool
    command_start: str = ""


@dataclass(frozen=True)
class JobPage:
    items: list[JobListItem]
    next_cursor: str | None


def decode_cursor(cursor: str) -> int:
    """A list cursor back to its boundary; InvalidInput for anything we did not hand out."""
    return job_repo.decode_cursor(cursor)


def list_jobs(session: Session, principal: Principal, wanted: JobFilter) -> JobPage:
    """One page of the jobs ``principal`` may see, newest first (or oldest), with tags and stars."""
    user_id: int | None = None
    if wanted.scope == "mine":
        visible, user_id = None, principal.user_id
    elif wanted.scope == "vc" and principal.is_cluster_admin:  # an admin's "my VCs": the VCs they belong to
        visible = sorted(principal.vc_ids.values())
    else:
        visible = visible_vc_ids(principal)
    vc_id = None
    empty = JobPage([], None)
    if wanted.vc:
        vc_id = cluster_repo.vc_id_named(session, wanted.vc)
        if vc_id is None or (visible is not None and vc_id not in visible) or (
                wanted.scope == "mine" and wanted.vc not in principal.vcs and not principal.is_cluster_admin):
            return empty
    if wanted.user and wanted.scope != "mine":
        user_id = cluster_repo.user_id_named(session, wanted.user)
        if user_id is None:
            return empty
    rows = job_repo.list_jobs(session, visible_vc_ids=visible, user_id=user_id, vc_id=vc_id, statuses=list(wanted.statuses),
                              job_type=wanted.job_type, boundary=wanted.before, oldest_first=wanted.oldest_first,
                              limit=wanted.limit + 1, tag=wanted.tag or None,
                              favourite_of=principal.user_id if wanted.favourite else None, archived=wanted.archived)
    page = rows[:wanted.limit]
    ids = [j.id for j in page]
    previews = job_repo.command_previews(session, ids, wanted.command_preview_chars) if wanted.command_preview_chars else {}
    tags = job_repo.tags_of(session, ids)
    starred = job_repo.favourites_of(session, principal.user_id, ids)
    items = [JobListItem(j, policy.job_visibility(principal, j) or policy.Visibility.PUBLIC,
                         time_left_s(j, j.vc.max_job_time_s), tags.get(j.id, []), j.id in starred, previews.get(j.id, ""))
             for j in page]
    return JobPage(items, job_repo.encode_cursor(page[-1].id) if len(rows) > wanted.limit else None)


@dataclass(frozen=True)
class JobRights:
    """What the reader may do to a job besides ``allowed_actions``: where the use-case would accept
    it (the portal shows a control only then; the use-case still checks)."""

    patch: bool = False  # jobs.patch: priority, max time, idle exemption of a job that has not ended
    tag: bool = False  # job_keeping.set_tags
    clone: bool = False  # job_keeping.spec: the body that submits it again
    archive: bool = False  # job_keeping.set_archived: the owner's ended job
    delete: bool = False  # job_keeping.delete: the owner's ended job
    open_endpoint: bool = False  # endpoints.open_endpoint: a job that has not ended and is not being killed


def rights(principal: Principal, job: Job) -> JobRights:
    full = policy.job_visibility(principal, job) is policy.Visibility.FULL
    owner_of_ended = job.user_id == principal.user_id and job.status in TERMINAL
    return JobRights(patch=full and job.status not in TERMINAL, tag=full, clone=full, archive=owner_of_ended,
                     delete=owner_of_ended, open_endpoint=full and endpoint_service.can_open(job))


@dataclass(frozen=True)
class JobDetail:
    """One job as its reader may see it. With ``Visibility.PUBLIC`` the lists are empty."""

    job: Job
    visibility: policy.Visibility
    attempts: list[JobAttempt]
    endpoints: list[endpoint_service.EndpointView]
    insights: list[JobInsight]
    events: list[JobEvent]
    tags: list[str]
    favourite: bool
    actions: tuple[str, ...]
    rights: JobRights = JobRights()

    @property
    def full(self) -> bool:
        return self.visibility is policy.Visibility.FULL

    @property
    def current_attempt(self) -> JobAttempt | None:
        return next((a for a in self.attempts if a.number == self.job.attempt), None)

    @property
    def placements(self) -> list[dict[str, Any]]:
        """Where the job runs now (``current_placements``)."""
        return current_placements(self.job, self.attempts)


def current_placements(job: Job, attempts: list[JobAttempt]) -> list[dict[str, Any]]:
    """The current attempt's placements while the job is active (it holds them), else none."""
    current = next((a for a in attempts if a.number == job.attempt), None)
    return current.placements if current is not None and job.status in ACTIVE else []


def allowed_actions(principal: Principal, job: Job) -> tuple[str, ...]:
    """The actions ``principal`` may take on ``job`` now (kill, pause, resume, approve): what
    ``kill``/``pause``/``resume``/``approve`` would accept, in that order."""
    if policy.job_visibility(principal, job) is not policy.Visibility.FULL:
        return ()
    actions = []
    if job.status in KILLABLE:
        actions.append("kill")
    if job.status in PAUSABLE:
        actions.append("pause")
    if job.status is S.PAUSED:
        actions.append("resume")
    if job.status is S.UNAPPROVED and principal.is_vc_admin(job.vc.name):
        actions.append("approve")
    return tuple(actions)


def detail(session: Session, principal: Principal, job_id: int, *, events: int = 0) -> JobDetail:
    """The job with its attempts, endpoints, insights, tags, star, allowed actions and (``events`` > 0)
    its newest events; NotFound outside the job's VCs."""
    from dlts.repositories import insight as insight_repo

    job, visibility = get(session, principal, job_id)
    full = visibility is policy.Visibility.FULL
    tags = job_repo.tags_of(session, [job.id]).get(job.id, [])
    starred = job.id in job_repo.favourites_of(session, principal.user_id, [job.id])
    if not full:
        return JobDetail(job, visibility, [], [], [], [], tags, starred, (), rights(principal, job))
    return JobDetail(job, visibility, job_repo.attempts_of(session, job.id), endpoint_service.views_of(session, job),
                     insight_repo.insights_of(session, job.id),
                     job_repo.latest_events(session, job.id, events) if events else [], tags, starred,
                     allowed_actions(principal, job), rights(principal, job))


def owner_lacks_ssh_key(session: Session, principal: Principal, job: Job, endpoints: list[endpoint_service.EndpointView]) -> bool:
    """Whether to tell the owner that nobody could log in by ssh: they have no key, and the job can
    still open an endpoint or has an ssh one."""
    return (job.user_id == principal.user_id and (endpoint_service.can_open(job) or any(e.kind == EndpointKind.SSH for e in endpoints))
            and not job_repo.has_ssh_key(session, principal.user_id))


def visible_jobs(session: Session, principal: Principal, ids: list[int]) -> list[tuple[int, Job | None]]:
    """(id, job) for each id, in order; None where the job is missing or outside ``principal``'s VCs."""
    found = job_repo.jobs_by_id(session, ids)
    return [(i, j if j is not None and policy.job_visibility(principal, j) is not None else None)
            for i, j in ((i, found.get(i)) for i in ids)]


def keeping_of(session: Session, principal: Principal, job: Job) -> tuple[list[str], bool]:
    """The job's tags, and whether ``principal`` starred it."""
    return (job_repo.tags_of(session, [job.id]).get(job.id, []),
            job.id in job_repo.favourites_of(session, principal.user_id, [job.id]))


def attempts_of(session: Session, job: Job) -> list[JobAttempt]:
    return job_repo.attempts_of(session, job.id)


def vc_names_for(session: Session, principal: Principal) -> list[str]:
    """The VCs ``principal`` picks from in forms and filters: every VC for a cluster admin."""
    return cluster_repo.all_vc_names(session) if principal.is_cluster_admin else list(principal.vcs)


def _load_for_change(session: Session, principal: Principal, job_id: int, action: str) -> Job:
    job = session.get(Job, job_id)
    policy.require_visible(principal, job, job_id)
    assert job is not None
    if action == "approve":
        policy.require_approve(principal, job)
    else:
        policy.require_manage(principal, job, action)
    return job


def _cas(session: Session, job: Job, target: JobStatus, actor: str, reason: str, values: dict[str, Any] | None = None,
         message: str | None = None) -> None:
    if not job_repo.set_status(session, job.id, job.status, target, actor=actor, reason=reason, values=values,
                               message=message[:1024] if message else None):
        raise WrongState(f"Job {job.id} changed state while you acted on it; reload and try again.", code="concurrent_change")


def kill(session: Session, principal: Principal, job_id: int, *, reason: str = EndReason.KILLED_BY_USER,
         detail: str | None = None) -> Job:
    """``reason``/``detail``: why, for a kill that is not a person's (the idle-job policy: ``idle_gpus``)."""
    detail = (detail or f"killed by {principal.name}")[:512]
    message = detail if reason != EndReason.KILLED_BY_USER else None
    with transaction(session):
        job = _load_for_change(session, principal, job_id, "kill")
        for attempt in range(3):
            if attempt:
                # the job manager moved it meanwhile (queued -> scheduling as it started): the
                # kill applies to its new state, not a 409 for the user to retry by hand
                session.refresh(job)
            if job.status is S.KILLING:
                return job  # already on its way out: asking twice is not an error
            if job.status in (S.UNAPPROVED, S.QUEUED, S.PAUSED):
                target, values = S.KILLED, {"finished_at": utcnow(), "reason": reason, "reason_detail": detail,
                                            "queue_position": None, "estimated_start": None, "forecast_start": None,
                                            "estimate_note": None}
            elif job.status in (S.SCHEDULING, S.RUNNING, S.PAUSING):
                target, values = S.KILLING, {"reason": reason, "reason_detail": detail}
            else:
                raise WrongState(f"Job {job.id} is {job.status.value}; only jobs that have not ended can be killed.",
                                 code="job_already_ended", details={"status": job.status.value})
            if job_repo.set_status(session, job.id, job.status, target, actor=principal.name, reason=reason,
                                   values=values, message=message[:1024] if message else None):
                break
        else:
            raise WrongState(f"Job {job.id} changed state while you acted on it; reload and try again.",
                             code="concurrent_change")
    session.refresh(job)
    return job


def pause(session: Session, principal: Principal, job_id: int, *, reason: str = EndReason.PAUSED_BY_USER,
          detail: str | None = None) -> Job:
    """``reason``/``detail``: why, for a pause that is not a person's (the idle-job policy: ``idle_gpus``,
    which the paused job keeps as its reason)."""
    with transaction(session):
        job = _load_for_change(session, principal, job_id, "pause")
        by_user = reason == EndReason.PAUSED_BY_USER
        if job.status in (S.UNAPPROVED, S.QUEUED):
            _cas(session, job, S.PAUSED, principal.name, reason,
                 {"reason": "paused" if by_user else reason, "reason_detail": None if by_user else (detail or "")[:512] or None,
                  "queue_position": None, "estimated_start": None, "forecast_start": None, "estimate_note": None},
                 None if by_user else detail)
        elif job.status in (S.SCHEDULING, S.RUNNING):
            _cas(session, job, S.PAUSING, principal.name, reason,
                 None if by_user else {"reason": reason, "reason_detail": (detail or "")[:512] or None}, None if by_user else detail)
        elif job.status in (S.PAUSING, S.PAUSED):
            return job
        else:
            raise WrongState(f"Job {job.id} is {job.status.value}; only waiting or running jobs can be paused.",
                             code="wrong_state", details={"status": job.status.value})
    session.refresh(job)
    return job


def resume(session: Session, principal: Principal, job_id: int) -> Job:
    """A resumed job re-enters approval: over the user quota it waits for a VC admin again."""
    with transaction(session):
        job = _load_for_change(session, principal, job_id, "resume")
        if job.status is not S.PAUSED:
            raise WrongState(f"Job {job.id} is {job.status.value}; only paused jobs can be resumed.",
                             code="wrong_state", details={"status": job.status.value})
        why = _needs_approval(session, job, job.vc.user_gpu_quota)
        if why:
            _cas(session, job, S.UNAPPROVED, principal.name, "user_quota", {"reason": "user_quota", "reason_detail": why[:512]})
        else:
            _cas(session, job, S.QUEUED, principal.name, "resumed", {"reason": None, "reason_detail": None})
    session.refresh(job)
    return job


def approve(session: Session, principal: Principal, job_id: int) -> Job:
    with transaction(session):
        job = _load_for_change(session, principal, job_id, "approve")
        if job.status is not S.UNAPPROVED:
            raise WrongState(f"Job {job.id} is {job.status.value}; only unapproved jobs can be approved.",
                             code="wrong_state", details={"status": job.status.value})
        # the scheduler no longer holds this job to the user quota (it reads jobs.approved_by)
        _cas(session, job, S.QUEUED, principal.name, "approved",
             {"reason": None, "reason_detail": f"approved by {principal.name}", "approved_by": principal.name[:64]})
    session.refresh(job)
    return job


@dataclass(frozen=True)
class LogRead:
    """A slice of an attempt's log (``dlts.logstore``): follow it with ``next_offset``."""

    job: Job
    attempt: int  # 0: the job has not run yet
    data: bytes
    offset: int
    next_offset: int
    size: int  # bytes the attempt has written so far (stored or dropped)
    dropped: int  # bytes of the middle dropped to keep the log within log_max_bytes

    @property
    def complete(self) -> bool:
        return is_ended(self.job) and self.attempt == self.job.attempt and self.next_offset >= self.size


def _log_attempt(session: Session, principal: Principal, job_id: int,
                 attempt: int | None) -> tuple[Job, int, JobAttempt | None]:
    """(job, attempt number (0: not run yet), the attempt's row: its ``log_key`` names the log)."""
    job = session.get(Job, job_id)
    policy.require_visible(principal, job, job_id)
    assert job is not None
    policy.require_manage(principal, job, "read the log of")
    number = attempt or job.attempt
    if job.attempt == 0:
        return job, 0, None
    if number < 1 or number > job.attempt:
        raise InvalidInput(f"Job {job.id} has attempts 1-{job.attempt}.", details={"field": "attempt"})
    row = session.scalar(sa.select(JobAttempt).where(JobAttempt.job_id == job.id, JobAttempt.number == number))
    return job, number, row


def _unsafe(job: Job, number: int, exc: logstore.UnsafeLog) -> InvalidInput:
    log.warning("job %s attempt %s: refusing to serve its log: %s", job.id, number, exc)
    return InvalidInput(f"Job {job.id} has no log DLTS can serve: its log file was replaced by something that "
                        "is not a plain file (a link?), so it is not read.", code="no_log")


def read_log(session: Session, settings: Settings, principal: Principal, job_id: int,
             attempt: int | None, offset: int, limit: int) -> LogRead:
    """``limit`` bytes of an attempt's log from ``offset`` (a position in all the attempt wrote; a
    line stands for the dropped middle). No log yet: empty. A log that is a link or not a plain
    file is never read: ``no_log``."""
    job, number, row = _log_attempt(session, principal, job_id, attempt)
    if number == 0:
        return LogRead(job, 0, b"", offset, offset, 0, 0)
    try:
        piece = None if row is None else \
            logstore.read_log(settings.effective_log_dir, job.id, number, offset, limit, key=row.log_key)
    except logstore.UnsafeLog as exc:
        raise _unsafe(job, number, exc) from None
    if piece is None:
        return LogRead(job, number, b"", offset, 0, 0, 0)
    return LogRead(job, number, piece.data, offset, piece.next_offset, piece.size, piece.dropped)


def download_log(session: Session, settings: Settings, principal: Principal, job_id: int,
                 attempt: int | None) -> tuple[Job, int, Iterator[bytes]]:
    """The attempt's whole stored log, its rotated parts in order with a line for the dropped
    middle: (job, attempt, chunks). ``no_log`` when it has none (or only an unsafe one)."""
    job, number, row = _log_attempt(session, principal, job_id, attempt)
    first = None
    log_key = row.log_key if row is not None else None
    if row is not None:
        try:
            first = logstore.read_log(settings.effective_log_dir, job.id, number, 0, LOG_DOWNLOAD_CHUNK, key=log_key)
        except logstore.UnsafeLog as exc:
            raise _unsafe(job, number, exc) from None
    if first is None or not first.size:
        raise InvalidInput(f"Job {job_id} has no log yet.", code="no_log")
    log_dir, job_key = settings.effective_log_dir, job.id

    def chunks() -> Iterator[bytes]:
        yield first.data
        offset = first.next_offset
        while True:
            try:
                piece = logstore.read_log(log_dir, job_key, number, offset, LOG_DOWNLOAD_CHUNK, key=log_key)
            except logstore.UnsafeLog as exc:  # replaced while it was being sent: stop there
                log.warning("job %s attempt %s: log download stopped: %s", job_key, number, exc)
                return
            if piece is None or not piece.data:
                return
            yield piece.data
            offset = piece.next_offset

    return job, number, chunks()


def is_ended(job: Job) -> bool:
    return job.status in TERMINAL


def time_left_s(job: Job, vc_limit_s: int | None, now: dt.datetime | None = None) -> float | None:
    limit = job.max_time_s or vc_limit_s
    if limit is None or job.started_at is None or job.status in TERMINAL:
        return None
    return max(0.0, limit - ((now or utcnow()) - job.started_at).total_seconds())


# -- change, batch, history ---------------------------------------------------------------------

def patch(session: Session, principal: Principal, job_id: int, changes: Mapping[str, int | bool | None]) -> Job:
    """Change ``priority`` and/or ``max_time_s`` (the scheduler reads them at its next tick), and
    ``idle_exempt`` (VC admins and cluster admins: the VC's idle-job policy leaves the job alone)."""
    with transaction(session):
        job = session.get(Job, job_id)
        policy.require_visible(principal, job, job_id)
        assert job is not None
        if not changes:
            raise InvalidInput("Send priority, max_time_s and/or idle_exempt.", details={"field": "body"})
        unknown = sorted(set(changes) - {"priority", "max_time_s", "idle_exempt"})
        if unknown:
            raise InvalidInput(f"unknown job setting {unknown[0][:40]!r}; settable: priority, max_time_s, idle_exempt.",
                               details={"field": unknown[0][:40]})
        policy.check_patch(principal, job, changes.get("priority"), changes.get("max_time_s"))
        if "idle_exempt" in changes:
            policy.require_idle_exempt(principal, job)
            if not isinstance(changes["idle_exempt"], bool):
                raise InvalidInput("idle_exempt must be true or false.", details={"field": "idle_exempt"})
        if job.status in TERMINAL:
            raise WrongState(f"Job {job.id} is {job.status.value}; an ended job cannot be changed.",
                             code="job_already_ended", details={"status": job.status.value})
        said = []
        values: dict[str, Any] = {}
        for key in ("priority", "max_time_s"):
            if key in changes and getattr(job, key) != changes[key]:
                said.append(f"{key} {getattr(job, key)} -> {changes[key]}")
                values[key] = changes[key]
        if "idle_exempt" in changes and bool((job.spec or {}).get("idle_exempt")) != changes["idle_exempt"]:
            spec = {k: v for k, v in (job.spec or {}).items() if k not in ("idle_exempt", "idle_exempt_by")}
            if changes["idle_exempt"]:
                spec |= {"idle_exempt": True, "idle_exempt_by": principal.name}
            said.append(f"idle_exempt {not changes['idle_exempt']} -> {changes['idle_exempt']}")
            values["spec"] = spec
        if values:
            # guarded on the status we read, so a job that ended meanwhile is not changed
            result = session.execute(sa.update(Job).where(Job.id == job.id, Job.status == job.status)
                                     .values(updated_at=utcnow(), **values).execution_options(synchronize_session=False))
            if rowcount(result) != 1:
                raise WrongState(f"Job {job.id} changed state while you acted on it; reload and try again.", code="concurrent_change")
            job_repo.add_event(session, job.id, EventKind.CHANGE, reason="patched", message="; ".join(said), actor=principal.name)
    if values:
        session.refresh(job)
    return job


BATCH_ACTIONS = {"kill": kill, "pause": pause, "resume": resume, "approve": approve}


@dataclass(frozen=True)
class BatchResult:
    id: int
    ok: bool
    http_status: int
    status: str | None = None
    code: str | None = None
    message: str | None = None


def batch(session: Session, principal: Principal, action: str, ids: list[int]) -> list[BatchResult]:
    """Apply ``action`` to each id in its own transaction; one bad id never fails the others."""
    from dlts.errors import DltsError

    if action not in BATCH_ACTIONS:
        raise InvalidInput(f"action must be one of {', '.join(BATCH_ACTIONS)}.", details={"field": "action"})
    results = []
    seen = set()
    for job_id in ids:
        if job_id in seen:
            continue  # asking twice in one batch is asking once
        seen.add(job_id)
        try:
            job = BATCH_ACTIONS[action](session, principal, job_id)
            results.append(BatchResult(job_id, True, 202, job.status.value))
        except DltsError as exc:  # its transaction rolled back
            results.append(BatchResult(job_id, False, exc.http_status, None, exc.code, exc.message))
    return results


PUBLIC_EVENT_KINDS = (EventKind.TRANSITION,)  # what the other members of a job's VC see
MESSAGE_KINDS = (EventKind.INSIGHT, EventKind.REPAIR)  # events shown as messages above a job's history


def events(session: Session, principal: Principal, job_id: int, *, before_id: int | None = None,
           limit: int = 50) -> tuple[policy.Visibility, list[JobEvent]]:
    """Newest first. Other members of the VC see transitions only, without messages or actors."""
    job = session.get(Job, job_id)
    visibility = policy.require_visible(principal, job, job_id)
    query = sa.select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id.desc()).limit(limit)
    if visibility is policy.Visibility.PUBLIC:
        query = query.where(JobEvent.kind.in_(PUBLIC_EVENT_KINDS))
    if before_id is not None:
        query = query.where(JobEvent.id < before_id)
    return visibility, list(session.scalars(query))


def attempts(session: Session, principal: Principal, job_id: int, *, after_number: int = 0,
             limit: int = 50) -> tuple[policy.Visibility, list[JobAttempt]]:
    """Oldest first (retry history reads forward)."""
    job = session.get(Job, job_id)
    visibility = policy.require_visible(principal, job, job_id)
    rows = session.scalars(sa.select(JobAttempt).where(JobAttempt.job_id == job_id, JobAttempt.number > after_number)
                           .order_by(JobAttempt.number).limit(limit))
    return visibility, list(rows)
