"""Job attribution against forgery, with real processes under the real local backend.

Jobs 7 and 8 run through ``LocalBackend``; the agent's jobs collector is scoped to its run directory
(as ``dlts demo`` sets it). A process that puts job 8's ``DLTS_JOB_ID`` in its own environment, in
job 7 or outside any job, must book nothing on job 8: no pid, no CPU, no memory, no GPU.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlts.backends.base import LaunchSpec, RunPhase
from dlts.backends.local import LocalBackend
from dlts.scheduler.model import Placement
from dlts_agent.collectors.jobs import JobsCollector
from dlts_agent.model import GpuSample, JobLabels

BURN = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass\n"


def _spec(tmp_path: Path, job_id: int, user: str, gpu: int, command: str) -> LaunchSpec:
    return LaunchSpec(job_id=job_id, attempt=1, user=user, vc="vision", type="batch", image="-", command=command,
                      placements=(Placement("local", (gpu,), 1.0, 2**20),),
                      log_path=str(tmp_path / "logs" / str(job_id) / "attempt-1.log"))


def _running(backend: LocalBackend, key: tuple[int, int]) -> None:
    deadline = time.monotonic() + 20
    while True:
        seen = {(o.job_id, o.attempt): o for o in backend.observe()}.get(key)
        if seen is not None and seen.phase is RunPhase.RUNNING:
            return
        assert time.monotonic() < deadline, f"{key}: {seen}"
        time.sleep(0.05)


def _wait_file(path: Path) -> int:
    deadline = time.monotonic() + 10
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)
    return int(path.read_text())


@pytest.fixture
def jobs(tmp_path: Path):
    """Job 7 (alice, GPU 0) starts a CPU burner claiming job 8 and GPU 1; job 8 (bob, GPU 1) sleeps."""
    backend = LocalBackend(tmp_path / "run", node_name="local", demo_gpus=4)
    forger = (f"DLTS_JOB_ID=8 DLTS_USER=bob CUDA_VISIBLE_DEVICES=1 {sys.executable} -c '{BURN}' & "
              "echo $! > forger.pid; wait")
    try:
        backend.launch(_spec(tmp_path, 7, "alice", 0, forger))
        backend.launch(_spec(tmp_path, 8, "bob", 1, "sleep 60"))
        for key in ((7, 1), (8, 1)):
            _running(backend, key)
        yield backend, _wait_file(tmp_path / "run" / "7-1" / "work" / "forger.pid")
    finally:
        backend.collect_garbage([])


def _collect_twice(collector: JobsCollector):
    collector.collect()
    time.sleep(0.5)
    return collector.collect()[0]


def test_a_process_of_one_job_claiming_another_books_on_its_own_job_only(jobs, tmp_path):
    _, forger = jobs
    collector = JobsCollector(local_run_dir=str((tmp_path / "run").resolve()))
    sample = _collect_twice(collector)
    alice, bob = JobLabels("7", "alice", "vision", False), JobLabels("8", "bob", "vision", False)
    assert sample.by_pid[forger] == alice  # it descends from job 7's init: job 7's, whatever it claims
    bob_pids = {pid for pid, labels in sample.by_pid.items() if labels == bob}
    assert forger not in bob_pids
    assert sample.usage["8"].pids == len(bob_pids)  # bob's init, shell and sleep: nothing of the forger's
    assert sample.usage["8"].cpu_cores is not None and sample.usage["8"].cpu_cores < 0.2  # only sleeping
    assert sample.by_gpu_index == {0: alice, 1: bob}  # the backend's assignment, not the forger's variable
    # NVML seeing the forger on GPU 1 links GPU 1 to the forger's real job, never to the one it names
    assert sample.for_gpu(GpuSample(index=1, uuid=None, bus_id=None, pids=(forger,))) == alice
    assert sample.unattributed == 0


def test_a_process_outside_every_job_claiming_one_books_nothing(jobs, tmp_path, caplog):
    run_dir = str((tmp_path / "run").resolve())
    env = {**os.environ, "DLTS_JOB_ID": "8", "DLTS_USER": "bob", "DLTS_VC": "vision", "DLTS_RUN_DIR": run_dir,
           "CUDA_VISIBLE_DEVICES": "2"}
    outsider = subprocess.Popen([sys.executable, "-c", BURN], env=env)
    try:
        collector = JobsCollector(local_run_dir=run_dir)
        with caplog.at_level(logging.WARNING, logger="dlts_agent.collectors.jobs"):
            sample = _collect_twice(collector)
        assert outsider.pid not in sample.by_pid
        assert sample.usage["8"].cpu_cores is not None and sample.usage["8"].cpu_cores < 0.2
        assert 2 not in sample.by_gpu_index
        assert sample.for_gpu(GpuSample(index=2, uuid=None, bus_id=None, pids=(outsider.pid,))) is None
        assert sample.job_ids == {"7", "8"}
        assert sample.unattributed == 1  # counted (dlts_node_unattributed_job_processes) and logged once
        claims = [r.getMessage() for r in caplog.records if f"pid {outsider.pid} claims job '8'" in r.getMessage()]
        assert len(claims) == 1, caplog.text
    finally:
        outsider.kill()
        outsider.wait()


def test_an_ended_unit_attributes_nothing_to_its_pid_record(jobs, tmp_path):
    """Once job 8's init is gone, its pid record attributes nothing, even to a process that now has its pid
    (the start ticks differ) or that it left behind."""
    backend, _ = jobs
    backend.terminate(8, 1, grace_s=1)
    deadline = time.monotonic() + 10
    collector = JobsCollector(local_run_dir=str((tmp_path / "run").resolve()))
    while "8" in collector.collect()[0].job_ids:
        assert time.monotonic() < deadline, "job 8 still attributed after its init ended"
        time.sleep(0.1)
    assert "7" in collector.collect()[0].job_ids
