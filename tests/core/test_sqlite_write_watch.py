"""The demo's SQLite: WAL with synchronous=NORMAL on every connection the app opens, and a warning
naming the thread when a write transaction holds the single write lock for long (every other
writer, API requests included, waits behind it up to the busy timeout)."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import sqlalchemy as sa

from dlts.app import create_app
from dlts.config import Settings
from dlts.db import engine_of, watch_sqlite_writes


@pytest.fixture
def engine(tmp_path):
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'watch.db'}", home=tmp_path))
    eng = engine_of(app)
    with eng.begin() as conn:
        conn.execute(sa.text("CREATE TABLE probe (id INTEGER PRIMARY KEY)"))
    return eng


def test_the_app_opens_sqlite_in_wal_with_normal_sync(engine):
    with engine.connect() as conn:
        assert conn.execute(sa.text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(sa.text("PRAGMA synchronous")).scalar() == 1  # NORMAL
        assert conn.execute(sa.text("PRAGMA busy_timeout")).scalar() == 30000


def test_a_long_write_transaction_is_logged_with_its_thread(engine, caplog):
    watch_sqlite_writes(engine, warn_after_s=0.2)

    def hold(seconds: float) -> None:
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO probe (id) VALUES (NULL)"))
            time.sleep(seconds)

    with caplog.at_level(logging.WARNING, logger="dlts.db"):
        worker = threading.Thread(target=hold, args=(0.5,), name="slow-writer")
        worker.start()
        worker.join()
        hold(0.0)  # a quick one is not worth a line
        with engine.connect() as conn:  # nor is a transaction that only reads
            conn.execute(sa.text("SELECT COUNT(*) FROM probe")).scalar()
            time.sleep(0.3)
    lines = [r.getMessage() for r in caplog.records if r.name == "dlts.db"]
    assert len(lines) == 1, lines
    assert "thread slow-writer" in lines[0] and "INSERT INTO probe" in lines[0]
    held = float(lines[0].split("for ")[1].split(" s")[0])
    assert 0.5 <= held < 5


def test_a_write_left_open_and_returned_to_the_pool_is_reported_once(engine, caplog):
    watch_sqlite_writes(engine, warn_after_s=0.1)
    with caplog.at_level(logging.WARNING, logger="dlts.db"):
        raw = engine.raw_connection()
        raw.cursor().execute("INSERT INTO probe (id) VALUES (NULL)")
        # the watch sees statements through the engine only; this one went around it
        raw.close()
        with engine.connect() as conn:
            conn.execute(sa.text("INSERT INTO probe (id) VALUES (NULL)"))
            time.sleep(0.2)
        # closed without commit: rolled back, and the hold is reported
    lines = [r.getMessage() for r in caplog.records if r.name == "dlts.db"]
    assert len(lines) == 1 and "INSERT INTO probe" in lines[0], lines
