"""One job the whole way: HTTP -> database -> scheduler core -> real process -> observed -> log."""

from __future__ import annotations

import time

import requests
import sqlalchemy as sa
from live_helpers import get, submit, wait_for, wait_for_log

from dlts.models import JobEvent


def test_a_job_prints_a_value_and_the_log_returns_it(live, world):
    job = submit(live, world, gpus=2,
                 command='echo "answer=$((6*7)) user=$DLTS_USER vc=$DLTS_VC gpus=$DLTS_NUM_GPUS cuda=$CUDA_VISIBLE_DEVICES"')
    assert job["status"] == "queued"
    done = wait_for(live, world, job["id"], {"finished"})
    assert done["exit_code"] == 0
    assert done["started_at"] and done["finished_at"] and done["started_at"] <= done["finished_at"]
    assert done["attempts"][0]["placements"][0]["gpu_indices"] == [0, 1]
    log = requests.get(f"{live.url}/api/v1/jobs/{job['id']}/log", headers=world.auth("alice"), timeout=10).json()
    assert log["data"] == "answer=42 user=alice vc=vision gpus=2 cuda=0,1\n"
    assert log["complete"] is True and log["next_offset"] == log["size"]
    download = requests.get(f"{live.url}/api/v1/jobs/{job['id']}/log?download=1", headers=world.auth("alice"), timeout=10)
    assert download.status_code == 200 and download.text == log["data"]
    assert "attachment" in download.headers["Content-Disposition"]


def test_a_cpu_only_job_runs_without_gpus(live, world):
    job = submit(live, world, command='echo "[$CUDA_VISIBLE_DEVICES]"', gpus=0)
    assert job["sku"] is None and job["gpus"] == 0
    wait_for(live, world, job["id"], {"finished"})
    log = requests.get(f"{live.url}/api/v1/jobs/{job['id']}/log", headers=world.auth("alice"), timeout=10).json()
    assert log["data"] == "[]\n"


def test_a_failing_command_ends_failed_with_its_exit_code_after_its_retries(live, world, sessions):
    job = submit(live, world, command="echo try; exit 7", max_retries=1)
    done = wait_for(live, world, job["id"], {"failed"})
    assert done["exit_code"] == 7
    assert done["retries_used"] == 1
    assert [(a["number"], a["exit_code"], a["spends_retry"]) for a in done["attempts"]] == [(1, 7, True), (2, 7, False)]
    assert done["reason"] == "failed"
    with sessions() as s:
        moves = s.execute(sa.select(JobEvent.from_status, JobEvent.to_status).where(
            JobEvent.job_id == job["id"], JobEvent.kind == "transition", JobEvent.from_status.is_not(None))
            .order_by(JobEvent.id)).all()
    assert moves[0] == ("queued", "scheduling")
    assert moves[-1][1] == "failed"
    assert ("running", "queued") in moves or ("scheduling", "queued") in moves  # the retry


def test_a_sleeping_job_is_killed_within_the_grace_period(live, world, settings):
    job = submit(live, world, command="echo started; exec sleep 600")
    wait_for_log(live, world, job["id"], "started")
    t0 = time.monotonic()
    r = requests.post(f"{live.url}/api/v1/jobs/{job['id']}/kill", headers=world.auth("alice"), timeout=10)
    assert r.status_code == 202 and r.json()["status"] == "killing"
    done = wait_for(live, world, job["id"], {"killed"}, timeout_s=settings.preempt_grace_s + 10)
    assert time.monotonic() - t0 < settings.preempt_grace_s + 5
    assert done["reason"] == "killed_by_user"
    assert done["exit_code"] == 128 + 15  # SIGTERM reached sleep through the init
    # killing a finished job is a 409 with the envelope
    again = requests.post(f"{live.url}/api/v1/jobs/{job['id']}/kill", headers=world.auth("alice"), timeout=10)
    assert again.status_code == 409 and again.json()["error"]["code"] == "job_already_ended"


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace(live, world, settings):
    job = submit(live, world, command="trap '' TERM; echo started; while :; do sleep 1; done")
    wait_for_log(live, world, job["id"], "started")
    requests.post(f"{live.url}/api/v1/jobs/{job['id']}/kill", headers=world.auth("alice"), timeout=10)
    done = wait_for(live, world, job["id"], {"killed"}, timeout_s=settings.preempt_grace_s + 15)
    assert done["exit_code"] in (137, 143)


def test_a_queued_job_over_capacity_waits_with_a_reason_and_position(live, world):
    first = submit(live, world, command="sleep 600", gpus=4)
    wait_for(live, world, first["id"], {"running"})
    second = submit(live, world, command="true", gpus=2, user="bob")
    live.tick()
    waiting = get(live, world, second["id"], "bob")
    assert waiting["status"] == "queued"
    assert waiting["reason"] in {"vc_quota", "capacity"} and waiting["reason_detail"]
    assert waiting["queue_position"] == 1
    requests.post(f"{live.url}/api/v1/jobs/{first['id']}/kill", headers=world.auth("alice"), timeout=10)
    wait_for(live, world, second["id"], {"finished"}, user="bob", timeout_s=20)
