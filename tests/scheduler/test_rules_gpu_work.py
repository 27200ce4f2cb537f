"""Table tests for the rules of issue 19 that are not backfill: quotas that protect GPU work, FIFO
per resource pool, reasons naming the real blocker, fair share inside a VC and the preemption
budget. Same shape as ``test_rules.py``: a snapshot, the decisions it must produce."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest

from dlts.scheduler import Decisions, JobType, Policy, Snapshot, decide

from .builders import GIB, LEAN_SKUS, SKUS, job, node, running, snap, summary, vc


@dataclass
class Case:
    name: str
    snapshot: Snapshot
    starts: dict | set | None = None
    waits: dict | None = None
    stops: dict | None = None
    now: float = 1000.0
    details: dict = field(default_factory=dict)  # job id -> text its wait detail must contain
    check: Callable[[Decisions], None] | None = None


def _cpu(id: int, cores: float, **kw):
    return job(id, 0, cpu=cores, memory_bytes=kw.pop("memory_bytes", 4 * GIB), **kw)


CASES = [
    # -- 1. quotas that protect GPU work ---------------------------------------------------------
    Case(
        "another VC's CPU-only jobs cannot take the cores a GPU node keeps for its free GPUs",
        # The report: VC w's CPU-only jobs filled n1's cores and v's in-quota 4-GPU job waited
        # `capacity` forever ("only 4 GPUs are free").
        snap(
            [node("n1")],
            [vc("v", quota={"a100": 8}), vc("w", quota={"a100": 8}, allow_cpu_jobs_on_gpu_nodes=True)],
            [
                running(job(1, 4), ("n1", (0, 1, 2, 3))),
                _cpu(2, 24.0, vc="w", queue_time=1.0),
                _cpu(3, 24.0, vc="w", queue_time=2.0),
                job(4, 4, queue_time=3.0),
            ],
        ),
        starts={4: [("n1", (4, 5, 6, 7))]},
        waits={2: "capacity", 3: "capacity"},
        details={2: "48 more cores on GPU nodes are kept for their free GPUs"},
    ),
    Case(
        "no preemption for a CPU-only job that freeing the victim's GPUs would not make room for",
        # An inference job's two core replicas on one node were listed twice there: reclaim counted
        # their cores twice, stopped the job for a CPU-only job, and the cores kept for the freed
        # GPUs left it no room; the job came back and was stopped again, for ever (a property
        # test's example hung `dlts sim`).
        snap(
            [node("n1")],
            [vc("v", quota={"a100": 8}), vc("w", quota={"a100": 8}, allow_cpu_jobs_on_gpu_nodes=True)],
            [
                running(job(1, 1, type=JobType.INFERENCE, preemptible=True, min_replicas=2, max_replicas=3),
                        ("n1", (0,)), ("n1", (1,)), ("n1", (2,))),
                _cpu(2, 1.0, vc="w", priority=200, memory_bytes=2 * GIB),
            ],
        ),
        stops={},
        waits={2: "capacity"},
    ),
    Case(
        "cpu_per_gpu leaves the rest of a GPU node's cores to CPU-only jobs",
        snap(
            [node("n1")],
            [vc("v", quota={"a100": 8}), vc("w", quota={"a100": 8}, allow_cpu_jobs_on_gpu_nodes=True)],
            [_cpu(1, 16.0, vc="w"), _cpu(2, 1.0, vc="w"), job(3, 8, cpu=80.0, memory_bytes=800 * GIB)],
            skus=LEAN_SKUS,
        ),
        starts={1: [("n1", ())], 3: [("n1", tuple(range(8)))]},
        waits={2: "capacity"},
    ),
    Case(
        "CPU-only quota derived from the GPU quota is enforced",
        # a100 quota 1 of 8 GPUs: 12 cores and 112.5 GiB go with it
        snap([node("c1", "cpu")], vc(quota={"a100": 1}), [_cpu(1, 8.0), _cpu(2, 8.0), _cpu(3, 4.0)]),
        starts={1: None, 3: None},
        waits={2: "vc_quota"},
        details={2: "uses 8 of 12 cores of CPU-only quota (derived from its GPU quota)"},
    ),
    Case(
        "derived memory quota is enforced too",
        snap([node("c1", "cpu")], vc(quota={"a100": 1}), [_cpu(1, 1.0, memory_bytes=100 * GIB), _cpu(2, 1.0, memory_bytes=20 * GIB)]),
        starts={1: None},
        waits={2: "vc_quota"},
        details={2: "GiB of CPU-only quota"},
    ),
    Case(
        "a VC without GPU or CPU quota runs CPU-only work only preemptible; that wait is permanent",
        snap([node("c1", "cpu")], vc(quota={}), [_cpu(1, 1.0), _cpu(2, 1.0, preemptible=True)]),
        starts={2: None},
        waits={1: "vc_quota"},
        check=lambda d: _assert(d.waits[0].permanent and "submit it preemptible" in d.waits[0].detail),
    ),
    Case(
        "an explicit cpu_quota wins over the derived one",
        snap([node("c1", "cpu")], vc(quota={"a100": 1}, cpu_quota=20.0), [_cpu(1, 16.0), _cpu(2, 8.0)]),
        starts={1: None},
        waits={2: "vc_quota"},
        details={2: "uses 16 of 20 cores"},
    ),
    Case(
        "reclaim for a CPU-only job on a GPU node respects the cores kept for free GPUs",
        snap(
            [node("n1")],
            [vc("v", quota={"a100": 8}), vc("w", quota={"a100": 8}, allow_cpu_jobs_on_gpu_nodes=True)],
            [running(job(1, 1, vc="v", preemptible=True), ("n1", (0,))), _cpu(2, 24.0, vc="w")],
        ),
        stops={},
        waits={2: "capacity"},
    ),
    # -- 2. FIFO blocks only within one resource pool ------------------------------------------
    Case(
        "FIFO does not hold a CPU-only job behind a GPU job waiting for GPUs",
        snap(
            [node("n1"), node("c1", "cpu")],
            vc(policy=Policy.FIFO, quota={"a100": 16, "cpu": 8}),
            [running(job(1, 8), ("n1", tuple(range(8)))), job(2, 4), _cpu(3, 2.0), job(4, 1)],
        ),
        starts={3: [("c1", ())]},
        waits={2: "capacity", 4: "blocked_by:2"},
        details={4: "ahead in its queue for a100 GPUs"},
    ),
    Case(
        "FIFO blocks per SKU: a v100 job starts behind a waiting a100 job; CPU-only jobs block only CPU-only jobs",
        snap(
            [node("n1"), node("v1", "v100"), node("c1", "cpu")],
            vc(policy=Policy.FIFO, quota={"a100": 16, "v100": 4, "cpu": 128}),
            [
                running(job(1, 8), ("n1", tuple(range(8)))),
                job(2, 2),
                job(3, 2, sku="v100"),
                _cpu(4, 60.0),
                _cpu(5, 8.0),
                job(6, 2, sku="v100"),
                _cpu(7, 1.0),
            ],
        ),
        starts={3: [("v1", (0, 1))], 4: [("c1", ())], 6: [("v1", (2, 3))]},
        waits={2: "capacity", 5: "capacity", 7: "blocked_by:5"},
        details={7: "ahead in its queue for CPU-only work"},
    ),
    # -- 3. reasons name the real blocker ------------------------------------------------------
    Case(
        "a GPU job asking more than cpu_per_gpu per GPU is not protected and names cores",
        snap(
            [node("n1")],
            [vc("v", quota={"a100": 8}), vc("w", quota={"a100": 8}, allow_cpu_jobs_on_gpu_nodes=True)],
            [_cpu(1, 16.0, vc="w"), job(2, 8)],  # job 2 takes the default share: 96 cores
            skus=LEAN_SKUS,
        ),
        starts={1: None},
        waits={2: "cpu"},
        details={2: "free cores"},
    ),
    Case(
        "a 1-node distributed job blocked by a CPU job's cores reads cpu, not topology",
        snap(
            [node("n1"), node("n2", domain="p2")],
            vc(quota={"a100": 16}),
            [
                running(_cpu(1, 40.0), ("n1", ())),
                running(job(2, 1), ("n2", (0,))),
                job(3, 8, type=JobType.DISTRIBUTED, nodes=1),
            ],
        ),
        waits={3: "cpu"},
        details={3: "1 have all GPUs free but only 0 of them the cores (at most 56 free cores on one)"},
    ),
    Case(
        "a gang whose whole nodes are free in two domains still reads topology",
        snap(
            [node("n1"), node("n2", domain="p2")],
            vc(quota={"a100": 16}),
            [job(3, 8, type=JobType.DISTRIBUTED, nodes=2)],
        ),
        waits={3: "topology"},
    ),
    Case(
        "a gang short of memory on its whole nodes reads memory",
        snap(
            [node("n1")],
            vc(quota={"a100": 16}),
            [running(_cpu(1, 1.0, memory_bytes=10 * GIB), ("n1", ())), job(3, 8, type=JobType.DISTRIBUTED, nodes=1, cpu=8.0)],
        ),
        waits={3: "memory"},
    ),
    Case(
        "a single-node GPU job: the GPUs are free but not the memory",
        snap(
            [node("n1")],
            vc(quota={"a100": 16}),
            [running(_cpu(1, 1.0, memory_bytes=500 * GIB), ("n1", ())), job(2, 8, cpu=8.0)],
        ),
        waits={2: "memory"},
        details={2: "1 node has the GPUs and cores free but at most 400.0 GiB of free memory"},
    ),
    Case(
        "too few GPUs is capacity, scattered GPUs fragmentation",
        snap(
            [node("n1"), node("n2")],
            vc(quota={"a100": 32}),
            [running(job(1, 4), ("n1", (0, 1, 2, 3))), running(job(2, 4), ("n2", (0, 1, 2, 3))), job(3, 8), job(4, 8, queue_time=9)],
        ),
        waits={3: "fragmentation"},
    ),
    # -- 6. fair share inside a VC -----------------------------------------------------------------
    Case(
        "fair share: a colleague with less recent use goes before a heavy user's older jobs",
        snap(
            [node("n1")],
            vc(quota={"a100": 16}),
            [job(1, 8, user="ann"), job(2, 8, user="ann"), job(3, 8, user="bob")],
            fair_share_usage={("v", "ann"): 36_000.0, ("v", "bob"): 0.0},
        ),
        starts={3: None},
        waits={1: "fair_share", 2: "capacity"},
        details={1: "user ann used 2.00x an equal share of VC v's recent GPU time; job 3 of bob (0.00x)"},
        check=lambda d: _assert({w.job_id: w.queue_position for w in d.waits} == {1: 2, 2: 3}),
    ),
    Case(
        "fair share: the colleague's job that went first took the VC's quota, and the reason says fair share",
        snap(
            [node("n1"), node("n2")],
            vc(quota={"a100": 8}),
            [job(1, 8, user="ann"), job(2, 8, user="bob")],
            fair_share_usage={("v", "ann"): 36_000.0},
        ),
        starts={2: None},
        waits={1: "fair_share"},
        details={1: "user ann used 2.00x an equal share of VC v's recent GPU time; job 2 of bob (0.00x)"},
    ),
    Case(
        "fair share: one user's 500 queued jobs do not starve a colleague",
        snap(
            [node("n1"), node("n2")],
            vc(quota={"a100": 64}),
            [running(job(9999, 8, user="ann"), ("n1", tuple(range(8))))]
            + [job(i, 1, user="ann") for i in range(1, 501)] + [job(501, 8, user="bob")],
            fair_share_usage={("v", "ann"): 8 * 3600.0},
        ),
        starts={501: [("n2", tuple(range(8)))]},
        check=lambda d: _assert(next(w for w in d.waits if w.job_id == 1).reason.value == "fair_share"),
    ),
    Case(
        "fair share never beats priority",
        snap(
            [node("n1")],
            vc(quota={"a100": 16}),
            [job(1, 8, user="ann", priority=200), job(2, 8, user="bob")],
            fair_share_usage={("v", "ann"): 1e9},
        ),
        starts={1: None},
        waits={2: "capacity"},
    ),
    Case(
        "fair share off for a VC keeps queue-time order",
        snap(
            [node("n1")],
            vc(quota={"a100": 16}, fair_share=False),
            [job(1, 8, user="ann"), job(2, 8, user="bob")],
            fair_share_usage={("v", "ann"): 1e9},
        ),
        starts={1: None},
        waits={2: "capacity"},
    ),
    Case(
        "fair_share_max_wait_s: a heavy user's job that has waited that long goes before a lighter "
        "colleague's newer job",
        snap(
            [node("n1")],
            vc(quota={"a100": 16}, fair_share_max_wait_s=3600.0),
            [job(1, 8, user="ann", queue_time=0.0), job(2, 8, user="bob", queue_time=3000.0)],
            fair_share_usage={("v", "ann"): 1e9},
        ),
        now=3600.0,
        starts={1: None},
        waits={2: "capacity"},
    ),
    Case(
        "fair_share_max_wait_s: one second short of it fair share still decides",
        snap(
            [node("n1")],
            vc(quota={"a100": 16}, fair_share_max_wait_s=3600.0),
            [job(1, 8, user="ann", queue_time=0.0), job(2, 8, user="bob", queue_time=3000.0)],
            fair_share_usage={("v", "ann"): 1e9},
        ),
        now=3599.0,
        starts={2: None},
        waits={1: "fair_share"},
        details={1: "fair share holds it back for at most 1 s more (the VC's fair_share_max_wait_s)"},
    ),
    Case(
        "fair_share_max_wait_s: jobs past it go by queue time among themselves, ahead of newer work; "
        "newer work keeps the fair-share order",
        snap(
            [node("n1")],
            vc(quota={"a100": 64}, fair_share_max_wait_s=3600.0),
            [job(1, 8, user="ann", queue_time=100.0), job(2, 8, user="bob", queue_time=200.0),
             job(3, 8, user="ann", queue_time=5000.0), job(4, 8, user="bob", queue_time=6000.0)],
            fair_share_usage={("v", "ann"): 1e9, ("v", "bob"): 1e6},
        ),
        now=7000.0,
        starts={1: None},
        waits={2: "capacity", 3: "capacity", 4: "capacity"},
        check=lambda d: _assert({w.job_id: w.queue_position for w in d.waits} == {2: 2, 4: 3, 3: 4}),
    ),
    # -- shorter limits first (Vc.limit_weight) ----------------------------------------------------
    Case(
        "limit_weight: a short job passes a long one that has not waited its weight x the difference longer",
        # 0.25 x (7 days - 1 hour) = 150,300 s: the 7-day job ranks at 151,200, the 1-hour job,
        # queued 150,299 s later, at 151,199
        snap(
            [node("n1")],
            vc(quota={"a100": 16}, limit_weight=0.25),
            [job(1, 8, queue_time=0.0, max_time_s=7 * 86400), job(2, 8, queue_time=150_299.0, max_time_s=3600)],
        ),
        now=200_000.0,
        starts={2: None},
        waits={1: "capacity"},
        check=lambda d: _assert({w.job_id: w.queue_position for w in d.waits} == {1: 2}),
    ),
    Case(
        "limit_weight: at the bound (the long job waited exactly that much longer) queue time decides",
        snap(
            [node("n1")],
            vc(quota={"a100": 16}, limit_weight=0.25),
            [job(1, 8, queue_time=0.0, max_time_s=7 * 86400), job(2, 8, queue_time=150_300.0, max_time_s=3600)],
        ),
        now=200_000.0,
        starts={1: None},
        waits={2: "capacity"},
    ),
    Case(
        "limit_weight: a job without a limit counts a week, and so does a longer limit",
        # VC limit unset: job 1 counts 7 days (shift 151,200 s), job 2's 14-day limit counts 7 days too,
        # so queue time orders them; job 3's 2-day limit (43,200 s) puts it first
        snap(
            [node("n1")],
            vc(quota={"a100": 24}, limit_weight=0.25),
            [job(1, 8, queue_time=0.0), job(2, 8, queue_time=10.0, max_time_s=14 * 86400),
             job(3, 8, queue_time=100_000.0, max_time_s=2 * 86400)],
        ),
        now=200_000.0,
        starts={3: None},
        waits={1: "capacity", 2: "capacity"},
        check=lambda d: _assert({w.job_id: w.queue_position for w in d.waits} == {1: 2, 2: 3}),
    ),
    Case(
        "limit_weight: the VC's max_job_time_s is the limit of a job without its own",
        snap(
            [node("n1")],
            vc(quota={"a100": 16}, limit_weight=1.0, max_job_time_s=7200),
            [job(1, 8, queue_time=0.0, max_time_s=86400), job(2, 8, queue_time=70_000.0)],
        ),
        now=100_000.0,
        starts={2: None},  # ranks at 77,200 against job 1's 86,400
        waits={1: "capacity"},
    ),
    Case(
        "limit_weight: fair share decides first; the weight orders within one user's standing",
        snap(
            [node("n1")],
            vc(quota={"a100": 32}, limit_weight=0.25),
            [job(1, 8, user="ann", queue_time=0.0, max_time_s=3600),
             job(2, 8, user="bob", queue_time=10.0, max_time_s=7 * 86400),
             job(3, 8, user="bob", queue_time=20.0, max_time_s=3600)],
            fair_share_usage={("v", "ann"): 1e9, ("v", "bob"): 1e6},
        ),
        starts={3: None},
        waits={2: "capacity", 1: "fair_share"},
        check=lambda d: _assert({w.job_id: w.queue_position for w in d.waits} == {2: 2, 1: 3}),
    ),
    Case(
        "limit_weight: a VC's weight re-ranks its own jobs and leaves its place against other VCs",
        # v's 7-day job was queued first: it keeps the node against w's job queued after it, which a
        # weight applied across VCs would have put first (10 < 151,200)
        snap(
            [node("n1")],
            [vc(quota={"a100": 16}, limit_weight=0.25), vc("w", quota={"a100": 16})],
            [job(1, 8, queue_time=0.0, max_time_s=7 * 86400), job(2, 8, vc="w", queue_time=10.0, max_time_s=3600)],
        ),
        now=1000.0,
        starts={1: None},
        waits={2: "capacity"},
    ),
    Case(
        "limit_weight: a kept reservation binds the jobs ranked after it; a later job ranked before it "
        "(a lighter user's, with a shorter limit) goes first",
        snap(
            [node("n1")],
            vc(policy=Policy.BACKFILL, quota={"a100": 16}, limit_weight=1.0),
            [job(1, 8, user="ann", queue_time=10.0, max_time_s=5000, reserved=True),  # ranks at 5,010
             job(2, 8, user="bob", queue_time=500.0, max_time_s=2000)],  # ranks at 2,500
            fair_share_usage={("v", "ann"): 1e9},
        ),
        now=1000.0,
        starts={2: None},
        waits={1: "capacity"},
    ),
    Case(
        "limit_weight: a lighter user's job ranked after a kept reservation stays behind it",
        snap(
            [node("n1")],
            vc(policy=Policy.BACKFILL, quota={"a100": 16}, limit_weight=1.0),
            [job(1, 8, user="ann", queue_time=10.0, max_time_s=5000, reserved=True),  # ranks at 5,010
             job(3, 8, user="bob", queue_time=600.0, max_time_s=4800)],  # ranks at 5,400
            fair_share_usage={("v", "ann"): 1e9},
        ),
        now=1000.0,
        starts={1: None},
        check=lambda d: _assert({w.job_id for w in d.waits} == {3}),
    ),
    Case(
        "limit_weight under FIFO: the head of the VC's pool is the first job by rank time",
        snap(
            [node("n1")],
            vc(policy=Policy.FIFO, quota={"a100": 16}, limit_weight=0.25),
            [running(job(9, 4, queue_time=0.0), ("n1", (0, 1, 2, 3))),
             job(1, 4, queue_time=0.0, max_time_s=7 * 86400), job(2, 8, queue_time=10.0, max_time_s=3600)],
        ),
        now=1000.0,
        starts={},
        waits={2: "capacity", 1: "blocked_by:2"},
    ),
    Case(
        "fair share re-ranks inside a VC and leaves another VC's place alone",
        snap(
            [node("n1")],
            [vc(quota={"a100": 16}), vc("w", quota={"a100": 16})],
            [job(1, 8, vc="w", user="cat"), job(2, 8, user="ann"), job(3, 8, user="bob")],
            fair_share_usage={("v", "ann"): 1e6, ("w", "cat"): 1e9},
        ),
        starts={1: None},
        waits={2: "capacity", 3: "capacity"},
        check=lambda d: _assert({w.job_id: w.queue_position for w in d.waits} == {3: 1, 2: 2}),
    ),
    Case(
        "fair share: a job the pass preempts for waits for its room (capacity), though a colleague "
        "moved ahead of it started (found by the property test once replays had fair share)",
        snap(
            [node("n1"), node("n2")],
            [vc(quota={"a100": 16}), vc("w", quota={"a100": 0})],
            [running(job(9, 8, vc="w", preemptible=True), ("n2", tuple(range(8)))),
             job(1, 8, user="ann"), job(2, 8, user="bob", queue_time=5.0)],
            fair_share_usage={("v", "ann"): 36_000.0},
        ),
        starts={2: [("n1", tuple(range(8)))]},
        stops={9: "preempted"},
        waits={1: "capacity"},
    ),
    # -- 7. preemption budget ----------------------------------------------------------------------
    Case(
        "a preemptible job runs at least min_runtime_s before it may be preempted",
        snap(
            [node("n1")],
            [vc("v", quota={"a100": 8}), vc("w", quota={"a100": 8}, min_runtime_s=600.0)],
            [running(job(1, 8, vc="w", preemptible=True), ("n1", tuple(range(8))), started_at=900.0), job(2, 8, queue_time=950.0)],
        ),
        now=1000.0,
        stops={},
        waits={2: "capacity"},
        details={2: "preempting job 1 would make room, but they are inside their preemption budget (min_runtime_s) for 500 s more"},
    ),
    Case(
        "after min_runtime_s the job is preempted as before",
        snap(
            [node("n1")],
            [vc("v", quota={"a100": 8}), vc("w", quota={"a100": 8}, min_runtime_s=600.0)],
            [running(job(1, 8, vc="w", preemptible=True), ("n1", tuple(range(8))), started_at=900.0), job(2, 8, queue_time=950.0)],
        ),
        now=1500.0,
        stops={1: "preempted"},
        waits={2: "capacity"},
    ),
    Case(
        "the guarantee wins once the job waited for room longer than its VC's max_reclaim_delay_s",
        snap(
            [node("n1")],
            [vc("v", quota={"a100": 8}, max_reclaim_delay_s=300.0), vc("w", quota={"a100": 8}, min_runtime_s=600.0)],
            [running(job(1, 8, vc="w", preemptible=True), ("n1", tuple(range(8))), started_at=900.0),
             job(2, 8, queue_time=0.0, room_wait_since=600.0)],
        ),
        now=1000.0,
        stops={1: "preempted"},
    ),
    Case(
        "the delay is not over yet: the reason says how long either protection lasts",
        snap(
            [node("n1")],
            [vc("v", quota={"a100": 8}, max_reclaim_delay_s=300.0), vc("w", quota={"a100": 8}, min_runtime_s=600.0)],
            [running(job(1, 8, vc="w", preemptible=True), ("n1", tuple(range(8))), started_at=900.0),
             job(2, 8, queue_time=0.0, room_wait_since=800.0)],
        ),
        now=1000.0,
        stops={},
        details={2: "or until this job has waited for room max_reclaim_delay_s (100 s more)"},
    ),
    Case(
        "the delay counts the wait for room, not the queue time: a job that waited for its own VC's "
        "quota starts the count when it first waits for room",
        snap(
            [node("n1")],
            [vc("v", quota={"a100": 8}, max_reclaim_delay_s=300.0), vc("w", quota={"a100": 8}, min_runtime_s=600.0)],
            [running(job(1, 8, vc="w", preemptible=True), ("n1", tuple(range(8))), started_at=900.0),
             job(2, 8, queue_time=0.0)],
        ),
        now=1000.0,
        stops={},
        details={2: "or until this job has waited for room max_reclaim_delay_s (300 s more)"},
    ),
    Case(
        "a job preempted max_preemptions times is protected for min_runtime_s without exception",
        snap(
            [node("n1")],
            [vc("v", quota={"a100": 8}, max_reclaim_delay_s=300.0),
             vc("w", quota={"a100": 8}, min_runtime_s=600.0, max_preemptions=2)],
            [running(job(1, 8, vc="w", preemptible=True, preemptions=2), ("n1", tuple(range(8))), started_at=900.0),
             job(2, 8, queue_time=0.0)],
        ),
        now=1000.0,
        stops={},
        details={2: "preempted max_preemptions times already: no exception"},
    ),
    Case(
        "... and may be preempted again once it has run min_runtime_s",
        snap(
            [node("n1")],
            [vc("v", quota={"a100": 8}), vc("w", quota={"a100": 8}, min_runtime_s=600.0, max_preemptions=2)],
            [running(job(1, 8, vc="w", preemptible=True, preemptions=5), ("n1", tuple(range(8))), started_at=900.0),
             job(2, 8, queue_time=0.0)],
        ),
        now=1500.0,
        stops={1: "preempted"},
    ),
    Case(
        "reclaim takes the unprotected victim when one of two is inside its budget",
        snap(
            [node("n1")],
            [vc("v", quota={"a100": 8}), vc("w", quota={"a100": 8}, min_runtime_s=600.0)],
            [running(job(1, 4, vc="w", preemptible=True, priority=50), ("n1", (0, 1, 2, 3)), started_at=950.0),
             running(job(3, 4, vc="w", preemptible=True), ("n1", (4, 5, 6, 7)), started_at=100.0),
             job(2, 4, queue_time=0.0)],
        ),
        now=1000.0,
        stops={3: "preempted"},
    ),
    Case(
        "a gang's reclaim skips nodes holding protected work",
        snap(
            [node("n1"), node("n2")],
            [vc("v", quota={"a100": 16}), vc("w", quota={"a100": 16}, min_runtime_s=600.0)],
            [running(job(1, 8, vc="w", preemptible=True), ("n1", tuple(range(8))), started_at=950.0),
             running(job(3, 8, vc="w", preemptible=True), ("n2", tuple(range(8))), started_at=100.0),
             job(2, 8, type=JobType.DISTRIBUTED, nodes=1, queue_time=0.0)],
        ),
        now=1000.0,
        stops={3: "preempted"},
    ),
]


def _assert(cond: bool) -> None:
    assert cond


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_rule(case: Case) -> None:
    d = decide(case.snapshot, case.now)
    got = summary(d)
    if case.starts is not None:
        assert set(got["starts"]) == set(case.starts), got
        for jid, want in case.starts.items():
            if want is not None:
                assert got["starts"][jid] == want, got
    if case.waits is not None:
        for jid, reason in case.waits.items():
            assert got["waits"].get(jid) == reason, (got, [w.detail for w in d.waits])
    if case.stops is not None:
        assert got["stops"] == case.stops, got
    waits = {w.job_id: w for w in d.waits}
    for jid, text in case.details.items():
        assert text in waits[jid].detail, waits[jid].detail
    pending = {j.id for j in case.snapshot.jobs if not j.running}
    started = {s.job_id for s in d.starts if not s.scale_up}
    assert started | set(got["waits"]) == pending, "every pending job starts or gets a reason"
    for w in d.waits:
        assert w.detail, f"wait of job {w.job_id} has no detail"
    if case.check is not None:
        case.check(d)


def test_default_reserve_is_the_proportional_share() -> None:
    from dlts.scheduler.quota import gpu_reserve

    assert gpu_reserve(node("n1"), SKUS) == (12.0, 900 * GIB // 8)
    assert gpu_reserve(node("n1"), LEAN_SKUS) == (10.0, 100 * GIB)
    assert gpu_reserve(node("c1", "cpu"), SKUS) == (0.0, 0)
    assert replace(SKUS["a100"]).cpu_per_gpu is None
