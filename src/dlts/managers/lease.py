"""The managers' lease: exactly one ``dlts managers`` process acts, the others stand by.

The lease is one row of ``managers_lease`` (holder, fencing token, expiry on the database's clock).
Every ``poll_s`` (``lease_s``/6) each process runs ``Lease.keep``: the holder renews the row (a
guarded UPDATE: its holder and token, not yet expired), a standby takes it once it has expired
(the token grows by one). The row lasts ``lease_s - poll_s`` from each renewal, so a standby
polling every ``poll_s`` holds it within ``lease_s`` of the holder's last renewal when the holder
stops (kill -9) or hangs (SIGSTOP, a stuck pass: ``keep`` does not renew while a watched pass has
run longer than ``lease_s``).

Fencing, so that a holder that lost the lease (stopped, then resumed) stops acting before its
next write:

- ``fenced_sessions``: every commit of a managers session first runs the guarded UPDATE on the
  lease row *inside the same transaction* (``WHERE holder=? AND token=? AND expires_at > now``);
  when no row matches, ``LeaseLost`` is raised and the transaction is rolled back, so no state
  write of a process without the lease ever lands. The row lock it takes also orders the commit
  against a standby's take-over.
- ``FencedBackend``: every backend call first checks that the lease is held *with margin*: by the
  local monotonic clock, at most ``lease_s - poll_s - margin_s`` since the renewal that began
  latest, so a call starts only while the row still has ``margin_s`` (``lease_s``/3) to run.

A holder frozen *inside* a write transaction keeps that transaction's row locks. On MariaDB/MySQL
``bound_idle_write_transactions`` has the server end such a connection once its write transaction
has been idle ``lease_s`` (``idle_write_transaction_timeout``): the locks go, the frozen process's
writes are rolled back, and it meets a dead connection when it resumes. The fencing check is itself
a write (it counts ``fenced_commits``), so a holder frozen between the check and its COMMIT, whose
transaction holds the lease row's lock, is bounded too: the server counts a transaction whose only
UPDATE changed nothing as read-only and would leave its locks in place until ``wait_timeout``. SQLite locks the whole file
for a writer and has no such bound: a holder frozen mid-write stops every process until it resumes
or dies, so failover from a *hung* holder needs a server database (SQLite is for one host).

A backend call already under way when the holder is frozen may finish after a standby took over;
backend objects are named from (job id, attempt) and every launch is idempotent, so at worst it
creates what the new holder creates too, or an orphan its garbage collection removes
(docs/reliability.md says where this matters).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from dlts.models.lease import ManagersLease
from dlts.services import transaction

log = logging.getLogger(__name__)
NAME = "managers"


def bound_idle_write_transactions(engine: sa.engine.Engine, seconds: float) -> bool:
    """MariaDB/MySQL: every new connection of ``engine`` has the server kill it when a write
    transaction of it stays idle longer than ``seconds`` (rounded up, at least 1), so a frozen
    managers process cannot hold row locks past its lease. Connections already pooled are dropped.
    False (nothing done) on other databases."""
    if engine.dialect.name != "mysql":
        return False
    limit = max(1, math.ceil(seconds))

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"SET SESSION idle_write_transaction_timeout = {int(limit)}")
        finally:
            cursor.close()

    sa.event.listen(engine, "connect", on_connect)
    engine.dispose()
    return True


class LeaseLost(Exception):
    """This process does not hold the managers' lease (any more): it must not act."""


def db_now(session: Session) -> Any:
    """The database's clock as epoch seconds (a SQL expression), so that every process compares
    expiries on one clock whatever its own says."""
    if session.get_bind().dialect.name == "sqlite":
        return sa.literal_column("((julianday('now') - 2440587.5) * 86400.0)")
    return sa.func.unix_timestamp(sa.func.now(6))


def _matched(session: Session, statement: Any) -> int:
    """The rows an UPDATE matched (MySQL dialects count matched rows: SQLAlchemy sets FOUND_ROWS)."""
    return cast(CursorResult, session.execute(statement)).rowcount


class Lease:
    def __init__(self, sessions: Callable[[], Session], holder: str, lease_s: float, name: str = NAME,
                 monotonic: Callable[[], float] = time.monotonic):
        self.sessions = sessions  # unfenced: the lease's own reads and writes
        self.holder = holder
        self.lease_s = float(lease_s)
        self.name = name
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self.token: int | None = None
        self._valid_until = 0.0
        self._stalled = False

    @property
    def poll_s(self) -> float:
        return self.lease_s / 6

    @property
    def term_s(self) -> float:
        """How long the row lasts from a renewal (one poll short of lease_s)."""
        return self.lease_s - self.poll_s

    @property
    def margin_s(self) -> float:
        return self.lease_s / 3

    # -- state ------------------------------------------------------------------------------------
    def held(self) -> bool:
        with self._lock:
            return self.token is not None and self.monotonic() < self._valid_until

    def require(self, what: str) -> None:
        if not self.held():
            raise LeaseLost(f"{what}: {self.holder} does not hold the managers' lease")

    def _lose(self, why: str) -> None:
        with self._lock:
            token, self.token, self._valid_until = self.token, None, 0.0
        if token is not None:
            log.warning("lease %s: %s lost it (token %s): %s; stopped acting", self.name, self.holder, token, why)

    # -- keep: renew or take over -------------------------------------------------------------------
    def keep(self, stalled: bool = False) -> bool:
        """Renew the lease (holder) or take it when it has expired (standby); True when held.
        ``stalled``: a watched pass of this process hangs: neither renew nor take it."""
        if stalled:
            if not self._stalled:
                log.error("lease %s: a pass has run longer than lease_s (%g s); not renewing the lease", self.name,
                          self.lease_s)
            self._stalled = True
            return self.held()
        self._stalled = False
        started = self.monotonic()
        with self._lock:
            token = self.token
        with self.sessions() as session:
            now = db_now(session)
            row = ManagersLease
            if token is not None:
                with transaction.step(session):
                    renewed = _matched(session,
                        sa.update(row).where(row.name == self.name, row.holder == self.holder, row.token == token,
                                             row.expires_at > now)
                        .values(expires_at=now + self.term_s, renewed_at=now)
                        .execution_options(synchronize_session=False))
                if renewed == 1:
                    self._held_from(started, token)
                    return self.held()
                self._lose("it expired or another process took it")
            self._ensure_row(session)
            with transaction.step(session):
                taken = _matched(session,
                    sa.update(row).where(row.name == self.name, row.expires_at <= now)
                    .values(holder=self.holder, token=row.token + 1, expires_at=now + self.term_s, acquired_at=now,
                            renewed_at=now)
                    .execution_options(synchronize_session=False))
                if taken != 1:
                    return False
                new_token = int(session.scalar(sa.select(row.token).where(row.name == self.name)) or 0)
        self._held_from(started, new_token)
        log.warning("lease %s: %s holds it now (token %s)", self.name, self.holder, new_token)
        return self.held()

    def _held_from(self, started: float, token: int) -> None:
        with self._lock:
            self.token = token
            self._valid_until = started + self.term_s - self.margin_s

    def _ensure_row(self, session: Session) -> None:
        if session.get(ManagersLease, self.name) is not None:
            return
        try:
            with transaction.step(session):
                session.add(ManagersLease(name=self.name, holder="", token=0, expires_at=0.0, acquired_at=0.0,
                                          renewed_at=0.0))
        except IntegrityError:  # another process made it first (the step rolled back)
            pass

    def release(self) -> None:
        """On a clean stop: give the lease up at once, so that a standby takes over at its next poll."""
        with self._lock:
            token = self.token
        if token is None:
            return
        self._lose("released on shutdown")
        try:
            with self.sessions() as session:
                row = ManagersLease
                with transaction.step(session):
                    session.execute(sa.update(row).where(row.name == self.name, row.holder == self.holder,
                                                         row.token == token)
                                    .values(expires_at=0.0).execution_options(synchronize_session=False))
        except sa.exc.SQLAlchemyError as exc:  # the database is away: the lease simply runs out
            log.warning("lease %s: could not release it: %s", self.name, exc)

    # -- fencing ------------------------------------------------------------------------------------
    def check(self, session: Session) -> None:
        """The fencing check, in ``session``'s transaction: the lease is held (locally, with margin,
        and in the row: this holder, this token, not expired), else ``LeaseLost``."""
        self.require("a state write")
        with self._lock:
            token = self.token
        row = ManagersLease
        now = db_now(session)
        matched = _matched(session,
            sa.update(row).where(row.name == self.name, row.holder == self.holder, row.token == token,
                                 row.expires_at > now)
            # a real change: MariaDB/MySQL count a transaction whose only UPDATE changed nothing as
            # read-only, and idle_write_transaction_timeout would never free this row's lock from a
            # holder frozen between this check and its COMMIT (the standby could not take over)
            .values(fenced_commits=row.fenced_commits + 1).execution_options(synchronize_session=False))
        if matched != 1:
            self._lose("the lease row names another holder or token, or it expired")
            raise LeaseLost(f"a state write: {self.holder} no longer holds the managers' lease (token {token})")

    def fenced_sessions(self, sessions: sessionmaker) -> sessionmaker:
        """A session factory like ``sessions`` whose every commit runs ``check`` first."""
        fenced = sessionmaker(**sessions.kw)
        sa.event.listen(fenced, "before_commit", self.check)
        return fenced


class FencedBackend:
    """The cluster backend, each of whose calls is made only while the lease is held with margin."""

    def __init__(self, backend: Any, lease: Lease):
        self._backend = backend
        self._lease = lease

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._backend, name)
        if not callable(value):
            return value
        lease = self._lease

        def fenced(*args: Any, **kwargs: Any) -> Any:
            lease.require(f"backend.{name}")
            return value(*args, **kwargs)

        return fenced


class Watch:
    """When each watched pass (the job manager's tick, the repair pass) began, while it runs: one
    that has run longer than ``lease_s`` means this process hangs and must give the lease up."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic):
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._running: dict[str, float] = {}

    def begin(self, entry_id: str) -> None:
        with self._lock:
            self._running[entry_id] = self.monotonic()

    def end(self, entry_id: str) -> None:
        with self._lock:
            self._running.pop(entry_id, None)

    def stalled(self, limit_s: float) -> bool:
        now = self.monotonic()
        with self._lock:
            return any(now - began > limit_s for began in self._running.values())
