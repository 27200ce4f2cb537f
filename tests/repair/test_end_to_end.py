"""End to end: the real node agent (fake NVML) reports to the real API over HTTP; the job manager
(local backend, real processes) and the repair manager run their passes; jobs are submitted and
read through the API. Each test is one operator story from docs/repair.md."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import requests
import sqlalchemy as sa
from repair_agents import MANAGERS, drive, four_gpus
from repair_kit import Outbox

from dlts.managers.notify import NotifyManager
from dlts.managers.repair import RepairManager
from dlts.models import JobAttempt, Node, NodeOrder, NodeState, RepairCycle, RepairStep
from dlts.repair.settings import RepairSettings
from tests.smtp_server import with_notify

N = NodeState
# (an agent is lost after 30 s of silence: a busy machine can starve its thread for seconds; the
# lost-heartbeat story shortens it to 3 s)
REPAIR = RepairSettings(interval_s=0.2, quiet_period_s=1.0, validation_timeout_s=60, lost_after_s=30.0,
                        max_nodes_in_repair="2", flap_window_s=3600)


@pytest.fixture
def repair(live, sessions, settings, request):
    lost_after = getattr(request, "param", REPAIR.lost_after_s)
    manager = RepairManager(sessions, settings.model_copy(update={"repair": REPAIR.model_copy(update={"lost_after_s": lost_after})}))
    manager.outbox = Outbox(sessions)  # the real notifier's rows, written in the repair transactions
    return manager


def api(live, world, method, path, user="admin", **kw):
    r = requests.request(method, f"{live.url}/api/v1{path}", headers=world.auth(user), timeout=10, **kw)
    assert r.status_code < 400, r.text
    return r.json()


def node_state(sessions, name="testnode") -> NodeState:
    with sessions() as s:
        return s.scalar(sa.select(Node.state).where(Node.name == name))


@pytest.fixture
def placed(sessions):
    def on_gpus(ids):
        with sessions() as s:
            out = {}
            for job_id in ids:
                attempt = s.scalar(sa.select(JobAttempt).where(JobAttempt.job_id == job_id).order_by(JobAttempt.number.desc()))
                out[attempt.placements[0]["gpu_indices"][0]] = job_id
            return out
    return on_gpus


def start_four(live, world, placed):
    ids = [api(live, world, "POST", "/jobs", user="alice", json={"vc": "vision", "image": "debian:12", "command": "sleep 600",
                                                                 "gpus": 1, "name": f"train-{i}"})["id"] for i in range(4)]
    deadline = time.monotonic() + 30
    while not all(api(live, world, "GET", f"/jobs/{i}", user="alice")["status"] == "running" for i in ids):
        assert time.monotonic() < deadline, [(j["status"], j["reason"], j.get("reason_detail"),
                                              requests.get(f"{live.url}/api/v1/jobs/{j['id']}/log", headers=world.auth("alice"),
                                                           timeout=10).text[-500:])
                                             for j in (api(live, world, "GET", f"/jobs/{i}", user="alice") for i in ids)]
        live.tick()
        time.sleep(0.1)
    return placed(ids)


def test_a_dbe_on_gpu3_runs_the_whole_cycle_with_the_real_agent(live, world, sessions, settings, repair, start_agent, placed,
                                                                 smtp_server):
    jobs = start_four(live, world, placed)
    victim = jobs[3]
    before = api(live, world, "GET", f"/jobs/{victim}", user="alice")
    agent = start_agent("testnode", four_gpus("dbe-gpu3"))
    drive(live, repair, lambda: node_state(sessions) is not N.IN_SERVICE, what="the DBE to quarantine GPU 3")
    node = api(live, world, "GET", "/nodes/testnode")
    assert node["repair"]["gpus"] == [3] and node["unhealthy_gpus"] == [3] and node["schedulable"] is True
    # the job on GPU 3 is stopped and requeued at the head; the jobs on GPUs 0-2 keep running
    job = drive(live, repair, lambda: (j := api(live, world, "GET", f"/jobs/{victim}", user="alice"))["status"] == "queued" and j,
                what="the job on GPU 3 to be requeued")
    assert (job["retries_used"], job["priority"], job["queue_time"]) == (0, before["priority"], before["queue_time"])
    attempts = api(live, world, "GET", f"/jobs/{victim}/attempts", user="alice")["items"]
    assert [(a["end_reason"], a["spends_retry"]) for a in attempts] == [("node_repair", False)]
    events = api(live, world, "GET", f"/jobs/{victim}/events", user="alice")["items"]
    repair_events = [e for e in events if e["kind"] == "repair"]
    assert [e["message"] for e in repair_events] == [
        "node testnode GPU 3 has uncorrectable ECC errors; your job was stopped and requeued at the head of its queue "
        "(no retry spent)"]
    for gpu in (0, 1, 2):
        assert api(live, world, "GET", f"/jobs/{jobs[gpu]}", user="alice")["status"] == "running"
    # the agent resets GPU 3 (an order in its report response), validation passes, the GPU returns
    drive(live, repair, lambda: node_state(sessions) is N.IN_SERVICE, agents=[agent], what="the node back in service")
    assert agent.lib.resets == [3]
    assert any("--gpu-reset" in c for c in agent.driver.commands)
    # the validation's GPU diagnostic ran on GPU 3 only (the others kept their jobs) and passed
    assert [c[1:] for c in agent.driver.commands if c[1:2] == ["diag"]] == [["diag", "-r", "1", "-j", "-i", "3"]]
    cycles = api(live, world, "GET", "/nodes/testnode/repairs")["items"]
    assert [(c["outcome"], c["scope"], [s["remediation"] for s in c["steps"]], [s["result"] for s in c["steps"]])
            for c in cycles] == [("returned", "gpu", ["reset_gpu"], ["succeeded"])]
    # GPU 3 is schedulable again: the requeued job starts there (it kept its queue time: first in line)
    job = drive(live, repair, lambda: (j := api(live, world, "GET", f"/jobs/{victim}", user="alice"))["status"] == "running" and j,
                what="the requeued job to run again")
    assert placed([victim]) == {3: victim} and job["queue_time"] == before["queue_time"]
    templates = repair.outbox.templates()
    assert templates.count("node_out_of_service") == 1 and templates.count("job_stopped_for_repair") == 1
    # the notifier (managers.notify, as `dlts managers` runs it) mails them over SMTP
    notifier = NotifyManager(sessions, with_notify(settings, smtp_port=smtp_server.port))
    assert notifier.run_once().sent == 2
    mails = {m.message["Subject"].removeprefix(notifier.settings.subject_prefix): m for m in smtp_server.received}
    [left] = [m for subject, m in mails.items() if subject.startswith("Node testnode left service")]
    assert left.rcpt_tos == ["admin@example.org"] and "gpu_ecc_uncorrected (critical) on gpu3" in left.body
    stopped = mails[f"Job {victim} ({before['name']}) was stopped for a node repair"]
    assert stopped.rcpt_tos == ["alice@example.org", "vcadmin@example.org"]  # the owner and the VC's admins
    assert ("node testnode GPU 3 has uncorrectable ECC errors; your job was stopped and requeued at the head of its "
            "queue (no retry spent)") in " ".join(stopped.body.split())
    assert notifier.run_once().sent == 0  # each notice once


def test_a_remap_failure_goes_to_rma_and_the_other_gpus_keep_serving(live, world, sessions, settings, repair, start_agent,
                                                                      placed, smtp_server):
    lib = four_gpus("healthy-8xa100")
    lib.gpus[2].remapped_rows = (3, 9, 0, 1)
    start_agent("testnode", lib)
    drive(live, repair, lambda: node_state(sessions) is N.RMA, what="rma")
    node = api(live, world, "GET", "/nodes/testnode")
    assert (node["unhealthy_gpus"], node["schedulable"]) == ([2], True)
    assert repair.outbox.templates()[-1] == "node_needs_human"
    notifier = NotifyManager(sessions, with_notify(settings, smtp_port=smtp_server.port))
    notifier.run_once()
    [human] = [m for m in smtp_server.received if "needs a person" in m.message["Subject"]]
    assert human.rcpt_tos == ["admin@example.org"] and "dlts node return testnode" in human.body
    jobs = [api(live, world, "POST", "/jobs", user="alice", json={"vc": "vision", "image": "debian:12", "command": "sleep 600",
                                                                  "gpus": 1})["id"] for _ in range(4)]
    deadline = time.monotonic() + 30  # three start (their inits may be slow on a busy machine); one waits
    while sorted(statuses := [api(live, world, "GET", f"/jobs/{j}", user="alice")["status"] for j in jobs]) != [
            "queued", "running", "running", "running"]:
        assert time.monotonic() < deadline and "queued" in statuses, statuses
        live.tick()
        time.sleep(0.1)
    assert 2 not in placed([j for j, st in zip(jobs, statuses) if st == "running"])


def test_a_failed_validation_escalates_to_a_reboot_and_a_flapping_node_goes_to_a_human(
        live, world, sessions, repair, start_agent, placed):
    jobs = start_four(live, world, placed)
    agent = start_agent("testnode", four_gpus("dbe-gpu3"))
    agent.driver.reset_works = False  # nvidia-smi says yes, the errors stay: validation must catch it
    drive(live, repair, lambda: (api(live, world, "GET", "/nodes/testnode")["repair"] or {}).get("step") == "reboot",
          agents=[agent], what="the escalation to a reboot")
    # a reboot needs the whole node: every job leaves, requeued at the head
    drive(live, repair, lambda: all(api(live, world, "GET", f"/jobs/{j}", user="alice")["status"] == "queued"
                                    for j in jobs.values()), agents=[agent], what="the whole node drained")
    drive(live, repair, lambda: node_state(sessions) is N.IN_SERVICE, agents=[agent], timeout_s=90, what="back after the reboot")
    assert agent.boots == 1
    cycle = api(live, world, "GET", "/nodes/testnode/repairs")["items"][0]
    assert [(s["remediation"], s["result"]) for s in cycle["steps"]] == [("reset_gpu", "succeeded"), ("reboot", "succeeded")]
    assert cycle["scope"] == "node" and cycle["outcome"] == "returned"
    # the same fault again soon after the reboot fixed it: no repeat of the chain, a human now
    agent.driver.reset_works = True
    agent.lib.gpus[3].ecc[(1, 0)] = 3
    drive(live, repair, lambda: node_state(sessions) is N.OUT_OF_SERVICE, agents=[agent], what="out of service")
    second = api(live, world, "GET", "/nodes/testnode/repairs")["items"][0]
    assert (second["flap"], second["outcome"], second["steps"]) == (True, "out_of_service", [])
    assert repair.outbox.templates()[-1] == "node_needs_human"
    # the human swaps the board and returns the node: it validates and serves again
    agent.lib.reset_gpu(3)
    api(live, world, "POST", "/nodes/testnode/return", json={"reason": "GPU 3 reseated"})
    drive(live, repair, lambda: node_state(sessions) is N.IN_SERVICE, agents=[agent], what="returned by the human")
    assert [c["kind"] for c in api(live, world, "GET", "/nodes/testnode/repairs")["items"]] == ["return", "rule", "rule"]


def test_with_a_budget_of_two_three_failing_nodes_leave_service_two_at_a_time(live, world, sessions, repair, start_agent):
    with sessions() as s:
        for name in ("g1", "g2", "g3"):
            s.add(Node(name=name, sku="demo-gpu", gpus=4, cpu=8, memory_bytes=2**34, ib_domain="x", backend="agent-only",
                       labels={}, metrics={}))
        s.commit()
    agents = [start_agent(name, four_gpus("dbe-gpu3")) for name in ("g1", "g2", "g3")]
    most = 0
    seen_queued = False

    def all_back():
        nonlocal most, seen_queued
        states = [node_state(sessions, a.name) for a in agents]
        most = max(most, sum(1 for st in states if st in (N.DRAINING, N.REMEDIATING, N.VALIDATING)))
        seen_queued = seen_queued or N.QUARANTINED in states
        with sessions() as s:
            done = s.scalar(sa.select(sa.func.count(RepairCycle.id)).where(RepairCycle.outcome == "returned"))
        return done == 3 and all(st is N.IN_SERVICE for st in states)

    drive(live, repair, all_back, agents=agents, timeout_s=90, what="all three repaired")
    assert most == 2 and seen_queued
    with sessions() as s:
        starts = sorted((c.queued_until, c.ended_at, c.node_id) for c in s.scalars(sa.select(RepairCycle)))
    # the third left service only after one of the first two was back
    assert starts[2][0] >= min(starts[0][1], starts[1][1])


@pytest.mark.parametrize("repair", [3.0], indirect=True, ids=["lost_after_3s"])
def test_a_lost_heartbeat_marks_the_node_lost_requeues_its_jobs_and_it_returns_through_validation(
        live, world, sessions, repair, start_agent, placed):
    agent = start_agent("testnode", four_gpus("healthy-8xa100"))
    jobs = start_four(live, world, placed)
    agent.halt()
    drive(live, repair, lambda: node_state(sessions) is N.LOST, timeout_s=30, what="lost")
    drive(live, repair, lambda: all(api(live, world, "GET", f"/jobs/{j}", user="alice")["status"] == "queued"
                                    for j in jobs.values()), what="jobs requeued")
    job = api(live, world, "GET", f"/jobs/{jobs[0]}", user="alice")
    attempts = api(live, world, "GET", f"/jobs/{jobs[0]}/attempts", user="alice")["items"]
    assert job["retries_used"] == 0 and [(a["end_reason"], a["spends_retry"]) for a in attempts] == [("node_lost", False)]
    findings = api(live, world, "GET", "/nodes/testnode")["details"]["findings"]
    assert findings[0]["code"] == "heartbeat_lost" and findings[0]["cleared_at"] is None
    agent.start()
    drive(live, repair, lambda: node_state(sessions) is N.IN_SERVICE, what="back in service")
    drive(live, repair, lambda: all(api(live, world, "GET", f"/jobs/{j}", user="alice")["status"] == "running"
                                    for j in jobs.values()), what="jobs running again")


def test_killing_the_managers_at_any_step_and_restarting_finishes_the_cycle_exactly_once(
        live, world, sessions, settings, start_agent, placed, tmp_path):
    """The repair manager runs in its own process and is SIGKILLed again and again while the cycle
    goes on; each restart goes on from the database. One cycle, one order, one stop, one event."""
    jobs = start_four(live, world, placed)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    args = [sys.executable, "-c", MANAGERS, settings.database_url, str(tmp_path / "mhome"), REPAIR.model_dump_json()]
    agent = start_agent("testnode", four_gpus("dbe-gpu3"))
    kills, proc = 0, None
    deadline = time.monotonic() + 240  # liveness only; a busy machine does less in each window
    try:
        while True:  # until the cycle has ended with the node back, killed at least 3 times on the way
            assert time.monotonic() < deadline, f"stuck in {node_state(sessions)} after {kills} kills"
            proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            assert proc.stdout.readline().strip() == "ready"
            # a different moment of the work each time; past 10 kills the windows grow, so a machine
            # too busy to finish a step in the short ones still gets through the cycle
            end = time.monotonic() + 0.1 + 0.13 * (kills % 5) + 0.05 * max(0, kills - 10)
            while time.monotonic() < end:
                live.tick()
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            kills += 1
            live.tick()
            with sessions() as s:
                returned = s.scalar(sa.select(sa.func.count(RepairCycle.id)).where(RepairCycle.outcome == "returned"))
            if returned and kills >= 3:
                break
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(RepairCycle.id))) == 1
        assert s.scalar(sa.select(RepairCycle.outcome)) == "returned"
        # one reset and one GPU diagnostic (the validation's), each ordered exactly once
        assert sorted(s.scalars(sa.select(NodeOrder.action))) == ["gpu_diag", "reset_gpu"]
        assert s.scalar(sa.select(sa.func.count(RepairStep.id))) == 1
    events = api(live, world, "GET", f"/jobs/{jobs[3]}/events", user="alice")["items"]
    assert len([e for e in events if e["kind"] == "repair"]) == 1
    assert agent.lib.resets == [3]
