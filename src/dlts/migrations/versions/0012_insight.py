"""job_insights (the current insight findings of running jobs); vcs.idle_policy (the idle-job policy)

Revision ID: 0012
Revises: 0011
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
_TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), 'mariadb').with_variant(mysql.DATETIME(fsp=6), 'mysql')


def upgrade() -> None:
    op.create_table('job_insights',
    sa.Column('id', _ID, nullable=False),
    sa.Column('job_id', sa.BigInteger(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('code', sa.String(length=32), nullable=False),
    sa.Column('key', sa.String(length=128), nullable=False),
    sa.Column('message', sa.String(length=1024), nullable=False),
    sa.Column('since', _TS, nullable=False),
    sa.Column('raised_at', _TS, nullable=False),
    sa.Column('updated_at', _TS, nullable=False),
    sa.Column('warned_at', _TS, nullable=True),
    sa.Column('acted_at', _TS, nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_job_insights')),
    sa.UniqueConstraint('job_id', 'code', name=op.f('uq_job_insights_job_id_code')),
    )
    with op.batch_alter_table('vcs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('idle_policy', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('vcs', schema=None) as batch_op:
        batch_op.drop_column('idle_policy')
    op.drop_table('job_insights')
