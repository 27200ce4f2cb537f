"""A VC's preemption budget changed through the API applies at the job manager's next tick, with no
restart: the live server (real HTTP), the job manager ticked by the test, real processes."""

from __future__ import annotations

import time

import requests
from live_helpers import get, submit, wait_for


def _patch_nlp(live, world, body: dict) -> dict:
    r = requests.patch(f"{live.url}/api/v1/vcs/nlp", json=body, headers=world.auth("admin"), timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_min_runtime_set_on_the_vc_protects_its_work_from_the_next_tick_and_clearing_it_releases_it(live, world, settings):
    assert _patch_nlp(live, world, {"min_runtime_s": 3600})["min_runtime_s_source"] == "vc"
    guest = submit(live, world, user="carol", vc="nlp", command="exec sleep 600", gpus=4, preemptible=True)
    wait_for(live, world, guest["id"], {"running"}, user="carol")
    owner = submit(live, world, command="echo owner-ran", gpus=2)
    for _ in range(3):
        live.tick()
    waiting = get(live, world, owner["id"])
    assert waiting["status"] == "queued", waiting
    assert "inside their preemption budget (min_runtime_s)" in waiting["reason_detail"], waiting
    assert get(live, world, guest["id"], user="carol")["status"] == "running"

    assert _patch_nlp(live, world, {"min_runtime_s": None})["min_runtime_s_source"] == "default"  # 0: no budget
    t0 = time.monotonic()
    done = wait_for(live, world, owner["id"], {"finished"}, timeout_s=settings.preempt_grace_s + 20)
    assert done["exit_code"] == 0 and time.monotonic() - t0 < settings.preempt_grace_s + 15
    assert get(live, world, guest["id"], user="carol")["attempts"][0]["end_reason"] == "preempted"


def _patch(live, world, vc: str, body: dict) -> None:
    r = requests.patch(f"{live.url}/api/v1/vcs/{vc}", json=body, headers=world.auth("admin"), timeout=10)
    assert r.status_code == 200, r.text


def test_max_reclaim_delay_counts_from_when_the_job_first_waited_for_room(live, world, settings, sessions):
    """The delay counts from the first pass that finds the owner's job waiting for room, which the
    job manager reads back from the job's reason events, not from its queue time: the job was
    queued longer than the delay before any pass saw it, and still the protected guest keeps
    running until the delay has passed since that pass."""
    from dlts.jobmanager.snapshot import load_snapshot

    _patch(live, world, "nlp", {"min_runtime_s": 3600})
    _patch(live, world, "vision", {"max_reclaim_delay_s": 3})
    guest = submit(live, world, user="carol", vc="nlp", command="exec sleep 600", gpus=4, preemptible=True)
    wait_for(live, world, guest["id"], {"running"}, user="carol")
    owner = submit(live, world, command="echo owner-ran", gpus=2)
    time.sleep(3.5)  # queued longer than the delay, before any pass saw it
    live.tick()
    first_seen = time.time()
    waiting = get(live, world, owner["id"])
    assert waiting["status"] == "queued" and waiting["reason"] == "capacity", waiting
    assert "or until this job has waited for room max_reclaim_delay_s" in waiting["reason_detail"], waiting
    with sessions() as s:
        since = next(j for j in load_snapshot(s, settings).jobs if j.id == owner["id"]).room_wait_since
    assert since is not None and first_seen - 2 < since <= first_seen
    if time.time() - since < 2.5:  # a tick inside the delay leaves the guest alone
        live.tick()
        assert get(live, world, guest["id"], user="carol")["attempts"][0]["end_reason"] is None
    time.sleep(max(0.0, since + 3.2 - time.time()))
    t0 = time.monotonic()
    done = wait_for(live, world, owner["id"], {"finished"}, timeout_s=settings.preempt_grace_s + 20)
    assert done["exit_code"] == 0 and time.monotonic() - t0 < settings.preempt_grace_s + 15
    assert get(live, world, guest["id"], user="carol")["attempts"][0]["end_reason"] == "preempted"
