"""identity, storage and registry credentials: users.uid/gid, vcs.gid/ephemeral_storage_bytes, registry_credentials

Revision ID: 0005
Revises: 0004
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
_TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), 'mariadb').with_variant(mysql.DATETIME(fsp=6), 'mysql')


def upgrade() -> None:
    with op.batch_alter_table('users', schema=None) as batch_op:
        batch_op.add_column(sa.Column('uid', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('gid', sa.Integer(), nullable=True))
        batch_op.create_unique_constraint(batch_op.f('uq_users_uid'), ['uid'])
    with op.batch_alter_table('vcs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('gid', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('ephemeral_storage_bytes', sa.BigInteger(), nullable=True))
    op.create_table('registry_credentials',
    sa.Column('id', _ID, nullable=False),
    sa.Column('scope', sa.String(length=8), nullable=False),
    sa.Column('user_id', _ID, nullable=True),
    sa.Column('vc_id', _ID, nullable=True),
    sa.Column('server', sa.String(length=255), nullable=False),
    sa.Column('username', sa.String(length=255), nullable=False),
    sa.Column('password_encrypted', sa.Text(), nullable=False),
    sa.Column('created_by', sa.String(length=64), nullable=False),
    sa.Column('created_at', _TS, nullable=False),
    sa.CheckConstraint("(scope = 'user' AND user_id IS NOT NULL AND vc_id IS NULL) OR "
                       "(scope = 'vc' AND vc_id IS NOT NULL AND user_id IS NULL)",
                       name=op.f('ck_registry_credentials_one_owner')),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_registry_credentials_user_id_users'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['vc_id'], ['vcs.id'], name=op.f('fk_registry_credentials_vc_id_vcs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_registry_credentials'))
    )
    with op.batch_alter_table('registry_credentials', schema=None) as batch_op:
        batch_op.create_index('ix_registry_credentials_user_id', ['user_id'], unique=False)
        batch_op.create_index('ix_registry_credentials_vc_id', ['vc_id'], unique=False)


def downgrade() -> None:
    # its indexes go with it (MariaDB refuses to drop an index a foreign key needs)
    op.drop_table('registry_credentials')
    with op.batch_alter_table('vcs', schema=None) as batch_op:
        batch_op.drop_column('ephemeral_storage_bytes')
        batch_op.drop_column('gid')
    with op.batch_alter_table('users', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('uq_users_uid'), type_='unique')
        batch_op.drop_column('gid')
        batch_op.drop_column('uid')
