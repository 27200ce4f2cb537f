"""Revision 0021 adds ``jobs.estimate_note`` (why a waiting job's estimated start last moved later)
as a nullable column: existing jobs keep their rows with no note, a note as long as an event's
message fits, and the downgrade drops it keeping the jobs, on the database the tests run on (SQLite,
or MariaDB with DLTS_TEST_DATABASE_URL)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from dlts import db_migrate
from tests.core.test_migration_approved_by import _insert
from tests.core.test_migration_vc_scheduling import _downgrade
from tests.repair.test_migration import scratch_engine  # noqa: F401 (the fixture)


@pytest.mark.db
def test_revision_0021_adds_the_estimate_note_unset_and_drops_it_keeping_the_jobs(scratch_engine):  # noqa: F811
    engine = scratch_engine
    db_migrate.upgrade(engine, "0020")
    with engine.begin() as conn:
        _insert(conn, "users", id=1, name="alice")
        _insert(conn, "vcs", id=1, name="vision")
        _insert(conn, "jobs", id=7, name="waiting", user_id=1, vc_id=1, type="batch", status="queued",
                estimated_start="2026-01-01 01:00:00")
    assert "estimate_note" not in {c["name"] for c in sa.inspect(engine).get_columns("jobs")}
    db_migrate.upgrade(engine, "0021")
    with engine.connect() as conn:
        assert tuple(conn.execute(sa.text("SELECT name, status, estimate_note FROM jobs")).one()) \
            == ("waiting", "queued", None)
    note = "estimated start moved 5 min later: " + "job 14 (shorter limit), " * 40  # up to 1024 characters
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE jobs SET estimate_note = :n WHERE id = 7"), {"n": note[:1024]})
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT estimate_note FROM jobs")).scalar_one() == note[:1024]

    _downgrade(engine, "0020")
    assert "estimate_note" not in {c["name"] for c in sa.inspect(engine).get_columns("jobs")}
    with engine.connect() as conn:
        assert tuple(conn.execute(sa.text("SELECT id, name FROM jobs")).one()) == (7, "waiting")
    db_migrate.upgrade(engine)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT estimate_note FROM jobs")).scalar_one() is None
