"""Values the scheduler core reads and the decisions it returns.

Everything here is a frozen dataclass or an Enum: the job manager (and the simulator) build a
``Snapshot`` from the database (or from a trace), hand it to ``decide(snapshot, now)`` and apply the
returned ``Decision`` values. Nothing in this package touches a database, a clock, or the network.
The values a pass makes by the thousand (placements and decisions: 88,000 waits in a 100k-job pass)
also have ``__slots__``: a frozen dataclass with slots is made in half the time of one with a
``__dict__``, and is smaller.

Units are in the names: ``memory_bytes``, ``max_time_s``, ``queue_time`` / ``started_at`` are seconds
since the epoch (or since trace start in the simulator); the core only compares and subtracts them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

CPU_SKU = "cpu"  # the SKU name of CPU-only nodes and CPU-only requests
# ``Vc.limit_weight`` counts a job's limit up to this (a week); a job without a limit counts it
LIMIT_RANK_CAP_S = 7 * 86400
MAX_LIMIT_WEIGHT = 10.0  # the largest ``Vc.limit_weight`` accepted (config, API, dlts sim)


class Policy(str, enum.Enum):
    RF = "RF"
    FIFO = "FIFO"
    BACKFILL = "backfill"  # RF plus reservations (plugins/backfill.py)


class JobType(enum.StrEnum):
    BATCH = "batch"
    INTERACTIVE = "interactive"
    DISTRIBUTED = "distributed"
    INFERENCE = "inference"


class WaitReason(str, enum.Enum):
    """Why a pending job did not start in a pass (SCHEDULING.md "Every decision has a reason")."""

    VC_QUOTA = "vc_quota"
    USER_QUOTA = "user_quota"
    INTERACTIVE_CAP = "interactive_cap"
    CAPACITY = "capacity"
    FRAGMENTATION = "fragmentation"
    TOPOLOGY = "topology"
    BLOCKED_BY = "blocked_by"  # rendered as "blocked_by:<id>"
    APPROVAL = "approval"
    NO_MATCHING_NODES = "no_matching_nodes"
    CPU = "cpu"  # the GPUs are there but the node(s) lack free cores
    MEMORY = "memory"  # the GPUs (and cores) are there but the node(s) lack free memory
    FAIR_SHARE = "fair_share"  # jobs of users with less recent use went first (plugins/fairshare.py)
    RESERVATION = "reservation"  # rendered as "reservation:<id>"; set by policy backfill (would delay job <id>)
    # set by the job manager, never by a pass: the job would start, but a volume the launch writes is
    # below its hard threshold (jobmanager/disk_pressure.py)
    DISK_PRESSURE = "disk_pressure"


# The reasons of a job that fits its VC's quota and caps but finds no room: while a non-preemptible
# job waits with one of these its VC's guarantee is not met, which the preemption budget's
# ``max_reclaim_delay_s`` counts (``Job.room_wait_since``).
ROOM_REASONS = frozenset({WaitReason.CAPACITY, WaitReason.FRAGMENTATION, WaitReason.TOPOLOGY, WaitReason.CPU,
                          WaitReason.MEMORY})


class StopReason(str, enum.Enum):
    """Why the core asks for a running job to be stopped."""

    WALL_TIME = "wall_time"
    PREEMPTED = "preempted"
    SCALE_DOWN = "scale_down"  # inference replicas above what capacity allows


@dataclass(frozen=True)
class SkuShape:
    """What one node of a SKU has. ``gpus`` is 0 for the CPU-only SKU."""

    name: str
    gpus: int
    cpu: float
    memory_bytes: int
    # Cores and bytes reserved for each *free* GPU of a node of this SKU: CPU-only jobs on such a
    # node may use only what is left (``scheduler/quota.py``). None: the node's proportional share
    # (``cpu / gpus``, ``memory_bytes / gpus``), so a default-sized GPU job always fits.
    cpu_per_gpu: float | None = None
    memory_per_gpu_bytes: int | None = None


@dataclass(frozen=True)
class Node:
    name: str
    sku: str
    gpus: int
    cpu: float
    memory_bytes: int
    ib_domain: str = "default"
    vc: str | None = None  # hard assignment: only this VC may use the node
    schedulable: bool = True  # False when cordoned, unhealthy, in repair or lost
    # GPU indices never assigned (a GPU-scope repair: the node serves with its other GPUs)
    unhealthy_gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class Vc:
    name: str
    # GPUs per SKU; for the CPU-only SKU the quota is cores (``cpu_quota``) and memory.
    quota: Mapping[str, int]
    policy: Policy = Policy.RF
    max_job_time_s: int | None = None
    max_interactive_gpus: int | None = None
    user_gpu_quota: int | None = None
    cpu_quota: float | None = None
    memory_quota_bytes: int | None = None
    allow_cpu_jobs_on_gpu_nodes: bool = False
    # backfill: the runtime assumed for jobs with no limit (no max_time_s, no max_job_time_s);
    # None: such jobs are unbounded and estimates that depend on them are unknown
    default_runtime_estimate_s: int | None = None
    # Fair share inside the VC (plugins/fairshare.py): among jobs of equal priority, owners with
    # less decayed GPU use (``Snapshot.fair_share_usage``) relative to an equal share go first.
    fair_share: bool = True
    # ... for at most this long: a job that has waited ``fair_share_max_wait_s`` (since its queue
    # time) is ranked as if its owner had no recent use, so it goes ahead of newer work of lighter
    # users and by queue time among the others so ranked (None: fair share holds a job back for
    # as long as its owner's use is high).
    fair_share_max_wait_s: float | None = None
    # Shorter limits first (plugins/fairshare.py): among jobs of equal priority, each job ranks as if
    # queued ``limit_weight`` x its effective limit later (the limit counted at most
    # ``LIMIT_RANK_CAP_S``; a job without one counts that much). 0: queue time alone (SCHEDULING.md).
    limit_weight: float = 0.0
    # Preemption budget (plugins/reclaim.py): a preemptible job of this VC runs at least
    # ``min_runtime_s`` before it may be preempted, unless the job reclaim is for (of any VC) has
    # waited for room (``Job.room_wait_since``) longer than *its* VC's ``max_reclaim_delay_s``
    # (None: never overridden); a job
    # preempted ``max_preemptions`` times (0: no limit) is protected for ``min_runtime_s`` of every
    # later run without that override.
    min_runtime_s: float = 0.0
    max_reclaim_delay_s: float | None = None
    max_preemptions: int = 0


@dataclass(frozen=True, slots=True)
class Placement:
    """One node's share of a job: which GPU indices, how many cores and bytes."""

    node: str
    gpu_indices: tuple[int, ...]
    cpu: float
    memory_bytes: int


@dataclass(frozen=True)
class Job:
    """A job as the core sees it.

    ``running`` jobs hold ``placements``; pending jobs have none. ``gpus`` is per node for
    distributed jobs (``nodes`` > 0) and the total for every other type. ``max_time_s`` is the job's
    own limit (None: the VC's current ``max_job_time_s`` applies).
    """

    id: int
    vc: str
    user: str
    type: JobType
    sku: str | None
    gpus: int
    cpu: float
    memory_bytes: int
    queue_time: float
    priority: int = 100
    preemptible: bool = False
    nodes: int = 0
    ib_domain_any: bool = False
    max_time_s: int | None = None
    running: bool = False
    started_at: float | None = None
    placements: tuple[Placement, ...] = ()
    # inference: min_replicas non-preemptible, up to max_replicas more preemptible (scheduler issue)
    min_replicas: int = 0
    max_replicas: int = 0
    # A running job already told to stop (preempting, killing, pausing): it still holds its
    # placements until it exits, is never chosen as a victim again, and its resources count as
    # "coming free" when the core looks for room to reclaim.
    stopping: bool = False
    # Inference replicas being removed (scale-down): no longer replicas of the job, but they hold
    # their node resources until they exit. The core counts them as used and as stopping work
    # (free at no cost to a reclaim, never chosen as victims).
    retiring: tuple[Placement, ...] = ()
    # Pending jobs the core schedules are approved; an unapproved job only gets reason ``approval``.
    approved: bool = True
    # A VC admin approved this job above the user's GPU quota, so ``user_quota`` no longer applies.
    user_quota_approved: bool = False
    # How many times the job has been preempted so far (the preemption budget reads it).
    preemptions: int = 0
    # Since when the job has waited for room (a reason in ``ROOM_REASONS`` at every pass since; the
    # job manager reads it from the job's reason events where some VC has a ``min_runtime_s`` and the
    # job's VC a ``max_reclaim_delay_s``, ``dlts sim`` keeps it as it replays); None: it did not wait
    # for room at the previous pass (or it decides nothing). ``Vc.max_reclaim_delay_s`` counts from here.
    room_wait_since: float | None = None
    # backfill: the job held a reservation at the previous pass (only reservations carry an
    # estimate: the job manager reads ``jobs.estimated_start``, ``dlts sim`` keeps it as it replays).
    # A reservation is kept until the job starts: in a backfill VC no job of its priority submitted
    # after it is ranked ahead of it (plugins/fairshare.py), and it gets its reservation before new
    # ones are given (plugins/backfill.py).
    reserved: bool = False


@dataclass(frozen=True)
class Snapshot:
    skus: Mapping[str, SkuShape]
    nodes: tuple[Node, ...]
    vcs: Mapping[str, Vc]
    jobs: tuple[Job, ...]  # pending (``running`` False) and running jobs, in any order
    # Defaults for CPU-only requests that leave ``cpu`` / ``memory_bytes`` unset (<= 0).
    cpu_job_default_cpu: float = 1.0
    cpu_job_default_memory_bytes: int = 2 * 1024**3
    # backfill: how many jobs that cannot start get a reservation per pass (in the pass's order)
    reservation_depth: int = 8
    # (vc, user) -> decayed GPU-seconds of recent use, computed by the job manager (fair share).
    # Empty: nobody has used anything, so fair share leaves the priority/queue-time order alone.
    fair_share_usage: Mapping[tuple[str, str], float] = field(default_factory=dict)


# -- decisions --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start:
    """Start a pending job on ``placements``.

    For an inference job that is already running, ``scale_up`` is True and ``placements`` are the
    replicas to add (one Placement per replica).
    """

    job_id: int
    placements: tuple[Placement, ...]
    scale_up: bool = False


@dataclass(frozen=True, slots=True)
class Stop:
    job_id: int
    reason: StopReason
    for_job: int | None = None  # the job a preemption makes room for
    # Inference scale-down: the replicas (placements of the running job) to remove. Empty means
    # the whole job.
    placements: tuple[Placement, ...] = ()


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a job cannot start now: a plugin's answer (the pass says it as the job's ``Wait``).
    ``permanent`` rejections (nothing in the cluster could ever hold the job as asked) never block a
    FIFO queue, or the VC would stall forever."""

    reason: WaitReason
    detail: str
    permanent: bool = False
    blocked_by: int | None = None


@dataclass(slots=True)  # not frozen: a pass makes one per waiting job, and a frozen one costs 4x to make
class Wait:
    job_id: int
    reason: WaitReason
    detail: str = ""  # numbers for people: "VC vision uses 60 of 64 a100 GPUs; this job asks 8"
    blocked_by: int | None = None
    queue_position: int | None = None  # 1-based position in its VC's order this pass
    # Nothing but a change of configuration (quota, nodes, the job's own request) lets it start;
    # such a job does not block a FIFO queue.
    permanent: bool = False
    # backfill: when the job's reservation starts (snapshot clock); None: unknown (no reservation)
    estimated_start: float | None = None

    @property
    def reason_code(self) -> str:
        if self.reason in (WaitReason.BLOCKED_BY, WaitReason.RESERVATION) and self.blocked_by is not None:
            return f"{self.reason.value}:{self.blocked_by}"
        return self.reason.value


@dataclass(frozen=True, slots=True)
class Reservation:
    """Backfill: a waiting job's planned start, ``placements`` held from ``start`` until ``end``
    (``math.inf`` for a job with no limit) against every job considered after it in the pass."""

    job_id: int
    start: float
    end: float
    placements: tuple[Placement, ...]


Decision = Start | Stop | Wait


@dataclass(frozen=True)
class Decisions:
    starts: tuple[Start, ...] = ()
    stops: tuple[Stop, ...] = ()
    waits: tuple[Wait, ...] = ()
    timings_s: Mapping[str, float] = field(default_factory=dict)  # phase name -> seconds
    reservations: tuple[Reservation, ...] = ()  # backfill VCs only


def resource_pool(job: Job) -> str:
    """The pool a job competes in for FIFO: its GPU SKU, or ``cpu`` for CPU-only jobs."""
    if job.gpus <= 0 or job.sku in (None, CPU_SKU):
        return job.sku if job.type is JobType.DISTRIBUTED and job.sku else CPU_SKU
    return job.sku

