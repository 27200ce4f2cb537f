"""The job page says when a waiting job is expected to start and what kind of estimate that is: a
forecast from the forecast manager's run over the live job manager's jobs, or unknown."""

from __future__ import annotations

import requests

from dlts.jobmanager.forecast import ForecastManager
from tests.core.live_helpers import submit, wait_for


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
