"""Property-based tests: random clusters and job streams, invariants after every pass.

Hypothesis draws a small cluster (two GPU SKUs and CPU-only nodes over up to three IB domains, some
nodes hard-assigned or unschedulable), a few VCs with random policies, quotas and caps, and a
stream of jobs of every type. The stream is replayed through the simulator, and after each pass
``check_pass`` asserts the invariants on the snapshot and decisions; at the end the RESULT.json
checker must agree. Preempted jobs must come back with their original queue time.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlts.scheduler import JobType, Node, Policy, Vc
from dlts.sim.engine import Simulation
from dlts.sim.inputs import Cluster, TraceJob
from dlts.sim.verify import check_result

from .builders import LEAN_SKUS, SKUS
from .invariants import check_pass


@st.composite
def clusters(draw) -> Cluster:
    n_vcs = draw(st.integers(1, 3))
    vc_names = [f"vc{i}" for i in range(n_vcs)]
    domains = [f"pod{i}" for i in range(draw(st.integers(1, 3)))]
    nodes = []
    for sku, count in (("a100", draw(st.integers(1, 5))), ("v100", draw(st.integers(0, 4))), ("cpu", draw(st.integers(0, 2)))):
        shape = SKUS[sku]
        for k in range(count):
            nodes.append(
                Node(
                    f"{sku}-{k}",
                    sku,
                    shape.gpus,
                    shape.cpu,
                    shape.memory_bytes,
                    draw(st.sampled_from(domains)),
                    draw(st.sampled_from([None, None, None] + vc_names)),
                    draw(st.sampled_from([True, True, True, True, False])),
                )
            )
    vcs = {}
    for name in vc_names:
        vcs[name] = Vc(
            name,
            {"a100": draw(st.integers(0, 32)), "v100": draw(st.integers(0, 12))},
            draw(st.sampled_from(list(Policy))),
            draw(st.sampled_from([None, 3000, 20000])),
            draw(st.sampled_from([None, 0, 2, 8])),
            draw(st.sampled_from([None, 4, 16])),
            allow_cpu_jobs_on_gpu_nodes=draw(st.booleans()),
            min_runtime_s=draw(st.sampled_from([0.0, 0.0, 500.0])),
            max_reclaim_delay_s=draw(st.sampled_from([None, 1000.0])),
            max_preemptions=draw(st.sampled_from([0, 1])),
            fair_share=draw(st.sampled_from([True, True, False])),
            fair_share_max_wait_s=draw(st.sampled_from([None, None, 600.0])),
            limit_weight=draw(st.sampled_from([0.0, 0.0, 0.25, 1.0])),
        )
    # LEAN_SKUS opens 16 cores of each a100 node to CPU-only jobs (cpu_per_gpu 10)
    skus = dict(draw(st.sampled_from([SKUS, LEAN_SKUS])))
    # fair share: a one-hour half-life decays within the traces' ~2 h; 0 is queue-time order
    return Cluster(skus, tuple(nodes), vcs, tick_s=10.0, preempt_grace_s=draw(st.sampled_from([0.0, 0.0, 30.0])),
                   fair_share_half_life_h=draw(st.sampled_from([0.0, 1.0, 168.0])))


@st.composite
def traces(draw, cluster: Cluster) -> list[TraceJob]:
    jobs = []
    for i in range(1, draw(st.integers(1, 25)) + 1):
        jtype = draw(st.sampled_from(list(JobType)))
        sku = draw(st.sampled_from(["a100", "v100", None]))
        per_node = SKUS[sku].gpus if sku else 0
        gpus = draw(st.integers(1, per_node)) if sku else 0
        nodes = 0
        if jtype is JobType.DISTRIBUTED:
            if sku is None:
                sku, per_node = "a100", 8
            gpus, nodes = per_node, draw(st.integers(1, 3))
        min_r = draw(st.integers(1, 2)) if jtype is JobType.INFERENCE else 0
        jobs.append(
            TraceJob(
                id=i,
                submit_s=float(draw(st.integers(0, 4000))),
                vc=draw(st.sampled_from(sorted(cluster.vcs))),
                user=draw(st.sampled_from(["ann", "bob"])),
                type=jtype,
                sku=sku,
                gpus=gpus,
                nodes=nodes,
                duration_s=float(draw(st.integers(30, 6000))),
                max_time_s=draw(st.sampled_from([None, None, 600, 4000])),
                priority=draw(st.sampled_from([50, 100, 100, 200])),
                preemptible=draw(st.booleans()),
                min_replicas=min_r,
                max_replicas=min_r + draw(st.integers(0, 2)) if min_r else 0,
            )
        )
    return jobs


@settings(max_examples=int(os.environ.get("DLTS_PROPERTY_EXAMPLES", "120")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_invariants_hold_after_every_pass(data) -> None:
    cluster = data.draw(clusters())
    trace = data.draw(traces(cluster))
    submit = {t.id: t.submit_s for t in trace}
    passes = []

    def hook(snap, decisions, now):
        check_pass(snap, decisions, now)
        for j in snap.jobs:
            assert j.queue_time == submit[j.id], f"job {j.id} lost its queue time"
        passes.append(now)

    result = Simulation(cluster, trace, on_pass=hook).run()
    assert check_result(result) == []
    assert passes == sorted(passes)
    # Nothing is lost: every job either ran to an end or is still queued with a reason.
    for job in result["jobs"]:
        assert job["state"] in ("finished", "killed", "queued")
        if job["state"] == "queued":
            assert job["wait_reasons"], f"job {job['id']} never started and never got a reason"


def test_a_job_that_ends_by_itself_during_its_wall_time_grace_is_no_violation() -> None:
    """Found by the property test: limit 600 s, tick 10 s, grace 30 s, the job's own end at 611 s."""
    cluster = Cluster(
        skus=dict(SKUS), nodes=(Node("a100-0", "a100", 8, 96.0, 900 * 2**30, "pod0"),),
        vcs={"vc0": Vc("vc0", {"a100": 0}, Policy.RF)}, tick_s=10.0, preempt_grace_s=30.0)
    trace = [TraceJob(id=1, submit_s=0.0, vc="vc0", user="ann", type=JobType.BATCH, sku="a100", gpus=1, nodes=0,
                      duration_s=611.0, max_time_s=600, priority=50, preemptible=True, line=0)]
    result = Simulation(cluster, trace).run()
    assert check_result(result) == []
    (job,) = result["jobs"]
    assert job["attempts"][0]["end_s"] == 611.0
