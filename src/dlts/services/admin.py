"""Operator use-cases behind the CLI (and later the admin API): users, tokens, VCs, membership."""

from __future__ import annotations

import re
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.errors import InvalidInput, NotFound, WrongState
from dlts.models import Role, RoleBinding, User, VirtualCluster
from dlts.repositories import vc_events
from dlts.services.auth import forget_principals, issue_token

NAME_RE = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")


def _check_name(kind: str, name: str) -> None:
    if not NAME_RE.match(name):
        raise InvalidInput(f"{kind} name {name!r} must start with a lowercase letter and use a-z, 0-9, '.', '_' or '-' (at most 64).",
                           details={"field": "name"})


def get_user(session: Session, name: str) -> User:
    user = session.scalar(sa.select(User).where(User.name == name))
    if user is None:
        raise NotFound(f"No user named {name!r}; add one with `dlts user add {name}`.", code="user_not_found")
    return user


def get_vc(session: Session, name: str) -> VirtualCluster:
    vc = session.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == name))
    if vc is None:
        raise NotFound(f"No VC named {name!r}; add one with `dlts vc add {name}`.", code="vc_not_found")
    return vc


def _bind(session: Session, role: Role, user: User, vc: VirtualCluster | None) -> None:
    exists = session.scalar(sa.select(RoleBinding.id).where(
        RoleBinding.role == role, RoleBinding.user_id == user.id,
        RoleBinding.vc_id.is_(None) if vc is None else RoleBinding.vc_id == vc.id))
    if exists is None:
        session.add(RoleBinding(role=role, user_id=user.id, vc_id=vc.id if vc else None))
        forget_principals()


def add_user(session: Session, name: str, *, admin: bool = False, email: str | None = None) -> User:
    _check_name("User", name)
    if session.scalar(sa.select(User.id).where(User.name == name)) is not None:
        raise WrongState(f"User {name!r} already exists.", code="user_exists")
    user = User(name=name, email=email, preferences={})
    session.add(user)
    session.flush()
    if admin:
        _bind(session, Role.CLUSTER_ADMIN, user, None)
    session.commit()
    return user


def new_token(session: Session, name: str, token_name: str = "cli", expires_days: int | None = None) -> str:
    user = get_user(session, name)
    token = issue_token(session, user, token_name, expires_days)
    session.commit()
    return token


def parse_quota(items: list[str] | tuple[str, ...]) -> dict[str, int]:
    quota: dict[str, int] = {}
    for item in items:
        sku, sep, value = item.partition("=")
        if not sep or not sku or not value.isdigit():
            raise InvalidInput(f"quota {item!r} must look like SKU=GPUS, e.g. a100=64.", details={"field": "quota"})
        quota[sku] = int(value)
    return quota


def add_vc(session: Session, name: str, quota: dict[str, int], *, policy: str = "RF",
           cpu_quota: float | None = None, memory_quota_bytes: int | None = None) -> VirtualCluster:
    _check_name("VC", name)
    if policy not in ("RF", "FIFO"):
        raise InvalidInput("policy must be RF or FIFO.", details={"field": "policy"})
    if session.scalar(sa.select(VirtualCluster.id).where(VirtualCluster.name == name)) is not None:
        raise WrongState(f"VC {name!r} already exists.", code="vc_exists")
    vc = VirtualCluster(name=name, quota=quota, policy=policy, cpu_quota=cpu_quota,
                        memory_quota_bytes=memory_quota_bytes, pod_policy={}, storage={})
    session.add(vc)
    session.commit()
    return vc


@dataclass(frozen=True)
class VcSetResult:
    created: bool
    changes: tuple[str, ...]  # empty: the VC already was as asked


def set_vc(session: Session, name: str, quota: dict[str, int], *, policy: str | None = None,
           actor: str = "cli") -> VcSetResult:
    """Create VC ``name`` or bring it to ``quota`` (the whole quota: SKUs left out go to 0) and ``policy``
    (None: RF for a new VC, unchanged otherwise), for deployments that declare their VCs. Returns what
    changed; each change is recorded as a VC event by ``actor``."""
    _check_name("VC", name)
    if policy is not None and policy not in ("RF", "FIFO"):
        raise InvalidInput("policy must be RF or FIFO.", details={"field": "policy"})
    wanted = {sku: gpus for sku, gpus in sorted(quota.items()) if gpus}  # 0 and absent mean the same
    vc = session.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == name))
    if vc is None:
        session.add(VirtualCluster(name=name, quota=wanted, policy=policy or "RF", pod_policy={}, storage={}))
        vc_events.record(session, name, actor, "created", None, {"quota": wanted, "policy": policy or "RF"})
        session.commit()
        return VcSetResult(created=True, changes=(f"quota {wanted}, policy {policy or 'RF'}",))
    changes = []
    current = {sku: int(gpus) for sku, gpus in sorted((vc.quota or {}).items()) if gpus}
    if current != wanted:
        vc_events.record(session, name, actor, "quota", vc.quota, wanted)
        vc.quota = wanted
        changes.append(f"quota {current} -> {wanted}")
    if policy is not None and vc.policy != policy:
        vc_events.record(session, name, actor, "policy", vc.policy, policy)
        changes.append(f"policy {vc.policy} -> {policy}")
        vc.policy = policy
    session.commit()
    return VcSetResult(created=False, changes=tuple(changes))


def add_member(session: Session, vc_name: str, user_name: str, *, admin: bool = False) -> None:
    vc, user = get_vc(session, vc_name), get_user(session, user_name)
    _bind(session, Role.VC_MEMBER, user, vc)
    if admin:
        _bind(session, Role.VC_ADMIN, user, vc)
    session.commit()


def set_vc_lustre(session: Session, vc_name: str, settings: dict) -> dict:
    """Store a VC's Lustre settings (pool, OSTs, MDT, directory, project); the storage manager applies them."""
    from dlts_lustre.policy import PolicyError, policy_from_vcs

    vc = get_vc(session, vc_name)
    lustre = {k: v for k, v in settings.items() if v is not None}
    try:  # validate the VC's entry alone; filesystem-wide checks happen when the manager applies it
        policy_from_vcs([{"name": vc.name, **lustre}], {"filesystem": {"name": "check", "mount": "/check"}})
    except PolicyError as exc:
        raise InvalidInput(str(exc), code="invalid_lustre_settings", details={"field": "storage.lustre"}) from None
    vc.storage = {**(vc.storage or {}), "lustre": lustre}
    session.commit()
    return lustre
