"""backfill: jobs.estimated_start (the scheduler's estimate for a waiting job) and
vcs.default_runtime_estimate_s (the runtime assumed for jobs with no limit)

Revision ID: 0015
Revises: 0014
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None

_TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), 'mariadb').with_variant(mysql.DATETIME(fsp=6), 'mysql')


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('estimated_start', _TS, nullable=True))
    with op.batch_alter_table('vcs') as batch:
        batch.add_column(sa.Column('default_runtime_estimate_s', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('vcs') as batch:
        batch.drop_column('default_runtime_estimate_s')
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('estimated_start')
