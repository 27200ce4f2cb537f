"""storage_snapshots, storage_expiry_log; storage_usage rows belong to a snapshot and may be a top-level directory's

Revision ID: 0011
Revises: 0010
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
_TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), 'mariadb').with_variant(mysql.DATETIME(fsp=6), 'mysql')


def upgrade() -> None:
    op.create_table('storage_snapshots',
    sa.Column('id', _ID, nullable=False),
    sa.Column('root', sa.String(length=255), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('started_at', _TS, nullable=False),
    sa.Column('scanned_at', _TS, nullable=False),
    sa.Column('duration_s', sa.Float(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('message', sa.String(length=1024), nullable=True),
    sa.Column('errors', sa.Integer(), nullable=False),
    sa.Column('other_filesystems', sa.Integer(), nullable=False),
    sa.Column('dirs', sa.BigInteger(), nullable=False),
    sa.Column('files', sa.BigInteger(), nullable=False),
    sa.Column('allocated_bytes', sa.BigInteger(), nullable=False),
    sa.Column('apparent_bytes', sa.BigInteger(), nullable=False),
    sa.Column('fs_total_bytes', sa.BigInteger(), nullable=True),
    sa.Column('fs_used_bytes', sa.BigInteger(), nullable=True),
    sa.Column('over_alert', sa.Boolean(), nullable=False),
    sa.Column('detail', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_storage_snapshots')),
    )
    op.create_index('ix_storage_snapshots_root_scanned_at', 'storage_snapshots', ['root', 'scanned_at'], unique=False)
    op.create_table('storage_expiry_log',
    sa.Column('id', _ID, nullable=False),
    sa.Column('root', sa.String(length=255), nullable=False),
    sa.Column('owner', sa.String(length=64), nullable=False),
    sa.Column('action', sa.String(length=16), nullable=False),
    sa.Column('at', _TS, nullable=False),
    sa.Column('files', sa.BigInteger(), nullable=False),
    sa.Column('dirs', sa.BigInteger(), nullable=False),
    sa.Column('bytes', sa.BigInteger(), nullable=False),
    sa.Column('paths', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_storage_expiry_log')),
    )
    op.create_index('ix_storage_expiry_log_root_owner_action', 'storage_expiry_log', ['root', 'owner', 'action', 'at'],
                    unique=False)
    with op.batch_alter_table('storage_usage', schema=None) as batch_op:
        batch_op.add_column(sa.Column('snapshot_id', _ID, nullable=True))
        batch_op.add_column(sa.Column('directory', sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column('apparent_bytes', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('oldest_at', _TS, nullable=True))
        batch_op.create_foreign_key(batch_op.f('fk_storage_usage_snapshot_id_storage_snapshots'), 'storage_snapshots',
                                    ['snapshot_id'], ['id'], ondelete='CASCADE')
        batch_op.create_index('ix_storage_usage_snapshot_id', ['snapshot_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('storage_usage', schema=None) as batch_op:
        # the foreign key first: MariaDB will not drop the index a foreign key uses
        batch_op.drop_constraint(batch_op.f('fk_storage_usage_snapshot_id_storage_snapshots'), type_='foreignkey')
        batch_op.drop_index('ix_storage_usage_snapshot_id')
        batch_op.drop_column('oldest_at')
        batch_op.drop_column('apparent_bytes')
        batch_op.drop_column('directory')
        batch_op.drop_column('snapshot_id')
    op.drop_index('ix_storage_expiry_log_root_owner_action', table_name='storage_expiry_log')
    op.drop_table('storage_expiry_log')
    op.drop_index('ix_storage_snapshots_root_scanned_at', table_name='storage_snapshots')
    op.drop_table('storage_snapshots')
