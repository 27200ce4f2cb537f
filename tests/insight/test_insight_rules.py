"""The pure insight rules (dlts.insight.rules): history in, findings out, as tables."""

from __future__ import annotations

import datetime as dt

import pytest

from dlts.insight import rules
from dlts.insight.rules import IdlePolicy, JobView, Minute, Pressure
from dlts.insight.settings import InsightSettings

NOW = dt.datetime(2026, 12, 1, 12, 0, 30)
S = InsightSettings()
GiB = 2**30
A0, A1, B0 = ("a", 0), ("a", 1), ("b", 0)


def history(minutes: int, util, *, memory=None, cpu=None, gpus=(A0, A1), gap_at: int | None = None) -> list[Minute]:
    """``minutes`` points ending at NOW's minute; ``util(key, i)`` the ratio of GPU key in minute i
    (0 the oldest); ``gap_at``: that minute is missing."""
    start = NOW.replace(second=0) - dt.timedelta(minutes=minutes - 1)
    out = []
    for i in range(minutes):
        if i == gap_at:
            continue
        out.append(Minute(start + dt.timedelta(minutes=i),
                          {k: (util(k, i), memory(k, i) if memory else None) for k in gpus},
                          cpu(i) if cpu else None))
    return out


def job(minutes: list[Minute], *, started_min: float = 240, latest=None, reported_s: float | None = 5, cpu: float = 8,
        preemptible=False, memory_total=None, gpus=(A0, A1)) -> JobView:
    last = minutes[-1] if minutes else None
    if latest is None:
        latest = {k: (last.gpus[k][0] if last and k in last.gpus else None) for k in gpus}
    return JobView(job_id=7, gpus=len(gpus), cpu=cpu, started_at=NOW - dt.timedelta(minutes=started_min),
                   minutes=minutes, preemptible=preemptible, sku="a100", memory_total=memory_total or {},
                   latest=latest, reported_at=None if reported_s is None else NOW - dt.timedelta(seconds=reported_s))


def codes(view: JobView, **kw) -> list[str]:
    return [f.code for f in rules.evaluate(view, NOW, S, **kw)]


IDLE = lambda k, i: 0.01
BUSY = lambda k, i: 0.9


@pytest.mark.parametrize("case, view, expected", [
    ("idle for 45 min", job(history(45, IDLE)), ["gpus_idle"]),
    ("idle for 20 min: under idle_min", job(history(20, IDLE)), []),
    ("busy", job(history(90, BUSY)), []),
    # not idle (a busy minute, a gap, the last report): the hour's low average is what remains
    ("idle run broken by a busy minute 10 min ago", job(history(60, lambda k, i: 0.9 if i == 50 else 0.01)),
     ["low_utilisation"]),
    ("idle run broken by a missing minute", job(history(60, IDLE, gap_at=40)), ["low_utilisation"]),
    ("idle in the history but busy in the last report", job(history(45, IDLE), latest={A0: 0.8, A1: 0.0}),
     ["low_utilisation"]),
    ("idle 25 min after a gap: under idle_min", job(history(60, IDLE, gap_at=34), started_min=60), ["low_utilisation"]),
    ("no GPU readings at all", job(history(45, lambda k, i: None)), []),
    ("one GPU busy, one idle", job(history(40, lambda k, i: 0.9 if k == A0 else 0.0)), ["gpus_partly_busy"]),
    ("low average, none idle", job(history(70, lambda k, i: 0.15)), ["low_utilisation"]),
    ("low average but ran only 30 min", job(history(30, lambda k, i: 0.15), started_min=30), []),
    ("memory nearly full", job(history(20, BUSY, memory=lambda k, i: int(79 * GiB)), memory_total={A0: 80 * GiB, A1: 80 * GiB}),
     ["gpu_memory_full"]),
    ("memory full only now and then", job(history(20, BUSY, memory=lambda k, i: int((79 if i % 2 else 40) * GiB)),
                                          memory_total={A0: 80 * GiB, A1: 80 * GiB}), []),
    ("memory total unknown", job(history(20, BUSY, memory=lambda k, i: int(79 * GiB))), []),
    ("CPU saturated, GPUs starved", job(history(20, lambda k, i: 0.35, cpu=lambda i: 7.8)), ["cpu_bound"]),
    ("CPU saturated, GPUs busy", job(history(20, BUSY, cpu=lambda i: 7.9)), []),
    ("CPU light, GPUs starved", job(history(20, lambda k, i: 0.35, cpu=lambda i: 2.0)), []),
])
def test_findings(case, view, expected):
    assert codes(view) == expected, case


@pytest.mark.parametrize("case, view, pressure, expected", [
    ("preemptible, demand above free", job(history(5, BUSY), preemptible=True), Pressure("a100", 8, 2), ["preemption_risk"]),
    ("preemptible, demand fits the free GPUs", job(history(5, BUSY), preemptible=True), Pressure("a100", 2, 2), []),
    ("not preemptible", job(history(5, BUSY)), Pressure("a100", 8, 0), []),
    ("preemptible, nothing known", job(history(5, BUSY), preemptible=True), None, []),
])
def test_preemption_risk(case, view, pressure, expected):
    assert codes(view, pressure=pressure) == expected, case


def test_each_message_says_what_to_do_and_the_idle_since_is_the_start_of_the_run():
    view = job(history(45, lambda k, i: 0.9 if i < 5 else 0.0))
    [idle] = rules.evaluate(view, NOW, S)
    assert idle.since == NOW.replace(second=0) - dt.timedelta(minutes=39)
    assert "kill it" in idle.message and "since 11:21 UTC" in idle.message
    [partly] = rules.evaluate(job(history(40, lambda k, i: 0.9 if k == A0 else 0.0)), NOW, S)
    assert partly.key == "gpus_partly_busy:1/2" and "a GPU 1" in partly.message and "gpus: 1" in partly.message
    [low] = rules.evaluate(job(history(70, lambda k, i: 0.15)), NOW, S)
    assert "averaged 15%" in low.message and "Profile" in low.message
    [cpu] = rules.evaluate(job(history(20, lambda k, i: 0.35, cpu=lambda i: 7.8)), NOW, S)
    assert "7.8 of its 8 cores" in cpu.message and "more cpu" in cpu.message


def test_an_idle_run_starts_no_earlier_than_the_attempt():
    view = job(history(45, IDLE), started_min=40.5)
    assert rules.idle_since(view, S) == NOW - dt.timedelta(minutes=40.5)


def every(k: int, minutes: list[Minute]) -> list[Minute]:
    """Every k-th point, NOW's minute kept: what agents reporting every k minutes leave."""
    return [m for i, m in enumerate(reversed(minutes)) if i % k == 0][::-1]


@pytest.mark.parametrize("report_s, view, expected", [
    # agents reporting every 2 min leave every other minute without a point: still one idle run
    (120, job(every(2, history(45, IDLE))), ["gpus_idle"]),
    (120, job(every(4, history(45, IDLE))), ["gpus_idle"]),  # 4 min apart: two intervals
    (120, job(every(5, history(45, IDLE))), []),  # 5 min apart: silent past two intervals, a gap
    (60, job(every(2, history(45, IDLE))), ["gpus_idle"]),
    (60, job(every(3, history(45, IDLE))), []),
    # ... and a window needs half the points such reports give (one every 3 min: 10 of 60 min)
    (180, job(every(3, history(70, lambda k, i: 0.15))), ["low_utilisation"]),
    # every 15 s (the default): a missing minute is a gap, and sparse points fill no window
    (15, job(every(2, history(45, IDLE))), []),
    (15, job(every(3, history(70, lambda k, i: 0.15))), []),
])
def test_agents_reporting_less_than_once_a_minute(report_s, view, expected):
    s = InsightSettings(report_interval_s=report_s)
    assert [f.code for f in rules.evaluate(view, NOW, s)] == expected


def test_the_vc_policy_raises_the_idle_finding_earlier():
    view = job(history(12, IDLE))
    assert codes(view) == [] and codes(view, idle_min=10) == ["gpus_idle"]


@pytest.mark.parametrize("case, view, fresh", [
    ("reported 5 s ago", job(history(3, BUSY), reported_s=5), True),
    ("reported 29 s ago (two intervals: 30 s)", job(history(3, BUSY), reported_s=29), True),
    ("reported 31 s ago", job(history(3, BUSY), reported_s=31), False),
    ("a node never named the job", job(history(3, BUSY), reported_s=None), False),
    ("no history", job([], reported_s=1), False),
    ("history ends 3 minutes ago", job(history(10, BUSY)[:-3], reported_s=1), False),
])
def test_freshness(case, view, fresh):
    assert rules.is_fresh(view, NOW, S.report_interval_s) is fresh, case


T0 = NOW - dt.timedelta(minutes=100)
POLICY = IdlePolicy(warn_min=30, action_min=20, action="pause")


@pytest.mark.parametrize("case, policy, since, warned, acted, fresh, exempt, step", [
    ("no policy", None, T0, None, None, True, False, None),
    ("idle 100 min, not warned yet", POLICY, T0, None, None, True, False, "warn"),
    ("idle 20 min", POLICY, NOW - dt.timedelta(minutes=20), None, None, True, False, None),
    ("warned 25 min ago", POLICY, T0, NOW - dt.timedelta(minutes=25), None, True, False, "act"),
    ("warned 10 min ago", POLICY, T0, NOW - dt.timedelta(minutes=10), None, True, False, None),
    ("warned, policy only warns", IdlePolicy(30, 20, "none"), T0, NOW - dt.timedelta(minutes=25), None, True, False, None),
    ("stale data", POLICY, T0, NOW - dt.timedelta(minutes=25), None, False, False, None),
    ("exempt", POLICY, T0, NOW - dt.timedelta(minutes=25), None, True, True, None),
    ("acted already", POLICY, T0, NOW - dt.timedelta(minutes=25), NOW - dt.timedelta(minutes=1), True, False, None),
    ("not idle", POLICY, None, NOW - dt.timedelta(minutes=25), None, True, False, None),
    ("idle run began after the warning", POLICY, NOW - dt.timedelta(minutes=5), NOW - dt.timedelta(minutes=25), None,
     True, False, None),
])
def test_idle_policy_steps(case, policy, since, warned, acted, fresh, exempt, step):
    assert rules.idle_step(policy, since, warned, acted, NOW, fresh=fresh, exempt=exempt) == step, case


@pytest.mark.parametrize("policy, job_type, flag, exempt", [
    (IdlePolicy(1, 1, "kill", ("interactive",)), "interactive", False, True),
    (IdlePolicy(1, 1, "kill", ("interactive",)), "batch", False, False),
    (IdlePolicy(1, 1, "kill"), "batch", True, True),
    (None, "batch", False, False),
])
def test_exemptions(policy, job_type, flag, exempt):
    assert rules.is_exempt(policy, job_type, flag) is exempt


def test_a_multi_node_job_is_idle_only_when_every_node_is():
    both = (A0, B0)
    view = job(history(45, lambda k, i: 0.0 if k == A0 else 0.02, gpus=both), gpus=both)
    assert codes(view) == ["gpus_idle"]
    view = job(history(45, lambda k, i: 0.0 if k == A0 else 0.5, gpus=both), gpus=both)
    assert codes(view) == ["gpus_partly_busy"]
