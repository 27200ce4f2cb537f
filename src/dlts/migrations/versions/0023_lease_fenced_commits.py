"""managers_lease.fenced_commits: every fenced commit of the holder adds one, so the fencing check
is a real write (MariaDB/MySQL count a transaction whose only UPDATE changed nothing as read-only,
and ``idle_write_transaction_timeout`` then never frees the lease row's lock of a holder frozen
between the check and its commit)

Revision ID: 0023
Revises: 0022
"""
import sqlalchemy as sa
from alembic import op

revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('managers_lease') as batch:
        batch.add_column(sa.Column('fenced_commits', sa.BigInteger(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('managers_lease') as batch:
        batch.drop_column('fenced_commits')
