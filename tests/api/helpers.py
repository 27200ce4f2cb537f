"""Small builders for the API tests: principals, jobs in a given state, SSH keys, the envelope check."""

from __future__ import annotations

import itertools

import sqlalchemy as sa
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from dlts.models import Job, JobAttempt, JobStatus, User, utcnow
from dlts.repositories import jobs as job_repo
from dlts.services import jobs as job_service
from dlts.services.auth import principal_for

_names = itertools.count(1)


def principal(session, name: str):
    return principal_for(session, session.scalar(sa.select(User).where(User.name == name)))


def make_job(sessions, settings, user: str = "alice", vc: str = "vision", status: JobStatus = JobStatus.QUEUED,
             gpus: int = 0, **extra) -> int:
    """Submit through the service (as ``user``), then walk the lifecycle table to ``status``."""
    with sessions() as s:
        req = job_service.JobRequest(vc=vc, image="debian:12", command="sleep 1", gpus=gpus, **extra)
        job = job_service.submit(s, settings, principal(s, user), req)
        path = {
            JobStatus.QUEUED: [],
            JobStatus.UNAPPROVED: [JobStatus.UNAPPROVED],
            JobStatus.PAUSED: [JobStatus.PAUSED],
            JobStatus.RUNNING: [JobStatus.SCHEDULING, JobStatus.RUNNING],
            JobStatus.FINISHED: [JobStatus.SCHEDULING, JobStatus.RUNNING, JobStatus.FINISHED],
        }[status]
        current = job.status
        for target in path:
            values = {"finished_at": utcnow()} if target is JobStatus.FINISHED else {}
            if target is JobStatus.SCHEDULING:
                s.add(JobAttempt(job_id=job.id, number=1, placements=[]))
                values["attempt"] = 1
            assert job_repo.set_status(s, job.id, current, target, actor="test", values=values)
            current = target
        s.commit()
        return job.id


def ssh_public_key(kind: str = "ed25519", bits: int = 2048, comment: str = "me@laptop") -> str:
    if kind == "ed25519":
        key = ed25519.Ed25519PrivateKey.generate()
    elif kind == "rsa":
        key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    else:
        key = ec.generate_private_key(ec.SECP256R1())
    line = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return f"{line} {comment}" if comment else line


def job_count(sessions) -> int:
    with sessions() as s:
        return s.scalar(sa.select(sa.func.count(Job.id)))


def unique(prefix: str) -> str:
    return f"{prefix}{next(_names)}"


def assert_envelope(response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.get_data(as_text=True)[:500]
    error = response.get_json()["error"]
    assert set(error) == {"code", "message", "details"} and error["message"]
    if code:
        assert error["code"] == code, error
    assert "Traceback" not in response.get_data(as_text=True)
    return error
