"""The job page says when a waiting job is expected to start and what kind of estimate that is: a
forecast from the forecast manager's run over the live job manager's jobs, or unknown; and, when the
live job manager moved its reservation later, why (the job's estimate_note), on the job page and in
the jobs list's tooltip, to its owner."""

from __future__ import annotations

import time

import requests
from markupsafe import escape

from dlts.jobmanager.forecast import ForecastManager
from tests.core.live_helpers import get, submit, wait_for


def test_the_job_page_shows_a_forecast_start_and_says_it_is_a_forecast(live, world, sessions, settings, as_user):
    r = requests.patch(f"{live.url}/api/v1/vcs/vision", json={"max_job_time_s": 3600}, headers=world.auth("vcadmin"),
                       timeout=10)
    assert r.status_code == 200, r.text
    first = submit(live, world, command="sleep 600", gpus=4)
    wait_for(live, world, first["id"], {"running"})
    second = submit(live, world, command="true", gpus=2, user="bob")
    live.tick()
    bob = as_user("bob")
    before = bob.get(f"/jobs/{second['id']}").get_data(as_text=True)
    assert 'data-estimate-source=""' in before and ">unknown</dd>" in before
    ForecastManager(sessions, settings).run_once()
    page = bob.get(f"/jobs/{second['id']}").get_data(as_text=True)
    assert 'data-estimate-source="forecast"' in page and "forecast: if running jobs end as predicted" in page
    requests.post(f"{live.url}/api/v1/jobs/{first['id']}/kill", headers=world.auth("alice"), timeout=10)


def test_the_job_page_says_why_the_estimated_start_moved_later(live, world, as_user):
    r = requests.patch(f"{live.url}/api/v1/vcs/vision", json={"policy": "backfill", "limit_weight": 0.25},
                       headers=world.auth("vcadmin"), timeout=10)
    assert r.status_code == 200, r.text
    blocker = submit(live, world, command="sleep 600", gpus=4, max_time_s=3600)
    jobs = [blocker["id"]]
    try:
        wait_for(live, world, blocker["id"], {"running"})
        waiting = submit(live, world, command="true", gpus=1)["id"]  # no limit: ranks a week x 0.25 later
        jobs.append(waiting)
        deadline = time.monotonic() + 20
        while get(live, world, waiting)["estimated_start_source"] != "reservation":
            assert time.monotonic() < deadline, get(live, world, waiting)
            live.tick()
        alice = as_user("alice")
        page = alice.get(f"/jobs/{waiting}").get_data(as_text=True)
        assert 'data-estimate-source="reservation"' in page and 'id="estimate-note"' not in page
        ahead = submit(live, world, command="true", gpus=4, max_time_s=600)["id"]  # ranks ahead by its limit
        jobs.append(ahead)
        live.tick()
        note = get(live, world, waiting)["estimate_note"]
        assert note and note.endswith(f"job {ahead} (shorter limit) ranked ahead of it"), note

        page = alice.get(f"/jobs/{waiting}").get_data(as_text=True)
        assert f'<span class="small" id="estimate-note">Moved later: {escape(note)}</span>' in page, page
        assert 'data-estimate-source="reservation"' in page
        listed = alice.get("/jobs").get_data(as_text=True)
        row = listed[listed.index(f'<tr data-job="{waiting}"'):]
        row = row[:row.index("</tr>")]
        assert "data-estimate-note" in row and f"(reservation); {escape(note)}" in row, row
        other = listed[listed.index(f'<tr data-job="{ahead}"'):]
        assert "data-estimate-note" not in other[:other.index("</tr>")]  # its own estimate did not move

        bob = as_user("bob")  # another member of the VC: the public fields, which the note names no job in
        assert "estimate-note" not in bob.get(f"/jobs/{waiting}").get_data(as_text=True)
        theirs = bob.get("/jobs?scope=vc").get_data(as_text=True)
        assert f'<tr data-job="{waiting}"' in theirs and "data-estimate-note" not in theirs
    finally:
        for job_id in jobs:
            requests.post(f"{live.url}/api/v1/jobs/{job_id}/kill", headers=world.auth("alice"), timeout=10)
