"""Revision 0016 moves a job's approval out of ``spec["approved_by"]`` into ``jobs.approved_by``, and
back on downgrade, on the database the tests run on (SQLite, or MariaDB with DLTS_TEST_DATABASE_URL)."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from alembic import command

from dlts import db_migrate
from tests.repair.test_migration import scratch_engine  # noqa: F401 (the fixture)


def _insert(conn, table: str, **values) -> None:
    """A row with ``values`` and a plain value in every other required column of the table as it is
    at this revision."""
    for column in sa.inspect(conn).get_columns(table):
        if column["name"] in values or column["nullable"] or column.get("autoincrement") is True:
            continue
        kind = column["type"]
        if isinstance(kind, sa.DateTime):
            values[column["name"]] = "2026-01-01 00:00:00"
        elif isinstance(kind, (sa.Integer, sa.Float, sa.Numeric, sa.Boolean)):
            values[column["name"]] = 0
        elif isinstance(kind, (sa.JSON, sa.Text)) or "JSON" in str(kind).upper() or "TEXT" in str(kind).upper():
            values[column["name"]] = "{}"  # MariaDB's JSON is LONGTEXT that must hold valid JSON
        else:
            values[column["name"]] = "x"
    names = ", ".join(values)
    conn.execute(sa.text(f"INSERT INTO {table} ({names}) VALUES ({', '.join(':' + n for n in values)})"), values)


def _jobs(conn):
    return {r.name: r for r in conn.execute(sa.text("SELECT * FROM jobs ORDER BY id"))}


def _spec(row) -> dict:
    return json.loads(row.spec) if isinstance(row.spec, (str, bytes)) else row.spec


@pytest.mark.db
def test_approval_moves_from_the_spec_to_its_column_and_back(scratch_engine):  # noqa: F811
    engine = scratch_engine
    db_migrate.upgrade(engine, "0015")
    with engine.begin() as conn:
        _insert(conn, "users", id=1, name="alice")
        _insert(conn, "vcs", id=1, name="vision")
        specs = {"approved": {"env": {"A": "1"}, "approved_by": "vcadmin"},
                 "plain": {"env": {}, "ssh": True},
                 "named": {"env": {"NOTE": "approved_by is just text here"}}}
        for i, (name, spec) in enumerate(specs.items(), start=1):
            _insert(conn, "jobs", id=i, name=name, user_id=1, vc_id=1, type="batch", status="queued",
                    spec=json.dumps(spec))
    db_migrate.upgrade(engine, "0016")
    with engine.connect() as conn:
        rows = _jobs(conn)
    assert {n: r.approved_by for n, r in rows.items()} == {"approved": "vcadmin", "plain": None, "named": None}
    assert _spec(rows["approved"]) == {"env": {"A": "1"}}
    assert _spec(rows["plain"]) == specs["plain"] and _spec(rows["named"]) == specs["named"]
    cfg = db_migrate.alembic_config()
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection
        command.downgrade(cfg, "0015")
    with engine.connect() as conn:
        back = _jobs(conn)
    assert {n: _spec(r) for n, r in back.items()} == specs
    assert "approved_by" not in back["approved"]._fields
