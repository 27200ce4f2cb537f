"""Database plumbing outside requests: the engine for a process, sessions for background work."""

from __future__ import annotations

import logging
import threading
import time
import weakref

import sqlalchemy as sa
from flask import Flask
from sqlalchemy.orm import Session, sessionmaker

from dlts.extensions import db

log = logging.getLogger(__name__)


def sqlite_pragmas(dbapi_connection, _record) -> None:
    # WAL lets the demo's API threads read while the job manager writes
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    # in WAL mode NORMAL syncs at checkpoints, not at every commit: no corruption, and a commit no
    # longer waits for the disk while other writers queue behind it (durability of the last
    # transactions on a power cut is what it gives up; MariaDB serves production)
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


_WRITES = ("insert", "update", "delete", "replace")
_WATCHED: weakref.WeakKeyDictionary[sa.engine.Engine, float] = weakref.WeakKeyDictionary()


def watch_sqlite_writes(engine: sa.engine.Engine, warn_after_s: float = 5.0) -> None:
    """Log write transactions that hold SQLite's single write lock longer than ``warn_after_s``.

    Every other writer (an API request included) waits behind such a transaction, up to the busy
    timeout; the warning names the thread that held the lock and the statement that took it.
    Watching an engine again only changes its threshold."""
    from sqlalchemy import event

    watched = engine in _WATCHED
    _WATCHED[engine] = warn_after_s
    if watched:
        return

    @event.listens_for(engine, "before_cursor_execute")
    def _first_write(conn, _cursor, statement, _params, _context, _many) -> None:
        if "dlts_write_since" not in conn.info and statement.lstrip()[:7].lower().startswith(_WRITES):
            conn.info["dlts_write_since"] = (time.monotonic(), threading.current_thread().name, statement.strip()[:120])

    def _ended(conn) -> None:
        _report(conn.info)

    def _report(info: dict) -> None:
        since = info.pop("dlts_write_since", None)
        if since is not None and (held := time.monotonic() - since[0]) > _WATCHED.get(engine, warn_after_s):
            log.warning("a write transaction held the database for %.1f s (thread %s, first write: %s)",
                        held, since[1], since[2])

    event.listen(engine, "commit", _ended)
    event.listen(engine, "rollback", _ended)
    # a connection returned to the pool mid-transaction is rolled back by the pool's reset
    @event.listens_for(engine.pool, "checkin")
    def _returned(_dbapi, record) -> None:
        if record is not None:
            _report(record.info)


SERVER_STATUS_IN_TRANS = 0x0001  # MySQL/MariaDB protocol: the session has an open transaction


def rollback_unless_reset(dbapi_connection, _record, _reset_state) -> None:
    """A pooled connection comes back: roll back only if a transaction is still open.

    The pool's own reset (a ROLLBACK on every return) costs a round trip per request even after the
    session committed or rolled back. PyMySQL keeps the server's status flags from every reply, so
    with ``pool_reset_on_return=None`` this listener rolls back exactly the connections returned
    mid-transaction (an error path); a driver without the flags always gets the rollback.
    """
    status = getattr(dbapi_connection, "server_status", None)
    if status is None or status & SERVER_STATUS_IN_TRANS:
        dbapi_connection.rollback()


def engine_of(app: Flask) -> sa.engine.Engine:
    with app.app_context():
        return db.engine


def session_factory(app: Flask) -> sessionmaker[Session]:
    """Plain SQLAlchemy sessions on the app's engine, for threads outside a request.

    ``session.info["dlts_settings"]`` is the app's settings (services.notify reads its window there)."""
    return sessionmaker(bind=engine_of(app), expire_on_commit=False,
                        info={"dlts_settings": app.extensions.get("dlts_settings")})
