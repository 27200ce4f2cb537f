"""The Flask application factory: ``create_app(settings)`` for the API, the portal and tests.

Nothing connects at import time. ``gunicorn 'dlts.app:create_app()'`` serves production (settings
from ``/etc/dlts/dlts.yaml`` and ``DLTS_*``); the demo and the tests pass their own settings.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from flask import Flask
from werkzeug.routing import IntegerConverter

from dlts.config import Settings, load_settings
from dlts.extensions import db

log = logging.getLogger(__name__)


class AsciiIntegerConverter(IntegerConverter):
    """``<int:...>`` in routes, ASCII digits only: werkzeug's ``\\d+`` also matches ``١`` and ``１``,
    which ``int()`` reads as 1, so ``/jobs/١`` was job 1. Now such a path matches no route (404)."""

    regex = r"[0-9]+"


def create_app(settings: Settings | None = None) -> Flask:
    settings = settings or load_settings()
    app = Flask(__name__)
    app.url_map.converters["int"] = AsciiIntegerConverter  # before any route: ids are ASCII digits
    app.config.update(
        SQLALCHEMY_DATABASE_URI=settings.effective_database_url,
        SQLALCHEMY_ENGINE_OPTIONS=engine_options(settings.effective_database_url),
        SECRET_KEY=settings.secret_key or None,
        MAX_CONTENT_LENGTH=settings.max_body_bytes,
        JSON_SORT_KEYS=False,
    )
    app.extensions["dlts_settings"] = settings
    if settings.trusted_proxies:
        from werkzeug.middleware.proxy_fix import ProxyFix

        hops = settings.trusted_proxies
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=hops, x_proto=hops, x_host=hops)  # type: ignore[method-assign]
    db.init_app(app)
    app.teardown_appcontext(_end_session)  # runs before Flask-SQLAlchemy's own (teardowns run last-first)
    from sqlalchemy import event

    from dlts.db import engine_of, rollback_unless_reset, sqlite_pragmas, watch_sqlite_writes

    if settings.effective_database_url.startswith("sqlite"):
        event.listen(engine_of(app), "connect", sqlite_pragmas)
        watch_sqlite_writes(engine_of(app))
    else:
        event.listen(engine_of(app), "reset", rollback_unless_reset)
    from dlts import metrics

    metrics.instrument_engine(engine_of(app))
    metrics.init_app(app)

    from dlts.api import init_api

    init_api(app)
    from dlts.portal import init_portal

    init_portal(app)
    from dlts.api import metrics as metrics_view

    metrics_view.init_app(app)
    from dlts.unread_body import UnreadBodyGuard

    # outermost: an answer given before the request's body was read never leaves that body on a
    # kept-alive connection (drained when small, the connection closed otherwise)
    app.wsgi_app = UnreadBodyGuard(app.wsgi_app)  # type: ignore[method-assign]
    return app


def _end_session(_exc: BaseException | None) -> None:
    """End the request's session. When the database went away after the request's last statement
    (a restart, a failover), the rollback of its still-open transaction fails on the dead
    connection; the request's answer is already made and must stand (a bare 500 would tell a user
    whose job was stored that it failed), so the session is dropped and the pool, which has
    invalidated the connection, opens a new one for the next request."""
    try:
        db.session.remove()
    except sa.exc.DBAPIError as error:
        log.warning("database connection lost at the end of a request (%s); dropped",
                                            error.__class__.__name__)
        db.session.registry.clear()


def engine_options(url: str) -> dict:
    from dlts.strict import dumps_for_db

    # JSON columns: NaN and infinities raise instead of being stored (MariaDB's json_valid CHECK
    # refuses them; SQLite would keep them and answer invalid JSON on every later read)
    if url.startswith("sqlite"):
        # the demo's API threads and job manager thread share one file; wait for locks, don't fail
        return {"connect_args": {"timeout": 30, "check_same_thread": False}, "json_serializer": dumps_for_db}
    # MariaDB: recover by itself after the server restarts; keep idle connections fresh
    # (pool_reset_on_return=None: dlts.db.rollback_unless_reset skips the redundant ROLLBACK)
    # READ COMMITTED whatever the server's default: status changes are compare-and-set UPDATEs, and
    # REPEATABLE READ's gap locks on the status indexes let two racing CAS writers deadlock.
    return {"pool_pre_ping": True, "pool_recycle": 3600, "pool_size": 10, "max_overflow": 20, "pool_reset_on_return": None,
            "isolation_level": "READ COMMITTED", "json_serializer": dumps_for_db,
            "connect_args": {"connect_timeout": 5, "read_timeout": 30, "write_timeout": 30}}


