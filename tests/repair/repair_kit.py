"""Builders for the repair tests: the notifier's outbox as rows, a clock that can jump, node reports
through the real service, and jobs placed on a node's GPUs."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from dlts.models import (
    Job,
    JobAttempt,
    JobEvent,
    JobStatus,
    Node,
    NodeOrder,
    OutboxMessage,
    User,
    utcnow,
)
from dlts.repositories import jobs as job_repo
from dlts.services import nodes as node_service


@dataclass
class Outbox:
    """The real notifier's outbox as the repair manager left it (``dlts.services.notify.enqueue``
    rows written in the repair decision's transaction), oldest first."""

    sessions: Any

    @property
    def rows(self) -> list[dict[str, Any]]:
        with self.sessions() as s:
            return [{"template": r.template, "to": list(r.recipients), "context": dict(r.context), "dedup_key": r.dedup_key,
                     "status": r.status.value} for r in s.scalars(sa.select(OutboxMessage).order_by(OutboxMessage.id))]

    def templates(self) -> list[str]:
        return [r["template"] for r in self.rows]


class Clock:
    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds

    def now(self):
        from dlts.managers.repair import from_epoch

        return from_epoch(self())

    def patch(self, monkeypatch) -> None:
        """Stamp the report service's and the repair services' rows with this clock."""
        for module in ("dlts.services.nodes", "dlts.services.repair", "dlts.repositories.repair"):
            monkeypatch.setattr(f"{module}.utcnow", self.now)


def healthy_metrics(gpus: int = 4, remap_pending: tuple[int, ...] = ()) -> dict[str, Any]:
    return {"gpu_count": gpus, "driver_version": "550.127.05",
            "gpus": [{"index": i, "lost": False, "row_remap_pending": int(i in remap_pending)} for i in range(gpus)]}


def report(sessions, node: str = "testnode", findings=(), metrics: dict | None = None, results=(),
           gpu_status: str = "ok") -> list[dict]:
    """What the agent's report does to the database (services.nodes.record_report), without HTTP."""
    with sessions() as s:
        row = s.scalar(sa.select(Node).where(Node.name == node))
        parsed = node_service.Report(
            node=node, agent_version="test", heartbeat_at=None, boot_id="b1",
            findings=[node_service.FindingIn(code=f["code"], severity=f["severity"], device=f.get("device"),
                                             action=f.get("action"), evidence=f.get("evidence", {})) for f in findings],
            metrics=metrics if metrics is not None else healthy_metrics(row.gpus),
            collectors={"gpu": {"status": gpu_status, "errors": []}},
            order_results=[node_service.OrderResultIn(id=r["id"], status=r["status"], message=r.get("message", ""),
                                                      raw=r) for r in results])
        return node_service.record_report(s, row, parsed)


DBE = [{"code": "gpu_ecc_uncorrected", "severity": "critical", "device": "gpu3", "action": "reset_gpu",
        "evidence": {"message": "2 uncorrected ECC errors"}},
       {"code": "gpu_xid", "severity": "critical", "device": "gpu3", "action": "reset_gpu", "evidence": {"xid": 48}}]


def running_job(sessions, settings, node: str, gpus: tuple[int, ...], user: str = "alice", preemptible: bool = False,
                vc: str = "vision", **extra) -> int:
    """A job submitted through the service and walked to running on ``gpus`` of ``node``."""
    from dlts.services import jobs as job_service
    from dlts.services.auth import principal_for

    with sessions() as s:
        who = principal_for(s, s.scalar(sa.select(User).where(User.name == user)))
        req = job_service.JobRequest(vc=vc, image="debian:12", command="sleep 1", gpus=len(gpus), preemptible=preemptible,
                                     **extra)
        job = job_service.submit(s, settings, who, req)
        assert job_repo.set_status(s, job.id, job.status, JobStatus.SCHEDULING, actor="test", values={"attempt": 1})
        s.add(JobAttempt(job_id=job.id, number=1, started_at=utcnow(),
                         placements=[{"node": node, "gpu_indices": list(gpus), "cpu": 1.0, "memory_bytes": 2**30, "replica": 0}]))
        assert job_repo.set_status(s, job.id, JobStatus.SCHEDULING, JobStatus.RUNNING, actor="test",
                                   values={"started_at": utcnow()})
        s.commit()
        return job.id


def pending_orders(sessions, node: str = "testnode") -> list[NodeOrder]:
    with sessions() as s:
        node_id = s.scalar(sa.select(Node.id).where(Node.name == node))
        return list(s.scalars(sa.select(NodeOrder).where(NodeOrder.node_id == node_id,
                                                         NodeOrder.status.in_(["pending", "sent"])).order_by(NodeOrder.id)))


class EndingBackend:
    """The job manager's backend for DB-level tests: holds no attempts, so a stopped attempt is
    simply over (what the local backend reports once the process has exited)."""

    name = "test"

    def observe(self):
        return []

    def forget(self, job_id, attempt):
        pass

    def terminate(self, job_id, attempt, grace_s):
        pass

    def nodes(self):
        return []


def end_stopped_attempts(sessions, settings) -> None:
    """Run the job manager's reconcile as if the backend's processes stopped when asked: attempts
    the repair manager stopped have ended (and are requeued), every other one still runs."""
    from dlts.backends.base import Observed, RunPhase
    from dlts.jobmanager import JobManager
    from dlts.models import ACTIVE

    manager = JobManager(sessions, EndingBackend(), settings)
    with sessions() as s:
        running = s.execute(sa.select(JobAttempt.job_id, JobAttempt.number).join(
            Job, sa.and_(Job.id == JobAttempt.job_id, Job.attempt == JobAttempt.number)).where(
            Job.status.in_(ACTIVE), JobAttempt.stop_requested.is_(None))).all()
        observed = {(j, a): Observed(j, a, RunPhase.RUNNING, started_at=time.time()) for j, a in running}
        manager.reconcile(s, observed)


def job_row(sessions, job_id: int) -> Job:
    with sessions() as s:
        job = s.get(Job, job_id)
        s.expunge(job)
        return job


def events(sessions, job_id: int, kind: str | None = None) -> list[JobEvent]:
    with sessions() as s:
        query = sa.select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
        if kind is not None:
            query = query.where(JobEvent.kind == kind)
        rows = list(s.scalars(query))
        s.expunge_all()
        return rows
