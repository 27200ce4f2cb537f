"""The usage rollup equals the sum of the attempts, for a history made by the real job manager on
real processes (preemption, retries, a job still running), booked incrementally by the accounting
manager between ticks; a crash in the middle of a booking books nothing, a rerun nothing twice."""

from __future__ import annotations

import datetime as dt
import time
from collections import defaultdict

import pytest
import requests
import sqlalchemy as sa

from dlts.managers.accounting import AccountingManager
from dlts.models import Job, JobAttempt, UsageJobDay, UsageTotal, utcnow
from dlts.repositories import accounting as accounting_repo
from dlts.services import accounting


def submit(live, world, user="alice", **body):
    payload = {"vc": "vision", "image": "debian:12", "command": "true"} | body
    r = requests.post(f"{live.url}/api/v1/jobs", json=payload, headers=world.auth(user), timeout=10)
    assert r.status_code == 201, r.text
    return r.json()


def get(live, world, job_id, user):
    r = requests.get(f"{live.url}/api/v1/jobs/{job_id}", headers=world.auth(user), timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def run_until(live, world, job_id, user, statuses, accountant, timeout_s=30.0):
    """Tick the job manager (and book now and then) until the job is in one of ``statuses``."""
    deadline = time.monotonic() + timeout_s
    n = 0
    while True:
        live.tick()
        n += 1
        if n % 3 == 0:
            accountant.run_once()
        job = get(live, world, job_id, user)
        if job["status"] in statuses:
            return job
        assert time.monotonic() < deadline, f"job {job_id} stuck in {job['status']} ({job.get('reason')})"
        time.sleep(0.1)


def ms(t: dt.datetime) -> int:
    return (t - accounting.EPOCH) // accounting.MS


def rollup_sums(s) -> dict[str, dict[tuple, int]]:
    out: dict[str, dict[tuple, int]] = {"day": defaultdict(int), "month": defaultdict(int)}
    for row in s.scalars(sa.select(UsageTotal)):
        out[row.period][(row.user_id, row.vc_id, row.sku, row.preemptible)] += row.gpu_ms
    return out


def attempt_sums(s) -> dict[tuple, int]:
    sums: dict[tuple, int] = defaultdict(int)
    for a, job in s.execute(sa.select(JobAttempt, Job).join(Job, Job.id == JobAttempt.job_id)):
        sums[(job.user_id, job.vc_id, job.sku or "", job.preemptible)] += a.gpu_ms
    return sums


def test_totals_equal_the_sum_of_attempts_through_preemption_retries_and_a_running_job(live, world, sessions, settings):
    accountant = AccountingManager(sessions, settings.utilisation_retention_days)
    flaky = submit(live, world, user="bob", command="sleep 0.3; exit 3", gpus=1, max_retries=1)
    run_until(live, world, flaky["id"], "bob", {"failed"}, accountant)
    guest = submit(live, world, user="carol", vc="nlp", command="exec sleep 600", gpus=4, preemptible=True)
    run_until(live, world, guest["id"], "carol", {"running"}, accountant)
    time.sleep(0.3)
    accountant.run_once()  # books the guest's first attempt while it runs
    owner = submit(live, world, command="sleep 0.5; echo owner-ran", gpus=2)
    run_until(live, world, owner["id"], "alice", {"finished"}, accountant, timeout_s=settings.preempt_grace_s + 20)
    back = run_until(live, world, guest["id"], "carol", {"running"}, accountant)
    assert back["attempts"][0]["end_reason"] == "preempted" and len(back["attempts"]) >= 2
    time.sleep(0.2)
    result = accountant.run_once()
    assert result.conflicts == 0

    with sessions() as s:
        attempts = {(a.job_id, a.number): a for a in s.scalars(sa.select(JobAttempt))}
        flaky_attempts = [a for (j, _), a in attempts.items() if j == flaky["id"]]
        assert len(flaky_attempts) == 2 and sorted(a.end_reason for a in flaky_attempts) == ["failed", "retry"]
        for (job_id, _number), a in attempts.items():
            gpus = {guest["id"]: 4, owner["id"]: 2, flaky["id"]: 1}[job_id]
            if a.ended_at is not None:  # ended: booked exactly GPUs x run time (closed once its minutes are)
                assert a.gpu_ms == gpus * (ms(a.ended_at) - ms(a.started_at)), (job_id, _number)
                assert a.booked_until == a.ended_at
            else:  # still running: booked up to its mark, which the last pass set
                assert a.gpu_ms == gpus * (ms(a.booked_until) - ms(a.started_at)) > 0
                assert a.accounting_open is True
        by_attempts = attempt_sums(s)
        rolled = rollup_sums(s)
        assert dict(rolled["day"]) == dict(by_attempts) == dict(rolled["month"])
        assert s.scalar(sa.select(sa.func.sum(UsageJobDay.gpu_ms))) == sum(by_attempts.values())
        guest_job = s.get(Job, guest["id"])
        assert by_attempts[(guest_job.user_id, guest_job.vc_id, "demo-gpu", True)] > 0  # preemptible kept apart

    # the API answers the same numbers, by user, to a cluster admin; members see only their VCs
    admin = requests.get(f"{live.url}/api/v1/usage", params={"group_by": "user,preemptible"},
                         headers=world.auth("admin"), timeout=10).json()
    got = {(r["user"], r["preemptible"]): r["gpu_seconds"] for r in admin["items"]}
    with sessions() as s:
        expected = defaultdict(float)
        for a, job in s.execute(sa.select(JobAttempt, Job).join(Job, Job.id == JobAttempt.job_id)):
            expected[(job.user.name, job.preemptible)] += a.gpu_ms / 1000
    assert got == pytest.approx(dict(expected))
    mine = requests.get(f"{live.url}/api/v1/usage", headers=world.auth("carol"), timeout=10).json()
    assert {r["user"] for r in mine["items"]} == {"carol"}  # carol's VC nlp has no other user's jobs
    vision = requests.get(f"{live.url}/api/v1/usage", params={"group_by": "job"}, headers=world.auth("bob"), timeout=10).json()
    assert {r["job_id"] for r in vision["items"]} == {owner["id"], flaky["id"]}  # VC vision only, not nlp's guest


def test_a_booking_that_dies_before_its_commit_books_nothing_and_a_rerun_books_once(live, world, sessions, settings,
                                                                                  monkeypatch):
    later = utcnow() + dt.timedelta(minutes=5)  # past the end and the utilisation lag: the pass closes it
    accountant = AccountingManager(sessions, settings.utilisation_retention_days, clock=lambda: later)
    job = submit(live, world, command="sleep 0.4", gpus=2)
    run_until(live, world, job["id"], "alice", {"finished"}, accountant=type("NoBook", (), {"run_once": lambda self: None})())
    real = accounting_repo.add_job_days

    def crash(*args, **kwargs):
        raise RuntimeError("managers process killed here")

    monkeypatch.setattr(accounting_repo, "add_job_days", crash)  # after the totals and marks, before the commit
    with pytest.raises(RuntimeError):
        accountant.run_once()
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(UsageTotal.id))) == 0
        attempt = s.scalar(sa.select(JobAttempt).where(JobAttempt.job_id == job["id"]))
        assert attempt.booked_until is None and attempt.gpu_ms == 0 and attempt.accounting_open
    monkeypatch.setattr(accounting_repo, "add_job_days", real)
    accountant.run_once()
    again = accountant.run_once()
    assert again.attempts == 0
    with sessions() as s:
        attempt = s.scalar(sa.select(JobAttempt).where(JobAttempt.job_id == job["id"]))
        expected = 2 * (ms(attempt.ended_at) - ms(attempt.started_at))
        assert attempt.gpu_ms == expected and not attempt.accounting_open
        assert s.scalar(sa.select(sa.func.sum(UsageTotal.gpu_ms)).where(UsageTotal.period == "day")) == expected
        assert s.scalar(sa.select(sa.func.sum(UsageTotal.gpu_ms)).where(UsageTotal.period == "month")) == expected
        assert s.scalar(sa.select(sa.func.sum(UsageJobDay.gpu_ms))) == expected


def test_an_end_recorded_before_the_last_booking_is_booked_back(world, sessions, settings):
    """The backend saw the process end before the manager noticed, after a pass booked past that end:
    the next pass books the difference back (negative), so the attempt's total is its run time."""
    from dlts.models import JobStatus, User
    from dlts.repositories import jobs as job_repo
    from dlts.services import jobs as job_service
    from dlts.services.auth import principal_for

    with sessions() as s:
        alice = principal_for(s, s.scalar(sa.select(User).where(User.name == "alice")))
        job = job_service.submit(s, settings, alice, job_service.JobRequest(vc="vision", image="debian:12", command="true",
                                                                         gpus=3))
        start = dt.datetime(2026, 11, 30, 23, 59, 0)
        s.add(JobAttempt(job_id=job.id, number=1, placements=[{"node": "testnode", "gpu_indices": [0, 1, 2]}],
                         started_at=start))
        assert job_repo.set_status(s, job.id, JobStatus.QUEUED, JobStatus.SCHEDULING, actor="test", values={"attempt": 1})
        s.commit()
        job_id = job.id
    with sessions() as s:  # a pass at 00:02 books across midnight and into December
        accounting.book(s, start + dt.timedelta(minutes=3))
    with sessions() as s:
        attempt = s.scalar(sa.select(JobAttempt).where(JobAttempt.job_id == job_id))
        attempt.ended_at = start + dt.timedelta(minutes=2)  # it ended at 00:01
        s.commit()
    with sessions() as s:
        accounting.book(s, start + dt.timedelta(minutes=10))
    with sessions() as s:
        attempt = s.scalar(sa.select(JobAttempt).where(JobAttempt.job_id == job_id))
        assert attempt.gpu_ms == 3 * 120_000 and not attempt.accounting_open
        days = {r.start: r.gpu_ms for r in s.scalars(sa.select(UsageTotal).where(UsageTotal.period == "day"))}
        months = {r.start: r.gpu_ms for r in s.scalars(sa.select(UsageTotal).where(UsageTotal.period == "month"))}
        assert days == {dt.date(2026, 11, 30): 3 * 60_000, dt.date(2026, 12, 1): 3 * 60_000}
        assert months == {dt.date(2026, 11, 1): 3 * 60_000, dt.date(2026, 12, 1): 3 * 60_000}


def test_day_pieces_add_up_and_split_at_midnight():
    start = dt.datetime(2026, 11, 29, 22, 0, 0, 123456)
    end = dt.datetime(2026, 12, 1, 1, 30)
    pieces = accounting.day_pieces(start, end)
    assert [d for d, _ in pieces] == [dt.date(2026, 11, 29), dt.date(2026, 11, 30), dt.date(2026, 12, 1)]
    assert sum(p for _, p in pieces) == ms(end) - ms(start)
    assert pieces[1][1] == 86_400_000
    assert accounting.day_pieces(end, end) == []


def test_dlts_managers_books_accounting_at_the_configured_interval(settings, managers_entries, tmp_path):
    config = tmp_path / "dlts.yaml"
    config.write_text(f"database_url: {settings.database_url}\nhome: {settings.home}\n"
                      "accounting_interval_s: 30\nutilisation_retention_days: 7\nlocal_backend_trusted_users: true\n")
    entry = managers_entries(config)["accounting.book"]
    assert entry.interval_s == 30 and entry.run.__wrapped__.__self__.retention_days == 7  # (counted by dlts.metrics)


def test_a_second_booker_with_a_stale_read_books_nothing(world, sessions, settings, monkeypatch):
    """Two managers processes for a moment (a standby taking the lease): the one whose read of the
    marks is stale fails the compare-and-set, rolls its batch back, and nothing is booked twice."""
    from dlts.models import JobStatus, User
    from dlts.repositories import jobs as job_repo
    from dlts.services import jobs as job_service
    from dlts.services.auth import principal_for

    start = dt.datetime(2026, 11, 10, 8, 0, 0)
    with sessions() as s:
        alice = principal_for(s, s.scalar(sa.select(User).where(User.name == "alice")))
        job = job_service.submit(s, settings, alice, job_service.JobRequest(vc="vision", image="debian:12", command="true", gpus=2))
        s.add(JobAttempt(job_id=job.id, number=1, placements=[{"node": "testnode", "gpu_indices": [0, 1]}], started_at=start))
        assert job_repo.set_status(s, job.id, JobStatus.QUEUED, JobStatus.SCHEDULING, actor="test", values={"attempt": 1})
        s.commit()
    with sessions() as s:
        stale = accounting_repo.open_attempts(s, 0, 10)
    with sessions() as s:
        assert accounting.book(s, start + dt.timedelta(minutes=10)).attempts == 1
    reads = iter([stale, []])
    monkeypatch.setattr(accounting_repo, "open_attempts", lambda *a, **k: next(reads))
    with sessions() as s:
        result = accounting.book(s, start + dt.timedelta(minutes=20))
    assert result.conflicts == 1 and result.attempts == 0
    with sessions() as s:
        attempt = s.scalar(sa.select(JobAttempt))
        assert attempt.gpu_ms == 2 * 600_000 and attempt.booked_until == start + dt.timedelta(minutes=10)
        assert s.scalar(sa.select(sa.func.sum(UsageTotal.gpu_ms)).where(UsageTotal.period == "day")) == 2 * 600_000
