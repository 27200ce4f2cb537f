"""The node agent's job attribution on real pods (docs/agent.md, "Job attribution").

Two jobs run as real pods on the real containerd of each node; the agent's jobs collector, pointed
at that node's containerd state directory, attributes each pod's processes to its job from the
container's cgroup and OCI bundle. A process in job A's pod and a process on the host that both put
job B's ``DLTS_JOB_ID`` in their environment book nothing on job B.
"""

from __future__ import annotations

import os
import subprocess
import time

import psutil
import pytest

from dlts_agent.collectors.jobs import RUNTIME_DIR, JobsCollector
from dlts_agent.model import JobsSample

pytestmark = [pytest.mark.kube, pytest.mark.slow]

FORGED_SLEEP = "3017"  # the forger in job A's pod: sleep with a number nothing else on the machine sleeps


def _host_pids(argv: list[str]) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == argv]


def _cgroup(pid: int) -> str:
    with open(f"/proc/{pid}/cgroup") as f:
        return f.read()


def _sample(state_dir: str) -> JobsSample:
    collector = JobsCollector(containerd_state_dir=state_dir)
    collector.collect()
    time.sleep(0.3)
    return collector.collect()[0]


def test_the_agent_attributes_pod_processes_by_container_and_a_forged_job_id_books_nothing(deployed):
    b = deployed.submit("sleep 300")
    # job A's own command starts the forger: a process of job A that names job B
    a = deployed.submit(f"DLTS_JOB_ID={b} DLTS_USER=mallory sleep {FORGED_SLEEP} & sleep 300")
    deployed.tick_until("both jobs run", lambda: deployed.status(a) == "running" and deployed.status(b) == "running")
    pods = {job: deployed.pods(job)[0] for job in (a, b)}
    pod_a = pods[a]
    # what containerd really keeps: the job container's bundle under the node's state directory
    states = {job: str(deployed.cluster.node(pod["spec"]["nodeName"]).directory / "containerd" / "state")
              for job, pod in pods.items()}
    bundles = os.path.join(states[a], RUNTIME_DIR, "k8s.io")
    assert os.path.isdir(bundles), sorted(os.listdir(states[a]))
    deadline = time.monotonic() + 30
    while not (in_pod := _host_pids(["sleep", FORGED_SLEEP])):
        assert time.monotonic() < deadline, f"the forger in job A's pod never started: {deployed.log(a)!r}"
        time.sleep(0.2)
    forger = in_pod[0]
    assert pod_a["metadata"]["uid"] in _cgroup(forger)  # it runs in job A's container
    env = {**os.environ, "DLTS_JOB_ID": str(b), "DLTS_USER": "mallory", "DLTS_VC": "vision"}
    outsider = subprocess.Popen(["sleep", "3019"], env=env)
    try:
        sample = _sample(states[a])
        labels = {pid: job.job_id for pid, job in sample.by_pid.items()}
        assert labels.get(forger) == str(a), (labels, _cgroup(forger), sorted(os.listdir(bundles)))
        assert sample.by_pid[forger].user == "alice"  # the labels the kubelet gave the container, not the forger's
        assert outsider.pid not in sample.by_pid
        assert sample.unattributed >= 1  # the outsider (and no process of a job's container)
        job_a = [pid for pid, job in labels.items() if job == str(a)]
        assert all(pod_a["metadata"]["uid"] in _cgroup(pid) for pid in job_a)
        assert sample.usage[str(a)].pids == len(job_a) >= 2  # the job's command and the forger
        job_b = [pid for pid, job in labels.items() if job == str(b)]
        assert forger not in job_b and all(pods[b]["metadata"]["uid"] in _cgroup(pid) for pid in job_b)
        if states[b] != states[a]:
            job_b = [pid for pid, job in _sample(states[b]).by_pid.items() if job.job_id == str(b)]
        assert job_b and all(pods[b]["metadata"]["uid"] in _cgroup(pid) for pid in job_b)  # B's own processes only
        assert forger not in job_b and outsider.pid not in job_b
    finally:
        outsider.kill()
        outsider.wait()
