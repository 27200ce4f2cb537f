"""Queue policies per VC: RF (runnable first) and FIFO.

Both walk the VC's order; they differ only in what a job that does not fit does to the jobs behind
it. Only non-preemptible jobs are ever blocked, and only by a non-preemptible job of the same VC
in the same resource pool.
"""

from __future__ import annotations

from dlts.scheduler.framework import VcQueue
from dlts.scheduler.model import Job, Policy, Rejection, resource_pool


class RunnableFirst:
    """Start every job that fits; a job that does not fit is skipped (large jobs may starve; the
    reason is recorded)."""

    name = Policy.RF.value

    def blocked_by(self, queue: VcQueue, job: Job) -> int | None:
        return None

    def on_wait(self, queue: VcQueue, job: Job, rejection: Rejection) -> None:
        return None


class Fifo:
    """The first non-preemptible job that does not fit blocks every later non-preemptible job of
    its VC *in the same resource pool* (GPU SKU; CPU-only jobs are their own pool) for the rest of
    the pass: a CPU-only job never waits behind a GPU job that waits for GPUs, nor an a100 job
    behind a v100 one. Permanent rejections (no node could ever hold the job) do not block: the
    VC would otherwise stall until someone deletes the job."""

    name = Policy.FIFO.value

    def blocked_by(self, queue: VcQueue, job: Job) -> int | None:
        if job.preemptible or not queue.blockers:
            return None
        return queue.blockers.get(resource_pool(job))

    def on_wait(self, queue: VcQueue, job: Job, rejection: Rejection) -> None:
        if job.preemptible or rejection.permanent:
            return
        pool = resource_pool(job)
        if pool in queue.blockers:
            return
        queue.blockers[pool] = job.id
        if queue.blocker is None:
            queue.blocker = job.id
