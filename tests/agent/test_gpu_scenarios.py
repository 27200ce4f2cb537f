"""The NVML seam: each named fake-NVML scenario read through dlts_agent.nvml, exported, and judged."""

from __future__ import annotations

import pytest
from agent_testkit import FakeNode, agent_config

from dlts_agent.agent import Agent
from dlts_agent.model import CollectorStatus, FindingCode, RecommendedAction, Severity
from dlts_agent.nvml import Nvml, NvmlUnavailable, normalize_bus_id
from dlts_testing.fake_nvml import SCENARIOS, scenario


def run_agent(node: FakeNode, name: str, expected_gpus: int = 8, lib=None) -> Agent:
    agent = Agent(agent_config(node, expected_gpu_count=expected_gpus), nvml_lib=lib or scenario(name))
    agent.collect_once()
    return agent


def codes(agent: Agent) -> set[tuple[str, str, str]]:
    return {(f.code.value, f.device, f.action.value) for f in agent.latest().findings}


def test_healthy_8xa100_reads_every_gpu_and_finds_nothing(node):
    agent = run_agent(node, "healthy-8xa100")
    gpus = agent.latest().collection.sample("gpu").gpus
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[0].bus_id == "0000:07:00.0" and gpus[0].power_watts == 312.0
    assert gpus[0].utilization_ratio == pytest.approx(0.87)
    assert agent.latest().findings == ()
    labels = {
        "gpu": "0",
        "uuid": gpus[0].uuid,
        "bus_id": "0000:07:00.0",
        "job_id": "",
        "user": "",
        "vc": "",
        "preemptible": "",
    }
    r = agent.registry
    assert r.get_sample_value("dlts_gpu_memory_total_bytes", labels) == 80 * 1024**3
    assert (
        r.get_sample_value("dlts_gpu_ecc_errors_total", {**labels, "type": "uncorrected", "counter": "volatile"}) == 0
    )
    assert r.get_sample_value("dlts_gpu_row_remap_pending", labels) == 0
    assert r.get_sample_value("dlts_gpu_retired_pages", {**labels, "cause": "single_bit"}) is None  # A100: no data
    assert r.get_sample_value("dlts_node_collector_success", {"collector": "gpu"}) == 1


def test_dbe_on_gpu3_asks_for_a_gpu_reset(node):
    agent = run_agent(node, "dbe-gpu3")
    found = codes(agent)
    assert ("gpu_ecc_uncorrected", "gpu3", "reset_gpu") in found
    assert ("gpu_row_remap_pending", "gpu3", "reset_gpu") in found
    assert ("gpu_xid", "gpu3", "reset_gpu") in found  # XID 48 arrived as an NVML event
    assert all(f.device == "gpu3" for f in agent.latest().findings)
    f = next(f for f in agent.latest().findings if f.code is FindingCode.GPU_ECC_UNCORRECTED)
    assert f.severity is Severity.CRITICAL and f.evidence["uncorrected_volatile"] == 2
    assert f.gpu_uuid == "GPU-a1000003-5c1e-4b3a-9f00-000000000003" and f.bus_id == "0000:4e:00.0"


def test_remap_pending_is_critical_and_cleared_by_a_reset(node):
    lib = scenario("remap-pending")
    agent = run_agent(node, "remap-pending", lib=lib)
    assert codes(agent) == {("gpu_row_remap_pending", "gpu1", "reset_gpu")}
    lib.reset_gpu(1)
    agent.collect_once()
    assert agent.latest().findings == ()


def test_remap_failure_asks_for_a_ticket(node):
    agent = run_agent(node, "remap-failure")
    assert codes(agent) == {("gpu_row_remap_failure", "gpu6", "ticket")}


def test_more_than_ten_retired_pages_on_a_v100(node):
    agent = run_agent(node, "retired-pages")
    assert codes(agent) == {("gpu_retired_pages", "gpu2", "ticket"), ("gpu_retired_pages_pending", "gpu2", "reboot")}
    f = next(f for f in agent.latest().findings if f.code is FindingCode.GPU_RETIRED_PAGES)
    assert f.evidence["single_bit"] == 11 and f.evidence["double_bit"] == 3
    labels = {
        "gpu": "2",
        "uuid": "GPU-v1000002-5c1e-4b3a-9f00-000000000002",
        "bus_id": "0000:47:00.0",
        "job_id": "",
        "user": "",
        "vc": "",
        "preemptible": "",
    }
    assert agent.registry.get_sample_value("dlts_gpu_retired_pages", {**labels, "cause": "double_bit"}) == 3
    assert agent.registry.get_sample_value("dlts_gpu_row_remap_pending", labels) is None  # V100: no remapper


def test_gpu_fallen_off_the_bus_is_reported_not_fatal(node):
    agent = run_agent(node, "fallen-off-bus")
    snap = agent.latest()
    assert snap.collection.status("gpu") is CollectorStatus.OK
    assert ("gpu_lost", "gpu5", "reboot") in codes(agent)
    assert ("gpu_count_low", "node", "reboot") in codes(agent)
    count_low = next(f for f in snap.findings if f.code is FindingCode.GPU_COUNT_LOW)
    assert count_low.evidence == {"expected": 8, "nvml_count": 8, "usable": 7, "lost": [5]}
    assert (
        agent.registry.get_sample_value(
            "dlts_gpu_lost",
            {"gpu": "5", "uuid": "", "bus_id": "", "job_id": "", "user": "", "vc": "", "preemptible": ""},
        )
        == 1
    )


def test_a_gpu_lost_after_start_keeps_its_identity(node):
    lib = scenario("healthy-8xa100")
    agent = run_agent(node, "healthy-8xa100", lib=lib)
    lib.fall_off_bus(4)
    agent.collect_once()
    g4 = agent.latest().collection.sample("gpu").gpus[4]
    assert g4.lost and g4.bus_id == "0000:87:00.0" and g4.uuid.startswith("GPU-a1000004")


def test_not_supported_everywhere_gives_absent_metrics_and_no_findings(node):
    agent = run_agent(node, "not-supported", expected_gpus=2)
    g = agent.latest().collection.sample("gpu").gpus[0]
    assert g.temperature_celsius is None and g.ecc_errors == {} and g.row_remap_pending is None
    assert agent.latest().findings == ()
    labels = {
        "gpu": "0",
        "uuid": g.uuid,
        "bus_id": "0000:01:00.0",
        "job_id": "",
        "user": "",
        "vc": "",
        "preemptible": "",
    }
    for name in (
        "dlts_gpu_temperature_celsius",
        "dlts_gpu_power_watts",
        "dlts_gpu_row_remap_pending",
        "dlts_gpu_recovery_action",
        "dlts_gpu_utilization_ratio",
    ):
        assert agent.registry.get_sample_value(name, labels) is None, name
    assert agent.registry.get_sample_value("dlts_gpu_lost", labels) == 0


def test_nvml_init_failure_fails_the_gpu_collector_and_says_why(node):
    agent = run_agent(node, "init-failure")
    snap = agent.latest()
    assert snap.collection.status("gpu") is CollectorStatus.FAILED
    assert "Driver Not Loaded" in snap.collection.results["gpu"].errors[0]
    assert codes(agent) == {("gpu_telemetry_unavailable", "node", "investigate")}
    r = agent.registry
    assert r.get_sample_value("dlts_node_collector_success", {"collector": "gpu"}) == 0
    assert r.get_sample_value("dlts_node_collector_errors_total", {"collector": "gpu"}) == 1
    assert r.get_sample_value("dlts_node_gpus") is None  # not "0 GPUs": we could not count
    agent.collect_once()
    assert r.get_sample_value("dlts_node_collector_errors_total", {"collector": "gpu"}) == 2
    assert r.get_sample_value("dlts_node_collector_success", {"collector": "host"}) == 1


def test_a_cpu_node_without_nvml_has_no_gpu_finding(node):
    agent = run_agent(node, "init-failure", expected_gpus=0)
    assert agent.latest().findings == ()


def test_recovery_action_field_maps_to_an_action(node):
    lib = scenario("healthy-8xa100")
    lib.gpus[7].recovery_action = 2
    agent = run_agent(node, "", lib=lib)
    f = agent.latest().findings[0]
    assert (f.code, f.device, f.action, f.evidence["name"]) == (
        FindingCode.GPU_RECOVERY_ACTION,
        "gpu7",
        RecommendedAction.REBOOT,
        "NODE_REBOOT",
    )


def test_every_scenario_is_named_and_readable():
    assert set(SCENARIOS) == {
        "healthy-8xa100",
        "dbe-gpu3",
        "remap-pending",
        "remap-failure",
        "retired-pages",
        "fallen-off-bus",
        "not-supported",
        "init-failure",
    }
    for name in SCENARIOS:
        n = Nvml(scenario(name))
        if name == "init-failure":
            with pytest.raises(NvmlUnavailable):
                n.read()
        else:
            assert n.read().count >= 2
    with pytest.raises(ValueError, match="unknown fake NVML scenario"):
        scenario("nope")


def test_real_pynvml_without_a_driver_is_unavailable_not_a_crash():
    import pynvml

    with pytest.raises(NvmlUnavailable, match="NVML init failed"):
        Nvml(pynvml).read()


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("00000000:4E:00.0", "0000:4e:00.0"),
        ("PCI:0000:65:00", "0000:65:00.0"),
        ("0000:b7:00.1", "0000:b7:00.1"),
        (b"00000000:07:00.0", "0000:07:00.0"),
        ("65:00.0", "0000:65:00.0"),
        (None, None),
    ],
)
def test_bus_ids_from_nvml_and_the_kernel_normalise_to_one_form(raw, expected):
    assert normalize_bus_id(raw) == expected


def test_a_lasting_nvml_failure_is_logged_once_not_every_round(node, caplog):
    caplog.set_level("INFO", logger="dlts_agent")
    agent = run_agent(node, "init-failure")
    agent.collect_once()
    agent.collect_once()
    failures = [r for r in caplog.records if "collector gpu failed" in r.getMessage()]
    assert len(failures) == 1 and "Driver Not Loaded" in failures[0].getMessage()


def test_deferred_faults_show_a_gpu_healthy_until_a_job_uses_it_then_its_fault_once(node):
    """The demo's fake scenario: GPU 3's DBE and XID 48 appear only once a job runs on GPU 3."""
    from dlts_testing.fake_nvml import DeferredFaults

    deferred = DeferredFaults(scenario("dbe-gpu3"))
    assert deferred.pending == {3}
    agent = Agent(agent_config(node, expected_gpu_count=8), nvml_lib=deferred.lib)
    agent.collect_once()
    assert agent.latest().findings == ()
    assert not deferred.use(0)  # a healthy GPU: nothing to show
    assert deferred.use(3) and not deferred.use(3)
    agent.collect_once()
    found = codes(agent)
    assert {("gpu_ecc_uncorrected", "gpu3", "reset_gpu"), ("gpu_xid", "gpu3", "reset_gpu")} <= found
    assert all(f.device == "gpu3" for f in agent.latest().findings)
