"""The reporter against a real HTTP server on 127.0.0.1 that checks the node token and returns
orders (tests/agent/report_api.py plays the API). Covers the wire format, 401/403, orders and their
results, backoff while the API is down, and that the exporter never waits for the API."""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request

import pytest
from agent_testkit import FakeNode, agent_config, logged_commands
from report_api import ReportAPI

from dlts_agent.agent import Agent
from dlts_agent.config import (
    ConfigError,
    ReportConfig,
    config_from_mapping,
    read_node_token,
)
from dlts_agent.reporter import Reporter, ReportError
from dlts_testing.fake_nvml import dbe_gpu3, healthy_8xa100

TOKEN = "nt_gpu-node-01_3f9c2b7a"


def reporting_agent(node: FakeNode, api: ReportAPI, lib=None, **overrides) -> Agent:
    cfg = agent_config(
        node,
        report={
            "enabled": True,
            "api_url": api.url,
            "node_token_file": str(node.root / "tok"),
            "interval_s": 0.2,
            "backoff_initial_s": 0.1,
            "backoff_max_s": 0.4,
            "timeout_s": 2,
        },
        **overrides,
    )
    (node.root / "tok").write_text(TOKEN + "\n")
    return Agent(cfg, nvml_lib=lib or healthy_8xa100())


def make_reporter(agent: Agent, token: str = TOKEN) -> Reporter:
    agent.reporter = Reporter(
        agent.cfg.report,
        agent.node,
        token,
        agent.latest,
        agent.executor,
        submit_orders=agent.submit_orders,
        boot_id=agent.boot_id(),
        rng=random.Random(7),
    )
    return agent.reporter


def test_report_wire_format_is_the_documented_contract(node: FakeNode):
    with ReportAPI({"gpu-node-01": TOKEN}) as api:
        agent = reporting_agent(node, api, lib=dbe_gpu3())
        agent.collect_once()
        assert make_reporter(agent).report_once() == []
        (body,) = api.reports
    assert set(body) == {
        "schema_version",
        "node",
        "agent_version",
        "heartbeat_at",
        "collected_at",
        "boot_id",
        "collectors",
        "findings",
        "metrics",
        "order_results",
    }
    assert body["schema_version"] == 1 and body["node"] == "gpu-node-01"
    assert body["heartbeat_at"].endswith("Z") and body["boot_id"]
    assert body["collectors"]["gpu"] == {"status": "ok", "errors": []}
    f = next(f for f in body["findings"] if f["code"] == "gpu_ecc_uncorrected")
    assert f == {
        "code": "gpu_ecc_uncorrected",
        "severity": "critical",
        "device": "gpu3",
        "gpu_uuid": "GPU-a1000003-5c1e-4b3a-9f00-000000000003",
        "bus_id": "0000:4e:00.0",
        "recommended_action": "reset_gpu",
        "message": f["message"],
        "evidence": {"uncorrected_volatile": 2, "threshold": 0},
    }
    assert body["metrics"]["gpu_count"] == 8 and len(body["metrics"]["gpus"]) == 8
    assert body["order_results"] == []


@pytest.mark.parametrize("token", ["wrong-token", TOKEN + "x"])
def test_a_wrong_node_token_is_refused_with_403(node: FakeNode, token):
    with ReportAPI({"gpu-node-01": TOKEN, "gpu-node-02": "other"}) as api:
        agent = reporting_agent(node, api)
        agent.collect_once()
        with pytest.raises(ReportError, match="refused the node token \\(HTTP 403"):
            make_reporter(agent, token=token).report_once()
        assert api.reports == []


def test_another_nodes_token_may_not_report_for_this_node(node: FakeNode):
    with ReportAPI({"gpu-node-01": TOKEN, "gpu-node-02": "tok-02"}) as api:
        agent = reporting_agent(node, api)
        agent.collect_once()
        with pytest.raises(ReportError, match="HTTP 403"):
            make_reporter(agent, token="tok-02").report_once()


def test_orders_from_the_response_run_once_and_their_results_come_back(node: FakeNode, command_log):
    with ReportAPI({"gpu-node-01": TOKEN}) as api:
        api.order("gpu-node-01", id="o-1", action="reset_gpu", target="3", dry_run=False, reason="DBE")
        api.order("gpu-node-01", id="o-2", action="drop_caches", target="", dry_run=True)
        api.order("gpu-node-01", id="o-3", action="restart_service", target="sshd", dry_run=False)
        agent = reporting_agent(node, api)
        agent.collect_once()
        rep = make_reporter(agent)
        orders = rep.report_once()
        assert [o["id"] for o in orders] == ["o-1", "o-2", "o-3"]
        for o in orders:
            agent.executor.execute(o)
        assert rep.report_once() == []  # results delivered -> the API stops ordering
        results = {r["id"]: r for r in api.reports[-1]["order_results"]}
        assert rep.report_once() == [] and api.reports[-1]["order_results"] == []  # sent once after a 2xx
    assert results["o-1"]["status"] == "succeeded" and results["o-1"]["action"] == "reset_gpu"
    assert results["o-2"]["status"] == "dry_run" and "drop_caches" in results["o-2"]["message"]
    assert results["o-3"]["status"] == "rejected" and "restartable_services" in results["o-3"]["message"]
    assert results["o-1"]["started_at"].endswith("Z")
    assert logged_commands(command_log) == [f"nvidia-smi --gpu-reset -i {healthy_8xa100().gpus[3].uuid}"]
    assert (node.proc / "sys/vm/drop_caches").read_text() == "0\n"  # dry run changed nothing


def test_results_are_resent_until_the_api_accepts_them(node: FakeNode):
    with ReportAPI({"gpu-node-01": TOKEN}) as api:
        agent = reporting_agent(node, api)
        agent.collect_once()
        rep = make_reporter(agent)
        agent.executor.execute({"id": "o-9", "action": "drop_caches", "target": "", "dry_run": True})
        api.status_override = 503
        with pytest.raises(ReportError, match="HTTP 503"):
            rep.report_once()
        api.status_override = None
        rep.report_once()
        assert [r["id"] for r in api.reports[-1]["order_results"]] == ["o-9"]


def test_backoff_grows_to_the_cap_with_jitter():
    rep = Reporter(
        ReportConfig(enabled=True, api_url="http://127.0.0.1:1", backoff_initial_s=2, backoff_max_s=60),
        "n",
        "t",
        lambda: None,
        None,
        rng=random.Random(1),
    )
    waits = [rep.backoff_s(n) for n in range(1, 9)]
    for n, w in enumerate(waits, 1):
        d = min(60, 2 * 2 ** (n - 1))
        assert d / 2 <= w <= d
    assert waits[-1] >= 30


def test_api_down_then_up_the_agent_keeps_exporting_and_sends_only_the_latest_state(node: FakeNode):
    api = ReportAPI({"gpu-node-01": TOKEN})
    api.delay_s = 1.5  # a hung API: every request takes 1.5 s
    with api:
        agent = reporting_agent(
            node, api, exporter={"enabled": True, "listen_address": "127.0.0.1", "port": 0}, interval_s=0.2
        )
        stop = threading.Event()
        t = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        t.start()
        try:
            assert agent.ready.wait(10)
            for _ in range(5):  # scrapes answer fast while the reporter is stuck in the API
                start = time.monotonic()
                with urllib.request.urlopen(f"http://127.0.0.1:{agent.exporter_port}/metrics", timeout=5) as r:
                    text = r.read().decode()
                assert time.monotonic() - start < 1.0
                assert "dlts_gpu_temperature_celsius" in text
            api.delay_s = 0
            api.status_override = 503
            assert _wait_for(lambda: agent.latest().report.consecutive_failures >= 2)
            reports_while_down = len(api.reports)
            api.status_override = None
            assert _wait_for(lambda: len(api.reports) > reports_while_down + 1)
            last = api.reports[-1]
            assert agent.latest().report.consecutive_failures == 0
            assert agent.registry.get_sample_value("dlts_node_report_failures_total") >= 1
        finally:
            stop.set()
            t.join(10)
    # the report carries a recent collection, not the first one queued while the API was down
    first_collected = api.reports[0]["collected_at"]
    assert last["collected_at"] > first_collected
    assert not t.is_alive()


def _wait_for(cond, timeout_s: float = 8.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_the_exporter_port_cannot_trigger_actions(node: FakeNode, command_log):
    with ReportAPI({"gpu-node-01": TOKEN}) as api:
        agent = reporting_agent(node, api, exporter={"enabled": True, "listen_address": "127.0.0.1", "port": 0})
        stop = threading.Event()
        t = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        t.start()
        try:
            assert agent.ready.wait(10)
            body = json.dumps({"orders": [{"id": "x", "action": "reboot", "target": "", "force": True}]}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{agent.exporter_port}/report", data=body, method="POST")
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(req, timeout=5).read()
            assert refused.value.code == 501  # the metrics port has no method that accepts input
            with pytest.raises(urllib.error.HTTPError) as missing:
                urllib.request.urlopen(f"http://127.0.0.1:{agent.exporter_port}/report", timeout=5).read()
            assert missing.value.code == 404
            time.sleep(0.3)
        finally:
            stop.set()
            t.join(10)
    assert logged_commands(command_log) == []
    assert "x" not in agent.state.orders


def test_plain_http_to_a_remote_api_is_refused_at_start_up():
    with pytest.raises(ConfigError, match="report.api_url.*https"):
        config_from_mapping({"report": {"enabled": True, "api_url": "http://dlts.example.com"}})
    config_from_mapping({"report": {"enabled": True, "api_url": "http://dlts.lab", "allow_insecure_http": True}})


def test_node_token_from_environment_or_file(tmp_path):
    cfg = ReportConfig(node_token_file=str(tmp_path / "missing"))
    assert read_node_token(cfg, {"DLTS_AGENT_NODE_TOKEN": "abc"}) == "abc"
    with pytest.raises(ConfigError, match="report.node_token_file.*DLTS_AGENT_NODE_TOKEN"):
        read_node_token(cfg, {})


def test_systemd_gets_ready_then_watchdog_pings(node: FakeNode, tmp_path, monkeypatch):
    import socket

    sock_path = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(sock_path)
    listener.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", sock_path)
    agent = Agent(agent_config(node, interval_s=0.1), nvml_lib=healthy_8xa100())
    stop = threading.Event()
    t = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    t.start()
    try:
        messages = [listener.recv(256).decode() for _ in range(3)]
    finally:
        stop.set()
        t.join(10)
        listener.close()
    assert messages[0] == "READY=1" and messages[1:] == ["WATCHDOG=1", "WATCHDOG=1"]
