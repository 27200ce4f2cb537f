"""VC membership: list a VC's members and admins, add or change one (member or admin), remove one.

VC admins manage their VC's members; cluster admins every VC's. A user's effective roles are their own
bindings together with their groups' (``services.groups``); this page lists both and changes only the
direct ones. Every change is a ``vc_events`` row (field ``member``) and clears the principal cache of
this process (``services.auth.forget_principals``); other API workers follow within ``auth_cache_s``.

Removing a member: jobs of theirs that are running (or starting, pausing, being killed) finish as they
would; their waiting jobs in the VC (unapproved, queued, paused) are kept or killed, as the admin
chooses (``queued=keep|kill``), and the answer says which and lists them. A user who is still a member
through a group keeps their access and their jobs; the answer names the groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.errors import Forbidden, InvalidInput
from dlts.models import ACTIVE, JobStatus, Role, RoleBinding, User, utcnow
from dlts.repositories import identity as identity_repo
from dlts.repositories import jobs as job_repo
from dlts.repositories import vc_events
from dlts.services import admin, policy
from dlts.services.auth import Principal, forget_principals
from dlts.services.transaction import transaction

ROLES = {"member": (Role.VC_MEMBER,), "admin": (Role.VC_MEMBER, Role.VC_ADMIN)}
QUEUED_CHOICES = ("keep", "kill")
REMOVABLE_WAITING = (JobStatus.UNAPPROVED, JobStatus.QUEUED, JobStatus.PAUSED)


@dataclass(frozen=True)
class MemberView:
    user: str
    role: str  # member | admin: the effective role (direct or through a group)
    direct_role: str | None  # the user's own binding; None: only through groups
    groups: list[dict[str, str]]  # [{"group", "role"}]
    disabled: bool
    email: str | None = None


@dataclass(frozen=True)
class RemovalView:
    vc: str
    user: str
    removed: bool  # False: the user had no direct binding
    still_member_via: list[str]  # groups through which the user still is a member
    queued: str  # keep | kill: what was asked
    queued_jobs: list[int]  # waiting jobs of the user in the VC: kept or killed, as `queued` says
    killed_jobs: list[int]
    running_jobs: list[int] = field(default_factory=list)  # they finish


class _Holdings(TypedDict):
    """How one user holds roles on a VC: directly, and through each group."""

    direct: set[Role]
    groups: dict[str, set[Role]]


def _role_name(roles: set[Role]) -> str | None:
    if Role.VC_ADMIN in roles:
        return "admin"
    return "member" if Role.VC_MEMBER in roles else None


def _require_vc_admin(principal: Principal, name: str, what: str) -> None:
    if not principal.is_vc_admin(name):
        raise Forbidden(f"Only an admin of VC {name} (or a cluster admin) may {what}.", code="requires_vc_admin")


def list_members(session: Session, principal: Principal, vc_name: str) -> list[MemberView]:
    """Members see their VC's members (404 outside it); every way each holds a role."""
    policy.require_vc_visible(principal, vc_name)
    vc = admin.get_vc(session, vc_name)
    people: dict[str, _Holdings] = {}
    for b in identity_repo.vc_bindings(session, vc.id):
        entry = people.setdefault(b.user, {"direct": set(), "groups": {}})
        if b.group is None:
            entry["direct"].add(b.role)
        else:
            entry["groups"].setdefault(b.group, set()).add(b.role)
    users = {u.name: u for u in session.scalars(sa.select(User).where(User.name.in_(list(people))))} if people else {}
    show_email = principal.is_vc_admin(vc_name)
    out = []
    for name in sorted(people):
        entry = people[name]
        every = set(entry["direct"]).union(*entry["groups"].values()) if entry["groups"] else set(entry["direct"])
        role = _role_name(every)
        if role is None:
            continue
        user = users[name]
        out.append(MemberView(name, role, _role_name(entry["direct"]),
                              [{"group": g, "role": _role_name(r) or "member"} for g, r in sorted(entry["groups"].items())],
                              user.disabled_at is not None, user.email if show_email else None))
    return out


def member_view(session: Session, principal: Principal, vc_name: str, user_name: str) -> MemberView | None:
    return next((m for m in list_members(session, principal, vc_name) if m.user == user_name), None)


def put_member(session: Session, principal: Principal, vc_name: str, user_name: str, role: str) -> tuple[MemberView, bool]:
    """Make ``user_name`` a ``member`` or an ``admin`` of the VC (their direct binding); idempotent.
    Returns the member and whether anything changed."""
    with transaction(session):
        policy.require_vc_visible(principal, vc_name)
        _require_vc_admin(principal, vc_name, "add or change its members")
        if role not in ROLES:
            raise InvalidInput("role must be member or admin.", details={"field": "role"})
        vc = admin.get_vc(session, vc_name)
        user = admin.get_user(session, user_name)
        current = identity_repo.direct_vc_roles(session, user.id, vc.id)
        wanted = set(ROLES[role])
        for extra in current - wanted:
            session.execute(sa.delete(RoleBinding).where(RoleBinding.user_id == user.id, RoleBinding.vc_id == vc.id,
                                                         RoleBinding.role == extra))
        for missing in wanted - current:
            session.add(RoleBinding(role=missing, user_id=user.id, vc_id=vc.id))
        changed = current != wanted
        if changed:
            vc_events.record(session, vc.name, principal.name, "member", {"user": user.name, "role": _role_name(current)},
                             {"user": user.name, "role": role})
    if changed:
        forget_principals()
    view = member_view(session, principal, vc_name, user_name)
    assert view is not None
    return view, changed


def remove_member(session: Session, principal: Principal, vc_name: str, user_name: str, queued: str) -> RemovalView:
    """Remove the user's direct membership (and VC admin role) of the VC; see the module's docstring."""
    with transaction(session):
        policy.require_vc_visible(principal, vc_name)
        _require_vc_admin(principal, vc_name, "remove its members")
        if queued not in QUEUED_CHOICES:
            raise InvalidInput("queued must be keep or kill: what happens to the user's waiting jobs in the VC.",
                               details={"field": "queued"})
        vc = admin.get_vc(session, vc_name)
        user = admin.get_user(session, user_name)
        current = identity_repo.direct_vc_roles(session, user.id, vc.id)
        if current:
            session.execute(sa.delete(RoleBinding).where(RoleBinding.user_id == user.id, RoleBinding.vc_id == vc.id,
                                                         RoleBinding.role.in_(list(identity_repo.VC_ROLES))))
            vc_events.record(session, vc.name, principal.name, "member", {"user": user.name, "role": _role_name(current)},
                             {"user": user.name, "role": None, "queued": queued})
        via = sorted({g for g, _ in identity_repo.group_vc_roles(session, user.id, vc.id)})
        waiting = identity_repo.live_job_ids(session, user.id, vc.id, REMOVABLE_WAITING)
        running = identity_repo.live_job_ids(session, user.id, vc.id, ACTIVE)
        killed: list[int] = []
        if queued == "kill" and not via:
            for job in identity_repo.waiting_jobs(session, user.id, vc.id, REMOVABLE_WAITING):
                detail = f"killed by {principal.name}: {user.name} was removed from VC {vc.name}"
                if job_repo.set_status(session, job.id, job.status, JobStatus.KILLED, actor=principal.name,
                                       reason="member_removed", values={"finished_at": utcnow(), "reason": "member_removed",
                                                                       "reason_detail": detail[:512], "queue_position": None}):
                    killed.append(job.id)
    forget_principals()
    return RemovalView(vc.name, user.name, bool(current), via, queued, waiting, killed, running)
