"""A user's own API tokens (the portal's "My API tokens" page and /api/v1/me/tokens): list, create,
revoke. The plaintext is returned once at creation; only the SHA-256 is stored (services.auth)."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.errors import InvalidInput, NotFound, Refused
from dlts.models import ApiToken, User, iso, utcnow
from dlts.repositories import limits as limits_repo
from dlts.services.auth import Principal, forget_principals, issue_token
from dlts.services.transaction import transaction

MAX_TOKENS_PER_USER = 20


@dataclass(frozen=True)
class TokenView:
    id: int
    name: str
    prefix: str
    created_at: str | None
    expires_at: str | None
    last_used_at: str | None
    token: str | None = None  # only in the answer to a creation


def _view(row: ApiToken, token: str | None = None) -> TokenView:
    return TokenView(row.id, row.name, row.prefix, iso(row.created_at), iso(row.expires_at), iso(row.last_used_at), token)


def _live(user_id: int) -> sa.Select[ApiToken]:
    now = utcnow()
    return sa.select(ApiToken).where(ApiToken.user_id == user_id, ApiToken.revoked_at.is_(None),
                                     sa.or_(ApiToken.expires_at.is_(None), ApiToken.expires_at > now))


def list_tokens(session: Session, principal: Principal) -> list[TokenView]:
    """Tokens that still work (not revoked, not expired), oldest first."""
    return [_view(r) for r in session.scalars(_live(principal.user_id).order_by(ApiToken.id))]


def create_token(session: Session, principal: Principal, name: str, expires_days: int | None = None) -> TokenView:
    with transaction(session):
        if not name or len(name) > 64 or not name.isprintable():
            raise InvalidInput("name must be printable text of 1-64 characters.", details={"field": "name"})
        if expires_days is not None and not 1 <= expires_days <= 3650:
            raise InvalidInput("expires_days must be between 1 and 3650, or null for no expiry.", details={"field": "expires_days"})
        # one creation per user at a time, so parallel requests cannot all pass the count (any worker, both databases)
        limits_repo.lock(session, User.id, principal.user_id, touch=User.created_at)
        count = session.execute(sa.select(sa.func.count()).select_from(_live(principal.user_id).subquery())).scalar_one()
        if count >= MAX_TOKENS_PER_USER:
            raise Refused(f"You have {count} working tokens, the most allowed is {MAX_TOKENS_PER_USER}; revoke one first.",
                          code="too_many_tokens", details={"max": MAX_TOKENS_PER_USER})
        user = session.get_one(User, principal.user_id)
        token = issue_token(session, user, name, expires_days)
    row = session.execute(sa.select(ApiToken).where(ApiToken.user_id == principal.user_id)
                          .order_by(ApiToken.id.desc()).limit(1)).scalar_one()
    return _view(row, token)


def revoke_token(session: Session, principal: Principal, token_id: int) -> TokenView:
    with transaction(session):
        row = session.get(ApiToken, token_id)
        if row is None or row.user_id != principal.user_id or row.revoked_at is not None:
            raise NotFound(f"You have no working token with id {token_id}.", code="token_not_found")
        row.revoked_at = utcnow()
    forget_principals()
    return _view(row)
