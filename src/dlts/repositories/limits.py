"""Counters and locks that hold across API workers and processes, on SQLite and MariaDB alike.

``hit``: one more in a fixed-window counter (``rate_counters``), as one atomic upsert, so parallel
requests in any number of gunicorn workers each get a distinct count. ``lock``: hold one row of a
table until the caller's transaction ends, so a check-then-insert (a cap) cannot interleave with
another. Neither commits: the caller's service does.

The janitor deletes counters whose window began more than an hour ago, or more than the login
window (``login_limit_window_s``) when that is longer (``dlts managers``, ``counter_window_s``): a
counter with a longer window must raise that bound.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import cast

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, sqlite
from sqlalchemy.orm import InstrumentedAttribute, Session

from dlts.models import RateCounter

COUNTERS = cast(sa.Table, RateCounter.__table__)


@dataclass(frozen=True)
class Count:
    n: int  # this hit included
    window_start: dt.datetime

    def retry_after_s(self, window_s: float, now: dt.datetime) -> int:
        """Whole seconds until this window ends (at least 1)."""
        # a parallel request may have opened the window a moment after this one read its clock
        left = min(window_s, (self.window_start + dt.timedelta(seconds=window_s) - now).total_seconds())
        return max(1, int(left) + (0 if left == int(left) else 1))


def _dialect(session: Session) -> str:
    return session.get_bind().dialect.name


def hit(session: Session, key: str, window_s: float, now: dt.datetime, by: int = 1) -> Count:
    """Add ``by`` to ``key``'s counter (a window older than ``window_s`` starts again at ``now``) and
    return the count. The row stays locked until the caller's transaction ends."""
    table = COUNTERS
    cutoff = now - dt.timedelta(seconds=window_s)
    stmt: sa.Insert
    if _dialect(session) == "sqlite":
        old = table.c  # in SQLite's DO UPDATE, column names are the row's values before the update
        stmt = sqlite.insert(table).values(key=key, window_start=now, n=by).on_conflict_do_update(index_elements=[table.c.key], set_={
            "n": sa.case((old.window_start <= cutoff, by), else_=old.n + by),
            "window_start": sa.case((old.window_start <= cutoff, now), else_=old.window_start)})
    else:
        # MariaDB assigns left to right, later assignments seeing earlier ones: n first, while
        # window_start still holds the old value; window_start's own test reads only itself
        stmt = mysql.insert(table).values(key=key, window_start=now, n=by).on_duplicate_key_update([
            ("n", sa.case((table.c.window_start <= cutoff, by), else_=table.c.n + by)),
            ("window_start", sa.case((table.c.window_start <= cutoff, now), else_=table.c.window_start))])
    session.execute(stmt)
    n, start = session.execute(sa.select(table.c.n, table.c.window_start).where(table.c.key == key)).one()
    return Count(int(n), start)


def peek(session: Session, key: str, window_s: float, now: dt.datetime) -> Count | None:
    """The counter's current window without counting (None: nothing counted in it)."""
    table = COUNTERS
    row = session.execute(sa.select(table.c.n, table.c.window_start).where(table.c.key == key)).first()
    if row is None or row.window_start <= now - dt.timedelta(seconds=window_s):
        return None
    return Count(int(row.n), row.window_start)


def forget(session: Session, key: str) -> None:
    session.execute(sa.delete(COUNTERS).where(COUNTERS.c.key == key))


def give_back(session: Session, key: str, by: int = 1) -> None:
    """Undo ``by`` of the current window's count (never below 0)."""
    table = COUNTERS
    session.execute(sa.update(table).where(table.c.key == key, table.c.n >= by).values(n=table.c.n - by))


def purge(session: Session, prefix: str, before: dt.datetime, limit: int = 1000) -> int:
    """Delete counters named ``prefix...`` whose window began before ``before`` (at most ``limit`` rows)."""
    table = COUNTERS
    keys = list(session.scalars(sa.select(table.c.key).where(table.c.window_start < before,
                                                            table.c.key.startswith(prefix, autoescape=True)).limit(limit)))
    if keys:
        session.execute(sa.delete(table).where(table.c.key.in_(keys)))
    return len(keys)


def lock(session: Session, column: InstrumentedAttribute, ident: int, touch: InstrumentedAttribute) -> None:
    """Hold the row ``column == ident`` until the caller's transaction ends: parallel callers that lock
    the same row run one after the other, and each sees what the one before it committed.

    MariaDB: ``SELECT ... FOR UPDATE``. SQLite has no row locks and ignores FOR UPDATE, so a write that
    changes nothing (``touch = touch``) takes the database's write lock now; the reads that follow
    are then the latest, and no other writer commits before this transaction does."""
    if _dialect(session) == "sqlite":
        table = cast(sa.Table, column.class_.__table__)
        session.execute(sa.update(table).where(column == ident).values({touch.key: touch}))
    else:
        session.execute(sa.select(column).where(column == ident).with_for_update())
