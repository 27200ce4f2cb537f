"""The managers' lease (dlts.managers.lease): one holder at a time, take-over after expiry, and the
fencing that stops a holder that lost it before its next state write or backend call."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from dlts.config import load_settings
from dlts.jobmanager import JobManager
from dlts.managers.lease import FencedBackend, Lease, LeaseLost, Watch
from dlts.models import Job, JobStatus, ManagersLease, User
from dlts.services import jobs as job_service
from dlts.services.auth import principal_for


class Clock:
    """A monotonic clock the test moves (the lease's local view of time)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def expire(sessions, seconds_ago: float = 1.0) -> None:
    """What the passing of lease_s does to the row: its expiry is in the database's past."""
    with sessions() as s:
        now = s.scalar(sa.select(sa.func.unix_timestamp(sa.func.now(6))) if s.get_bind().dialect.name != "sqlite"
                       else sa.text("SELECT (julianday('now') - 2440587.5) * 86400.0"))
        s.execute(sa.update(ManagersLease).values(expires_at=float(now) - seconds_ago))
        s.commit()


def row(sessions) -> ManagersLease:
    with sessions() as s:
        r = s.get(ManagersLease, "managers")
        s.expunge(r)
        return r


@pytest.fixture
def pair(sessions):
    return (Lease(sessions, "ctl-a:1", 15.0, monotonic=Clock()), Lease(sessions, "ctl-b:2", 15.0, monotonic=Clock()))


def test_one_process_holds_the_lease_the_other_takes_it_only_after_it_expired(sessions, pair):
    a, b = pair
    assert a.keep() and a.token == 1
    assert not b.keep() and not b.held()
    assert a.keep() and not b.keep()  # renewed: still a's
    assert (row(sessions).holder, row(sessions).token) == ("ctl-a:1", 1)
    expire(sessions)  # a stopped renewing (kill -9, SIGSTOP) and lease_s went by
    assert b.keep() and b.token == 2
    assert (row(sessions).holder, row(sessions).token) == ("ctl-b:2", 2)
    assert not a.keep() and not a.held()  # a, back, finds it taken and stands by
    assert b.keep()


def test_a_holder_that_lost_the_lease_cannot_commit_a_state_write(sessions, pair, world):
    a, b = pair
    a.keep()
    with sessions() as s:
        job_id = job_service.submit(s, load_settings(environ={}), principal_for(
            s, s.scalar(sa.select(User).where(User.name == "alice"))),
            job_service.JobRequest(vc="vision", image="debian:12", command="true")).id
    expire(sessions)
    b.keep()
    # a was frozen: by its own clock it still holds the lease; the row says otherwise
    assert a.held()
    fenced = a.fenced_sessions(sessions)
    with fenced() as s:
        s.execute(sa.update(Job).where(Job.id == job_id).values(status=JobStatus.SCHEDULING))
        with pytest.raises(LeaseLost):
            s.commit()
        s.rollback()
    assert not a.held()
    with sessions() as s:
        assert s.get(Job, job_id).status is JobStatus.QUEUED  # nothing of a's transaction landed
    # b's own writes go through its fence
    with b.fenced_sessions(sessions)() as s:
        s.execute(sa.update(Job).where(Job.id == job_id).values(name="by-b"))
        s.commit()
    with sessions() as s:
        assert s.get(Job, job_id).name == "by-b"


def test_backend_calls_and_writes_stop_once_the_lease_has_less_than_its_margin_left(sessions):
    clock = Clock()
    lease = Lease(sessions, "ctl-a:1", 15.0, monotonic=clock)
    calls = []

    class Backend:
        name = "test"

        def terminate(self, job_id, attempt, grace_s):
            calls.append((job_id, attempt))

    backend = FencedBackend(Backend(), lease)
    with pytest.raises(LeaseLost):
        backend.terminate(1, 1, 0)  # never held: a standby calls nothing
    lease.keep()
    assert backend.name == "test"
    backend.terminate(1, 1, 0)
    # the row lasts term_s (12.5 s) from the renewal; a call may start until margin_s (5 s) before that
    clock.now += lease.term_s - lease.margin_s - 0.01
    backend.terminate(2, 1, 0)
    clock.now += 0.02
    with pytest.raises(LeaseLost):
        backend.terminate(3, 1, 0)
    with lease.fenced_sessions(sessions)() as s, pytest.raises(LeaseLost):
        s.commit()
    assert calls == [(1, 1), (2, 1)]
    assert lease.keep()  # renewed (the row had not expired): it acts again
    backend.terminate(4, 1, 0)


def test_a_job_manager_tick_without_the_lease_launches_nothing_and_writes_nothing(sessions, settings, world, pair):
    a, b = pair
    a.keep()
    with sessions() as s:
        alice = principal_for(s, s.scalar(sa.select(User).where(User.name == "alice")))
        job_id = job_service.submit(s, settings, alice, job_service.JobRequest(vc="vision", image="debian:12",
                                                                               command="true", gpus=1)).id
    calls = []

    class Recording:
        name = "local"

        def __getattr__(self, name):
            def call(*args, **kwargs):
                calls.append(name)
                return []
            return call

    expire(sessions)
    b.keep()
    manager = JobManager(a.fenced_sessions(sessions), FencedBackend(Recording(), a), settings)
    with pytest.raises(LeaseLost):
        manager.tick()  # a still believes it holds the lease: the first commit finds out
    with pytest.raises(LeaseLost):
        manager.tick()  # and from then on nothing is even called
    assert calls == ["nodes"]  # the one read before the first commit; nothing launched
    with sessions() as s:
        assert s.get(Job, job_id).status is JobStatus.QUEUED and s.get(Job, job_id).attempt == 0


def test_a_released_lease_is_taken_at_the_next_poll(sessions, pair):
    a, b = pair
    a.keep()
    a.release()
    assert not a.held()
    assert b.keep() and b.token == 2


def test_a_hanging_pass_stops_the_renewals():
    clock = Clock()
    watch = Watch(monotonic=clock)
    watch.begin("jobmanager.tick")
    clock.now += 14
    assert not watch.stalled(15.0)
    clock.now += 2
    assert watch.stalled(15.0)
    watch.end("jobmanager.tick")
    assert not watch.stalled(15.0)


def test_a_stalled_holder_does_not_renew(sessions):
    clock = Clock()
    lease = Lease(sessions, "ctl-a:1", 15.0, monotonic=clock)
    lease.keep()
    before = row(sessions).renewed_at
    assert lease.keep(stalled=True)  # still within its time, but not renewed
    assert row(sessions).renewed_at == before
    clock.now += lease.term_s
    assert not lease.keep(stalled=True)


def test_lease_settings_come_from_the_config_file(tmp_path):
    import os
    import socket

    path = tmp_path / "dlts.yaml"
    path.write_text("lease_s: 6\nlease_holder: ctl-1\n")
    settings = load_settings(path, environ={})
    assert (settings.lease_s, settings.effective_lease_holder) == (6.0, "ctl-1")
    assert load_settings(environ={}).effective_lease_holder == f"{socket.gethostname()}:{os.getpid()}"
    path.write_text("lease_s: 0.5\n")
    with pytest.raises(Exception, match="lease_s"):
        load_settings(path, environ={})


def test_on_mariadb_a_holder_frozen_inside_a_write_transaction_loses_its_locks_and_its_writes(settings, sessions):
    """What ``dlts managers`` sets on its engine: a connection whose write transaction stays idle
    (its process SIGSTOPped between two statements) is ended by the server, so a standby's writes
    to the same rows go through and the frozen process's uncommitted writes are rolled back."""
    import time

    from dlts.app import engine_options
    from dlts.managers.lease import bound_idle_write_transactions

    url = settings.database_url
    frozen_engine = sa.create_engine(url, **engine_options(url))
    if frozen_engine.dialect.name != "mysql":
        assert not bound_idle_write_transactions(frozen_engine, 1.0)  # SQLite: a frozen writer locks the file
        pytest.skip("idle_write_transaction_timeout is MariaDB's/MySQL's (docs/reliability.md: SQLite is for one host)")
    assert bound_idle_write_transactions(frozen_engine, 1.0)
    assert Lease(sessions, "ctl-a:1", 15.0).keep()
    frozen = frozen_engine.connect()
    frozen.execute(sa.update(ManagersLease).values(holder="frozen-writer"))  # a row lock, then it freezes
    standby_engine = sa.create_engine(url, **engine_options(url))
    try:
        with standby_engine.connect() as standby:
            standby.execute(sa.text("SET SESSION innodb_lock_wait_timeout = 30"))
            began = time.monotonic()
            standby.execute(sa.update(ManagersLease).values(renewed_at=1.0))
            standby.commit()
            waited = time.monotonic() - began
        assert waited < 15, waited  # the server ended the frozen connection after ~1 s, not the 30 s lock wait
        with pytest.raises(sa.exc.OperationalError):
            frozen.execute(sa.select(1))  # resumed: its connection is gone
        assert row(sessions).holder == "ctl-a:1"  # and its write never landed
    finally:
        frozen.invalidate()
        frozen_engine.dispose()
        standby_engine.dispose()


def test_on_mariadb_a_holder_frozen_between_its_fencing_check_and_its_commit_does_not_keep_the_lease_row(
        settings, sessions):
    """A pass whose commit writes nothing still runs the fencing check, which locks the lease row; a
    holder SIGSTOPped right after the check holds that lock. The check is a real write, so the
    server ends the frozen connection after the idle bound and a standby takes the lease (an UPDATE
    that changes nothing leaves the transaction read-only on MariaDB, and the lock stayed until
    wait_timeout: the standby's take-over waited out innodb_lock_wait_timeout every poll)."""
    import time

    from dlts.app import engine_options
    from dlts.managers.lease import bound_idle_write_transactions

    url = settings.database_url
    if not url.startswith(("mysql", "mariadb")):
        pytest.skip("idle_write_transaction_timeout is MariaDB's/MySQL's (docs/reliability.md: SQLite is for one host)")
    frozen_engine = sa.create_engine(url, **engine_options(url))
    assert bound_idle_write_transactions(frozen_engine, 1.0)
    holder = Lease(sa.orm.sessionmaker(bind=frozen_engine), "ctl-a:1", 15.0)
    assert holder.keep()
    frozen = holder.fenced_sessions(sa.orm.sessionmaker(bind=frozen_engine))()
    frozen.execute(sa.select(Job.id).limit(1))  # a pass that read and wrote nothing ...
    holder.check(frozen)  # ... commits: the check runs, and the process freezes before the COMMIT
    standby_engine = sa.create_engine(url, **engine_options(url))
    try:
        expiry_waited = 0.0
        with standby_engine.connect() as standby:
            standby.execute(sa.text("SET SESSION innodb_lock_wait_timeout = 30"))
            began = time.monotonic()
            # what a standby's take-over does once the row expired: an UPDATE of the lease row
            standby.execute(sa.update(ManagersLease).values(expires_at=0.0))
            standby.commit()
            expiry_waited = time.monotonic() - began
        assert expiry_waited < 15, expiry_waited  # ended after ~1 s idle, not the 30 s lock wait
        standby_lease = Lease(sessions, "ctl-b:2", 15.0)
        assert standby_lease.keep() and standby_lease.token == 2
        with pytest.raises(sa.exc.OperationalError):
            frozen.execute(sa.select(1))  # resumed: its connection is gone
    finally:
        frozen.close()
        frozen_engine.dispose()
        standby_engine.dispose()
