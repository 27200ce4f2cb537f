"""Sort plugin: priority (higher first), then queue time (older first), then id."""

from __future__ import annotations

from dlts.scheduler.framework import SortKey
from dlts.scheduler.model import Job


class PriorityQueueTime:
    """Requeued jobs (preempted, node lost) keep their queue time, so they sort back to the head;
    the id breaks ties so the order is total and a pass is deterministic."""

    name = "priority_queue_time"

    def sort_key(self, job: Job) -> SortKey:
        return (-job.priority, job.queue_time, job.id)
