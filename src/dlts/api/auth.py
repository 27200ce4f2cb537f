"""Bearer authentication for every /api/v1 route except the OpenAPI document."""

from __future__ import annotations

from flask import Flask, current_app, g, request

from dlts.extensions import db, settings_of
from dlts.services.auth import Principal, PrincipalCache, authenticate_bearer


def principal_cache(app: Flask) -> PrincipalCache:
    cache = app.extensions.get("dlts_principal_cache")
    if cache is None:
        cache = app.extensions["dlts_principal_cache"] = PrincipalCache(settings_of(app).auth_cache_s)
    return cache


def authenticate() -> None:
    """``before_request`` of each API blueprint: sets ``g.principal`` or raises Unauthenticated."""
    g.principal = authenticate_bearer(db.session(), request.headers.get("Authorization"), principal_cache(current_app))


def principal() -> Principal:
    return g.principal
