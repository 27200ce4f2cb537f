"""Policies side by side over many draws of the production-shaped trace, not one.

    python bench/traces/policy_seeds.py --seeds 1-8                     # production_28d's shape, RF vs backfill
    python bench/traces/policy_seeds.py --seeds 1-8 --vc fair_share_max_wait_s=43200
    python bench/traces/policy_seeds.py --seeds 19 --policies FIFO,RF,backfill --json /tmp/seeds.json

For each seed, ``production.py`` writes a trace (by default with ``production_28d.csv``'s
arguments: ``--load 0.8 --days 28 --max-share 0.5 --no-limit 0``) and its cluster file; ``--vc
KEY=VALUE`` sets a scheduling setting on every VC of that cluster file; then ``dlts sim --policy P``
replays it once per policy, ``--workers`` replays at a time, and ``check_result`` re-checks every
RESULT against the rules. The table has, per seed, each policy's average wait and the worst wait
of a job of 16 GPUs or more (all of them, and the non-preemptible ones alone), each also as a
ratio to the first policy's; the last row is the median over the seeds. One trace's worst job moves with any change of the decisions, so the
ratios over several draws say more than one replay does (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from dlts.sim.verify import check_result

HERE = Path(__file__).resolve().parent
GENERATOR = HERE / "production.py"
TRACE_28D = ["--load", "0.8", "--days", "28", "--max-share", "0.5", "--no-limit", "0"]
METRICS = {  # column -> RESULT.json summary key
    "avg wait": "avg_wait_s",
    "big-job worst": "big_job_max_wait_s",
    "big-job worst, non-preemptible": "big_job_max_wait_guaranteed_s",
}


def parse_seeds(text: str) -> list[int]:
    """``1-8``, ``3,7,11`` or both (``1-4,19``)."""
    seeds: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            seeds.extend(range(int(lo), int(hi) + 1) if hi else [int(lo)])
        except ValueError:
            raise argparse.ArgumentTypeError(f"--seeds: {part!r} is not a seed or a range like 1-8") from None
    if not seeds:
        raise argparse.ArgumentTypeError("--seeds: give at least one seed")
    return list(dict.fromkeys(seeds))  # each once: a seed's files are written in one folder


def parse_setting(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--vc: {text!r} is not KEY=VALUE")
    return key, yaml.safe_load(value)


def write_trace(seed: int, out: Path, generator_args: list[str], settings: list[tuple[str, object]]) -> tuple[Path, Path]:
    """The seed's trace and cluster file (with ``settings`` on every VC), written under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, str(GENERATOR), *generator_args, "--seed", str(seed), "--name", "trace",
                    "--out-dir", str(out)], check=True, capture_output=True, text=True)
    cluster = out / "trace_cluster.yaml"
    if settings:
        doc = yaml.safe_load(cluster.read_text())
        for vc in doc["vcs"]:
            vc.update(settings)
        cluster.write_text(yaml.safe_dump(doc, sort_keys=False))
    return cluster, out / "trace.csv"


def replay(cluster: Path, trace: Path, policy: str, out: Path) -> tuple[dict, list[str]]:
    """``dlts sim --policy`` as a user runs it: the summary of its RESULT.json, and what
    ``check_result`` finds wrong in it (every rule of SCHEDULING.md it can re-check)."""
    got = subprocess.run([sys.executable, "-m", "dlts", "sim", "--cluster", str(cluster), "--trace", str(trace),
                          "--out", str(out), "--policy", policy], capture_output=True, text=True)
    if got.returncode != 0:
        raise SystemExit(f"dlts sim --policy {policy} on {trace} failed:\n{got.stdout}{got.stderr}")
    result = json.loads(out.read_text())
    return result["summary"], [str(v) for v in check_result(result)]


def ratios(per_seed: dict[int, dict[str, dict]], policies: list[str]) -> dict[int, dict[str, dict[str, float]]]:
    """Per seed, policy and metric: the value in hours and its ratio to the first policy's."""
    base = policies[0]
    out: dict[int, dict[str, dict[str, float]]] = {}
    for seed, by_policy in per_seed.items():
        out[seed] = {}
        for p in policies:
            row: dict[str, float] = {}
            for name, key in METRICS.items():
                value, ref = by_policy[p][key], by_policy[base][key]
                row[name] = value / 3600
                row[name + " ratio"] = value / ref if ref else float("nan")
            out[seed][p] = row
    return out


def medians(table: dict[int, dict[str, dict[str, float]]], policies: list[str]) -> dict[str, dict[str, float]]:
    return {p: {k: statistics.median(t[p][k] for t in table.values()) for k in next(iter(table.values()))[p]}
            for p in policies}


def markdown(table: dict[int, dict[str, dict[str, float]]], policies: list[str]) -> str:
    base = policies[0]
    others = policies[1:] or policies
    head = ["seed"]
    for name in METRICS:
        head.append(f"{name}, {' / '.join(policies)}")
        head.extend(f"{name}, {p}/{base}" for p in others)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = [(str(s), t) for s, t in table.items()] + [("median", medians(table, policies))]
    for label, t in rows:
        cells = [label]
        for name in METRICS:
            cells.append(" / ".join(f"{t[p][name]:.2f} h" for p in policies))
            cells.extend(f"{t[p][name + ' ratio']:.2f}x" for p in others)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=parse_seeds, default=parse_seeds("1-8"), help="e.g. 1-8 or 3,7,19")
    ap.add_argument("--policies", default="RF,backfill",
                    help="comma-separated; the first is the one the ratios are taken against")
    ap.add_argument("--vc", type=parse_setting, action="append", default=[], metavar="KEY=VALUE",
                    help="set on every VC of the cluster file (repeatable), e.g. fair_share_max_wait_s=43200")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="replays at a time")
    ap.add_argument("--out-dir", type=Path, default=Path("/tmp/dlts-policy-seeds"))
    ap.add_argument("--json", type=Path, help="also write every summary and ratio here")
    ap.add_argument("generator", nargs="*", metavar="-- GENERATOR_ARG",
                    help="production.py arguments instead of production_28d's (after --)")
    args = ap.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        ap.error("--policies: give at least one policy")
    generator_args = args.generator or TRACE_28D

    with ThreadPoolExecutor(max(1, args.workers)) as pool:
        files = dict(zip(args.seeds, pool.map(
            lambda s: write_trace(s, args.out_dir / f"seed{s}", generator_args, args.vc), args.seeds)))
        jobs = {(s, p): pool.submit(replay, *files[s], p, args.out_dir / f"seed{s}" / f"{p}.json")
                for s in args.seeds for p in policies}
        done = {(s, p): jobs[s, p].result() for s in args.seeds for p in policies}
    per_seed = {s: {p: done[s, p][0] for p in policies} for s in args.seeds}
    violations = {f"{s} {p}": done[s, p][1] for s in args.seeds for p in policies if done[s, p][1]}

    table = ratios(per_seed, policies)
    print(f"production.py {' '.join(generator_args)}; every VC: "
          f"{', '.join(f'{k}={v}' for k, v in args.vc) or 'as written'}")
    print(markdown(table, policies))
    print(f"check_result: {sum(map(len, violations.values()))} rule violations in {len(done)} replays")
    for where, found in violations.items():
        print(f"  seed {where}: " + "; ".join(found[:3]) + (" ..." if len(found) > 3 else ""))
    if args.json:
        args.json.write_text(json.dumps({"generator": generator_args, "vc": dict(args.vc), "policies": policies,
                                         "summaries": per_seed, "table": table, "violations": violations,
                                         "median": medians(table, policies)}, indent=1))


if __name__ == "__main__":
    main()
