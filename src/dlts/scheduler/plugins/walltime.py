"""Stop plugin: kill running jobs past their wall time.

The limit is the job's own ``max_time_s`` when set (the submit service already checked who may set
it above the VC's limit), else the VC's *current* ``max_job_time_s``, so a VC admin lowering the
limit affects running jobs on the next pass.
"""

from __future__ import annotations

from dlts.scheduler.model import Job, Stop, StopReason, Vc
from dlts.scheduler.state import PassState


def effective_limit_s(job: Job, vc: Vc | None) -> float | None:
    if job.max_time_s is not None and job.max_time_s > 0:
        return job.max_time_s
    if vc is not None and vc.max_job_time_s is not None and vc.max_job_time_s > 0:
        return vc.max_job_time_s
    return None


class WallTime:
    name = "wall_time"

    def stops(self, state: PassState) -> list[Stop]:
        out = []
        for job in state.snapshot.jobs:
            if not job.running or job.stopping or job.started_at is None:
                continue
            limit = effective_limit_s(job, state.vcs.get(job.vc))
            if limit is not None and state.now - job.started_at >= limit:
                out.append(Stop(job.id, StopReason.WALL_TIME))
                state.mark_stopping(job)
        return out
