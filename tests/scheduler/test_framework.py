"""The plugin registry, profiles, phase timings, and the core's purity."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from dlts.scheduler import (
    BUILTIN,
    PROFILES,
    JobType,
    Profile,
    Rejection,
    WaitReason,
    decide,
    profile_named,
)
from dlts.scheduler.framework import SortKey
from dlts.scheduler.model import Job
from dlts.scheduler.plugins.ordering import PriorityQueueTime

from .builders import job, nodes, running, snap, vc


def test_every_profile_names_only_registered_plugins() -> None:
    for profile in PROFILES.values():
        assert ("sort", profile.sort) in BUILTIN
        for point in ("stop", "filter", "policy", "place", "preempt"):
            for name in getattr(profile, point):
                assert (point, name) in BUILTIN, (point, name)


def test_an_unknown_plugin_name_fails_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown filter plugin 'nope' \(known: .*vc_quota"):
        decide(snap(nodes("n", 1), vc(), [job(1)]), 0, Profile(filter=("nope",)))


def test_an_unknown_profile_name_fails_with_the_known_ones() -> None:
    assert profile_named("default") == Profile()
    with pytest.raises(ValueError, match=r"unknown scheduler profile 'fast' \(known: default, no_fair_share"):
        profile_named("fast")


def test_registering_a_name_twice_is_refused_and_the_builtin_registry_never_changes() -> None:
    with pytest.raises(ValueError, match="already registered"):
        BUILTIN.with_plugin("filter", "vc_quota", lambda h: _NoJobsAboveFourGpus())
    with pytest.raises(ValueError, match="unknown extension point 'score'"):
        BUILTIN.with_plugin("score", "x", lambda h: _NoJobsAboveFourGpus())
    more = BUILTIN.with_plugin("filter", _NoJobsAboveFourGpus.name, lambda h: _NoJobsAboveFourGpus())
    assert ("filter", _NoJobsAboveFourGpus.name) in more
    assert ("filter", _NoJobsAboveFourGpus.name) not in BUILTIN


def test_a_factory_that_returns_no_plugin_of_its_point_fails_by_name() -> None:
    reg = BUILTIN.with_plugin("filter", "broken", lambda h: object())
    with pytest.raises(TypeError, match="filter plugin 'broken' does not implement FilterPlugin"):
        decide(snap(nodes("n", 1), vc(), [job(1)]), 0, Profile(filter=("broken",)), reg)


class _NoJobsAboveFourGpus:
    name = "test_no_jobs_above_four_gpus"

    def check(self, state, job, req, vc):
        if req is not None and req.total_gpus > 4:
            return Rejection(WaitReason.CAPACITY, "this cluster takes at most 4 GPUs a job")
        return None


class _OnlyPlaceableGangs:
    """A filter built with the pass's handle: it asks which placer would take the request."""

    name = "test_only_gangs"

    def __init__(self, plugins) -> None:
        self.plugins = plugins

    def check(self, state, job, req, vc):
        placer = self.plugins.placer_for(req) if req is not None else None
        if placer is None or placer.name != "gang":
            return Rejection(WaitReason.CAPACITY, f"only gangs here, not {placer.name if placer else 'this'}")
        return None


def test_a_profile_adds_a_custom_filter_by_name() -> None:
    s = snap(nodes("n", 1), vc(), [job(1, 8), job(2, 4)])
    default = decide(s, 0)
    assert {x.job_id for x in default.starts} == {1}
    reg = BUILTIN.with_plugin("filter", _NoJobsAboveFourGpus.name, lambda h: _NoJobsAboveFourGpus())
    custom = decide(s, 0, Profile(filter=Profile().filter + (_NoJobsAboveFourGpus.name,)), reg)
    assert {x.job_id for x in custom.starts} == {2}
    assert custom.waits[0].detail == "this cluster takes at most 4 GPUs a job"


def test_a_factory_gets_a_handle_to_the_placers() -> None:
    s = snap(nodes("n", 2), vc(), [job(1, 8), job(2, 8, type=JobType.DISTRIBUTED, nodes=2)])
    reg = BUILTIN.with_plugin("filter", _OnlyPlaceableGangs.name, _OnlyPlaceableGangs)
    d = decide(s, 0, Profile(filter=Profile().filter + (_OnlyPlaceableGangs.name,)), reg)
    assert {x.job_id for x in d.starts} == {2}
    assert [w.detail for w in d.waits] == ["only gangs here, not best_fit"]


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


def test_a_pass_leaves_the_garbage_collector_as_it_found_it() -> None:
    import gc

    s = snap(nodes("n", 1), vc(), [job(1)])
    assert gc.isenabled()
    decide(s, 0)
    assert gc.isenabled()
    with pytest.raises(ValueError):
        decide(s, 0, Profile(filter=("nope",)))
    assert gc.isenabled()
    gc.disable()
    try:
        decide(s, 0)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_priority_queue_time_sorts_give_the_sort_key_order() -> None:
    rng = random.Random(5)
    ids = rng.sample(range(1, 10_000), 2_000)  # not in id order; few priorities and queue times, so many ties
    jobs = [job(i, queue_time=float(rng.randrange(20)), priority=rng.choice([50, 100, 200])) for i in ids]
    sorter = PriorityQueueTime()
    assert sorter.sorted_jobs(jobs) == sorted(jobs, key=sorter.sort_key)


def test_a_subclass_with_its_own_sort_key_is_sorted_by_it() -> None:
    class NewestFirst(PriorityQueueTime):
        def sort_key(self, job: Job) -> SortKey:
            return (-job.queue_time, job.id)

    jobs = [job(i, queue_time=float(i % 7), priority=100) for i in range(1, 50)]
    assert NewestFirst().sorted_jobs(jobs) == sorted(jobs, key=lambda j: (-j.queue_time, j.id))
