"""The agent on a Lustre server serves dlts_lustre's server-side metrics: from the config file's
collectors.lustre_server to the exporter's text, against the stateful fake lctl (tests/lustre)
running as the OSS and as the MGS; rates appear from the second round."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

import pytest
from agent_testkit import agent_config

from dlts_agent.agent import Agent
from dlts_agent.config import ConfigError, load_config

LUSTRE_TESTS = Path(__file__).resolve().parents[1] / "lustre"
GIB = 1024 * 1024


def _base_state(mount: Path) -> dict:
    """The fake's state (format: tests/lustre/fakebin/fake_lustre.py): MGS "mgs", MDTs on "mds", OSTs on "oss"."""
    return {
        "version": "2.15.4", "fsname": "dltsfs", "mount": str(mount),
        "mdts": [{"index": i, "kib_total": 100 * GIB, "kib_used": 2 * GIB, "inodes_total": 50_000_000,
                  "inodes_used": 1_000_000} for i in range(2)],
        "osts": [{"index": i, "kib_total": 1000 * GIB, "kib_used": 100 * GIB, "inodes_total": 60_000_000,
                  "inodes_used": 500_000} for i in range(4)],
        "pools": {}, "users": {}, "groups": {}, "quotas": {"u": {}, "g": {}, "p": {}}, "defaults": {}, "grace": {},
        "dirs": {}, "health": "healthy",
    }


@pytest.fixture
def fake_servers(tmp_path, monkeypatch):
    state_dir = tmp_path / "fake-lustre"
    state_dir.mkdir()
    state = _base_state(tmp_path / "mnt")
    state["osts"][0]["kib_used"] = 995 * GIB  # 5 GiB of 1000 left
    state["pools"] = {"vc_a": [0, 1]}
    state["stats"] = {"obdfilter": {"OST0000": {"snapshot_time": 100.0, "counters": {
        "write_bytes": {"samples": 10, "unit": "bytes", "min": 1, "max": 1, "sum": 1000}}}}}
    (state_dir / "state.json").write_text(json.dumps(state))
    monkeypatch.setenv("DLTS_FAKE_LUSTRE_DIR", str(state_dir))
    monkeypatch.setenv("DLTS_FAKE_LUSTRE_PYTHON", sys.executable)
    monkeypatch.setenv("PATH", f"{LUSTRE_TESTS / 'fakebin'}{os.pathsep}{os.environ['PATH']}")
    return state_dir


def _config_file(node, tmp_path, **lustre_server) -> str:
    cfg = agent_config(node)  # the fake node's paths; then the file a role would write
    path = tmp_path / "agent.yaml"
    path.write_text(json.dumps({
        "node_name": "oss1", "state_dir": cfg.state_dir, "exporter": {"listen_address": "127.0.0.1", "port": 0},
        "paths": {"proc": cfg.paths.proc, "sys": cfg.paths.sys},
        "collectors": {"gpu": {"enabled": False}, "xid": {"enabled": False}, "lustre": {"enabled": False},
                       "lustre_server": {"enabled": True, "fsname": "dltsfs", **lustre_server}}}))
    return str(path)


def _scrape(agent: Agent) -> dict:
    """{(name, labels): value} of the exporter's text, parsed as Prometheus parses it."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(agent.render().decode()) for s in f.samples}


def _labels(**kv) -> frozenset:
    return frozenset(kv.items())


def test_the_agent_on_an_oss_serves_target_space_quota_enforcement_and_op_rates(node, tmp_path, fake_servers,
                                                                                monkeypatch):
    monkeypatch.setenv("DLTS_FAKE_LUSTRE_NODE", "oss")
    agent = Agent(load_config(_config_file(node, tmp_path, sections=["health", "targets", "ost_stats"]), env={}),
                  persistent=False)
    agent.collect_once()
    values = _scrape(agent)
    ost0 = {"fs": "dltsfs", "index": "0", "kind": "OST", "target": "dltsfs-OST0000"}
    assert values[("dlts_lustre_target_free_bytes", _labels(**ost0))] == 5 * GIB * 1024
    assert values[("dlts_lustre_target_quota_enforced", _labels(**ost0, type="user"))] == 0.0
    assert values[("dlts_lustre_collector_success", _labels(section="targets"))] == 1.0
    assert not [k for k in values if k[0] == "dlts_lustre_io_rate_bytes_per_second"]  # one snapshot: no rate yet
    state = json.loads((fake_servers / "state.json").read_text())
    state["stats"]["obdfilter"]["OST0000"]["snapshot_time"] = 110.0
    state["stats"]["obdfilter"]["OST0000"]["counters"]["write_bytes"].update(samples=30, sum=21000)
    (fake_servers / "state.json").write_text(json.dumps(state))
    agent.collect_once()
    values = _scrape(agent)
    assert values[("dlts_lustre_io_rate_bytes_per_second", _labels(direction="write", target="dltsfs-OST0000"))] == 2000.0
    assert agent.latest().collection.results["lustre_server"].errors == ()


def test_the_agent_on_the_mgs_serves_pool_membership_and_its_http_exporter_answers(node, tmp_path, fake_servers,
                                                                                   monkeypatch):
    monkeypatch.setenv("DLTS_FAKE_LUSTRE_NODE", "mgs")
    cfg = load_config(_config_file(node, tmp_path, sections=["health", "targets", "pools", "mdt_stats"]), env={})
    agent = Agent(cfg, persistent=False)
    agent.collect_once()
    from dlts_agent.metrics import serve_metrics

    server = serve_metrics("127.0.0.1", 0, agent.render)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/metrics", timeout=10) as r:
            text = r.read().decode()
    finally:
        server.shutdown()
    assert 'dlts_lustre_pool_ost{fs="dltsfs",pool="vc_a",target="dltsfs-OST0001"} 1.0' in text
    # the MGS holds no target: "targets" is empty, not failed
    assert 'dlts_lustre_collector_success{section="targets"} 1.0' in text
    assert "dlts_lustre_target_capacity_bytes{" not in text


@pytest.mark.parametrize("settings,message", [
    ({"fsname": ""}, "collectors.lustre_server.fsname"),
    ({"sections": ["df"]}, "df needs collectors.lustre_server.mount"),
    ({"sections": ["bogus"]}, "collectors.lustre_server.sections"),
])
def test_bad_lustre_server_settings_name_the_key(node, tmp_path, settings, message):
    with pytest.raises(ConfigError, match=message):
        load_config(_config_file(node, tmp_path, **settings), env={})
