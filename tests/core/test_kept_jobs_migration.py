"""Revision 0014 (idempotency keys, tags, favourites, jobs.archived_at, portal_sessions.expires_at
index) goes down to 0013 and up again, keeping the jobs (SQLite batch mode on jobs)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.models import Job, JobStatus, JobTag, User, VirtualCluster, utcnow
from dlts.services import admin


def test_revision_0014_goes_down_and_up_again_keeping_the_jobs(tmp_path):
    from alembic import command

    from dlts import db_migrate

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'down.db'}")
    try:
        db_migrate.upgrade(engine)
        with Session(engine) as s:
            admin.add_vc(s, "v", {})
            admin.add_user(s, "alice")
            user = s.scalar(sa.select(User).where(User.name == "alice"))
            vc = s.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == "v"))
            job = Job(name="j", user=user, vc=vc, type="batch", status=JobStatus.FINISHED, image="i", command="c",
                      cpu=1, memory_bytes=1, spec={}, archived_at=utcnow())
            s.add(job)
            s.flush()
            s.add(JobTag(job_id=job.id, tag="x"))
            s.commit()
        cfg = db_migrate.alembic_config()
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0013")
        inspector = sa.inspect(engine)
        assert not {"idempotency_keys", "job_tags", "job_favourites"} & set(inspector.get_table_names())
        assert "archived_at" not in {c["name"] for c in inspector.get_columns("jobs")}
        db_migrate.upgrade(engine)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT id, archived_at FROM jobs")).all() == [(1, None)]
            assert "ix_portal_sessions_expires_at" in {i["name"] for i in sa.inspect(conn).get_indexes("portal_sessions")}
    finally:
        engine.dispose()
