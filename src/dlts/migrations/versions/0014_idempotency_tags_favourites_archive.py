"""idempotency_keys (POST /jobs with an Idempotency-Key), job_tags, job_favourites, jobs.archived_at, an index on portal_sessions.expires_at (the janitor purges expired sessions)

Revision ID: 0014
Revises: 0013
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
_TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), 'mariadb').with_variant(mysql.DATETIME(fsp=6), 'mysql')


def upgrade() -> None:
    op.create_table('idempotency_keys',
    sa.Column('id', _ID, nullable=False),
    sa.Column('user_id', _ID, nullable=False),
    sa.Column('key', sa.String(length=128), nullable=False),
    sa.Column('body_hash', sa.String(length=64), nullable=False),
    sa.Column('job_id', _ID, nullable=False),
    sa.Column('created_at', _TS, nullable=False),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_idempotency_keys_user_id_users'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_idempotency_keys_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_idempotency_keys')),
    sa.UniqueConstraint('user_id', 'key', name=op.f('uq_idempotency_keys_user_id_key')),
    )
    op.create_index('ix_idempotency_keys_created_at', 'idempotency_keys', ['created_at'], unique=False)
    op.create_index(op.f('ix_idempotency_keys_job_id'), 'idempotency_keys', ['job_id'], unique=False)
    op.create_table('job_tags',
    sa.Column('job_id', _ID, nullable=False),
    sa.Column('tag', sa.String(length=32), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_job_tags_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_id', 'tag', name=op.f('pk_job_tags')),
    )
    op.create_index('ix_job_tags_tag_job_id', 'job_tags', ['tag', 'job_id'], unique=False)
    op.create_table('job_favourites',
    sa.Column('user_id', _ID, nullable=False),
    sa.Column('job_id', _ID, nullable=False),
    sa.Column('created_at', _TS, nullable=False),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_job_favourites_user_id_users'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_job_favourites_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('user_id', 'job_id', name=op.f('pk_job_favourites')),
    )
    op.create_index('ix_job_favourites_job_id', 'job_favourites', ['job_id'], unique=False)
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('archived_at', _TS, nullable=True))
    op.create_index('ix_jobs_archived_at', 'jobs', ['archived_at'], unique=False)
    op.create_index(op.f('ix_portal_sessions_expires_at'), 'portal_sessions', ['expires_at'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_portal_sessions_expires_at'), table_name='portal_sessions')
    op.drop_index('ix_jobs_archived_at', table_name='jobs')
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('archived_at')
    op.drop_index('ix_job_favourites_job_id', table_name='job_favourites')
    op.drop_table('job_favourites')
    op.drop_index('ix_job_tags_tag_job_id', table_name='job_tags')
    op.drop_table('job_tags')
    op.drop_index(op.f('ix_idempotency_keys_job_id'), table_name='idempotency_keys')
    op.drop_index('ix_idempotency_keys_created_at', table_name='idempotency_keys')
    op.drop_table('idempotency_keys')
