"""Revision 0010 goes down to 0009 and up again, keeping the attempts (SQLite batch mode)."""

from __future__ import annotations

import sqlalchemy as sa


def test_revision_0010_goes_down_and_up_again_keeping_the_attempts(tmp_path):
    from alembic import command

    from dlts import db_migrate

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'down.db'}")
    try:
        db_migrate.upgrade(engine)
        cfg = db_migrate.alembic_config()
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0009")
        inspector = sa.inspect(engine)
        assert not {"usage_totals", "usage_job_days", "utilisation_points"} & set(inspector.get_table_names())
        assert "booked_until" not in {c["name"] for c in inspector.get_columns("job_attempts")}
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO users (name, preferences, created_at) VALUES ('alice', '{}', '2024-01-01')"))
            # (no foreign keys on this bare connection: an attempt needs no job row here)
            conn.execute(sa.text("INSERT INTO job_attempts (job_id, number, placements, created_at, started_at, ended_at) "
                                 "VALUES (1, 1, '[]', '2024-01-01', '2024-01-01 00:00:00', '2024-01-01 01:00:00')"))
        db_migrate.upgrade(engine)
        with engine.connect() as conn:
            columns = {c["name"] for c in sa.inspect(conn).get_columns("job_attempts")}
            assert {"accounting_open", "booked_until", "utilisation_booked_until", "gpu_ms"} <= columns
            assert conn.scalar(sa.text("SELECT count(*) FROM users")) == 1
            # an attempt from before the revision is open with nothing booked: the first pass books it
            assert conn.execute(sa.text("SELECT accounting_open, gpu_ms, booked_until FROM job_attempts")).one() == (1, 0, None)
    finally:
        engine.dispose()
