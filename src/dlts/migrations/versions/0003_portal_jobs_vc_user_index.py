"""jobs (vc_id, user_id, id): the portal's jobs list filtered by VC and user, newest first, from one index

Without it, "VC vision, user bob" walks all of bob's jobs through (user_id, id) and reads each row to
check its VC: 0.5 s for a user with 20,000 jobs outside the VC on a 1M-job MariaDB.

Revision ID: 0003
Revises: 0002
"""
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_jobs_vc_user_id', 'jobs', ['vc_id', 'user_id', 'id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_jobs_vc_user_id', table_name='jobs')
