"""``build_launch_spec`` from real rows: the owner's uid/gid and the VC's group, root only where the VC
still allows it, the VC's storage and the owner's home as mounts, the owner's then the VC's registry
credentials decrypted, the scratch space; one query per kind."""

from __future__ import annotations

import sqlalchemy as sa

from dlts.backends.base import RegistryCredential as LaunchCredential
from dlts.backends.base import StorageMount
from dlts.jobmanager.launch_spec import build_launch_spec
from dlts.models import Job, JobAttempt, User, VirtualCluster
from dlts.models.placements import placements_to_json
from dlts.scheduler.model import Placement
from dlts.services import admin, registry_credentials
from dlts.services import jobs as job_service
from dlts.services.auth import principal_for

STORAGE = {
    "nfs": [{"name": "datasets", "server": "10.0.0.5", "path": "/export/datasets", "mount_path": "/datasets", "read_only": True}],
    "host": [{"path": "/mnt/lustre/vision", "mount_path": "/lustre"}],
    "home": {"kind": "nfs", "server": "nfs1.lab", "path": "/export/home", "mount_path": "/home"},
}


def who(session, name):
    return principal_for(session, session.scalar(sa.select(User).where(User.name == name)))


def prepared(sessions, settings, **ask) -> int:
    """VC vision with a group, storage, root allowed and scratch space; alice with a uid and two credentials."""
    with sessions() as s:
        admin.add_vc(s, "vision", {})
        admin.add_vc(s, "nlp", {})
        admin.add_user(s, "alice", uid=20001, gid=20000)
        admin.add_user(s, "bob")
        admin.add_user(s, "root-admin", admin=True)
        admin.add_member(s, "vision", "alice")
        vc = s.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == "vision"))
        vc.gid, vc.ephemeral_storage_bytes, vc.pod_policy = 30000, 20 * 2**30, {"run_as_root": True}
        admin.replace_vc_storage(s, vc, STORAGE, "test")
        registry_credentials.add_vc(s, settings.secret_key, who(s, "root-admin"), "vision", "registry.lab:5000", "robot",
                                    "robot-pw")
        registry_credentials.add_mine(s, settings.secret_key, who(s, "alice"), "ghcr.io", "alice-gh", "alice-pw")
        registry_credentials.add_mine(s, settings.secret_key, who(s, "bob"), "ghcr.io", "bob-gh", "bob-pw")
        job = job_service.submit(s, settings, who(s, "alice"),
                                 job_service.JobRequest(vc="vision", image="debian:12", command="true", **ask))
        s.add(JobAttempt(job_id=job.id, number=1, placements=placements_to_json([Placement("n1", (), 1.0, 2**30)])))
        s.commit()
        return job.id


def spec_of(sessions, settings, job_id):
    with sessions() as s:
        job = s.get(Job, job_id)
        attempt = s.scalar(sa.select(JobAttempt).where(JobAttempt.job_id == job_id))
        statements = []

        def record(conn, cursor, statement, *args):
            statements.append(statement)

        sa.event.listen(s.get_bind(), "before_cursor_execute", record)
        try:
            spec = build_launch_spec(s, settings, job, attempt)
        finally:
            sa.event.remove(s.get_bind(), "before_cursor_execute", record)
        return spec, statements


def test_the_spec_carries_identity_storage_credentials_and_scratch_space(sessions, settings):
    job_id = prepared(sessions, settings, ephemeral_storage_bytes=10 * 2**30, run_as_root=True)
    spec, _ = spec_of(sessions, settings, job_id)
    assert (spec.user, spec.uid, spec.gid, spec.supplemental_groups) == ("alice", 20001, 20000, (30000,))
    assert spec.run_as_root is True
    assert spec.ephemeral_storage_bytes == 10 * 2**30
    assert spec.storage == (
        StorageMount("vc-datasets", "nfs", "/export/datasets", "/datasets", "10.0.0.5", True),
        StorageMount("vc-host-0", "host", "/mnt/lustre/vision", "/lustre"),
        StorageMount("home", "nfs", "/export/home/alice", "/home/alice", "nfs1.lab"),
    )
    assert len({m.name for m in spec.storage}) == len(spec.storage)
    # the owner's first, then the VC's; never another user's
    assert spec.registry_credentials == (LaunchCredential("ghcr.io", "alice-gh", "alice-pw"),
                                         LaunchCredential("registry.lab:5000", "robot", "robot-pw"))


def test_one_query_for_the_credentials_and_none_for_the_rest(sessions, settings):
    job_id = prepared(sessions, settings)
    _, statements = spec_of(sessions, settings, job_id)
    assert len(statements) == 1 and "registry_credentials" in statements[0], statements


def test_defaults_without_asks_and_root_withdrawn_by_the_vc(sessions, settings):
    job_id = prepared(sessions, settings, run_as_root=True)
    with sessions() as s:
        vc = s.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == "vision"))
        vc.pod_policy = {}  # the VC stopped allowing root after the job was submitted
        s.commit()
    spec, _ = spec_of(sessions, settings, job_id)
    assert spec.run_as_root is False and spec.uid == 20001
    assert spec.ephemeral_storage_bytes == 20 * 2**30  # the VC's default
    with sessions() as s:
        vc = s.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == "vision"))
        vc.ephemeral_storage_bytes, vc.gid, vc.storage = None, None, {}
        s.commit()
    spec, _ = spec_of(sessions, settings, job_id)
    assert (spec.ephemeral_storage_bytes, spec.supplemental_groups, spec.storage) == (None, (), ())


def test_a_user_without_a_uid_gets_none_and_the_backend_decides(sessions, settings):
    job_id = prepared(sessions, settings)
    with sessions() as s:
        s.execute(sa.update(User).where(User.name == "alice").values(uid=None, gid=None))
        s.commit()
    spec, _ = spec_of(sessions, settings, job_id)
    assert (spec.uid, spec.gid, spec.run_as_root) == (None, None, False)


def test_credentials_that_no_longer_decrypt_are_left_out(sessions, settings, caplog):
    job_id = prepared(sessions, settings)
    rotated = settings.model_copy(update={"secret_key": "another-secret-key-0123456789"})
    spec, _ = spec_of(sessions, rotated, job_id)
    assert spec.registry_credentials == ()
    assert "does not decrypt" in caplog.text
