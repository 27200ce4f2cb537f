"""Host, InfiniBand, NFS, jobs and Lustre collectors on fake /proc and /sys trees; malformed input
never crashes a collector and always raises that collector's error metric."""

from __future__ import annotations

import os
import threading
import time

import pytest
from agent_testkit import NET_DEV, FakeNode, agent_config

from dlts_agent.agent import Agent
from dlts_agent.collectors.base import run_collector
from dlts_agent.collectors.host import HostCollector
from dlts_agent.collectors.infiniband import InfinibandCollector
from dlts_agent.collectors.jobs import JobsCollector
from dlts_agent.collectors.lustre import LustreCollector
from dlts_agent.collectors.nfs import NfsCollector
from dlts_agent.model import CollectorStatus, FindingCode, JobLabels
from dlts_testing.fake_nvml import healthy_8xa100


def test_host_collector_reads_the_fake_proc_tree(node: FakeNode):
    sample, errors = HostCollector(str(node.proc), (str(node.root),)).collect()
    assert errors == []
    assert sample.cpu_count == 2
    assert sample.memory_total_bytes == 24683116 * 1024
    assert sample.memory_available_bytes == 17220412 * 1024
    assert (sample.load1, sample.load5, sample.load15) == (0.52, 0.61, 0.70)
    assert sample.network == {"eth0": (987654321, 123456789)}
    assert sample.cpu_seconds["user"] > 0
    assert sample.filesystems[0].mount == str(node.root) and sample.filesystems[0].size_bytes > 0
    assert sample.filesystems[0].free_inodes == os.statvfs(node.root).f_favail or sample.filesystems[0].free_inodes is None


def test_host_collector_reports_a_missing_mount_without_failing(node: FakeNode):
    sample, errors = HostCollector(str(node.proc), (str(node.root), "/no/such/mount")).collect()
    assert len(sample.filesystems) == 1 and "/no/such/mount" in errors[0]


def test_infiniband_ports_counters_and_rates(node: FakeNode):
    node.add_ib_port("mlx5_0", 1)
    node.add_ib_port("mlx5_1", 1, state="1: DOWN", phys="3: Disabled", counters={"symbol_error": "17"})
    ports, errors = InfinibandCollector(str(node.sys)).collect()
    assert errors == []
    p0, p1 = ports
    assert (p0.name, p0.state, p0.rate_bytes_per_second) == ("mlx5_0/1", "ACTIVE", 25e9)
    assert p0.transmitted_bytes == 4000 and p0.received_bytes == 10000  # 32-bit words -> bytes
    assert p1.state == "DOWN" and p1.phys_state == "DISABLED" and p1.errors["symbol_error"] == 17


def test_infiniband_ignored_port_and_no_hca(node: FakeNode):
    node.add_ib_port("mlx5_0", 1, state="1: DOWN")
    assert InfinibandCollector(str(node.sys), ("mlx5_0/1",)).collect() == ((), [])
    assert InfinibandCollector(str(node.root / "nowhere")).collect() == ((), [])


def test_nfs_mounted_responsive_hung_and_missing(node: FakeNode):
    node.add_mount("/mnt/home")
    node.add_mount("/mnt/data")
    release = threading.Event()

    def stat(path: str):
        if path == "/mnt/data":
            release.wait(10)  # a hung NFS server: stat() blocks in the kernel
        return None

    c = NfsCollector(("/mnt/home", "/mnt/data", "/mnt/scratch"), timeout_s=0.2, proc_root=str(node.proc), stat=stat)
    start = time.monotonic()
    mounts, errors = c.collect()
    assert errors == []  # a well-formed mount table; the stuck mount is a state, not an error
    assert time.monotonic() - start < 2
    home, data, scratch = mounts
    assert home.mounted and home.responsive and home.fstype == "nfs4"
    assert data.mounted and not data.responsive
    assert not scratch.mounted
    # still stuck: reported hung again at once, without starting a second stat thread
    threads_before = threading.active_count()
    start = time.monotonic()
    mounts2, _ = c.collect()
    assert not mounts2[1].responsive and threading.active_count() == threads_before
    release.set()


def test_nfs_stale_handle_is_not_responsive(node: FakeNode):
    node.add_mount("/mnt/home")

    def stat(path):
        raise OSError(116, "Stale file handle")

    (m,), _ = NfsCollector(("/mnt/home",), proc_root=str(node.proc), stat=stat).collect()
    assert m.mounted and not m.responsive


def _jobs(node: FakeNode) -> JobsCollector:
    return JobsCollector(str(node.proc), local_run_dir=str(node.run_dir), containerd_state_dir=str(node.containerd_state))


def test_jobs_are_found_from_their_runtime_and_linked_to_gpus(node: FakeNode):
    node.add_process(
        4242,
        {
            "DLTS_JOB_ID": "1234",
            "DLTS_USER": "alice",
            "DLTS_VC": "vision",
            "DLTS_PREEMPTIBLE": "true",
            "CUDA_VISIBLE_DEVICES": "0,1",
        },
    )
    node.add_process(
        4243,
        {
            "DLTS_JOB_ID": "1235",
            "DLTS_USER": "bob",
            "DLTS_VC": "nlp",
            "NVIDIA_VISIBLE_DEVICES": "GPU-a1000003-5c1e-4b3a-9f00-000000000003",
            "CUDA_VISIBLE_DEVICES": "0",
        },
    )  # container-relative index: ignored
    node.add_process(4244, {"PATH": "/usr/bin"})
    sample, errors = _jobs(node).collect()
    assert errors == []
    alice = JobLabels("1234", "alice", "vision", True)
    assert sample.by_gpu_index == {0: alice, 1: alice}
    assert sample.by_gpu_uuid == {"GPU-a1000003-5c1e-4b3a-9f00-000000000003": JobLabels("1235", "bob", "nlp", False)}
    assert sample.job_ids == {"1234", "1235"}
    assert sample.unattributed == 0


def test_a_process_claiming_a_job_its_runtime_does_not_give_it_books_nothing(node: FakeNode, caplog):
    """The environment is a hint: a process outside every unit and container that names job 1234 (and a
    container whose bundle says job 1235 while the process says 1234) books nothing on job 1234."""
    node.add_process(4242, {"DLTS_JOB_ID": "1234", "DLTS_USER": "alice", "DLTS_VC": "vision", "CUDA_VISIBLE_DEVICES": "0"})
    node.add_process(4250, {"DLTS_JOB_ID": "1234", "CUDA_VISIBLE_DEVICES": "1"}, job_env={})
    node.add_process(4260, {"DLTS_JOB_ID": "1234", "NVIDIA_VISIBLE_DEVICES": "GPU-a1000003-5c1e-4b3a-9f00-000000000009"},
                     job_env={"DLTS_JOB_ID": "1235", "DLTS_USER": "bob", "DLTS_VC": "nlp",
                              "NVIDIA_VISIBLE_DEVICES": "GPU-a1000003-5c1e-4b3a-9f00-000000000003"})
    collector = _jobs(node)
    with caplog.at_level("WARNING", logger="dlts_agent.collectors.jobs"):
        sample, _ = collector.collect()
        collector.collect()
    bob = JobLabels("1235", "bob", "nlp", False)
    assert sample.by_pid == {4242: JobLabels("1234", "alice", "vision", False), 4260: bob}
    assert sample.usage["1234"].pids == 1
    assert sample.by_gpu_index == {0: sample.by_pid[4242]}
    assert sample.by_gpu_uuid == {"GPU-a1000003-5c1e-4b3a-9f00-000000000003": bob}
    assert sample.unattributed == 1
    assert len([r for r in caplog.records if "pid 4250 claims job '1234'" in r.getMessage()]) == 1


@pytest.mark.parametrize("junk", ["\u00b2", "0,\u00b2", "\u0663", "9" * 40, "-1", "GPU", "\x7f"])
def test_junk_in_one_processs_cuda_visible_devices_skips_that_entry_only_and_logs_it_once(node: FakeNode, junk, caplog):
    # '²'.isdigit() is True and int('²') raises: once that failed the whole jobs collector, and with
    # it every GPU reset and reboot on the node ("cannot tell which jobs use the GPU")
    node.add_process(4242, {"DLTS_JOB_ID": "1234", "DLTS_USER": "alice", "DLTS_VC": "vision", "CUDA_VISIBLE_DEVICES": "0"})
    node.add_process(4250, {"DLTS_JOB_ID": "99", "DLTS_USER": "mallory", "DLTS_VC": "vision", "CUDA_VISIBLE_DEVICES": junk})
    collector = _jobs(node)
    with caplog.at_level("WARNING", logger="dlts_agent.collectors.jobs"):
        result = run_collector(collector)
        again = run_collector(collector)
    assert result.status is CollectorStatus.OK and again.status is CollectorStatus.OK
    assert result.sample.by_gpu_index[0] == JobLabels("1234", "alice", "vision", False)
    assert set(result.sample.by_gpu_index) <= {0}  # the junk GPU entry went; the valid one stayed
    assert result.sample.job_ids == {"1234", "99"}  # the job stays known: a reboot still waits for it
    assert result.errors and all("job 99" in e for e in result.errors)
    assert len([r for r in caplog.records if "job 99" in r.getMessage()]) == 1  # logged once, not every round


def test_a_process_directory_named_with_a_non_ascii_digit_is_not_a_pid(node: FakeNode):
    node.add_process(4242, {"DLTS_JOB_ID": "1234", "CUDA_VISIBLE_DEVICES": "0"})
    node.write("proc/\u00b2/environ", b"DLTS_JOB_ID=5\0")
    result = run_collector(_jobs(node))
    assert result.status is CollectorStatus.OK and result.sample.job_ids == {"1234"}


def test_gpu_metrics_carry_the_job_labels(node: FakeNode):
    lib = healthy_8xa100()
    lib.gpus[5].pids = [5555]  # NVML's own pid list wins over environment hints
    node.add_process(5555, {"DLTS_JOB_ID": "77", "DLTS_USER": "carol", "DLTS_VC": "speech", "DLTS_PREEMPTIBLE": "0"})
    node.add_process(
        4242,
        {
            "DLTS_JOB_ID": "1234",
            "DLTS_USER": "alice",
            "DLTS_VC": "vision",
            "DLTS_PREEMPTIBLE": "1",
            "CUDA_VISIBLE_DEVICES": "0",
        },
    )
    agent = Agent(agent_config(node), nvml_lib=lib)
    agent.collect_once()
    g0 = {
        "gpu": "0",
        "uuid": lib.gpus[0].uuid,
        "bus_id": "0000:07:00.0",
        "job_id": "1234",
        "user": "alice",
        "vc": "vision",
        "preemptible": "true",
    }
    g5 = {
        "gpu": "5",
        "uuid": lib.gpus[5].uuid,
        "bus_id": "0000:90:00.0",
        "job_id": "77",
        "user": "carol",
        "vc": "speech",
        "preemptible": "false",
    }
    assert agent.registry.get_sample_value("dlts_gpu_utilization_ratio", g0) == pytest.approx(0.87)
    assert agent.registry.get_sample_value("dlts_gpu_utilization_ratio", g5) == pytest.approx(0.87)
    assert agent.registry.get_sample_value("dlts_node_jobs") == 2


class FakeLustreClient:
    """Stands in for dlts_lustre.client.LustreClient with the package's own value types."""

    def __init__(self, health_text: str, stats_text: str = "", stats_error: Exception | None = None):
        self.health_text, self.stats_text, self.stats_error = health_text, stats_text, stats_error

    def health(self):
        from dlts_lustre.parsers.health import parse_health

        return parse_health(self.health_text)

    def stats(self, param):
        from dlts_lustre.parsers.stats import parse_stats

        if self.stats_error:
            raise self.stats_error
        return parse_stats(self.stats_text)


OSC_STATS = """\
osc.dltsfs-OST0000-osc-ffff8a0b4c5d6000.stats=
snapshot_time             1700000010.000000000 secs.nsecs
read_bytes                1500 samples [bytes] 4096 1048576 157286400
write_bytes               25101 samples [bytes] 98304 4194304 104867600000
ost_read                  1500 samples [usecs] 10 5000 300000
"""


def test_lustre_health_and_per_target_client_stats():
    sample, errors = LustreCollector(lambda: FakeLustreClient("healthy\n", OSC_STATS)).collect()
    assert errors == [] and sample.healthy
    (t,) = sample.targets
    assert (t.read_bytes, t.write_bytes, t.operations) == (157286400, 104867600000, {"ost_read": 1500})


def test_lustre_unhealthy_is_a_finding(node: FakeNode):
    agent = Agent(
        agent_config(node),
        nvml_lib=healthy_8xa100(),
        lustre_client=lambda: FakeLustreClient("device dltsfs-OST0012 reported unhealthy\nNOT HEALTHY\n"),
    )
    agent.collect_once()
    (f,) = agent.latest().findings
    assert f.code is FindingCode.LUSTRE_UNHEALTHY and f.evidence["unhealthy_devices"] == ["dltsfs-OST0012"]
    assert agent.registry.get_sample_value("dlts_node_lustre_healthy") == 0


def test_lustre_skips_cleanly_without_lctl(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    r = run_collector(LustreCollector())
    assert r.status is CollectorStatus.SKIPPED and "lctl" in r.skip_reason


# --------------------------------------------------------------------------------------------
# Malformed inputs: every collector survives and raises its own error metric


def corrupt_host(node: FakeNode):
    node.write("proc/net/dev", NET_DEV + "  eth1: lots of bytes\n")


def corrupt_host_loadavg(node: FakeNode):
    node.write("proc/loadavg", "zero point five\n")


def corrupt_ib(node: FakeNode):
    node.add_ib_port("mlx5_0", 1, state="ACTIVE-ish", counters={})
    node.add_ib_port("mlx5_1", 1, rate="fast", counters={"symbol_error": "-3", "port_xmit_data": "lots"})
    node.write("sys/class/infiniband/mlx5_1/ports/lost+found", "")


def corrupt_nfs(node: FakeNode):
    node.write("proc/mounts", "only-two fields\n")


def corrupt_jobs(node: FakeNode):
    node.add_process(777, {"DLTS_JOB_ID": "", "CUDA_VISIBLE_DEVICES": "0"})
    node.add_process(778, {"DLTS_JOB_ID": "9", "CUDA_VISIBLE_DEVICES": "zero,1"})
    node.write("proc/779/environ", b"\xff\xfe\x00DLTS_JOB_ID=\xff\x00")


def corrupt_xid(node: FakeNode):
    node.kmsg.write_text("\x00\x01 binary junk\n;;;;\n4,5,x,-;NVRM: Xid (PCI:0000:07:00): 48, x\n")


def corrupt_xid_boot_id(node: FakeNode):
    (node.proc / "sys/kernel/random/boot_id").unlink()


def corrupt_lustre(node: FakeNode):
    pass  # the client itself returns garbage (see lustre_client below)


MALFORMED = [
    ("host", corrupt_host, CollectorStatus.FAILED),
    ("host", corrupt_host_loadavg, CollectorStatus.OK),
    ("infiniband", corrupt_ib, CollectorStatus.OK),
    ("nfs", corrupt_nfs, CollectorStatus.OK),
    ("jobs", corrupt_jobs, CollectorStatus.OK),
    ("xid", corrupt_xid, CollectorStatus.OK),
    ("xid", corrupt_xid_boot_id, CollectorStatus.FAILED),
    ("lustre", corrupt_lustre, CollectorStatus.FAILED),
]


@pytest.mark.parametrize("collector, corrupt, status", MALFORMED, ids=[f"{c}-{f.__name__}" for c, f, _ in MALFORMED])
def test_malformed_input_raises_that_collectors_error_metric_only(node: FakeNode, collector, corrupt, status):
    node.add_mount("/mnt/home")
    corrupt(node)
    agent = Agent(
        agent_config(node, collectors={"nfs": {"mounts": ["/mnt/home"]}}),
        nvml_lib=healthy_8xa100(),
        lustre_client=lambda: FakeLustreClient("" if collector == "lustre" else "healthy"),
    )
    agent.collect_once()
    results = agent.latest().collection.results
    assert results[collector].status is status
    r = agent.registry
    assert r.get_sample_value("dlts_node_collector_errors_total", {"collector": collector}) >= 1
    for other, res in results.items():
        if other != collector and res.status is not CollectorStatus.DISABLED:
            assert res.status is CollectorStatus.OK, (other, res.errors)
            assert r.get_sample_value("dlts_node_collector_errors_total", {"collector": other}) == 0, other
    assert r.get_sample_value("dlts_node_collector_success", {"collector": "gpu"}) == 1


def test_the_host_collector_never_changes_what_other_threads_read_from_proc(node: FakeNode):
    """Other threads of the process (the reporter; in the repair tests the job manager, whose
    process checks then saw the fake /proc and took every job's process for vanished) keep seeing
    the real /proc while the collector reads a fake one."""
    import os

    import psutil

    real_boot, me = psutil.boot_time(), psutil.Process(os.getpid())
    wrong: list[str] = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            try:
                if psutil.boot_time() != real_boot or not psutil.pid_exists(me.pid):
                    wrong.append("psutil read another /proc")
            except Exception as exc:  # noqa: BLE001 - anything the fake /proc made psutil raise
                wrong.append(repr(exc))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _ in range(300):
            HostCollector(str(node.proc), (str(node.root),)).collect()
    finally:
        stop.set()
        watcher.join()
    assert wrong == []
