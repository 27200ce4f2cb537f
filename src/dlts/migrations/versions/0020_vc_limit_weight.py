"""vcs.limit_weight: shorter limits first in the VC's order (each job ranks as if queued this many
times its limit later; scheduler/plugins/fairshare.py), which a VC admin changes at runtime like the
other scheduling settings of revision 0017; NULL: not set on the VC

Revision ID: 0020
Revises: 0019
"""
import sqlalchemy as sa
from alembic import op

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('vcs') as batch:
        batch.add_column(sa.Column('limit_weight', sa.Float(precision=53), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('vcs') as batch:
        batch.drop_column('limit_weight')
