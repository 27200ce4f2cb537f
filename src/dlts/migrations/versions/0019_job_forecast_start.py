"""jobs.forecast_start: the forecast manager's estimate for a waiting job that holds no reservation
(scheduler/forecast.py); kept apart from estimated_start, which the next pass reads as a reservation

Revision ID: 0019
Revises: 0018
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None

_TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), 'mariadb').with_variant(mysql.DATETIME(fsp=6), 'mysql')


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('forecast_start', _TS, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('forecast_start')
