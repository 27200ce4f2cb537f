"""Table-driven tests: one readable case per rule of SCHEDULING.md.

Each case gives a snapshot and the decisions it must produce. ``starts`` lists the jobs that start
(with placements when they matter), ``waits`` the reason code of each job that does not, ``stops``
the running jobs asked to stop. Keys left out are not checked, except that every pending job must
be either started or given a reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from dlts.scheduler import Decisions, JobType, Policy, Snapshot, decide

from .builders import LEAN_SKUS, job, node, nodes, running, snap, summary, vc


@dataclass
class Case:
    name: str
    snapshot: Snapshot
    starts: dict | set | None = None
    waits: dict | None = None
    stops: dict | None = None
    now: float = 1000.0
    check: Callable[[Decisions], None] | None = None
    extra: dict = field(default_factory=dict)


CASES = [
    # -- placement ------------------------------------------------------------------------------
    Case(
        "best fit picks the node with the fewest free GPUs left",
        snap(
            [node("n1"), node("n2")],
            vc(),
            [running(job(1, 6), ("n2", tuple(range(6)))), job(2, 2)],
        ),
        starts={2: [("n2", (6, 7))]},
    ),
    Case(
        "GPU indices are a contiguous run, the shortest one that fits",
        snap(
            [node("n1")],
            vc(),
            [running(job(1, 2), ("n1", (2, 3))), running(job(2, 1), ("n1", (7,))), job(3, 2), job(4, 4)],
        ),
        # free runs: 0-1 (2 long) and 4-6 (3 long): the 2-GPU job takes 0-1, the 4-GPU job finds no run
        starts={3: [("n1", (0, 1))]},
        waits={4: "capacity"},
    ),
    Case(
        "fragmentation when enough GPUs are free but not on one node",
        snap(
            [node("n1"), node("n2")],
            vc(),
            [running(job(1, 4), ("n1", (0, 1, 2, 3))), running(job(2, 4), ("n2", (0, 1, 2, 3))), job(3, 8)],
        ),
        starts=set(),
        waits={3: "fragmentation"},
    ),
    Case(
        "capacity when the cluster has too few free GPUs",
        snap([node("n1")], vc(), [running(job(1, 8), ("n1", tuple(range(8)))), job(2, 1)]),
        starts=set(),
        waits={2: "capacity"},
    ),
    Case(
        "cordoned, unhealthy or lost nodes are never chosen",
        snap([node("n1", schedulable=False), node("n2")], vc(), [job(1, 8), job(2, 8)]),
        starts={1: [("n2", tuple(range(8)))]},
        waits={2: "capacity"},
    ),
    Case(
        "a job larger than any node has no matching nodes",
        snap([node("n1")], vc(), [job(1, 16), job(2, 1, sku="h100")]),
        waits={1: "no_matching_nodes", 2: "no_matching_nodes"},
    ),
    Case(
        "CPU-only jobs go to CPU-only nodes, with default cores and memory",
        snap([node("n1"), node("c1", "cpu")], vc(), [job(1, 0)]),
        starts={1: [("c1", ())]},
        check=lambda d: _assert(d.starts[0].placements[0].cpu == 1.0),
    ),
    Case(
        "CPU-only jobs stay off GPU nodes unless the VC allows it",
        snap([node("n1")], [vc("v"), vc("w", allow_cpu_jobs_on_gpu_nodes=True)], [job(1, 0), job(2, 0, vc="w")],
             skus=LEAN_SKUS),
        starts={2: [("n1", ())]},
        waits={1: "no_matching_nodes"},
    ),
    Case(
        "hard-assigned nodes serve only their VC",
        snap([node("h1", vc="w")], [vc("v"), vc("w")], [job(1, 1, vc="v"), job(2, 1, vc="w")]),
        starts={2: [("h1", (0,))]},
        waits={1: "no_matching_nodes"},
    ),
    Case(
        "a VC uses its hard-assigned nodes first",
        snap([node("s1"), node("h1", vc="w")], [vc("w")], [job(1, 8, vc="w")]),
        starts={1: [("h1", tuple(range(8)))]},
    ),
    # -- gangs ----------------------------------------------------------------------------------
    Case(
        "a distributed job takes whole nodes inside one IB domain",
        snap(
            nodes("a", 1, domain="p1") + nodes("b", 2, domain="p2") + nodes("c", 3, domain="p3"),
            vc(),
            [job(1, 8, type=JobType.DISTRIBUTED, nodes=2)],
        ),
        # p2 has exactly two whole nodes: packing leaves the three of p3 for a bigger gang
        starts={1: [("b0", tuple(range(8))), ("b1", tuple(range(8)))]},
    ),
    Case(
        "a gang waits for topology when free whole nodes are split across domains",
        snap(
            nodes("a", 2, domain="p1") + nodes("b", 2, domain="p2"),
            vc(),
            [running(job(1, 1), ("a0", (0,))), running(job(2, 1), ("b0", (0,))), job(3, 8, type=JobType.DISTRIBUTED, nodes=2)],
        ),
        waits={3: "topology"},
    ),
    Case(
        "ib_domain any lets a gang span domains",
        snap(
            nodes("a", 2, domain="p1") + nodes("b", 2, domain="p2"),
            vc(),
            [
                running(job(1, 1), ("a0", (0,))),
                running(job(2, 1), ("b0", (0,))),
                job(3, 8, type=JobType.DISTRIBUTED, nodes=2, ib_domain_any=True),
            ],
        ),
        starts={3: [("a1", tuple(range(8))), ("b1", tuple(range(8)))]},
    ),
    Case(
        "a gang no domain could ever hold waits for topology and does not block FIFO",
        snap(
            nodes("a", 2, domain="p1") + nodes("b", 2, domain="p2"),
            vc(policy=Policy.FIFO),
            [job(1, 8, type=JobType.DISTRIBUTED, nodes=3), job(2, 1)],
        ),
        starts={2: None},
        waits={1: "topology"},
    ),
    Case(
        "a gang waits for fragmentation when GPUs are free but no node is whole",
        snap(
            nodes("a", 3),
            vc(),
            [running(job(1, 1), ("a0", (0,))), running(job(2, 1), ("a1", (0,))), job(3, 8, type=JobType.DISTRIBUTED, nodes=2)],
        ),
        waits={3: "fragmentation"},
    ),
    # -- quota, caps, approval ----------------------------------------------------------------
    Case(
        "a non-preemptible job over its VC's quota waits for vc_quota; a preemptible one runs beyond it",
        snap(
            nodes("n", 2),
            vc(quota={"a100": 8}),
            [running(job(1, 6), ("n0", tuple(range(6)))), job(2, 4), job(3, 4, preemptible=True)],
        ),
        starts={3: None},
        waits={2: "vc_quota"},
    ),
    Case(
        "the interactive cap holds running interactive GPUs of a VC",
        snap(
            nodes("n", 2),
            vc(max_interactive_gpus=4),
            [
                running(job(1, 2, type=JobType.INTERACTIVE), ("n0", (0, 1))),
                job(2, 2, type=JobType.INTERACTIVE),
                job(3, 1, type=JobType.INTERACTIVE),
            ],
        ),
        starts={2: None},
        waits={3: "interactive_cap"},
    ),
    Case(
        "a user over the per-user GPU quota waits for user_quota unless a VC admin approved it",
        snap(
            nodes("n", 2),
            vc(user_gpu_quota=4),
            [
                running(job(1, 4), ("n0", (0, 1, 2, 3))),
                job(2, 2),
                job(3, 2, user_quota_approved=True),
                job(4, 2, user="bob"),
            ],
        ),
        starts={3: None, 4: None},
        waits={2: "user_quota"},
    ),
    Case(
        "an unapproved job waits for approval and has no queue position",
        snap(nodes("n", 1), vc(), [job(1, 1, approved=False)]),
        waits={1: "approval"},
        check=lambda d: _assert(d.waits[0].queue_position is None),
    ),
    # -- order and policy ---------------------------------------------------------------------
    Case(
        "higher priority goes first, then older queue time, then lower id",
        snap(
            nodes("n", 1),
            vc(),
            [job(1, 8, queue_time=5), job(2, 8, queue_time=1), job(3, 8, priority=200, queue_time=9), job(4, 8, queue_time=1)],
        ),
        starts={3: None},
        check=lambda d: _assert([w.job_id for w in sorted(d.waits, key=lambda w: w.queue_position)] == [2, 4, 1]),
    ),
    Case(
        "RF skips a job that does not fit and starts later ones",
        snap(nodes("n", 1), vc(), [running(job(1, 4), ("n0", (0, 1, 2, 3))), job(2, 8), job(3, 4)]),
        starts={3: None},
        waits={2: "capacity"},
    ),
    Case(
        "FIFO blocks later non-preemptible jobs of the VC, not preemptible ones or other VCs",
        snap(
            nodes("n", 2),
            [vc("v", policy=Policy.FIFO), vc("w")],
            [
                running(job(1, 4), ("n0", (0, 1, 2, 3))),
                running(job(9, 4, vc="w"), ("n1", (0, 1, 2, 3))),
                job(2, 8),
                job(3, 1),
                job(4, 1, preemptible=True),
                job(5, 1, vc="w"),
            ],
        ),
        starts={4: None, 5: None},
        waits={2: "fragmentation", 3: "blocked_by:2"},
    ),
    Case(
        "queue positions count each VC's order, non-preemptible jobs first",
        snap(
            nodes("n", 1, sku="v100"),
            [vc("v"), vc("w")],
            [job(1, 8), job(2, 8, preemptible=True), job(3, 8, vc="w"), job(4, 8)],
        ),
        check=lambda d: _assert({w.job_id: w.queue_position for w in d.waits} == {1: 1, 4: 2, 2: 3, 3: 1}),
    ),
    # -- wall time ------------------------------------------------------------------------------
    Case(
        "a job past its own max_time_s is killed with wall_time",
        snap(nodes("n", 1), vc(max_job_time_s=10_000), [running(job(1, 1, max_time_s=100), ("n0", (0,)), started_at=0)]),
        now=100,
        stops={1: "wall_time"},
    ),
    Case(
        "without its own limit a job gets its VC's current max_job_time_s",
        snap(
            nodes("n", 1),
            vc(max_job_time_s=500),
            [running(job(1, 1), ("n0", (0,)), started_at=0), running(job(2, 1), ("n0", (1,)), started_at=600)],
        ),
        now=1000,
        stops={1: "wall_time"},
    ),
    Case(
        "a job already stopping is not stopped again",
        snap(nodes("n", 1), vc(max_job_time_s=5), [running(job(1, 1), ("n0", (0,)), started_at=0, stopping=True)]),
        stops={},
    ),
    # -- reclaim -------------------------------------------------------------------------------
    Case(
        "reclaim preempts the smallest set of preemptible jobs for a job within quota",
        snap(
            nodes("n", 2),
            [vc("v"), vc("w", quota={})],
            [
                running(job(1, 4, vc="w", preemptible=True), ("n0", (0, 1, 2, 3))),
                running(job(2, 4, vc="w", preemptible=True), ("n0", (4, 5, 6, 7))),
                running(job(3, 8, vc="w", preemptible=True), ("n1", tuple(range(8)))),
                job(4, 8),
            ],
        ),
        starts=set(),
        stops={3: "preempted"},
        waits={4: "capacity"},
    ),
    Case(
        "reclaim takes the lowest priority, then the most recently started",
        snap(
            nodes("n", 3),
            [vc("v"), vc("w", quota={})],
            [
                running(job(1, 8, vc="w", preemptible=True, priority=50), ("n0", tuple(range(8))), started_at=10),
                running(job(2, 8, vc="w", preemptible=True, priority=10), ("n1", tuple(range(8))), started_at=10),
                running(job(3, 8, vc="w", preemptible=True, priority=10), ("n2", tuple(range(8))), started_at=20),
                job(4, 8),
            ],
        ),
        stops={3: "preempted"},
    ),
    Case(
        "reclaim never happens for a job over its VC's quota or for a preemptible job",
        snap(
            nodes("n", 1),
            [vc("v", quota={"a100": 4}), vc("w", quota={})],
            [running(job(1, 8, vc="w", preemptible=True), ("n0", tuple(range(8)))), job(2, 8), job(3, 8, preemptible=True)],
        ),
        stops={},
        waits={2: "vc_quota", 3: "capacity"},
    ),
    Case(
        "a job whose victims are still stopping waits for them and preempts nobody else",
        snap(
            nodes("n", 2),
            [vc("v"), vc("w", quota={})],
            [
                running(job(1, 8, vc="w", preemptible=True), ("n0", tuple(range(8))), stopping=True),
                running(job(2, 8, vc="w", preemptible=True), ("n1", tuple(range(8)))),
                job(3, 8),
            ],
        ),
        stops={},
        waits={3: "capacity"},
        check=lambda d: _assert("waiting for job 1" in d.waits[0].detail),
    ),
    Case(
        "two jobs never count on the same reclaimed room",
        snap(
            nodes("n", 2),
            [vc("v"), vc("w", quota={})],
            [
                running(job(1, 8, vc="w", preemptible=True), ("n0", tuple(range(8)))),
                running(job(2, 8, vc="w", preemptible=True), ("n1", tuple(range(8)))),
                job(3, 8),
                job(4, 8),
            ],
        ),
        stops={1: "preempted", 2: "preempted"},
        waits={3: "capacity", 4: "capacity"},
    ),
    Case(
        "reclaim clears whole nodes in one domain for a gang",
        snap(
            nodes("a", 2, domain="p1") + nodes("b", 2, domain="p2"),
            [vc("v"), vc("w", quota={})],
            [
                running(job(1, 8, vc="w"), ("a0", tuple(range(8)))),
                running(job(2, 1, vc="w", preemptible=True), ("a1", (0,))),
                running(job(3, 1, vc="w", preemptible=True), ("b0", (0,))),
                running(job(4, 1, vc="w", preemptible=True), ("b1", (0,))),
                job(5, 8, type=JobType.DISTRIBUTED, nodes=2),
            ],
        ),
        stops={3: "preempted", 4: "preempted"},
        waits={5: "capacity"},
    ),
    Case(
        "the free part of reclaimed room is not given to preemptible work in the same pass",
        snap(
            nodes("a", 2),
            [vc("v"), vc("w", quota={})],
            [
                running(job(1, 8, vc="w", preemptible=True), ("a0", tuple(range(8)))),
                job(2, 8, type=JobType.DISTRIBUTED, nodes=2),
                job(3, 8, vc="w", preemptible=True),
            ],
        ),
        stops={1: "preempted"},
        waits={2: "capacity", 3: "capacity"},
    ),
    Case(
        "a job past its wall time frees room for reclaim without preempting anyone",
        snap(
            nodes("n", 2),
            [vc("v"), vc("w", quota={}, max_job_time_s=100)],
            [
                running(job(1, 8, vc="w"), ("n0", tuple(range(8))), started_at=0),
                running(job(2, 8, vc="w", preemptible=True), ("n1", tuple(range(8))), started_at=500),
                job(3, 8),
            ],
        ),
        now=150,
        stops={1: "wall_time"},
        waits={3: "capacity"},
        check=lambda d: _assert("waiting for job 1" in next(w.detail for w in d.waits if w.job_id == 3)),
    ),
    Case(
        "CPU-only quota counts cores",
        snap([node("c1", "cpu")], vc(cpu_quota=4.0), [job(1, 0, cpu=3.0), job(2, 0, cpu=2.0), job(3, 0, cpu=1.0)]),
        starts={1: None, 3: None},
        waits={2: "vc_quota"},
    ),
    Case(
        "reclaim never takes another VC's hard-assigned node",
        snap(
            [node("h1", vc="w")],
            [vc("v"), vc("w")],
            [running(job(1, 8, vc="w", preemptible=True), ("h1", tuple(range(8)))), job(2, 8)],
        ),
        stops={},
        waits={2: "no_matching_nodes"},
    ),
    Case(
        "a request above the VC's whole quota is permanent and does not block FIFO",
        snap(nodes("n", 2), vc(policy=Policy.FIFO, quota={"a100": 8}), [job(1, 8, type=JobType.DISTRIBUTED, nodes=2), job(2, 4)]),
        starts={2: None},
        waits={1: "vc_quota"},
        check=lambda d: _assert(d.waits[0].permanent),
    ),
    # -- inference ----------------------------------------------------------------------------
    Case(
        "an inference job starts min_replicas and grows to max_replicas on idle capacity",
        snap(nodes("n", 1), vc(), [job(1, 2, type=JobType.INFERENCE, min_replicas=2, max_replicas=3)]),
        starts={1: [("n0", (0, 1)), ("n0", (2, 3)), ("n0", (4, 5))]},
    ),
    Case(
        "a running inference job scales up when capacity frees",
        snap(
            nodes("n", 1),
            vc(),
            [running(job(1, 2, type=JobType.INFERENCE, min_replicas=1, max_replicas=3), ("n0", (0, 1)))],
        ),
        starts={1: [("n0", (2, 3)), ("n0", (4, 5))]},
        check=lambda d: _assert(d.starts[0].scale_up),
    ),
    Case(
        "extra inference replicas are scaled down to make room for a non-preemptible job",
        snap(
            nodes("n", 1),
            [vc("v"), vc("w")],
            [
                running(
                    job(1, 4, vc="w", type=JobType.INFERENCE, min_replicas=1, max_replicas=2),
                    ("n0", (0, 1, 2, 3)),
                    ("n0", (4, 5, 6, 7)),
                ),
                job(2, 4),
            ],
        ),
        stops={1: "scale_down"},
        waits={2: "capacity"},
        check=lambda d: _assert(d.stops[0].placements[0].gpu_indices == (4, 5, 6, 7)
                                and "removing 1 replica of job 1 to make room" in d.waits[0].detail),
    ),
    Case(
        "inference min_replicas count against the VC quota, extras do not",
        snap(
            nodes("n", 2),
            vc(quota={"a100": 4}),
            [job(1, 2, type=JobType.INFERENCE, min_replicas=2, max_replicas=4), job(2, 2)],
        ),
        starts={1: None},
        waits={2: "vc_quota"},
        check=lambda d: _assert(len(d.starts[0].placements) == 4),
    ),
    # -- inference replicas being removed (Job.retiring) -----------------------------------------
    Case(
        "a retiring replica holds its GPUs until it exits: the job it makes room for waits, nothing is stopped again",
        snap(
            nodes("n", 1),
            [vc("v"), vc("w")],
            [
                running(
                    job(1, 4, vc="w", type=JobType.INFERENCE, min_replicas=1, max_replicas=2),
                    ("n0", (0, 1, 2, 3)),
                    retiring=(("n0", (4, 5, 6, 7)),),
                ),
                job(2, 4),
            ],
        ),
        starts={},  # job 1 does not grow back onto the retiring replica's GPUs either
        stops={},
        waits={2: "capacity"},
        check=lambda d: _assert("waiting for 1 replica of job 1 to exit" in d.waits[0].detail),
    ),
    Case(
        "retiring replicas are not replicas: the job grows back toward max_replicas on free capacity",
        snap(
            nodes("n", 2),
            vc(),
            [
                running(
                    job(1, 4, type=JobType.INFERENCE, min_replicas=1, max_replicas=2),
                    ("n0", (0, 1, 2, 3)),
                    retiring=(("n0", (4, 5, 6, 7)),),
                ),
            ],
        ),
        starts={1: [("n1", (0, 1, 2, 3))]},
        check=lambda d: _assert(d.starts[0].scale_up),
    ),
    Case(
        "a retiring replica's cores count as used on its node",
        snap(
            [node("c0", "cpu")],
            vc(cpu_quota=64),
            [
                running(
                    job(1, 0, type=JobType.INFERENCE, cpu=32.0, memory_bytes=8 * 2**30, min_replicas=1, max_replicas=1),
                    ("c0", ()),
                    retiring=(("c0", ()),),
                ),
                job(2, 0, cpu=16.0, memory_bytes=8 * 2**30),
            ],
        ),
        stops={},
        waits={2: "capacity"},
    ),
    Case(
        "an inference job past its wall time with a retiring replica: all of it counts as coming free",
        snap(
            nodes("n", 1),
            vc(),
            [
                running(
                    job(1, 4, type=JobType.INFERENCE, min_replicas=1, max_replicas=2, max_time_s=100),
                    ("n0", (0, 1, 2, 3)),
                    retiring=(("n0", (4, 5, 6, 7)),),
                ),
                job(2, 8),
            ],
        ),
        stops={1: "wall_time"},
        waits={2: "capacity"},
        check=lambda d: _assert("waiting for job 1 to exit" in d.waits[0].detail),
    ),
]


def _assert(cond: bool) -> None:
    assert cond


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_rule(case: Case) -> None:
    d = decide(case.snapshot, case.now)
    got = summary(d)
    if case.starts is not None:
        if isinstance(case.starts, set):
            assert set(got["starts"]) == case.starts, got
        else:
            assert set(got["starts"]) == set(case.starts), got
            for jid, want in case.starts.items():
                if want is not None:
                    assert got["starts"][jid] == want, got
    if case.waits is not None:
        for jid, reason in case.waits.items():
            assert got["waits"].get(jid) == reason, got
    if case.stops is not None:
        assert got["stops"] == case.stops, got
    pending = {j.id for j in case.snapshot.jobs if not j.running}
    started = {s.job_id for s in d.starts if not s.scale_up}
    assert started | set(got["waits"]) == pending, "every pending job starts or gets a reason"
    assert not started & set(got["waits"])
    for w in d.waits:
        assert w.detail, f"wait of job {w.job_id} has no detail"
    if case.check is not None:
        case.check(d)
