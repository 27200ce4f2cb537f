"""The repair loop on the Kubernetes backend (the real client against the fake API server): a node
that leaves service is cordoned by the job manager's node sync with DLTS's ownership annotation,
its job is stopped and requeued at the head and restarts on another node, and once the node is
validated DLTS lifts its own cordon, never someone else's."""

from __future__ import annotations

import datetime as dt
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from werkzeug.serving import make_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "repair"))  # repair_agents, repair_kit

from conftest import Harness
from repair_agents import FakeDriver, RunningAgent, agent_config, make_fake_node
from repair_kit import Outbox

from dlts.managers.repair import RepairManager
from dlts.models import JobEvent, JobStatus, Node, NodeState, RepairCycle, RepairStep
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
    repair = RepairManager(h.sessions, settings.model_copy(update={"repair": RepairSettings(quiet_period_s=0, validation_diag="off")}))
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


# -- end to end with the real agent (fake NVML) reporting to the live API -------------------------
# Two clocks, as in production: the agent, the API and the repair manager on the wall clock; the
# fake API server's kubelet, the Kubernetes backend and the job manager on the fake clock, which
# each pass of ``drive`` moves one second on (pod terminations and the backend's node-loss timer).

LOST_AFTER_S = 3.0
REPAIR = RepairSettings(interval_s=0.2, quiet_period_s=1.0, validation_timeout_s=60, lost_after_s=LOST_AFTER_S,
                        max_nodes_in_repair="2", flap_window_s=3600)
N = NodeState
TICK_S = 0.15  # real time between passes of drive


@pytest.fixture
def agent_api(app):
    """The real API over HTTP on loopback, acting on fake-NVML reports as the demo does. (No job
    manager with it: the Kubernetes one is the harness's.)"""
    app.config["DLTS_DEMO"] = True
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.fixture
def start_agent(agent_api, sessions, tmp_path):
    """start_agent(node, lib) -> the real agent (repair_agents.RunningAgent) for a node of the
    fake cluster, with 8 GPUs, reporting to the live API every 0.2 s with its node token."""
    agents: list[RunningAgent] = []

    def start(name: str, lib) -> RunningAgent:
        root = tmp_path / f"agent-{name}"
        root.mkdir()
        node = make_fake_node(root)
        with sessions() as s:
            token = node_service.issue_node_token(s, name)
        (root / "node-token").write_text(token)
        cfg = agent_config(node, node_name=name, interval_s=0.2, expected_gpu_count=8,
                           report={"enabled": True, "api_url": agent_api, "node_token_file": str(root / "node-token"),
                                   "interval_s": 0.2, "timeout_s": 5, "backoff_initial_s": 0.2, "backoff_max_s": 1})
        agents.append(RunningAgent(name, node, lib, FakeDriver(lib), cfg).start())
        return agents[-1]

    yield start
    for a in agents:
        a.halt()


@pytest.fixture(params=["list", "watch"])
def kh(request, api, cluster, settings, make_backend) -> Harness:
    """The Kubernetes job-manager harness with node loss after LOST_AFTER_S on both sides (the
    backend's NotReady timer, the repair manager's silent-agent timer)."""
    settings = settings.model_copy(update={"node_lost_after_s": LOST_AFTER_S, "repair": REPAIR})
    harness = Harness(api, cluster, settings,
                      lambda **kw: make_backend(node_lost_after_s=LOST_AFTER_S, **kw), watch=request.param == "watch")
    with cluster() as s:
        harness.manager.sync_nodes(s)
    return harness


@pytest.fixture
def repair(kh, request):
    """The repair manager; its silent-agent timer LOST_AFTER_S only where a test asks for it
    (``indirect`` param True): elsewhere 30 s, since a busy machine can starve the agent's thread."""
    lost_after = LOST_AFTER_S if getattr(request, "param", False) else 30.0
    manager = RepairManager(kh.sessions, kh.settings.model_copy(
        update={"repair": kh.settings.repair.model_copy(update={"lost_after_s": lost_after})}))
    manager.outbox = Outbox(kh.sessions)
    return manager


class Drive:
    """Passes of the job manager (one fake second of the cluster each) and the repair manager until
    a condition holds; records the node states and the cordons it saw on the way. ``fake_s``: how
    far each pass moves the cluster's clock (None: as far as the wall clock moved, the two in step)."""

    def __init__(self, h: Harness, repair: RepairManager, node: str, fake_s: float | None = 1.0) -> None:
        self.h, self.repair, self.node, self.fake_s = h, repair, node, fake_s
        self.last = time.monotonic()
        self.states: list[NodeState] = []
        self.cordons: list[bool] = []

    def catch_up(self) -> None:
        """With ``fake_s`` None: move the cluster's clock by the wall time since the last pass, without
        a pass, so a stamp the test makes next (a node going NotReady) is made at the wall clock's time
        and the next pass does not count the time before it as time after it."""
        now = time.monotonic()
        self.h.api.clock.advance(max(now - self.last, 0.0))
        self.last = now

    def __call__(self, until, what: str, timeout_s: float = 45.0, agents=()):
        deadline = time.monotonic() + timeout_s
        while True:
            now = time.monotonic()
            self.h.tick(self.fake_s if self.fake_s is not None else max(now - self.last, 0.01))
            self.last = now
            self.repair.run_once()
            for a in agents:
                if a.driver.reboot_requested.is_set():
                    a.reboot()
            st = state(self.h.sessions, self.node)
            if not self.states or self.states[-1] is not st:
                self.states.append(st)
            self.cordons.append(bool(self.h.api.store.get("nodes", "", self.node)["spec"].get("unschedulable")))
            value = until()
            if value:
                return value
            assert time.monotonic() < deadline, f"timed out waiting for {what}; states {self.states}"
            time.sleep(TICK_S)


def placed_on(h: Harness, job_id: int) -> tuple[str, tuple[int, ...]]:
    placement = h.attempts(job_id)[-1].placements[0]
    return placement["node"], tuple(placement["gpu_indices"])


def start_jobs(h: Harness, count: int) -> list[int]:
    ids = [h.submit(command="sleep infinity", gpus=1, name=f"train-{i}") for i in range(count)]
    for _ in range(20):
        h.tick(1)
        if all(h.job(j).status is JobStatus.RUNNING for j in ids):
            return ids
    raise AssertionError([(h.job(j).status, h.job(j).reason) for j in ids])


def repair_events(h: Harness, job_id: int) -> list[str]:
    with h.sessions() as s:
        return list(s.scalars(sa.select(JobEvent.message).where(JobEvent.job_id == job_id, JobEvent.kind == "repair")
                              .order_by(JobEvent.id)))


def requeues(h: Harness, job_id: int) -> list[str]:
    """The statuses the job went to from running (or stopping): its transitions out of a run."""
    with h.sessions() as s:
        return list(s.scalars(sa.select(JobEvent.to_status).where(
            JobEvent.job_id == job_id, JobEvent.kind == "transition", JobEvent.from_status.in_(("running", "stopping")))
            .order_by(JobEvent.id)))


def reported(h: Harness, name: str) -> bool:
    with h.sessions() as s:
        return s.scalar(sa.select(Node.last_heartbeat_at).where(Node.name == name)) is not None


def test_a_dbe_on_gpu3_of_a_kubernetes_node_runs_the_whole_cycle_with_the_real_agent(kh, repair, start_agent):
    from dlts_testing.fake_nvml import scenario

    h = kh
    jobs = start_jobs(h, 8)
    on = {placed_on(h, j): j for j in jobs}
    (target, _), victim = next(((node, gpus), j) for (node, gpus), j in on.items() if gpus == (3,))
    neighbours = [j for (node, gpus), j in on.items() if node == target and j != victim]
    before = h.job(victim)
    agent = start_agent(target, scenario("dbe-gpu3"))
    drive = Drive(h, repair, target)
    drive(lambda: state(h.sessions, target) is not N.IN_SERVICE, "the DBE to quarantine GPU 3")
    with h.sessions() as s:
        node = s.scalar(sa.select(Node).where(Node.name == target))
        assert (node.repair_scope, node.unhealthy_gpus) == ("gpu", [3])
    # the job on GPU 3 is stopped and requeued at the head, no retry spent; its neighbours keep running
    # (the pass that requeues it may place it again at once: it is first in line and GPUs are free)
    drive(lambda: h.attempts(victim)[0].end_reason is not None, "the job on GPU 3 to be requeued")
    job = h.job(victim)
    assert (job.retries_used, job.priority, job.queue_time) == (0, before.priority, before.queue_time)
    assert [(a.end_reason, a.spends_retry) for a in h.attempts(victim)][:1] == [("node_repair", False)]
    assert "queued" in requeues(h, victim)
    assert repair_events(h, victim) == [
        (f"node {target} GPU 3 has uncorrectable ECC errors; your job was stopped and requeued at the head of its queue "
         "(no retry spent)")]
    assert all(h.job(j).status is JobStatus.RUNNING for j in neighbours)
    # the agent resets GPU 3 (the order in its report response), validation passes, the GPU returns
    drive(lambda: state(h.sessions, target) is N.IN_SERVICE, "the node back in service", agents=[agent])
    assert agent.lib.resets == [3] and any("--gpu-reset" in c for c in agent.driver.commands)
    assert [c[1:] for c in agent.driver.commands if c[1:2] == ["diag"]] == [["diag", "-r", "1", "-j", "-i", "3"]]
    assert N.REMEDIATING in drive.states and N.VALIDATING in drive.states
    assert drive.states.index(N.REMEDIATING) < drive.states.index(N.VALIDATING) < len(drive.states) - 1
    with h.sessions() as s:
        cycle = s.scalar(sa.select(RepairCycle))
        steps = [(st.remediation, st.result) for st in s.scalars(sa.select(RepairStep))]
        assert (cycle.scope, cycle.outcome, steps) == ("gpu", "returned", [("reset_gpu", "succeeded")])
    # a GPU-scope repair never cordons: the node kept serving with its other GPUs (docs/repair.md, F3)
    assert not any(drive.cordons)
    assert "dlts.io/cordoned-by" not in (h.api.store.get("nodes", "", target)["metadata"].get("annotations") or {})
    # the requeued job runs again, keeping its queue time
    drive(lambda: h.job(victim).status is JobStatus.RUNNING, "the requeued job to run again")
    assert len(h.attempts(victim)) == 2 and h.job(victim).queue_time == before.queue_time


@pytest.mark.parametrize("repair", [True], indirect=True, ids=["lost_after_3s"])
def test_a_lost_heartbeat_on_kubernetes_cordons_requeues_and_the_node_returns_through_validation(kh, repair, start_agent):
    from dlts_testing.fake_nvml import scenario

    h = kh
    [job_id] = start_jobs(h, 1)
    target, _ = placed_on(h, job_id)
    before = h.job(job_id)
    agent = start_agent(target, scenario("healthy-8xa100"))
    drive = Drive(h, repair, target, fake_s=None)  # the backend's NotReady timer in step with the agent's silence
    drive(lambda: reported(h, target), "the agent's first report")
    # the machine goes away: the agent is silent and the kubelet stops posting (NotReady)
    agent.halt()
    drive.catch_up()
    h.api.set_node_ready(target, False, status="Unknown")
    drive(lambda: h.job(job_id).status is not JobStatus.RUNNING, "the job to leave the lost node")
    with h.sessions() as s:
        last = s.scalar(sa.select(Node.last_heartbeat_at).where(Node.name == target))
    silent = time.time() - (last if last.tzinfo else last.replace(tzinfo=dt.UTC)).timestamp()
    # requeued once silent for node_lost_after_s, never earlier, within one tick more (a pass of each
    # manager, and its work) and a second more (NotReady's lastTransitionTime is whole seconds: the
    # backend counts from the end of that second)
    assert LOST_AFTER_S <= silent <= LOST_AFTER_S + REPAIR.interval_s + TICK_S + 2.0, silent
    drive(lambda: state(h.sessions, target) is N.LOST, "the node lost")
    job = h.job(job_id)
    assert "queued" in requeues(h, job_id)
    assert (job.retries_used, job.priority, job.queue_time) == (0, before.priority, before.queue_time)
    first = h.attempts(job_id)[0]
    assert (first.end_reason, first.spends_retry) == ("node_lost", False)
    with h.sessions() as s:
        finding = s.scalar(sa.select(Node).where(Node.name == target))
        assert finding.state is N.LOST
    # lost is node scope: DLTS cordons it, with its annotation; the job runs again elsewhere
    h.manager_tick()
    node = h.api.store.get("nodes", "", target)
    assert node["spec"]["unschedulable"] is True and node["metadata"]["annotations"]["dlts.io/cordoned-by"] == "dlts"
    drive(lambda: h.job(job_id).status is JobStatus.RUNNING, "the requeued job to run again")
    assert placed_on(h, job_id)[0] != target
    # the machine is back: the agent reports again, the node validates and returns; DLTS uncordons it
    h.api.set_node_ready(target, True)
    agent.start()
    drive(lambda: state(h.sessions, target) is N.IN_SERVICE, "back in service", agents=[agent])
    assert drive.states[-3:] == [N.LOST, N.VALIDATING, N.IN_SERVICE]
    h.manager_tick()
    node = h.api.store.get("nodes", "", target)
    assert not node["spec"].get("unschedulable") and "dlts.io/cordoned-by" not in (node["metadata"].get("annotations") or {})
