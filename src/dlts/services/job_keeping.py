"""Jobs people keep and find, and retries that are safe: idempotent submission, tags, favourites,
archive, delete, and a job's spec to submit again. No Flask; each use-case owns its transaction.

Idempotent submission: ``submit`` with an ``Idempotency-Key`` writes (user, key, SHA-256 of the
canonical request, job id) in the job's own transaction. A retry with the same key and the same
request answers that job and makes none; the same key with another request is refused
(``idempotency_key_reused``). Two parallel requests with one key: the unique (user_id, key) lets one
commit; the other's INSERT fails (MariaDB: it waits for the first to commit, then meets the
duplicate; SQLite: its write waits for the database lock, then meets it), it rolls back and answers
the job the first one made.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dlts.config import Settings
from dlts.errors import Forbidden, InvalidInput, Refused, WrongState
from dlts.models import (
    TERMINAL,
    EventKind,
    IdempotencyKey,
    Job,
    JobAttempt,
    JobEndpoint,
    JobEvent,
    JobFavourite,
    JobInsight,
    JobTag,
    JobType,
    utcnow,
)
from dlts.repositories import jobs as job_repo
from dlts.services import jobs as job_service
from dlts.services import policy
from dlts.services.auth import Principal
from dlts.services.transaction import discard, rowcount, transaction, transactional

log = logging.getLogger(__name__)

HEADER = "Idempotency-Key"
KEY_PATTERN = re.compile(r"^[A-Za-z0-9._:~+/=-]{1,128}$", re.ASCII)
KEY_RULE = "1-128 characters: letters, digits and . _ : ~ + / = - (a UUID is a good key)"


# -- idempotent submission -------------------------------------------------------------------------

def check_key(key: object) -> str:
    if not isinstance(key, str) or not KEY_PATTERN.match(key):
        raise InvalidInput(f"The {HEADER} header must be {KEY_RULE}.", code="invalid_idempotency_key",
                           details={"field": HEADER, "header": HEADER})
    return key


def request_hash(req: job_service.JobRequest) -> str:
    """SHA-256 of the canonical request: every field of the validated request (defaults filled in,
    memory in bytes), keys sorted, so key order and spelled-out defaults do not matter."""
    data = dataclasses.asdict(req)
    data["env"] = dict(data["env"])
    data["ports"] = list(data["ports"])
    data["tags"] = sorted(job_service.clean_tags(list(data["tags"])))
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


@transactional
def _replay(session: Session, settings: Settings, principal: Principal, key: str, body_hash: str) -> Job | None:
    """The job an earlier request with ``key`` made; None when there was none (or it has expired)."""
    row = session.scalar(sa.select(IdempotencyKey).where(IdempotencyKey.user_id == principal.user_id,
                                                         IdempotencyKey.key == key))
    if row is None:
        return None
    if row.created_at < utcnow() - dt.timedelta(hours=settings.idempotency_key_ttl_h):
        # expired but not purged yet: it no longer stands for its job
        session.execute(sa.delete(IdempotencyKey).where(IdempotencyKey.id == row.id))
        return None
    if row.body_hash != body_hash:
        job_id = row.job_id
        raise Refused(f"This {HEADER} was already used for another request (job {job_id}); a retry must send the "
                      "same body. Use a new key for a new job.", code="idempotency_key_reused",
                      details={"field": HEADER, "header": HEADER, "job_id": job_id})
    return session.get(Job, row.job_id)


def submit(session: Session, settings: Settings, principal: Principal, req: job_service.JobRequest,
           key: str | None) -> tuple[Job, bool]:
    """(job, replayed): without a key a plain ``jobs.submit``; with one, the job an earlier request
    with this key and body made (replayed), or a new job stored with the key.

    Three transactions, one after the other (not one around them): the look-up of the key (which
    deletes an expired one), the submission, and after a submission that lost the key to a parallel
    request (its transaction rolled back) the look-up again."""
    if key is None:
        return job_service.submit(session, settings, principal, req), False
    check_key(key)
    body_hash = request_hash(req)
    found = _replay(session, settings, principal, key, body_hash)
    if found is not None:
        return found, True
    try:
        return job_service.submit(session, settings, principal, req, idempotency=(key, body_hash)), False
    except IntegrityError:
        found = _replay(session, settings, principal, key, body_hash)  # a parallel request with the key won
        if found is None:
            raise
        return found, True


def purge_expired_keys(session: Session, before: dt.datetime, limit: int) -> int:
    """Delete up to ``limit`` keys created before ``before`` (the janitor commits)."""
    ids = list(session.scalars(sa.select(IdempotencyKey.id).where(IdempotencyKey.created_at < before)
                               .order_by(IdempotencyKey.created_at).limit(limit)))
    if ids:
        session.execute(sa.delete(IdempotencyKey).where(IdempotencyKey.id.in_(ids)))
    return len(ids)


# -- tags, favourites, archive ---------------------------------------------------------------------

def _load(session: Session, principal: Principal, job_id: int) -> tuple[Job, policy.Visibility]:
    job = session.get(Job, job_id)
    visibility = policy.require_visible(principal, job, job_id)
    assert job is not None
    return job, visibility


def tags_of(session: Session, job_ids: list[int]) -> dict[int, list[str]]:
    return job_repo.tags_of(session, job_ids)


@transactional
def set_tags(session: Session, principal: Principal, job_id: int, tags: object) -> list[str]:
    """Replace the job's tags (owner, VC admin, cluster admin); an event of kind ``change`` says what changed."""
    job, _ = _load(session, principal, job_id)
    policy.require_manage(principal, job, "tag")
    wanted = job_service.clean_tags(tags)
    # the job's row first: two editors of one job's tags take turns (each sees the other's commit)
    job_repo.lock_job(session, job.id)
    current = job_repo.tags_of(session, [job.id]).get(job.id, [])
    added = [t for t in wanted if t not in current]
    removed = [t for t in current if t not in wanted]
    if removed:
        session.execute(sa.delete(JobTag).where(JobTag.job_id == job.id, JobTag.tag.in_(removed)))
    for tag in added:
        session.add(JobTag(job_id=job.id, tag=tag))
    if added or removed:
        said = "; ".join(part for part in (f"added {', '.join(added)}" if added else "",
                                           f"removed {', '.join(removed)}" if removed else "") if part)
        job_repo.add_event(session, job.id, EventKind.CHANGE, reason="tags", message=f"tags: {said}", actor=principal.name)
    return sorted(wanted)


@transactional
def set_favourite(session: Session, principal: Principal, job_id: int, on: bool) -> bool:
    """Star or unstar a job you can see (per user; starring twice is starring once)."""
    job, _ = _load(session, principal, job_id)
    if on:
        exists = session.scalar(sa.select(JobFavourite.job_id).where(JobFavourite.user_id == principal.user_id,
                                                                     JobFavourite.job_id == job.id))
        if exists is None:
            session.add(JobFavourite(user_id=principal.user_id, job_id=job.id, created_at=utcnow()))
            try:
                session.flush()
            except IntegrityError:  # a parallel star of the same job by the same user: theirs stands
                discard(session)
    else:
        session.execute(sa.delete(JobFavourite).where(JobFavourite.user_id == principal.user_id,
                                                      JobFavourite.job_id == job.id))
    return on


def favourites_of(session: Session, user_id: int, job_ids: list[int]) -> set[int]:
    return job_repo.favourites_of(session, user_id, job_ids)


def _require_owner_of_ended(principal: Principal, job: Job, action: str) -> None:
    if job.user_id != principal.user_id:
        raise Forbidden(f"Only the job's owner ({job.user.name}) may {action} job {job.id}.", code="requires_owner")
    if job.status not in TERMINAL:
        raise WrongState(f"Job {job.id} is {job.status.value}; only a job that has ended can be {action}d. Kill it "
                         "first, or wait for it to end.", code="job_not_ended", details={"status": job.status.value})


def set_archived(session: Session, principal: Principal, job_id: int, archived: bool) -> Job:
    """Archive (hide from the default lists) or unarchive an ended job of yours; usage still counts it."""
    with transaction(session):
        job, _ = _load(session, principal, job_id)
        _require_owner_of_ended(principal, job, "archive" if archived else "unarchive")
        changed = (job.archived_at is not None) != archived
        if changed:
            job.archived_at = utcnow() if archived else None
            job_repo.add_event(session, job.id, EventKind.CHANGE, reason="archived" if archived else "unarchived",
                               message="archived: hidden from the default job lists" if archived else "unarchived",
                               actor=principal.name)
    if changed:
        session.refresh(job)
    return job


def delete(session: Session, settings: Settings, principal: Principal, job_id: int) -> None:
    """Delete an ended job of yours: its row, events, attempts, endpoints, tags, favourites, idempotency
    keys and log files. The accounting rollup (usage_totals, usage_job_days) keeps its GPU time: usage
    reports still count it (without the job's name)."""
    with transaction(session):
        job, _ = _load(session, principal, job_id)
        _require_owner_of_ended(principal, job, "delete")
        delete_jobs(session, [job.id])
    remove_logs(settings.effective_log_dir, [job_id])


def delete_jobs(session: Session, ids: list[int]) -> dict[str, int]:
    """Delete ended jobs and every row that hangs on them (children first, each count known); the
    caller commits. Shared by the owner's delete and the janitor's purge."""
    counts = {
        "events": rowcount(session.execute(sa.delete(JobEvent).where(JobEvent.job_id.in_(ids)))) or 0,
        "attempts": rowcount(session.execute(sa.delete(JobAttempt).where(JobAttempt.job_id.in_(ids)))) or 0,
        "endpoints": rowcount(session.execute(sa.delete(JobEndpoint).where(JobEndpoint.job_id.in_(ids)))) or 0,
        "tags": rowcount(session.execute(sa.delete(JobTag).where(JobTag.job_id.in_(ids)))) or 0,
        "favourites": rowcount(session.execute(sa.delete(JobFavourite).where(JobFavourite.job_id.in_(ids)))) or 0,
        "idempotency_keys": rowcount(session.execute(sa.delete(IdempotencyKey).where(IdempotencyKey.job_id.in_(ids)))) or 0,
        "insights": rowcount(session.execute(sa.delete(JobInsight).where(JobInsight.job_id.in_(ids)))) or 0,
    }
    counts["jobs"] = rowcount(session.execute(sa.delete(Job).where(Job.id.in_(ids), Job.status.in_([s.value for s in TERMINAL]))
                                              .execution_options(synchronize_session=False))) or 0
    return counts


def remove_logs(log_dir: Path | None, ids: list[int]) -> None:
    if log_dir is None:
        return
    for job_id in ids:
        path = log_dir / str(job_id)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


# -- a job's spec, to submit again ----------------------------------------------------------------

def submit_spec(job: Job, tags: list[str]) -> dict[str, Any]:
    """The body of ``POST /jobs`` that makes this job again (what the submitter asked for, as the
    schema takes it). The name is left out when it was the default ``<type>-<id>``."""
    spec = job.spec or {}
    body: dict[str, Any] = {
        "vc": job.vc.name, "image": job.image, "command": job.command, "type": job.type, "gpus": job.gpus,
        "cpu": job.cpu, "memory": job.memory_bytes, "nodes": job.nodes, "preemptible": job.preemptible,
        "max_retries": job.max_retries, "max_time_s": job.max_time_s, "priority": job.priority,
        "env": dict(spec.get("env") or {}), "ports": list(spec.get("ports") or []), "ssh": bool(spec.get("ssh")),
        "run_as_root": bool(spec.get("run_as_root")), "tags": tags,
    }
    if job.name and job.name != f"{job.type}-{job.id}":
        body["name"] = job.name
    if job.sku:
        body["sku"] = job.sku
    for key in ("ib_domain", "ephemeral_storage_bytes"):
        if spec.get(key) is not None:
            body[key] = spec[key]
    if job.type == JobType.INFERENCE:
        body["min_replicas"], body["max_replicas"] = spec.get("min_replicas", 0), spec.get("max_replicas", 0)
    return body


def spec(session: Session, principal: Principal, job_id: int) -> dict[str, Any]:
    """``GET /jobs/{id}/spec``: owner, VC admin, cluster admin (the command and env are not public)."""
    job, _ = _load(session, principal, job_id)
    policy.require_manage(principal, job, "copy the spec of")
    return submit_spec(job, job_repo.tags_of(session, [job.id]).get(job.id, []))
