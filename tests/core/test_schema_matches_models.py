"""The migrations and the models describe the same schema (no drift), on SQLite and MariaDB."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from dlts.models import Base


def test_migrated_schema_has_no_drift_from_the_models(database_url):
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": False}), Base.metadata)
    finally:
        engine.dispose()
    assert diff == [], f"models and migrations differ; write a revision: {diff}"


def test_revision_0005_goes_down_and_up_again_keeping_the_rows(tmp_path):
    """users.uid/gid, vcs.gid/ephemeral_storage_bytes and registry_credentials come and go cleanly on SQLite
    (batch mode) with the rows of the tables it alters kept."""
    from alembic import command

    from dlts import db_migrate

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'down.db'}")
    try:
        db_migrate.upgrade(engine)
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO users (name, preferences, created_at, uid, gid) "
                                 "VALUES ('alice', '{}', '2024-01-01', 20001, 20000)"))
        cfg = db_migrate.alembic_config()
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0004")
        inspector = sa.inspect(engine)
        assert "registry_credentials" not in inspector.get_table_names()
        assert "uid" not in {c["name"] for c in inspector.get_columns("users")}
        db_migrate.upgrade(engine)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT name, uid FROM users")).all() == [("alice", None)]
    finally:
        engine.dispose()
