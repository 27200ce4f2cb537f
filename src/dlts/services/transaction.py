"""The one unit of work: services open it, views and repositories never commit or roll back.

``transaction(session)`` commits when its block ends normally and rolls back when anything escapes it
(a ``DltsError`` refusal as much as a database error), so a refused request leaves no half-written
rows in the session for the page that shows the refusal. ``@transactional`` wraps a use-case whose
first argument is the session in one.

Blocks nest: only the outermost one commits or rolls back, so a use-case may call another and the
caller still decides (the insight manager's step for one job holds the pause it asks of
``services.jobs``, and a refusal rolls back that job's step only). Nothing else in the package calls
``commit()`` or ``rollback()`` (``tests/core/test_layers.py``): what must follow the commit (a reload,
a cache reset) comes after the use-case's ``with transaction(session):`` block.

The control loops (the job manager's tick, the managers' passes) own no transaction of their own: each
of their steps is a ``step(session)`` block, which commits when the step ends even if it only read
(the next step starts a new transaction, as the loop's rule wants: every step's rows are committed
before it acts on the cluster), and ``discard(session)`` ends a step whose compare-and-set lost its
race with a rollback instead.

Every outermost block tells ``dlts.db_faults`` how its writes went: a write refused by a full disk
or a read-only database, and the next write that is committed (``/readyz`` answers from that).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar, overload

import sqlalchemy as sa
from sqlalchemy.orm import Session, scoped_session

from dlts import db_faults

P = ParamSpec("P")
R = TypeVar("R")

DEPTH = "dlts_transaction_depth"
WROTE = "dlts_transaction_wrote"
DISCARD = "dlts_transaction_discard"

AnySession = Session | scoped_session[Session]


def _real(session: AnySession) -> Session:
    return session.registry() if isinstance(session, scoped_session) else session


@sa.event.listens_for(Session, "after_flush")
def _flushed(session: Session, _context: Any) -> None:
    session.info[WROTE] = True


@sa.event.listens_for(Session, "do_orm_execute")
def _executed(state: Any) -> None:
    if state.is_insert or state.is_update or state.is_delete:
        state.session.info[WROTE] = True


@sa.event.listens_for(Session, "after_commit")
@sa.event.listens_for(Session, "after_soft_rollback")
def _ended(session: Session, *_: Any) -> None:
    session.info.pop(WROTE, None)


def _has_writes(session: Session) -> bool:
    return bool(session.info.get(WROTE) or session.new or session.dirty or session.deleted)


def rowcount(result: sa.Result[*tuple[Any, ...]]) -> int:
    """The rows an UPDATE or DELETE matched (``Session.execute`` types every result as a plain ``Result``;
    a data-changing statement's is a ``CursorResult``, which counts them)."""
    if not isinstance(result, sa.CursorResult):
        raise TypeError(f"not the result of an UPDATE or DELETE: {result!r}")
    return result.rowcount


def commit_keeping_loaded(session: AnySession) -> None:
    """Commit without expiring the session's objects.

    For a write whose every column the caller set itself (no server-side defaults, no SQL UPDATE
    behind the ORM's back): the objects stay readable after the commit without a reload, which
    saves a round trip per request. Anything else must commit normally.
    """
    real = _real(session)
    saved = real.expire_on_commit
    real.expire_on_commit = False
    try:
        real.commit()
    finally:
        real.expire_on_commit = saved


def discard(session: AnySession) -> None:
    """End the outermost open block with a rollback instead of a commit (a control loop's step whose
    compare-and-set found the row changed: whatever the step wrote goes, and the loaded objects are
    expired so that the next step reads them again). The block ends normally; nothing is raised."""
    real = _real(session)
    if not real.info.get(DEPTH):
        raise RuntimeError("discard() outside a transaction block")
    real.info[DISCARD] = True


@contextlib.contextmanager
def transaction(session: AnySession, *, keep_loaded: bool = False, commit_reads: bool = False) -> Iterator[Session]:
    """Commit on success, roll back on any exception (re-raised); only the outermost block acts.

    ``keep_loaded``: commit without expiring the loaded objects (see ``commit_keeping_loaded``).
    A block that wrote nothing (or whose writes were already committed inside it) ends without a
    COMMIT, so a read-only use-case costs no extra round trip; ``commit_reads`` commits it all the
    same (see ``step``). A block ``discard`` was called in rolls back.
    """
    real = _real(session)
    depth = real.info.get(DEPTH, 0)
    real.info[DEPTH] = depth + 1
    try:
        yield real
        if depth == 0 and real.info.get(DISCARD):
            real.rollback()
        elif depth == 0 and (commit_reads or _has_writes(real)):
            wrote = _has_writes(real)
            if keep_loaded:
                commit_keeping_loaded(real)
            else:
                real.commit()  # a COMMIT that fails (a duplicate key at the flush) rolls back below
            if wrote:
                db_faults.observe_success(real)
    except BaseException as exc:
        if depth == 0:
            db_faults.observe_failure(real, exc)
            # a lost connection cannot roll back; the pool replaces it, and the first error is the one to tell
            with contextlib.suppress(sa.exc.DBAPIError):
                real.rollback()
        raise
    finally:
        real.info[DEPTH] = depth
        if depth == 0:
            real.info.pop(DISCARD, None)


def best_effort_write(session: AnySession, statement: sa.Executable) -> bool:
    """A small write a read may make and may lose (a last-use stamp), in a transaction of its own
    after the read's: refused by a full disk or a read-only database (``db_faults``) it is dropped
    and False returned, so the read still answers. Other errors pass on."""
    try:
        with transaction(session) as real:
            real.execute(statement)
    except sa.exc.DBAPIError as exc:
        if db_faults.write_fault(exc) is None:
            raise
        return False
    return True


def step(session: AnySession) -> contextlib.AbstractContextManager[Session]:
    """One step of a control loop (the job manager's tick, a manager's pass): a ``transaction`` that
    always ends its transaction, with a COMMIT even when the step only read, so that each step's
    writes are committed before the loop acts on the cluster and the next step reads afresh."""
    return transaction(session, commit_reads=True)


@overload
def transactional(fn: Callable[P, R], /) -> Callable[P, R]: ...


@overload
def transactional(*, keep_loaded: bool) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def transactional(fn: Callable[P, R] | None = None, /, *,
                  keep_loaded: bool = False) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Run the use-case ``fn(session, ...)`` in ``transaction(session)``: ``@transactional``, or
    ``@transactional(keep_loaded=True)`` for a use-case whose writes set every column themselves."""

    def wrap(use_case: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(use_case)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            session = args[0] if args else kwargs["session"]
            with transaction(session, keep_loaded=keep_loaded):  # type: ignore[arg-type]
                return use_case(*args, **kwargs)

        return run

    return wrap if fn is None else wrap(fn)
