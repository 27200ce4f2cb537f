"""Scheduler decisions carried out by the job manager on real processes: preemption, wall time."""

from __future__ import annotations

import time

from live_helpers import get, submit, wait_for


def test_a_non_preemptible_job_preempts_opportunistic_work_which_returns_to_the_head_of_its_queue(live, world, settings):
    guest = submit(live, world, user="carol", vc="nlp", command="echo guest; exec sleep 600", gpus=4, preemptible=True)
    wait_for(live, world, guest["id"], {"running"}, user="carol")
    owner = submit(live, world, command="echo owner-ran", gpus=2)
    t0 = time.monotonic()
    done = wait_for(live, world, owner["id"], {"finished"}, timeout_s=settings.preempt_grace_s + 20)
    assert time.monotonic() - t0 < settings.preempt_grace_s + 15
    back = get(live, world, guest["id"], user="carol")
    assert back["status"] in {"queued", "scheduling", "running"}
    assert back["retries_used"] == 0
    assert back["queue_time"] == guest["queue_time"]
    assert back["attempts"][0]["end_reason"] == "preempted" and back["attempts"][0]["spends_retry"] is False
    assert done["exit_code"] == 0


def test_a_job_past_its_wall_time_is_killed_with_reason_wall_time(live, world, settings):
    job = submit(live, world, command="echo started; exec sleep 600", max_time_s=1)
    done = wait_for(live, world, job["id"], {"killed"}, timeout_s=settings.preempt_grace_s + 20)
    assert done["reason"] == "wall_time"
    assert done["attempts"][-1]["end_reason"] == "wall_time"
    assert done["finished_at"]
