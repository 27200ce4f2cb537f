"""Backfill end to end: a VC on policy backfill, a job that waits behind a running one gets an
``estimated_start`` from the job manager's pass (stored on the job like its reason and queue
position), the API shows it, and it is cleared once the job starts. Settings from dlts.yaml
reach the core's snapshot."""

from __future__ import annotations

import datetime as dt

import requests
from live_helpers import get, submit, wait_for

from dlts.config import load_settings
from dlts.jobmanager.snapshot import load_snapshot


def _epoch(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_a_waiting_job_of_a_backfill_vc_carries_its_estimated_start(live, world, sessions, settings):
    r = requests.patch(f"{live.url}/api/v1/vcs/vision", json={"policy": "backfill", "max_job_time_s": 3600},
                       headers=world.auth("vcadmin"), timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["policy"] == "backfill"
    first = submit(live, world, command="sleep 600", gpus=4)
    running = wait_for(live, world, first["id"], {"running"})
    second = submit(live, world, command="true", gpus=2, user="bob")
    live.tick()
    waiting = get(live, world, second["id"], "bob")
    assert waiting["status"] == "queued" and waiting["estimated_start"] is not None
    # the running job's limit (the VC's 3600 s) bounds it: it starts when that one must have ended
    started = running["attempts"][-1]["started_at"] or running["started_at"]
    assert abs(_epoch(waiting["estimated_start"]) - (_epoch(started) + 3600)) < 5
    listed = requests.get(f"{live.url}/api/v1/jobs?vc=vision", headers=world.auth("bob"), timeout=10).json()
    row = next(j for j in listed["items"] if j["id"] == second["id"])
    assert row["estimated_start"] == waiting["estimated_start"]
    # the next pass reads it back as a reservation held, which the core keeps until the job starts
    # (docs/scheduling.md, "Kept reservations")
    with sessions() as s:
        held = {j.id: j.reserved for j in load_snapshot(s, settings).jobs}
    assert held[second["id"]] is True and held[first["id"]] is False
    requests.post(f"{live.url}/api/v1/jobs/{first['id']}/kill", headers=world.auth("alice"), timeout=10)
    done = wait_for(live, world, second["id"], {"finished"}, user="bob", timeout_s=30)
    assert done["estimated_start"] is None


def test_an_rf_vc_gives_no_estimate(live, world, sessions, settings):
    first = submit(live, world, command="sleep 600", gpus=4)
    wait_for(live, world, first["id"], {"running"})
    second = submit(live, world, command="true", gpus=2, user="bob")
    live.tick()
    assert get(live, world, second["id"], "bob")["estimated_start"] is None
    with sessions() as s:
        assert {j.id: j.reserved for j in load_snapshot(s, settings).jobs}[second["id"]] is False
    requests.post(f"{live.url}/api/v1/jobs/{first['id']}/kill", headers=world.auth("alice"), timeout=10)


def test_backfill_settings_from_the_file_reach_the_snapshot(tmp_path, sessions, world, settings):
    path = tmp_path / "dlts.yaml"
    path.write_text(f"database_url: {settings.database_url!r}\nreservation_depth: 3\ndefault_runtime_estimate_s: 7200\n")
    loaded = load_settings(path, environ={})
    assert (loaded.reservation_depth, loaded.default_runtime_estimate_s) == (3, 7200)
    with sessions() as s:
        snap = load_snapshot(s, loaded)
    assert snap.reservation_depth == 3
    assert snap.vcs["vision"].default_runtime_estimate_s == 7200  # the VC sets none: the cluster default
