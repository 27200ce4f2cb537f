"""The repair loop on the Kubernetes backend (the real client against the fake API server): a node
that leaves service is cordoned by the job manager's node sync with DLTS's ownership annotation,
its job is stopped and requeued at the head and restarts on another node, and once the node is
validated DLTS lifts its own cordon, never someone else's."""

from __future__ import annotations

import sqlalchemy as sa

from dlts.managers.repair import RepairManager
from dlts.models import JobStatus, Node, NodeState
from dlts.repair.settings import RepairSettings
from dlts.services import nodes as node_service

FELL_OFF = node_service.FindingIn(code="gpu_fell_off_bus", severity="critical", device="gpu5", action="reboot")


def report(sessions, name, findings=(), results=()):
    with sessions() as s:
        node = s.scalar(sa.select(Node).where(Node.name == name))
        metrics = {"gpu_count": 8, "gpus": [{"index": i, "lost": False, "row_remap_pending": 0} for i in range(8)]}
        return node_service.record_report(s, node, node_service.Report(
            node=name, agent_version="test", heartbeat_at=None, boot_id="b", findings=list(findings), metrics=metrics,
            collectors={"gpu": {"status": "ok", "errors": []}}, order_results=list(results)))


def state(sessions, name) -> NodeState:
    with sessions() as s:
        return s.scalar(sa.select(Node.state).where(Node.name == name))


def test_a_node_repair_cordons_with_dlts_ownership_and_uncordons_only_its_own(h, settings):
    repair = RepairManager(h.sessions, settings.model_copy(update={"repair": RepairSettings(quiet_period_s=0)}))
    h.api.store.patch("nodes", "", "n2", {"spec": {"unschedulable": True}}, "application/merge-patch+json")  # a human's
    job_id = h.submit(command="sleep infinity", gpus=8)
    h.tick()
    h.tick()
    first = h.attempts(job_id)[0].placements[0]["node"]
    before = h.job(job_id)
    assert before.status is JobStatus.RUNNING and first != "n2"
    report(h.sessions, first, [FELL_OFF])
    repair.run_once()
    assert state(h.sessions, first) is NodeState.DRAINING
    h.manager_tick()  # node sync cordons it; the drain's stop goes to the cluster
    node = h.api.store.get("nodes", "", first)
    assert node["spec"]["unschedulable"] is True and node["metadata"]["annotations"]["dlts.io/cordoned-by"] == "dlts"
    for _ in range(6):
        h.tick(3)
    job = h.job(job_id)
    attempts = h.attempts(job_id)
    assert attempts[0].end_reason == "node_repair" and attempts[0].spends_retry is False
    assert job.queue_time == before.queue_time and job.retries_used == 0
    assert attempts[-1].placements[0]["node"] not in (first, "n2")  # restarted on a healthy, uncordoned node
    repair.run_once()  # drained: the reboot is ordered
    orders = report(h.sessions, first)
    assert [o["action"] for o in orders] == ["reboot"]
    report(h.sessions, first, results=[node_service.OrderResultIn(id=orders[0]["id"], status="succeeded")])
    repair.run_once()
    report(h.sessions, first)
    repair.run_once()
    assert state(h.sessions, first) is NodeState.IN_SERVICE
    h.manager_tick()
    node = h.api.store.get("nodes", "", first)
    assert not node["spec"].get("unschedulable") and "dlts.io/cordoned-by" not in (node["metadata"].get("annotations") or {})
    assert h.api.store.get("nodes", "", "n2")["spec"]["unschedulable"] is True  # not ours: left alone
