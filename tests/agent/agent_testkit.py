"""Test kit for the node agent: a fake node (``/proc`` and ``/sys`` trees, kernel log file), config
builders, and fake executables (nvidia-smi, systemctl, journalctl) that record their arguments.
NVML is faked at its seam with ``dlts_testing.fake_nvml`` scenarios. A uniquely named module (not
``conftest``) so that test files can import it whatever other conftest.py files pytest loads."""

from __future__ import annotations

import hashlib
import json
import stat
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dlts_agent.config import AgentConfig, config_from_mapping

FIXTURES = Path(__file__).parent / "fixtures"
BOOT_ID = "4c6b5a4e-0d51-4d0a-9a55-5d0f0c8c1a01"
BTIME = int(time.time()) - 3600  # booted an hour ago, so recorded XIDs are inside the 2 h window

MEMINFO = """\
MemTotal:       24683116 kB
MemFree:         1043220 kB
MemAvailable:   17220412 kB
Buffers:          348812 kB
Cached:         15012928 kB
SwapCached:            0 kB
Active:          9437400 kB
Inactive:       12021028 kB
Active(anon):    5941088 kB
Inactive(anon):        0 kB
Active(file):    3496312 kB
Inactive(file): 12021028 kB
Unevictable:           0 kB
Mlocked:               0 kB
SwapTotal:             0 kB
SwapFree:              0 kB
Dirty:               192 kB
Writeback:             0 kB
AnonPages:       6096684 kB
Mapped:           877720 kB
Shmem:             45208 kB
KReclaimable:     587352 kB
Slab:             875744 kB
SReclaimable:     587352 kB
SUnreclaim:       288392 kB
"""

NET_DEV = """\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 3606833   19513    0    0    0     0          0         0  3606833   19513    0    0    0     0       0          0
  eth0: 987654321 812345    0    0    0     0          0         0 123456789  612345    0    0    0     0       0          0
"""


@dataclass
class FakeNode:
    """A node's /proc and /sys as files under tmp_path, plus its kernel log."""

    root: Path

    @property
    def proc(self) -> Path:
        return self.root / "proc"

    @property
    def sys(self) -> Path:
        return self.root / "sys"

    @property
    def kmsg(self) -> Path:
        return self.root / "kmsg"

    def write(self, rel: str, text: str | bytes) -> Path:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(text)
        return p

    def set_boot_id(self, boot_id: str) -> None:
        self.write("proc/sys/kernel/random/boot_id", boot_id + "\n")

    @property
    def run_dir(self) -> Path:
        """The local backend's run directory (collectors.jobs.local_run_dir)."""
        return self.root / "run"

    @property
    def containerd_state(self) -> Path:
        """containerd's state directory (collectors.jobs.containerd_state_dir)."""
        return self.root / "containerd"

    def add_process(self, pid: int, env: dict[str, str], *, job_env: dict[str, str] | None = None) -> None:
        """A process with ``env`` in its environ and, where it belongs to a job, what its job's runtime
        wrote, the way the jobs collector reads it (docs/agent.md, "Job attribution"):
        * with ``NVIDIA_VISIBLE_DEVICES`` in ``job_env``: a Kubernetes container, its cgroup below its
          pod's and its OCI bundle in containerd's state directory (``process.env`` = ``job_env``);
        * else with a ``DLTS_JOB_ID`` in ``job_env``: the DLTS init of a local backend unit (its ``pid``
          record with the process's start ticks, and ``spec.json`` with ``job_env``).
        ``job_env`` defaults to ``env`` (the process runs with what its job was given); pass ``{}``
        for a process outside every job whatever its environment says."""
        job_env = env if job_env is None else job_env
        data = b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
        self.write(f"proc/{pid}/environ", data)
        ticks = 100000 + pid
        # pid (comm) state ppid ... field 22 starttime; utime/stime 0
        self.write(f"proc/{pid}/stat", f"{pid} (job) S 1 {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {ticks} 0 0\n")
        if "NVIDIA_VISIBLE_DEVICES" in job_env:
            container = hashlib.sha256(str(pid).encode()).hexdigest()
            pod = str(uuid.uuid5(uuid.NAMESPACE_OID, f"pod-{pid}"))
            self.write(f"proc/{pid}/cgroup", f"0::/kubepods/besteffort/pod{pod}/{container}\n")
            bundle = {"ociVersion": "1.0.2-dev", "process": {"env": [f"{k}={v}" for k, v in job_env.items()]},
                      "annotations": {"io.kubernetes.cri.container-type": "container",
                                      "io.kubernetes.cri.sandbox-uid": pod}}
            self.write(f"containerd/io.containerd.runtime.v2.task/k8s.io/{container}/config.json", json.dumps(bundle))
            return
        self.write(f"proc/{pid}/cgroup", "0::/user.slice\n")
        job = job_env.get("DLTS_JOB_ID", "")
        if job:
            unit = f"run/{job}-{pid}"
            self.write(f"{unit}/pid", f"{pid} {time.time():.3f} {ticks}\n")
            self.write(f"{unit}/spec.json", json.dumps({"job_env": job_env}))

    def add_ib_port(
        self,
        dev: str,
        port: int,
        *,
        state: str = "4: ACTIVE",
        phys: str = "5: LinkUp",
        rate: str = "200 Gb/sec (4X HDR)",
        counters: dict[str, str] | None = None,
        link_layer: str = "InfiniBand",
    ) -> None:
        base = f"sys/class/infiniband/{dev}/ports/{port}"
        self.write(f"{base}/state", state + "\n")
        self.write(f"{base}/phys_state", phys + "\n")
        self.write(f"{base}/rate", rate + "\n")
        self.write(f"{base}/link_layer", link_layer + "\n")
        defaults = {
            "port_xmit_data": "1000",
            "port_rcv_data": "2500",
            "symbol_error": "0",
            "link_downed": "1",
            "port_rcv_errors": "0",
        }
        for name, value in {**defaults, **(counters or {})}.items():
            self.write(f"{base}/counters/{name}", value + "\n")

    def append_kmsg(self, *lines: str) -> None:
        with open(self.kmsg, "a") as f:
            for line in lines:
                f.write(line.rstrip("\n") + "\n")

    def add_mount(self, mount: str, fstype: str = "nfs4", source: str = "nfs1:/export") -> None:
        with open(self.proc / "mounts", "a") as f:
            f.write(f"{source} {mount} {fstype} rw,relatime,vers=4.2 0 0\n")


def make_fake_node(root: Path) -> FakeNode:
    node = FakeNode(root)
    node.write(
        "proc/stat",
        textwrap.dedent(f"""\
        cpu  56472 0 25099 91063 790 0 568 1046 3 0
        cpu0 25794 0 11868 48609 399 0 223 505 2 0
        cpu1 30678 0 13231 42454 391 0 345 541 1 0
        intr 1 2 3
        ctxt 123456
        btime {BTIME}
        processes 4567
        """),
    )
    node.write("proc/meminfo", MEMINFO)
    node.write("proc/loadavg", "0.52 0.61 0.70 2/345 6789\n")
    node.write("proc/net/dev", NET_DEV)
    node.write("proc/mounts", "/dev/sda1 / ext4 rw,relatime 0 0\n")
    node.write("proc/sys/vm/drop_caches", "0\n")
    node.set_boot_id(BOOT_ID)
    node.write("proc/1/environ", b"HOME=/\0TERM=linux\0")
    node.kmsg.write_text("")
    (root / "sys/class").mkdir(parents=True, exist_ok=True)
    (root / "state").mkdir()
    return node


def agent_config(node: FakeNode, **overrides: Any) -> AgentConfig:
    """A config that points every OS boundary at the fake node; overrides are nested dicts."""
    data: dict[str, Any] = {
        "node_name": "gpu-node-01",
        "interval_s": 1,
        "state_dir": str(node.root / "state"),
        "exporter": {"enabled": False},
        "collectors": {
            "host": {"mounts": [str(node.root)]},
            "xid": {"kmsg_path": str(node.kmsg)},
            "jobs": {"local_run_dir": str(node.run_dir), "containerd_state_dir": str(node.containerd_state)},
        },
        "paths": {"proc": str(node.proc), "sys": str(node.sys)},
        "actions": {"nvidia_smi": str(FAKEBIN / "nvidia-smi"), "systemctl": str(FAKEBIN / "systemctl"),
                    "dcgmi": str(FAKEBIN / "dcgmi")},
    }
    _merge(data, overrides)
    return config_from_mapping(data)


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


FAKEBIN = Path(__file__).parent / "fakebin"


def enable_command_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake executables append their argv here (one line per call)."""
    log = tmp_path / "commands.log"
    monkeypatch.setenv("DLTS_FAKE_COMMAND_LOG", str(log))
    for exe in FAKEBIN.iterdir():
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return log


def logged_commands(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []
