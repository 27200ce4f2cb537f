"""Portal fixtures: the shared ``world`` with passwords, and logged-in Flask test clients per role.

Hashing with scrypt is deliberately slow, so the test users' passwords are hashed once per session,
with cheap scrypt parameters, and written straight into ``users.password_hash`` of each test's fresh
database. The production parameters are exercised by ``test_passwords_cli_demo.py``.
"""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa
from werkzeug.security import generate_password_hash

from dlts.models import User

PASSWORDS = {name: f"{name}-correct-horse-9" for name in ("admin", "vcadmin", "alice", "bob", "carol")}
CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture(scope="session")
def password_hashes() -> dict[str, str]:
    # cheap scrypt parameters for the many test logins; production hashing is tested in test_passwords_cli_demo
    return {name: generate_password_hash(pw, method="scrypt:1024:8:1") for name, pw in PASSWORDS.items()}


@pytest.fixture
def portal_world(world, sessions, password_hashes):
    with sessions() as s:
        for name, pw_hash in password_hashes.items():
            s.execute(sa.update(User).where(User.name == name).values(password_hash=pw_hash))
        s.commit()
    return world


def csrf_of(html: str) -> str:
    match = CSRF_RE.search(html)
    assert match, "page has no CSRF token"
    return match.group(1)


class PortalClient:
    """A Flask test client that logs in through the form and sends the page's CSRF token on posts."""

    def __init__(self, client):
        self.client = client
        self.token: str | None = None

    def get(self, url: str, **kw):
        response = self.client.get(url, **kw)
        if response.mimetype == "text/html":
            match = CSRF_RE.search(response.get_data(as_text=True))
            if match:
                self.token = match.group(1)
        return response

    def post(self, url: str, data: dict | None = None, *, csrf: bool = True, **kw):
        data = dict(data or {})
        if csrf:
            if self.token is None:
                self.get("/login")
            data.setdefault("csrf_token", self.token)
        return self.client.post(url, data=data, **kw)

    def login(self, name: str, password: str | None = None):
        self.get("/login")
        return self.post("/login", {"username": name, "password": password or PASSWORDS[name]})


@pytest.fixture
def as_user(app, portal_world):
    """``as_user("alice")``: a test client logged in as alice (a fresh cookie jar each call)."""

    def make(name: str) -> PortalClient:
        portal = PortalClient(app.test_client())
        response = portal.login(name)
        assert response.status_code == 302, response.get_data(as_text=True)[:500]
        portal.get("/jobs")  # a CSRF token bound to the logged-in session
        return portal

    return make


@pytest.fixture
def anon(app, portal_world):
    """``anon()``: a test client that is not logged in."""
    return lambda: PortalClient(app.test_client())


@pytest.fixture
def passwords() -> dict[str, str]:
    return PASSWORDS
