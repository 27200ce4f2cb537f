"""A waiting job is told why its estimated start moved later (an ``estimate_moved`` event).

The case the backfill property found (tests/scheduler/test_backfill_properties.py), through the job
manager: in a backfill VC that weighs limits, job J (1 GPU, no limit) waits for the VC's quota with
an estimate; then job K (the VC's whole quota, a 300 s limit) arrives and ranks ahead of J by its
shorter limit, so J's estimate moves out by K's run. J's events say so, naming K and why, and the
API's job carries the same message as its ``estimate_note`` (to its owner; not to the other members
of the VC) until J starts.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from dlts.models import EventKind, JobEvent, VirtualCluster
from dlts.services import admin


@pytest.fixture
def vision_quota() -> int:
    return 2


def estimate_events(h, job_id: int) -> list[str]:
    with h.sessions() as s:
        return [e.message for e in s.scalars(sa.select(JobEvent).where(
            JobEvent.job_id == job_id, JobEvent.kind == EventKind.REASON, JobEvent.reason == "estimate_moved"))]


def api_job(client, token: str, job_id: int) -> dict:
    """GET /api/v1/jobs/<id> as the token's user."""
    r = client.get(f"/api/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.get_data(as_text=True)
    return r.get_json()


@pytest.mark.parametrize("h", ["list"], indirect=True)
def test_a_job_ranked_ahead_by_a_shorter_limit_is_named_when_the_estimate_moves(h, client):
    with h.sessions() as s:
        vc = s.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == "vision"))
        vc.policy, vc.limit_weight = "backfill", 0.25
        admin.add_user(s, "carol", uid=1002, gid=1002)
        admin.add_member(s, "vision", "carol")  # sees alice's jobs' public fields
        alice, carol = admin.new_token(s, "alice", "test"), admin.new_token(s, "carol", "test")
        s.commit()
    running = [h.submit(command="sleep 900", gpus=1, max_time_s=900) for _ in range(2)]
    h.tick()
    waiting = h.submit(command="sleep 60", gpus=1)  # no limit: ranks a week x 0.25 later
    h.tick()
    first = h.job(waiting).estimated_start
    assert first is not None and estimate_events(h, waiting) == []
    assert api_job(client, alice, waiting)["estimate_note"] is None  # not moved yet
    ahead = h.submit(command="sleep 300", gpus=2, max_time_s=300)
    h.tick()
    assert h.job(waiting).estimated_start > first
    [message] = estimate_events(h, waiting)
    assert message == f"estimated start moved 5 min later: job {ahead} (shorter limit) ranked ahead of it", message
    job = api_job(client, alice, waiting)
    assert (job["status"], job["estimated_start_source"], job["estimate_note"]) == ("queued", "reservation", message)
    assert "estimate_note" not in api_job(client, carol, waiting)  # it names other jobs: not a public field
    h.tick()
    assert len(estimate_events(h, waiting)) == 1  # said when it moved, not every pass
    assert api_job(client, alice, waiting)["estimate_note"] == message  # kept while the estimate stands
    assert running  # both hold the quota throughout

    h.api.run_until_idle(900, step_s=10)  # the running jobs reach their limits; the job ahead starts
    h.manager_tick()
    h.manager_tick()
    assert h.job(ahead).status.value in ("scheduling", "running")
    assert api_job(client, alice, waiting)["estimate_note"] == message  # still waiting, for the job ahead
    h.api.run_until_idle(310, step_s=10)  # the job ahead ends by its limit: the waiting job starts
    h.manager_tick()
    h.manager_tick()
    job = api_job(client, alice, waiting)
    assert job["status"] in ("scheduling", "running") and job["estimate_note"] is None, job
    assert h.job(waiting).estimate_note is None  # cleared in the row, not only hidden by the API


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
    assert h.job(waiting).estimate_note is None
