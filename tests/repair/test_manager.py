"""The repair manager's shell on the database: a whole cycle from findings to a node back in
service, jobs requeued at the head, escalation, RMA, budget, pause, dry run, lost heartbeats, and
crashes at every effect of every step (a fresh manager finishes the cycle exactly once).

Agent reports go through the real report service; the job manager's reconcile ends the attempts
the repair manager stopped. tests/repair/test_end_to_end.py does the same with the real agent over
HTTP."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa
from repair_kit import (
    DBE,
    Clock,
    Outbox,
    end_stopped_attempts,
    events,
    job_row,
    pending_orders,
    report,
    running_job,
)

from dlts.managers.notify import NotifyManager, backoff_s
from dlts.managers.repair import RepairManager
from dlts.models import (
    JobStatus,
    Node,
    NodeEvent,
    NodeOrder,
    NodeState,
    RepairCycle,
    RepairStep,
    utcnow,
)
from dlts.repair.settings import RepairSettings
from dlts.services import repair as repair_service
from dlts.services.notify import MailRenderer
from tests.smtp_server import with_notify

N = NodeState


@pytest.fixture
def rsettings(settings):
    # (no agent runs orders here: the GPU diagnostic has its own test, which answers for the agent)
    return settings.model_copy(update={"repair": RepairSettings(quiet_period_s=30, validation_timeout_s=600,
                                                                max_nodes_in_repair="2", flap_window_s=3600,
                                                                validation_diag="off")})


@pytest.fixture
def kit(world, sessions, rsettings, monkeypatch):
    clock, outbox = Clock(), Outbox(sessions)
    clock.patch(monkeypatch)  # reports, returns and cancels are stamped by the same clock as the manager's

    def manager(**kw):
        return RepairManager(sessions, rsettings, clock=clock, **kw)

    return manager, clock, outbox


def node_row(sessions, name="testnode") -> Node:
    with sessions() as s:
        n = s.scalar(sa.select(Node).where(Node.name == name))
        s.expunge(n)
        return n


def agent_does(sessions, results_status="succeeded", findings=(), metrics=None, node="testnode") -> list[str]:
    """The agent's next two reports: it receives the pending orders, then answers them."""
    orders = report(sessions, node, findings=findings, metrics=metrics)
    results = [{"id": o["id"], "action": o["action"], "status": results_status, "message": f"{o['action']} {results_status}"}
               for o in orders]
    report(sessions, node, findings=findings, metrics=metrics, results=results)
    return [o["action"] + ":" + o["target"] for o in orders]


def test_a_dbe_on_gpu3_runs_the_whole_cycle_and_requeues_the_job_at_the_head(kit, sessions, rsettings):
    manager, clock, outbox = kit
    victim = running_job(sessions, rsettings, "testnode", (3,))
    bystander = running_job(sessions, rsettings, "testnode", (0, 1))
    before = job_row(sessions, victim)
    report(sessions, findings=DBE)
    # one tick: quarantined (GPU 3 only), admitted by the budget, the job on GPU 3 told to stop
    manager().run_once()
    n = node_row(sessions)
    assert (n.state, n.repair_scope, n.unhealthy_gpus, n.schedulable) == (N.DRAINING, "gpu", [3], True)
    repair_events = events(sessions, victim, "repair")
    assert [e.message for e in repair_events] == [
        "node testnode GPU 3 has uncorrectable ECC errors; your job was stopped and requeued at the head of its queue "
        "(no retry spent)"]
    assert events(sessions, bystander, "repair") == []
    end_stopped_attempts(sessions, rsettings)
    after = job_row(sessions, victim)
    assert (after.status, after.reason, after.retries_used, after.queue_time, after.priority) == (
        JobStatus.QUEUED, "node_repair", 0, before.queue_time, before.priority)
    with sessions() as s:
        attempt = s.execute(sa.text("SELECT end_reason, spends_retry FROM job_attempts WHERE job_id = :j"), {"j": victim}).one()
    assert tuple(attempt) == ("node_repair", 0)
    manager().run_once()  # drained -> remediating, the reset ordered
    assert node_row(sessions).state is N.REMEDIATING
    assert agent_does(sessions) == ["reset_gpu:3"]
    assert job_row(sessions, bystander).status is JobStatus.RUNNING
    manager().run_once()
    assert node_row(sessions).state is N.VALIDATING
    report(sessions)  # healthy, but inside the quiet period
    manager().run_once()
    assert node_row(sessions).state is N.VALIDATING
    clock.advance(31)
    report(sessions)
    manager().run_once()
    n = node_row(sessions)
    assert (n.state, n.repair_scope, n.unhealthy_gpus) == (N.IN_SERVICE, None, [])
    with sessions() as s:
        cycle = s.scalar(sa.select(RepairCycle))
        steps = list(s.scalars(sa.select(RepairStep)))
        assert (cycle.outcome, cycle.open_node_id, cycle.gpus, cycle.rule) == ("returned", None, [3], "gpu_ecc_uncorrected/critical")
        assert [(st.remediation, st.result) for st in steps] == [("reset_gpu", "succeeded")]
        transitions = [(e.from_state, e.to_state) for e in s.scalars(sa.select(NodeEvent).where(NodeEvent.kind == "transition")
                                                                    .order_by(NodeEvent.id))]
    assert transitions == [("in_service", "quarantined"), ("quarantined", "draining"), ("draining", "remediating"),
                           ("remediating", "validating"), ("validating", "in_service")]
    assert outbox.templates() == ["node_out_of_service", "job_stopped_for_repair"]
    node_notice, job_notice = outbox.rows
    assert node_notice["to"] == ["admin@example.org"] and node_notice["context"]["node"] == "testnode"
    # the owner, then the VC's admins; the message is the job's `repair` event
    assert job_notice["to"] == ["alice@example.org", "vcadmin@example.org"]
    assert (job_notice["context"]["job_id"], job_notice["context"]["message"]) == (victim, repair_events[0].message)
    assert {r["status"] for r in outbox.rows} == {"queued"}  # sent later by managers.notify


def test_a_failed_reset_escalates_to_a_reboot_of_the_drained_node(kit, sessions, rsettings):
    manager, clock, outbox = kit
    other = running_job(sessions, rsettings, "testnode", (0,))
    report(sessions, findings=DBE)
    for _ in range(2):
        manager().run_once()
    assert agent_does(sessions, "failed", findings=DBE) == ["reset_gpu:3"]
    manager().run_once()  # failed -> next step (reboot) needs the whole node: drain it all
    n = node_row(sessions)
    assert (n.state, n.repair_scope) == (N.DRAINING, "node")
    assert [e.reason for e in events(sessions, other, "repair")] == ["node_repair"]
    end_stopped_attempts(sessions, rsettings)
    manager().run_once()
    assert agent_does(sessions, findings=()) == ["reboot:"]
    manager().run_once()
    clock.advance(31)
    report(sessions)
    manager().run_once()
    assert node_row(sessions).state is N.IN_SERVICE
    assert "node_escalated" in outbox.templates()
    with sessions() as s:
        assert [(st.number, st.remediation, st.result) for st in s.scalars(sa.select(RepairStep).order_by(RepairStep.id))] == [
            (0, "reset_gpu", "failed"), (1, "reboot", "succeeded")]


def test_every_repair_notice_renders_and_a_refused_smtp_connection_keeps_it_for_a_later_run(
        kit, sessions, rsettings, down_smtp_server):
    """A chain run to its end writes all four repair notices; each renders from templates/email with
    the context the repair manager gives (StrictUndefined: a missing key fails). The mail server is
    down at first: the notices stay in the outbox and the next run after the back-off sends them."""
    manager, _clock, outbox = kit
    victim = running_job(sessions, rsettings, "testnode", (3,))
    report(sessions, findings=DBE)
    manager().run_once()
    end_stopped_attempts(sessions, rsettings)
    manager().run_once()
    agent_does(sessions, "failed", findings=DBE)  # the reset fails: escalate to a reboot
    manager().run_once()
    manager().run_once()
    agent_does(sessions, "failed", findings=DBE)  # the reboot fails too: a ticket, a person
    manager().run_once()
    assert node_row(sessions).state is N.OUT_OF_SERVICE
    assert outbox.templates() == ["node_out_of_service", "job_stopped_for_repair", "node_escalated", "node_escalated",
                                  "node_needs_human"]
    renderer = MailRenderer()
    subjects = [renderer.render(r["template"], r["context"]).subject for r in outbox.rows]
    assert subjects[1].startswith(f"Job {victim} (") and subjects[1].endswith(") was stopped for a node repair")
    assert subjects[0].startswith("Node testnode left service")
    assert subjects[2].startswith("Node testnode escalated to reboot") and subjects[3].startswith("Node testnode escalated to ticket")
    assert subjects[4].startswith("Node testnode needs a person")

    now = [utcnow() + dt.timedelta(seconds=5)]
    notifier = NotifyManager(sessions, with_notify(rsettings, smtp_port=down_smtp_server.port), clock=lambda: now[0])
    first = notifier.run_once()
    assert first.sent == 0 and first.unreachable
    assert {r["status"] for r in outbox.rows} == {"queued"}
    down_smtp_server.start()
    now[0] += dt.timedelta(seconds=backoff_s(notifier.settings, 1) + 1)
    assert notifier.run_once().sent == 5
    assert {r["status"] for r in outbox.rows} == {"sent"}
    prefix = notifier.settings.subject_prefix
    got = {(m.message["Subject"].removeprefix(prefix), tuple(m.rcpt_tos)) for m in down_smtp_server.received}
    assert got == {(sub, tuple(r["to"])) for sub, r in zip(subjects, outbox.rows)}
    [job_mail] = [m for m in down_smtp_server.received if "alice@example.org" in m.rcpt_tos]
    assert ("node testnode GPU 3 has uncorrectable ECC errors; your job was stopped and requeued at the head of its queue"
            in " ".join(job_mail.body.split()))


def test_a_node_that_fails_validation_escalates(kit, sessions):
    manager, clock, _outbox = kit
    report(sessions, findings=DBE)
    for _ in range(2):
        manager().run_once()
    agent_does(sessions, findings=DBE)  # the reset "worked" but the ECC errors are still there
    manager().run_once()
    clock.advance(31)
    report(sessions, findings=DBE)
    manager().run_once()
    with sessions() as s:
        cycle = s.scalar(sa.select(RepairCycle))
        assert (cycle.step_index, cycle.state) == (1, "remediating")
        message = s.scalar(sa.select(NodeEvent.message).where(NodeEvent.to_state == "remediating", NodeEvent.from_state == "validating"))
    assert "validation failed" in message and "still present" in message


def test_a_remap_failure_goes_to_rma_and_only_a_human_returns_it(kit, sessions, world, client):
    manager, clock, outbox = kit
    report(sessions, findings=[{"code": "gpu_row_remap_failure", "severity": "critical", "device": "gpu2", "action": "ticket"}])
    manager().run_once()
    n = node_row(sessions)
    assert (n.state, n.unhealthy_gpus, n.schedulable) == (N.RMA, [2], True)  # the other GPUs keep serving
    assert outbox.templates()[-1] == "node_needs_human"
    for _ in range(3):
        manager().run_once()
    assert node_row(sessions).state is N.RMA
    r = client.post("/api/v1/nodes/testnode/return", json={"reason": "GPU 2 replaced"}, headers=world.auth("admin"))
    assert r.status_code == 200, r.get_json()
    assert node_row(sessions).state is N.VALIDATING
    clock.advance(31)
    report(sessions)
    manager().run_once()
    n = node_row(sessions)
    assert (n.state, n.unhealthy_gpus) == (N.IN_SERVICE, [])


def test_a_flapping_node_escalates_instead_of_repeating(kit, sessions):
    manager, clock, _outbox = kit

    def cycle_once(expect_action):
        report(sessions, findings=DBE)
        for _ in range(2):
            manager().run_once()
        assert agent_does(sessions) == [expect_action]
        manager().run_once()
        clock.advance(31)
        report(sessions)
        manager().run_once()
        assert node_row(sessions).state is N.IN_SERVICE

    cycle_once("reset_gpu:3")
    cycle_once("reboot:")  # the same fault within the flap window: the next step of the chain
    with sessions() as s:
        flaps = [c.flap for c in s.scalars(sa.select(RepairCycle).order_by(RepairCycle.id))]
    assert flaps == [False, True]


def test_with_a_budget_of_two_three_failing_nodes_leave_two_at_a_time(kit, sessions):
    manager, clock, _outbox = kit
    with sessions() as s:
        for name in ("n1", "n2", "n3"):
            s.add(Node(name=name, sku="demo-gpu", gpus=4, cpu=8, memory_bytes=2**34, ib_domain="x", backend="test",
                       labels={}, metrics={}))
        s.commit()
    report(sessions, "n2", findings=[{"code": "gpu_fell_off_bus", "severity": "critical", "device": "gpu1"}])
    report(sessions, "n1", findings=[{"code": "gpu_retired_pages_pending", "severity": "warning", "device": "gpu0"}])
    clock.advance(3601)  # the warning's hold-down
    report(sessions, "n1", findings=[{"code": "gpu_retired_pages_pending", "severity": "warning", "device": "gpu0"}])
    report(sessions, "n3", findings=[{"code": "gpu_lost", "severity": "critical", "device": "gpu2"}])
    report(sessions, "n2", findings=[{"code": "gpu_fell_off_bus", "severity": "critical", "device": "gpu1"}])
    report(sessions, "testnode")
    manager().run_once()
    states = {n: node_row(sessions, n).state for n in ("n1", "n2", "n3")}
    # budget 2 of demo-gpu: the critical ones first (nothing to drain: ordered at once), the warning waits
    assert states == {"n1": N.QUARANTINED, "n2": N.REMEDIATING, "n3": N.REMEDIATING}
    with sessions() as s:
        from dlts.models import User
        from dlts.services.auth import principal_for

        status = repair_service.status(s, principal_for(s, s.scalar(sa.select(User).where(User.name == "admin"))), None)
    assert [q["node"] for q in status["queue"]] == ["n1"]
    assert [b["in_repair"] for b in status["budget"]] == [2]
    manager().run_once()
    assert node_row(sessions, "n1").state is N.QUARANTINED
    for name in ("n2", "n3"):
        agent_does(sessions, node=name)
    manager().run_once()
    clock.advance(31)
    for name in ("n1", "n2", "n3"):
        report(sessions, name)
    manager().run_once()
    assert {n: node_row(sessions, n).state for n in ("n2", "n3")} == {"n2": N.IN_SERVICE, "n3": N.IN_SERVICE}
    assert node_row(sessions, "n1").state is N.REMEDIATING  # in the same tick: the budget freed, its turn


def test_a_lost_heartbeat_marks_the_node_lost_requeues_its_jobs_and_a_report_validates_it(kit, sessions, rsettings):
    manager, clock, _outbox = kit
    job = running_job(sessions, rsettings, "testnode", (1,))
    report(sessions)
    clock.advance(rsettings.node_lost_after_s + 1)
    manager().run_once()
    n = node_row(sessions)
    assert (n.state, n.schedulable) == (N.LOST, False)
    assert [e.reason for e in events(sessions, job, "repair")] == ["node_lost"]
    end_stopped_attempts(sessions, rsettings)
    assert (job_row(sessions, job).status, job_row(sessions, job).reason, job_row(sessions, job).retries_used) == (
        JobStatus.QUEUED, "node_lost", 0)
    with sessions() as s:
        assert s.scalar(sa.text("SELECT code FROM node_findings WHERE cleared_at IS NULL")) == "heartbeat_lost"
    manager().run_once()
    assert node_row(sessions).state is N.LOST
    report(sessions)  # the agent is back
    manager().run_once()
    assert node_row(sessions).state is N.VALIDATING
    clock.advance(31)
    report(sessions)
    manager().run_once()
    assert node_row(sessions).state is N.IN_SERVICE
    with sessions() as s:
        assert s.scalar(sa.text("SELECT count(*) FROM node_findings WHERE cleared_at IS NULL")) == 0


def test_a_lost_node_that_comes_back_with_a_fault_goes_into_that_faults_chain(kit, sessions, rsettings):
    manager, clock, outbox = kit
    job = running_job(sessions, rsettings, "testnode", (3,))
    report(sessions)
    clock.advance(rsettings.node_lost_after_s + 1)
    manager().run_once()
    assert node_row(sessions).state is N.LOST
    end_stopped_attempts(sessions, rsettings)
    report(sessions, findings=DBE)  # back, with uncorrectable ECC errors on GPU 3
    manager().run_once()  # quarantined into the DBE rule's chain, admitted, nothing to drain: the reset ordered
    n = node_row(sessions)
    assert (n.state, n.repair_scope, n.unhealthy_gpus) == (N.REMEDIATING, "gpu", [3])
    assert pending_orders(sessions)[0].action == "reset_gpu"
    with sessions() as s:
        cycles = [(c.kind, c.rule, c.outcome) for c in s.scalars(sa.select(RepairCycle).order_by(RepairCycle.id))]
        transitions = [(e.from_state, e.to_state) for e in s.scalars(
            sa.select(NodeEvent).where(NodeEvent.kind == "transition").order_by(NodeEvent.id))]
    assert cycles == [("rule", "gpu_ecc_uncorrected/critical", None)]
    assert transitions == [("in_service", "lost"), ("lost", "quarantined"), ("quarantined", "draining"),
                           ("draining", "remediating")]
    assert job_row(sessions, job).reason == "node_lost"
    agent_does(sessions)
    manager().run_once()
    clock.advance(31)
    report(sessions)
    manager().run_once()
    assert node_row(sessions).state is N.IN_SERVICE
    assert outbox.templates().count("node_out_of_service") == 2  # lost, then the fault


def test_a_fault_seen_while_a_lost_node_validates_goes_into_that_faults_chain(kit, sessions, rsettings):
    manager, clock, _outbox = kit
    report(sessions)
    clock.advance(rsettings.node_lost_after_s + 1)
    manager().run_once()
    report(sessions)  # back, healthy: validating
    manager().run_once()
    assert node_row(sessions).state is N.VALIDATING
    clock.advance(31)
    report(sessions, findings=DBE)  # the errors show up in the quiet period
    manager().run_once()
    assert node_row(sessions).state is N.REMEDIATING
    with sessions() as s:
        cycles = [(c.kind, c.outcome) for c in s.scalars(sa.select(RepairCycle).order_by(RepairCycle.id))]
    assert cycles == [("return", "fault"), ("rule", None)]


def test_pause_holds_new_actions_and_resume_goes_on(kit, sessions, world, client):
    manager, clock, _outbox = kit
    assert client.post("/api/v1/repair/pause", json={"reason": "maintenance"}, headers=world.auth("admin")).status_code == 200
    report(sessions, findings=DBE)
    manager().run_once()
    assert node_row(sessions).state is N.IN_SERVICE
    client.post("/api/v1/repair/pause", json={"node": "testnode"}, headers=world.auth("admin"))
    client.post("/api/v1/repair/resume", json={}, headers=world.auth("admin"))
    manager().run_once()
    assert node_row(sessions).state is N.IN_SERVICE and node_row(sessions).repair_paused  # its own pause holds
    client.post("/api/v1/repair/resume", json={"node": "testnode"}, headers=world.auth("admin"))
    manager().run_once()
    assert node_row(sessions).state is N.REMEDIATING  # nothing to drain: the reset is ordered
    client.post("/api/v1/repair/pause", json={}, headers=world.auth("admin"))
    agent_does(sessions)
    manager().run_once()  # in flight: the order's result is taken ...
    clock.advance(31)
    report(sessions)
    manager().run_once()  # ... and the validation returns the node
    assert node_row(sessions).state is N.IN_SERVICE


def test_dry_run_records_what_it_would_do_and_changes_nothing(kit, sessions, rsettings):
    _, clock, outbox = kit
    dry = rsettings.model_copy(update={"repair": rsettings.repair.model_copy(update={"dry_run": True})})
    report(sessions, findings=DBE)
    for _ in range(3):
        RepairManager(sessions, dry, clock=clock).run_once()
    assert pending_orders(sessions) == []
    assert node_row(sessions).state is N.IN_SERVICE and outbox.rows == []
    with sessions() as s:
        messages = list(s.scalars(sa.select(NodeEvent.message).where(NodeEvent.kind == "dry_run")))
    assert len(messages) == 1 and "in_service -> quarantined" in messages[0] and "reset_gpu -> reboot -> ticket" in messages[0]


EFFECTS = ["open_cycle", "transition", "stop_jobs", "start_step", "end_step", "notice", "commit"]


@pytest.mark.parametrize("effect", EFFECTS)
def test_a_crash_at_any_effect_of_any_step_finishes_the_cycle_exactly_once(kit, sessions, rsettings, effect):
    """Every tick runs in a fresh manager (a restart); the first time each step reaches ``effect``
    it crashes there. The cycle still ends once, with each order, stop and notice once."""
    manager, clock, outbox = kit
    job = running_job(sessions, rsettings, "testnode", (3,))
    crashed: set[tuple[str, str]] = set()

    class Crash(Exception):
        pass

    def fail(node, at):
        key = (node_row(sessions, node).state.value, at)
        if at == effect and key not in crashed:
            crashed.add(key)
            raise Crash(key)

    def tick():
        try:
            manager(fail_after=fail).run_once()
        except Crash:
            pass

    report(sessions, findings=DBE)
    for _ in range(40):
        tick()
        end_stopped_attempts(sessions, rsettings)
        orders = pending_orders(sessions)
        if orders:
            agent_does(sessions)
        state = node_row(sessions).state
        if state is N.VALIDATING:
            clock.advance(31)
            report(sessions)
        if state is N.IN_SERVICE and crashed and not orders:
            with sessions() as s:
                if s.scalar(sa.select(sa.func.count(RepairCycle.id))):
                    break
    assert crashed, f"no step reached {effect}"
    assert node_row(sessions).state is N.IN_SERVICE
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(RepairCycle.id))) == 1
        assert s.scalar(sa.select(RepairCycle.outcome)) == "returned"
        assert s.scalar(sa.select(sa.func.count(NodeOrder.id))) == 1
        assert s.scalar(sa.select(sa.func.count(RepairStep.id))) == 1
    assert len(events(sessions, job, "repair")) == 1
    assert outbox.templates().count("node_out_of_service") == 1
    assert job_row(sessions, job).status is JobStatus.QUEUED


def test_cancel_returns_the_node_and_withdraws_its_orders(kit, sessions, world, client):
    manager, _clock, _outbox = kit
    started = client.post("/api/v1/nodes/testnode/repairs", json={"steps": ["reset_gpu", "ticket"], "gpus": [1]},
                          headers=world.auth("admin"))
    assert started.status_code == 201, started.get_json()
    manager().run_once()
    assert [o.action for o in pending_orders(sessions)] == ["reset_gpu"]
    cycle_id = started.get_json()["id"]
    r = client.post(f"/api/v1/nodes/testnode/repairs/{cycle_id}/cancel", headers=world.auth("admin"))
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["outcome"] == "cancelled"
    assert node_row(sessions).state is N.IN_SERVICE and pending_orders(sessions) == []
    # the agent's late result is ignored; nothing starts again
    report(sessions, results=[{"id": "1", "action": "reset_gpu", "status": "succeeded"}])
    manager().run_once()
    assert node_row(sessions).state is N.IN_SERVICE
    listed = client.get("/api/v1/nodes/testnode/repairs", headers=world.auth("admin")).get_json()["items"]
    assert [(c["id"], c["outcome"], [st["result"] for st in c["steps"]]) for c in listed] == [(cycle_id, "cancelled", ["cancelled"])]


def test_metrics_count_states_cycles_durations_and_outcomes_per_remediation(kit, sessions):
    from prometheus_client import CollectorRegistry

    from dlts.managers.repair_metrics import RepairMetrics

    manager, clock, _outbox = kit
    registry = CollectorRegistry()
    registry.register(RepairMetrics(sessions))
    report(sessions, findings=DBE)
    manager().run_once()
    assert registry.get_sample_value("dlts_nodes", {"state": "remediating"}) == 1
    assert registry.get_sample_value("dlts_nodes", {"state": "in_service"}) == 0
    agent_does(sessions, "failed", findings=DBE)
    manager().run_once()
    assert registry.get_sample_value("dlts_repair_steps_total", {"remediation": "reset_gpu", "result": "failed"}) == 1
    agent_does(sessions)
    manager().run_once()
    clock.advance(31)
    report(sessions)
    manager().run_once()
    assert registry.get_sample_value("dlts_repair_cycles_total", {"outcome": "returned"}) == 1
    assert registry.get_sample_value("dlts_repair_steps_total", {"remediation": "reboot", "result": "succeeded"}) == 1
    assert registry.get_sample_value("dlts_repair_cycle_duration_seconds_count", {"outcome": "returned"}) == 1
    assert registry.get_sample_value("dlts_repair_cycle_duration_seconds_sum", {"outcome": "returned"}) >= 31
    assert registry.get_sample_value("dlts_repair_paused") == 0


def diag_settings(rsettings, **kw):
    return rsettings.model_copy(update={"repair": rsettings.repair.model_copy(update={"validation_diag": "auto", **kw})})


def to_validating(kit, sessions):
    manager, clock, _ = kit
    report(sessions, findings=DBE)
    for _ in range(2):
        manager().run_once()
    assert agent_does(sessions) == ["reset_gpu:3"]
    manager().run_once()
    assert node_row(sessions).state is N.VALIDATING
    clock.advance(31)
    report(sessions)


def test_the_validation_orders_dcgmi_diag_on_the_repaired_gpu_and_returns_when_it_passes(kit, sessions, rsettings):
    _manager, clock, _ = kit
    to_validating(kit, sessions)
    repair = RepairManager(sessions, diag_settings(rsettings), clock=clock)
    repair.run_once()
    repair.run_once()  # ordered once, not again while it runs
    assert node_row(sessions).state is N.VALIDATING
    with sessions() as s:
        orders = [(o.action, o.target, o.status) for o in s.scalars(sa.select(NodeOrder).where(NodeOrder.action == "gpu_diag"))]
        ordered = s.scalar(sa.select(NodeEvent.message).where(NodeEvent.reason == "diag_ordered"))
    assert orders == [("gpu_diag", "1:3", "pending")]  # GPU scope: only GPU 3, the others serve jobs
    assert ordered.startswith("ordered the GPU diagnostic (dcgmi diag -r 1) on GPU 3 (order ")
    assert agent_does(sessions) == ["gpu_diag:1:3"]
    repair.run_once()
    n = node_row(sessions)
    assert n.state is N.IN_SERVICE
    with sessions() as s:
        back = s.scalar(sa.select(NodeEvent.message).where(NodeEvent.to_state == "in_service"))
    assert back == "healthy after the quiet period and the GPU diagnostic passed (gpu_diag succeeded): back in service"


def test_a_failed_diagnostic_escalates_and_a_silent_one_times_out_and_is_cancelled(kit, sessions, rsettings):
    _manager, clock, _ = kit
    to_validating(kit, sessions)
    repair = RepairManager(sessions, diag_settings(rsettings, validation_diag_timeout_s=100), clock=clock)
    repair.run_once()
    assert agent_does(sessions, results_status="failed") == ["gpu_diag:1:3"]
    repair.run_once()
    with sessions() as s:
        cycle = s.scalar(sa.select(RepairCycle))
        message = s.scalar(sa.select(NodeEvent.message).where(NodeEvent.from_state == "validating"))
    assert (cycle.step_index, cycle.state) == (1, "remediating")  # the next step: a reboot
    assert message.startswith("validation failed: the GPU diagnostic: gpu_diag failed; next: reboot")
    # the reboot, a new validation, and this time the agent never answers the diagnostic
    assert agent_does(sessions) == ["reboot:"]
    repair.run_once()
    clock.advance(31)
    report(sessions)
    repair.run_once()
    report(sessions)  # the agent takes the order (sent) and says nothing
    clock.advance(101)
    report(sessions)
    repair.run_once()
    with sessions() as s:
        diag = s.scalars(sa.select(NodeOrder).where(NodeOrder.action == "gpu_diag").order_by(NodeOrder.id)).all()
        # a reboot needs the whole node: its validation diagnoses every GPU (no GPU list)
        assert [(o.target, o.status) for o in diag] == [("1:3", "failed"), ("1", "cancelled")]
        message = s.scalar(sa.select(NodeEvent.message).where(NodeEvent.from_state == "validating").order_by(NodeEvent.id.desc()))
    assert "the GPU diagnostic had no result after 100 s" in message


def test_required_without_dcgmi_fails_the_validation(kit, sessions, rsettings):
    _manager, clock, _ = kit
    to_validating(kit, sessions)
    repair = RepairManager(sessions, diag_settings(rsettings, validation_diag="required"), clock=clock)
    repair.run_once()
    assert agent_does(sessions, results_status="skipped") == ["gpu_diag:1:3"]
    repair.run_once()
    with sessions() as s:
        message = s.scalar(sa.select(NodeEvent.message).where(NodeEvent.from_state == "validating"))
    assert "the GPU diagnostic is required (repair.validation_diag)" in message
