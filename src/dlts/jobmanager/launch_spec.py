"""What the job manager hands a backend to launch an attempt: the ``LaunchSpec`` built from the rows.

One function, ``build_launch_spec``, reads what a launch needs (the owner's SSH keys when the job
asked for ssh, the VC's pod policy and storage) and returns the frozen spec. The backends never read
the database; everything they may use about a job reaches them here.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.backends.base import LaunchSpec
from dlts.config import Settings
from dlts.jobmanager.snapshot import replicas_from_json
from dlts.logs import attempt_log_path
from dlts.models import Job, JobAttempt, SshKey


def build_launch_spec(session: Session, settings: Settings, job: Job, attempt: JobAttempt) -> LaunchSpec:
    """The spec of ``attempt`` with its replicas that are not retiring."""
    keys = tuple(session.scalars(sa.select(SshKey.public_key).where(SshKey.user_id == job.user_id))) \
        if job.spec.get("ssh") else ()
    active = [r for r in replicas_from_json(attempt.placements) if not r.retiring]
    return LaunchSpec(
        job_id=job.id, attempt=attempt.number, user=job.user.name, vc=job.vc.name, type=job.type, image=job.image,
        command=job.command, placements=tuple(r.placement for r in active), replicas=tuple(r.index for r in active),
        env=dict(job.spec.get("env", {})),
        preemptible=job.preemptible, ports=tuple(job.spec.get("ports", [])), ssh_public_keys=keys,
        log_path=str(attempt_log_path(settings, job.id, attempt.number)),
        vc_pod_policy=dict(job.vc.pod_policy or {}),
    )
