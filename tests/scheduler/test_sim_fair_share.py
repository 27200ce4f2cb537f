"""``dlts sim`` hands the core each user's decayed GPU use, so a replay orders by fair share as the
live job manager does, and the RESULT checker's FIFO rule follows the same order."""

from __future__ import annotations

import copy
import math
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlts.sim.cli import sim_command
from dlts.sim.engine import Simulation
from dlts.sim.fairshare import DecayedUse
from dlts.sim.inputs import load_cluster, load_trace
from dlts.sim.verify import check_result

HEADER = "id,submit_s,vc,user,type,sku,gpus,nodes,duration_s,max_time_s,priority,preemptible\n"

CLUSTER = """\
skus:
  a100: {{gpus: 8, cpu: 96, memory_gb: 900}}
nodes:
  - {{name: g1, sku: a100, ib_domain: pod0}}
vcs:
  - {{name: lab, quota: {{a100: 8}}, policy: {policy}}}
tick_s: 10
{extra}"""

# ann uses the node for an hour; then ann's job 2 (older) and bob's job 3 both want all of it
TRACE = HEADER + """\
1,0,lab,ann,batch,a100,8,0,3600,,100,false
2,100,lab,ann,batch,a100,8,0,600,,100,false
3,200,lab,bob,batch,a100,8,0,600,,100,false
"""


def _replay(tmp_path: Path, policy: str = "RF", extra: str = "", trace: str = TRACE) -> dict:
    (tmp_path / "c.yaml").write_text(CLUSTER.format(policy=policy, extra=extra))
    (tmp_path / "t.csv").write_text(trace)
    cluster = load_cluster(tmp_path / "c.yaml")
    return Simulation(cluster, load_trace(tmp_path / "t.csv", cluster)).run()


def _starts(result: dict) -> dict[int, float]:
    return {j["id"]: j["start_s"] for j in result["jobs"]}


@pytest.mark.parametrize("policy", ["RF", "FIFO", "backfill"])
def test_a_user_with_less_recent_use_goes_first(tmp_path: Path, policy: str) -> None:
    result = _replay(tmp_path, policy)
    starts = _starts(result)
    assert starts[3] == 3600.0 and starts[2] == 4200.0  # bob's younger job first
    ann_2 = next(j for j in result["jobs"] if j["id"] == 2)
    assert ann_2["wait_reasons"].get("fair_share", 0) >= 1  # the reason names fair share
    assert result["cluster"]["fair_share_half_life_h"] == 168.0
    assert result["cluster"]["vcs"]["lab"]["fair_share"] is True
    assert check_result(result) == []


def test_half_life_zero_or_a_vc_without_fair_share_orders_by_queue_time(tmp_path: Path) -> None:
    off = _replay(tmp_path, extra="fair_share_half_life_h: 0\n")
    assert _starts(off)[2] == 3600.0 and _starts(off)[3] == 4200.0
    (tmp_path / "c.yaml").write_text(
        CLUSTER.format(policy="RF", extra="").replace("policy: RF}", "policy: RF, fair_share: false}")
    )
    cluster = load_cluster(tmp_path / "c.yaml")
    vc_off = Simulation(cluster, load_trace(tmp_path / "t.csv", cluster)).run()
    assert _starts(vc_off)[2] == 3600.0
    assert check_result(off) == [] and check_result(vc_off) == []


def test_use_decays_with_the_half_life(tmp_path: Path) -> None:
    """Ann's 8 GPU-hours five hours ago against bob's 1 GPU-hour just now: with a half-life of one
    hour ann's use weighs 8 * 2**-5 = 0.25 of bob's, so her younger job goes first; with ten hours
    it weighs 8 * 2**-0.5 = 5.7 times his, and his goes first."""
    trace = HEADER + """\
1,0,lab,ann,batch,a100,8,0,3600,,100,false
4,18000,lab,bob,batch,a100,1,0,3600,,100,false
5,21590,lab,bob,batch,a100,8,0,600,,100,false
2,21595,lab,ann,batch,a100,8,0,600,,100,false
"""
    short = _replay(tmp_path, extra="fair_share_half_life_h: 1\n", trace=trace)
    assert _starts(short)[2] == 21600.0 and _starts(short)[5] == 22200.0
    long = _replay(tmp_path, extra="fair_share_half_life_h: 10\n", trace=trace)
    assert _starts(long)[5] == 21600.0 and _starts(long)[2] == 22200.0
    assert check_result(short) == [] and check_result(long) == []


def test_the_checker_holds_fifo_to_the_fair_share_order(tmp_path: Path) -> None:
    fair = _replay(tmp_path, "FIFO")
    assert check_result(fair) == []
    # the same starts read without fair share: bob's job 3 passed ann's older job 2
    told_off = copy.deepcopy(fair)
    told_off["cluster"]["fair_share_half_life_h"] = 0.0
    assert check_result(told_off) == ["FIFO VC lab: job 3 started at 3600.0 while job 2, ahead of it in the VC's order, waited"]
    # a queue-time replay read with fair share: ann's job 2 started while bob (no use) waited
    queue_order = _replay(tmp_path, "FIFO", extra="fair_share_half_life_h: 0\n")
    queue_order["cluster"]["fair_share_half_life_h"] = 168.0
    assert check_result(queue_order) == ["FIFO VC lab: job 2 started at 3600.0 while job 3, ahead of it in the VC's order, waited"]


def test_incremental_use_equals_the_closed_form() -> None:
    rng = random.Random(7)
    h = 5000.0
    spans = []
    for _ in range(200):
        a = rng.uniform(0, 50_000)
        spans.append((a, a + rng.uniform(1, 20_000), rng.choice([1, 2, 8])))
    changes = sorted([(a, g) for a, _, g in spans] + [(e, -g) for _, e, g in spans])
    use = DecayedUse(h)
    for t, g in changes:
        use.hold(("v", "u"), g, t)
    t = 80_000.0
    got = use.at_time(t)[("v", "u")]
    want = sum(g * h / math.log(2) * (0.5 ** ((t - e) / h) - 0.5 ** ((t - a) / h)) for a, e, g in spans)
    assert got == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("value,expect", [("-1", ">= 0"), ("9000", "<= 8760"), (".nan", "<= 8760"), ("soon", "must be float")])
def test_a_bad_half_life_names_the_field(tmp_path: Path, value: str, expect: str) -> None:
    (tmp_path / "c.yaml").write_text(CLUSTER.format(policy="RF", extra=f"fair_share_half_life_h: {value}\n"))
    (tmp_path / "t.csv").write_text(TRACE)
    res = CliRunner().invoke(
        sim_command, ["--cluster", str(tmp_path / "c.yaml"), "--trace", str(tmp_path / "t.csv"), "--out", str(tmp_path / "r.json")]
    )
    assert res.exit_code == 2, res.output
    assert "field 'cluster.fair_share_half_life_h'" in res.output and expect in res.output, res.output


@pytest.mark.parametrize("bound,first", [(3450, 2), (3550, 3)])
def test_fair_share_max_wait_lets_a_heavy_users_job_go_first_once_it_has_waited_that_long(
        tmp_path: Path, bound: int, first: int) -> None:
    """At 3600 s ann's job 2 has waited 3500 s and bob's job 3 (bob has no use) 3400 s: with a bound of
    3450 s ann's use no longer counts for job 2, which is older; with 3550 s it still does."""
    cluster = CLUSTER.format(policy="FIFO", extra="").replace(
        "policy: FIFO}", f"policy: FIFO, fair_share_max_wait_s: {bound}}}")
    (tmp_path / "c.yaml").write_text(cluster)
    (tmp_path / "t.csv").write_text(TRACE)
    loaded = load_cluster(tmp_path / "c.yaml")
    result = Simulation(loaded, load_trace(tmp_path / "t.csv", loaded)).run()
    assert _starts(result)[first] == 3600.0 and _starts(result)[5 - first] == 4200.0
    assert result["cluster"]["vcs"]["lab"]["fair_share_max_wait_s"] == bound
    assert check_result(result) == []
    if first == 2:  # the checker reads the bound: without it, job 2 passed bob's job 3
        unbounded = copy.deepcopy(result)
        unbounded["cluster"]["vcs"]["lab"]["fair_share_max_wait_s"] = None
        assert check_result(unbounded) == [
            "FIFO VC lab: job 2 started at 3600.0 while job 3, ahead of it in the VC's order, waited"]


def test_a_bad_fair_share_max_wait_names_the_field(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(CLUSTER.format(policy="RF", extra="").replace(
        "policy: RF}", "policy: RF, fair_share_max_wait_s: -5}"))
    (tmp_path / "t.csv").write_text(TRACE)
    res = CliRunner().invoke(
        sim_command, ["--cluster", str(tmp_path / "c.yaml"), "--trace", str(tmp_path / "t.csv"), "--out", str(tmp_path / "r.json")]
    )
    assert res.exit_code == 2, res.output
    assert "fair_share_max_wait_s" in res.output and ">= 0" in res.output, res.output


# the node is busy for an hour; then ann's 2-day job 2 (older) and bob's 1-hour job 3 both want all of it
LIMITS_TRACE = HEADER + """\
1,0,lab,ann,batch,a100,8,0,3600,3600,100,false
2,100,lab,ann,batch,a100,8,0,600,172800,100,false
3,200,lab,bob,batch,a100,8,0,600,3600,100,false
"""


@pytest.mark.parametrize("weight,first", [(0.0, 2), (0.25, 3)])
def test_limit_weight_puts_the_short_job_first_in_a_replay_and_the_checker_follows_it(
        tmp_path: Path, weight: float, first: int) -> None:
    """Fair share off (half-life 0): with limit_weight 0.25 job 3 ranks at 200 + 900 s, job 2 at
    100 + 43,200 s; without it queue time decides."""
    cluster = CLUSTER.format(policy="FIFO", extra="fair_share_half_life_h: 0\n").replace(
        "policy: FIFO}", f"policy: FIFO, limit_weight: {weight}}}")
    (tmp_path / "c.yaml").write_text(cluster)
    (tmp_path / "t.csv").write_text(LIMITS_TRACE)
    loaded = load_cluster(tmp_path / "c.yaml")
    result = Simulation(loaded, load_trace(tmp_path / "t.csv", loaded)).run()
    assert _starts(result)[first] == 3600.0 and _starts(result)[5 - first] == 4200.0
    assert result["cluster"]["vcs"]["lab"]["limit_weight"] == weight
    assert check_result(result) == []
    if weight:  # the checker reads the weight: without it, job 3 passed the older job 2
        unweighted = copy.deepcopy(result)
        unweighted["cluster"]["vcs"]["lab"]["limit_weight"] = 0.0
        assert check_result(unweighted) == [
            "FIFO VC lab: job 3 started at 3600.0 while job 2, ahead of it in the VC's order, waited"]


@pytest.mark.parametrize("value", ["11", "-0.5", ".nan"])
def test_a_bad_limit_weight_names_the_field(tmp_path: Path, value: str) -> None:
    (tmp_path / "c.yaml").write_text(CLUSTER.format(policy="RF", extra="").replace(
        "policy: RF}", f"policy: RF, limit_weight: {value}}}"))
    (tmp_path / "t.csv").write_text(TRACE)
    res = CliRunner().invoke(
        sim_command, ["--cluster", str(tmp_path / "c.yaml"), "--trace", str(tmp_path / "t.csv"), "--out", str(tmp_path / "r.json")]
    )
    assert res.exit_code == 2, res.output
    assert "limit_weight" in res.output and ("between 0 and 10" in res.output or ">= 0" in res.output), res.output
