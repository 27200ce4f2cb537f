"""``dlts sim``: the example scenarios replay cleanly, results re-check, bad input reads well."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlts.sim.cli import sim_command
from dlts.sim.engine import Simulation
from dlts.sim.inputs import load_cluster, load_trace
from dlts.sim.verify import check_result

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "bench" / "traces"
CLUSTER = TRACES / "cluster.yaml"

HEADER = "id,submit_s,vc,user,type,sku,gpus,nodes,duration_s,max_time_s,priority,preemptible\n"

SMALL_CLUSTER = """\
skus:
  a100: {gpus: 8, cpu: 96, memory_gb: 900}
  cpu:  {gpus: 0, cpu: 64, memory_gb: 256}
nodes:
  - {prefix: g, count: 4, sku: a100, ib_domains: 2}
  - {name: c1, sku: cpu}
vcs:
  - {name: vision, quota: {a100: 16}, policy: FIFO, max_job_time_s: 3600, max_interactive_gpus: 2}
  - {name: lab, quota: {a100: 16}, policy: RF}
tick_s: 10
"""


@pytest.mark.parametrize("scenario", ["steady", "bursts"])
def test_example_trace_replays_and_every_rule_rechecks_from_result(tmp_path: Path, scenario: str) -> None:
    out = tmp_path / "result.json"
    res = CliRunner().invoke(
        sim_command, ["--cluster", str(CLUSTER), "--trace", str(TRACES / f"{scenario}.csv"), "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    result = json.loads(out.read_text())
    assert check_result(result) == []
    s = result["summary"]
    assert s["jobs"] == 400 and s["finished"] > 300
    assert s["preemptions"] > 0 and s["killed"] > 0  # the scenarios exercise reclaim and wall time
    reasons = {r for j in result["jobs"] for r in j["wait_reasons"]}
    assert {"blocked_by", "capacity", "vc_quota", "interactive_cap"} <= reasons
    types = {j["type"] for j in result["jobs"] if j["state"] == "finished"}
    assert types == {"batch", "interactive", "distributed", "inference"}
    if scenario == "bursts":
        assert s["scale_downs"] > 0


def test_result_format_matches_scheduling_md(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(SMALL_CLUSTER)
    (tmp_path / "t.csv").write_text(
        HEADER
        + "1,0,vision,ann,batch,a100,8,0,100,,100,false\n"
        + "2,5,vision,ann,distributed,a100,8,2,50,,100,false\n"
        + "3,5,lab,bob,batch,a100,8,0,5000,,100,true\n"
        + "4,0,vision,ann,batch,a100,4,0,9000,,100,false\n"
    )
    res = CliRunner().invoke(
        sim_command, ["--cluster", str(tmp_path / "c.yaml"), "--trace", str(tmp_path / "t.csv"), "--out", str(tmp_path / "r.json")]
    )
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "r.json").read_text())
    jobs = {j["id"]: j for j in r["jobs"]}
    for j in jobs.values():
        assert {"id", "vc", "user", "submit_s", "start_s", "end_s", "state", "attempts", "wait_reasons"} <= set(j)
        for a in j["attempts"]:
            assert {"start_s", "end_s", "nodes", "gpus", "reason"} <= set(a)
    assert {"makespan_s", "avg_wait_s", "p95_wait_s", "avg_jct_s", "gpu_utilization", "preemptions", "by_vc"} <= set(
        r["summary"]
    )
    assert jobs[1]["state"] == "finished" and jobs[1]["attempts"][0] == {
        "start_s": 0.0,
        "end_s": 100.0,
        "nodes": ["g000"],
        "gpus": {"g000": list(range(8))},
        "reason": "finished",
    }
    # Job 4 runs past VC vision's 3600 s limit: killed at the first tick after it.
    assert jobs[4]["state"] == "killed" and jobs[4]["attempts"][-1]["reason"] == "wall_time"
    assert jobs[4]["end_s"] == 3600.0
    # The gang takes two whole nodes of one domain.
    gang = jobs[2]["attempts"][0]
    assert len(gang["nodes"]) == 2
    # Job 3 (preemptible, another VC) gives way to the gang and comes back.
    assert [a["reason"] for a in jobs[3]["attempts"]][0] in ("preempted", "finished")
    assert check_result(r) == []


def test_preempted_job_is_requeued_keeping_its_queue_time(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(SMALL_CLUSTER)
    (tmp_path / "t.csv").write_text(
        HEADER
        + "".join(f"{i},0,lab,bob,batch,a100,8,0,1000,,100,true\n" for i in range(1, 5))
        + "5,100,vision,ann,batch,a100,8,0,300,,100,false\n"
        + "6,200,lab,bob,batch,a100,8,0,1000,,100,true\n"
    )
    cluster = load_cluster(tmp_path / "c.yaml")
    result = Simulation(cluster, load_trace(tmp_path / "t.csv", cluster)).run()
    jobs = {j["id"]: j for j in result["jobs"]}
    preempted = [j for j in jobs.values() if any(a["reason"] == "preempted" for a in j["attempts"])]
    assert len(preempted) == 1
    victim = preempted[0]
    assert victim["attempts"][0]["end_s"] == 100.0 == jobs[5]["start_s"]
    # Back at the head of the queue: it restarts before job 6, submitted later.
    assert victim["attempts"][1]["start_s"] <= jobs[6]["start_s"]
    assert result["summary"]["preemptions"] == 1
    assert check_result(result) == []


def test_python_dash_m_runs_the_same_command(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "dlts.sim", "--cluster", str(CLUSTER), "--trace", str(TRACES / "steady.csv"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "400 jobs" in proc.stdout
    assert json.loads(out.read_text())["summary"]["jobs"] == 400


BAD_INPUTS = [
    ("missing cluster file", None, HEADER, "c.yaml: cannot read"),
    ("YAML syntax error", "skus: [\n", HEADER, "c.yaml, line"),
    ("node with an unknown SKU", SMALL_CLUSTER.replace("sku: cpu}", "sku: tpu}"), HEADER, "field 'nodes[1].sku'"),
    ("VC with a bad policy", SMALL_CLUSTER.replace("policy: RF", "policy: LIFO"), HEADER, "field 'vcs[1].policy'"),
    ("SKU with a non-numeric GPU count", SMALL_CLUSTER.replace("gpus: 8,", "gpus: eight,"), HEADER, "skus.a100.gpus"),
    ("trace lacks a column", SMALL_CLUSTER, "id,submit_s,vc\n", "t.csv, line 1, field 'user'"),
    ("trace row with an unknown VC", SMALL_CLUSTER, HEADER + "1,0,nope,ann,batch,a100,1,0,10,,100,false\n", "t.csv, line 2, field 'vc'"),
    ("trace row with a bad number", SMALL_CLUSTER, HEADER + "1,0,lab,ann,batch,a100,x,0,10,,100,false\n", "line 2, field 'gpus'"),
    ("distributed row without nodes", SMALL_CLUSTER, HEADER + "1,0,lab,ann,distributed,a100,8,0,10,,100,false\n", "field 'nodes'"),
    ("duplicate job id", SMALL_CLUSTER,
     HEADER + "1,0,lab,a,batch,a100,1,0,10,,100,false\n1,0,lab,a,batch,a100,1,0,10,,100,false\n", "line 3, field 'id'"),
]


@pytest.mark.parametrize("name,cluster,trace,expect", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_names_file_line_and_field(tmp_path: Path, name: str, cluster, trace: str, expect: str) -> None:
    if cluster is not None:
        (tmp_path / "c.yaml").write_text(cluster)
    (tmp_path / "t.csv").write_text(trace)
    res = CliRunner().invoke(
        sim_command, ["--cluster", str(tmp_path / "c.yaml"), "--trace", str(tmp_path / "t.csv"), "--out", str(tmp_path / "r.json")]
    )
    assert res.exit_code == 2, res.output
    assert expect in res.output, res.output
    assert ("Traceback" not in res.output and res.exception is None) or isinstance(res.exception, SystemExit)


def test_a_terminal_gets_a_progress_bar(tmp_path: Path) -> None:
    """stdout on a pseudo-terminal: the command draws click's progress bar and still succeeds."""
    import os

    primary, secondary = os.openpty()
    out = tmp_path / "r.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlts.sim", "--cluster", str(CLUSTER), "--trace", str(TRACES / "steady.csv"), "--out", str(out)],
        stdout=secondary,
        stderr=subprocess.PIPE,
    )
    os.close(secondary)
    chunks = []
    while True:
        try:
            data = os.read(primary, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=120) == 0, proc.stderr.read() if proc.stderr else ""
    os.close(primary)
    text = b"".join(chunks).decode(errors="replace")
    assert "simulating" in text and "400/400" in text
    assert json.loads(out.read_text())["summary"]["jobs"] == 400


def test_forecast_every_reports_how_close_the_first_forecasts_came(tmp_path: Path) -> None:
    """``--forecast-every`` runs the forecast manager's forecast in the replay; its summary is
    re-derived here from the rows the replay wrote, and it does not change a decision."""
    def run(*extra: str) -> dict:
        out = tmp_path / f"r{len(extra)}{'-'.join(extra)}.json"
        res = CliRunner().invoke(sim_command, ["--cluster", str(CLUSTER), "--trace", str(TRACES / "bursts.csv"),
                                               "--out", str(out), *extra])
        assert res.exit_code == 0, res.output
        return json.loads(out.read_text()) | {"output": res.output}

    plain = run()
    predicted = run("--forecast-every", "600")
    limits = run("--forecast-every", "600", "--forecast-history", "0")
    assert "forecast" not in plain["summary"] and "forecast_start_s" not in plain["jobs"][0]
    for r in (predicted, limits):  # the same replay
        assert [j["start_s"] for j in r["jobs"]] == [j["start_s"] for j in plain["jobs"]]
    f = predicted["summary"]["forecast"]
    reached = [j for j in predicted["jobs"] if j["forecast_made_s"] is not None and j["start_s"] is not None
               and j["start_s"] > j["forecast_made_s"]]
    assert f["jobs"] == len(reached) > 20 and f["history_runs"] == 2 and f["forecasts"] > 10
    errors = sorted(abs(j["forecast_start_s"] - j["start_s"]) / 3600 for j in reached)
    assert f["abs_error_h_p50"] == errors[(len(errors) + 1) // 2 - 1]
    assert f["early_share"] == sum(j["forecast_start_s"] < j["start_s"] for j in reached) / len(reached)
    assert all(j["forecast_made_s"] <= j["forecast_start_s"] for j in reached)
    assert "first forecast off by" in predicted["output"] and "limits only" in limits["output"]
    # limits are generous guesses: forecasts from them alone come later than the starts more often
    lf = limits["summary"]["forecast"]
    assert lf["history_runs"] == 0 and lf["early_share"] < f["early_share"]


def test_forecast_every_refuses_a_period_under_a_minute(tmp_path: Path) -> None:
    res = CliRunner().invoke(sim_command, ["--cluster", str(CLUSTER), "--trace", str(TRACES / "bursts.csv"),
                                           "--out", str(tmp_path / "r.json"), "--forecast-every", "5"])
    assert res.exit_code == 2 and "--forecast-every" in res.output and "60" in res.output
