"""Queries of the identity aggregate: role bindings (direct and through groups), group members, a user's
waiting jobs. Repositories never commit."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.models import (
    Group,
    GroupMember,
    Job,
    JobStatus,
    Role,
    RoleBinding,
    User,
    VirtualCluster,
)

VC_ROLES = (Role.VC_MEMBER, Role.VC_ADMIN)
# a job that has not started: disabling its owner holds it, removing its owner from the VC may kill it
WAITING = (JobStatus.UNAPPROVED, JobStatus.QUEUED)


@dataclass(frozen=True)
class VcBinding:
    """One way a user holds a role on a VC: directly (``group`` None) or through a group."""

    user: str
    role: Role
    group: str | None


def vc_bindings(session: Session, vc_id: int) -> list[VcBinding]:
    """Every user's VC roles on ``vc_id``: their own bindings and their groups' (effective roles)."""
    direct = session.execute(
        sa.select(User.name, RoleBinding.role).join(User, User.id == RoleBinding.user_id)
        .where(RoleBinding.vc_id == vc_id, RoleBinding.role.in_(VC_ROLES))).all()
    grouped = session.execute(
        sa.select(User.name, RoleBinding.role, Group.name)
        .join(GroupMember, GroupMember.group_id == RoleBinding.group_id)
        .join(User, User.id == GroupMember.user_id).join(Group, Group.id == RoleBinding.group_id)
        .where(RoleBinding.vc_id == vc_id, RoleBinding.role.in_(VC_ROLES))).all()
    return [VcBinding(u, r, None) for u, r in direct] + [VcBinding(u, r, g) for u, r, g in grouped]


def direct_vc_roles(session: Session, user_id: int, vc_id: int) -> set[Role]:
    return set(session.scalars(sa.select(RoleBinding.role).where(
        RoleBinding.user_id == user_id, RoleBinding.vc_id == vc_id, RoleBinding.role.in_(VC_ROLES))))


def group_vc_roles(session: Session, user_id: int, vc_id: int) -> list[tuple[str, Role]]:
    """(group, role) of the user's groups on the VC."""
    return [(g, r) for g, r in session.execute(
        sa.select(Group.name, RoleBinding.role).join(RoleBinding, RoleBinding.group_id == Group.id)
        .join(GroupMember, GroupMember.group_id == Group.id)
        .where(GroupMember.user_id == user_id, RoleBinding.vc_id == vc_id, RoleBinding.role.in_(VC_ROLES)))]


def is_cluster_admin(session: Session, user_id: int) -> bool:
    """Directly or through a group."""
    groups = sa.select(GroupMember.group_id).where(GroupMember.user_id == user_id)
    return session.scalar(sa.select(RoleBinding.id).where(
        RoleBinding.role == Role.CLUSTER_ADMIN, RoleBinding.vc_id.is_(None),
        sa.or_(RoleBinding.user_id == user_id, RoleBinding.group_id.in_(groups))).limit(1)) is not None


def enabled_cluster_admins(session: Session) -> set[int]:
    """Ids of enabled users who are cluster admins, directly or through a group."""
    direct = sa.select(RoleBinding.user_id).where(RoleBinding.role == Role.CLUSTER_ADMIN, RoleBinding.user_id.is_not(None))
    grouped = (sa.select(GroupMember.user_id).join(RoleBinding, RoleBinding.group_id == GroupMember.group_id)
               .where(RoleBinding.role == Role.CLUSTER_ADMIN))
    return set(session.scalars(sa.select(User.id).where(User.disabled_at.is_(None),
                                                        sa.or_(User.id.in_(direct), User.id.in_(grouped)))))


def cluster_admin_ids(session: Session, user_ids: list[int]) -> set[int]:
    if not user_ids:
        return set()
    admins = enabled_cluster_admins(session)
    disabled_admins = set(session.scalars(sa.select(RoleBinding.user_id).where(
        RoleBinding.role == Role.CLUSTER_ADMIN, RoleBinding.user_id.in_(user_ids))))
    return set(user_ids) & (admins | disabled_admins)


def groups_of(session: Session, user_ids: list[int]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    if not user_ids:
        return out
    for uid, name in session.execute(sa.select(GroupMember.user_id, Group.name).join(Group, Group.id == GroupMember.group_id)
                                     .where(GroupMember.user_id.in_(user_ids)).order_by(Group.name)):
        out.setdefault(uid, []).append(name)
    return out


def waiting_jobs(session: Session, user_id: int, vc_id: int | None = None,
                 statuses: tuple[JobStatus, ...] = WAITING) -> list[Job]:
    query = sa.select(Job).where(Job.user_id == user_id, Job.status.in_(statuses)).order_by(Job.id)
    if vc_id is not None:
        query = query.where(Job.vc_id == vc_id)
    return list(session.scalars(query))


def live_job_ids(session: Session, user_id: int, vc_id: int, statuses) -> list[int]:
    return list(session.scalars(sa.select(Job.id).where(Job.user_id == user_id, Job.vc_id == vc_id,
                                                        Job.status.in_(list(statuses))).order_by(Job.id)))


def vc_names(session: Session, vc_ids: set[int]) -> dict[int, str]:
    if not vc_ids:
        return {}
    return {i: n for i, n in session.execute(sa.select(VirtualCluster.id, VirtualCluster.name)
                                             .where(VirtualCluster.id.in_(vc_ids)))}
