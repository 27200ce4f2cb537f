"""Portal login: passwords (scrypt via werkzeug), the login check and its rate limit, and the
server-side portal sessions.

Passwords are stored only as a scrypt hash in ``users.password_hash`` (NULL: this user cannot log in
with a password, only with API tokens). ``authenticate_password`` answers with one message for every
failure (unknown user, wrong password, no password, disabled) so that the login form does not tell
an attacker which user names exist.

The rate limit (``login``) counts every attempt per user name and per client address in a fixed
window, in the database (``repositories.limits``: one atomic upsert), *before* the password hash is
checked: parallel guesses through any number of API workers each take a distinct count, and those
over the limit never reach the hash. A successful login clears its user name's count and gives its
attempt back to the address. Limits and window are settings (``login_limit_per_user``,
``login_limit_per_ip``, ``login_limit_window_s``).

A portal session is a ``portal_sessions`` row; the browser's cookie holds only its random id (the
row holds the id's SHA-256). Logout deletes the row and a password change deletes all of the user's
rows, so a copied cookie stops working at once.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session
from werkzeug.security import check_password_hash, generate_password_hash

from dlts.errors import InvalidInput, RateLimited, Unauthenticated
from dlts.models import ApiToken, PortalSession, User, utcnow
from dlts.repositories import limits as limits_repo
from dlts.services.admin import get_user
from dlts.services.auth import Principal, principal_for
from dlts.services.transaction import best_effort_write, rowcount, step, transaction, transactional

MIN_PASSWORD_CHARS = 12
MAX_PASSWORD_CHARS = 256
# scrypt with N=2^15, r=8, p=1 (werkzeug's default): ~50 ms and 32 MiB per check
PASSWORD_METHOD = "scrypt"
# verified against when the user does not exist, so both paths cost the same time
_DUMMY_HASH = generate_password_hash("not-a-real-password-" + secrets.token_hex(8), method=PASSWORD_METHOD)
LOGIN_FAILED = "Wrong user name or password."


class TooManyAttempts(RateLimited):
    code = "too_many_login_attempts"


def check_password_strength(password: str) -> None:
    if len(password) < MIN_PASSWORD_CHARS:
        raise InvalidInput(f"The password must have at least {MIN_PASSWORD_CHARS} characters; it has {len(password)}.",
                           code="password_too_short", details={"field": "password"})
    if len(password) > MAX_PASSWORD_CHARS:
        raise InvalidInput(f"The password may have at most {MAX_PASSWORD_CHARS} characters.",
                           code="password_too_long", details={"field": "password"})


def random_password() -> str:
    """16 URL-safe characters (~95 bits): printed once by the demo and ``dlts user password``."""
    return secrets.token_urlsafe(12)


@transactional
def set_password(session: Session, user_name: str, password: str) -> User:
    check_password_strength(password)
    user = get_user(session, user_name)
    user.password_hash = generate_password_hash(password, method=PASSWORD_METHOD)
    end_sessions_of(session, user.id)  # whoever had the old password (or a cookie made with it) is out
    return user


def authenticate_password(session: Session, user_name: str, password: str) -> Principal:
    user = session.scalar(sa.select(User).where(User.name == user_name.strip())) if user_name else None
    if user is None or not user.password_hash:
        check_password_hash(_DUMMY_HASH, password)
        raise Unauthenticated(LOGIN_FAILED, code="login_failed")
    if not check_password_hash(user.password_hash, password) or user.disabled_at is not None:
        raise Unauthenticated(LOGIN_FAILED, code="login_failed")
    return principal_for(session, user)


@dataclass(frozen=True)
class LoginLimits:
    """Attempts allowed per user name and per client address in one window. Per address more: many
    people may share one address (a NAT, or a proxy in front of the API), and one of them mistyping
    must not lock out the others."""

    per_user: int = 5
    per_ip: int = 30
    window_s: float = 300.0


def login_keys(user_name: str, client_ip: str | None) -> tuple[str, str]:
    return f"login-user:{user_name.strip().lower()[:64]}", f"login-ip:{(client_ip or '-')[:100]}"


def login(session: Session, limits: LoginLimits, user_name: str, password: str, client_ip: str | None,
          now: dt.datetime | None = None) -> Principal:
    """Count the attempt, refuse it over a limit (TooManyAttempts, before any hash is computed), then
    check the password (Unauthenticated). Two transactions: the count is committed before the slow
    hash runs (and stays when the password is wrong); the reset of the counts after a good one."""
    now = now or utcnow()
    user_key, ip_key = login_keys(user_name, client_ip)
    with step(session):
        counts = [(limits_repo.hit(session, user_key, limits.window_s, now), limits.per_user),
                  (limits_repo.hit(session, ip_key, limits.window_s, now), limits.per_ip)]
        if counts[1][0].n == 1:  # a new window for this address: old counters go (bounded, indexed)
            limits_repo.purge(session, "login-", now - dt.timedelta(seconds=limits.window_s))
    over = [count.retry_after_s(limits.window_s, now) for count, limit in counts if count.n > limit]
    if over:
        retry_s = max(over)
        raise TooManyAttempts(f"Too many failed logins; wait {retry_s} s and try again.", retry_after_s=retry_s,
                              details={"limit_per_user": limits.per_user, "limit_per_ip": limits.per_ip,
                                       "window_s": limits.window_s})
    with step(session):
        who = authenticate_password(session, user_name, password)
        limits_repo.forget(session, user_key)
        limits_repo.give_back(session, ip_key)
    return who


# -- server-side portal sessions --------------------------------------------------------------------

SESSION_TOUCH_S = 60  # last_seen_at is written at most this often


def _session_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@transactional
def start_session(session: Session, principal: Principal, lifetime: dt.timedelta) -> str:
    """A new session for ``principal``; returns the id for the cookie (never stored in the clear)."""
    now = utcnow()
    token = secrets.token_urlsafe(32)
    session.execute(sa.delete(PortalSession).where(PortalSession.user_id == principal.user_id,
                                                   PortalSession.expires_at <= now))
    session.add(PortalSession(token_hash=_session_hash(token), user_id=principal.user_id, created_at=now,
                              expires_at=now + lifetime, last_seen_at=now))
    return token


def principal_for_session(session: Session, token: object) -> Principal | None:
    """The principal behind a session cookie's id; None when the session ended or expired, or the user
    is gone or disabled."""
    with transaction(session):
        if not isinstance(token, str) or not token or len(token) > 128:
            return None
        now = utcnow()
        row = session.execute(sa.select(PortalSession, User).join(User, User.id == PortalSession.user_id)
                              .where(PortalSession.token_hash == _session_hash(token))).first()
        if row is None:
            return None
        record, user = row
        if record.expires_at <= now or user.disabled_at is not None:
            return None
        touch = (now - record.last_seen_at).total_seconds() >= SESSION_TOUCH_S
    who = principal_for(session, user)
    if touch:  # after the read, on its own: a database that refuses writes still lets its users read
        best_effort_write(session, sa.update(PortalSession).where(PortalSession.id == record.id).values(last_seen_at=now))
    return who


@transactional
def end_session(session: Session, token: object) -> None:
    """Logout: this session's row goes; its cookie, wherever a copy is, no longer logs anybody in."""
    if isinstance(token, str) and token:
        session.execute(sa.delete(PortalSession).where(PortalSession.token_hash == _session_hash(token)))


def end_sessions_of(session: Session, user_id: int) -> int:
    """Every portal session of the user ends (a password change); the caller commits."""
    return rowcount(session.execute(sa.delete(PortalSession).where(PortalSession.user_id == user_id)))


# -- the user's own API tokens (the portal's "My API tokens" page; creating and revoking: services.tokens)

def list_tokens(session: Session, principal: Principal) -> list[ApiToken]:
    return list(session.scalars(sa.select(ApiToken).where(ApiToken.user_id == principal.user_id)
                                .order_by(ApiToken.revoked_at.is_not(None), ApiToken.id.desc())))


# -- portal preferences (users.preferences JSON) ----------------------------------------------------

PREFERENCE_KEYS = ("job_columns",)


@transactional
def save_preference(session: Session, principal: Principal, key: str, value: object) -> None:
    if key not in PREFERENCE_KEYS:
        raise InvalidInput(f"Unknown preference {key!r}.", details={"field": key})
    user = session.get_one(User, principal.user_id)
    # a new dict, so SQLAlchemy sees the JSON column change
    user.preferences = {**(user.preferences or {}), key: value}


def preferences(session: Session, principal: Principal) -> dict[str, Any]:
    """The portal preferences ``principal`` saved (``{}`` before the first)."""
    return dict(session.get_one(User, principal.user_id).preferences or {})
