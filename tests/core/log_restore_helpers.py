"""Jobs run through the real job manager and local backend, their logs read through the API, and the
orphaned logs listed by ``dlts db orphan-logs``: what the tests of logs after a database restore share
(tests/core/test_log_restore.py with SQLite and ``mariadb-dump``, tests/ansible/test_db_backup.py
with the mariadb role's point-in-time restore)."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

TIMEOUT_S = 180.0  # generous (a loaded 2-core machine took over 60 s): the bound of every wait, never a pause


@pytest.fixture
def cluster(app, settings, sessions, world, tmp_path):
    """A job manager with the local backend, ticked by the test; the API through the test client."""
    from dlts.backends.local import LocalBackend
    from dlts.jobmanager import JobManager

    backend = LocalBackend(settings.effective_run_dir, node_name="testnode", demo_gpus=4, demo_sku="demo-gpu")
    manager = JobManager(sessions, backend, settings)
    with sessions() as s:
        manager.sync_nodes(s)
    yield manager, backend
    backend.shutdown_running(1)


def until(manager, condition, what: str):
    """Tick the manager until ``condition()`` is true (its value is returned), at most TIMEOUT_S."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        manager.tick()
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {TIMEOUT_S} s: {what}"
        time.sleep(0.05)  # between polls


def submit(client, world, command: str) -> int:
    r = client.post("/api/v1/jobs", json={"vc": "vision", "image": "debian:12", "command": command, "max_retries": 0},
                    headers=world.auth("alice"))
    assert r.status_code == 201, r.get_data(as_text=True)
    return r.get_json()["id"]


def status(client, world, job_id: int) -> str:
    return client.get(f"/api/v1/jobs/{job_id}", headers=world.auth("alice")).get_json()["status"]


def job_log(client, world, job_id: int) -> str:
    r = client.get(f"/api/v1/jobs/{job_id}/log", headers=world.auth("alice"))
    assert r.status_code == 200, r.get_data(as_text=True)
    return r.get_json()["data"]


def download(client, world, job_id: int) -> tuple[int, str]:
    r = client.get(f"/api/v1/jobs/{job_id}/log", query_string={"download": 1}, headers=world.auth("alice"))
    return r.status_code, r.get_data(as_text=True)


def run_to_end(client, world, manager, settings, job_id: int) -> None:
    """Until the job finished and the backend forgot it (its run record is gone)."""
    record = settings.effective_run_dir / f"{job_id}-1"
    try:
        until(manager, lambda: status(client, world, job_id) == "finished" and not record.exists(),
              f"job {job_id} finished and forgotten")
    except AssertionError as exc:  # say which half did not come
        raise AssertionError(f"{exc} (status {status(client, world, job_id)}, run record "
                             f"{'still there: ' + str(sorted(p.name for p in record.iterdir())) if record.exists() else 'gone'})") from None


def orphan_report(settings, monkeypatch) -> list[dict]:
    """``dlts db orphan-logs --json`` with the test's settings: the orphans it lists."""
    from dlts.cli import main

    monkeypatch.setenv("DLTS_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("DLTS_HOME", str(settings.home))
    result = CliRunner().invoke(main, ["db", "orphan-logs", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["log_dir"] == str(settings.effective_log_dir)
    return report["orphans"]


def attempt_key(sessions, job_id: int, number: int = 1) -> str | None:
    import sqlalchemy as sa

    from dlts.models import JobAttempt

    with sessions() as s:
        return s.scalar(sa.select(JobAttempt.log_key).where(JobAttempt.job_id == job_id, JobAttempt.number == number))
