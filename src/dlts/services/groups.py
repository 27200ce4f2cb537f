"""Groups (cluster admins): create, delete, add and remove users, bind a group to a VC role.

A group bound to a VC as ``member`` (or ``admin``) makes each of its users a member (or admin) of that VC
for as long as they are in the group: a user's effective roles are their own bindings together with
their groups' (``services.auth.principal_for``, used by every authorisation check). A group may also be
bound to ``cluster_admin``. Groups made by the directory sync (``source: directory``) take their
members from the directory: changing those by hand is refused (the next sync would undo it), binding
them to VC roles is not (bindings made here are the admin's; those the directory settings map are the
sync's, ``source: directory``). Every change clears the principal cache of this process.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.errors import InvalidInput, NotFound, WrongState
from dlts.models import Group, GroupMember, Role, RoleBinding, User, VirtualCluster
from dlts.repositories import vc_events
from dlts.services import admin, policy
from dlts.services.auth import Principal, forget_principals
from dlts.services.transaction import rowcount, transaction

VC_ROLES = {"member": Role.VC_MEMBER, "admin": Role.VC_ADMIN}
DIRECTORY = "directory"


@dataclass(frozen=True)
class GroupView:
    name: str
    source: str | None
    members: list[str]
    vcs: list[dict[str, str | None]]  # [{"vc", "role", "source"}]
    cluster_admin: bool


def get_group(session: Session, name: str) -> Group:
    group = session.scalar(sa.select(Group).where(Group.name == name))
    if group is None:
        raise NotFound(f"No group named {name[:64]!r}; create one with POST /api/v1/groups.", code="group_not_found")
    return group


def _views(session: Session, groups: list[Group]) -> list[GroupView]:
    ids = [g.id for g in groups]
    members: dict[int, list[str]] = {}
    bindings: dict[int, list[tuple[Role, str | None, str | None]]] = {}
    if ids:
        for gid, name in session.execute(sa.select(GroupMember.group_id, User.name).join(User, User.id == GroupMember.user_id)
                                         .where(GroupMember.group_id.in_(ids)).order_by(User.name)):
            members.setdefault(gid, []).append(name)
        for bound_group, role, vc_name, source in session.execute(
                sa.select(RoleBinding.group_id, RoleBinding.role, VirtualCluster.name, RoleBinding.source)
                .outerjoin(VirtualCluster, VirtualCluster.id == RoleBinding.vc_id).where(RoleBinding.group_id.in_(ids))):
            assert bound_group is not None  # bindings of these groups
            bindings.setdefault(bound_group, []).append((role, vc_name, source))
    out = []
    for g in groups:
        rows = bindings.get(g.id, [])
        roles_by_vc: dict[str, tuple[str, str | None]] = {}
        for role, vc, source in rows:
            if vc is None:
                continue
            name = "admin" if role is Role.VC_ADMIN else "member"
            if vc not in roles_by_vc or name == "admin":
                roles_by_vc[vc] = (name, source)
        out.append(GroupView(g.name, g.source, members.get(g.id, []),
                             [{"vc": vc, "role": r, "source": src} for vc, (r, src) in sorted(roles_by_vc.items())],
                             any(role is Role.CLUSTER_ADMIN for role, _, _ in rows)))
    return out


def list_groups(session: Session, principal: Principal, *, after_name: str | None = None, limit: int = 50) -> list[GroupView]:
    policy.require_cluster_admin(principal, "list groups")
    query = sa.select(Group).order_by(Group.name).limit(limit)
    if after_name is not None:
        query = query.where(Group.name > after_name)
    return _views(session, list(session.scalars(query)))


def get(session: Session, principal: Principal, name: str) -> GroupView:
    policy.require_cluster_admin(principal, "read groups")
    return _views(session, [get_group(session, name)])[0]


def create(session: Session, principal: Principal, name: str) -> GroupView:
    with transaction(session):
        policy.require_cluster_admin(principal, "create groups")
        check_name(name)
        if session.scalar(sa.select(Group.id).where(Group.name == name)) is not None:
            raise WrongState(f"Group {name!r} already exists.", code="group_exists")
        group = Group(name=name)
        session.add(group)
    return _views(session, [group])[0]


def check_name(name: str) -> None:
    if not isinstance(name, str) or not admin.NAME_RE.match(name):
        raise InvalidInput(f"Group name {str(name)[:70]!r} must start with a lowercase letter and use a-z, 0-9, '.', '_' "
                           "or '-' (at most 64).", details={"field": "name"})


def delete(session: Session, principal: Principal, name: str) -> None:
    """The group and its bindings go; its users lose what they held only through it."""
    with transaction(session):
        policy.require_cluster_admin(principal, "delete groups")
        group = get_group(session, name)
        for vc in session.scalars(sa.select(VirtualCluster.name).join(RoleBinding, RoleBinding.vc_id == VirtualCluster.id)
                                  .where(RoleBinding.group_id == group.id).distinct()):
            vc_events.record(session, vc, principal.name, "group", {"group": group.name}, None)
        session.execute(sa.delete(RoleBinding).where(RoleBinding.group_id == group.id))
        session.execute(sa.delete(GroupMember).where(GroupMember.group_id == group.id))
        session.delete(group)
    forget_principals()


def _require_hand_managed(group: Group) -> None:
    if group.source == DIRECTORY:
        raise WrongState(f"Group {group.name} comes from the directory; its members change there (the next "
                         "`dlts directory sync` would undo a change made here).", code="group_from_directory")


def add_user(session: Session, principal: Principal, name: str, user_name: str) -> tuple[GroupView, bool]:
    with transaction(session):
        policy.require_cluster_admin(principal, "change groups")
        group = get_group(session, name)
        user = admin.get_user(session, user_name)
        _require_hand_managed(group)
        exists = session.get(GroupMember, (group.id, user.id)) is not None
        if not exists:
            session.add(GroupMember(group_id=group.id, user_id=user.id))
    if not exists:
        forget_principals()
    return _views(session, [group])[0], not exists


def remove_user(session: Session, principal: Principal, name: str, user_name: str) -> GroupView:
    with transaction(session):
        policy.require_cluster_admin(principal, "change groups")
        group = get_group(session, name)
        user = admin.get_user(session, user_name)
        _require_hand_managed(group)
        row = session.get(GroupMember, (group.id, user.id))
        if row is None:
            raise NotFound(f"{user.name} is not in group {group.name}.", code="not_in_group")
        session.delete(row)
    forget_principals()
    return _views(session, [group])[0]


def bind(session: Session, group: Group, vc: VirtualCluster, role: str, actor: str, source: str | None = None) -> bool:
    """Bind ``group`` to ``role`` (member | admin) on ``vc`` (admin implies member); the caller commits.
    Returns whether anything changed."""
    wanted = {Role.VC_MEMBER} | ({Role.VC_ADMIN} if role == "admin" else set())
    rows = list(session.scalars(sa.select(RoleBinding).where(RoleBinding.group_id == group.id, RoleBinding.vc_id == vc.id)))
    current = {r.role for r in rows}
    if current == wanted and all(r.source == source for r in rows):
        return False
    for r in rows:
        if r.role not in wanted:
            session.delete(r)
        else:
            r.source = source
    for missing in wanted - current:
        session.add(RoleBinding(role=missing, group_id=group.id, vc_id=vc.id, source=source))
    if current != wanted:
        old = "admin" if Role.VC_ADMIN in current else ("member" if current else None)
        vc_events.record(session, vc.name, actor, "group", {"group": group.name, "role": old}, {"group": group.name, "role": role})
    return True


def unbind(session: Session, group: Group, vc: VirtualCluster, actor: str) -> bool:
    n = rowcount(session.execute(sa.delete(RoleBinding).where(RoleBinding.group_id == group.id, RoleBinding.vc_id == vc.id)))
    if n:
        vc_events.record(session, vc.name, actor, "group", {"group": group.name}, None)
    return bool(n)


def put_vc_role(session: Session, principal: Principal, name: str, vc_name: str, role: str) -> tuple[GroupView, bool]:
    with transaction(session):
        policy.require_cluster_admin(principal, "bind groups to VC roles")
        if role not in VC_ROLES:
            raise InvalidInput("role must be member or admin.", details={"field": "role"})
        group = get_group(session, name)
        vc = admin.get_vc(session, vc_name)
        changed = bind(session, group, vc, role, principal.name)
    if changed:
        forget_principals()
    return _views(session, [group])[0], changed


def delete_vc_role(session: Session, principal: Principal, name: str, vc_name: str) -> GroupView:
    with transaction(session):
        policy.require_cluster_admin(principal, "bind groups to VC roles")
        group = get_group(session, name)
        vc = admin.get_vc(session, vc_name)
        if not unbind(session, group, vc, principal.name):
            raise NotFound(f"Group {group.name} holds no role on VC {vc.name}.", code="binding_not_found")
    forget_principals()
    return _views(session, [group])[0]
