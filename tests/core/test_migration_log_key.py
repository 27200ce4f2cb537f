"""Revision 0022 adds ``job_attempts.log_key`` as a nullable column: an attempt that ran before the
upgrade keeps no key, and its log, written under the old names (``<job id>/attempt-<n>.log``), is
still served by the API after the upgrade; the downgrade drops the column keeping the attempts. On
the database the tests run on (SQLite, or MariaDB with DLTS_TEST_DATABASE_URL)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from dlts import db_migrate
from dlts.logstore import AttemptLogWriter
from tests.core.test_migration_approved_by import _insert
from tests.core.test_migration_vc_scheduling import _downgrade
from tests.repair.test_migration import scratch_engine  # noqa: F401 (the fixture)


def _columns(engine) -> set[str]:
    return {c["name"] for c in sa.inspect(engine).get_columns("job_attempts")}


@pytest.mark.db
def test_revision_0022_keeps_the_logs_of_attempts_from_before_it_readable(scratch_engine, tmp_path):  # noqa: F811
    from dlts.app import create_app
    from dlts.config import Settings
    from dlts.db import engine_of, session_factory
    from dlts.services import admin

    engine = scratch_engine
    db_migrate.upgrade(engine, "0021")
    with engine.begin() as conn:
        _insert(conn, "users", id=1, name="alice")
        _insert(conn, "vcs", id=1, name="vision")
        _insert(conn, "jobs", id=7, name="old", user_id=1, vc_id=1, type="batch", status="finished", attempt=1)
        _insert(conn, "job_attempts", id=1, job_id=7, number=1, placements="[]")
    settings = Settings(home=tmp_path / "home", database_url=engine.url.render_as_string(hide_password=False),
                        secret_key="test-secret-key-0123456789")
    # the log as the code before 0022 wrote it: no key in its name
    writer = AttemptLogWriter(settings.effective_log_dir, 7, 1, 64 * 1024, key=None)
    writer.write(b"written before the upgrade\n")
    writer.close()
    assert "log_key" not in _columns(engine)

    db_migrate.upgrade(engine)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT job_id, number, log_key FROM job_attempts")).one() == (7, 1, None)
    settings.home.mkdir(parents=True, exist_ok=True)
    app = create_app(settings)
    try:
        with session_factory(app)() as s:
            token = admin.new_token(s, "alice", "test")
        client, auth = app.test_client(), {"Authorization": f"Bearer {token}"}
        r = client.get("/api/v1/jobs/7/log", headers=auth)
        assert r.status_code == 200 and r.get_json()["data"] == "written before the upgrade\n", r.get_data(as_text=True)
        r = client.get("/api/v1/jobs/7/log", query_string={"download": 1}, headers=auth)
        assert (r.status_code, r.get_data(as_text=True)) == (200, "written before the upgrade\n")
    finally:
        engine_of(app).dispose()

    _downgrade(engine, "0021")
    assert "log_key" not in _columns(engine)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT job_id, number FROM job_attempts")).one() == (7, 1)
    db_migrate.upgrade(engine)
    assert "log_key" in _columns(engine)
