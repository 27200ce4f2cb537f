"""The gpu_diag order: dcgmi diag's JSON read in DCGM 3's and DCGM 4's documents (fake dcgmi
replaying fixtures), the jobs precondition, a missing dcgmi, and a run that established nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_testkit import FakeNode, agent_config, logged_commands

from dlts_agent.agent import Agent
from dlts_agent.dcgm import DiagOutputError, parse_diag
from dlts_agent.model import OrderStatus
from dlts_testing.fake_nvml import FakeDriver, healthy_8xa100, remap_failure

FIXTURES = Path(__file__).parent / "fixtures"


def agent_on(node: FakeNode, lib=None, **overrides) -> Agent:
    agent = Agent(agent_config(node, **overrides), nvml_lib=lib or healthy_8xa100())
    agent.collect_once()
    return agent


def test_dcgm3_output_with_a_warning_line_and_nulls_passes():
    diag = parse_diag((FIXTURES / "dcgmi_diag_r1_pass.txt").read_text())
    assert (diag.version, diag.ran, diag.failed) == ("3.3.9", 9, [])
    assert "Page Retirement/Row Remap" in diag.passed


def test_dcgm4_output_names_the_failed_test_its_gpu_and_the_warning():
    diag = parse_diag((FIXTURES / "dcgmi_diag_r1_fail_dcgm4.json").read_text())
    assert diag.failed == ["Page Retirement/Row Remap (GPU 3: GPU 3 had uncorrectable memory errors and row remapping "
                           "failed. Drain the GPU and reset it or reboot the node.)"]
    assert len(diag.passed) == 8


@pytest.mark.parametrize("text", ["", "Error: unable to connect to the host engine", "{not json", '{"other": {}}'])
def test_output_without_a_diagnostic_is_an_error(text):
    with pytest.raises(DiagOutputError):
        parse_diag(text)


def test_a_passing_level_1_run_on_the_named_gpus(node, command_log):
    result = agent_on(node).executor.execute({"id": "d1", "action": "gpu_diag", "target": "1:3,5"})
    assert result.status is OrderStatus.SUCCEEDED, result.message
    assert result.message == "dcgmi diag -r 1 -j -i 3,5: 9 tests passed"
    assert logged_commands(command_log)[-1] == "dcgmi diag -r 1 -j -i 3,5"


def test_a_failing_run_fails_the_order_with_dcgms_words(node, command_log, monkeypatch):
    monkeypatch.setenv("DLTS_FAKE_DCGMI_OUTPUT", str(FIXTURES / "dcgmi_diag_r1_fail_dcgm4.json"))
    monkeypatch.setenv("DLTS_FAKE_DCGMI_RC", "1")
    result = agent_on(node).executor.execute({"id": "d1", "action": "gpu_diag", "target": "1"})
    assert result.status is OrderStatus.FAILED
    assert result.message.startswith("dcgmi diag -r 1 -j: failed: Page Retirement/Row Remap (GPU 3: GPU 3 had")
    assert logged_commands(command_log)[-1] == "dcgmi diag -r 1 -j"  # no -i: every GPU


def test_a_non_zero_exit_without_json_fails(node, command_log, monkeypatch, tmp_path):
    (tmp_path / "out").write_text("Error: Unable to connect to the host engine at localhost.\n")
    monkeypatch.setenv("DLTS_FAKE_DCGMI_OUTPUT", str(tmp_path / "out"))
    monkeypatch.setenv("DLTS_FAKE_DCGMI_RC", "249")
    result = agent_on(node).executor.execute({"id": "d1", "action": "gpu_diag", "target": "1"})
    assert result.status is OrderStatus.FAILED and "exited 249 without a result" in result.message
    assert "Unable to connect to the host engine" in result.message


def test_without_dcgmi_the_order_is_skipped(node, command_log, tmp_path):
    agent = agent_on(node, actions={"dcgmi": str(tmp_path / "no-such-dcgmi")})
    result = agent.executor.execute({"id": "d1", "action": "gpu_diag", "target": "1"})
    assert result.status is OrderStatus.SKIPPED and "not installed" in result.message


def test_a_gpu_a_job_uses_is_not_diagnosed_unless_forced(node, command_log):
    node.add_process(4242, {"DLTS_JOB_ID": "77", "DLTS_USER": "alice", "DLTS_VC": "vision", "CUDA_VISIBLE_DEVICES": "3"})
    agent = agent_on(node)
    refused = agent.executor.execute({"id": "d1", "action": "gpu_diag", "target": "1:3"})
    assert refused.status is OrderStatus.REJECTED and "job 77" in refused.message
    assert not any(c.startswith("dcgmi") for c in logged_commands(command_log))
    forced = agent.executor.execute({"id": "d2", "action": "gpu_diag", "target": "1:3", "force": True})
    assert forced.status is OrderStatus.SUCCEEDED


@pytest.mark.parametrize("target", ["", "5", "1:99", "one"])
def test_a_bad_target_is_rejected(node, command_log, target):
    result = agent_on(node).executor.execute({"id": "d1", "action": "gpu_diag", "target": target})
    assert result.status is OrderStatus.REJECTED, result.message


def test_the_fake_driver_diagnoses_the_fake_gpus_in_dcgms_format():
    """The demo's and the repair tests' dcgmi: what it prints is read by the same parser."""
    lib = remap_failure()
    bad = next(i for i, g in enumerate(lib.gpus) if (g.remapped_rows or (0, 0, 0, 0))[3])
    rc, out = FakeDriver(lib)(["dcgmi", "diag", "-r", "1", "-j", "-i", str(bad)], 60)
    assert rc != 0 and parse_diag(out).failed[0].startswith(f"Page Retirement/Row Remap (GPU {bad}: GPU {bad} has a row")
    rc, out = FakeDriver(healthy_8xa100())(["dcgmi", "diag", "-r", "1", "-j"], 60)
    assert rc == 0 and parse_diag(out).ran == 9
