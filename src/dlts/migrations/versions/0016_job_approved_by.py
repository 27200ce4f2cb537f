"""jobs.approved_by: the VC admin who let a job past its user quota, as a column (it was
spec["approved_by"]); the values move out of the JSON on upgrade and back on downgrade

Revision ID: 0016
Revises: 0015
"""
import json

import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None

BATCH = 1000


def _specs(conn, where: str):
    """(id, spec) of the jobs whose spec text matches ``where``, in id order, a batch at a time."""
    last = 0
    while True:
        rows = conn.execute(sa.text(f"SELECT id, spec FROM jobs WHERE id > :last AND {where} ORDER BY id LIMIT {BATCH}"),
                            {"last": last}).all()
        if not rows:
            return
        for job_id, spec in rows:
            yield job_id, (json.loads(spec) if isinstance(spec, (str, bytes)) else spec) or {}
        last = rows[-1][0]


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('approved_by', sa.String(64), nullable=True))
    conn = op.get_bind()
    for job_id, spec in list(_specs(conn, "spec LIKE '%approved_by%'")):
        if "approved_by" not in spec:
            continue
        who = spec.pop("approved_by")
        conn.execute(sa.text("UPDATE jobs SET approved_by = :who, spec = :spec WHERE id = :id"),
                     {"who": str(who)[:64] if who else None, "spec": json.dumps(spec), "id": job_id})


def downgrade() -> None:
    conn = op.get_bind()
    for job_id, who in list(conn.execute(sa.text("SELECT id, approved_by FROM jobs WHERE approved_by IS NOT NULL"))):
        spec_text = conn.execute(sa.text("SELECT spec FROM jobs WHERE id = :id"), {"id": job_id}).scalar()
        spec = (json.loads(spec_text) if isinstance(spec_text, (str, bytes)) else spec_text) or {}
        spec["approved_by"] = who
        conn.execute(sa.text("UPDATE jobs SET spec = :spec WHERE id = :id"), {"spec": json.dumps(spec), "id": job_id})
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('approved_by')
