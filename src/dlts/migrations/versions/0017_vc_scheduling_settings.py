"""vcs.fair_share, min_runtime_s, max_reclaim_delay_s, max_preemptions: the per-VC scheduling settings
a VC admin changes at runtime (they were dlts.yaml's vc_scheduling only); NULL: not set on the VC

Revision ID: 0017
Revises: 0016
"""
import sqlalchemy as sa
from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('vcs') as batch:
        batch.add_column(sa.Column('fair_share', sa.Boolean(), nullable=True))
        batch.add_column(sa.Column('min_runtime_s', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('max_reclaim_delay_s', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('max_preemptions', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('vcs') as batch:
        batch.drop_column('max_preemptions')
        batch.drop_column('max_reclaim_delay_s')
        batch.drop_column('min_runtime_s')
        batch.drop_column('fair_share')
