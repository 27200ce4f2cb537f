"""Forecast benchmark: what one forecast (``dlts.scheduler.forecast``, the forecast manager's run)
costs on the scheduling-pass benchmark's snapshots, and how far it gets.

    .venv/bin/python bench/forecast.py                      # 2k/200 and 20k/2000, RF/FIFO mix and backfill
    .venv/bin/python bench/forecast.py --only 20000 2000 --policy backfill --repeat 3

The snapshots are ``bench/scheduler_pass.py``'s, with limits drawn per job (1 hour to 7 days,
most of them short, as users set them) instead of the VCs' 7 days for all, so running work ends
spread over the week and the forecast needs passes to get through the queue. Each point reports
the median wall time of ``--repeat`` forecasts at the default settings (max_passes 200, precision
0.05), the passes they ran, the share of waiting jobs given a start, and the time of one
scheduling pass over the same snapshot for scale. How close forecasts come to the real starts is
measured with ``dlts sim --forecast-every`` (docs/benchmarks.md, "Forecast start").
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scheduler_pass import NOW, build_snapshot

from dlts.scheduler import Policy, Snapshot, decide
from dlts.scheduler.forecast import MAX_PASSES, PRECISION, forecast

LIMITS_S = [3600] * 4 + [4 * 3600] * 3 + [12 * 3600] * 2 + [86400, 3 * 86400, 7 * 86400]
POINTS = [(2_000, 200), (20_000, 2_000)]


def with_limits(snap: Snapshot, seed: int = 7) -> Snapshot:
    """Each job its own limit; a running job's start moved so it has not yet run past it."""
    rng = random.Random(seed)
    jobs = []
    for j in snap.jobs:
        limit = rng.choice(LIMITS_S)
        if j.running:
            j = replace(j, max_time_s=limit, started_at=NOW - rng.uniform(0, limit))
        else:
            j = replace(j, max_time_s=limit)
        jobs.append(j)
    return replace(snap, jobs=tuple(jobs))


def one_point(n_jobs: int, n_nodes: int, policy: str | None, repeat: int) -> dict:
    snap = with_limits(build_snapshot(n_jobs, n_nodes, policy=policy))
    t = time.perf_counter()
    decide(snap, NOW)
    pass_s = time.perf_counter() - t
    times, last = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        last = forecast(snap, NOW)
        times.append(time.perf_counter() - t)
    assert last is not None
    waiting = sum(1 for j in snap.jobs if not j.running)
    return {
        "pending": n_jobs,
        "nodes": n_nodes,
        "policy": policy or "RF/FIFO mix",
        "pass_s": round(pass_s, 3),
        "forecast_median_s": round(statistics.median(times), 2),
        "forecast_all_s": [round(x, 2) for x in times],
        "passes": last.passes,
        "max_passes": MAX_PASSES,
        "precision": PRECISION,
        "given_a_start": len(last.starts),
        "waiting": waiting,
        "share": round(len(last.starts) / waiting, 3) if waiting else 1.0,
        "horizon_h": None if last.horizon == float("inf") else round((last.horizon - NOW) / 3600, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs=2, type=int, metavar=("PENDING", "NODES"), help="one point")
    ap.add_argument("--policy", choices=[p.value for p in Policy], default=None,
                    help="every VC on this policy (default: the pass benchmark's RF/FIFO mix)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    points = [tuple(args.only)] if args.only else POINTS
    policies = [args.policy] if args.policy or args.only else [None, Policy.BACKFILL.value]
    rows = [one_point(n, m, p, args.repeat) for n, m in points for p in policies]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'pending':>8} {'nodes':>6} {'policy':<12} {'pass s':>7} {'forecast s':>10} {'passes':>6} "
          f"{'given a start':>14} {'horizon h':>9}")
    for r in rows:
        horizon = "-" if r["horizon_h"] is None else f"{r['horizon_h']:g}"
        print(f"{r['pending']:>8} {r['nodes']:>6} {r['policy']:<12} {r['pass_s']:>7.3f} {r['forecast_median_s']:>10.2f} "
              f"{r['passes']:>6} {r['given_a_start']:>7}/{r['waiting']:<6} {horizon:>9}")


if __name__ == "__main__":
    main()
