"""Why an estimated start moved later, in words (scheduler/explain.py): one case per rule."""

from __future__ import annotations

import pytest

from dlts.scheduler import JobType, Policy, Vc
from dlts.scheduler.explain import moved_later, why_ahead
from dlts.scheduler.model import Job


def job(i: int, *, user: str = "ann", queue_time: float = 100.0, priority: int = 100, max_time_s: int | None = None) -> Job:
    return Job(id=i, vc="v", user=user, type=JobType.BATCH, sku="a100", gpus=1, cpu=1.0, memory_bytes=1,
               queue_time=queue_time, priority=priority, max_time_s=max_time_s)


VC = Vc("v", {"a100": 8}, Policy.BACKFILL, fair_share=True, limit_weight=0.25)
USAGE = {("v", "ann"): 100.0, ("v", "bob"): 10.0}


@pytest.mark.parametrize(("ahead", "vc", "words"), [
    (job(2, priority=200, queue_time=200.0), VC, "higher priority"),
    (job(2, user="bob", queue_time=200.0), VC, "fair share: bob has used less"),
    (job(2, queue_time=50.0), VC, "back at the head of the queue"),
    (job(2, queue_time=200.0, max_time_s=300), VC, "shorter limit"),
    (job(2, queue_time=200.0, max_time_s=300), Vc("v", {"a100": 8}, Policy.BACKFILL), "ahead in the queue"),
    (job(2, user="bob", queue_time=200.0), Vc("v", {"a100": 8}, Policy.BACKFILL, fair_share=False), "ahead in the queue"),
])
def test_the_first_rule_of_the_order_that_puts_a_job_ahead_is_named(ahead, vc, words):
    assert why_ahead(ahead, job(1), vc, USAGE) == words


def test_the_message_names_up_to_three_jobs_and_counts_the_rest():
    ahead = [job(i, queue_time=200.0, max_time_s=300) for i in range(2, 7)]
    assert moved_later(job(1), 900.0, 1200.0, ahead, VC, {}) == (
        "estimated start moved 5 min later: job 2 (shorter limit), job 3 (shorter limit), job 4 (shorter limit) "
        "and 2 more ranked ahead of it")


@pytest.mark.parametrize(("delta", "said"), [(90, "90 s"), (300, "5 min"), (3 * 3600, "3.0 h"), (3 * 86400, "3.0 days")])
def test_how_much_later_is_said_in_the_unit_that_reads(delta, said):
    assert moved_later(job(1), 0.0, float(delta), [job(2, priority=200)], VC, {}).startswith(
        f"estimated start moved {said} later: job 2 (higher priority)")


def test_without_a_job_that_came_ahead_the_room_is_later():
    assert moved_later(job(1), 0.0, 600.0, [], VC, {}) == (
        "estimated start moved 10 min later: the room it waits for is now expected later (a job ahead of it holds "
        "it longer, or the cluster has less of it)")
