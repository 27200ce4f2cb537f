"""Inference replica scaling carried out on real processes: the job manager adds replicas to a
running inference job (one DLTS-init process per replica, each with its own GPUs) and removes the
surplus ones to make room for a non-preemptible job, without touching the job's status or retries."""

from __future__ import annotations

import re
import time

import psutil
import requests
import sqlalchemy as sa
from live_helpers import get, submit, wait_for

from dlts.backends.base import LaunchSpec, RunPhase
from dlts.backends.local import LocalBackend
from dlts.models import JobAttempt, JobEvent
from dlts.scheduler.model import Placement

# Each replica says who it is, then runs until SIGTERM, which it answers after a second.
REPLICA = ('echo "replica $DLTS_REPLICA pid $$ gpus $CUDA_VISIBLE_DEVICES"; '
           'trap \'sleep 1; echo "replica $DLTS_REPLICA stopping"; exit 0\' TERM; '
           'while :; do sleep 0.1; done')
LINE = re.compile(r"replica (\d+) pid (\d+) gpus (\S*)")


def log_text(live, world, job_id) -> str:
    r = requests.get(f"{live.url}/api/v1/jobs/{job_id}/log", headers=world.auth("alice"), timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["data"]


def replicas_row(sessions, job_id) -> list[dict]:
    with sessions() as s:
        row = s.scalar(sa.select(JobAttempt).where(JobAttempt.job_id == job_id).order_by(JobAttempt.number.desc()))
        return list(row.placements)


def scaled_events(sessions, job_id) -> list[tuple[str, str]]:
    with sessions() as s:
        return [(e.reason, e.message) for e in s.scalars(
            sa.select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "scaled").order_by(JobEvent.id))]


def announced(live, world, job_id, count, timeout_s=15.0) -> dict[int, tuple[int, str]]:
    """Replica index -> (shell pid, CUDA_VISIBLE_DEVICES) once ``count`` replicas have printed."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = {int(i): (int(pid), gpus) for i, pid, gpus in LINE.findall(log_text(live, world, job_id))}
        if len(seen) >= count:
            return seen
        assert time.monotonic() < deadline, f"only replicas {sorted(seen)} started"
        live.tick()
        time.sleep(0.1)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone(pid: int, timeout_s: float = 3.0) -> bool:
    """The process has exited (a DLTS init exits moments after it recorded the exit code)."""
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_an_inference_job_scales_up_to_max_replicas_then_gives_its_surplus_to_a_non_preemptible_job(
        live, world, sessions, settings):
    # 3 of the node's 4 GPUs busy: the inference job starts with min_replicas only.
    batch = submit(live, world, user="bob", command="exec sleep 600", gpus=3)
    wait_for(live, world, batch["id"], {"running"}, user="bob")
    service = submit(live, world, type="inference", command=REPLICA, gpus=1, min_replicas=1, max_replicas=3)
    wait_for(live, world, service["id"], {"running"})
    first = announced(live, world, service["id"], 1)
    assert list(first) == [0] and [r["replica"] for r in replicas_row(sessions, service["id"])] == [0]

    # The batch job ends: the next passes add two replicas, each its own process with its own GPU.
    r = requests.post(f"{live.url}/api/v1/jobs/{batch['id']}/kill", headers=world.auth("bob"), timeout=10)
    assert r.status_code in (200, 202), r.text
    wait_for(live, world, batch["id"], {"killed"}, user="bob")
    replicas = announced(live, world, service["id"], 3)
    assert sorted(replicas) == [0, 1, 2]
    assert len({pid for pid, _ in replicas.values()}) == 3 and all(alive(pid) for pid, _ in replicas.values())
    gpu_sets = [set(gpus.split(",")) for _, gpus in replicas.values()]
    assert all(len(g) == 1 for g in gpu_sets) and len(set().union(*gpu_sets)) == 3  # one GPU each, distinct
    row = replicas_row(sessions, service["id"])
    assert [(e["replica"], e.get("retiring", False)) for e in row] == [(0, False), (1, False), (2, False)]
    assert [str(e["gpu_indices"][0]) for e in row] == [replicas[i][1] for i in range(3)]
    [up] = scaled_events(sessions, service["id"])
    assert up == ("scale_up", "added replicas 1, 2 on testnode")
    seen = {o.job_id: o for o in live.backend.observe()}[service["id"]]
    assert seen.phase is RunPhase.RUNNING and seen.replicas == frozenset({0, 1, 2}) and not seen.retiring
    # a restarted job manager's backend adopts the same replicas from the run records
    adopted = LocalBackend(settings.effective_run_dir, node_name="testnode", demo_gpus=4)
    assert {o.job_id: o for o in adopted.observe()}[service["id"]] == seen

    # A non-preemptible job needing 3 GPUs: only replicas 1 and 2 (the surplus) make room.
    urgent = submit(live, world, command="echo urgent-ran", gpus=3)
    live.tick()
    row = replicas_row(sessions, service["id"])
    assert [(e["replica"], e.get("retiring", False)) for e in row] == [(0, False), (1, True), (2, True)]
    assert scaled_events(sessions, service["id"])[-1] == (
        "scale_down", f"removing replicas 1, 2 on testnode to make room for job {urgent['id']}")
    assert get(live, world, urgent["id"])["status"] == "queued"
    # The surplus replicas got SIGTERM; the job starts only once they have exited.
    deadline = time.monotonic() + settings.preempt_grace_s + 15
    while get(live, world, urgent["id"])["status"] == "queued":
        assert time.monotonic() < deadline, "the non-preemptible job never started"
        live.tick()
        time.sleep(0.05)
    assert not alive(replicas[1][0]) and not alive(replicas[2][0])
    assert alive(replicas[0][0])
    text = log_text(live, world, service["id"])
    assert "replica 1 stopping" in text and "replica 2 stopping" in text and "replica 0 stopping" not in text
    done = wait_for(live, world, urgent["id"], {"finished"})
    assert done["exit_code"] == 0

    # The inference job kept running as the same attempt: no retry, no status change.
    job = get(live, world, service["id"])
    assert job["status"] == "running" and job["retries_used"] == 0 and len(job["attempts"]) == 1
    with sessions() as s:
        transitions = [e.to_status for e in s.scalars(sa.select(JobEvent).where(
            JobEvent.job_id == service["id"], JobEvent.kind == "transition")) if e.to_status]
    assert transitions == ["scheduling", "running"]

    # With the room free again it grows back to max_replicas, under fresh processes.
    deadline = time.monotonic() + 15
    while len(replicas_row(sessions, service["id"])) < 3 or len(LINE.findall(log_text(live, world, service["id"]))) < 5:
        assert time.monotonic() < deadline, replicas_row(sessions, service["id"])
        live.tick()
        time.sleep(0.1)
    assert [e["replica"] for e in replicas_row(sessions, service["id"])] == [0, 1, 2]


def test_a_replica_that_fails_by_itself_fails_the_attempt(live, world, sessions):
    """Only replicas DLTS removes end quietly: one that crashes ends the attempt as failed."""
    job = submit(live, world, type="inference", gpus=1, min_replicas=2, max_replicas=2, max_retries=0,
                 command='if [ "$DLTS_REPLICA" = 1 ]; then sleep 0.5; exit 7; fi; exec sleep 600')
    wait_for(live, world, job["id"], {"running"})
    done = wait_for(live, world, job["id"], {"failed"})
    assert done["exit_code"] == 7 and "replica 1" in (done["reason_detail"] or "")


def _spec(tmp_path, replicas, command='echo "up $DLTS_REPLICA"; exec sleep 600', attempt=1) -> LaunchSpec:
    return LaunchSpec(job_id=9, attempt=attempt, user="alice", vc="vision", type="inference", image="-",
                      command=command, placements=tuple(Placement("local", (i,), 0.5, 2**20) for i in replicas),
                      replicas=tuple(replicas), log_path=str(tmp_path / "log" / "9" / f"attempt-{attempt}.log"))


def _up(tmp_path, *replicas, word="up", timeout_s=10.0, attempt="*") -> None:
    """Wait until those replicas' commands run (their init has its signal handlers by then); by
    default in any attempt's log (the helpers launch attempts 1 and 2)."""
    logs = tmp_path / "log" / "9"
    deadline = time.monotonic() + timeout_s
    while not all(f"{word} {i}\n" in "".join(p.read_text() for p in logs.glob(f"attempt-{attempt}.log")) for i in replicas):
        assert time.monotonic() < deadline, f"replicas {replicas} never started"
        time.sleep(0.02)


def _observe(backend, timeout_s=10.0, until=lambda o: True, key=(9, 1)):
    deadline = time.monotonic() + timeout_s
    while True:
        seen = {(o.job_id, o.attempt): o for o in backend.observe()}.get(key)
        if seen is not None and until(seen):
            return seen
        assert time.monotonic() < deadline, seen
        time.sleep(0.05)


def test_the_local_backend_adds_removes_terminates_and_collects_replicas(tmp_path):
    backend = LocalBackend(tmp_path / "run", node_name="local", demo_gpus=4)
    backend.launch(_spec(tmp_path, [0]))
    backend.launch(_spec(tmp_path, [0, 3, 5]))  # scale-up: only 3 and 5 are new
    _up(tmp_path, 0, 3, 5)
    seen = _observe(backend)
    assert seen.phase is RunPhase.RUNNING and seen.replicas == {0, 3, 5}
    pids = {i: int((tmp_path / "run" / "9-1" / "replicas" / str(i) / "pid").read_text().split()[0]) for i in (0, 3, 5)}
    backend.launch(_spec(tmp_path, [0, 3, 5]))  # again: nothing new starts
    assert {int(p.name) for p in (tmp_path / "run" / "9-1" / "replicas").iterdir()} == {0, 3, 5}
    assert pids == {i: int((tmp_path / "run" / "9-1" / "replicas" / str(i) / "pid").read_text().split()[0])
                    for i in (0, 3, 5)}

    backend.remove_replicas(9, 1, [3], grace_s=5)
    backend.remove_replicas(9, 1, [3, 42], grace_s=5)  # repeated, and one that never existed: harmless
    seen = _observe(backend, until=lambda o: 3 not in o.replicas)
    assert seen.phase is RunPhase.RUNNING and seen.replicas == {0, 5} and not seen.retiring  # 143 is no failure
    assert gone(pids[3]) and alive(pids[0]) and alive(pids[5])
    assert not (tmp_path / "run" / "9-1" / "replicas" / "3").exists()

    backend.terminate(9, 1, grace_s=5)  # the whole attempt: every replica
    seen = _observe(backend, until=lambda o: o.phase is not RunPhase.RUNNING)
    assert seen.phase is RunPhase.FAILED and seen.exit_code == 143
    assert gone(pids[0]) and gone(pids[5])

    backend.launch(_spec(tmp_path, [0, 1], attempt=2))
    _up(tmp_path, 0, 1, attempt=2)  # attempt 1's log says "up 0" too
    orphan = _observe(backend, key=(9, 2), until=lambda o: o.phase is RunPhase.RUNNING)
    assert orphan.replicas == {0, 1}
    orphan_pids = [int((tmp_path / "run" / "9-2" / "replicas" / str(i) / "pid").read_text().split()[0]) for i in (0, 1)]
    assert sorted(backend.collect_garbage([(9, 1)])) == [(9, 2)]
    assert not (tmp_path / "run" / "9-2").exists()
    assert all(gone(pid) for pid in orphan_pids)


def test_a_replica_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    backend = LocalBackend(tmp_path / "run", node_name="local", demo_gpus=4)
    backend.launch(_spec(tmp_path, [0, 1], command="trap '' TERM; echo deaf $DLTS_REPLICA; while :; do sleep 0.1; done"))
    _observe(backend, until=lambda o: o.replicas == {0, 1} and o.phase is RunPhase.RUNNING)
    _up(tmp_path, 0, 1, word="deaf")
    backend.remove_replicas(9, 1, [1], grace_s=0.5)
    t0 = time.monotonic()
    seen = _observe(backend, until=lambda o: o.retiring == {1})
    seen = _observe(backend, until=lambda o: o.replicas == {0})
    assert 0.4 < time.monotonic() - t0 < 8 and seen.phase is RunPhase.RUNNING
    backend.terminate(9, 1, grace_s=0)
