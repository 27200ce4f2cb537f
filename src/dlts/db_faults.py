"""Database writes refused while reads still work: a full disk under SQLite, a read-only MariaDB.

``write_fault(exc)`` recognises such an error (SQLite's ``SQLITE_FULL``/``SQLITE_READONLY``/
``SQLITE_IOERR``, MariaDB's disk-full and read-only errors) and says which it is; anything else
(a lost connection, a lock timeout, a bad statement) is not one.

``WriteHealth`` is what this process last saw of its writes to one database (one per engine,
``health_of``): ``services.transaction`` records every failed and every committed write, so
``/readyz`` answers not ready with the cause from the first refused write until one goes through
again (``services.cluster.probe_writes`` tries one while it is failing).

``FaultLog`` keeps a loop (the job manager's tick, a manager's pass) to one line when its writes
start being refused and one when they work again, instead of a traceback per pass.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DISK_FULL = "disk_full"
READ_ONLY = "read_only"
IO_ERROR = "io_error"

# MariaDB/MySQL server error codes (the first argument of PyMySQL's errors)
_MYSQL = {
    3: DISK_FULL,  # ER_ERROR_ON_WRITE (errno 28 in the message)
    1021: DISK_FULL,  # ER_DISK_FULL
    1114: DISK_FULL,  # ER_RECORD_FILE_FULL: the table is full
    1036: READ_ONLY,  # ER_OPEN_AS_READONLY
    1290: READ_ONLY,  # ER_OPTION_PREVENTS_STATEMENT: --read-only
    1792: READ_ONLY,  # ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
    1836: READ_ONLY,  # ER_READ_ONLY_MODE
}
_SQLITE = (("SQLITE_FULL", DISK_FULL), ("SQLITE_READONLY", READ_ONLY), ("SQLITE_IOERR", IO_ERROR))
WORDS = {DISK_FULL: "its disk is full", READ_ONLY: "it is read-only", IO_ERROR: "its disk fails to write"}


@dataclass(frozen=True)
class WriteFault:
    kind: str  # DISK_FULL | READ_ONLY | IO_ERROR
    message: str  # the database's own words

    @property
    def words(self) -> str:
        return f"{WORDS[self.kind]} ({self.message})"


def write_fault(exc: BaseException) -> WriteFault | None:
    """The write fault ``exc`` (a SQLAlchemy error or the driver's own) reports, or None."""
    orig: Any = getattr(exc, "orig", None) or exc
    name = getattr(orig, "sqlite_errorname", None)
    if isinstance(name, str):
        for prefix, kind in _SQLITE:
            if name == prefix or name.startswith(prefix + "_"):
                return WriteFault(kind, str(orig))
        return None
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int) and args[0] in _MYSQL:
        message = str(args[1]) if len(args) > 1 else str(orig)
        if args[0] == 3 and "28" not in message:
            return None  # a write error that is not ENOSPC
        return WriteFault(_MYSQL[args[0]], message)
    return None


class WriteHealth:
    """This process's last word on writes to one database: the fault, or none."""

    PROBE_EVERY_S = 2.0  # while failing, /readyz tries a write at most this often

    def __init__(self, monotonic=time.monotonic) -> None:
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self.fault: WriteFault | None = None
        self._probed_at = 0.0

    def failed(self, fault: WriteFault) -> None:
        with self._lock:
            self.fault = fault

    def succeeded(self) -> None:
        with self._lock:
            self.fault = None

    def probe_due(self) -> bool:
        """While failing: whether it is time to try a write again (and the try is taken now)."""
        with self._lock:
            if self.fault is None:
                return False
            now = self.monotonic()
            if now - self._probed_at < self.PROBE_EVERY_S:
                return False
            self._probed_at = now
            return True


_HEALTH: weakref.WeakKeyDictionary[Any, WriteHealth] = weakref.WeakKeyDictionary()
_HEALTH_LOCK = threading.Lock()


def health_of(engine: Any) -> WriteHealth:
    with _HEALTH_LOCK:
        health = _HEALTH.get(engine)
        if health is None:
            health = _HEALTH[engine] = WriteHealth()
        return health


def _engine(session: Any) -> Any:
    try:
        bind = session.get_bind()
    except Exception:  # noqa: BLE001 - an unbound session records nothing
        return None
    return getattr(bind, "engine", bind)


def observe_failure(session: Any, exc: BaseException) -> WriteFault | None:
    """Record a refused write of the session's database; the fault, or None for other errors."""
    fault = write_fault(exc)
    if fault is not None and (engine := _engine(session)) is not None:
        health_of(engine).failed(fault)
    return fault


def observe_success(session: Any) -> None:
    """A write of the session's database was committed."""
    engine = _engine(session)
    if engine is not None:
        with _HEALTH_LOCK:
            health = _HEALTH.get(engine)
        if health is not None and health.fault is not None:
            health.succeeded()


def refusing() -> WriteFault | None:
    """A fault this process's last writes to any of its databases met (one database: its fault)."""
    with _HEALTH_LOCK:
        healths = list(_HEALTH.values())
    return next((h.fault for h in healths if h.fault is not None), None)


class FaultLog:
    """One log line when ``what``'s writes start being refused, one when they go through again:
    ``succeeded`` after a pass that raised nothing, which says so only once a write of this process
    was committed since (a pass that only read proves nothing)."""

    def __init__(self, what: str, logger: logging.Logger, monotonic=time.monotonic) -> None:
        self.what, self.log, self.monotonic = what, logger, monotonic
        self.fault: WriteFault | None = None
        self._since = 0.0

    def failed(self, fault: WriteFault) -> None:
        if self.fault is None:
            self._since = self.monotonic()
            self.log.error("%s: the database refuses writes, %s; retrying quietly until it accepts them",
                           self.what, fault.words)
        self.fault = fault

    def succeeded(self, engine: Any = None) -> None:
        """``engine``: the database the pass wrote to (default: any of this process's)."""
        still = refusing() if engine is None else health_of(engine).fault
        if self.fault is not None and still is None:
            self.log.warning("%s: the database accepts writes again (refused for %.0f s)", self.what,
                             self.monotonic() - self._since)
            self.fault = None

    def run(self, step: Callable[[], object]) -> None:
        """One pass of ``what``: a write the database refuses is a line (``failed``, once until it
        accepts them again), any other failure a logged traceback; either way the next pass retries."""
        try:
            step()
        except Exception as exc:  # one failing pass must not stop the loop
            fault = write_fault(exc)
            if fault is None:
                self.log.exception("%s failed; the next pass retries", self.what)
            else:
                self.failed(fault)
        else:
            self.succeeded()
