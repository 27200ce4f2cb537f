"""jobs.estimate_note: why a waiting job's estimated start last moved later (the message of its last
estimate_moved event: the jobs that came ahead of it and why; scheduler/explain.py), shown with the
estimate by the API, the CLI and the portal; NULL when it has not moved, or the job holds no
reservation any more or no longer waits

Revision ID: 0021
Revises: 0020
"""
import sqlalchemy as sa
from alembic import op

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('estimate_note', sa.String(length=1024), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('estimate_note')
