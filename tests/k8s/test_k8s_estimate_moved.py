"""A waiting job is told why its estimated start moved later (an ``estimate_moved`` event).

The case the backfill property found (tests/scheduler/test_backfill_properties.py), through the job
manager: in a backfill VC that weighs limits, job J (1 GPU, no limit) waits for the VC's quota with
an estimate; then job K (the VC's whole quota, a 300 s limit) arrives and ranks ahead of J by its
shorter limit, so J's estimate moves out by K's run. J's events say so, naming K and why.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from dlts.models import EventKind, JobEvent, VirtualCluster


@pytest.fixture
def vision_quota() -> int:
    return 2


def estimate_events(h, job_id: int) -> list[str]:
    with h.sessions() as s:
        return [e.message for e in s.scalars(sa.select(JobEvent).where(
            JobEvent.job_id == job_id, JobEvent.kind == EventKind.REASON, JobEvent.reason == "estimate_moved"))]


@pytest.mark.parametrize("h", ["list"], indirect=True)
def test_a_job_ranked_ahead_by_a_shorter_limit_is_named_when_the_estimate_moves(h):
    with h.sessions() as s:
        vc = s.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == "vision"))
        vc.policy, vc.limit_weight = "backfill", 0.25
        s.commit()
    running = [h.submit(command="sleep 900", gpus=1, max_time_s=900) for _ in range(2)]
    h.tick()
    waiting = h.submit(command="sleep 60", gpus=1)  # no limit: ranks a week x 0.25 later
    h.tick()
    first = h.job(waiting).estimated_start
    assert first is not None and estimate_events(h, waiting) == []
    ahead = h.submit(command="sleep 300", gpus=2, max_time_s=300)
    h.tick()
    assert h.job(waiting).estimated_start > first
    [message] = estimate_events(h, waiting)
    assert message == f"estimated start moved 5 min later: job {ahead} (shorter limit) ranked ahead of it", message
    h.tick()
    assert len(estimate_events(h, waiting)) == 1  # said when it moved, not every pass
    assert running  # both hold the quota throughout


@pytest.mark.parametrize("h", ["list"], indirect=True)
def test_an_estimate_that_does_not_move_says_nothing(h):
    with h.sessions() as s:
        vc = s.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == "vision"))
        vc.policy = "backfill"
        s.commit()
    for _ in range(2):
        h.submit(command="sleep 900", gpus=1, max_time_s=900)
    h.tick()
    waiting = h.submit(command="sleep 60", gpus=1, max_time_s=600)
    h.tick()
    h.submit(command="sleep 60", gpus=2, max_time_s=300)  # later and not ahead: behind the reservation
    h.tick()
    h.tick()
    assert h.job(waiting).estimated_start is not None and estimate_events(h, waiting) == []
