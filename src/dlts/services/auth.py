"""Who is calling: API tokens (stored as SHA-256 only) and the principal with its roles."""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.errors import Unauthenticated
from dlts.models import ApiToken, GroupMember, Role, RoleBinding, User, VirtualCluster, utcnow

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
        sa.select(RoleBinding.role, VirtualCluster.name)
        .outerjoin(VirtualCluster, VirtualCluster.id == RoleBinding.vc_id)
        .where(sa.or_(RoleBinding.user_id == user.id, RoleBinding.group_id.in_(group_ids)))
    ).all()
    admin = False
    vc_roles: dict[str, set[Role]] = {}
    for role, vc_name in rows:
        if role is Role.CLUSTER_ADMIN:
            admin = True
        elif vc_name is not None:
            vc_roles.setdefault(vc_name, set()).add(role)
    return Principal(user.id, user.name, admin, {k: frozenset(v) for k, v in vc_roles.items()})


def authenticate_bearer(session: Session, header: str | None) -> Principal:
    if not header or not header.startswith("Bearer "):
        raise Unauthenticated("Send 'Authorization: Bearer <token>'. Create a token with `dlts user token NAME` or on the portal's My API tokens page.")
    token = header[len("Bearer ") :].strip()
    row = session.execute(
        sa.select(ApiToken, User).join(User, User.id == ApiToken.user_id).where(ApiToken.token_hash == hash_token(token))
    ).first()
    now = utcnow()
    if row is None:
        raise Unauthenticated("This token is not valid. Create a new one with `dlts user token NAME`.")
    token_row, user = row
    if token_row.revoked_at is not None or user.disabled_at is not None:
        raise Unauthenticated("This token was revoked. Create a new one.")
    if token_row.expires_at is not None and token_row.expires_at <= now:
        raise Unauthenticated("This token has expired. Create a new one.")
    # last-use stamps at most once a minute: no write per request
    if token_row.last_used_at is None or now - token_row.last_used_at > dt.timedelta(minutes=1):
        session.execute(sa.update(ApiToken).where(ApiToken.id == token_row.id).values(last_used_at=now))
        session.commit()
    return principal_for(session, user)
