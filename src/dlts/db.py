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


def engine_of(app: Flask) -> sa.engine.Engine:
    with app.app_context():
        return db.engine


def session_factory(app: Flask) -> sessionmaker[Session]:
    """Plain SQLAlchemy sessions on the app's engine, for threads outside a request."""
    return sessionmaker(bind=engine_of(app), expire_on_commit=False)
