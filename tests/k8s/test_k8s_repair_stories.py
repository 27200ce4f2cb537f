"""The repair stories of docs/repair.md on the Kubernetes backend, with the real agent (fake NVML)
reporting to the live API, the repair manager, and the Kubernetes job manager against the fake API
server (the stories tests/repair/test_end_to_end.py tells on the local backend): a remap failure
goes to rma and the node serves on with its other GPUs; a reset that does not work escalates to a
reboot (cordoned, drained, uncordoned) and the same fault again soon after goes to a human; with a
budget of two, three failing nodes leave service two at a time; the repair manager SIGKILLed again
and again finishes the cycle exactly once. The harness, the agent and ``Drive`` are
test_k8s_repair.py's (its fixtures are imported here; both parameterisations, list and watch)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "repair"))  # repair_agents

import test_k8s_repair
from repair_agents import MANAGERS
from test_k8s_repair import Drive, placed_on, repair_events, requeues, start_jobs, state

from dlts.models import JobStatus, Node, NodeEvent, NodeOrder, RepairCycle, RepairStep
from dlts.models import NodeState as N
from dlts.services import admin

# test_k8s_repair.py's fixtures: the harness (list and watch), the repair manager, the live API, the agent
kh, repair = test_k8s_repair.kh, test_k8s_repair.repair
agent_api, start_agent = test_k8s_repair.agent_api, test_k8s_repair.start_agent

ANNOTATION = "dlts.io/cordoned-by"


@pytest.fixture
def operator(kh) -> str:
    """A cluster admin with an address (the repair notices go to the cluster admins): its API token."""
    with kh.sessions() as s:
        admin.add_user(s, "root", admin=True, email="root@example.org")
        return admin.new_token(s, "root", "test")


def needs_human(repair) -> list[dict]:
    return [r for r in repair.outbox.rows if r["template"] == "node_needs_human"]


def k8s_node(h, name: str) -> dict:
    return h.api.store.get("nodes", "", name)


def cordoned_by_dlts(h, name: str) -> bool:
    node = k8s_node(h, name)
    return bool(node["spec"].get("unschedulable")) and (node["metadata"].get("annotations") or {}).get(ANNOTATION) == "dlts"


def uncordoned(h, name: str) -> bool:
    node = k8s_node(h, name)
    return not node["spec"].get("unschedulable") and ANNOTATION not in (node["metadata"].get("annotations") or {})


def human_cordon(h, name: str) -> None:
    h.api.store.patch("nodes", "", name, {"spec": {"unschedulable": True}}, "application/merge-patch+json")


def cycles(h, name: str) -> list[RepairCycle]:
    with h.sessions() as s:
        node_id = s.scalar(sa.select(Node.id).where(Node.name == name))
        rows = list(s.scalars(sa.select(RepairCycle).where(RepairCycle.node_id == node_id).order_by(RepairCycle.id)))
        for row in rows:
            s.expunge(row)
        return rows


def steps(h, cycle_id: int) -> list[tuple[str, str | None]]:
    with h.sessions() as s:
        return [(st.remediation, st.result) for st in s.scalars(
            sa.select(RepairStep).where(RepairStep.cycle_id == cycle_id).order_by(RepairStep.id))]


def pods_on(h, name: str) -> list[dict]:
    """The job pods the fake kube-scheduler bound to a node (and not yet gone)."""
    return [p for p in h.api.store.list("pods", "default")["items"]
            if p["spec"].get("nodeName") == name and p["status"].get("phase") in ("Pending", "Running")]


def node_row(h, name: str) -> Node:
    with h.sessions() as s:
        node = s.scalar(sa.select(Node).where(Node.name == name))
        s.expunge(node)
        return node


# -- a remap failure: rma, the GPU never used again, the others serve ------------------------------

def test_a_remap_failure_on_kubernetes_goes_to_rma_and_the_other_gpus_keep_serving(kh, repair, start_agent, operator):
    from dlts_testing.fake_nvml import scenario

    h = kh
    target = "n3"
    agent = start_agent(target, scenario("remap-failure"))  # GPU 6: a row remap failed (the board must go)
    drive = Drive(h, repair, target)
    drive(lambda: state(h.sessions, target) is N.RMA, "rma", agents=[agent])
    node = node_row(h, target)
    assert (node.repair_scope, node.unhealthy_gpus) == ("gpu", [6])
    [notice] = needs_human(repair)
    assert notice["to"] == ["root@example.org"] and repair.outbox.templates()[-1] == "node_needs_human"
    [cycle] = cycles(h, target)
    assert (cycle.scope, cycle.outcome) == ("gpu", "rma")
    # no remediation can fix it: nothing was ordered, and the node stays schedulable (GPU scope: no cordon)
    with h.sessions() as s:
        assert s.scalar(sa.select(sa.func.count(NodeOrder.id))) == 0
    assert not any(drive.cordons) and uncordoned(h, target)
    # the other nodes are full (their owners' cordons): new jobs can only land on the rma node, on its
    # seven healthy GPUs; the eighth waits
    for other in ("n1", "n2", "n4"):
        human_cordon(h, other)
    jobs = [h.submit(command="sleep infinity", gpus=1, name=f"after-{i}") for i in range(8)]

    def seven_running():
        statuses = [h.job(j).status for j in jobs]
        return statuses.count(JobStatus.RUNNING) == 7 and statuses.count(JobStatus.QUEUED) == 1

    drive(seven_running, "seven jobs running on the healthy GPUs", agents=[agent])
    for _ in range(5):  # and it stays so: GPU 6 is never handed out
        drive(lambda: True, "a pass", agents=[agent])
    running = [j for j in jobs if h.job(j).status is JobStatus.RUNNING]
    assert len(running) == 7 and h.job(next(j for j in jobs if j not in running)).status is JobStatus.QUEUED
    placements = [placed_on(h, j) for j in running]
    assert {n for n, _ in placements} == {target}
    assert sorted(g for _, gpus in placements for g in gpus) == [0, 1, 2, 3, 4, 5, 7]
    assert len(pods_on(h, target)) == 7  # the pods landed there (the fake kube-scheduler bound them)
    assert state(h.sessions, target) is N.RMA


# -- a reset that does not work: a reboot; the same fault again soon after: a human ------------------

def test_a_failed_validation_on_kubernetes_escalates_to_a_reboot_and_a_flapping_node_goes_to_a_human(
        kh, repair, start_agent, agent_api, operator):
    from dlts_testing.fake_nvml import scenario

    h = kh
    jobs = start_jobs(h, 8)
    on = {placed_on(h, j): j for j in jobs}
    target = next(node for (node, gpus) in on if gpus == (3,))
    here = [j for (node, _), j in on.items() if node == target]
    agent = start_agent(target, scenario("dbe-gpu3"))
    agent.driver.reset_works = False  # nvidia-smi says yes, the errors stay: the validation must catch it
    drive = Drive(h, repair, target)
    drive(lambda: node_row(h, target).repair_scope == "node", "the escalation to a reboot", agents=[agent])
    # a reboot needs the whole node: DLTS cordons it with its annotation and drains every job from it,
    # each requeued at the head without spending a retry
    drive(lambda: cordoned_by_dlts(h, target), "DLTS's cordon", agents=[agent])
    drive(lambda: all(h.attempts(j)[0].end_reason is not None for j in here), "the whole node drained", agents=[agent])
    for j in here:
        assert (h.attempts(j)[0].end_reason, h.attempts(j)[0].spends_retry, h.job(j).retries_used) == ("node_repair", False, 0)
        assert "queued" in requeues(h, j) and len(repair_events(h, j)) == 1
    # the agent reboots the machine (the order in its report response), the node validates and returns
    drive(lambda: state(h.sessions, target) is N.IN_SERVICE, "back after the reboot", agents=[agent], timeout_s=60)
    # nvidia-smi was asked to reset GPU 3 and did nothing; the reboot reloaded every GPU
    assert agent.boots == 1 and any("--gpu-reset" in c for c in agent.driver.commands)
    assert agent.lib.resets == list(range(8))
    assert [s for s in drive.states if s in (N.REMEDIATING, N.VALIDATING)][-2:] == [N.REMEDIATING, N.VALIDATING]
    [first] = cycles(h, target)
    assert (first.scope, first.outcome, first.flap) == ("node", "returned", False)
    assert steps(h, first.id) == [("reset_gpu", "succeeded"), ("reboot", "succeeded")]
    # the report after the reset still had the errors (no diagnostic then); the validation after the
    # reboot diagnosed every GPU of the drained node
    assert [c[1:] for c in agent.driver.commands if c[1:2] == ["diag"]] == [["diag", "-r", "1", "-j"]]
    drive(lambda: uncordoned(h, target), "DLTS's cordon lifted", agents=[agent])
    # the drained jobs ran again elsewhere meanwhile
    drive(lambda: all(h.job(j).status is JobStatus.RUNNING for j in here), "the drained jobs running again", agents=[agent])
    # the same fault again soon after the reboot fixed it: no repeat of the chain, a human now
    agent.driver.reset_works = True
    agent.lib.gpus[3].ecc[(1, 0)] = 3
    drive(lambda: state(h.sessions, target) is N.OUT_OF_SERVICE, "out of service", agents=[agent])
    first, second = cycles(h, target)
    assert (second.flap, second.outcome, steps(h, second.id)) == (True, "out_of_service", [])
    assert repair.outbox.templates()[-1] == "node_needs_human" and len(needs_human(repair)) == 1
    commands = len(agent.driver.commands)
    # the fault is GPU 3's alone: it waits for the human quarantined, the node serving with its other
    # GPUs (no cordon); nothing is ordered
    assert (second.scope, node_row(h, target).unhealthy_gpus) == ("gpu", [3])
    for _ in range(3):
        drive(lambda: True, "a pass", agents=[agent])
    assert uncordoned(h, target) and state(h.sessions, target) is N.OUT_OF_SERVICE
    assert agent.boots == 1 and agent.lib.resets == list(range(8)) and len(agent.driver.commands) == commands
    # the human swaps the board and returns the node through the API: it validates and serves again
    agent.lib.reset_gpu(3)
    r = requests.post(f"{agent_api}/api/v1/nodes/{target}/return", json={"reason": "GPU 3 reseated"},
                      headers={"Authorization": f"Bearer {operator}"}, timeout=30)
    assert r.status_code == 200, r.text
    drive(lambda: state(h.sessions, target) is N.IN_SERVICE, "returned by the human", agents=[agent])
    assert [(c.kind, c.outcome) for c in cycles(h, target)] == [("rule", "returned"), ("rule", "out_of_service"),
                                                                ("return", "returned")]
    drive(lambda: uncordoned(h, target), "DLTS's cordon lifted after the return", agents=[agent])
    with h.sessions() as s:
        node_id = s.scalar(sa.select(Node.id).where(Node.name == target))
        messages = list(s.scalars(sa.select(NodeEvent.message).where(NodeEvent.node_id == node_id)))
    assert any("returned by root: GPU 3 reseated" in m for m in messages)


# -- a budget of two -----------------------------------------------------------------------------

def test_with_a_budget_of_two_three_failing_kubernetes_nodes_leave_service_two_at_a_time(kh, repair, start_agent):
    from dlts_testing.fake_nvml import scenario

    h = kh
    assert h.settings.repair.max_nodes_in_repair == "2"
    names = ("n1", "n2", "n3")
    agents = [start_agent(name, scenario("dbe-gpu3")) for name in names]
    out = (N.DRAINING, N.REMEDIATING, N.VALIDATING)
    most, seen_waiting = 0, set()

    def all_back():
        nonlocal most
        states = [state(h.sessions, n) for n in names]
        most = max(most, sum(st in out for st in states))
        seen_waiting.update(n for n, st in zip(names, states) if st is N.QUARANTINED)
        with h.sessions() as s:
            done = s.scalar(sa.select(sa.func.count(RepairCycle.id)).where(RepairCycle.outcome == "returned"))
        return done == 3 and all(st is N.IN_SERVICE for st in states)

    drive = Drive(h, repair, "n1")
    drive(all_back, "all three repaired", agents=agents, timeout_s=90)
    assert most == 2 and len(seen_waiting) >= 1
    assert state(h.sessions, "n4") is N.IN_SERVICE
    with h.sessions() as s:
        spans = sorted((c.queued_until, c.ended_at) for c in s.scalars(sa.select(RepairCycle)))
        assert s.scalar(sa.select(sa.func.count(NodeOrder.id)).where(NodeOrder.action == "reset_gpu")) == 3
    # the third left service only once one of the first two was back
    assert spans[2][0] >= min(spans[0][1], spans[1][1])
    for a in agents:
        assert a.lib.resets == [3]
    for name in names:  # GPU-scope repairs: never cordoned
        assert uncordoned(h, name)


# -- the repair manager SIGKILLed again and again --------------------------------------------------

def test_killing_the_repair_manager_again_and_again_on_kubernetes_finishes_the_cycle_exactly_once(
        kh, start_agent, tmp_path):
    """The repair manager runs in its own process and is SIGKILLed again and again while the cycle on
    a Kubernetes node goes on (the job manager ticks here, through the harness); each restart goes on
    from the database. One cycle, one reset, one GPU diagnostic, one stop, one repair event."""
    from dlts_testing.fake_nvml import scenario

    h = kh
    jobs = start_jobs(h, 8)
    on = {placed_on(h, j): j for j in jobs}
    (target, _), victim = next(((node, gpus), j) for (node, gpus), j in on.items() if gpus == (3,))
    before = h.job(victim)
    settings = h.settings.repair.model_copy(update={"lost_after_s": 30.0})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    args = [sys.executable, "-c", MANAGERS, h.settings.database_url, str(tmp_path / "mhome"), settings.model_dump_json()]
    agent = start_agent(target, scenario("dbe-gpu3"))
    kills, proc, seen, killed_in = 0, None, set(), []
    deadline = time.monotonic() + 180

    def returned() -> int:
        with h.sessions() as s:
            return int(s.scalar(sa.select(sa.func.count(RepairCycle.id)).where(RepairCycle.outcome == "returned")))

    try:
        while True:  # until the cycle has ended with the node back, killed at least 3 times on the way
            assert time.monotonic() < deadline, f"stuck in {state(h.sessions, target)} after {kills} kills; saw {seen}"
            proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            while not select.select([proc.stdout], [], [], 0.05)[0]:  # the cluster goes on while it starts
                assert proc.poll() is None, "the repair manager's process died"
                h.tick(1)
            assert proc.stdout.readline().strip() == "ready"
            # Killed 5 times, once at least in the middle of the cycle: this run is left to finish it
            # (on a loaded machine a short run may do no work, and killing forever proves nothing more).
            finish = kills >= 5 and any(st is not N.IN_SERVICE for st in killed_in)
            # otherwise a different moment of the work each time
            end = deadline if finish else time.monotonic() + 0.1 + 0.13 * (kills % 5)
            while time.monotonic() < end and not (finish and returned()):
                h.tick(1)
                seen.add(state(h.sessions, target))
                time.sleep(0.05)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            kills += 1
            killed_in.append(state(h.sessions, target))
            h.tick(1)
            if returned() and kills >= 3:
                break
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
    assert state(h.sessions, target) is N.IN_SERVICE and kills >= 3
    assert [st for st in killed_in if st is not N.IN_SERVICE], killed_in  # killed in the middle of the cycle
    with h.sessions() as s:
        assert s.scalar(sa.select(sa.func.count(RepairCycle.id))) == 1
        assert s.scalar(sa.select(RepairCycle.outcome)) == "returned"
        # one reset and one GPU diagnostic (the validation's), each ordered exactly once
        assert sorted(s.scalars(sa.select(NodeOrder.action))) == ["gpu_diag", "reset_gpu"]
        assert s.scalar(sa.select(sa.func.count(RepairStep.id))) == 1
    assert agent.lib.resets == [3]
    assert len([c for c in agent.driver.commands if c[1:2] == ["diag"]]) == 1
    # the job on GPU 3 was stopped once, requeued at the head once, with one repair event
    assert len(repair_events(h, victim)) == 1
    assert requeues(h, victim).count("queued") == 1
    assert [a.end_reason for a in h.attempts(victim)][:1] == ["node_repair"]
    assert (h.job(victim).retries_used, h.job(victim).queue_time) == (0, before.queue_time)
    # the other jobs of the node were never touched (a GPU-scope repair); the node was never cordoned
    for j in on.values():
        if j != victim:
            assert len(h.attempts(j)) == 1 and h.job(j).status is JobStatus.RUNNING
    assert uncordoned(h, target)
