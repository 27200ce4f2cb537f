"""Portal login: passwords (scrypt via werkzeug), the login check, and the login rate limit.

Passwords are stored only as a scrypt hash in ``users.password_hash`` (NULL: this user cannot log in
with a password, only with API tokens). ``authenticate_password`` answers with one message for every
failure (unknown user, wrong password, no password, disabled) so that the login form does not tell
an attacker which user names exist.

The rate limit counts failed logins per user name (5) and per client address (30) in a 5-minute
sliding window. It lives in the process's memory: with N gunicorn workers an attacker gets at most N times the limit,
which still makes guessing a random 16-character password hopeless; a shared store would be needed
for an exact cluster-wide count.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session
from werkzeug.security import check_password_hash, generate_password_hash

from dlts.errors import DltsError, InvalidInput, Unauthenticated
from dlts.models import ApiToken, User
from dlts.services.admin import get_user
from dlts.services.auth import Principal, principal_for

MIN_PASSWORD_CHARS = 12
MAX_PASSWORD_CHARS = 256
# scrypt with N=2^15, r=8, p=1 (werkzeug's default): ~50 ms and 32 MiB per check
PASSWORD_METHOD = "scrypt"
# verified against when the user does not exist, so both paths cost the same time
_DUMMY_HASH = generate_password_hash("not-a-real-password-" + secrets.token_hex(8), method=PASSWORD_METHOD)
LOGIN_FAILED = "Wrong user name or password."


class TooManyAttempts(DltsError):
    code = "too_many_login_attempts"
    http_status = 429


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


def set_password(session: Session, user_name: str, password: str) -> User:
    check_password_strength(password)
    user = get_user(session, user_name)
    user.password_hash = generate_password_hash(password, method=PASSWORD_METHOD)
    session.commit()
    return user


def authenticate_password(session: Session, user_name: str, password: str) -> Principal:
    user = session.scalar(sa.select(User).where(User.name == user_name.strip())) if user_name else None
    if user is None or not user.password_hash:
        check_password_hash(_DUMMY_HASH, password)
        raise Unauthenticated(LOGIN_FAILED, code="login_failed")
    if not check_password_hash(user.password_hash, password) or user.disabled_at is not None:
        raise Unauthenticated(LOGIN_FAILED, code="login_failed")
    return principal_for(session, user)


def principal_for_session(session: Session, user_id: int) -> Principal | None:
    """The principal behind a portal session cookie; None when the user is gone or disabled."""
    user = session.get(User, user_id)
    if user is None or user.disabled_at is not None:
        return None
    return principal_for(session, user)


@dataclass(frozen=True)
class RateLimit:
    max_failures: int
    window_s: float = 300.0


# Per user name: guessing one account's password stops after 5 tries. Per client address, more: many
# people may share one address (a NAT, or a proxy in front of the API), and one of them mistyping
# must not lock out the others.
DEFAULT_LIMITS = {"user": RateLimit(5), "ip": RateLimit(30)}


class LoginLimiter:
    """Sliding-window count of failed logins per key: ``user:NAME`` and ``ip:ADDR``, each kind with its limit."""

    def __init__(self, limits: Mapping[str, RateLimit] | None = None, clock: Callable[[], float] = time.monotonic):
        self.limits = dict(limits or DEFAULT_LIMITS)
        self.clock = clock
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _limit(self, key: str) -> RateLimit:
        return self.limits[key.split(":", 1)[0]]

    def _recent(self, key: str, now: float) -> deque[float]:
        times = self._failures.setdefault(key, deque())
        window_s = self._limit(key).window_s
        while times and now - times[0] >= window_s:
            times.popleft()
        return times

    def check(self, *keys: str) -> None:
        """Raise TooManyAttempts while any key is over its limit, saying when to retry."""
        now = self.clock()
        with self._lock:
            waits = []
            for key in keys:
                times, limit = self._recent(key, now), self._limit(key)
                if len(times) >= limit.max_failures:
                    waits.append(limit.window_s - (now - times[-limit.max_failures]))
        if waits:
            retry_s = max(1, int(max(waits)) + 1)
            raise TooManyAttempts(f"Too many failed logins; wait {retry_s} s and try again.",
                                  details={"retry_after_s": retry_s})

    def failed(self, *keys: str) -> None:
        now = self.clock()
        with self._lock:
            for key in keys:
                self._recent(key, now).append(now)
            if len(self._failures) > 10000:  # forget idle keys so a scan cannot grow memory forever
                for key in [k for k, v in self._failures.items() if not v or now - v[-1] >= self._limit(k).window_s]:
                    del self._failures[key]

    def succeeded(self, user_key: str) -> None:
        with self._lock:
            self._failures.pop(user_key, None)


# -- the user's own API tokens (the portal's "My API tokens" page; creating and revoking: services.tokens)

def list_tokens(session: Session, principal: Principal) -> list[ApiToken]:
    return list(session.scalars(sa.select(ApiToken).where(ApiToken.user_id == principal.user_id)
                                .order_by(ApiToken.revoked_at.is_not(None), ApiToken.id.desc())))


# -- portal preferences (users.preferences JSON) ----------------------------------------------------

PREFERENCE_KEYS = ("job_columns",)


def save_preference(session: Session, principal: Principal, key: str, value: object) -> None:
    if key not in PREFERENCE_KEYS:
        raise InvalidInput(f"Unknown preference {key!r}.", details={"field": key})
    user = session.get_one(User, principal.user_id)
    # a new dict, so SQLAlchemy sees the JSON column change
    user.preferences = {**(user.preferences or {}), key: value}
    session.commit()
