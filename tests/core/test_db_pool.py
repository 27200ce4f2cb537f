"""MariaDB sessions: READ COMMITTED whatever the server default, and the pool's return path
(dlts.db.rollback_unless_reset): a connection that comes back
with an open transaction is rolled back; one whose transaction already ended costs no ROLLBACK."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from dlts.db import engine_of


def _status(cursor, name: str) -> int:
    cursor.execute("SHOW SESSION STATUS LIKE %s", (name,))
    return int(cursor.fetchone()[1])


@pytest.fixture
def engine(app, settings):
    if not settings.effective_database_url.startswith(("mysql", "mariadb")):
        pytest.skip("the pool listener is MariaDB's (SQLite has no pooled server sessions)")
    eng = engine_of(app)
    eng.dispose()
    return eng


def test_a_connection_returned_mid_transaction_is_rolled_back(engine):
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE IF NOT EXISTS pool_probe (id INT PRIMARY KEY) ENGINE=InnoDB"))
        conn.execute(sa.text("DELETE FROM pool_probe"))
    try:
        raw = engine.raw_connection()
        thread_id = raw.dbapi_connection.thread_id()
        cur = raw.cursor()
        cur.execute("INSERT INTO pool_probe (id) VALUES (1)")
        assert raw.dbapi_connection.server_status & 1  # in a transaction, never committed
        raw.close()  # back to the pool mid-transaction (what an error path does)

        again = engine.raw_connection()
        assert again.dbapi_connection.thread_id() == thread_id  # the same server session, reused
        assert not again.dbapi_connection.server_status & 1
        cur = again.cursor()
        cur.execute("SELECT COUNT(*) FROM pool_probe")
        assert cur.fetchone()[0] == 0
        again.close()
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE IF EXISTS pool_probe"))


def test_a_committed_connection_goes_back_without_a_rollback(engine):
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))
        conn.commit()
        raw = conn.connection.dbapi_connection
    cur = raw.cursor()
    before = _status(cur, "Com_rollback")
    with engine.connect() as conn:  # the same pooled session: check out, commit, check in
        assert conn.connection.dbapi_connection is raw
        conn.execute(sa.text("SELECT 1"))
        conn.commit()
    assert _status(cur, "Com_rollback") == before


def test_sessions_run_read_committed_whatever_the_server_default(engine):
    """Status changes are compare-and-set UPDATEs; REPEATABLE READ's gap locks let two racing
    writers deadlock, so the engine asks for READ COMMITTED itself (CI's server defaults to RR)."""
    with engine.connect() as conn:
        assert conn.scalar(sa.text("SELECT @@SESSION.tx_isolation")) == "READ-COMMITTED"



def test_a_connection_that_dies_after_the_requests_work_does_not_turn_its_answer_into_a_500(app, engine, client,
                                                                                           world):
    """The database goes away (a restart, a failover, KILL) after a request's last statement but
    before its session ends: the work is done and its answer stands. Flask-SQLAlchemy's teardown
    rolls the session back on the dead connection, which raises; that must not replace the answer
    with a bare 500 (the chaos test saw one for a stored job), and the next request gets a fresh
    connection."""
    from flask import Blueprint

    from dlts.extensions import db

    probe = Blueprint("dead_connection_probe", __name__)

    @probe.route("/_probe/dies-after-the-work")
    def dies_after_the_work():
        thread_id = db.session.execute(sa.text("SELECT CONNECTION_ID()")).scalar_one()  # a transaction is open
        with engine.connect() as other:
            other.execute(sa.text(f"KILL {int(thread_id)}"))
        return {"done": True}

    @probe.route("/_probe/dies-during-the-work")
    def dies_during_the_work():
        thread_id = db.session.execute(sa.text("SELECT CONNECTION_ID()")).scalar_one()
        with engine.connect() as other:
            other.execute(sa.text(f"KILL {int(thread_id)}"))
        db.session.execute(sa.text("SELECT 1"))  # the lost connection: the 503 handler answers
        return {"done": True}

    app.register_blueprint(probe)
    after = client.get("/_probe/dies-after-the-work")
    assert after.status_code == 200 and after.get_json() == {"done": True}, after.data
    during = client.get("/_probe/dies-during-the-work")
    assert during.status_code == 503 and during.get_json()["error"]["code"] == "database_unavailable", during.data
    again = client.get("/api/v1/me", headers=world.auth("alice"))
    assert again.status_code == 200, again.get_json()
