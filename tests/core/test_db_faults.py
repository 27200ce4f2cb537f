"""A database that refuses writes but answers reads (a full disk, read-only): which errors are such
faults, reads that still answer, writes refused with the cause, /readyz not ready until a write goes
through again, and loops that say so once instead of a traceback a pass.

The read-only database here is every new connection made read-only: SQLite's ``PRAGMA query_only``
(what a read-only file answers, ``SQLITE_READONLY``), MariaDB's ``SET SESSION TRANSACTION READ ONLY``
(error 1792, as a read-only transaction; a server in ``--read-only`` answers 1290, which is told
apart the same way but not set here: it is the whole server's); the full disk for real is
tests/core/test_disk_full.py."""

from __future__ import annotations

import logging
import sqlite3

import pymysql
import pytest
import sqlalchemy as sa
from live_helpers import get, submit

from dlts import db_faults
from dlts.db import engine_of
from dlts.jobmanager import JobManager
from tests.conftest import IS_MYSQL

READ_ONLY_WORDS = "it is read-only (" + ("Cannot execute statement in a READ ONLY transaction" if IS_MYSQL else
                                        "attempt to write a readonly database")


def _sqlite_error(sql: str, setup: str = "") -> sa.exc.OperationalError:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (x)")
    if setup:
        conn.execute(setup)
    try:
        conn.execute(sql)
    except sqlite3.OperationalError as exc:
        return sa.exc.OperationalError(sql, {}, exc)
    raise AssertionError("no error")


def _mysql(code: int, message: str) -> sa.exc.OperationalError:
    return sa.exc.OperationalError("UPDATE x", {}, pymysql.err.OperationalError(code, message))


@pytest.mark.parametrize(("error", "kind"), [
    pytest.param(_sqlite_error("INSERT INTO t VALUES (1)", "PRAGMA query_only=1"), "read_only", id="sqlite read-only"),
    pytest.param(_mysql(1290, "The MariaDB server is running with the --read-only option"), "read_only",
                 id="mariadb --read-only"),
    pytest.param(_mysql(1792, "Cannot execute statement in a READ ONLY transaction"), "read_only",
                 id="mariadb read-only transaction"),
    pytest.param(_mysql(1021, "Disk full (/var/tmp/#sql_1.MAI); waiting for someone to free some space..."),
                 "disk_full", id="mariadb disk full"),
    pytest.param(_mysql(1114, "The table 'jobs' is full"), "disk_full", id="mariadb table full"),
    pytest.param(_mysql(3, "Error writing file './dlts/x' (Errcode: 28 \"No space left on device\")"), "disk_full",
                 id="mariadb write error 28"),
    pytest.param(_mysql(3, "Error writing file './dlts/x' (Errcode: 13 \"Permission denied\")"), None,
                 id="mariadb other write error"),
    pytest.param(_mysql(2013, "Lost connection to server during query"), None, id="a lost connection"),
    pytest.param(_sqlite_error("SELECT * FROM missing"), None, id="a bad statement"),
])
def test_write_faults_are_told_from_other_database_errors(error, kind):
    fault = db_faults.write_fault(error)
    assert (fault.kind if fault else None) == kind


def _read_only(app) -> None:
    engine = engine_of(app)
    sa.event.listen(engine, "connect", _query_only)
    engine.dispose()  # every connection from now on is read-only


def _writable(app) -> None:
    engine = engine_of(app)
    sa.event.remove(engine, "connect", _query_only)
    engine.dispose()


def _query_only(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("SET SESSION TRANSACTION READ ONLY" if IS_MYSQL else "PRAGMA query_only=1")
    cursor.close()


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_read_only_database_answers_reads_refuses_writes_with_the_cause_and_readyz_follows_it(app, client, world):
    health = db_faults.health_of(engine_of(app))
    health.monotonic = clock = Clock()
    _read_only(app)
    for url, user in (("/api/v1/me", "admin"), ("/api/v1/jobs", "alice"), ("/api/v1/vcs", "bob")):
        # their tokens were never used: each read tries its last-use stamp, which is refused
        assert client.get(url, headers=world.auth(user)).status_code == 200, url
    refused = client.post("/api/v1/jobs", headers=world.auth("alice"),
                          json={"vc": "vision", "image": "debian:12", "command": "true"})
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "30"
    assert refused.json["error"]["code"] == "database_read_only"
    assert refused.json["error"]["details"] == {"cause": "read_only"}
    assert "it is read-only" in refused.json["error"]["message"]
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.json["error"]["code"] == "database_read_only"
    assert ready.json["error"]["details"] == {"cause": "read_only"}

    _writable(app)
    assert client.get("/readyz").status_code == 503  # no write went through yet, and the next try is not due
    clock.now += db_faults.WriteHealth.PROBE_EVERY_S
    assert client.get("/readyz").status_code == 200  # its own try went through
    assert client.post("/api/v1/jobs", headers=world.auth("alice"),
                       json={"vc": "vision", "image": "debian:12", "command": "true"}).status_code == 201


def test_the_job_manager_backs_off_while_writes_are_refused_and_says_so_once_each_way(live, world, sessions, settings,
                                                                                       app, caplog):
    from prometheus_client import REGISTRY

    clock = Clock(live.manager.clock())
    manager = JobManager(sessions, live.backend, settings, clock=clock)
    job = submit(live, world, gpus=1, command="echo late")
    refused = {"error": "database_refuses_writes"}
    before = REGISTRY.get_sample_value("dlts_jobmanager_tick_errors_total", refused) or 0.0
    _read_only(app)
    with caplog.at_level(logging.INFO, logger="dlts.jobmanager.manager"):
        tried = 0
        for _ in range(40):  # 8 s of ticks by the manager's clock: the backoff doubles up to its cap
            ticks = REGISTRY.get_sample_value("dlts_jobmanager_ticks_total") or 0.0
            manager.tick()
            tried += (REGISTRY.get_sample_value("dlts_jobmanager_ticks_total") or 0.0) > ticks
            clock.now += settings.tick_s
        errors = (REGISTRY.get_sample_value("dlts_jobmanager_tick_errors_total", refused) or 0.0) - before
        assert errors == tried and 3 <= tried <= 6  # 0, 0.2, 0.6, 1.4, 3.0, 6.2 s: backed off, not every tick
        assert get(live, world, job["id"])["status"] == "queued"
        _writable(app)
        clock.now += 10
        for _ in range(50):
            manager.tick()
            clock.now += settings.tick_s
            if get(live, world, job["id"])["status"] == "finished":
                break
    assert get(live, world, job["id"])["status"] == "finished"
    said = [r.getMessage() for r in caplog.records if r.name == "dlts.jobmanager.manager"]
    refused, accepted = [m for m in said if "database" in m]
    assert refused.startswith(f"job manager: the database refuses writes, {READ_ONLY_WORDS}")
    assert refused.endswith("; retrying quietly until it accepts them")
    assert accepted.startswith("job manager: the database accepts writes again")
    assert not [r for r in caplog.records if r.exc_info]


def test_a_managers_pass_refused_by_the_database_is_one_line_not_a_traceback_a_pass(caplog):
    from dlts.managers import Periodic, _guarded
    from dlts.managers.lease import Watch

    error = _sqlite_error("INSERT INTO t VALUES (1)", "PRAGMA query_only=1")
    fail = {"now": True}

    def run():
        if fail["now"]:
            raise error

    guarded = _guarded(Periodic("janitor.purge", 1.0, run), None, Watch())
    with caplog.at_level(logging.INFO, logger="dlts.managers"):
        for _ in range(5):
            guarded()
    assert [r.getMessage() for r in caplog.records] == [
        "manager janitor.purge: the database refuses writes, it is read-only (attempt to write a readonly database); "
        "retrying quietly until it accepts them"]
    assert not [r for r in caplog.records if r.exc_info]
