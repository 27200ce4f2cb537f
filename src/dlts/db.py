"""Database plumbing outside requests: the engine for a process, sessions for background work."""

from __future__ import annotations

import sqlalchemy as sa
from flask import Flask
from sqlalchemy.orm import Session, sessionmaker

from dlts.extensions import db


def sqlite_pragmas(dbapi_connection, _record) -> None:
    # WAL lets the demo's API threads read while the job manager writes
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


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
