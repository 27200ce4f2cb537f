"""End to end: the real node agent reads a fake NVML (dlts_testing.fake_nvml) and a fake /proc
holding the jobs' processes, and reports to the real API over HTTP every 0.2 s; the job manager
(local backend, real processes), the insight manager and the notifier (real SMTP server) run their
passes. The VC's idle policy is set through the API, in minutes (fractions of one here, so that
the story takes seconds)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "agent"))  # agent_testkit

from agent_testkit import agent_config, make_fake_node

from dlts.insight.settings import InsightSettings
from dlts.managers.insight import InsightManager
from dlts.managers.notify import NotifyManager
from tests.smtp_server import with_notify

pytestmark = [pytest.mark.db, pytest.mark.slow]
IDLE_MIN = 0.05  # 3 s


def api(live, world, method, path, user="alice", **kw):
    r = requests.request(method, f"{live.url}/api/v1{path}", headers=world.auth(user), timeout=10, **kw)
    assert r.status_code < 400, r.text
    return r.json()


@pytest.fixture
def agent(tmp_path, live, sessions, app):
    """The real agent on a fake node with 4 fake A100s (idle), reporting to the live API. The API
    runs as the demo does: it takes the utilisation a fake NVML reads (any other API ignores it)."""
    from dlts.services import nodes as node_service
    from dlts_agent.agent import Agent
    from dlts_testing.fake_nvml import FakeDriver, scenario

    app.config["DLTS_DEMO"] = True
    lib = scenario("healthy-8xa100")
    lib.gpus = lib.gpus[:4]
    for g in lib.gpus:
        g.utilization_pct = 0
    node = make_fake_node(tmp_path / "agent")
    with sessions() as s:
        token = node_service.issue_node_token(s, "testnode")
    (tmp_path / "agent" / "node-token").write_text(token)
    cfg = agent_config(node, node_name="testnode", interval_s=0.2, expected_gpu_count=4,
                       report={"enabled": True, "api_url": live.url, "node_token_file": str(tmp_path / "agent" / "node-token"),
                               "interval_s": 0.2, "timeout_s": 5, "backoff_initial_s": 0.2, "backoff_max_s": 1})
    running = Agent(cfg, nvml_lib=lib)
    running.executor.runner = FakeDriver(lib)
    stop = threading.Event()
    thread = threading.Thread(target=running.run, args=(stop,), name="agent-testnode", daemon=True)
    thread.start()
    assert running.ready.wait(20), "the agent never finished its first collection"
    yield SimpleNamespace(agent=running, lib=lib, node=node)
    stop.set()
    thread.join(timeout=10)


def start(live, world, gpus: int, name: str) -> dict:
    job = api(live, world, "POST", "/jobs", json={"vc": "vision", "image": "debian:12", "command": "sleep 600",
                                                  "gpus": gpus, "name": name})
    deadline = time.monotonic() + 30
    while (job := api(live, world, "GET", f"/jobs/{job['id']}"))["status"] != "running":
        assert time.monotonic() < deadline, job
        live.tick()
        time.sleep(0.1)
    return job


def test_an_idle_job_is_warned_then_paused_a_silent_one_and_an_exempt_one_are_not(
        live, world, sessions, settings, agent, smtp_server):
    idle = start(live, world, 2, "idle-train")
    silent = start(live, world, 1, "unseen")  # its processes are not on the agent's node: no report names it
    exempt = start(live, world, 1, "notebook")
    for pid, job in ((4242, idle), (4343, exempt)):
        gpus = ",".join(str(i) for i in job["placements"][0]["gpu_indices"])
        agent.node.add_process(pid, {"DLTS_JOB_ID": str(job["id"]), "DLTS_USER": "alice", "DLTS_VC": "vision",
                                     "CUDA_VISIBLE_DEVICES": gpus})
    api(live, world, "PATCH", f"/jobs/{exempt['id']}", user="vcadmin", json={"idle_exempt": True})
    api(live, world, "PATCH", "/vcs/vision", user="vcadmin",
        json={"idle_policy": {"idle_warn_min": IDLE_MIN, "idle_action_min": IDLE_MIN, "idle_action": "pause"}})
    insight = InsightManager(sessions, settings.model_copy(update={"insight": InsightSettings(
        idle_min=IDLE_MIN, report_interval_s=2.0)}))
    notifier = NotifyManager(sessions, with_notify(settings, smtp_port=smtp_server.port))

    def insight_events(job):
        return [(e["reason"], e["message"]) for e in reversed(api(live, world, "GET", f"/jobs/{job['id']}/events",
                                                                  params={"limit": 500})["items"]) if e["kind"] == "insight"]

    deadline = time.monotonic() + 90
    while (now := api(live, world, "GET", f"/jobs/{idle['id']}"))["status"] != "paused":
        assert time.monotonic() < deadline, (now["status"], insight_events(idle))
        live.tick()
        insight.run_once()
        notifier.run_once()
        time.sleep(0.2)
    assert now["reason"] == "idle_gpus" and "idle-job policy" in now["reason_detail"]
    reasons = [r for r, _ in insight_events(idle)]
    assert reasons[:3] == ["gpus_idle", "idle_warning", "idle_action"], reasons
    # the owner got the warning, then the notice that the job was paused (and the VC's admins that one)
    notifier.run_once()
    mails = [(m.rcpt_tos, m.message["Subject"]) for m in smtp_server.received]
    assert any(to == ["alice@example.org"] and f"Job {idle['id']} (idle-train) has idle GPUs" in s for to, s in mails), mails
    assert any(to == ["alice@example.org", "vcadmin@example.org"] and f"Job {idle['id']} (idle-train) was paused" in s
               for to, s in mails), mails
    warning = next(m for m in smtp_server.received if "has idle GPUs" in m.message["Subject"])
    assert "kill it yourself" in warning.body and "exempt" in warning.body
    # the exempt job has its insight but was never warned or paused; the silent one has nothing at all
    for _ in range(5):  # more passes: still nothing
        live.tick()
        insight.run_once()
        time.sleep(0.2)
    assert api(live, world, "GET", f"/jobs/{exempt['id']}")["status"] == "running"
    assert [i["code"] for i in api(live, world, "GET", f"/jobs/{exempt['id']}")["insights"]] == ["gpus_idle"]
    assert [r for r, _ in insight_events(exempt)] == ["gpus_idle"]
    assert api(live, world, "GET", f"/jobs/{silent['id']}")["status"] == "running"
    assert api(live, world, "GET", f"/jobs/{silent['id']}")["insights"] == [] and insight_events(silent) == []
    # the paused job's insight is cleared
    assert insight_events(idle)[-1] == ("gpus_idle_cleared", "Cleared: the job is no longer running.")
    assert not any(f"Job {j['id']}" in s for j in (silent, exempt) for _, s in mails)
