"""job_attempts.log_key: the random key in the names of an attempt's log files (dlts.logstore),
made with the attempt, so that a job id reused after the database is restored from a backup never
shows the log of the job the restore discarded; existing attempts keep NULL and their logs the old
names (``attempt-<n>.log``)

Revision ID: 0022
Revises: 0021
"""
import sqlalchemy as sa
from alembic import op

revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job_attempts') as batch:
        batch.add_column(sa.Column('log_key', sa.String(length=16), nullable=True))


def downgrade() -> None:
    # the logs of attempts made since 0022 keep their keyed names, which the older code never reads
    with op.batch_alter_table('job_attempts') as batch:
        batch.drop_column('log_key')
