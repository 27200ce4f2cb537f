"""The forecast end to end: dlts.yaml's ``forecast:`` section, `dlts managers` registering the
forecast manager, a run over the live job manager's jobs (real HTTP, local backend) writing
``jobs.forecast_start``, the API's ``estimated_start`` / ``estimated_start_source``, and the next
pass, which must not read a forecast as a reservation."""

from __future__ import annotations

import datetime as dt
import time

import pytest
import requests
from live_helpers import get, submit, wait_for

from dlts.config import ConfigError, load_settings
from dlts.jobmanager.forecast import ForecastManager
from dlts.jobmanager.snapshot import load_snapshot
from dlts.repositories import jobs as job_repo


def _epoch(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _limit_vision(live, world, seconds: int) -> None:
    r = requests.patch(f"{live.url}/api/v1/vcs/vision", json={"max_job_time_s": seconds},
                       headers=world.auth("vcadmin"), timeout=10)
    assert r.status_code == 200, r.text


def test_every_waiting_job_gets_a_forecast_start_that_the_scheduler_does_not_hold(live, world, sessions, settings,
                                                                                    tmp_path):
    config = tmp_path / "dlts.yaml"
    config.write_text("forecast:\n  max_passes: 50\n  precision: 0.01\n  history_runs: 2\n")
    loaded = load_settings(config, environ={})
    forecaster = ForecastManager(sessions, settings.model_copy(update={"forecast": loaded.forecast}))
    _limit_vision(live, world, 3600)  # vision is RF: no reservation, the forecast is all there is
    first = submit(live, world, command="sleep 600", gpus=4)
    running = wait_for(live, world, first["id"], {"running"})
    second = submit(live, world, command="true", gpus=2, user="bob")
    third = submit(live, world, command="true", gpus=4, user="bob", max_time_s=1800)
    live.tick()
    assert get(live, world, second["id"], "bob")["estimated_start"] is None  # nothing forecast yet
    run = forecaster.run_once()
    assert (run.waiting, run.forecast) == (2, 2) and run.changed == 2
    started = _epoch(running["attempts"][-1]["started_at"] or running["started_at"])
    two, three = get(live, world, second["id"], "bob"), get(live, world, third["id"], "bob")
    # job 1 holds all 4 GPUs until its limit (alice has no finished run to predict from); then job 2
    # (2 GPUs, the VC's 3600 s) and job 3 (4 GPUs) cannot run together: job 3 after job 2's limit
    assert two["estimated_start_source"] == "forecast" and abs(_epoch(two["estimated_start"]) - (started + 3600)) < 40
    assert abs(_epoch(three["estimated_start"]) - (started + 7200)) < 80
    listed = requests.get(f"{live.url}/api/v1/jobs?vc=vision", headers=world.auth("alice"), timeout=10).json()
    row = next(j for j in listed["items"] if j["id"] == second["id"])  # a colleague sees it too
    assert (row["estimated_start"], row["estimated_start_source"]) == (two["estimated_start"], "forecast")
    # the next pass does not take a forecast for a reservation
    live.tick()
    with sessions() as s:
        assert {j.id: j.reserved for j in load_snapshot(s, settings).jobs}[second["id"]] is False
    assert forecaster.run_once().changed == 0  # nothing moved: no row written
    requests.post(f"{live.url}/api/v1/jobs/{first['id']}/kill", headers=world.auth("alice"), timeout=10)
    done = wait_for(live, world, second["id"], {"finished"}, user="bob", timeout_s=30)
    assert done["estimated_start"] is None and done["estimated_start_source"] is None
    with sessions() as s:
        assert job_repo.jobs_by_id(s, [second["id"]])[second["id"]].forecast_start is None  # cleared at its start


def test_a_users_last_finished_runs_predict_their_running_jobs_end(live, world, sessions, settings):
    _limit_vision(live, world, 36000)
    quick = [submit(live, world, command="sleep 1", gpus=1) for _ in range(3)]
    for q in quick:
        wait_for(live, world, q["id"], {"finished"})
    with sessions() as s:
        runs = job_repo.recent_run_times(s, ["alice", "bob"], 2)
    assert list(runs) == ["alice"] and len(runs["alice"]) == 2 and all(0.5 < r < 30 for r in runs["alice"])
    blocker = submit(live, world, command="sleep 600", gpus=4, max_time_s=30000)
    running = wait_for(live, world, blocker["id"], {"running"})
    waiting = submit(live, world, command="true", gpus=4, user="bob")
    live.tick()
    forecaster = ForecastManager(sessions, settings)
    # alice's last two runs took about a second each: her new job is predicted to end as soon
    forecaster.run_once()
    started = _epoch(running["started_at"])
    predicted = started + sum(runs["alice"]) / 2
    assert abs(_epoch(get(live, world, waiting["id"], "bob")["estimated_start"]) - max(predicted, time.time())) < 5
    # once it has run longer than that, it is expected to run to its limit (30000 s)
    while time.time() < started + max(runs["alice"]) + 0.5:
        time.sleep(0.2)
    forecaster.run_once()
    start = _epoch(get(live, world, waiting["id"], "bob")["estimated_start"])
    assert abs(start - (started + 30000)) < 1600  # within 5 % of the time ahead
    # with history_runs 0 only limits count, from the first forecast on
    limits_only = settings.forecast.model_copy(update={"history_runs": 0})
    ForecastManager(sessions, settings.model_copy(update={"forecast": limits_only})).run_once()
    assert abs(_epoch(get(live, world, waiting["id"], "bob")["estimated_start"]) - start) < 1600
    requests.post(f"{live.url}/api/v1/jobs/{blocker['id']}/kill", headers=world.auth("alice"), timeout=10)


def test_a_job_behind_work_without_a_limit_has_no_forecast(live, world, sessions, settings):
    first = submit(live, world, command="sleep 600", gpus=4)  # vision sets no limit: unbounded
    wait_for(live, world, first["id"], {"running"})
    second = submit(live, world, command="true", gpus=2, user="bob")
    live.tick()
    run = ForecastManager(sessions, settings).run_once()
    assert (run.waiting, run.forecast) == (1, 0) and run.horizon == float("inf")
    got = get(live, world, second["id"], "bob")
    assert got["estimated_start"] is None and got["estimated_start_source"] is None
    requests.post(f"{live.url}/api/v1/jobs/{first['id']}/kill", headers=world.auth("alice"), timeout=10)


def test_dlts_managers_runs_the_forecast_manager_with_the_files_settings(settings, managers_entries, tmp_path):
    config = tmp_path / "dlts.yaml"
    config.write_text(f"database_url: {settings.database_url}\nhome: {settings.home}\nlocal_backend_trusted_users: true\n"
                      "forecast:\n  interval_s: 120\n  max_passes: 40\n")
    entry = managers_entries(config)["forecast.run"]
    assert entry.interval_s == 120 and entry.run.__wrapped__.__self__.settings.forecast.max_passes == 40
    config.write_text(config.read_text() + "  enabled: false\n")
    seen = managers_entries(config)
    assert "forecast.run" not in seen and "jobmanager.tick" in seen


def test_bad_forecast_settings_stop_start_up_naming_the_key(tmp_path):
    config = tmp_path / "dlts.yaml"
    for text, key in (("forecast:\n  precision: 0\n", "forecast.precision"),
                      ("forecast:\n  max_passes: 0\n", "forecast.max_passes"),
                      ("forecast:\n  passes: 3\n", "forecast.passes")):
        config.write_text(text)
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_settings(config, environ={})
    assert load_settings(None, environ={"DLTS_FORECAST__INTERVAL_S": "60"}).forecast.interval_s == 60
