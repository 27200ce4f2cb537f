"""What the job manager hands a backend to launch an attempt: the ``LaunchSpec`` built from the rows.

One function, ``build_launch_spec``, reads what a launch needs and returns the frozen spec: the
owner's uid/gid and the VC's group, root only where the VC's policy still allows what the job asked,
the VC's storage and the owner's home (``services.vc_storage``), the registry credentials of the owner
and of the VC (decrypted), the scratch space, and the owner's SSH keys when the job asked for ssh.
The job's user and VC rows come loaded with the job; beyond them it makes at most one query per
kind (keys, credentials). The backends never read the database; everything they may use about a
job reaches them here.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts import logstore
from dlts.backends.base import LaunchSpec
from dlts.config import Settings
from dlts.models import Job, JobAttempt, SshKey
from dlts.models.placements import replicas_from_json
from dlts.services import registry_credentials, vc_storage
from dlts.services.jobs import root_allowed


def build_launch_spec(session: Session, settings: Settings, job: Job, attempt: JobAttempt) -> LaunchSpec:
    """The spec of ``attempt`` with its replicas that are not retiring."""
    user, vc = job.user, job.vc
    keys = tuple(session.scalars(sa.select(SshKey.public_key).where(SshKey.user_id == job.user_id).order_by(SshKey.id))) \
        if job.spec.get("ssh") else ()
    active = [r for r in replicas_from_json(attempt.placements) if not r.retiring]
    return LaunchSpec(
        job_id=job.id, attempt=attempt.number, user=user.name, vc=vc.name, type=job.type, image=job.image,
        command=job.command, placements=tuple(r.placement for r in active), replicas=tuple(r.index for r in active),
        env=dict(job.spec.get("env", {})),
        preemptible=job.preemptible, ports=tuple(job.spec.get("ports", [])), ssh_public_keys=keys,
        log_path=str(logstore.head_path(settings.effective_log_dir, job.id, attempt.number, key=attempt.log_key)),
        log_key=attempt.log_key,
        vc_pod_policy=dict(vc.pod_policy or {}),
        registry_credentials=registry_credentials.for_launch(session, settings.secret_key, job.user_id, job.vc_id),
        uid=user.uid, gid=user.gid,
        supplemental_groups=(vc.gid,) if vc.gid is not None else (),
        # the policy is read again at launch: a VC that stopped allowing root runs the job as its owner
        run_as_root=bool(job.spec.get("run_as_root")) and root_allowed(settings, vc),
        storage=vc_storage.mounts_for(vc.storage, user.name),
        ephemeral_storage_bytes=job.spec.get("ephemeral_storage_bytes") or vc.ephemeral_storage_bytes,
    )
