"""vc_events: the history of VC setting changes (quota, policy, limits)

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), 'mariadb').with_variant(mysql.DATETIME(fsp=6), 'mysql')


def upgrade() -> None:
    op.create_table('vc_events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('vc', sa.String(length=64), nullable=False),
    sa.Column('at', Timestamp, nullable=False),
    sa.Column('actor', sa.String(length=64), nullable=False),
    sa.Column('field', sa.String(length=64), nullable=False),
    sa.Column('old_value', sa.JSON(), nullable=True),
    sa.Column('new_value', sa.JSON(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_vc_events')),
    )
    op.create_index('ix_vc_events_vc_id', 'vc_events', ['vc', 'id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_vc_events_vc_id', table_name='vc_events')
    op.drop_table('vc_events')
