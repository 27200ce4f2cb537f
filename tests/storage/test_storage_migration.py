"""Revision 0011 on a database with rows of the old storage_usage: they stay readable, and the
downgrade keeps them (SQLite here; MariaDB was checked by hand with the same round trip)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command
from sqlalchemy.orm import Session

from dlts import db_migrate
from dlts.services import storage as storage_service
from dlts.services.auth import Principal

CLUSTER_ADMIN = Principal(user_id=1, name="admin", is_cluster_admin=True)


def test_old_usage_rows_survive_0011_up_and_down(tmp_path):
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'm.db'}")
    try:
        db_migrate.upgrade(engine, "0010")
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO storage_usage (scanned_at, mount, vc, user, bytes_used, files) "
                                 "VALUES ('2026-11-29 12:00:00.000000', '/data', 'vision', 'alice', 42, 3)"))
        db_migrate.upgrade(engine)
        with Session(engine) as session:
            report = storage_service.last_scan(session, CLUSTER_ADMIN)
        assert report.scanned_at == "2026-11-29T12:00:00.000Z"
        assert [(r.mount, r.user, r.bytes_used, r.directory, r.previous_bytes_used) for r in report.rows] == [
            ("/data", "alice", 42, None, None)]
        cfg = db_migrate.alembic_config()
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0010")
        inspector = sa.inspect(engine)
        assert "storage_snapshots" not in inspector.get_table_names()
        assert "snapshot_id" not in {c["name"] for c in inspector.get_columns("storage_usage")}
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT mount, bytes_used FROM storage_usage")).all() == [("/data", 42)]
    finally:
        engine.dispose()
