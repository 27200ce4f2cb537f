"""Probes outside /api/v1: /healthz (the process answers), /readyz (the database answers)."""

from __future__ import annotations

from flask import Blueprint, jsonify

from dlts.api.errors import envelope
from dlts.extensions import db
from dlts.services import cluster as cluster_service

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz():
    if not cluster_service.database_answers(db.session()):
        return envelope(503, "database_unavailable", "The database is unreachable.")
    return jsonify({"status": "ready"})
