"""job_endpoints: ssh, Jupyter, VS Code and port endpoints of jobs, exposed by the job manager

Revision ID: 0004
Revises: 0003
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
_TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), 'mariadb').with_variant(mysql.DATETIME(fsp=6), 'mysql')


def upgrade() -> None:
    op.create_table('job_endpoints',
    sa.Column('id', _ID, nullable=False),
    sa.Column('job_id', _ID, nullable=False),
    sa.Column('kind', sa.Enum('ssh', 'jupyter', 'vscode', 'port', name='endpointkind', native_enum=False, length=16), nullable=False),
    sa.Column('name', sa.String(length=32), nullable=False),
    sa.Column('port', sa.Integer(), nullable=False),
    sa.Column('status', sa.Enum('pending', 'ready', 'failed', 'closing', name='endpointstatus', native_enum=False, length=16), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=True),
    sa.Column('host', sa.String(length=255), nullable=True),
    sa.Column('host_port', sa.Integer(), nullable=True),
    sa.Column('message', sa.String(length=512), nullable=True),
    sa.Column('secret_hash', sa.String(length=64), nullable=True),
    sa.Column('created_by', sa.String(length=64), nullable=False),
    sa.Column('created_at', _TS, nullable=False),
    sa.Column('updated_at', _TS, nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_job_endpoints_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_job_endpoints')),
    sa.UniqueConstraint('job_id', 'name', name=op.f('uq_job_endpoints_job_id_name')),
    sa.UniqueConstraint('job_id', 'port', name=op.f('uq_job_endpoints_job_id_port'))
    )
    with op.batch_alter_table('job_endpoints', schema=None) as batch_op:
        batch_op.create_index('ix_job_endpoints_status', ['status'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('job_endpoints', schema=None) as batch_op:
        batch_op.drop_index('ix_job_endpoints_status')
    op.drop_table('job_endpoints')
