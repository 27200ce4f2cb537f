"""Revision 0006 moves old node rows to the repair loop's states, and back on downgrade."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy.engine import make_url

from dlts import db_migrate
from tests.conftest import IS_MYSQL, TEST_DATABASE_URL


@pytest.fixture
def scratch_engine(tmp_path):
    """An empty database of the kind the tests run on: a SQLite file, or on MariaDB
    (DLTS_TEST_DATABASE_URL) a scratch database next to the test one (``<name>_migration``), so the
    migrations can go down and up without touching the schema the other tests share."""
    if not IS_MYSQL:
        engine = sa.create_engine(f"sqlite:///{tmp_path / 'm.db'}")
        yield engine
        engine.dispose()
        return
    url = make_url(TEST_DATABASE_URL)
    name = f"{url.database}_migration"
    server = sa.create_engine(url.set(database=None))
    with server.begin() as conn:
        conn.execute(sa.text(f"DROP DATABASE IF EXISTS `{name}`"))
        conn.execute(sa.text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
    engine = sa.create_engine(url.set(database=name))
    yield engine
    engine.dispose()
    with server.begin() as conn:
        conn.execute(sa.text(f"DROP DATABASE IF EXISTS `{name}`"))
    server.dispose()


def _nodes(conn):
    return {r.name: r for r in conn.execute(sa.text("SELECT * FROM nodes ORDER BY name"))}


@pytest.mark.db
def test_old_node_states_migrate_and_downgrade(scratch_engine):
    engine = scratch_engine
    db_migrate.upgrade(engine, "0004")
    with engine.begin() as conn:
        for i, state in enumerate(("in_service", "cordoned", "unhealthy", "in_repair", "lost")):
            conn.execute(sa.text(
                "INSERT INTO nodes (name, sku, gpus, cpu, memory_bytes, ib_domain, state, ready, health, repair_state, "
                "backend, metrics, labels, created_at, updated_at) VALUES (:n, 'a100', 8, 64, 1, 'd', :s, 1, 'ok', "
                ":r, 'local', '{}', '{}', '2026-01-01', '2026-01-01')"), {"n": f"n{i}-{state}", "s": state,
                                                                          "r": "ordered" if state == "in_repair" else None})
    db_migrate.upgrade(engine, "0006")
    with engine.connect() as conn:
        rows = _nodes(conn)
    assert {n: (r.state, r.cordoned_by is not None) for n, r in rows.items()} == {
        "n0-in_service": ("in_service", False), "n1-cordoned": ("in_service", True),
        "n2-unhealthy": ("out_of_service", False), "n3-in_repair": ("out_of_service", False), "n4-lost": ("lost", False)}
    assert "dlts node return" in rows["n2-unhealthy"].state_reason
    assert all(r.unhealthy_gpus == "[]" and r.repair_paused == 0 for r in rows.values())
    cfg = db_migrate.alembic_config()
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection
        command.downgrade(cfg, "0004")
    with engine.connect() as conn:
        back = {n: r.state for n, r in _nodes(conn).items()}
    assert back == {"n0-in_service": "in_service", "n1-cordoned": "cordoned", "n2-unhealthy": "unhealthy",
                    "n3-in_repair": "unhealthy", "n4-lost": "lost"}
