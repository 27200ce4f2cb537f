"""portal_sessions (server-side portal sessions), rate_counters (login and submission limits shared by
every API worker), vcs.max_queued_jobs_per_user and vcs.max_submissions_per_minute

Revision ID: 0008
Revises: 0007
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
_TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), 'mariadb').with_variant(mysql.DATETIME(fsp=6), 'mysql')


def upgrade() -> None:
    op.create_table('portal_sessions',
    sa.Column('id', _ID, nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('user_id', _ID, nullable=False),
    sa.Column('created_at', _TS, nullable=False),
    sa.Column('expires_at', _TS, nullable=False),
    sa.Column('last_seen_at', _TS, nullable=False),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_portal_sessions_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_portal_sessions')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_portal_sessions_token_hash')),
    )
    op.create_index(op.f('ix_portal_sessions_user_id'), 'portal_sessions', ['user_id'], unique=False)
    op.create_table('rate_counters',
    sa.Column('key', sa.String(length=191), nullable=False),
    sa.Column('window_start', _TS, nullable=False),
    sa.Column('n', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('key', name=op.f('pk_rate_counters')),
    )
    op.create_index(op.f('ix_rate_counters_window_start'), 'rate_counters', ['window_start'], unique=False)
    with op.batch_alter_table('vcs') as batch:
        batch.add_column(sa.Column('max_queued_jobs_per_user', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('max_submissions_per_minute', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('vcs') as batch:
        batch.drop_column('max_submissions_per_minute')
        batch.drop_column('max_queued_jobs_per_user')
    op.drop_index(op.f('ix_rate_counters_window_start'), table_name='rate_counters')
    op.drop_table('rate_counters')
    op.drop_index(op.f('ix_portal_sessions_user_id'), table_name='portal_sessions')
    op.drop_table('portal_sessions')
