"""`dlts-agent --once`, the config file (every key validated with its name), the exposition format,
the textfile mode, and the systemd unit verified by systemd-analyze."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from agent_testkit import FakeNode, agent_config
from prometheus_client.parser import text_string_to_metric_families

from dlts_agent.agent import Agent
from dlts_agent.cli import main
from dlts_agent.config import AgentConfig, ConfigError, config_from_mapping, load_config
from dlts_testing.fake_nvml import dbe_gpu3

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "agents/systemd/dlts-agent.service"
EXAMPLE = REPO / "agents/dlts-agent.yaml.example"
AGENT_BIN = Path(sys.executable).parent / "dlts-agent"


def write_config(node: FakeNode, **extra) -> Path:
    data = {
        "node_name": "gpu-node-01",
        "expected_gpu_count": 8,
        "state_dir": str(node.root / "state"),
        "collectors": {"host": {"mounts": [str(node.root)]}, "xid": {"kmsg_path": str(node.kmsg)}},
        "paths": {"proc": str(node.proc), "sys": str(node.sys)},
        **extra,
    }
    path = node.root / "agent.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(AGENT_BIN), *args], capture_output=True, text=True, timeout=60)


def test_once_prom_prints_valid_exposition_text_and_the_findings(node: FakeNode):
    cfg = write_config(node)
    proc = run_cli("--config", str(cfg), "--once", "--format", "prom", "--fake-nvml", "dbe-gpu3")
    assert proc.returncode == 0, proc.stderr
    fams = {f.name: f for f in text_string_to_metric_families(proc.stdout)}
    assert "dlts_gpu_ecc_errors" in fams and fams["dlts_gpu_ecc_errors"].type == "counter"
    assert "# finding critical gpu_ecc_uncorrected gpu3 -> reset_gpu" in proc.stdout
    unc = [
        s
        for s in fams["dlts_gpu_ecc_errors"].samples
        if s.labels["gpu"] == "3" and s.labels["type"] == "uncorrected" and s.labels["counter"] == "volatile"
    ]
    assert unc[0].value == 2


def test_once_json_has_collectors_findings_and_metrics(node: FakeNode):
    cfg = write_config(node)
    proc = run_cli("--config", str(cfg), "--once", "--format", "json", "--fake-nvml", "fallen-off-bus")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["node"] == "gpu-node-01"
    assert out["collectors"]["gpu"]["status"] == "ok"
    assert {f["code"] for f in out["findings"]} == {"gpu_lost", "gpu_count_low"}
    assert out["metrics"]["gpus"][5]["lost"] is True


def test_once_on_a_machine_without_nvidia_driver_tells_the_truth(node: FakeNode):
    cfg = write_config(node)
    proc = run_cli("--config", str(cfg), "--once", "--format", "json")  # the real pynvml, no driver here
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    if _nvml_works():  # a lent GPU machine: the real GPUs must be read
        assert out["collectors"]["gpu"]["status"] == "ok" and out["metrics"]["gpu_count"] >= 1
        return
    assert out["collectors"]["gpu"]["status"] == "failed"
    assert "NVML" in out["collectors"]["gpu"]["errors"][0]
    assert [f["code"] for f in out["findings"]] == ["gpu_telemetry_unavailable"]


def _nvml_works() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.parametrize(
    "data, message",
    [
        ({"intervall_s": 5}, "unknown config key intervall_s"),
        ({"collectors": {"gpu": {"enabeld": False}}}, "unknown config key collectors.gpu.enabeld"),
        ({"interval_s": "fast"}, "interval_s: expected a number"),
        ({"interval_s": 0}, "interval_s: must be greater than 0"),
        ({"exporter": {"port": 70000}}, "exporter.port"),
        ({"exporter": {"textfile_path": "/run/prometheus/agent.txt"}}, "exporter.textfile_path.*\\.prom"),
        ({"collectors": {"xid": {"source": "dmesg"}}}, "collectors.xid.source"),
        ({"collectors": {"nfs": {"mounts": "/mnt/home"}}}, "collectors.nfs.mounts: expected a list"),
        ({"thresholds": {"disk_used_warning_ratio": 0.99, "disk_used_critical_ratio": 0.9}}, "disk_used"),
        ({"actions": {"restartable_services": ["rm -rf /"]}}, "actions.restartable_services"),
        ({"expected_gpu_count": True}, "expected_gpu_count: expected a whole number"),
        ({"report": {"enabled": True, "api_url": "ftp://x"}}, "report.api_url"),
    ],
)
def test_a_bad_config_value_names_its_key(data, message):
    with pytest.raises(ConfigError, match=message):
        config_from_mapping(data)


def test_config_errors_stop_the_cli_with_exit_code_2_and_no_traceback(tmp_path, capsys):
    bad = tmp_path / "agent.yaml"
    bad.write_text("exporter:\n  port: many\n")
    assert main(["--config", str(bad), "--check-config"]) == 2
    err = capsys.readouterr().err
    assert "exporter.port: expected a whole number" in err and "Traceback" not in err
    bad.write_text("exporter: [unclosed\n")
    assert main(["--config", str(bad)]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    assert main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_the_example_config_documents_exactly_the_defaults():
    assert load_config(str(EXAMPLE), env={}) == AgentConfig()


def test_every_config_key_is_documented():
    doc = (REPO / "docs/agent.md").read_text()
    example = yaml.safe_load(EXAMPLE.read_text())

    def keys(d, prefix=""):
        for k, v in d.items():
            yield f"{prefix}{k}"
            if isinstance(v, dict):
                yield from keys(v, f"{prefix}{k}.")

    missing = [k for k in keys(example) if f"`{k}`" not in doc]
    assert missing == []


def test_textfile_mode_writes_atomically_a_file_node_exporter_can_read(node: FakeNode):
    out = node.root / "textfile" / "dlts_agent.prom"
    out.parent.mkdir()
    agent = Agent(agent_config(node, exporter={"enabled": False, "textfile_path": str(out)}), nvml_lib=dbe_gpu3())
    agent.collect_once()
    text = out.read_text()
    assert os.listdir(out.parent) == ["dlts_agent.prom"]  # no temp file left behind
    fams = list(text_string_to_metric_families(text))
    assert any(f.name == "dlts_gpu_row_remap_pending" for f in fams)
    assert all(s.timestamp is None for f in fams for s in f.samples)  # node_exporter rejects timestamps
    inode = out.stat().st_ino
    agent.collect_once()
    assert out.stat().st_ino != inode  # replaced by rename, never rewritten in place


def test_metric_names_follow_the_conventions(node: FakeNode):
    agent = Agent(agent_config(node), nvml_lib=dbe_gpu3())
    agent.collect_once()
    from prometheus_client.exposition import generate_latest

    for fam in text_string_to_metric_families(generate_latest(agent.registry).decode()):
        assert fam.name.startswith(("dlts_node_", "dlts_gpu_")), fam.name
        for s in fam.samples:
            if fam.type == "counter":
                assert s.name.endswith(("_total", "_created")), s.name
            assert not re.search(r"_(kb|mb|gb|ms|percent|milliwatts)\b", s.name), s.name


@pytest.fixture(scope="module")
def systemd_analyze() -> str:
    exe = shutil.which("systemd-analyze")
    assert exe, "systemd-analyze is required (apt-get install systemd)"
    return exe


def _verify(unit_text: str, tmp_path: Path, systemd_analyze: str) -> subprocess.CompletedProcess:
    path = tmp_path / "dlts-agent.service"
    path.write_text(unit_text)
    return subprocess.run([systemd_analyze, "verify", str(path)], capture_output=True, text=True, timeout=60)


def test_systemd_unit_verifies_cleanly(tmp_path, systemd_analyze):
    # The unit names the packaged path; point it at this venv's console script, nothing else changes.
    text = UNIT.read_text().replace("/usr/local/bin/dlts-agent", str(AGENT_BIN))
    proc = _verify(text, tmp_path, systemd_analyze)
    assert proc.returncode == 0, proc.stderr
    assert "dlts-agent.service" not in proc.stderr, proc.stderr  # no warnings about our unit either


def test_systemd_unit_has_the_required_settings():
    text = UNIT.read_text()
    for setting in (
        "Type=notify",
        "WatchdogSec=",
        "Restart=on-failure",
        "EnvironmentFile=",
        "MemoryMax=",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "CapabilityBoundingSet=",
        "StateDirectory=dlts-agent",
    ):
        assert setting in text, setting


def test_systemd_verify_catches_a_broken_unit(tmp_path, systemd_analyze):
    text = UNIT.read_text()  # /usr/local/bin/dlts-agent does not exist on this machine
    assert (
        _verify(text.replace("/usr/local/bin/dlts-agent", str(tmp_path / "nope")), tmp_path, systemd_analyze).returncode
        != 0
    )


def test_the_service_refuses_to_start_without_its_node_token(node: FakeNode, capsys, monkeypatch):
    monkeypatch.delenv("DLTS_AGENT_NODE_TOKEN", raising=False)
    cfg = write_config(
        node,
        report={"enabled": True, "api_url": "http://127.0.0.1:9", "node_token_file": str(node.root / "missing-token")},
        exporter={"enabled": False},
    )
    assert main(["--config", str(cfg), "--fake-nvml", "healthy-8xa100"]) == 2
    err = capsys.readouterr().err
    assert "report.node_token_file" in err and "DLTS_AGENT_NODE_TOKEN" in err and "Traceback" not in err
