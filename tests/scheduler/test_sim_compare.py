"""``dlts sim``: string job ids, ``--policy`` overriding every VC, ``--compare`` and ``--chart``."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from click.testing import CliRunner

from dlts.sim.cli import sim_command
from dlts.sim.verify import check_result

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "bench" / "traces" / "cluster.yaml"
STEADY = ROOT / "bench" / "traces" / "steady.csv"
HEADER = "id,submit_s,vc,user,type,sku,gpus,nodes,duration_s,max_time_s,priority,preemptible\n"


def _run(*args: str):
    return CliRunner().invoke(sim_command, list(args))


def test_string_ids_from_real_traces_replay_and_come_back_as_written(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        HEADER
        + "application_1506638472019_14199,0,vision,a,batch,a100,8,0,600,,100,false\n"
        + "application_1506638472019_14200,5,vision,b,distributed,a100,8,2,600,,100,false\n"
        + "app_3,1,speech,b,batch,a100,2,0,60,,100,false\n"
    )
    out = tmp_path / "r.json"
    res = _run("--cluster", str(CLUSTER), "--trace", str(trace), "--out", str(out))
    assert res.exit_code == 0, res.output
    result = json.loads(out.read_text())
    assert {j["id"] for j in result["jobs"]} == {
        "application_1506638472019_14199", "application_1506638472019_14200", "app_3"
    }
    assert all(j["state"] == "finished" for j in result["jobs"])
    assert check_result(result) == []


def test_duplicate_string_id_is_refused_naming_line_and_field(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(HEADER + "job_a,0,vision,a,batch,a100,1,0,60,,100,false\n" + "job_a,1,vision,a,batch,a100,1,0,60,,100,false\n")
    res = _run("--cluster", str(CLUSTER), "--trace", str(trace), "--out", str(tmp_path / "r.json"))
    assert res.exit_code == 2
    assert "line 3" in res.output and "'id'" in res.output and "appears twice" in res.output


def test_numeric_ids_stay_numbers(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(HEADER + "7,0,vision,a,batch,a100,1,0,60,,100,false\n")
    out = tmp_path / "r.json"
    assert _run("--cluster", str(CLUSTER), "--trace", str(trace), "--out", str(out)).exit_code == 0
    assert json.loads(out.read_text())["jobs"][0]["id"] == 7


def test_policy_overrides_every_vc(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = _run("--cluster", str(CLUSTER), "--trace", str(STEADY), "--out", str(out), "--policy", "FIFO")
    assert res.exit_code == 0, res.output
    result = json.loads(out.read_text())
    assert {v["policy"] for v in result["cluster"]["vcs"].values()} == {"FIFO"}
    assert check_result(result) == []
    # vision and nlp are RF in the file: under FIFO their jobs get blocked_by too
    assert any("blocked_by" in j["wait_reasons"] for j in result["jobs"] if j["vc"] in ("vision", "nlp"))


def test_bad_policy_names_the_option(tmp_path: Path) -> None:
    res = _run("--cluster", str(CLUSTER), "--trace", str(STEADY), "--out", str(tmp_path / "r.json"), "--policy", "LIFO")
    assert res.exit_code == 2 and "--policy" in res.output and "LIFO" in res.output
    res = _run("--cluster", str(CLUSTER), "--trace", str(STEADY), "--out", str(tmp_path / "r.json"), "--compare", "RF,nope")
    assert res.exit_code == 2 and "--compare" in res.output and "nope" in res.output
    res = _run("--cluster", str(CLUSTER), "--trace", str(STEADY), "--out", str(tmp_path / "r.json"), "--chart", "x.svg")
    assert res.exit_code == 2 and "--chart needs --compare" in res.output


def test_compare_prints_table_writes_each_result_and_an_svg(tmp_path: Path) -> None:
    out, chart = tmp_path / "r.json", tmp_path / "c.svg"
    res = _run("--cluster", str(CLUSTER), "--trace", str(STEADY), "--out", str(out),
               "--compare", "RF,FIFO", "--chart", str(chart))
    assert res.exit_code == 0, res.output
    for p in ("RF", "FIFO"):
        result = json.loads((tmp_path / f"r.{p}.json").read_text())
        assert {v["policy"] for v in result["cluster"]["vcs"].values()} == {p}
        assert check_result(result) == []
        guaranteed = [j["start_s"] - j["submit_s"] for j in result["jobs"]
                      if j["start_s"] is not None and not j["preemptible"] and j["gpus"] * max(1, j["nodes"]) >= 16]
        assert guaranteed and result["summary"]["big_job_max_wait_guaranteed_s"] == max(guaranteed)
    header = next(line for line in res.output.splitlines() if line.startswith("| metric"))
    assert [c.strip() for c in header.strip("|").split("|")] == ["metric", "RF", "FIFO"]
    for label in ("avg wait", "p50 wait", "p95 wait", "max wait", "avg JCT", "GPU utilisation", "preemptions",
                  "big-job (>=16 GPUs) max wait", "... non-preemptible only"):
        assert f"| {label}" in res.output
    svg = ET.fromstring(chart.read_text())
    lines = svg.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == 4  # queue length and utilisation, per policy
    assert all(len(pl.get("points").split()) == 300 for pl in lines)


def test_compare_with_forecasts_adds_their_accuracy_per_policy(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = _run("--cluster", str(CLUSTER), "--trace", str(STEADY), "--out", str(out), "--compare", "RF,backfill",
               "--forecast-every", "900")
    assert res.exit_code == 0, res.output
    row = next(line for line in res.output.splitlines() if line.startswith("| ... first forecast off by, p50"))
    cells = [c.strip() for c in row.strip("|").split("|")][1:]
    for p, cell in zip(("RF", "backfill"), cells, strict=True):
        f = json.loads((tmp_path / f"r.{p}.json").read_text())["summary"]["forecast"]
        assert cell == f"{f['abs_error_h_p50']:.2f} h" and f["jobs"] > 0
    plain = _run("--cluster", str(CLUSTER), "--trace", str(STEADY), "--out", str(out), "--compare", "RF,backfill")
    assert "first forecast" not in plain.output
