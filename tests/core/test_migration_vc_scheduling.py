"""Revision 0017 adds the VC's scheduling settings (fair_share, min_runtime_s, max_reclaim_delay_s,
max_preemptions) as nullable columns of ``vcs``: existing VCs keep their rows with every setting unset
(dlts.yaml's values apply, as before), and the downgrade drops them keeping the rows, on the database
the tests run on (SQLite, or MariaDB with DLTS_TEST_DATABASE_URL). Revision 0018 adds
fair_share_max_wait_s the same way, and revision 0020 limit_weight."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic import command

from dlts import db_migrate
from tests.core.test_migration_approved_by import _insert
from tests.repair.test_migration import scratch_engine  # noqa: F401 (the fixture)

COLUMNS = ("fair_share", "min_runtime_s", "max_reclaim_delay_s", "max_preemptions")


def _downgrade(engine, revision: str) -> None:
    cfg = db_migrate.alembic_config()
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection
        command.downgrade(cfg, revision)


@pytest.mark.db
def test_the_scheduling_columns_come_unset_and_go_keeping_the_vcs(scratch_engine):  # noqa: F811
    engine = scratch_engine
    db_migrate.upgrade(engine, "0016")
    with engine.begin() as conn:
        _insert(conn, "vcs", id=1, name="vision", policy="RF", quota='{"a100": 8}')
    db_migrate.upgrade(engine, "0017")
    with engine.connect() as conn:
        row = conn.execute(sa.text(f"SELECT name, policy, {', '.join(COLUMNS)} FROM vcs")).one()
    assert tuple(row) == ("vision", "RF", None, None, None, None)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE vcs SET fair_share = :f, min_runtime_s = 600, max_reclaim_delay_s = 0, "
                             "max_preemptions = 3 WHERE id = 1"), {"f": False})
    with engine.connect() as conn:
        row = conn.execute(sa.text(f"SELECT {', '.join(COLUMNS)} FROM vcs")).one()
    assert (bool(row[0]) is False, *row[1:]) == (True, 600, 0, 3)

    _downgrade(engine, "0016")
    assert not set(COLUMNS) & {c["name"] for c in sa.inspect(engine).get_columns("vcs")}
    with engine.connect() as conn:
        assert tuple(conn.execute(sa.text("SELECT name, policy FROM vcs")).one()) == ("vision", "RF")
    db_migrate.upgrade(engine)
    with engine.connect() as conn:
        assert tuple(conn.execute(sa.text(f"SELECT {', '.join(COLUMNS)} FROM vcs")).one()) == (None,) * 4


@pytest.mark.db
def test_revision_0018_adds_the_fair_share_bound_unset_and_drops_it_keeping_the_vcs(scratch_engine):  # noqa: F811
    engine = scratch_engine
    db_migrate.upgrade(engine, "0017")
    with engine.begin() as conn:
        _insert(conn, "vcs", id=1, name="vision", policy="RF", quota='{"a100": 8}')
        conn.execute(sa.text("UPDATE vcs SET min_runtime_s = 600 WHERE id = 1"))
    assert "fair_share_max_wait_s" not in {c["name"] for c in sa.inspect(engine).get_columns("vcs")}
    db_migrate.upgrade(engine, "0018")
    with engine.connect() as conn:
        assert tuple(conn.execute(sa.text("SELECT name, min_runtime_s, fair_share_max_wait_s FROM vcs")).one()) \
            == ("vision", 600, None)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE vcs SET fair_share_max_wait_s = 2592000 WHERE id = 1"))
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT fair_share_max_wait_s FROM vcs")).scalar_one() == 30 * 86400

    _downgrade(engine, "0017")
    assert "fair_share_max_wait_s" not in {c["name"] for c in sa.inspect(engine).get_columns("vcs")}
    with engine.connect() as conn:
        assert tuple(conn.execute(sa.text("SELECT name, min_runtime_s FROM vcs")).one()) == ("vision", 600)
    db_migrate.upgrade(engine)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT fair_share_max_wait_s FROM vcs")).scalar_one() is None


@pytest.mark.db
def test_revision_0020_adds_the_limit_weight_unset_and_drops_it_keeping_the_vcs(scratch_engine):  # noqa: F811
    engine = scratch_engine
    db_migrate.upgrade(engine, "0019")
    with engine.begin() as conn:
        _insert(conn, "vcs", id=1, name="vision", policy="backfill", quota='{"a100": 8}')
        conn.execute(sa.text("UPDATE vcs SET fair_share_max_wait_s = 3600 WHERE id = 1"))
    assert "limit_weight" not in {c["name"] for c in sa.inspect(engine).get_columns("vcs")}
    db_migrate.upgrade(engine, "0020")
    with engine.connect() as conn:
        assert tuple(conn.execute(sa.text("SELECT name, fair_share_max_wait_s, limit_weight FROM vcs")).one()) \
            == ("vision", 3600, None)
    with engine.begin() as conn:  # a double: 0.1 comes back as 0.1, not as a single-precision 0.100000001
        conn.execute(sa.text("UPDATE vcs SET limit_weight = 0.1 WHERE id = 1"))
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT limit_weight FROM vcs")).scalar_one() == 0.1

    _downgrade(engine, "0019")
    assert "limit_weight" not in {c["name"] for c in sa.inspect(engine).get_columns("vcs")}
    with engine.connect() as conn:
        assert tuple(conn.execute(sa.text("SELECT name, fair_share_max_wait_s FROM vcs")).one()) == ("vision", 3600)
    db_migrate.upgrade(engine)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT limit_weight FROM vcs")).scalar_one() is None
