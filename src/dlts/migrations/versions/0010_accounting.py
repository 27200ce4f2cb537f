"""accounting: GPU-time rollup (usage_totals, usage_job_days), booking marks on job_attempts,
per-attempt utilisation history (utilisation_points)

Existing attempts start with accounting_open true and nothing booked: the accounting manager's first
passes book their whole history through the same code as new ones (docs/accounting.md).

Revision ID: 0010
Revises: 0009
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
_TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), 'mariadb').with_variant(mysql.DATETIME(fsp=6), 'mysql')


def _usage_columns():
    return [sa.Column('user_id', sa.BigInteger(), nullable=False),
            sa.Column('vc_id', sa.BigInteger(), nullable=False),
            sa.Column('sku', sa.String(length=64), nullable=False),
            sa.Column('preemptible', sa.Boolean(), nullable=False),
            sa.Column('gpu_ms', sa.BigInteger(), nullable=False),
            sa.Column('busy_gpu_ms', sa.BigInteger(), nullable=False),
            sa.Column('sampled_gpu_ms', sa.BigInteger(), nullable=False)]


def upgrade() -> None:
    with op.batch_alter_table('job_attempts') as batch:
        batch.add_column(sa.Column('accounting_open', sa.Boolean(), server_default=sa.true(), nullable=False))
        batch.add_column(sa.Column('booked_until', _TS, nullable=True))
        batch.add_column(sa.Column('utilisation_booked_until', _TS, nullable=True))
        batch.add_column(sa.Column('gpu_ms', sa.BigInteger(), server_default='0', nullable=False))
        batch.add_column(sa.Column('busy_gpu_ms', sa.BigInteger(), server_default='0', nullable=False))
        batch.add_column(sa.Column('sampled_gpu_ms', sa.BigInteger(), server_default='0', nullable=False))
    op.create_index('ix_job_attempts_accounting_open', 'job_attempts', ['accounting_open'], unique=False)

    op.create_table('usage_totals',
    sa.Column('id', _ID, nullable=False),
    sa.Column('period', sa.String(length=8), nullable=False),
    sa.Column('start', sa.Date(), nullable=False),
    *_usage_columns(),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_usage_totals')),
    sa.UniqueConstraint('period', 'start', 'user_id', 'vc_id', 'sku', 'preemptible',
                        name=op.f('uq_usage_totals_period_start_user_id_vc_id_sku_preemptible')),
    )
    op.create_index('ix_usage_totals_period_start_vc_id', 'usage_totals', ['period', 'start', 'vc_id'], unique=False)
    op.create_index('ix_usage_totals_period_user_id_start', 'usage_totals', ['period', 'user_id', 'start'], unique=False)

    op.create_table('usage_job_days',
    sa.Column('id', _ID, nullable=False),
    sa.Column('job_id', sa.BigInteger(), nullable=False),
    sa.Column('day', sa.Date(), nullable=False),
    *_usage_columns(),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_usage_job_days')),
    sa.UniqueConstraint('job_id', 'day', name=op.f('uq_usage_job_days_job_id_day')),
    )
    op.create_index('ix_usage_job_days_day_job_id', 'usage_job_days', ['day', 'job_id'], unique=False)
    op.create_index('ix_usage_job_days_user_id_job_id_day', 'usage_job_days', ['user_id', 'job_id', 'day'], unique=False)
    op.create_index('ix_usage_job_days_vc_id_job_id_day', 'usage_job_days', ['vc_id', 'job_id', 'day'], unique=False)

    op.create_table('utilisation_points',
    sa.Column('id', _ID, nullable=False),
    sa.Column('attempt_id', sa.BigInteger(), nullable=False),
    sa.Column('node', sa.String(length=253), nullable=False),
    sa.Column('minute', _TS, nullable=False),
    sa.Column('samples', sa.Integer(), nullable=False),
    sa.Column('gpus', sa.JSON(), nullable=False),
    sa.Column('cpu_samples', sa.Integer(), nullable=False),
    sa.Column('cpu_cores', sa.Float(), nullable=True),
    sa.Column('memory_bytes', sa.BigInteger(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_utilisation_points')),
    sa.UniqueConstraint('attempt_id', 'node', 'minute', name=op.f('uq_utilisation_points_attempt_id_node_minute')),
    )
    op.create_index('ix_utilisation_points_minute', 'utilisation_points', ['minute'], unique=False)


def downgrade() -> None:
    op.drop_table('utilisation_points')
    op.drop_table('usage_job_days')
    op.drop_table('usage_totals')
    op.drop_index('ix_job_attempts_accounting_open', table_name='job_attempts')
    with op.batch_alter_table('job_attempts') as batch:
        for name in ('sampled_gpu_ms', 'busy_gpu_ms', 'gpu_ms', 'utilisation_booked_until', 'booked_until',
                     'accounting_open'):
            batch.drop_column(name)
