"""Helpers of the insight manager tests: a running job on the test node's GPUs, its utilisation
history as the node reports make it (services.accounting.record_utilisation at past minutes), and
the node's report through the API (services.nodes). A uniquely named module (not conftest)."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from dlts.models import Job, JobAttempt, JobStatus, utcnow
from dlts.services import accounting
from dlts.services import nodes as node_service

GiB = 2**30


def running_job(client, world, sessions, *, gpus=(0, 1), user="alice", started_min=120.0, **body) -> int:
    """Submit through the API, then what the job manager's launch records: attempt 1 on testnode."""
    payload = {"vc": "vision", "image": "debian:12", "command": "sleep 600", "gpus": len(gpus)} | body
    r = client.post("/api/v1/jobs", json=payload, headers=world.auth(user))
    assert r.status_code == 201, r.get_json()
    job_id = r.get_json()["id"]
    started = utcnow() - dt.timedelta(minutes=started_min)
    with sessions() as s:
        s.add(JobAttempt(job_id=job_id, number=1, started_at=started,
                         placements=[{"node": "testnode", "gpu_indices": list(gpus), "cpu": 2.0, "memory_bytes": GiB}]))
        s.execute(sa.update(Job).where(Job.id == job_id).values(status=JobStatus.RUNNING, attempt=1, started_at=started))
        s.commit()
    return job_id


def gpu_metrics(job_gpus: dict[int, tuple[int, float]], memory_used=GiB, memory_total=80 * GiB, cpu=None) -> dict:
    """Report metrics: index -> (job id, utilisation) for the GPUs of jobs."""
    metrics = {"gpus": [{"index": i, "job_id": str(job), "utilization_ratio": ratio, "memory_used_bytes": memory_used,
                         "memory_total_bytes": memory_total} for i, (job, ratio) in sorted(job_gpus.items())],
               "job_ids": sorted({str(job) for job, _ in job_gpus.values()})}
    if cpu is not None:
        metrics["jobs"] = [{"job_id": job, "pids": 1, "cpu_cores": cpu, "memory_bytes": GiB} for job in metrics["job_ids"]]
    return metrics


def history(sessions, minutes: int, metrics: dict, *, end: dt.datetime | None = None) -> None:
    """The node reported ``metrics`` once in each of the last ``minutes`` minutes up to ``end`` (now),
    ``end``'s own minute included: a report made after this, in the same minute or the next, continues
    the history without a gap (a history that stopped at the minute before ``end`` left one whenever
    the report came in the next minute, and a slow CI run saw idle GPUs as busy)."""
    end = end or utcnow()
    with sessions() as s:
        for k in range(minutes - 1, -1, -1):
            accounting.record_utilisation(s, "testnode", metrics, end - dt.timedelta(minutes=k))
        s.commit()


def node_token(sessions) -> str:
    with sessions() as s:
        return node_service.issue_node_token(s, "testnode")


def report(client, token: str, metrics: dict) -> None:
    body = {"schema_version": 1, "node": "testnode", "metrics": metrics}
    r = client.post("/api/v1/nodes/testnode/report", json=body, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.get_json()
