"""The local backend on its own (real processes): launch survives a crash at any point, the init
records itself, distributed units meet at their rendezvous, jobs run as their owner, and the job's
output reaches the log store through the init."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from dlts.backends import local as local_backend
from dlts.backends.base import LaunchSpec, RunPhase
from dlts.backends.local import LocalBackend
from dlts.logstore import iter_log
from dlts.scheduler.model import Placement

RENDEZVOUS = Path(__file__).with_name("rendezvous_check.py")


def _spec(tmp_path, command="echo hello", job_id=5, attempt=1, type="batch", gpus=((0,),), **kw) -> LaunchSpec:
    return LaunchSpec(job_id=job_id, attempt=attempt, user="alice", vc="vision", type=type, image="-", command=command,
                      placements=tuple(Placement("local", g, 1.0, 2**20) for g in gpus),
                      log_path=str(tmp_path / "logs" / str(job_id) / f"attempt-{attempt}.log"), **kw)


def _log(tmp_path, job_id=5, attempt=1) -> str:
    return b"".join(iter_log(tmp_path / "logs", job_id, attempt, key=None)).decode()  # specs without a log key


def _wait_log(tmp_path, text: str, count: int = 1, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _log(tmp_path).count(text) < count if (tmp_path / "logs" / "5").exists() else True:
        assert time.monotonic() < deadline, f"{text!r} x{count} never in the log"
        time.sleep(0.02)


def _observe(backend, key=(5, 1), until=lambda o: o is not None and o.phase in (RunPhase.SUCCEEDED, RunPhase.FAILED),
             timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while True:
        seen = {(o.job_id, o.attempt): o for o in backend.observe()}.get(key)
        if until(seen):
            return seen
        assert time.monotonic() < deadline, f"{key}: {seen}"
        time.sleep(0.05)


@pytest.fixture
def backend(tmp_path):
    made = LocalBackend(tmp_path / "run", node_name="local", demo_gpus=4)
    yield made
    made.collect_garbage([])


def _age(path: Path, seconds: float) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


# -- crash points of launch ------------------------------------------------------------------------

def test_a_run_directory_a_crash_left_without_a_pid_record_is_started_by_the_next_launch(backend, tmp_path):
    """Crash between mkdir and the init's start: nothing runs. Once older than an init needs to start,
    observe stops reporting it (the job manager launches again), and launch starts it afresh."""
    run = tmp_path / "run" / "5-1"
    run.mkdir()
    (run / "spec.json").write_text("{}")  # the crash came after the run spec was written
    assert _observe(backend, until=lambda o: True).phase is RunPhase.PENDING  # young: perhaps still starting
    backend.launch(_spec(tmp_path))
    assert not (run / "pid").exists()  # a young one is left alone
    _age(run, local_backend.LAUNCH_GRACE_S + 1)
    assert all((o.job_id, o.attempt) != (5, 1) for o in backend.observe())
    backend.launch(_spec(tmp_path, command="echo started again"))
    seen = _observe(backend)
    assert (seen.phase, seen.exit_code) == (RunPhase.SUCCEEDED, 0)
    assert _log(tmp_path) == "started again\n"


def test_a_half_made_replica_is_started_again_and_the_others_are_left_alone(backend, tmp_path):
    spec = _spec(tmp_path, type="inference", gpus=((0,), (1,)), replicas=(0, 1),
                 command='echo "up $DLTS_REPLICA"; exec sleep 600')
    backend.launch(spec)
    _wait_log(tmp_path, "up 0\n")
    _wait_log(tmp_path, "up 1\n")  # both inits recorded themselves before they started the job
    first_pid = (tmp_path / "run" / "5-1" / "replicas" / "0" / "pid").read_text()
    unit = tmp_path / "run" / "5-1" / "replicas" / "1"
    psutil.Process(int((unit / "pid").read_text().split()[0])).kill()  # the init of replica 1 dies ...
    for name in ("pid", "exit"):
        (unit / name).unlink(missing_ok=True)  # ... as if it had never recorded itself
    backend._children.pop(unit, None)
    _age(unit, local_backend.LAUNCH_GRACE_S + 1)
    seen = _observe(backend, until=lambda o: o is not None and o.replicas == {0})
    assert seen.phase is RunPhase.RUNNING
    backend.launch(spec)  # the job manager's missing-replica launch
    _observe(backend, until=lambda o: o is not None and o.replicas == {0, 1} and o.phase is RunPhase.RUNNING)
    assert (tmp_path / "run" / "5-1" / "replicas" / "0" / "pid").read_text() == first_pid
    _wait_log(tmp_path, "up 1\n", count=2)
    assert _log(tmp_path).count("up 0\n") == 1


def test_the_init_records_its_own_pid_and_start_time_before_the_job_runs(backend, tmp_path):
    backend.launch(_spec(tmp_path, command="exec sleep 600"))
    seen = _observe(backend, until=lambda o: o is not None and o.phase is RunPhase.RUNNING
                    and (tmp_path / "run" / "5-1" / "pid").exists())
    pid_text, started_text, ticks_text = (tmp_path / "run" / "5-1" / "pid").read_text().split()
    init = psutil.Process(int(pid_text))
    assert "dlts_init.py" in " ".join(init.cmdline())
    assert abs(init.create_time() - float(started_text)) < 0.05  # the same clock as psutil's
    assert int(ticks_text) == local_backend._start_ticks(init.pid)  # what identifies the process exactly
    # the child is the job's shell until its `exec sleep` runs: wait for the exec, not a fixed time
    deadline = time.monotonic() + 30
    while [c.name() for c in init.children()] != ["sleep"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [c.name() for c in init.children()] == ["sleep"]
    assert seen.started_at is not None
    backend.terminate(5, 1, 0)
    assert _observe(backend).exit_code == 137


def test_the_process_is_known_by_its_start_ticks_not_the_wall_clock(backend, tmp_path):
    """A wall clock stepped while a job runs moves the boot time psutil adds to start ticks: the
    job still runs. A pid whose start ticks differ (reused by another process) is the job gone."""
    backend.launch(_spec(tmp_path, command="exec sleep 600"))
    record = tmp_path / "run" / "5-1" / "pid"
    _observe(backend, until=lambda o: o is not None and o.phase is RunPhase.RUNNING and record.exists())
    pid, started, ticks = record.read_text().split()
    init = psutil.Process(int(pid))
    try:
        record.write_text(f"{pid} {float(started) - 5} {ticks}\n")  # the clock was 5 s behind then
        assert _observe(backend, until=lambda o: o is not None).phase is RunPhase.RUNNING
        record.write_text(f"{pid} {started} {int(ticks) + 1}\n")
        gone = _observe(backend, until=lambda o: o is not None)
        assert gone.phase is RunPhase.GONE
        assert gone.message == f"the job's process vanished (pid {pid} now belongs to another process)"
    finally:
        for proc in init.children(recursive=True) + [init]:
            proc.kill()
        init.wait(10)
    assert "no process with pid" in _observe(backend, until=lambda o: o is not None).message


def test_an_init_that_cannot_open_the_log_is_pending_with_reason_init_failed(backend, tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "5").symlink_to("/tmp")  # the job's log directory is not a plain directory
    backend.launch(_spec(tmp_path))
    seen = _observe(backend, until=lambda o: o is not None and o.reason)
    assert seen.phase is RunPhase.PENDING and seen.reason == "init_failed"
    assert "cannot open the job's log in the log store" in seen.message and "not a plain directory" in seen.message
    assert not (tmp_path / "run" / "5-1" / "pid").exists()


def test_terminate_of_a_unit_that_never_started_is_harmless_and_forget_clears_it(backend, tmp_path):
    run = tmp_path / "run" / "5-1"
    run.mkdir()
    backend.terminate(5, 1, 5)
    backend.forget(5, 1)
    assert not run.exists()


# -- the job's environment -------------------------------------------------------------------------

def test_the_job_works_in_its_own_directory_not_the_log_directory(backend, tmp_path):
    backend.launch(_spec(tmp_path, command="pwd; ls"))
    _observe(backend)
    assert _log(tmp_path) == f"{tmp_path / 'run' / '5-1' / 'work'}\n"


def test_output_through_the_init_is_capped_with_head_and_tail(tmp_path):
    backend = LocalBackend(tmp_path / "run", node_name="local", log_max_bytes=64 * 1024)
    backend.launch(_spec(tmp_path, command="seq 1 100000"))  # 589 KB
    _observe(backend)
    text = _log(tmp_path)
    assert text.startswith("1\n2\n3\n") and text.endswith("99999\n100000\n")
    assert text.count("bytes of this log were dropped here") == 1
    assert sum(p.stat().st_size for p in (tmp_path / "logs" / "5").iterdir()) <= 80 * 1024
    backend.collect_garbage([])


def test_every_job_gets_cuda_device_order_pci_bus_id(backend, tmp_path):
    backend.launch(_spec(tmp_path, command='echo "$CUDA_DEVICE_ORDER $CUDA_VISIBLE_DEVICES"', gpus=((2, 3),)))
    _observe(backend)
    assert _log(tmp_path) == "PCI_BUS_ID 2,3\n"


def test_the_demo_agent_sees_only_its_own_backends_jobs(tmp_path):
    """Two local backends on one machine (a demo and a test run) each run a job on "GPU 3": an
    agent scoped to one run directory links GPU 3 to that backend's job only, never the other's."""
    from dlts_agent.collectors.jobs import JobsCollector
    from dlts_agent.model import GpuSample

    mine, theirs = (LocalBackend(tmp_path / side / "run", node_name="local", demo_gpus=4) for side in ("mine", "theirs"))
    try:
        mine.launch(_spec(tmp_path / "mine", command="sleep 30", job_id=7, gpus=((3,),)))
        theirs.launch(_spec(tmp_path / "theirs", command="sleep 30", job_id=8, gpus=((3,),)))
        for backend, key in ((mine, (7, 1)), (theirs, (8, 1))):
            _observe(backend, key=key, until=lambda o: o is not None and o.phase is RunPhase.RUNNING)
        gpu3 = GpuSample(index=3, uuid=None, bus_id=None)
        for side, job in (("mine", "7"), ("theirs", "8")):
            scoped = JobsCollector(local_run_dir=str((tmp_path / side / "run").resolve())).collect()[0]
            assert scoped.job_ids == {job}
            assert scoped.for_gpu(gpu3).job_id == job
            assert scoped.unattributed == 0  # the other backend's processes name their own run directory
    finally:
        mine.collect_garbage([])
        theirs.collect_garbage([])


def test_a_distributed_attempt_runs_one_unit_per_placement_and_they_meet_at_the_rendezvous(backend, tmp_path):
    """Each unit starts LOCAL_WORLD_SIZE workers the way torchrun does; every worker connects to
    MASTER_ADDR:MASTER_PORT, where global rank 0 checks it heard from all WORLD_SIZE ranks."""
    spec = _spec(tmp_path, type="distributed", gpus=((0, 1), (2, 3)),
                 command=f"{sys.executable} {RENDEZVOUS}")
    backend.launch(spec)
    seen = _observe(backend, timeout_s=30)
    log = _log(tmp_path)
    assert (seen.phase, seen.exit_code) == (RunPhase.SUCCEEDED, 0), log
    for rank in range(4):
        assert f"rank {rank} of 4 (node {rank // 2} of 2, local {rank % 2} of 2) master 127.0.0.1:" in log
    assert "rendezvous complete: ranks [0, 1, 2, 3]" in log
    env = json.loads((tmp_path / "run" / "5-1" / "replicas" / "1" / "spec.json").read_text())
    assert env["cwd"].endswith("replicas/1/work")


def test_a_unit_started_again_after_a_crash_meets_at_the_same_port(backend, tmp_path):
    spec = _spec(tmp_path, type="distributed", gpus=((0,), (1,)), command="echo $MASTER_PORT; exec sleep 600")
    backend.launch(spec)
    _wait_log(tmp_path, "\n", count=2)
    port = (tmp_path / "run" / "5-1" / "rendezvous").read_text()
    unit = tmp_path / "run" / "5-1" / "replicas" / "1"
    psutil.Process(int((unit / "pid").read_text().split()[0])).kill()
    for name in ("pid", "exit"):
        (unit / name).unlink(missing_ok=True)
    backend._children.pop(unit, None)
    _age(unit, local_backend.LAUNCH_GRACE_S + 1)
    backend.launch(spec)
    _wait_log(tmp_path, "\n", count=3)
    assert _log(tmp_path) == f"{port}\n{port}\n{port}\n"


# -- identity ----------------------------------------------------------------------------------------

@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
def test_as_root_the_job_runs_as_its_owners_uid_gid_and_groups(backend, tmp_path):
    spec = _spec(tmp_path, command='id -u; id -g; id -G; echo "$HOME"; touch mine && stat -c %u mine',
                 uid=4321, gid=4322, supplemental_groups=(4323,))
    assert backend.launch(spec) is None
    _observe(backend)
    uid, gid, groups, home, owner = _log(tmp_path).splitlines()
    assert (uid, gid, owner) == ("4321", "4322", "4321")
    assert set(groups.split()) == {"4322", "4323"}
    assert home == str(tmp_path / "run" / "5-1" / "work")
    # the job cannot touch its log files: the init (root) owns them
    assert (tmp_path / "logs" / "5" / "attempt-1.log").stat().st_uid == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
def test_a_job_as_its_owner_cannot_rewrite_its_log(backend, tmp_path):
    log_path = tmp_path / "logs" / "5" / "attempt-1.log"
    spec = _spec(tmp_path, command=f"echo real; echo forged > {log_path} || echo refused", uid=4321, gid=4322)
    backend.launch(spec)
    _observe(backend)
    text = _log(tmp_path)
    assert text.startswith("real\n") and "refused" in text and "forged" not in text


def test_without_a_uid_the_job_runs_as_the_service_user(backend, tmp_path):
    backend.launch(_spec(tmp_path, command="id -u"))
    _observe(backend)
    assert _log(tmp_path) == f"{os.geteuid()}\n"


def test_when_dlts_is_not_root_a_job_with_another_uid_runs_as_the_service_user_and_says_so(
        backend, tmp_path, monkeypatch, caplog):
    me = os.geteuid()
    monkeypatch.setattr(local_backend.os, "geteuid", lambda: me + 1000 if me == 0 else me)
    not_me = (me + 1000 if me == 0 else me) + 1
    note = backend.launch(_spec(tmp_path, command="id -u", uid=not_me, gid=not_me))
    assert note and "runs as the DLTS service user" in note and "DLTS is not running as root" in note
    assert "DLTS is not running as root" in caplog.text
    _observe(backend)
    first, second = _log(tmp_path).splitlines()
    assert first == f"[dlts] {note}" and second == str(me)
