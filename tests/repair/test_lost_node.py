"""A node lost at the edge, as in `dlts demo` with its defaults: the demo's own node agent (pretend
GPUs, so no GPU readings and no repair actions) reports to the live API over HTTP; the job manager
(local backend, real processes) and the repair manager (the demo's default repair settings) run
their passes. The repair manager's and the report service's clock is injected and jumped over the
silence; everything else is polled with generous bounds (docs/repair.md, docs/reliability.md)."""

from __future__ import annotations

import time

import pytest
import requests
import sqlalchemy as sa
from click.testing import CliRunner
from repair_kit import Clock

from dlts.cli import main
from dlts.demo import agent_mode
from dlts.demo import start_agent as start_demo_agent
from dlts.managers.repair import RepairManager
from dlts.models import Node, NodeEvent, NodeState

N = NodeState
pytestmark = pytest.mark.timeout(240)


def api(live, world, method, path, user="admin", **kw):
    r = requests.request(method, f"{live.url}/api/v1{path}", headers=world.auth(user), timeout=10, **kw)
    assert r.status_code < 400, r.text
    return r.json()


def until(condition, what: str, timeout_s: float = 60.0, step=None):
    """Poll ``condition`` (after ``step``, if any) until it is true; the bound only catches a hang."""
    deadline = time.monotonic() + timeout_s
    while True:
        if step is not None:
            step()
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


class DemoAgent:
    """dlts.demo.start_agent: the agent `dlts demo` runs for its node; halt() stops it reporting,
    start() is the agent started again (a new process would do the same)."""

    def __init__(self, settings, sessions, live):
        self.settings, self.sessions, self.live = settings, sessions, live
        self.node = live.backend.nodes()[0]
        self.stop = self.thread = None

    def start(self) -> DemoAgent:
        _agent, self.stop, self.thread, mode = start_demo_agent(self.settings, self.sessions, self.node, self.live.url)
        assert mode == "host"  # pretend GPUs: heartbeats and host health only
        self.thread.start()
        return self

    def halt(self) -> None:
        if self.stop is not None:
            self.stop.set()
            self.thread.join(timeout=30)
            assert not self.thread.is_alive()


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    clock.patch(monkeypatch)  # reports are stamped, and nodes shown, by the repair manager's clock
    return clock


@pytest.fixture
def demo_agent(settings, sessions, live):
    agent = DemoAgent(settings, sessions, live)
    yield agent
    agent.halt()


def node_row(sessions) -> Node:
    with sessions() as s:
        node = s.scalar(sa.select(Node).where(Node.name == "testnode"))
        s.expunge(node)
        return node


def cli(settings, monkeypatch, *args) -> str:
    monkeypatch.setenv("DLTS_DATABASE_URL", settings.database_url)
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_a_lost_demo_node_is_shown_not_ready_requeues_its_job_and_returns_to_service_on_pretend_gpus(
        live, world, sessions, settings, clock, demo_agent, monkeypatch):
    assert agent_mode(live.backend.nodes()[0], settings, None) == "host"
    lost_after_s = settings.repair.lost_after(settings.node_lost_after_s)
    assert (settings.repair.validation_diag, lost_after_s) == ("auto", 300.0)  # the demo's defaults
    repair = RepairManager(sessions, settings, clock=clock)
    demo_agent.start()
    until(lambda: node_row(sessions).last_heartbeat_at is not None, "the agent's first report")
    job_id = api(live, world, "POST", "/jobs", user="alice",
                 json={"vc": "vision", "image": "debian:12", "command": "sleep 600", "gpus": 1})["id"]
    until(lambda: api(live, world, "GET", f"/jobs/{job_id}", user="alice")["status"] == "running", "the job runs",
          step=live.tick)
    view = api(live, world, "GET", "/nodes/testnode")
    assert (view["ready"], view["not_ready_reason"], view["health"]) == (True, None, "ok")

    # the agent stops reporting mid-job
    demo_agent.halt()
    last = node_row(sessions).last_heartbeat_at
    last_iso = api(live, world, "GET", "/nodes/testnode")["last_heartbeat_at"]
    clock.advance(lost_after_s + 1)
    # one rule: the API shows it lost as soon as the repair loop would take it for lost, before its pass
    view = api(live, world, "GET", "/nodes/testnode")
    reason = f"no report from its agent since {last_iso} (lost after 300 s)"
    assert (view["state"], view["ready"], view["not_ready_reason"], view["health"]) == ("in_service", False, reason, "unknown")
    repair.run_once()
    assert node_row(sessions).state is N.LOST
    until(lambda: api(live, world, "GET", f"/jobs/{job_id}", user="alice")["status"] == "queued", "the job requeued",
          step=live.tick)
    attempts = api(live, world, "GET", f"/jobs/{job_id}/attempts", user="alice")["items"]
    assert [(a["end_reason"], a["spends_retry"]) for a in attempts] == [("node_lost", False)]
    for _ in range(5):  # the lost node gets nothing: the job waits, requeued once
        live.tick()
    assert api(live, world, "GET", f"/jobs/{job_id}", user="alice")["status"] == "queued"
    assert len(api(live, world, "GET", f"/jobs/{job_id}/attempts", user="alice")["items"]) == 1
    for path in ("/nodes/testnode", "/nodes"):
        got = api(live, world, "GET", path)
        got = got["items"][0] if "items" in got else got
        assert (got["state"], got["ready"], got["schedulable"], got["not_ready_reason"], got["last_heartbeat_at"]) == (
            "lost", False, False, reason, last_iso)
    out = cli(settings, monkeypatch, "node", "list")
    assert "lost" in out and f"not ready: {reason}" in out and " no " in out, out
    out = cli(settings, monkeypatch, "node", "show", "testnode")
    assert f"not ready: {reason}" in out, out

    # the agent reports again: ready at once, then the repair loop validates it back into service
    demo_agent.start()
    until(lambda: (node_row(sessions).last_heartbeat_at or last) > last, "reports resume")
    view = api(live, world, "GET", "/nodes/testnode")
    assert (view["ready"], view["not_ready_reason"], view["health"]) == (True, None, "ok")
    repair.run_once()
    assert node_row(sessions).state is N.VALIDATING
    validating_since = node_row(sessions).state_changed_at
    clock.advance(settings.repair.quiet_period_s + 1)

    def repair_and_tick():
        repair.run_once()
        live.tick()

    until(lambda: node_row(sessions).state in (N.IN_SERVICE, N.OUT_OF_SERVICE), "validated", step=repair_and_tick)
    row = node_row(sessions)
    assert row.state is N.IN_SERVICE, row.state_reason
    assert "its agent reads no GPUs: no GPU diagnostic" in row.state_reason
    with sessions() as s:
        moves = [(e.from_state, e.to_state) for e in s.scalars(sa.select(NodeEvent).where(
            NodeEvent.node_id == row.id, NodeEvent.kind == "transition").order_by(NodeEvent.id))]
        diag_orders = s.scalar(sa.text("SELECT count(*) FROM node_orders WHERE action = 'gpu_diag'"))
    assert moves == [("in_service", "lost"), ("lost", "validating"), ("validating", "in_service")]
    assert diag_orders == 0  # never ordered: the agent reads no GPUs and would reject it
    assert row.state_changed_at > validating_since
    view = api(live, world, "GET", "/nodes/testnode")
    assert (view["state"], view["ready"], view["schedulable"], view["not_ready_reason"]) == ("in_service", True, True, None)
    until(lambda: api(live, world, "GET", f"/jobs/{job_id}", user="alice")["status"] == "running", "the job runs again",
          step=live.tick)
    assert len(api(live, world, "GET", f"/jobs/{job_id}/attempts", user="alice")["items"]) == 2
