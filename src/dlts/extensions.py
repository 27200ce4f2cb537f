"""Flask extensions, created unbound and bound in ``create_app`` (nothing happens at import)."""

from flask_sqlalchemy import SQLAlchemy

from dlts.models.base import Base

db = SQLAlchemy(model_class=Base)
