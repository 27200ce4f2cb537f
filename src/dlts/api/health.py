"""Probes outside /api/v1: /healthz (the process answers), /readyz (the database answers and takes
writes: a full disk or a read-only database is not ready, with the cause)."""

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
    fault = cluster_service.write_fault(db.session())
    if fault is not None:
        return envelope(503, "database_read_only", f"The database answers reads but refuses writes: {fault.words}.",
                        {"cause": fault.kind})
    return jsonify({"status": "ready"})
