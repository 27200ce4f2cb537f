"""Who is calling: API tokens (stored as SHA-256 only) and the principal with its roles."""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.errors import Unauthenticated
from dlts.models import ApiToken, GroupMember, Role, RoleBinding, User, VirtualCluster, utcnow
from dlts.services.transaction import best_effort_write, transaction

TOKEN_PREFIX = "dlts_"


def hash_token(token: str) -> str:
    # Tokens carry 256 random bits, so a fast hash is enough (no dictionary to attack).
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    user_id: int
    name: str
    is_cluster_admin: bool = False
    vc_roles: dict[str, frozenset[Role]] = field(default_factory=dict)
    vc_ids: dict[str, int] = field(default_factory=dict)  # id of each VC in vc_roles

    def is_vc_admin(self, vc: str) -> bool:
        return self.is_cluster_admin or Role.VC_ADMIN in self.vc_roles.get(vc, frozenset())

    def is_vc_member(self, vc: str) -> bool:
        return self.is_cluster_admin or bool(self.vc_roles.get(vc))

    @property
    def vcs(self) -> list[str]:
        return sorted(self.vc_roles)


def issue_token(session: Session, user: User, name: str = "default", expires_days: int | None = None) -> str:
    """Create a token for ``user``; the plaintext is returned once and never stored."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    expires = utcnow() + dt.timedelta(days=expires_days) if expires_days else None
    session.add(ApiToken(user_id=user.id, name=name, token_hash=hash_token(token), prefix=token[:12], expires_at=expires))
    return token


def principal_for(session: Session, user: User) -> Principal:
    group_ids = sa.select(GroupMember.group_id).where(GroupMember.user_id == user.id)
    rows = session.execute(
        sa.select(RoleBinding.role, VirtualCluster.name, VirtualCluster.id)
        .outerjoin(VirtualCluster, VirtualCluster.id == RoleBinding.vc_id)
        .where(sa.or_(RoleBinding.user_id == user.id, RoleBinding.group_id.in_(group_ids)))
    ).all()
    admin = False
    vc_roles: dict[str, set[Role]] = {}
    vc_ids: dict[str, int] = {}
    for role, vc_name, vc_id in rows:
        if role is Role.CLUSTER_ADMIN:
            admin = True
        elif vc_name is not None:
            vc_roles.setdefault(vc_name, set()).add(role)
            vc_ids[vc_name] = vc_id
    return Principal(user.id, user.name, admin, {k: frozenset(v) for k, v in vc_roles.items()}, vc_ids)


class PrincipalCache:
    """Token hash -> the principal it authenticated, kept ``ttl_s`` seconds in this process.

    A request then costs no database round trip for authentication (the token row, the user, the
    role bindings). Token revocations and new role bindings made through this process clear every
    cache at once (``forget_principals``; anything else that changes who a token is must call it
    too); those made by another API worker or the CLI take effect there within ``ttl_s`` (the
    ``auth_cache_s`` setting; 0 turns the cache off). Only tokens that authenticated are kept.
    """

    def __init__(self, ttl_s: float, *, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic):
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self._entries: dict[str, tuple[float, Principal, dt.datetime | None]] = {}
        self._lock = threading.Lock()
        _CACHES.add(self)

    def get(self, token_hash: str, now: dt.datetime) -> Principal | None:
        entry = self._entries.get(token_hash)
        if entry is None:
            return None
        fresh_until, who, expires_at = entry
        if self.clock() >= fresh_until or (expires_at is not None and expires_at <= now):
            with self._lock:
                self._entries.pop(token_hash, None)
            return None
        return who

    def put(self, token_hash: str, who: Principal, expires_at: dt.datetime | None) -> None:
        if self.ttl_s <= 0:
            return
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()  # bounded: a flood of distinct tokens cannot grow it
            self._entries[token_hash] = (self.clock() + self.ttl_s, who, expires_at)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


_CACHES: weakref.WeakSet[PrincipalCache] = weakref.WeakSet()


def forget_principals() -> None:
    """Tokens, users or roles changed: every cached principal in this process is looked up again."""
    for cache in list(_CACHES):
        cache.clear()


def authenticate_bearer(session: Session, header: str | None, cache: PrincipalCache | None = None) -> Principal:
    with transaction(session):
        if not header or not header.startswith("Bearer "):
            raise Unauthenticated("Send 'Authorization: Bearer <token>'. Create a token with `dlts user token NAME` or on "
                                  "the portal's My API tokens page.")
        token_hash = hash_token(header[len("Bearer ") :].strip())
        now = utcnow()
        if cache is not None and (who := cache.get(token_hash, now)) is not None:
            return who
        row = session.execute(
            sa.select(ApiToken, User).join(User, User.id == ApiToken.user_id).where(ApiToken.token_hash == token_hash)
        ).first()
        if row is None:
            raise Unauthenticated("This token is not valid. Create a new one with `dlts user token NAME`.")
        token_row, user = row
        if token_row.revoked_at is not None or user.disabled_at is not None:
            raise Unauthenticated("This token was revoked. Create a new one.")
        if token_row.expires_at is not None and token_row.expires_at <= now:
            raise Unauthenticated("This token has expired. Create a new one.")
        # last-use stamps at most once a minute: no write per request
        stamp = token_row.last_used_at is None or now - token_row.last_used_at > dt.timedelta(minutes=1)
    who = principal_for(session, user)
    if stamp:  # after the read, on its own: a database that refuses writes still lets its users read
        best_effort_write(session, sa.update(ApiToken).where(ApiToken.id == token_row.id).values(last_used_at=now))
    if cache is not None:
        cache.put(token_hash, who, token_row.expires_at)
    return who
