"""Job endpoints (ssh, Jupyter, VS Code, a port): open, list, close, and how a row reads. No Flask.

Rows hold what users asked for; the job manager exposes them for the job's current attempt and
records where they are reachable. This module only writes intent (a ``pending`` row, a ``closing``
row) and computes what a reader sees: an address belongs to one attempt of a running job, so a row
reads ``pending`` until the job manager has exposed it for the attempt that runs now, and ``closed``
once the job has ended (``endpoint_view``).

Jupyter and VS Code take a token as their password: it is made here, answered once, and only its
SHA-256 is stored (``secret_hash``), like API tokens.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dlts.errors import InvalidInput, NotFound, Refused, WrongState
from dlts.models import (
    TERMINAL,
    EndpointKind,
    EndpointStatus,
    EventKind,
    Job,
    JobEndpoint,
    JobStatus,
    SshKey,
    iso,
    utcnow,
)
from dlts.repositories import jobs as job_repo
from dlts.repositories import limits as limits_repo
from dlts.services import policy
from dlts.services.auth import Principal
from dlts.services.transaction import transactional

K = EndpointKind
ES = EndpointStatus
MAX_ENDPOINTS_PER_JOB = 8
MIN_PORT, MAX_PORT = 1024, 65535  # ports below 1024 are the system's (and ssh's 22)
# where DLTS starts each server inside the job's container
FIXED_PORTS = {K.SSH: 22, K.JUPYTER: 8888, K.VSCODE: 8080}
NAME_PATTERN = r"^[a-z][a-z0-9-]{0,31}$"
NAME_RE = re.compile(NAME_PATTERN)
KINDS = tuple(k.value for k in EndpointKind)
# what readers see as ``status``: the stored four, plus ``closed`` for endpoints of ended jobs
READ_STATUSES = ("pending", "ready", "failed", "closing", "closed")


@dataclass(frozen=True)
class EndpointView:
    id: int
    job_id: int
    kind: str
    name: str
    port: int
    status: str
    host: str | None
    host_port: int | None
    url: str | None
    message: str | None
    created_by: str
    created_at: str | None


def hash_secret(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _address_is_live(job: Job) -> bool:
    """Only a running job's current attempt is reachable; other states have no live address."""
    return job.status is JobStatus.RUNNING


def can_open(job: Job) -> bool:
    """A job may have endpoints opened until it ends or is being killed (it will not run again)."""
    return job.status not in TERMINAL and job.status is not JobStatus.KILLING


def read_status(endpoint: JobEndpoint, job: Job) -> str:
    # KILLING: the job will not run again, so nothing of it will be reachable again
    if not can_open(job):
        return "closed"
    if endpoint.status is ES.CLOSING:
        return "closing"
    if endpoint.status is ES.PENDING or endpoint.attempt != job.attempt or not _address_is_live(job):
        return "pending"
    value: str = endpoint.status.value
    return value


def _url(kind: EndpointKind, owner: str, host: str, host_port: int) -> str:
    shown = f"[{host}]" if ":" in host else host  # an IPv6 node address
    if kind is K.SSH:
        return f"ssh://{owner}@{shown}:{host_port}"
    return f"http://{shown}:{host_port}/"


def endpoint_view(endpoint: JobEndpoint, job: Job) -> EndpointView:
    """The endpoint as a reader sees it (API and portal): status, and an address only while it is current."""
    status = read_status(endpoint, job)
    # what the job manager recorded (address, message) holds for the attempt that runs now, never an older one
    current = status in (ES.READY, ES.FAILED, ES.PENDING) and endpoint.attempt == job.attempt and _address_is_live(job)
    addressed = current and status in (ES.READY, ES.FAILED)
    host = endpoint.host if addressed else None
    host_port = endpoint.host_port if addressed else None
    url = _url(endpoint.kind, job.user.name, host, host_port) if status == ES.READY and host and host_port else None
    return EndpointView(
        id=endpoint.id, job_id=endpoint.job_id, kind=endpoint.kind.value, name=endpoint.name, port=endpoint.port,
        status=status, host=host, host_port=host_port, url=url, message=endpoint.message if current else None,
        created_by=endpoint.created_by, created_at=iso(endpoint.created_at),
    )


def views_of(session: Session, job: Job) -> list[EndpointView]:
    """The endpoints of a job the caller may already manage (GET job with full visibility, the job page)."""
    return [endpoint_view(row, job) for row in _rows(session, job.id)]


def _rows(session: Session, job_id: int) -> list[JobEndpoint]:
    return list(session.scalars(sa.select(JobEndpoint).where(JobEndpoint.job_id == job_id).order_by(JobEndpoint.id)))


def _load(session: Session, principal: Principal, job_id: int, action: str, *, lock: bool = False) -> Job:
    if lock:  # one writer per job at a time (any worker, both databases): the per-job cap and the name checks stay exact
        limits_repo.lock(session, Job.id, job_id, touch=Job.updated_at)
    job = session.scalar(sa.select(Job).where(Job.id == job_id))
    policy.require_endpoints(principal, job, job_id, action)
    assert job is not None
    return job


def list_endpoints(session: Session, principal: Principal, job_id: int) -> list[EndpointView]:
    job = _load(session, principal, job_id, "see the endpoints of")
    return views_of(session, job)


# -- open ------------------------------------------------------------------------------------------

def _kind(kind: str) -> EndpointKind:
    try:
        return EndpointKind(kind)
    except ValueError:
        raise InvalidInput(f"kind must be one of {', '.join(KINDS)}; got {str(kind)[:32]!r}.",
                           details={"field": "kind"}) from None


def check_port(port: object, field: str = "port") -> int:
    """A port a job may expose: a whole number in 1024-65535."""
    if isinstance(port, bool) or not isinstance(port, int) or not MIN_PORT <= port <= MAX_PORT:
        raise InvalidInput(f"{field}: {str(port)[:16]} is not a port a job may expose; use {MIN_PORT}-{MAX_PORT} "
                           "(ports below 1024 belong to the system).", details={"field": field})
    return port


def _port_and_name(kind: EndpointKind, port: int | None, name: str | None) -> tuple[int, str]:
    if kind is K.PORT:
        if port is None:
            raise InvalidInput(f"kind port needs port: the port your job listens on ({MIN_PORT}-{MAX_PORT}).",
                               details={"field": "port"})
        check_port(port)
    elif port is not None:
        raise InvalidInput(f"port is only for kind port; {kind.value} always listens on port {FIXED_PORTS[kind]} "
                           "inside the job. Leave port out.", details={"field": "port"})
    else:
        port = FIXED_PORTS[kind]
    if name is None or name == "":
        name = f"port-{port}" if kind is K.PORT else kind.value
    elif not isinstance(name, str) or not NAME_RE.match(name):
        raise InvalidInput(f"name {str(name)[:40]!r} must be 1-32 characters: a lowercase letter, then lowercase "
                           "letters, digits or '-'.", details={"field": "name"})
    return port, name


def _check_room(rows: Sequence[JobEndpoint], job: Job, kind: EndpointKind, port: int, name: str) -> None:
    for row in rows:
        closing = " It is closing: open it again once it is gone (a few seconds)." if row.status is ES.CLOSING else ""
        if row.port == port:
            raise WrongState(f"Job {job.id} already has endpoint {row.name!r} ({row.kind.value}) on port {port}.{closing}",
                             code="endpoint_exists", details={"field": "port", "endpoint_id": row.id})
        if row.name == name:
            raise WrongState(f"Job {job.id} already has an endpoint named {name!r}; choose another name.{closing}",
                             code="endpoint_exists", details={"field": "name", "endpoint_id": row.id})
    if len(rows) >= MAX_ENDPOINTS_PER_JOB:
        n_closing = sum(1 for r in rows if r.status is ES.CLOSING)
        said = f" ({n_closing} of them closing: they go within seconds)" if n_closing else ""
        raise Refused(f"Job {job.id} has {len(rows)} endpoints{said}; at most {MAX_ENDPOINTS_PER_JOB} are allowed. "
                      "Close one first.", code="too_many_endpoints", details={"max": MAX_ENDPOINTS_PER_JOB})


def _require_ssh_key(session: Session, principal: Principal, job: Job) -> None:
    if session.scalar(sa.select(SshKey.id).where(SshKey.user_id == job.user_id).limit(1)) is not None:
        return
    who = "You have" if job.user_id == principal.user_id else f"The job's owner {job.user.name} has"
    raise Refused(f"{who} no SSH key, so nobody could log in to job {job.id}: add one with POST /api/v1/me/ssh-keys "
                  "or on the portal's SSH keys page, then open the ssh endpoint.",
                  code="no_ssh_key", details={"field": "kind", "user": job.user.name})


@transactional(keep_loaded=True)  # every column of the row is set here; the job is only read
def open_endpoint(session: Session, principal: Principal, job_id: int, kind: str, port: int | None = None,
                  name: str | None = None) -> tuple[EndpointView, str | None]:
    """Ask for an endpoint; the job manager exposes it while the job runs. Returns the view and, for
    jupyter and vscode, the token (its password): shown this once, only its hash is kept."""
    endpoint_kind = _kind(kind)
    port, name = _port_and_name(endpoint_kind, port, name)
    job = _load(session, principal, job_id, "open endpoints of", lock=True)
    if not can_open(job):
        raise WrongState(f"Job {job.id} is {job.status.value}; endpoints can only be opened on jobs that have not ended.",
                         code="job_ended", details={"status": job.status.value})
    _check_room(_rows(session, job.id), job, endpoint_kind, port, name)
    if endpoint_kind is K.SSH:
        _require_ssh_key(session, principal, job)
    token = secrets.token_urlsafe(24) if endpoint_kind in (K.JUPYTER, K.VSCODE) else None
    now = utcnow()
    row = JobEndpoint(job_id=job.id, kind=endpoint_kind, name=name, port=port, status=ES.PENDING, attempt=None,
                      host=None, host_port=None, message=None, secret_hash=hash_secret(token) if token else None,
                      created_by=principal.name, created_at=now, updated_at=now)
    session.add(row)
    job_repo.add_event(session, job.id, EventKind.ENDPOINT, reason="opened", actor=principal.name,
                       message=f"{endpoint_kind.value} endpoint {name!r} (port {port}) asked for")
    try:
        session.flush()
    except IntegrityError:  # another request took the port or name between our read and write (rolled back)
        raise WrongState(f"Job {job_id} already has an endpoint on port {port} or named {name!r}.",
                         code="endpoint_exists", details={"field": "name"}) from None
    return endpoint_view(row, job), token


def add_for_submit(session: Session, job_id: int, kinds_ports: Sequence[tuple[EndpointKind, int]], created_by: str) -> None:
    """The endpoint rows a submission asks for (``ssh: true``, ``ports``), in the caller's transaction:
    one multi-row INSERT (one round trip), nothing read."""
    now = utcnow()
    session.execute(sa.insert(JobEndpoint), [
        {"job_id": job_id, "kind": kind, "name": f"port-{port}" if kind is K.PORT else kind.value, "port": port,
         "status": ES.PENDING, "created_by": created_by, "created_at": now, "updated_at": now}
        for kind, port in kinds_ports])


# -- close -----------------------------------------------------------------------------------------

@transactional(keep_loaded=True)  # only two columns written, both set here
def close_endpoint(session: Session, principal: Principal, job_id: int, endpoint_id: int) -> EndpointView:
    """Mark an endpoint closing; the job manager removes it from the cluster and then the row."""
    job = _load(session, principal, job_id, "close endpoints of")
    row = session.get(JobEndpoint, endpoint_id)
    if row is None or row.job_id != job.id:
        raise NotFound(f"Job {job.id} has no endpoint {endpoint_id}; GET /api/v1/jobs/{job.id}/endpoints lists them.",
                       code="endpoint_not_found")
    if job.status in TERMINAL:
        raise WrongState(f"Job {job.id} is {job.status.value}: its endpoints are closed already, and go with the "
                         "job's history.", code="job_ended", details={"status": job.status.value})
    if row.status is not ES.CLOSING:
        # only these two columns are written (the job manager may be recording an address meanwhile)
        row.status, row.updated_at = ES.CLOSING, utcnow()
        job_repo.add_event(session, job.id, EventKind.ENDPOINT, reason="closed", actor=principal.name,
                           message=f"{row.kind.value} endpoint {row.name!r} (port {row.port}) closed")
    return endpoint_view(row, job)
