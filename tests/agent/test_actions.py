"""Repair actions: preconditions, dry run, idempotence by order id (across restarts and a reboot),
and the commands they run (fake nvidia-smi / systemctl executables record them)."""

from __future__ import annotations

import pytest
from agent_testkit import FakeNode, agent_config, logged_commands

from dlts_agent.agent import Agent
from dlts_agent.model import OrderStatus
from dlts_testing.fake_nvml import fallen_off_bus, healthy_8xa100

UUID3 = "GPU-a1000003-5c1e-4b3a-9f00-000000000003"


def agent_on(node: FakeNode, lib=None, **overrides) -> Agent:
    agent = Agent(agent_config(node, **overrides), nvml_lib=lib or healthy_8xa100())
    agent.collect_once()
    return agent


@pytest.mark.parametrize("target", ["3", UUID3, "0000:4e:00.0", "00000000:4E:00.0"])
def test_reset_gpu_accepts_index_uuid_or_bus_id(node, command_log, target):
    result = agent_on(node).executor.execute({"id": "r1", "action": "reset_gpu", "target": target})
    assert result.status is OrderStatus.SUCCEEDED, result.message
    assert logged_commands(command_log) == [f"nvidia-smi --gpu-reset -i {UUID3}"]


def test_reset_gpu_refuses_a_gpu_a_job_is_using(node, command_log):
    node.add_process(
        4242, {"DLTS_JOB_ID": "1234", "DLTS_USER": "alice", "DLTS_VC": "vision", "CUDA_VISIBLE_DEVICES": "3"}
    )
    result = agent_on(node).executor.execute({"id": "r1", "action": "reset_gpu", "target": "3"})
    assert result.status is OrderStatus.REJECTED and "job 1234 (alice)" in result.message
    assert logged_commands(command_log) == []


def test_junk_in_another_jobs_environment_does_not_block_a_reset(node, command_log):
    node.add_process(4250, {"DLTS_JOB_ID": "99", "DLTS_USER": "mallory", "DLTS_VC": "vision",
                            "CUDA_VISIBLE_DEVICES": "\u00b2"})
    result = agent_on(node).executor.execute({"id": "r1", "action": "reset_gpu", "target": "3"})
    assert result.status is OrderStatus.SUCCEEDED, result.message
    assert logged_commands(command_log) == [f"nvidia-smi --gpu-reset -i {UUID3}"]


def test_reset_gpu_refuses_a_gpu_with_unknown_processes(node, command_log):
    lib = healthy_8xa100()
    lib.gpus[3].pids = [999]
    result = agent_on(node, lib).executor.execute({"id": "r1", "action": "reset_gpu", "target": "3"})
    assert result.status is OrderStatus.REJECTED and "processes [999]" in result.message


def test_reset_gpu_refuses_when_it_cannot_see_the_jobs(node, command_log):
    agent = agent_on(node, collectors={"jobs": {"enabled": False}})
    result = agent.executor.execute({"id": "r1", "action": "reset_gpu", "target": "3"})
    assert result.status is OrderStatus.REJECTED and "jobs collector" in result.message


def test_reset_gpu_refuses_a_lost_gpu_and_an_unknown_one(node, command_log):
    agent = agent_on(node, fallen_off_bus())
    lost = agent.executor.execute({"id": "r1", "action": "reset_gpu", "target": "5"})
    assert lost.status is OrderStatus.REJECTED and "order a reboot" in lost.message
    unknown = agent.executor.execute({"id": "r2", "action": "reset_gpu", "target": "GPU-nope"})
    assert unknown.status is OrderStatus.REJECTED and "no GPU 'GPU-nope'" in unknown.message
    assert logged_commands(command_log) == []


def test_a_failing_reset_reports_nvidia_smis_words(node, command_log, monkeypatch):
    monkeypatch.setenv("DLTS_FAKE_GPU_RESET_FAIL", "1")
    result = agent_on(node).executor.execute({"id": "r1", "action": "reset_gpu", "target": "3"})
    assert result.status is OrderStatus.FAILED
    assert "exited 255" in result.message and "currently being used" in result.message


def test_dry_run_says_what_it_would_do_and_does_nothing(node, command_log):
    agent = agent_on(node)
    results = [
        agent.executor.execute({"id": f"d{i}", "action": a, "target": t, "dry_run": True})
        for i, (a, t) in enumerate(
            [("reset_gpu", "3"), ("restart_service", "nvidia-fabricmanager"), ("reboot", ""), ("drop_caches", "")]
        )
    ]
    assert [r.status for r in results] == [OrderStatus.DRY_RUN] * 4
    assert results[0].message.startswith(
        f"would run nvidia-smi --gpu-reset -i {UUID3}".replace("nvidia-smi", agent.cfg.actions.nvidia_smi)
    )
    assert "systemctl restart nvidia-fabricmanager.service" in results[1].message
    assert logged_commands(command_log) == []
    assert (node.proc / "sys/vm/drop_caches").read_text() == "0\n"


def test_an_order_id_is_carried_out_once_even_across_restarts(node, command_log):
    agent = agent_on(node)
    first = agent.executor.execute({"id": "r1", "action": "reset_gpu", "target": "3"})
    again = agent.executor.execute({"id": "r1", "action": "reset_gpu", "target": "3"})
    assert again == first
    restarted = agent_on(node)  # a new process reads the persisted results
    assert (
        restarted.executor.execute({"id": "r1", "action": "reset_gpu", "target": "3"}).status is OrderStatus.SUCCEEDED
    )
    assert len(logged_commands(command_log)) == 1


def test_a_successful_reset_clears_that_gpus_xid_findings(node, command_log):
    node.append_kmsg("4,10,1000000,-;NVRM: Xid (PCI:0000:4e:00): 48, pid=1, name=x, DBE")
    agent = agent_on(node)
    assert [f.code.value for f in agent.latest().findings] == ["gpu_xid"]
    agent.executor.execute({"id": "r1", "action": "reset_gpu", "target": "3"})
    agent.collect_once()
    assert agent.latest().findings == ()
    assert (
        agent.registry.get_sample_value(
            "dlts_gpu_xid_errors_total",
            {"gpu": "3", "uuid": UUID3, "bus_id": "0000:4e:00.0", "xid": "48", "source": "kernel"},
        )
        == 1
    )  # history stays


def test_restart_service_only_for_allowed_units(node, command_log):
    agent = agent_on(node)
    ok = agent.executor.execute({"id": "s1", "action": "restart_service", "target": "nvidia-persistenced.service"})
    assert ok.status is OrderStatus.SUCCEEDED
    no = agent.executor.execute({"id": "s2", "action": "restart_service", "target": "sshd"})
    assert no.status is OrderStatus.REJECTED and "sshd.service" in no.message
    assert logged_commands(command_log) == ["systemctl restart nvidia-persistenced.service"]


def test_reboot_waits_for_jobs_unless_forced_and_succeeds_on_the_next_boot(node, command_log):
    node.add_process(4242, {"DLTS_JOB_ID": "1234", "CUDA_VISIBLE_DEVICES": "0"})
    agent = agent_on(node)
    refused = agent.executor.execute({"id": "b1", "action": "reboot", "target": ""})
    assert refused.status is OrderStatus.REJECTED and "1234" in refused.message
    started = agent.executor.execute({"id": "b2", "action": "reboot", "target": "", "force": True})
    assert started.status is OrderStatus.IN_PROGRESS
    assert logged_commands(command_log) == ["systemctl reboot"]
    assert [r.id for r in agent.executor.unreported()] == ["b1"]  # in progress is not a result yet
    # the node reboots: new boot id, the agent starts again and the same order arrives again
    node.set_boot_id("0b0b0b0b-0000-4000-8000-00000000000b")
    after = agent_on(node)
    after.executor.resolve_reboots()
    again = after.executor.execute({"id": "b2", "action": "reboot", "target": "", "force": True})
    assert again.status is OrderStatus.SUCCEEDED and "rebooted" in again.message
    assert logged_commands(command_log) == ["systemctl reboot"]


def test_drop_caches_writes_the_tunable(node, command_log):
    result = agent_on(node).executor.execute({"id": "c1", "action": "drop_caches"})
    assert result.status is OrderStatus.SUCCEEDED
    assert (node.proc / "sys/vm/drop_caches").read_text() == "3\n"


@pytest.mark.parametrize(
    "order, message",
    [
        ({"id": "m1", "action": "format_disks"}, "unknown action 'format_disks'"),
        ({"action": "reboot"}, "order.id must be"),
        ({"id": "m2", "action": "reboot", "dry_run": "yes"}, "dry_run and force must be true or false"),
        ({"id": "m3", "action": "reset_gpu", "target": ["3"]}, "target must be a string"),
        (["not", "an", "object"], "must be a JSON object"),
    ],
)
def test_malformed_orders_are_rejected_with_a_reason(node, command_log, order, message):
    result = agent_on(node).executor.execute(order)
    assert result.status is OrderStatus.REJECTED and message in result.message
    assert logged_commands(command_log) == []


def test_actions_can_be_switched_off(node, command_log):
    agent = agent_on(node, actions={"enabled": False})
    result = agent.executor.execute({"id": "c1", "action": "drop_caches"})
    assert result.status is OrderStatus.REJECTED and "actions.enabled" in result.message


def test_orders_are_logged_with_their_id(node, command_log, caplog):
    caplog.set_level("INFO", logger="dlts_agent.actions")
    agent_on(node).executor.execute({"id": "ord-77", "action": "drop_caches", "reason": "memory pressure"})
    assert any("order ord-77" in r.getMessage() and "memory pressure" in r.getMessage() for r in caplog.records)
    assert any("order ord-77: succeeded" in r.getMessage() for r in caplog.records)
