"""vcs.fair_share_max_wait_s: the per-VC bound on how long fair share holds a job back, which a VC admin
changes at runtime like the other scheduling settings of revision 0017; NULL: not set on the VC

Revision ID: 0018
Revises: 0017
"""
import sqlalchemy as sa
from alembic import op

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('vcs') as batch:
        batch.add_column(sa.Column('fair_share_max_wait_s', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('vcs') as batch:
        batch.drop_column('fair_share_max_wait_s')
