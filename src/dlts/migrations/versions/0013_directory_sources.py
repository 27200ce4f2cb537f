"""users.source and users.disabled_reason, groups.source, role_bindings.source: what the directory sync owns

Revision ID: 0013
Revises: 0012
"""
import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL: made by a person (CLI, API, portal); 'directory': made (or adopted) by `dlts directory sync`
    with op.batch_alter_table('users') as batch:
        batch.add_column(sa.Column('source', sa.String(length=16), nullable=True))
        batch.add_column(sa.Column('disabled_reason', sa.String(length=255), nullable=True))
    with op.batch_alter_table('groups') as batch:
        batch.add_column(sa.Column('source', sa.String(length=16), nullable=True))
    with op.batch_alter_table('role_bindings') as batch:
        batch.add_column(sa.Column('source', sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('role_bindings') as batch:
        batch.drop_column('source')
    with op.batch_alter_table('groups') as batch:
        batch.drop_column('source')
    with op.batch_alter_table('users') as batch:
        batch.drop_column('disabled_reason')
        batch.drop_column('source')
