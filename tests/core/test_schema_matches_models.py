"""The migrations and the models describe the same schema (no drift), on SQLite and MariaDB."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from dlts.models import Base


def test_migrated_schema_has_no_drift_from_the_models(database_url):
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": False}), Base.metadata)
    finally:
        engine.dispose()
    assert diff == [], f"models and migrations differ; write a revision: {diff}"
