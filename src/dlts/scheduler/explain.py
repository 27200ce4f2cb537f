"""Why a waiting job's estimated start moved later, in words.

An estimate counts the jobs known when it is made. It moves later when a job comes ahead of the
waiting job in its VC's order afterwards: a new job of higher priority, a job of a colleague who has
used less (fair share), a job with a shorter limit where the VC weighs limits, or a job that went back
to the head of the queue (preempted, or stopped by a node loss or repair). It also moves when the
room it waits for comes later than counted (a job ahead was given more room, a node left). The job
manager asks ``moved_later`` when a pass moves an estimate later by more than a tick and puts the
answer on the job as an event (reason ``estimate_moved``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dlts.scheduler.model import Job, Vc
from dlts.scheduler.plugins.fairshare import rank_time

MAX_NAMED = 3  # jobs named in one message; the rest are counted


def why_ahead(ahead: Job, job: Job, vc: Vc | None, usage: Mapping[tuple[str, str], float]) -> str:
    """Why ``ahead`` ranks before ``job`` in their VC's order (the first rule of the order that puts it
    there: priority, fair share, rank time)."""
    if ahead.priority != job.priority:
        return "higher priority"
    if vc is not None and vc.fair_share and ahead.user != job.user and \
            usage.get((vc.name, ahead.user), 0.0) < usage.get((vc.name, job.user), 0.0):
        return f"fair share: {ahead.user} has used less"
    if ahead.queue_time < job.queue_time:
        return "back at the head of the queue"
    if vc is not None and vc.limit_weight and rank_time(ahead, vc) < rank_time(job, vc):
        return "shorter limit"
    return "ahead in the queue"


def moved_later(job: Job, before: float, after: float, came_ahead: Sequence[Job], vc: Vc | None,
                usage: Mapping[tuple[str, str], float]) -> str:
    """'estimated start moved 5 min later: job 14 (shorter limit) ranked ahead of it'."""
    head = f"estimated start moved {_duration(after - before)} later"
    if not came_ahead:
        return (f"{head}: the room it waits for is now expected later (a job ahead of it holds it longer, "
                "or the cluster has less of it)")
    named = [f"job {k.id} ({why_ahead(k, job, vc, usage)})" for k in came_ahead[:MAX_NAMED]]
    more = len(came_ahead) - len(named)
    listed = ", ".join(named) + (f" and {more} more" if more else "")
    return f"{head}: {listed} ranked ahead of it"


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{round(seconds / 60)} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
