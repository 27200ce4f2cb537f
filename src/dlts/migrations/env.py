"""Alembic environment: runs revisions on the connection ``dlts.db_migrate`` hands in."""

from alembic import context

from dlts.models import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:  # pragma: no cover - only `alembic` CLI use without dlts
    raise RuntimeError("run migrations through `dlts db upgrade`")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=True,  # SQLite needs table rebuilds for ALTER
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
