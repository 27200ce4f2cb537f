"""The storage tests: the shared in-process SMTP server (tests/smtp_server.py) and a portal login."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa
from werkzeug.security import generate_password_hash

from tests.smtp_server import smtp_server  # noqa: F401  (fixture)

CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture
def as_user(app, world, sessions):
    """``as_user("bob")``: a Flask test client logged in through the portal's form."""
    from dlts.models import User

    def make(name: str):
        password = f"{name}-storage-pw-123"
        with sessions() as s:
            s.execute(sa.update(User).where(User.name == name)
                      .values(password_hash=generate_password_hash(password, method="scrypt:1024:8:1")))
            s.commit()
        client = app.test_client()
        token = CSRF_RE.search(client.get("/login").get_data(as_text=True)).group(1)
        response = client.post("/login", data={"username": name, "password": password, "csrf_token": token})
        assert response.status_code == 302, response.get_data(as_text=True)[:300]
        return client

    return make
