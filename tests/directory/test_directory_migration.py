"""Revision 0013 (users.source, users.disabled_reason, groups.source, role_bindings.source) goes down to
0012 and up again, keeping the users, groups and bindings (SQLite batch mode)."""

from __future__ import annotations

import sqlalchemy as sa


def test_revision_0013_goes_down_and_up_again_keeping_the_rows(tmp_path):
    from alembic import command

    from dlts import db_migrate

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'down.db'}")
    try:
        db_migrate.upgrade(engine)
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO users (name, preferences, created_at, source, disabled_reason) "
                                 "VALUES ('alice', '{}', '2024-01-01', 'directory', 'missing from the directory')"))
            conn.execute(sa.text("INSERT INTO groups (name, source) VALUES ('team', 'directory')"))
            conn.execute(sa.text("INSERT INTO role_bindings (role, group_id, source) VALUES ('cluster_admin', 1, 'directory')"))
        cfg = db_migrate.alembic_config()
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0012")
        inspector = sa.inspect(engine)
        assert not {"source", "disabled_reason"} & {c["name"] for c in inspector.get_columns("users")}
        assert "source" not in {c["name"] for c in inspector.get_columns("role_bindings")}
        db_migrate.upgrade(engine)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT name, source, disabled_reason FROM users")).one() == ("alice", None, None)
            assert conn.execute(sa.text("SELECT name, source FROM groups")).one() == ("team", None)
            assert conn.scalar(sa.text("SELECT count(*) FROM role_bindings WHERE group_id = 1")) == 1
    finally:
        engine.dispose()
