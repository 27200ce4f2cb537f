"""The production-shaped trace generator (bench/traces/production.py): its jobs look as documented,
and a replay under backfill obeys every rule the RESULT checker knows."""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from dlts.scheduler import Policy
from dlts.sim.compare import with_policy
from dlts.sim.engine import Simulation
from dlts.sim.inputs import load_cluster, load_trace
from dlts.sim.verify import check_result

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "traces" / "production.py"


def _module():
    spec = importlib.util.spec_from_file_location("production_trace", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_the_trace_is_heavy_tailed_bursty_and_seeded() -> None:
    rows = _module().generate(3000, 11, seed=19)
    assert rows == _module().generate(3000, 11, seed=19)
    gpus = [int(r[6]) * max(1, int(r[7])) for r in rows]
    one = [r for r, g in zip(rows, gpus) if g == 1]
    assert 0.6 < len(one) / len(rows) < 0.8
    assert sum(1 for r in one if float(r[8]) < 3600) / len(one) > 0.6  # most 1-GPU jobs run under an hour
    assert max(float(r[8]) for r in rows) > 2 * 86400  # a tail to days
    gangs = [g for g in gpus if g >= 16]
    assert gangs and set(gangs) <= {16, 32, 64}
    assert len({r[2] for r in rows}) == 4


def test_the_load_mode_hits_the_offered_load_with_quota_shaped_vcs_and_limits() -> None:
    mod = _module()
    mod.LIMIT["over"], mod.LIMIT["round_s"] = (1.2, 3.0), 3600.0
    rows = mod.generate_at_load(0.8, 7, seed=3, no_limit=0.0, max_share=0.5)
    load = mod.offered(rows, 7)
    assert abs(load["cluster"] - 0.8) < 0.1
    # every job sets a limit that covers its run, rounded up to the hour, at most 3x + an hour
    for r in rows:
        limit, run = int(r[9]), float(r[8])
        assert run <= limit <= min(7 * 86400, run * 3 + 3600) and limit % 3600 == 0
    # no job asks more than half its VC's quota (whole nodes, at least 8 GPUs)
    for r in rows:
        assert int(r[6]) * max(1, int(r[7])) <= max(8, mod.QUOTA[r[2]] // 2)
    # jobs by VC roughly in proportion to the quotas (research has the smallest share)
    counts = {vc: sum(1 for r in rows if r[2] == vc) for vc in mod.QUOTA}
    assert counts["vision"] > counts["nlp"] > counts["speech"] > counts["research"] > 0
    # the default trace (no --load) is what it was: the old VC shares and limits
    assert mod.generate(200, 2, seed=19) == mod.generate(200, 2, seed=19, vcs=mod.VCS, no_limit=0.3)


def test_a_replay_under_backfill_obeys_the_rules(tmp_path) -> None:
    subprocess.run([sys.executable, str(SCRIPT), "--jobs", "300", "--days", "1", "--out-dir", str(tmp_path)],
                   check=True, capture_output=True)
    cluster = with_policy(load_cluster(tmp_path / "production_cluster.yaml"), Policy.BACKFILL)
    trace = load_trace(tmp_path / "production.csv", cluster)
    result = Simulation(cluster, trace).run()
    assert check_result(result) == []
    assert result["summary"]["finished"] == 300


def _forced_waits():
    """bench/traces/forced_waits.py, which is a script, not a module of the package."""
    spec = importlib.util.spec_from_file_location("forced_waits", ROOT / "bench" / "traces" / "forced_waits.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _attempt(start, end, node):
    return {"start_s": start, "end_s": end, "gpus": {node: list(range(8))}}


def test_forced_waits_count_only_the_vcs_own_work_running_at_submit(tmp_path) -> None:
    mod = _forced_waits()
    (tmp_path / "c.yaml").write_text(
        "skus:\n  a100: {gpus: 8, cpu: 96, memory_gb: 900}\nnodes:\n  - {prefix: g, count: 4, sku: a100}\n"
        "vcs:\n  - {name: v, quota: {a100: 16}}\n  - {name: w, quota: {a100: 16}}\n")
    head = "id,submit_s,vc,user,type,sku,gpus,nodes,duration_s,max_time_s,priority,preemptible\n"
    (tmp_path / "t.csv").write_text(head + "a,0,v,ann,batch,a100,8,0,100,,100,false\n"
                                    "p,0,v,ann,batch,a100,8,0,500,,100,true\n"
                                    "o,0,w,bob,batch,a100,8,0,900,,100,false\n"
                                    "big,10,v,bob,distributed,a100,8,2,50,,100,false\n")

    result = {"jobs": [
        {"id": "a", "start_s": 0.0, "attempts": [_attempt(0.0, 100.0, "g000")]},
        {"id": "p", "start_s": 0.0, "attempts": [_attempt(0.0, 500.0, "g001")]},  # preemptible: not counted
        {"id": "o", "start_s": 0.0, "attempts": [_attempt(0.0, 900.0, "g002")]},  # another VC: not counted
        {"id": "big", "start_s": 150.0, "attempts": [_attempt(150.0, 200.0, "g000")]},
    ]}
    rows = mod.forced_waits(tmp_path / "c.yaml", tmp_path / "t.csv", result)
    assert rows == [{"id": "big", "vc": "v", "gpus": 16, "wait_s": 140.0, "forced_s": 90.0, "older_s": 90.0}]


def test_older_work_counts_the_vcs_work_submitted_before_the_job_even_if_it_starts_later(tmp_path) -> None:
    mod = _forced_waits()
    (tmp_path / "c.yaml").write_text(
        "skus:\n  a100: {gpus: 8, cpu: 96, memory_gb: 900}\nnodes:\n  - {prefix: g, count: 4, sku: a100}\n"
        "vcs:\n  - {name: v, quota: {a100: 16}}\n")
    head = "id,submit_s,vc,user,type,sku,gpus,nodes,duration_s,max_time_s,priority,preemptible\n"
    (tmp_path / "t.csv").write_text(head + "a,0,v,ann,batch,a100,8,0,100,,100,false\n"
                                    "older,5,v,ann,batch,a100,8,0,300,,100,false\n"
                                    "big,10,v,bob,distributed,a100,8,2,50,,100,false\n"
                                    "young,20,v,cy,batch,a100,8,0,400,,100,false\n")

    result = {"jobs": [
        {"id": "a", "start_s": 0.0, "attempts": [_attempt(0.0, 100.0, "g000")]},
        {"id": "older", "start_s": 100.0, "attempts": [_attempt(100.0, 400.0, "g000")]},  # queued, then ran
        {"id": "young", "start_s": 400.0, "attempts": [_attempt(400.0, 800.0, "g001")]},  # passed it: not counted
        {"id": "big", "start_s": 800.0, "attempts": [_attempt(800.0, 850.0, "g002")]},
    ]}
    rows = mod.forced_waits(tmp_path / "c.yaml", tmp_path / "t.csv", result)
    # running at submit: a (until 100); submitted before it: a and older (from 100 to 400)
    assert rows == [{"id": "big", "vc": "v", "gpus": 16, "wait_s": 790.0, "forced_s": 90.0, "older_s": 390.0}]


def test_older_work_that_starts_during_the_jobs_run_counts_too(tmp_path) -> None:
    mod = _forced_waits()
    (tmp_path / "c.yaml").write_text(
        "skus:\n  a100: {gpus: 8, cpu: 96, memory_gb: 900}\nnodes:\n  - {prefix: g, count: 4, sku: a100}\n"
        "vcs:\n  - {name: v, quota: {a100: 16}}\n")
    head = "id,submit_s,vc,user,type,sku,gpus,nodes,duration_s,max_time_s,priority,preemptible\n"
    # the quota is free at submission, but older work queued for it starts 30 s later and runs 200 s:
    # the 50-second big job fits next to it only once it has ended
    (tmp_path / "t.csv").write_text(head + "older,5,v,ann,batch,a100,8,0,200,,100,false\n"
                                    "big,10,v,bob,distributed,a100,8,2,50,,100,false\n")

    result = {"jobs": [
        {"id": "older", "start_s": 40.0, "attempts": [_attempt(40.0, 240.0, "g000")]},
        {"id": "big", "start_s": 240.0, "attempts": [_attempt(240.0, 290.0, "g001")]},
    ]}
    rows = mod.forced_waits(tmp_path / "c.yaml", tmp_path / "t.csv", result)
    assert rows == [{"id": "big", "vc": "v", "gpus": 16, "wait_s": 230.0, "forced_s": 0.0, "older_s": 230.0}]


def _policy_seeds():
    spec = importlib.util.spec_from_file_location("policy_seeds", ROOT / "bench" / "traces" / "policy_seeds.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_the_seed_study_replays_each_draw_under_each_policy_with_the_vc_settings_given(tmp_path, capsys) -> None:
    mod = _policy_seeds()
    mod.main(["--seeds", "3-4", "--policies", "RF,backfill", "--vc", "fair_share_max_wait_s=3600",
              "--workers", "2", "--out-dir", str(tmp_path), "--json", str(tmp_path / "study.json"),
              "--", "--load", "0.8", "--days", "1", "--max-share", "0.5", "--no-limit", "0"])
    study = json.loads((tmp_path / "study.json").read_text())
    for seed in ("3", "4"):
        cluster = load_cluster(tmp_path / f"seed{seed}" / "trace_cluster.yaml")
        assert {vc.name: vc.fair_share_max_wait_s for vc in cluster.vcs.values()} == dict.fromkeys(
            ("vision", "nlp", "speech", "research"), 3600)
        for policy in ("RF", "backfill"):
            result = json.loads((tmp_path / f"seed{seed}" / f"{policy}.json").read_text())
            assert check_result(result) == []
            assert study["summaries"][seed][policy] == result["summary"]
        rf, bf = (study["summaries"][seed][p] for p in ("RF", "backfill"))
        row = study["table"][seed]["backfill"]
        assert row["avg wait"] == bf["avg_wait_s"] / 3600
        assert row["avg wait ratio"] == bf["avg_wait_s"] / rf["avg_wait_s"]
        assert row["big-job worst ratio"] == bf["big_job_max_wait_s"] / rf["big_job_max_wait_s"]
        assert study["table"][seed]["RF"]["avg wait ratio"] == 1.0
    assert study["median"]["backfill"]["avg wait"] == statistics.median(
        study["table"][s]["backfill"]["avg wait"] for s in ("3", "4"))
    # the two draws differ (the seed reaches the generator)
    assert (tmp_path / "seed3" / "trace.csv").read_text() != (tmp_path / "seed4" / "trace.csv").read_text()
    assert study["violations"] == {}
    out = capsys.readouterr().out
    assert "fair_share_max_wait_s=3600" in out and "| median |" in out
    assert "check_result: 0 rule violations in 4 replays" in out


def test_seeds_are_read_as_ranges_and_lists_each_once() -> None:
    assert _policy_seeds().parse_seeds("1-3,19,2") == [1, 2, 3, 19]


@pytest.mark.parametrize(("argv", "message"), [
    (["--seeds", "a-3"], "--seeds: 'a-3' is not a seed"),
    (["--vc", "fair_share"], "--vc: 'fair_share' is not KEY=VALUE"),
])
def test_the_seed_study_names_the_bad_argument(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as got:
        _policy_seeds().main(argv)
    assert got.value.code == 2
    assert message in capsys.readouterr().err
