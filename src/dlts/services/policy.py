"""Authorisation rules of API.md, in one place. Services call these; views never decide access.

Visibility of a job: ``FULL`` for its owner, its VC's admins and cluster admins; ``PUBLIC`` (name,
user, status, resources) for other members of its VC; ``None`` for everybody else, which the caller
turns into 404 so that ids do not leak.
"""

from __future__ import annotations

import enum

from dlts.errors import Forbidden, NotFound, Refused
from dlts.models import Job
from dlts.services.auth import Principal

MEMBER_MAX_PRIORITY = 100
VC_ADMIN_MAX_PRIORITY = 1000


class Visibility(enum.Enum):
    FULL = "full"
    PUBLIC = "public"


def job_visibility(principal: Principal, job: Job) -> Visibility | None:
    vc = job.vc.name
    if job.user_id == principal.user_id or principal.is_vc_admin(vc):
        return Visibility.FULL
    if principal.is_vc_member(vc):
        return Visibility.PUBLIC
    return None


def require_visible(principal: Principal, job: Job | None, job_id: int) -> Visibility:
    visibility = job_visibility(principal, job) if job is not None else None
    if visibility is None:
        raise NotFound(f"Job {job_id} does not exist or is not in a VC you belong to.", code="job_not_found")
    return visibility


def require_manage(principal: Principal, job: Job, action: str) -> None:
    """Owner, VC admin of the job's VC, or cluster admin (kill, pause, resume, log, patch)."""
    visibility = require_visible(principal, job, job.id)
    if visibility is not Visibility.FULL:
        raise Forbidden(f"Only the job's owner ({job.user.name}) or an admin of VC {job.vc.name} may {action} job {job.id}.")


def require_endpoints(principal: Principal, job: Job | None, job_id: int, action: str) -> None:
    """Endpoints (list, open, close) are the owner's, the VC admins' and cluster admins': 404 outside the
    VC, 403 for other members (an endpoint is a way into the job, not a public field)."""
    require_visible(principal, job, job_id)
    assert job is not None
    require_manage(principal, job, action)


def require_approve(principal: Principal, job: Job) -> None:
    require_visible(principal, job, job.id)
    if not principal.is_vc_admin(job.vc.name):
        raise Forbidden(f"Only an admin of VC {job.vc.name} may approve job {job.id}; ask one of them.", code="approval_requires_vc_admin")


def require_vc_member(principal: Principal, vc_name: str) -> None:
    if not principal.is_vc_member(vc_name):
        raise NotFound(f"VC {vc_name!r} does not exist or you are not a member of it. "
                       f"Your VCs: {', '.join(principal.vcs) or 'none'}.", code="vc_not_found", details={"field": "vc"})


def require_cluster_admin(principal: Principal, what: str) -> None:
    if not principal.is_cluster_admin:
        raise Forbidden(f"Only a cluster admin may {what}.")


def check_priority(principal: Principal, vc_name: str, priority: int) -> None:
    limit = VC_ADMIN_MAX_PRIORITY if principal.is_vc_admin(vc_name) else MEMBER_MAX_PRIORITY
    if not 1 <= priority <= limit:
        raise Refused(
            f"Priority {priority} is out of range: you may set 1-{limit} in VC {vc_name}"
            + ("" if limit == VC_ADMIN_MAX_PRIORITY else "; VC admins may set up to 1000") + ".",
            code="priority_out_of_range", details={"field": "priority", "max": limit},
        )


def check_max_time(principal: Principal, vc_name: str, max_time_s: int | None, vc_limit_s: int | None) -> None:
    if max_time_s is None or vc_limit_s is None or principal.is_vc_admin(vc_name):
        return
    if max_time_s > vc_limit_s:
        raise Refused(
            f"max_time_s {max_time_s} is above VC {vc_name}'s limit of {vc_limit_s} s; ask for at most {vc_limit_s} or ask a VC admin.",
            code="max_time_exceeds_vc", details={"field": "max_time_s", "max": vc_limit_s},
        )


# -- VCs, nodes, per-user material ------------------------------------------------------------------

def require_vc_visible(principal: Principal, vc_name: str) -> None:
    """Members see their VCs; anybody else gets 404 so that VC names do not leak."""
    if not principal.is_vc_member(vc_name):
        raise NotFound(f"VC {vc_name[:64]!r} does not exist or you are not a member of it.", code="vc_not_found")


def require_vc_settings_change(principal: Principal, vc_name: str, cluster_fields: set[str], vc_fields: bool) -> None:
    """VC admins change policy and limits; only cluster admins change quota (GPUs, cores, bytes)."""
    if cluster_fields and not principal.is_cluster_admin:
        raise Forbidden(f"Only a cluster admin may change {', '.join(sorted(cluster_fields))} of VC {vc_name}; "
                        "VC admins may change policy, max_job_time_s, max_interactive_gpus, user_gpu_quota, notice, "
                        "max_queued_jobs_per_user, max_submissions_per_minute, idle_policy, fair_share, fair_share_max_wait_s, "
                        "limit_weight, min_runtime_s, max_reclaim_delay_s and max_preemptions.",
                        code="quota_requires_cluster_admin")
    if vc_fields and not principal.is_vc_admin(vc_name):
        raise Forbidden(f"Only an admin of VC {vc_name} may change its settings.", code="requires_vc_admin")


def can_see_node_details(principal: Principal) -> bool:
    return principal.is_cluster_admin


def storage_row_visible(principal: Principal, vc: str | None, user: str | None, directory: str | None) -> bool:
    """A storage usage row: cluster admins see every row; everyone their own rows (their paths in
    detail, in a VC's directory or not); a VC admin every row of their VC; a member their VC's total.
    Never another user's rows elsewhere, another VC's, or the totals of a mount outside any VC."""
    if principal.is_cluster_admin or (user is not None and user == principal.name):
        return True
    if vc is None:
        return False
    if principal.is_vc_admin(vc):
        return True
    return principal.is_vc_member(vc) and user is None and directory is None


def can_see_storage_paths(principal: Principal) -> bool:
    """The paths a scan names (its biggest directories, its oldest files, its error message) span every
    VC of the root: cluster admins only; others see when, how and how full."""
    return principal.is_cluster_admin


def require_self_or_cluster_admin(principal: Principal, user_name: str, what: str) -> None:
    if user_name != principal.name and not principal.is_cluster_admin:
        raise Forbidden(f"Only a cluster admin may {what} of another user ({user_name[:64]}).")


def require_idle_exempt(principal: Principal, job: Job) -> None:
    """Only an admin of the job's VC (or a cluster admin) exempts a job from the VC's idle-job policy."""
    require_visible(principal, job, job.id)
    if not principal.is_vc_admin(job.vc.name):
        raise Forbidden(f"Only an admin of VC {job.vc.name} may exempt job {job.id} from the VC's idle-job policy; ask "
                        "one of them.", code="requires_vc_admin")


def check_patch(principal: Principal, job: Job, priority: int | None, max_time_s: int | None) -> None:
    """PATCH /jobs/{id}: owner (priority up to 100) or VC admin (up to 1000)."""
    require_manage(principal, job, "change")
    if priority is not None:
        check_priority(principal, job.vc.name, priority)
    if max_time_s is not None:
        check_max_time(principal, job.vc.name, max_time_s, job.vc.max_job_time_s)
