"""The forecast, one readable case per rule (scheduler/forecast.py; docs/scheduling.md "Forecast
start"): every waiting job gets the time the scheduler's own passes, run forward, start it."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings

from dlts.scheduler import Policy, decide
from dlts.scheduler.forecast import UserRuntimes, forecast
from dlts.sim.engine import Simulation

from .builders import job, node, running, snap, vc
from .test_backfill_properties import EXAMPLES, clusters_and_traces

NOW = 1000.0


def busy(j, name, idx, started_at=0.0):
    return running(j, (name, idx), started_at=started_at)


def test_every_waiting_job_starts_when_the_work_ahead_of_it_ends_by_its_limit() -> None:
    # n1 is full until 3600 (job 1's limit); job 2 takes the whole node for 7200 s, then 3 and 4 fit together
    s = snap([node("n1")], vc(), [busy(job(1, 8, max_time_s=3600), "n1", tuple(range(8))),
                                  job(2, 8, max_time_s=7200), job(3, 4, max_time_s=600), job(4, 4)])
    f = forecast(s, NOW)
    assert f.starts == {2: 3600.0, 3: 10800.0, 4: 10800.0}
    assert f.horizon == math.inf  # every job it could reach is reached


def test_a_job_that_can_start_now_is_forecast_now_as_the_pass_starts_it() -> None:
    s = snap([node("n1")], vc(), [busy(job(1, 6, max_time_s=3600), "n1", tuple(range(6))), job(2, 2), job(3, 4)])
    f = forecast(s, NOW)
    assert {st.job_id for st in decide(s, NOW).starts} == {2}
    assert f.starts == {2: NOW, 3: 3600.0}


def test_work_with_no_limit_leaves_the_jobs_behind_it_unknown() -> None:
    s = snap([node("n1")], vc(), [busy(job(1, 8), "n1", tuple(range(8))), job(2, 1, max_time_s=60)])
    f = forecast(s, NOW)
    assert f.starts == {} and f.horizon == math.inf


def test_the_vcs_limit_and_runtime_estimate_bound_work_without_a_limit_of_its_own() -> None:
    for kw, end in (({"max_job_time_s": 5000}, 5000.0), ({"default_runtime_estimate_s": 4000}, 4000.0)):
        s = snap([node("n1")], vc(**kw), [busy(job(1, 8), "n1", tuple(range(8))), job(2, 1)])
        assert forecast(s, NOW).starts == {2: end}, kw


def test_ends_close_together_are_taken_at_the_last_of_them_within_the_precision() -> None:
    # job 1 ends at 3600, job 2 at 3700: with 5 % of the 2,600 s ahead (130 s) one pass at 3700
    s = snap([node("n1")], vc(), [busy(job(1, 4, max_time_s=3600), "n1", (0, 1, 2, 3)),
                                  busy(job(2, 4, max_time_s=3700), "n1", (4, 5, 6, 7)), job(3, 2), job(4, 8)])
    coarse = forecast(s, NOW)
    assert coarse.starts[3] == 3700.0 and coarse.passes == 2
    assert coarse.starts[3] - 3600.0 <= 0.05 * (3600.0 - NOW) + 60  # late by at most the precision
    fine = forecast(s, NOW, precision=0.001, min_step_s=1)
    assert fine.starts[3] == 3600.0 and fine.passes == 3


def test_a_predicted_run_time_below_the_limit_ends_the_work_earlier() -> None:
    s = snap([node("n1")], vc(), [busy(job(1, 8, max_time_s=36000, user="ann"), "n1", tuple(range(8))),
                                  job(2, 8, user="bob", max_time_s=36000)])
    runtimes = UserRuntimes()
    runtimes.add("ann", 1000)
    runtimes.add("ann", 3000)  # mean of the last two: 2000 s
    assert forecast(s, NOW, runtime=runtimes).starts == {2: 2000.0}
    runtimes.add("ann", 100)  # the last two: 3000 and 100 -> 1550 s, and job 1 has run 1000 s
    assert forecast(s, NOW, runtime=runtimes).starts == {2: 1550.0}
    # already running longer than predicted: expected to run to its limit
    assert forecast(s, 2000.0, runtime=runtimes).starts == {2: 36000.0}
    # a prediction never goes past the limit
    runtimes.add("ann", 10**6)
    runtimes.add("ann", 10**6)
    assert forecast(s, NOW, runtime=runtimes).starts == {2: 36000.0}


def test_user_runtimes_keep_the_last_runs_of_each_user() -> None:
    r = UserRuntimes(keep=2)
    assert r(job(1, user="ann")) is None and len(r) == 0
    for seconds in (10, 20, 40):
        r.add("ann", seconds)
    assert r(job(1, user="ann")) == 30.0 and r(job(2, user="bob")) is None


def test_a_job_reclaiming_its_quota_is_forecast_now_and_the_preempted_job_after_it() -> None:
    # VC a owns the node; VC b's preemptible job borrows it; a's job reclaims it at once
    vcs = [vc("a", quota={"a100": 8}), vc("b", quota={"a100": 0})]
    s = snap([node("n1")], vcs, [
        busy(job(1, 8, vc="b", preemptible=True, max_time_s=9000), "n1", tuple(range(8))),
        job(2, 8, vc="a", max_time_s=3600),
    ])
    f = forecast(s, NOW)
    assert f.starts == {2: NOW}  # the preempted job 1 was running, so it is not a waiting job here
    assert f.passes == 3  # the pass that preempts, the one that starts job 2, and one when job 2 ends


def test_max_passes_bounds_the_work_and_says_how_far_it_got() -> None:
    jobs = [busy(job(1, 8, max_time_s=2000), "n1", tuple(range(8)))]
    jobs += [job(i, 8, max_time_s=10000) for i in range(2, 7)]
    s = snap([node("n1")], vc(), jobs)
    f = forecast(s, NOW, max_passes=3)
    assert f.starts == {2: 2000.0, 3: 12000.0} and f.passes == 3
    assert f.horizon == 22000.0  # the next pass would have been when job 3 ends
    assert set(forecast(s, NOW).starts) == {2, 3, 4, 5, 6}


def test_a_job_that_can_never_run_or_awaits_approval_gets_none() -> None:
    s = snap([node("n1")], vc(), [busy(job(1, 8, max_time_s=2000), "n1", tuple(range(8))),
                                  job(2, 16), job(3, 1, approved=False), job(4, 1)])
    f = forecast(s, NOW)
    assert f.starts == {4: 2000.0}


def test_a_reserved_job_is_forecast_by_its_reservation_when_work_ends_by_its_limits() -> None:
    s = snap([node("n1")], vc(policy=Policy.BACKFILL), [
        busy(job(1, 6, max_time_s=5000), "n1", tuple(range(6))), job(2, 8, max_time_s=100), job(3, 2, max_time_s=4000)])
    (r,) = decide(s, NOW).reservations
    f = forecast(s, NOW)
    assert f.starts[3] == NOW and f.starts[2] <= r.start + 0.05 * (r.start - NOW) + 60


# -- the forecast is the scheduler run forward: over random clusters, it starts each job when a replay does --


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(clusters_and_traces())
def test_a_forecast_after_the_last_submission_matches_the_replay(case) -> None:
    """Jobs run exactly to their limits and no job arrives after the forecast, so a forecast with a
    pass at every end (precision 0), and wherever a preemption budget or a max_reclaim_delay_s runs
    out, must start every job it reaches when ``dlts sim`` does. Fair share is off: the replay's use
    grows as jobs run, the forecast's stays as it was."""
    cluster, trace = case
    assume(cluster.fair_share_half_life_h == 0)
    last = max(t.submit_s for t in trace)
    taken: list = []

    def hook(snapshot, _decisions, now):
        if now >= last and not taken:
            taken.append((snapshot, now))

    result = Simulation(cluster, trace, on_pass=hook).run()
    assume(taken)
    snapshot, now = taken[0]
    f = forecast(snapshot, now, precision=0.0, min_step_s=0.0, max_passes=10_000)
    # the replay's start after the forecast (a job preempted later starts again)
    started = {j["id"]: min((a["start_s"] for a in j["attempts"] if a["start_s"] >= now), default=None)
               for j in result["jobs"]}
    by_trace_id = {t.id: t.trace_id for t in trace}
    for job_id, at in f.starts.items():
        assert started[by_trace_id[job_id]] == at, (job_id, at, started[by_trace_id[job_id]])


@pytest.mark.parametrize("precision", [0.0001, 0.05])
def test_a_coarser_forecast_is_late_by_at_most_its_precision(precision) -> None:
    s = snap([node("n1")], vc(), _three_ends())
    exact = forecast(s, NOW, precision=0.0, min_step_s=0.0)
    got = forecast(s, NOW, precision=precision)
    assert set(got.starts) == set(exact.starts) == {4, 5, 6}
    for i, t in exact.starts.items():
        assert t <= got.starts[i] <= t + max(60, precision * (got.starts[i] - NOW)), (i, t, got.starts[i])


def test_a_pass_taken_too_late_can_change_the_order_of_starts() -> None:
    # the bound is per pass, not per job: at precision 0.5 the pass for job 1's end (1500) runs at
    # job 2's (1600), where job 4 fits before job 6 does, and job 6 then waits two hours longer
    s = snap([node("n1")], vc(), _three_ends())
    assert forecast(s, NOW, precision=0.0, min_step_s=0.0).starts[6] == 1500.0
    assert forecast(s, NOW, precision=0.5).starts[6] == 3600.0


def _three_ends() -> list:
    return [busy(job(1, 2, max_time_s=1500), "n1", (0, 1)), busy(job(2, 2, max_time_s=1600), "n1", (2, 3)),
            busy(job(3, 4, max_time_s=2500), "n1", (4, 5, 6, 7)),
            job(4, 4, max_time_s=1000), job(5, 8, max_time_s=1000), job(6, 2, max_time_s=5000)]


def test_the_forecast_benchmark_runs_as_documented() -> None:
    import json
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "bench" / "forecast.py"
    out = subprocess.run([sys.executable, str(bench), "--only", "300", "40", "--repeat", "1", "--json"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    (row,) = json.loads(out)
    assert (row["pending"], row["nodes"], row["waiting"]) == (300, 40, 300)
    # every job it could reach: the rest are gangs larger than their VC's whole quota at this size
    # (they never run)
    assert 0 < row["passes"] <= row["max_passes"] and row["given_a_start"] > 250 and row["horizon_h"] is None
