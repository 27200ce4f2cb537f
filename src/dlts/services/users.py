"""User administration (cluster admins): list, create, disable, enable, reset a password, set uid/gid/e-mail,
make or unmake a cluster admin. The API, the portal and the directory sync call these.

Disabling a user (``disable``): their API tokens are revoked, their portal sessions end, their waiting jobs
(unapproved, queued) are held (paused, reason ``user_disabled``); running jobs go on to their end, so a
disabled user's training run is not lost (kill it as its VC admin if it must stop). Enabling holds
nothing against the user any more: jobs held by the disable go back to the queue (or to approval, over
the VC's per-user quota, as a resume does); revoked tokens stay revoked (the user makes new ones).
Nobody disables themselves, and the last enabled cluster admin is neither disabled nor unmade.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.errors import InvalidInput, WrongState
from dlts.models import ApiToken, JobStatus, Role, RoleBinding, User, iso, utcnow
from dlts.repositories import identity as identity_repo
from dlts.repositories import jobs as job_repo
from dlts.services import admin, policy, portal_auth
from dlts.services.auth import Principal, forget_principals
from dlts.services.transaction import rowcount, transaction, transactional

EMAIL_RE = re.compile(r"^[^@\s]{1,64}@[^@\s.]+(\.[^@\s.]+)+$")
MAX_REASON = 255
HELD_REASON = "user_disabled"
PATCH_FIELDS = ("uid", "gid", "email", "cluster_admin")


@dataclass(frozen=True)
class UserAdminView:
    name: str
    email: str | None
    uid: int | None
    gid: int | None
    cluster_admin: bool
    disabled: bool
    disabled_at: str | None
    disabled_reason: str | None
    source: str | None  # None: made by a person; "directory": by the directory sync
    groups: list[str]
    password_login: bool
    created_at: str | None


@dataclass(frozen=True)
class DisableView:
    user: UserAdminView
    tokens_revoked: int
    sessions_ended: int
    held_jobs: list[int]  # waiting jobs held (paused, reason user_disabled)
    running_jobs: list[int]  # they run on to their end


@dataclass(frozen=True)
class EnableView:
    user: UserAdminView
    released_jobs: list[int]  # held by the disable, back to the queue (or to approval)


@dataclass(frozen=True)
class PasswordView:
    user: str
    password: str | None  # the generated password, shown this once; None when the caller set one
    sessions_ended: bool = True


def check_email(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 254 or not value.isprintable() or not EMAIL_RE.match(value):
        raise InvalidInput("email must be an address like name@example.org (at most 254 characters), or null.",
                           details={"field": "email"})
    return value


def _views(session: Session, users: list[User]) -> list[UserAdminView]:
    ids = [u.id for u in users]
    admins = identity_repo.cluster_admin_ids(session, ids)
    groups = identity_repo.groups_of(session, ids)
    return [UserAdminView(u.name, u.email, u.uid, u.gid, u.id in admins, u.disabled_at is not None, iso(u.disabled_at),
                          u.disabled_reason, u.source, groups.get(u.id, []), bool(u.password_hash), iso(u.created_at))
            for u in users]


def view(session: Session, user: User) -> UserAdminView:
    return _views(session, [user])[0]


def list_users(session: Session, principal: Principal, *, after_name: str | None = None, limit: int = 50,
               query: str | None = None, disabled: bool | None = None) -> list[UserAdminView]:
    policy.require_cluster_admin(principal, "list users")
    select = sa.select(User).order_by(User.name).limit(limit)
    if after_name is not None:
        select = select.where(User.name > after_name)
    if query:
        select = select.where(User.name.contains(query, autoescape=True))
    if disabled is not None:
        select = select.where(User.disabled_at.is_not(None) if disabled else User.disabled_at.is_(None))
    return _views(session, list(session.scalars(select)))


def get(session: Session, principal: Principal, name: str) -> UserAdminView:
    policy.require_cluster_admin(principal, "read a user's administration record")
    return view(session, admin.get_user(session, name))


@transactional
def create(session: Session, principal: Principal, name: str, *, email: str | None = None, uid: int | None = None,
           gid: int | None = None, cluster_admin: bool = False, password: str | None = None,
           generate_password: bool = False) -> tuple[UserAdminView, str | None]:
    """A new user; ``password`` sets their portal password, ``generate_password`` makes one (returned once)."""
    policy.require_cluster_admin(principal, "create users")
    check_email(email)
    if password is not None and generate_password:
        raise InvalidInput("Send password or generate_password, not both.", details={"field": "password"})
    if password is not None:
        portal_auth.check_password_strength(password)
    user = admin.add_user(session, name, admin=cluster_admin, email=email, uid=uid, gid=gid)
    shown = portal_auth.random_password() if generate_password else None
    new_password = password if password is not None else shown
    if new_password is not None:
        portal_auth.set_password(session, name, new_password)
    return view(session, user), shown


def _require_not_last_admin(session: Session, user: User, what: str) -> None:
    admins = identity_repo.enabled_cluster_admins(session)
    if user.id in admins and len(admins) <= 1:
        raise WrongState(f"{user.name} is the only enabled cluster admin; make another one first, then {what}.",
                         code="last_cluster_admin")


def set_cluster_admin(session: Session, user: User, wanted: bool, actor: str) -> bool:
    """Grant or take the user's own cluster admin binding; the caller commits. Returns whether it changed.
    A cluster admin role through a group stays (change the group's)."""
    current = session.scalar(sa.select(RoleBinding.id).where(RoleBinding.user_id == user.id, RoleBinding.vc_id.is_(None),
                                                             RoleBinding.role == Role.CLUSTER_ADMIN))
    if wanted and current is None:
        session.add(RoleBinding(role=Role.CLUSTER_ADMIN, user_id=user.id, vc_id=None))
        return True
    if not wanted and current is not None:
        _require_not_last_admin(session, user, "take the role from this one")
        session.execute(sa.delete(RoleBinding).where(RoleBinding.id == current))
        return True
    return False


def update(session: Session, principal: Principal, name: str, changes: Mapping[str, Any]) -> UserAdminView:
    """``PATCH /users/{name}``: ``uid``/``gid`` (both set or both null), ``email``, ``cluster_admin``."""
    with transaction(session):
        policy.require_cluster_admin(principal, "change a user")
        unknown = sorted(set(changes) - set(PATCH_FIELDS))
        if unknown:
            raise InvalidInput(f"unknown user setting {unknown[0][:40]!r}; settable: {', '.join(PATCH_FIELDS)}.",
                               details={"field": unknown[0][:40]})
        if not changes:
            raise InvalidInput(f"Send at least one of {', '.join(PATCH_FIELDS)}.", details={"field": "body"})
        if "email" in changes:
            check_email(changes["email"])
        if "cluster_admin" in changes and not isinstance(changes["cluster_admin"], bool):
            raise InvalidInput("cluster_admin must be true or false.", details={"field": "cluster_admin"})
        user = admin.get_user(session, name)
        if "cluster_admin" in changes and not changes["cluster_admin"] and user.id in identity_repo.enabled_cluster_admins(session):
            _require_not_last_admin(session, user, "take the role from this one")
        ids = {k: changes[k] for k in ("uid", "gid") if k in changes}
        if ids:
            admin.set_user(session, name, ids)  # in this transaction
            user = admin.get_user(session, name)
        if "email" in changes:
            user.email = check_email(changes["email"])
        if "cluster_admin" in changes:
            set_cluster_admin(session, user, changes["cluster_admin"], principal.name)
    forget_principals()
    return view(session, user)


def disable_user(session: Session, user: User, actor: str, reason: str) -> DisableView:
    """Disable ``user`` (see the module's docstring); idempotent. The caller has checked who may."""
    with transaction(session):
        result = hold_user(session, user, actor, reason)
    forget_principals()
    return DisableView(view(session, user), *result)


def hold_user(session: Session, user: User, actor: str, reason: str) -> tuple[int, int, list[int], list[int]]:
    """The writes of a disable, in the caller's transaction: (tokens revoked, sessions ended, held jobs,
    running jobs). The caller commits and calls ``forget_principals``."""
    now = utcnow()
    revoked = rowcount(session.execute(sa.update(ApiToken).where(ApiToken.user_id == user.id, ApiToken.revoked_at.is_(None))
                                       .values(revoked_at=now).execution_options(synchronize_session=False)))
    ended = portal_auth.end_sessions_of(session, user.id)
    held = []
    for job in identity_repo.waiting_jobs(session, user.id):
        if job_repo.set_status(session, job.id, job.status, JobStatus.PAUSED, actor=actor, reason=HELD_REASON,
                               values={"reason": HELD_REASON, "queue_position": None,
                                       "reason_detail": f"held: {user.name} was disabled by {actor}"[:512]}):
            held.append(job.id)
    running = [j.id for j in identity_repo.waiting_jobs(session, user.id, statuses=(JobStatus.SCHEDULING, JobStatus.RUNNING))]
    if user.disabled_at is None:
        user.disabled_at = now
    user.disabled_reason = reason[:MAX_REASON]
    return int(revoked or 0), int(ended or 0), held, running


def enable_user(session: Session, user: User, actor: str) -> EnableView:
    with transaction(session):
        released = release_user(session, user, actor)
    forget_principals()
    return EnableView(view(session, user), released)


def release_user(session: Session, user: User, actor: str) -> list[int]:
    """The writes of an enable, in the caller's transaction; returns the jobs released."""
    from dlts.services.jobs import _needs_approval

    user.disabled_at = None
    user.disabled_reason = None
    released = []
    for job in identity_repo.waiting_jobs(session, user.id, statuses=(JobStatus.PAUSED,)):
        if job.reason != HELD_REASON:
            continue  # paused by its owner or an admin: stays paused
        why = _needs_approval(session, job, job.vc.user_gpu_quota)
        target = JobStatus.UNAPPROVED if why else JobStatus.QUEUED
        values = {"reason": "user_quota", "reason_detail": why[:512]} if why else {"reason": None, "reason_detail": None}
        if job_repo.set_status(session, job.id, JobStatus.PAUSED, target, actor=actor, reason="user_enabled", values=values):
            released.append(job.id)
    return released


def disable(session: Session, principal: Principal, name: str, reason: str | None = None) -> DisableView:
    policy.require_cluster_admin(principal, "disable users")
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON or not reason.isprintable()):
        raise InvalidInput(f"reason must be printable text of at most {MAX_REASON} characters.", details={"field": "reason"})
    user = admin.get_user(session, name)
    if user.id == principal.user_id:
        raise WrongState("You cannot disable yourself; ask another cluster admin.", code="cannot_disable_self")
    _require_not_last_admin(session, user, "disable this one")
    return disable_user(session, user, principal.name, reason or f"disabled by {principal.name}")


def enable(session: Session, principal: Principal, name: str) -> EnableView:
    policy.require_cluster_admin(principal, "enable users")
    return enable_user(session, admin.get_user(session, name), principal.name)


def reset_password(session: Session, principal: Principal, name: str, password: str | None = None) -> PasswordView:
    """Set the user's portal password to ``password``, or to a generated one returned this once. Either way
    every portal session of the user ends."""
    policy.require_cluster_admin(principal, "reset passwords")
    admin.get_user(session, name)
    shown: str | None = None
    if password is None:
        password = shown = portal_auth.random_password()
    portal_auth.set_password(session, name, password)
    return PasswordView(name, shown)


def me(session: Session, principal: Principal) -> dict[str, Any]:
    """GET /me: the caller's name, uid and gid, roles, and per VC its quota and the caller's GPUs in use."""
    from dlts.repositories import cluster as cluster_repo
    from dlts.services.jobs import user_gpus_in_vc

    uid, gid = cluster_repo.user_ids_of(session, principal.user_id)
    return {
        "name": principal.name,
        "uid": uid,
        "gid": gid,
        "cluster_admin": principal.is_cluster_admin,
        "vcs": [{"name": vc.name, "roles": sorted(r.value for r in principal.vc_roles[vc.name]), "quota": vc.quota,
                 "user_gpu_quota": vc.user_gpu_quota, "gpus_used": user_gpus_in_vc(session, principal.user_id, vc.id)}
                for vc in cluster_repo.vcs_named(session, principal.vcs)],
    }
