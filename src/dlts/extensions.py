"""Flask extensions, created unbound and bound in ``create_app`` (nothing happens at import), and the
app's settings as ``create_app`` stored them (``settings_of``), for the api and portal blueprints."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from dlts.models.base import Base

if TYPE_CHECKING:
    from dlts.config import Settings

db = SQLAlchemy(model_class=Base)


def settings_of(app: Flask) -> Settings:
    return app.extensions["dlts_settings"]
