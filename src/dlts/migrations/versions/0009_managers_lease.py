"""managers_lease: the lease that makes exactly one `dlts managers` process act (holder, fencing token, expiry)

Revision ID: 0009
Revises: 0008
"""
import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('managers_lease',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('holder', sa.String(length=255), nullable=False),
    sa.Column('token', sa.BigInteger(), nullable=False),
    sa.Column('expires_at', sa.Double(), nullable=False),
    sa.Column('acquired_at', sa.Double(), nullable=False),
    sa.Column('renewed_at', sa.Double(), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_managers_lease')),
    )


def downgrade() -> None:
    op.drop_table('managers_lease')
