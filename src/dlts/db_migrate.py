"""Schema migrations through Alembic (``dlts db upgrade``); the only way the schema changes."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def upgrade(engine: sa.engine.Engine, revision: str = "head") -> None:
    if revision == "head" and current_revision(engine) == head_revision():
        return  # nothing to do: skip Alembic's start-up cost
    cfg = alembic_config()
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, revision)


def current_revision(engine: sa.engine.Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def revision(engine: sa.engine.Engine, message: str) -> None:
    """Autogenerate a new revision from the models (developers only)."""
    cfg = alembic_config()
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection
        command.revision(cfg, message=message, autogenerate=True)
