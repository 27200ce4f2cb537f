"""The DB janitor: jobs that ended before the retention cutoff go, with attempts, events and logs, in
batches of ``batch_rows`` with a pause between; young, unfinished and recent jobs stay."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from dlts.managers.janitor import Janitor
from dlts.models import Job, JobAttempt, JobEndpoint, JobEvent, JobStatus, utcnow

from .helpers import make_job


def age(sessions, job_id: int, days: float) -> None:
    with sessions() as s:
        s.execute(sa.update(Job).where(Job.id == job_id).values(finished_at=utcnow() - dt.timedelta(days=days)))
        s.commit()


def test_old_ended_jobs_are_purged_in_batches_with_their_history_and_logs(sessions, settings, world):
    old = [make_job(sessions, settings, "alice", status=JobStatus.FINISHED) for _ in range(7)]
    young = make_job(sessions, settings, "alice", status=JobStatus.FINISHED)
    waiting = make_job(sessions, settings, "bob")
    for job_id in old:
        age(sessions, job_id, 40)
        log = settings.effective_log_dir / str(job_id)
        log.mkdir(parents=True)
        (log / "attempt-1.log").write_text("hello\n")
    age(sessions, young, 10)
    pauses: list[float] = []
    janitor = Janitor(sessions, retention_days=30, batch_rows=3, pause_s=0.25, log_dir=settings.effective_log_dir,
                      sleep=pauses.append, timer=_ticks(0.1))
    result = janitor.run()
    assert (result.jobs, result.attempts, result.batches) == (7, 7, 3)
    assert result.events == 7 * 4  # submitted + scheduling + running + finished
    assert pauses == [0.25, 0.25]  # between batches, not after the last; pause_s when batches are quicker
    with sessions() as s:
        assert sorted(s.scalars(sa.select(Job.id))) == sorted([young, waiting])
        assert s.scalar(sa.select(sa.func.count(JobEvent.id)).where(JobEvent.job_id.in_(old))) == 0
        assert s.scalar(sa.select(sa.func.count(JobAttempt.id)).where(JobAttempt.job_id.in_(old))) == 0
    assert not any((settings.effective_log_dir / str(j)).exists() for j in old)
    assert janitor.run().jobs == 0  # nothing left: a second pass changes nothing


def test_purged_jobs_take_their_endpoint_rows_and_young_jobs_keep_theirs(sessions, settings, world):
    old = [make_job(sessions, settings, "alice", status=JobStatus.FINISHED, ssh=True, ports=(6006,)) for _ in range(3)]
    young = make_job(sessions, settings, "alice", status=JobStatus.FINISHED, ports=(8888,))
    for job_id in old:
        age(sessions, job_id, 40)
    age(sessions, young, 10)
    result = Janitor(sessions, retention_days=30, batch_rows=2, pause_s=0, sleep=lambda s: None).run()
    assert (result.jobs, result.endpoints) == (3, 6)
    with sessions() as s:
        left = s.execute(sa.select(JobEndpoint.job_id, JobEndpoint.name)).all()
        assert left == [(young, "port-8888")]


def _ticks(step: float):
    """A timer that advances ``step`` seconds per reading: each batch 'takes' ``step``."""
    now = [0.0]

    def timer() -> float:
        now[0] += step
        return now[0]
    return timer


def test_the_pause_is_at_least_as_long_as_the_batch_so_a_slow_database_gets_more_rest(sessions, settings, world):
    jobs = [make_job(sessions, settings, "alice", status=JobStatus.FINISHED) for _ in range(5)]
    for job_id in jobs:
        age(sessions, job_id, 400)
    pauses: list[float] = []
    result = Janitor(sessions, retention_days=180, batch_rows=2, pause_s=0.01, sleep=pauses.append, timer=_ticks(0.5)).run()
    assert result.jobs == 5 and result.longest_batch_s == pytest.approx(0.5)
    assert pauses == [pytest.approx(0.5), pytest.approx(0.5)]  # slow batches: pause = batch time, not pause_s


def test_max_batches_bounds_one_pass_and_the_next_continues(sessions, settings, world):
    jobs = [make_job(sessions, settings, "alice", status=JobStatus.FINISHED) for _ in range(5)]
    for job_id in jobs:
        age(sessions, job_id, 400)
    janitor = Janitor(sessions, retention_days=180, batch_rows=2, pause_s=0, max_batches=1)
    assert janitor.run().jobs == 2
    assert janitor.run().jobs == 2
    assert janitor.run().jobs == 1


@pytest.mark.parametrize("kwargs", [{"retention_days": 0}, {"retention_days": 1, "batch_rows": 0}, {"retention_days": 1, "pause_s": -1}])
def test_bad_settings_are_refused(sessions, kwargs):
    with pytest.raises(ValueError):
        Janitor(sessions, **kwargs)


def test_dlts_managers_registers_the_janitor(settings, monkeypatch):
    from click.testing import CliRunner

    import dlts.managers
    from dlts.cli import main

    seen = {}
    monkeypatch.setattr(dlts.managers, "run_forever", lambda entries, **kw: seen.update({e.id: e for e in entries}))
    monkeypatch.setenv("DLTS_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("DLTS_HOME", str(settings.home))
    monkeypatch.setenv("DLTS_LOCAL_BACKEND_TRUSTED_USERS", "true")  # dlts managers with the local backend
    monkeypatch.setenv("DLTS_RETENTION_DAYS", "42")
    result = CliRunner().invoke(main, ["managers"])
    assert result.exit_code == 0, result.output
    janitor = seen["janitor.purge"]
    assert janitor.interval_s == 3600 and janitor.run.__wrapped__.__self__.retention_days == 42  # (counted by dlts.metrics)
    assert janitor.run.__wrapped__.__self__.batch_rows == 500


def _sessions_and_counters(sessions, expired: int, live: int):
    """``expired`` + ``live`` portal sessions of alice and rate counters (old windows, current windows)."""
    from dlts.models import PortalSession, RateCounter, User

    now = utcnow()
    with sessions() as s:
        uid = s.scalar(sa.select(User.id).where(User.name == "alice"))
        for i in range(expired):
            s.add(PortalSession(token_hash=f"old{i:061d}", user_id=uid, created_at=now - dt.timedelta(days=9),
                                expires_at=now - dt.timedelta(days=1), last_seen_at=now - dt.timedelta(days=2)))
            s.add(RateCounter(key=f"login-ip:10.0.0.{i}", window_start=now - dt.timedelta(hours=2), n=3))
        for i in range(live):
            s.add(PortalSession(token_hash=f"new{i:061d}", user_id=uid, created_at=now, expires_at=now + dt.timedelta(days=1),
                                last_seen_at=now))
            s.add(RateCounter(key=f"submit:1:{i}", window_start=now - dt.timedelta(seconds=30), n=1))
        s.commit()


def test_expired_portal_sessions_and_old_rate_counters_are_purged_in_batches(sessions, settings, world):
    from dlts.models import PortalSession, RateCounter

    _sessions_and_counters(sessions, expired=5, live=2)
    pauses: list[float] = []
    result = Janitor(sessions, retention_days=30, batch_rows=2, pause_s=0.25, sleep=pauses.append, timer=_ticks(0.1),
                     counter_window_s=300).run()
    assert (result.sessions, result.rate_counters) == (5, 5)
    assert result.batches == 6  # 2 + 2 + 1 of each table, one transaction each
    assert pauses == [0.25] * 5  # between batches only
    with sessions() as s:
        assert sorted(s.scalars(sa.select(PortalSession.token_hash))) == [f"new{i:061d}" for i in range(2)]
        assert sorted(s.scalars(sa.select(RateCounter.key))) == ["submit:1:0", "submit:1:1"]
    again = Janitor(sessions, retention_days=30, pause_s=0).run()
    assert (again.sessions, again.rate_counters) == (0, 0)


def test_the_short_lived_purges_share_max_batches_with_the_jobs(sessions, settings, world):
    _sessions_and_counters(sessions, expired=3, live=0)
    janitor = Janitor(sessions, retention_days=30, batch_rows=1, pause_s=0, max_batches=2)
    first = janitor.run()
    assert (first.sessions, first.rate_counters, first.batches) == (2, 0, 2)
    second = janitor.run()
    assert (second.sessions, second.rate_counters) == (1, 1)


def test_dlts_managers_janitor_takes_its_windows_from_the_settings(settings, monkeypatch):
    from click.testing import CliRunner

    import dlts.managers
    from dlts.cli import main

    seen = {}
    monkeypatch.setattr(dlts.managers, "run_forever", lambda entries, **kw: seen.update({e.id: e for e in entries}))
    monkeypatch.setenv("DLTS_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("DLTS_HOME", str(settings.home))
    monkeypatch.setenv("DLTS_LOCAL_BACKEND_TRUSTED_USERS", "true")
    monkeypatch.setenv("DLTS_IDEMPOTENCY_KEY_TTL_H", "6")
    monkeypatch.setenv("DLTS_LOGIN_LIMIT_WINDOW_S", "7200")
    assert CliRunner().invoke(main, ["managers"]).exit_code == 0
    janitor = seen["janitor.purge"].run.__wrapped__.__self__
    assert (janitor.idempotency_key_ttl_h, janitor.counter_window_s) == (6, 7200)  # at least an hour


def test_orphaned_logs_go_once_older_than_the_retention_and_the_logs_attempts_name_stay(sessions, settings, world,
                                                                                       monkeypatch):
    """Logs no attempt row names (a restore discarded their job, or the attempt under that id and
    number has another key, or the janitor stopped between its commit and the files): listed by
    `dlts db orphan-logs`, removed by the janitor only once last written before its cutoff. Files
    that are not DLTS's are left, and so is the directory that holds them."""
    from click.testing import CliRunner

    from dlts.cli import main
    from dlts.logstore import AttemptLogWriter, new_key

    log_dir = settings.effective_log_dir
    running = make_job(sessions, settings, "alice", status=JobStatus.RUNNING)  # attempt 1 from before keys
    key = new_key()
    with sessions() as s:
        s.add(JobAttempt(job_id=running, number=2, placements=[], log_key=key))
        s.commit()
    gone, gone_with_notes = running + 1000, running + 1001

    def write(job_id: int, attempt: int, log_key: str | None, text: bytes) -> None:
        writer = AttemptLogWriter(log_dir, job_id, attempt, 64 * 1024, key=log_key)
        writer.write(text)
        writer.close()

    write(running, 1, None, b"attempt 1\n")
    write(running, 2, key, b"attempt 2\n")
    write(running, 2, new_key(), b"a discarded job's attempt 2\n")
    write(running, 3, None, b"an attempt the database does not have\n")
    write(gone, 1, new_key(), b"a job the database does not have\n")
    write(gone_with_notes, 1, None, b"the same\n")
    (log_dir / str(gone_with_notes) / "notes.txt").write_text("an operator's file")

    monkeypatch.setenv("DLTS_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("DLTS_HOME", str(settings.home))
    report = CliRunner().invoke(main, ["db", "orphan-logs"])
    assert report.exit_code == 0, report.output
    lines = report.output.splitlines()
    assert lines[-1].startswith("4 orphaned logs (") and lines[-1].endswith(f" in {log_dir}")
    assert sum(f"{log_dir / str(running)}: attempt" in line and "has no attempt" in line for line in lines) == 2
    assert sum(f"job {gone} is not in the database" in line for line in lines) == 1

    now = utcnow()

    def janitor(days: int) -> Janitor:
        return Janitor(sessions, retention_days=30, log_dir=log_dir, clock=lambda: now + dt.timedelta(days=days))

    assert janitor(0).run().orphan_logs == janitor(29).run().orphan_logs == 0  # younger than retention_days
    result = janitor(31).run()
    assert (result.orphan_logs, result.jobs) == (4, 0)
    assert sorted(p.name for p in (log_dir / str(running)).iterdir()) == ["attempt-1.log", f"attempt-2-{key}.log"]
    assert not (log_dir / str(gone)).exists()
    assert [p.name for p in (log_dir / str(gone_with_notes)).iterdir()] == ["notes.txt"]
    assert CliRunner().invoke(main, ["db", "orphan-logs"]).output.strip() == f"no orphaned logs in {log_dir}"
