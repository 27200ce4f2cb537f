"""The job status transition table: every allowed transition works, others are refused, and every
write is a compare-and-set that appends exactly one event."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from dlts.models import TRANSITIONS, Job, JobEvent, JobStatus, User, VirtualCluster
from dlts.repositories.jobs import TransitionRefused, set_status

ALLOWED = [(a, b) for a, targets in TRANSITIONS.items() for b in sorted(targets, key=lambda s: s.value)]
REFUSED = [
    (JobStatus.QUEUED, JobStatus.RUNNING),  # must pass through scheduling
    (JobStatus.QUEUED, JobStatus.FINISHED),
    (JobStatus.FINISHED, JobStatus.QUEUED),  # terminal states are final
    (JobStatus.KILLED, JobStatus.RUNNING),
    (JobStatus.FAILED, JobStatus.QUEUED),
    (JobStatus.ERROR, JobStatus.QUEUED),
    (JobStatus.PAUSED, JobStatus.RUNNING),  # resume re-enters the queue, it does not jump to running
    (JobStatus.UNAPPROVED, JobStatus.SCHEDULING),  # approval first
    (JobStatus.KILLING, JobStatus.RUNNING),
    (JobStatus.PAUSING, JobStatus.RUNNING),
]


def _job(session, status: JobStatus) -> int:
    user = session.scalar(sa.select(User).where(User.name == "alice"))
    vc = session.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == "vision"))
    job = Job(name="t", user_id=user.id, vc_id=vc.id, type="batch", status=status, image="img", command="true",
              cpu=1, memory_bytes=1, spec={})
    session.add(job)
    session.commit()
    return job.id


def test_terminal_states_have_no_way_out():
    for status in (JobStatus.KILLED, JobStatus.FINISHED, JobStatus.FAILED, JobStatus.ERROR):
        assert TRANSITIONS[status] == frozenset()


@pytest.mark.parametrize("current,target", ALLOWED, ids=[f"{a.value}->{b.value}" for a, b in ALLOWED])
def test_every_allowed_transition_writes_the_status_and_one_event(world, sessions, current, target):
    with sessions() as s:
        job_id = _job(s, current)
        assert set_status(s, job_id, current, target, actor="test", reason="why")
        s.commit()
        assert s.scalar(sa.select(Job.status).where(Job.id == job_id)) is target
        events = s.scalars(sa.select(JobEvent).where(JobEvent.job_id == job_id)).all()
        assert [(e.from_status, e.to_status, e.actor) for e in events] == [(current.value, target.value, "test")]


@pytest.mark.parametrize("current,target", REFUSED, ids=[f"{a.value}->{b.value}" for a, b in REFUSED])
def test_a_transition_not_in_the_table_is_refused_and_nothing_is_written(world, sessions, current, target):
    with sessions() as s:
        job_id = _job(s, current)
        with pytest.raises(TransitionRefused):
            set_status(s, job_id, current, target, actor="test")
        s.commit()
        assert s.scalar(sa.select(Job.status).where(Job.id == job_id)) is current
        assert s.scalar(sa.select(sa.func.count()).select_from(JobEvent).where(JobEvent.job_id == job_id)) == 0


def test_a_stale_expected_status_changes_nothing(world, sessions):
    with sessions() as s:
        job_id = _job(s, JobStatus.RUNNING)
        assert not set_status(s, job_id, JobStatus.QUEUED, JobStatus.SCHEDULING, actor="test")
        s.commit()
        assert s.scalar(sa.select(Job.status).where(Job.id == job_id)) is JobStatus.RUNNING
        assert s.scalar(sa.select(sa.func.count()).select_from(JobEvent).where(JobEvent.job_id == job_id)) == 0


def test_two_concurrent_writers_exactly_one_wins(world, sessions):
    """Scheduler starts the job while the user kills it: one CAS wins, the other sees rowcount 0."""
    with sessions() as s:
        job_id = _job(s, JobStatus.QUEUED)
    for _round in range(5):
        with sessions() as s:
            s.execute(sa.update(Job).where(Job.id == job_id).values(status=JobStatus.QUEUED))
            s.execute(sa.delete(JobEvent).where(JobEvent.job_id == job_id))
            s.commit()
        barrier = threading.Barrier(2)
        results: dict[str, bool] = {}

        def writer(target: JobStatus, barrier: threading.Barrier = barrier, results: dict[str, bool] = results):
            with sessions() as s:
                s.connection()  # open the transaction before the race
                barrier.wait()
                results[target.value] = set_status(s, job_id, JobStatus.QUEUED, target, actor=target.value)
                s.commit()

        threads = [threading.Thread(target=writer, args=(t,)) for t in (JobStatus.SCHEDULING, JobStatus.KILLED)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(results.values()) == [False, True]
        winner = next(k for k, v in results.items() if v)
        with sessions() as s:
            assert s.scalar(sa.select(Job.status).where(Job.id == job_id)).value == winner
            events = s.scalars(sa.select(JobEvent).where(JobEvent.job_id == job_id)).all()
            assert [e.to_status for e in events] == [winner]
