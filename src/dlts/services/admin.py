"""Operator use-cases behind the CLI and the cluster-admin API: users (and their uid/gid), tokens, VCs
(quota, group, storage, scratch space), membership."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.errors import InvalidInput, NotFound, WrongState
from dlts.models import Role, RoleBinding, User, VirtualCluster
from dlts.repositories import vc_events
from dlts.services import vc_storage
from dlts.services.auth import forget_principals, issue_token
from dlts.services.transaction import transactional
from dlts.strict import is_whole_number

NAME_RE = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
# POSIX ids DLTS runs jobs as: below 1000 are the system's (root 0, daemon, disk, shadow, ...)
MIN_ID = 1000
MAX_ID = 2**31 - 1
MIN_EPHEMERAL_BYTES = 2**20
MAX_EPHEMERAL_BYTES = 2**50
MAX_ABUSE_LIMIT = 10_000_000


def check_id(field: str, value: Any) -> int | None:
    """A uid or gid DLTS may run jobs as (None: unset)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{field} must be a whole number between {MIN_ID} and {MAX_ID}.", details={"field": field})
    if value == 0:
        raise InvalidInput(f"{field} 0 is root's; jobs never run as root through a user's {field}. Use the user's own "
                           f"{field} (from the directory, `id NAME`).", code="root_id_refused", details={"field": field})
    if not MIN_ID <= value <= MAX_ID:
        raise InvalidInput(f"{field} {value} is outside {MIN_ID}..{MAX_ID}; ids below {MIN_ID} belong to the system.",
                           details={"field": field})
    return value


def check_ephemeral(field: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_EPHEMERAL_BYTES <= value <= MAX_EPHEMERAL_BYTES:
        raise InvalidInput(f"{field} must be bytes between {MIN_EPHEMERAL_BYTES} (1 MiB) and {MAX_EPHEMERAL_BYTES} "
                           "(1 PiB), or null for the cluster default.", details={"field": field})
    return value


def check_abuse_limit(key: str, value: Any) -> int | None:
    """A per-user abuse limit: a whole number (0: no limit), or None for the cluster's default."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ABUSE_LIMIT):
        raise InvalidInput(f"{key} must be a whole number between 0 (no limit) and {MAX_ABUSE_LIMIT}, or null for the "
                           "cluster's default.", details={"field": key})
    return value


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


def _check_identity(session: Session, name: str, uid: int | None, gid: int | None, user_id: int | None = None) -> None:
    check_id("uid", uid)
    check_id("gid", gid)
    if (uid is None) != (gid is None):
        raise InvalidInput(f"Give user {name} both a uid and a gid (jobs run as uid:gid), or neither.",
                           details={"field": "gid" if gid is None else "uid"})
    if uid is not None:
        holder = session.scalar(sa.select(User.name).where(User.uid == uid, User.id != (user_id or 0)))
        if holder is not None:
            raise WrongState(f"uid {uid} already belongs to user {holder}; a uid names one person.", code="uid_taken",
                             details={"field": "uid", "user": holder})


@transactional
def add_user(session: Session, name: str, *, admin: bool = False, email: str | None = None,
             uid: int | None = None, gid: int | None = None) -> User:
    _check_name("User", name)
    if session.scalar(sa.select(User.id).where(User.name == name)) is not None:
        raise WrongState(f"User {name!r} already exists.", code="user_exists")
    _check_identity(session, name, uid, gid)
    user = User(name=name, email=email, preferences={}, uid=uid, gid=gid)
    session.add(user)
    session.flush()
    if admin:
        _bind(session, Role.CLUSTER_ADMIN, user, None)
    return user


USER_FIELDS = ("uid", "gid")


@dataclass(frozen=True)
class UserView:
    name: str
    email: str | None
    uid: int | None
    gid: int | None


@transactional
def set_user(session: Session, name: str, changes: Mapping[str, Any]) -> tuple[UserView, tuple[str, ...]]:
    """Change ``uid``/``gid`` of user ``name`` (only the keys present; both end up set or both unset).
    Returns the user and what changed (empty: it already was so)."""
    unknown = sorted(set(changes) - set(USER_FIELDS))
    if unknown:
        raise InvalidInput(f"unknown user setting {unknown[0][:40]!r}; settable: {', '.join(USER_FIELDS)}.",
                           details={"field": unknown[0][:40]})
    if not changes:
        raise InvalidInput("Send uid and/or gid.", details={"field": "body"})
    user = get_user(session, name)
    uid = changes.get("uid", user.uid)
    gid = changes.get("gid", user.gid)
    _check_identity(session, name, uid, gid, user.id)
    said = tuple(f"{key} {getattr(user, key)} -> {value}" for key, value in (("uid", uid), ("gid", gid))
                 if getattr(user, key) != value)
    user.uid, user.gid = uid, gid
    return UserView(user.name, user.email, user.uid, user.gid), said


@transactional
def new_token(session: Session, name: str, token_name: str = "cli", expires_days: int | None = None) -> str:
    user = get_user(session, name)
    token = issue_token(session, user, token_name, expires_days)
    return token


def parse_quota(items: list[str] | tuple[str, ...]) -> dict[str, int]:
    quota: dict[str, int] = {}
    for item in items:
        sku, sep, value = item.partition("=")
        if not sep or not sku or not is_whole_number(value):
            raise InvalidInput(f"quota {item!r} must look like SKU=GPUS, e.g. a100=64.", details={"field": "quota"})
        quota[sku] = int(value)
    return quota


@transactional
def add_vc(session: Session, name: str, quota: dict[str, int], *, policy: str = "RF",
           cpu_quota: float | None = None, memory_quota_bytes: int | None = None) -> VirtualCluster:
    _check_name("VC", name)
    if policy not in ("RF", "FIFO", "backfill"):
        raise InvalidInput("policy must be RF, FIFO or backfill.", details={"field": "policy"})
    if session.scalar(sa.select(VirtualCluster.id).where(VirtualCluster.name == name)) is not None:
        raise WrongState(f"VC {name!r} already exists.", code="vc_exists")
    vc = VirtualCluster(name=name, quota=quota, policy=policy, cpu_quota=cpu_quota,
                        memory_quota_bytes=memory_quota_bytes, pod_policy={}, storage={})
    session.add(vc)
    return vc


@dataclass(frozen=True)
class VcSetResult:
    created: bool
    changes: tuple[str, ...]  # empty: the VC already was as asked


UNSET: Any = object()  # set_vc: leave this setting as it is


@transactional
def set_vc(session: Session, name: str, quota: dict[str, int], *, policy: str | None = None,
           gid: int | None = UNSET, ephemeral_storage_bytes: int | None = UNSET,
           max_queued_jobs_per_user: int | None = UNSET, max_submissions_per_minute: int | None = UNSET,
           actor: str = "cli") -> VcSetResult:
    """Create VC ``name`` or bring it to ``quota`` (the whole quota: SKUs left out go to 0) and ``policy``
    (None: RF for a new VC, unchanged otherwise), for deployments that declare their VCs; ``gid``,
    ``ephemeral_storage_bytes`` and the abuse limits ``max_queued_jobs_per_user`` and
    ``max_submissions_per_minute`` change only when given (None clears them: the cluster default). Returns what changed; each
    change is recorded as a VC event by ``actor``."""
    _check_name("VC", name)
    if policy is not None and policy not in ("RF", "FIFO", "backfill"):
        raise InvalidInput("policy must be RF, FIFO or backfill.", details={"field": "policy"})
    extra = {}
    if gid is not UNSET:
        extra["gid"] = check_id("gid", gid)
    if ephemeral_storage_bytes is not UNSET:
        extra["ephemeral_storage_bytes"] = check_ephemeral("ephemeral_storage_bytes", ephemeral_storage_bytes)
    for key, value in (("max_queued_jobs_per_user", max_queued_jobs_per_user),
                       ("max_submissions_per_minute", max_submissions_per_minute)):
        if value is not UNSET:
            extra[key] = check_abuse_limit(key, value)
    wanted = {sku: gpus for sku, gpus in sorted(quota.items()) if gpus}  # 0 and absent mean the same
    vc = session.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == name))
    if vc is None:
        session.add(VirtualCluster(name=name, quota=wanted, policy=policy or "RF", pod_policy={}, storage={}, **extra))
        vc_events.record(session, name, actor, "created", None, {"quota": wanted, "policy": policy or "RF", **extra})
        return VcSetResult(created=True, changes=(", ".join([f"quota {wanted}", f"policy {policy or 'RF'}"]
                                                            + [f"{k} {v}" for k, v in extra.items()]),))
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
    for key, value in extra.items():
        if getattr(vc, key) != value:
            vc_events.record(session, name, actor, key, getattr(vc, key), value)
            changes.append(f"{key} {getattr(vc, key)} -> {value}")
            setattr(vc, key, value)
    return VcSetResult(created=False, changes=tuple(changes))


@transactional
def add_member(session: Session, vc_name: str, user_name: str, *, admin: bool = False) -> None:
    vc, user = get_vc(session, vc_name), get_user(session, user_name)
    _bind(session, Role.VC_MEMBER, user, vc)
    if admin:
        _bind(session, Role.VC_ADMIN, user, vc)


def set_vc_lustre(session: Session, vc_name: str, settings: dict[str, Any], actor: str = "cli") -> dict[str, Any]:
    """Store a VC's Lustre settings (pool, OSTs, MDT, directory, project); the storage manager applies them.
    The rest of the VC's storage document is kept."""
    vc = get_vc(session, vc_name)
    lustre = vc_storage.check_lustre(vc.name, settings)
    replace_vc_storage(session, vc, {**(vc.storage or {}), "lustre": lustre}, actor)
    return lustre


@transactional
def replace_vc_storage(session: Session, vc: VirtualCluster, document: Any, actor: str) -> bool:
    """Make ``document`` (checked by ``services.vc_storage``) the VC's storage document, recorded as a VC
    event; returns False when it already was (nothing written). A document without a ``lustre`` key
    keeps the VC's Lustre settings (``dlts vc lustre`` owns them), so seeding the mounts from an
    inventory never undoes what an admin set for Lustre."""
    current = vc.storage or {}
    if isinstance(document, dict) and "lustre" not in document and "lustre" in current:
        document = {**document, "lustre": current["lustre"]}
    stored = vc_storage.normalize(vc.name, document)
    if stored == current:
        return False
    vc_events.record(session, vc.name, actor, "storage", current, stored)
    vc.storage = stored
    return True
