"""notify_outbox: the notifier's persistent outbox (queued, sent, failed and duplicate notices)

Revision ID: 0007
Revises: 0006
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
_TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), 'mariadb').with_variant(mysql.DATETIME(fsp=6), 'mysql')


def upgrade() -> None:
    op.create_table('notify_outbox',
    sa.Column('id', _ID, nullable=False),
    sa.Column('template', sa.String(length=64), nullable=False),
    sa.Column('recipients', sa.JSON(), nullable=False),
    sa.Column('context', sa.JSON(), nullable=False),
    sa.Column('dedup_key', sa.String(length=255), nullable=True),
    sa.Column('status', sa.Enum('queued', 'sent', 'failed', 'duplicate', name='outboxstatus', native_enum=False, length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('next_attempt_at', _TS, nullable=False),
    sa.Column('last_error', sa.String(length=512), nullable=True),
    sa.Column('created_at', _TS, nullable=False),
    sa.Column('sent_at', _TS, nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_notify_outbox')),
    )
    op.create_index('ix_notify_outbox_dedup_key', 'notify_outbox', ['dedup_key'], unique=False)
    op.create_index('ix_notify_outbox_status_next_attempt_at', 'notify_outbox', ['status', 'next_attempt_at'], unique=False)
    op.create_index('ix_notify_outbox_status_sent_at', 'notify_outbox', ['status', 'sent_at'], unique=False)
    op.create_index('ix_notify_outbox_created_at', 'notify_outbox', ['created_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_notify_outbox_created_at', table_name='notify_outbox')
    op.drop_index('ix_notify_outbox_status_sent_at', table_name='notify_outbox')
    op.drop_index('ix_notify_outbox_status_next_attempt_at', table_name='notify_outbox')
    op.drop_index('ix_notify_outbox_dedup_key', table_name='notify_outbox')
    op.drop_table('notify_outbox')
