"""Probes outside /api/v1: /healthz (the process answers), /readyz (the database answers)."""

from __future__ import annotations

import sqlalchemy as sa
from flask import Blueprint, jsonify

from dlts.api.errors import envelope
from dlts.extensions import db

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz():
    try:
        db.session.execute(sa.text("SELECT 1"))
    except sa.exc.SQLAlchemyError:
        db.session.rollback()
        return envelope(503, "database_unavailable", "The database is unreachable.")
    finally:
        db.session.remove()
    return jsonify({"status": "ready"})
