"""Fixtures for the insight tests: the test world with e-mail addresses (warnings go through the
real notifier's outbox), the shared in-process SMTP server, and helpers that put a job on the test
node's GPUs and have the node report on it (services.nodes / services.accounting, as the API does)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.smtp_server import smtp_server, with_notify  # noqa: F401  (fixtures and helpers)


@pytest.fixture
def world(world, sessions):
    """The shared world (tests/conftest.py) whose users have addresses: NAME@example.org."""
    from dlts.models import User

    with sessions() as s:
        for user in s.scalars(sa.select(User)):
            user.email = f"{user.name}@example.org"
        s.commit()
    return world
