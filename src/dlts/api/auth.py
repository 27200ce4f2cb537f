"""Bearer authentication for every /api/v1 route except the OpenAPI document."""

from __future__ import annotations

from flask import g, request

from dlts.extensions import db
from dlts.services.auth import Principal, authenticate_bearer


def authenticate() -> None:
    """``before_request`` of each API blueprint: sets ``g.principal`` or raises Unauthenticated."""
    g.principal = authenticate_bearer(db.session, request.headers.get("Authorization"))


def principal() -> Principal:
    return g.principal
