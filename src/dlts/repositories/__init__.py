"""Queries and writes shared by the services, the job manager and the portal."""

from __future__ import annotations

from sqlalchemy.orm import Session, scoped_session


def commit_keeping_loaded(session: Session | scoped_session) -> None:
    """Commit without expiring the session's objects.

    For a write whose every column the caller set itself (no server-side defaults, no SQL UPDATE
    behind the ORM's back): the objects stay readable after the commit without a reload, which
    saves a round trip per request. Anything else must commit normally.
    """
    real = session.registry() if isinstance(session, scoped_session) else session
    saved = real.expire_on_commit
    real.expire_on_commit = False
    try:
        real.commit()
    finally:
        real.expire_on_commit = saved
