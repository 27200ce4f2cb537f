"""POST /nodes/{name}/report: node tokens, heartbeat, health, findings history, orders and results;
cordon/uncordon/repair; and end to end, the real agent reporter (dlts_agent) over HTTP."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from dlts.models import Node, NodeFinding, NodeOrder, NodeState
from dlts.services import nodes as node_service

from .helpers import assert_envelope


@pytest.fixture
def node_token(sessions) -> str:
    with sessions() as s:
        return node_service.issue_node_token(s, "testnode")


def report(findings=(), order_results=(), node="testnode"):
    return {"schema_version": 1, "node": node, "agent_version": "1.0", "heartbeat_at": "2026-11-29T20:00:00.000Z",
            "collected_at": "2026-11-29T20:00:00.000Z", "boot_id": "b1",
            "collectors": {"gpu": {"status": "ok", "errors": []}}, "findings": list(findings),
            "metrics": {"gpu_count": 4, "load1": 0.5}, "order_results": list(order_results)}


ECC = {"code": "gpu_ecc_uncorrected", "severity": "critical", "device": "gpu3", "gpu_uuid": "GPU-3", "bus_id": "0000:3b:00.0",
       "recommended_action": "reset_gpu", "message": "2 uncorrected ECC errors", "evidence": {"count": 2}}


def test_tokens_missing_wrong_or_of_another_node_are_refused(client, world, sessions, node_token):
    assert_envelope(client.post("/api/v1/nodes/testnode/report", json=report()), 401)
    assert_envelope(client.post("/api/v1/nodes/testnode/report", json=report(), headers={"Authorization": "Bearer dltsn_wrong"}),
                    403, "wrong_node_token")
    with sessions() as s:
        s.add(Node(name="other", sku="demo-gpu", gpus=4, cpu=8, memory_bytes=2**30, ib_domain="x", labels={}, metrics={}))
        s.commit()
        other = node_service.issue_node_token(s, "other")
    assert_envelope(client.post("/api/v1/nodes/testnode/report", json=report(), headers={"Authorization": f"Bearer {other}"}), 403)
    # a valid token with a body naming another node
    assert_envelope(client.post("/api/v1/nodes/testnode/report", json=report(node="other"),
                                headers={"Authorization": f"Bearer {node_token}"}), 400)
    assert_envelope(client.post("/api/v1/nodes/nosuch/report", json=report(node="nosuch"),
                                headers={"Authorization": f"Bearer {node_token}"}), 403)


def test_a_new_token_replaces_the_old_one_and_the_cli_issues_it(client, world, sessions, settings, node_token, monkeypatch):
    from dlts.cli import main

    monkeypatch.setenv("DLTS_DATABASE_URL", settings.database_url)
    result = CliRunner().invoke(main, ["node", "token", "testnode"])
    assert result.exit_code == 0, result.output
    fresh = result.output.strip()
    assert fresh.startswith("dltsn_")
    assert client.post("/api/v1/nodes/testnode/report", json=report(), headers={"Authorization": f"Bearer {fresh}"}).status_code == 200
    assert_envelope(client.post("/api/v1/nodes/testnode/report", json=report(), headers={"Authorization": f"Bearer {node_token}"}), 403)
    bad = CliRunner().invoke(main, ["node", "token", "nosuch"])
    assert bad.exit_code != 0 and "No node named" in bad.output


def test_a_deployment_registers_its_own_token_idempotently(client, world, sessions, settings, tmp_path, monkeypatch):
    from dlts.cli import main

    monkeypatch.setenv("DLTS_DATABASE_URL", settings.database_url)
    token_file = tmp_path / "node-token"
    token_file.write_text("a" * 64 + "\n")  # e.g. sha256(vault seed + ":" + host), as the Ansible role writes it
    outputs = []
    for _ in range(2):
        result = CliRunner().invoke(main, ["node", "token", "testnode", "--token-file", str(token_file)])
        assert result.exit_code == 0 and "a" * 64 not in result.output, result.output
        outputs.append(result.output.strip())
    # the second run says it changed nothing: Ansible's changed_when reads this
    assert outputs == ["token of node testnode registered", "token of node testnode unchanged"]
    piped = CliRunner().invoke(main, ["node", "token", "testnode", "--token-file", "-"], input="a" * 64 + "\n")
    assert piped.output.strip() == "token of node testnode unchanged"  # '-' reads standard input
    auth = {"Authorization": "Bearer " + "a" * 64}
    assert client.post("/api/v1/nodes/testnode/report", json=report(), headers=auth).status_code == 200
    token_file.write_text("short\n")
    bad = CliRunner().invoke(main, ["node", "token", "testnode", "--token-file", str(token_file)])
    assert bad.exit_code != 0 and "at least 32 characters" in bad.output


def test_findings_history_health_and_heartbeat(client, world, sessions, node_token):
    auth = {"Authorization": f"Bearer {node_token}"}
    assert client.post("/api/v1/nodes/testnode/report", json=report([ECC]), headers=auth).get_json()["orders"] == []
    node = client.get("/api/v1/nodes/testnode", headers=world.auth("admin")).get_json()
    assert node["health"] == "critical" and node["last_heartbeat_at"] is not None
    assert node["details"]["metrics"]["gpu_count"] == 4
    finding = node["details"]["findings"][0]
    assert (finding["code"], finding["device"], finding["cleared_at"]) == ("gpu_ecc_uncorrected", "gpu3", None)
    assert finding["evidence"]["message"] == "2 uncorrected ECC errors"
    client.post("/api/v1/nodes/testnode/report", json=report([ECC]), headers=auth)
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(NodeFinding.id))) == 1  # the same finding again: one row, seen later
    client.post("/api/v1/nodes/testnode/report", json=report([]), headers=auth)
    node = client.get("/api/v1/nodes/testnode", headers=world.auth("admin")).get_json()
    assert node["health"] == "ok" and node["details"]["findings"][0]["cleared_at"] is not None


def test_repair_orders_are_sent_once_and_results_recorded_without_changing_the_node_state(client, world, sessions, node_token):
    auth = {"Authorization": f"Bearer {node_token}"}
    order = client.post("/api/v1/nodes/testnode/repair", json={"action": "reset_gpu", "target": "3", "reason": "ECC"},
                        headers=world.auth("admin"))
    assert order.status_code == 202, order.get_json()
    order_id = order.get_json()["id"]
    node = client.get("/api/v1/nodes/testnode", headers=world.auth("bob")).get_json()
    # a hand-made order is one action, not a repair: the repair loop alone moves the node's state
    assert (node["state"], node["repair"]) == ("in_service", None)
    assert_envelope(client.post("/api/v1/nodes/testnode/repair", json={"action": "reboot"}, headers=world.auth("admin")),
                    409, "repair_in_progress")
    assert_envelope(client.post("/api/v1/nodes/testnode/repair", json={"action": "reset_gpu"}, headers=world.auth("admin")), 400)
    orders = client.post("/api/v1/nodes/testnode/report", json=report(), headers=auth).get_json()["orders"]
    assert orders == [{"id": order_id, "action": "reset_gpu", "target": "3", "dry_run": False, "reason": "ECC"}]
    result = {"id": order_id, "action": "reset_gpu", "target": "3", "status": "succeeded", "message": "reset gpu 3",
              "dry_run": False, "started_at": "2026-11-29T20:00:01.000Z", "finished_at": "2026-11-29T20:00:02.000Z"}
    assert client.post("/api/v1/nodes/testnode/report", json=report(order_results=[result]), headers=auth).get_json()["orders"] == []
    # the agent re-sends a result until it sees a 2xx: recorded once
    client.post("/api/v1/nodes/testnode/report", json=report(order_results=[result | {"status": "failed"}]), headers=auth)
    # results for orders that are not ours are ignored, whatever their id looks like
    strangers = [result | {"id": i} for i in ("9" * 128, "-1", "abc", "99999")]
    assert client.post("/api/v1/nodes/testnode/report", json=report(order_results=strangers), headers=auth).status_code == 200
    with sessions() as s:
        row = s.get(NodeOrder, int(order_id))
        assert (row.status, row.result["agent"]["message"]) == ("done", "reset gpu 3")
        node = s.scalar(sa.select(Node).where(Node.name == "testnode"))
        assert node.state is NodeState.IN_SERVICE  # a "done" order never returns a node unvalidated


def test_a_cluster_admin_orders_a_gpu_diagnostic_by_hand(client, world, sessions, node_token):
    """docs/repair.md: `POST /nodes/{name}/repair` with action gpu_diag and target LEVEL[:GPUS]; the
    agent gets it with its next report, and its "skipped" (no dcgmi) is recorded as a failed order."""
    for target in (None, "", "5", "1:", "1:3,", "x:3", "1:3:4"):
        body = {"action": "gpu_diag"} | ({} if target is None else {"target": target})
        refused = client.post("/api/v1/nodes/testnode/repair", json=body, headers=world.auth("admin"))
        assert_envelope(refused, 400)
        assert "target" in str(refused.get_json()["error"]), (target, refused.get_json())
    order = client.post("/api/v1/nodes/testnode/repair", json={"action": "gpu_diag", "target": "1:3,GPU-7"},
                        headers=world.auth("admin"))
    assert order.status_code == 202, order.get_json()
    auth = {"Authorization": f"Bearer {node_token}"}
    orders = client.post("/api/v1/nodes/testnode/report", json=report(), headers=auth).get_json()["orders"]
    assert [(o["action"], o["target"]) for o in orders] == [("gpu_diag", "1:3,GPU-7")]
    result = {"id": orders[0]["id"], "action": "gpu_diag", "target": "1:3,GPU-7", "status": "skipped",
              "message": "dcgmi is not installed"}
    assert client.post("/api/v1/nodes/testnode/report", json=report(order_results=[result]), headers=auth).status_code == 200
    with sessions() as s:
        assert s.get(NodeOrder, int(orders[0]["id"])).status == "failed"
    unknown = client.post("/api/v1/nodes/testnode/repair", json={"action": "format_disk"}, headers=world.auth("admin"))
    assert_envelope(unknown, 400)


def test_cordon_and_uncordon_change_what_the_scheduler_may_use(client, world, sessions, settings):
    from dlts.jobmanager.snapshot import load_snapshot

    cordoned = client.post("/api/v1/nodes/testnode/cordon", headers=world.auth("admin")).get_json()
    assert (cordoned["state"], cordoned["cordoned_by"], cordoned["schedulable"]) == ("in_service", "admin", False)
    with sessions() as s:
        assert [n.schedulable for n in load_snapshot(s, settings).nodes if n.name == "testnode"] == [False]
    assert client.post("/api/v1/nodes/testnode/cordon", headers=world.auth("admin")).status_code == 200  # idempotent
    assert client.post("/api/v1/nodes/testnode/uncordon", headers=world.auth("admin")).get_json()["schedulable"] is True
    assert_envelope(client.post("/api/v1/nodes/nosuch/cordon", headers=world.auth("admin")), 404, "node_not_found")


def test_the_real_agent_reporter_talks_to_the_real_api(live, world, sessions):
    """dlts_agent's Reporter and ActionExecutor against the API served over HTTP: findings arrive, a
    dry-run order travels to the agent, and its result comes back and is stored."""
    from dlts_agent.actions import ActionExecutor
    from dlts_agent.config import ActionsConfig, ReportConfig
    from dlts_agent.model import (
        AgentSnapshot,
        Collection,
        Finding,
        FindingCode,
        RecommendedAction,
        Severity,
    )
    from dlts_agent.reporter import Reporter
    from dlts_agent.state import AgentState

    with sessions() as s:
        token = node_service.issue_node_token(s, "testnode")
    finding = Finding(FindingCode.GPU_ECC_UNCORRECTED, Severity.CRITICAL, "gpu1", RecommendedAction.RESET_GPU,
                      "uncorrected ECC errors on GPU 1", {"count": 3}, gpu_uuid="GPU-1", bus_id="0000:1b:00.0")
    snapshot = AgentSnapshot("testnode", "e2e", Collection(time.time(), {}), (finding,), {}, {})
    ran: list = []
    executor = ActionExecutor(ActionsConfig(), AgentState(None), lambda: snapshot,
                              runner=lambda argv, timeout_s: ran.append(argv) or (0, ""))
    cfg = ReportConfig(enabled=True, api_url=live.url, timeout_s=5)
    reporter = Reporter(cfg, "testnode", token, lambda: snapshot, executor, boot_id="boot-1")
    assert reporter.report_once() == []
    with sessions() as s:
        node = s.scalar(sa.select(Node).where(Node.name == "testnode"))
        assert node.health == "critical" and node.last_heartbeat_at is not None and node.metrics["agent_version"] == "e2e"
        assert [(f.code, f.device) for f in s.scalars(sa.select(NodeFinding))] == [("gpu_ecc_uncorrected", "gpu1")]
    admin = {"Authorization": f"Bearer {world.tokens['admin']}"}
    import requests

    order = requests.post(f"{live.url}/api/v1/nodes/testnode/repair", json={"action": "drop_caches", "dry_run": True},
                          headers=admin, timeout=5).json()
    orders = reporter.report_once()
    assert [o["id"] for o in orders] == [order["id"]]
    results = [executor.execute(o) for o in orders]
    assert results[0].status.value == "dry_run" and ran == []  # dry run: nothing executed
    assert reporter.report_once() == []
    with sessions() as s:
        row = s.get(NodeOrder, int(order["id"]))
        assert row.status == "done" and row.result["agent"]["status"] == "dry_run"
    bad = Reporter(cfg, "testnode", "dltsn_wrong", lambda: snapshot, None)
    from dlts_agent.reporter import ReportError

    with pytest.raises(ReportError, match="HTTP 403"):
        bad.report_once()


def _ready_endpoint(sessions, settings, user: str, host_port: int) -> int:
    from dlts.models import EndpointKind, EndpointStatus, JobEndpoint, JobStatus

    from .helpers import make_job

    job_id = make_job(sessions, settings, user, status=JobStatus.RUNNING)
    with sessions() as s:
        s.add(JobEndpoint(job_id=job_id, kind=EndpointKind.SSH, name="ssh", port=22, status=EndpointStatus.READY,
                          attempt=1, host="10.0.0.5", host_port=host_port, created_by=user))
        s.commit()
    return job_id


def test_the_report_response_carries_the_endpoint_firewall(client, world, sessions, settings, node_token):
    auth = {"Authorization": f"Bearer {node_token}"}
    empty = client.post("/api/v1/nodes/testnode/report", json=report(), headers=auth).get_json()["firewall"]
    assert empty["port_range"] == [30000, 32767] and empty["rules"] == []
    _ready_endpoint(sessions, settings, "alice", 31022)
    assert client.post("/api/v1/me/allowed-ips", json={"ip": "203.0.113.7"}, headers=world.auth("alice")).status_code == 201
    firewall = client.post("/api/v1/nodes/testnode/report", json=report(), headers=auth).get_json()["firewall"]
    assert firewall["rules"] == [{"port": 31022, "cidrs": ["203.0.113.7/32"]}]
    assert firewall["version"] != empty["version"]
    from dlts.services import allowlist

    with sessions() as s:
        assert allowlist.desired_state(s, settings) == firewall  # what every node gets, whoever asks
    # the documented response schema describes it
    spec = client.get("/api/v1/openapi.json").get_json()
    response = spec["paths"]["/api/v1/nodes/{name}/report"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    name = response["$ref"].rsplit("/", 1)[-1]
    assert {"orders", "firewall"} <= set(spec["components"]["schemas"][name]["properties"])


def test_the_real_agent_applies_the_api_firewall_only_when_it_changes(live, world, sessions, settings, tmp_path):
    """dlts_agent's Reporter and Firewall against the API over HTTP; nft is a recording runner here
    (tests/agent/test_firewall_nft.py runs the real nft in a network namespace)."""
    import requests

    from dlts_agent.config import FirewallConfig, ReportConfig
    from dlts_agent.firewall import Firewall
    from dlts_agent.model import AgentSnapshot, Collection
    from dlts_agent.reporter import Reporter

    with sessions() as s:
        token = node_service.issue_node_token(s, "testnode")
    scripts: list[str] = []

    def nft(argv, timeout_s):
        scripts.append(Path(argv[-1]).read_text())
        return 0, ""

    firewall = Firewall(FirewallConfig(enabled=True), str(tmp_path / "state"), nft=["nft"], runner=nft)
    snapshot = AgentSnapshot("testnode", "e2e", Collection(time.time(), {}), (), {}, {})
    reporter = Reporter(ReportConfig(enabled=True, api_url=live.url, timeout_s=5), "testnode", token, lambda: snapshot,
                        None, on_firewall=firewall.update)
    _ready_endpoint(sessions, settings, "alice", 31022)
    alice = {"Authorization": f"Bearer {world.tokens['alice']}"}
    assert requests.post(f"{live.url}/api/v1/me/allowed-ips", json={"ip": "203.0.113.7"}, headers=alice, timeout=5).ok
    reporter.report_once()
    reporter.report_once()
    assert len(scripts) == 1 and "203.0.113.7/32 . 31022" in scripts[0] and "tcp dport 30000-32767" in scripts[0]
    assert requests.post(f"{live.url}/api/v1/me/allowed-ips", json={"ip": "2001:db8:7::/48"}, headers=alice, timeout=5).ok
    reporter.report_once()
    assert len(scripts) == 2 and "2001:db8:7::/48 . 31022" in scripts[1]
    with sessions() as s:
        from dlts.services import allowlist

        assert firewall.applied_version == allowlist.desired_state(s, settings)["version"]
    assert firewall.status().pairs == 2 and (tmp_path / "state" / "firewall.nft").read_text() == scripts[1]
