"""The production path of the insight settings: dlts.yaml (and the environment) -> Settings ->
`dlts managers` registers the manager at its interval -> the thresholds change what it finds."""

from __future__ import annotations

import datetime as dt

import pytest
from insight_kit import gpu_metrics, history, node_token, report, running_job

from dlts.config import ConfigError, load_settings
from dlts.managers.insight import InsightManager
from dlts.models import utcnow

pytestmark = pytest.mark.db


def test_dlts_managers_runs_the_insight_manager_with_the_files_settings(settings, managers_entries, tmp_path):
    config = tmp_path / "dlts.yaml"
    config.write_text(f"database_url: {settings.database_url}\nhome: {settings.home}\nlocal_backend_trusted_users: true\n"
                      "insight:\n  interval_s: 120\n  idle_min: 12\n")
    entry = managers_entries(config)["insight.run"]
    assert entry.interval_s == 120 and entry.run.__wrapped__.__self__.settings.idle_min == 12
    config.write_text(config.read_text() + "  enabled: false\n")
    seen = managers_entries(config)
    assert "insight.run" not in seen and "jobmanager.tick" in seen


def test_bad_insight_settings_stop_start_up_naming_the_key(tmp_path):
    config = tmp_path / "dlts.yaml"
    for text, key in (("insight:\n  idle_ratio: 2\n", "insight.idle_ratio"), ("insight:\n  idle_min: 0\n", "insight.idle_min"),
                      ("insight:\n  idle_mins: 3\n", "insight.idle_mins")):
        config.write_text(text)
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_settings(config, environ={})
    with pytest.raises(ConfigError, match="DLTS_INSIGHT__INTERVAL_S"):
        load_settings(None, environ={"DLTS_INSIGHT__INTERVAL_S": "soon"})
    assert load_settings(None, environ={"DLTS_INSIGHT__IDLE_MIN": "45"}).insight.idle_min == 45


def codes_after_a_pass(client, world, sessions, settings, tmp_path, line: str, job_id: int) -> list[str]:
    """dlts.yaml with ``insight: {line}`` -> load_settings -> one manager pass -> the job's finding codes."""
    config = tmp_path / "insight.yaml"
    config.write_text(f"insight:\n  {line}\n")
    loaded = load_settings(config, environ={})
    InsightManager(sessions, settings.model_copy(update={"insight": loaded.insight})).run_once()
    got = client.get(f"/api/v1/jobs/{job_id}", headers=world.auth("alice")).get_json()["insights"]
    return [i["code"] for i in got]


def test_the_files_idle_min_decides_when_a_job_is_idle(client, world, sessions, settings, tmp_path):
    job_id = running_job(client, world, sessions, gpus=(0,))
    idle = gpu_metrics({0: (job_id, 0.0)})
    history(sessions, 15, idle)
    report(client, node_token(sessions), idle)
    for idle_min, found in ((30, []), (10, ["gpus_idle"])):
        assert codes_after_a_pass(client, world, sessions, settings, tmp_path, f"idle_min: {idle_min}", job_id) == found


def test_the_files_report_interval_decides_what_is_a_gap(client, world, sessions, settings, tmp_path):
    """Agents that report every 2 minutes leave every other minute without a point: an unbroken idle
    history once dlts.yaml says so, a broken one at the default 15 s."""
    job_id = running_job(client, world, sessions, gpus=(0,))
    idle = gpu_metrics({0: (job_id, 0.0)})
    now = utcnow()
    for k in range(44, 0, -2):
        history(sessions, 1, idle, end=now - dt.timedelta(minutes=k))
    report(client, node_token(sessions), idle)
    for interval, found in ((15, []), (120, ["gpus_idle"])):
        got = codes_after_a_pass(client, world, sessions, settings, tmp_path, f"report_interval_s: {interval}", job_id)
        assert got == found, interval
