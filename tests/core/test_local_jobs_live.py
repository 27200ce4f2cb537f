"""Jobs through the API and the job manager on the local backend: logs served only from the log
store (capped, merged on download, never through a link), launches a crash interrupted, pending
reasons and the start timeout, start times, and a torchrun-like distributed job in the demo."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import requests
import sqlalchemy as sa
from live_helpers import get, submit, wait_for, wait_for_log

from dlts.backends import local as local_backend
from dlts.jobmanager import JobManager
from dlts.models import Job, JobAttempt, JobEvent

RENDEZVOUS = Path(__file__).with_name("rendezvous_check.py")


def _log(live, world, job_id, **params):
    return requests.get(f"{live.url}/api/v1/jobs/{job_id}/log", params=params, headers=world.auth("alice"), timeout=10)


def test_a_job_that_links_its_log_to_etc_passwd_gets_nothing_served(live, world, settings, caplog):
    log_dir = settings.effective_log_dir
    # the log writer creates the file when the first output reaches it: wait for that before
    # swapping it for the link (an rm that came first failed the attempt, and its retry served "mine")
    # (its file is attempt-<n>-<log key>.log: the job finds it by its attempt number)
    job = submit(live, world, max_retries=0,
                 command=f'echo mine; cd {log_dir}/$DLTS_JOB_ID && for i in $(seq 100); do '
                         'f=$(ls attempt-$DLTS_ATTEMPT-*.log 2>/dev/null); [ -s "$f" ] && break; sleep 0.1; done; '
                         'rm "$f" && ln -s /etc/passwd "$f"')
    assert wait_for(live, world, job["id"], {"finished", "failed"})["status"] == "finished"
    [head] = (log_dir / str(job["id"])).glob("attempt-1-*.log")
    assert head.is_symlink()
    with caplog.at_level(logging.WARNING, logger="dlts.services.jobs"):
        for params in ({}, {"download": 1}):
            r = _log(live, world, job["id"], **params)
            assert r.status_code == 400 and r.json()["error"]["code"] == "no_log", r.text
            assert "root:" not in r.text
    assert "refusing to serve its log" in caplog.text


def test_a_log_over_the_cap_keeps_head_and_tail_and_the_download_merges_the_parts(live, world):
    live.backend.log_max_bytes = 64 * 1024
    job = submit(live, world, command="seq 1 100000")  # 589 KB of output
    wait_for(live, world, job["id"], {"finished"})
    whole = _log(live, world, job["id"], download=1)
    assert whole.status_code == 200
    text = whole.text
    assert text.startswith("1\n2\n3\n") and text.endswith("99999\n100000\n")
    assert text.count("bytes of this log were dropped here to keep it within log_max_bytes") == 1
    # following the log slice by slice reads the same bytes
    followed, offset = "", 0
    while True:
        piece = _log(live, world, job["id"], offset=offset, limit=8192).json()
        if not piece["data"]:
            break
        followed += piece["data"]
        offset = piece["next_offset"]
    assert followed == text and piece["complete"] is True
    assert piece["size"] == len("".join(f"{i}\n" for i in range(1, 100001)))


def test_a_launch_cut_short_by_a_crash_is_started_by_a_later_tick(live, world, monkeypatch):
    monkeypatch.setattr(local_backend, "LAUNCH_GRACE_S", 0.5)
    real_start = live.backend._start
    monkeypatch.setattr(live.backend, "_start", lambda *a, **kw: None)  # died right after mkdir
    job = submit(live, world, command="echo ran")
    live.tick()
    assert get(live, world, job["id"])["status"] == "scheduling"
    monkeypatch.setattr(live.backend, "_start", real_start)  # the restarted job manager
    done = wait_for(live, world, job["id"], {"finished"})
    assert done["exit_code"] == 0 and _log(live, world, job["id"]).json()["data"] == "ran\n"


def test_a_job_whose_launch_was_cut_short_can_be_killed(live, world, monkeypatch):
    monkeypatch.setattr(local_backend, "LAUNCH_GRACE_S", 0.5)
    monkeypatch.setattr(live.backend, "_start", lambda *a, **kw: None)  # every launch dies after mkdir
    job = submit(live, world, command="sleep 600")
    live.tick()
    r = requests.post(f"{live.url}/api/v1/jobs/{job['id']}/kill", headers=world.auth("alice"), timeout=10)
    assert r.status_code == 202 and r.json()["status"] == "killing"
    done = wait_for(live, world, job["id"], {"killed"}, timeout_s=10)
    assert done["status"] == "killed"
    assert not (live.backend.run_dir / f"{job['id']}-1").exists()


def test_start_times_are_never_before_the_submission(live, world, sessions):
    jobs = [submit(live, world, command="true", gpus=0) for _ in range(3)]
    for job in jobs:
        wait_for(live, world, job["id"], {"finished"})
    with sessions() as s:
        for job in jobs:
            row = s.get(Job, job["id"])
            attempt = s.scalar(sa.select(JobAttempt).where(JobAttempt.job_id == row.id))
            assert row.submitted_at <= attempt.created_at <= attempt.started_at <= attempt.ended_at
            assert row.submitted_at <= row.started_at <= row.finished_at


def test_a_pending_reason_shows_within_a_tick_and_the_start_timeout_ends_the_attempt(live, world, sessions, settings):
    """The init cannot open the job's log (its log directory is a link): the attempt never starts.
    Its reason is on the job after one tick, one event for it, and after start_timeout_s the attempt
    ends with that reason, spends the retry, and the job fails with the cause as its detail."""
    manager = JobManager(sessions, live.backend, settings.model_copy(update={"start_timeout_s": 5.0}))
    job = submit(live, world, command="echo never", max_retries=1)
    (settings.effective_log_dir).mkdir(parents=True, exist_ok=True)
    (settings.effective_log_dir / str(job["id"])).symlink_to("/tmp")
    manager.tick()  # starts it
    deadline = time.monotonic() + 5
    while (seen := get(live, world, job["id"]))["reason"] is None:
        assert time.monotonic() < deadline, (seen["status"], seen["reason"], seen["attempts"])
        time.sleep(0.1)
        manager.tick()
    assert seen["status"] == "scheduling" and seen["reason"] == "init_failed"
    assert "cannot open the job's log" in seen["reason_detail"]
    deadline = time.monotonic() + 30
    while (seen := get(live, world, job["id"]))["status"] != "failed":
        assert time.monotonic() < deadline, seen
        time.sleep(0.2)
        manager.tick()
    assert seen["reason"] == "start_timeout" and seen["reason_detail"].startswith("init_failed: the DLTS init exited")
    assert seen["retries_used"] == 1
    assert [(a["number"], a["spends_retry"]) for a in seen["attempts"]] == [(1, True), (2, False)]
    with sessions() as s:
        reasons = s.scalars(sa.select(JobEvent.reason).where(JobEvent.job_id == job["id"], JobEvent.kind == "reason")
                            .order_by(JobEvent.id)).all()
        ends = s.scalars(sa.select(JobAttempt.end_reason).where(JobAttempt.job_id == job["id"])
                         .order_by(JobAttempt.number)).all()
    assert reasons == ["init_failed", "init_failed"]  # once per attempt, not once per tick
    assert ends == ["start_timeout", "start_timeout"]
    assert not any(p.name.startswith(f"{job['id']}-") for p in live.backend.run_dir.iterdir())  # freed
    (settings.effective_log_dir / str(job["id"])).unlink()


def test_a_torchrun_like_distributed_job_meets_at_its_rendezvous_in_the_demo(live, world):
    job = submit(live, world, type="distributed", nodes=1, gpus=4, command=f"{sys.executable} {RENDEZVOUS}")
    done = wait_for(live, world, job["id"], {"finished", "failed"}, timeout_s=40)
    log = _log(live, world, job["id"]).json()["data"]
    assert done["status"] == "finished", log
    for rank in range(4):
        assert f"rank {rank} of 4 (node 0 of 1, local {rank} of 4) master 127.0.0.1:" in log
    assert "rendezvous complete: ranks [0, 1, 2, 3]" in log


def test_a_kill_reaches_the_job_through_the_log_pipe_init(live, world, settings):
    job = submit(live, world, command="echo started; exec sleep 600")
    wait_for_log(live, world, job["id"], "started")
    requests.post(f"{live.url}/api/v1/jobs/{job['id']}/kill", headers=world.auth("alice"), timeout=10)
    done = wait_for(live, world, job["id"], {"killed"}, timeout_s=settings.preempt_grace_s + 10)
    assert done["exit_code"] == 143
