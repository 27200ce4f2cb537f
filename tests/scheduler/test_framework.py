"""The plugin registry, profiles, phase timings, and the core's purity."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dlts.scheduler import REGISTRY, JobType, Profile, Rejection, WaitReason, decide, register

from .builders import job, nodes, running, snap, vc


def test_every_default_plugin_is_registered_by_name() -> None:
    p = Profile()
    assert p.sort in REGISTRY["sort"]
    for point in ("stop", "filter", "policy", "place", "preempt"):
        for name in getattr(p, point):
            assert name in REGISTRY[point], (point, name)


def test_an_unknown_plugin_name_fails_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown filter plugin 'nope' \(known: .*vc_quota"):
        decide(snap(nodes("n", 1), vc(), [job(1)]), 0, Profile(filter=("nope",)))


def test_registering_a_name_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register("filter", "vc_quota")(object)


class _NoJobsAboveFourGpus:
    name = "test_no_jobs_above_four_gpus"

    def check(self, state, job, req, vc):
        if req is not None and req.total_gpus > 4:
            return Rejection(WaitReason.CAPACITY, "this cluster takes at most 4 GPUs a job")
        return None


register("filter", _NoJobsAboveFourGpus.name)(_NoJobsAboveFourGpus)


def test_a_profile_adds_a_custom_filter_by_name() -> None:
    s = snap(nodes("n", 1), vc(), [job(1, 8), job(2, 4)])
    default = decide(s, 0)
    assert {x.job_id for x in default.starts} == {1}
    custom = decide(s, 0, Profile(filter=Profile().filter + (_NoJobsAboveFourGpus.name,)))
    assert {x.job_id for x in custom.starts} == {2}
    assert custom.waits[0].detail == "this cluster takes at most 4 GPUs a job"


def test_a_profile_without_reclaim_never_preempts() -> None:
    s = snap(
        nodes("n", 1),
        [vc("v"), vc("w", quota={})],
        [running(job(1, 8, vc="w", preemptible=True), ("n0", tuple(range(8)))), job(2, 8)],
    )
    assert [x.job_id for x in decide(s, 0).stops] == [1]
    assert decide(s, 0, Profile(preempt=())).stops == ()


def test_every_phase_is_timed() -> None:
    d = decide(snap(nodes("n", 2), vc(), [job(1, 8, type=JobType.DISTRIBUTED, nodes=2)]), 0)
    assert set(d.timings_s) == {"snapshot", "stop", "order", "assign", "opportunistic", "finalize", "total"}
    assert all(v >= 0 for v in d.timings_s.values())


def test_the_core_imports_no_database_web_or_cluster_library() -> None:
    code = (
        "import sys, dlts.scheduler, dlts.scheduler.plugins; "
        "bad = [m for m in ('flask', 'sqlalchemy', 'kubernetes', 'requests', 'dlts.models', 'dlts.services') "
        "if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
