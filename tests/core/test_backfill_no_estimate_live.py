"""Backfill end to end, with one reservation a pass (`reservation_depth: 1`): the job that gets
none says in its reason why it has no estimated start, through the job manager and the API."""

from __future__ import annotations

import pytest
import requests
from live_helpers import get, submit, wait_for


@pytest.fixture
def settings(settings):
    """The suite's settings with `reservation_depth: 1` (test_backfill_estimates_live.py checks that
    the setting reaches the snapshot from dlts.yaml)."""
    return settings.model_copy(update={"reservation_depth": 1})


def test_a_job_left_without_a_reservation_says_why_it_has_no_estimate(live, world, settings):
    r = requests.patch(f"{live.url}/api/v1/vcs/vision", json={"policy": "backfill", "max_job_time_s": 3600},
                       headers=world.auth("vcadmin"), timeout=10)
    assert r.status_code == 200, r.text
    first = submit(live, world, command="sleep 600", gpus=4)
    wait_for(live, world, first["id"], {"running"})
    second = submit(live, world, command="true", gpus=2, user="bob")
    third = submit(live, world, command="true", gpus=2, user="bob")
    live.tick()
    ahead, behind = get(live, world, second["id"], "bob"), get(live, world, third["id"], "bob")
    assert ahead["estimated_start"] is not None and "no estimated start" not in (ahead["reason_detail"] or "")
    assert behind["status"] == "queued" and behind["estimated_start"] is None
    assert behind["reason_detail"].endswith(
        "; no estimated start: this pass's reservations (reservation_depth 1) went to jobs ahead of it")
    requests.post(f"{live.url}/api/v1/jobs/{first['id']}/kill", headers=world.auth("alice"), timeout=10)
