"""How much of the big jobs' waits no scheduler could have avoided, from a ``dlts sim`` RESULT.

    python bench/traces/forced_waits.py --cluster bench/traces/production_cluster.yaml \\
        --trace bench/traces/production.csv --result /tmp/prod.backfill.json [--top 6]

For every non-preemptible job of at least ``--min-gpus`` GPUs (default 16), the *forced* part of
its wait is how long its VC's own non-preemptible work that was already running when the job was
submitted kept the VC's quota too full for it, had nothing else started afterwards: walk those
running attempts by their real end and stop when the quota left holds the job. Under
SCHEDULING.md's rules (the VC guarantee caps a VC's non-preemptible GPUs at its quota; only
preemptible work is ever preempted) no decision taken after the job was submitted could have
started it earlier than that, whatever the policy (only leaving quota idle *before* it arrived,
which needs knowing it will come, could).
The jobs are listed by wait, worst first, with the forced part next to it, and the *older work*
part: until when the VC's non-preemptible work submitted before the job (running or started later
in the replay) kept the quota too full for it. A policy that keeps the VC's order serves that work
first; the wait beyond it is younger work passing the job.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dlts.sim.inputs import load_cluster, load_trace


def forced_waits(cluster_path: Path, trace_path: Path, result: dict, min_gpus: int = 16) -> list[dict]:
    cluster = load_cluster(cluster_path)
    trace = {str(t.trace_id): t for t in load_trace(trace_path, cluster)}
    jobs = result["jobs"]
    rows = []
    for j in jobs:
        t = trace[str(j["id"])]
        size = t.gpus * max(1, t.nodes)
        if size < min_gpus or t.preemptible or j["start_s"] is None or t.sku is None:
            continue
        quota = cluster.vcs[t.vc].quota.get(t.sku, 0)
        held: list[tuple[float, int]] = []
        for x in jobs:
            tx = trace[str(x["id"])]
            if x is j or tx.vc != t.vc or tx.preemptible or tx.sku != t.sku:
                continue
            for a in x["attempts"]:
                if a["start_s"] <= t.submit_s and (a["end_s"] is None or a["end_s"] > t.submit_s):
                    end = a["end_s"] if a["end_s"] is not None else float("inf")
                    held.append((end, sum(len(v) for v in a["gpus"].values())))
        used = sum(g for _, g in held)
        free_at = t.submit_s
        for end, g in sorted(held):
            if quota - used >= size:
                break
            used -= g
            free_at = end
        rows.append({"id": j["id"], "vc": t.vc, "gpus": size, "wait_s": j["start_s"] - t.submit_s,
                     "forced_s": free_at - t.submit_s,
                     "older_s": _older_free(jobs, trace, t, j, quota, size) - t.submit_s})
    rows.sort(key=lambda r: -r["wait_s"])
    return rows


def _older_free(jobs: list[dict], trace: dict, t, j: dict, quota: int, size: int) -> float:
    """The first time from the job's submission at which it, running its real duration, fits in
    its VC's quota next to the VC's non-preemptible work *submitted before it*, as that work really
    ran (running then, or started later in this replay). Up to it the job waited for older work of
    its VC, which a policy that keeps the VC's order serves first (backfill lets a job start next
    to it only if it delays none of it); the wait beyond it is younger work passing the job (RF's
    starvation) or room lost to nodes rather than quota."""
    spans: list[tuple[float, float, int]] = []
    for x in jobs:
        tx = trace[str(x["id"])]
        if x is j or tx.vc != t.vc or tx.preemptible or tx.sku != t.sku or tx.submit_s >= t.submit_s:
            continue
        for a in x["attempts"]:
            end = a["end_s"] if a["end_s"] is not None else float("inf")
            if end > t.submit_s:
                spans.append((a["start_s"], end, sum(len(v) for v in a["gpus"].values())))
    run = float(t.duration_s)
    for at in sorted({t.submit_s} | {e for _s, e, _g in spans if e > t.submit_s}):
        points = [at] + [s0 for s0, _e, _g in spans if at < s0 < at + run]
        if all(quota - sum(g for s0, e, g in spans if s0 <= p < e) >= size for p in points):
            return at
    return float("inf")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", type=Path, required=True)
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--result", type=Path, required=True, nargs="+")
    ap.add_argument("--min-gpus", type=int, default=16)
    ap.add_argument("--top", type=int, default=6)
    args = ap.parse_args()
    for path in args.result:
        rows = forced_waits(args.cluster, args.trace, json.loads(path.read_text()), args.min_gpus)
        print(f"{path}: {len(rows)} non-preemptible jobs of >= {args.min_gpus} GPUs")
        for r in rows[: args.top]:
            print(f"  {r['id']:>16} {r['vc']:>9} {r['gpus']:>3} GPUs  wait {r['wait_s'] / 3600:7.1f} h"
                  f"  forced {r['forced_s'] / 3600:7.1f} h  older work {r['older_s'] / 3600:7.1f} h")


if __name__ == "__main__":
    main()
