"""Scheduling-pass benchmark: one ``decide`` over a large synthetic snapshot, and ``dlts sim``
over a 10,000-job trace.

    .venv/bin/python bench/scheduler_pass.py            # the curve 2k/200 .. 20k/2000, then the sim
    .venv/bin/python bench/scheduler_pass.py --only 20000 2000 --repeat 5

The full-size snapshot: 20,000 pending jobs, 2,000 nodes of 8 GPUs in 4 SKUs and 20 IB domains,
50 VCs whose quotas split each SKU's GPUs; 10 % of pending jobs preemptible, 5 % distributed
(2-4 whole nodes), the rest batch/interactive/inference of 1-8 GPUs. Half the GPUs are already
held by running jobs (a fifth of them preemptible), so a pass both places and rejects, with
reclaim, FIFO blocking and every reason. Smaller points scale nodes, domains and VCs with it.

Each point runs in a fresh process so its peak RSS (``ru_maxrss``) is its own. A pass is timed
as the median of ``--repeat`` runs; placements/s is the GPU placements the pass made divided by
that median.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from dlts.scheduler import Job, JobType, Node, Placement, Policy, SkuShape, Snapshot, Vc, decide

GIB = 1024**3
SKUS = {name: SkuShape(name, 8, 96.0, 1024 * GIB) for name in ("a100", "h100", "v100", "l40s")}
CURVE = [(2_000, 200), (5_000, 500), (10_000, 1_000), (20_000, 2_000)]
HERE = Path(__file__).resolve().parent


NOW = 200_000.0  # the pass's time


def build_snapshot(n_jobs: int, n_nodes: int, seed: int = 42, policy: str | None = None,
                   fair_share: bool = False, limit_weight: float = 0.0) -> Snapshot:
    rng = random.Random(seed)
    n_domains = max(2, n_nodes // 100)
    n_vcs = max(5, n_nodes // 40)
    sku_names = list(SKUS)
    nodes = []
    for i in range(n_nodes):
        sku = sku_names[i % len(sku_names)]
        nodes.append(Node(f"n{i:05d}", sku, 8, 96.0, 1024 * GIB, f"ib{(i // len(sku_names)) % n_domains:02d}"))
    vc_names = [f"vc{i:02d}" for i in range(n_vcs)]
    per_sku_gpus = {s: 8 * sum(1 for n in nodes if n.sku == s) for s in sku_names}
    vcs = {
        name: Vc(
            name,
            {s: per_sku_gpus[s] // n_vcs for s in sku_names},
            Policy(policy) if policy else (Policy.FIFO if k % 3 == 0 else Policy.RF),
            max_job_time_s=7 * 86400,
            max_interactive_gpus=16,
            user_gpu_quota=64,
            limit_weight=limit_weight,
        )
        for k, name in enumerate(vc_names)
    }
    jobs: list[Job] = []
    jid = 0
    # Running work: fill about half of the GPUs, node by node, with 1-8 GPU jobs.
    for node in nodes[: n_nodes // 2]:
        free = 8
        while free > 0:
            g = min(free, rng.choice([1, 2, 4, 8]))
            start = 8 - free
            jid += 1
            vc = vc_names[jid % n_vcs]
            jobs.append(
                Job(
                    id=jid,
                    vc=vc,
                    user=f"u{jid % 40}",
                    type=JobType.BATCH,
                    sku=node.sku,
                    gpus=g,
                    cpu=12.0 * g,
                    memory_bytes=128 * GIB * g,
                    queue_time=0.0,
                    preemptible=rng.random() < 0.2,
                    running=True,
                    started_at=float(rng.randint(0, 3600)),
                    placements=(Placement(node.name, tuple(range(start, start + g)), 12.0 * g, 128 * GIB * g),),
                )
            )
            free -= g
    for _ in range(n_jobs):
        jid += 1
        vc = rng.choice(vc_names)
        r = rng.random()
        common = dict(
            id=jid,
            vc=vc,
            user=f"u{rng.randrange(40)}",
            sku=rng.choice(sku_names),
            cpu=0.0,
            memory_bytes=0,
            queue_time=float(rng.randint(0, 100_000)),
            priority=rng.choice([100, 100, 100, 200, 50]),
            preemptible=rng.random() < 0.10,
        )
        if r < 0.05:
            jobs.append(Job(type=JobType.DISTRIBUTED, gpus=8, nodes=rng.choice([2, 3, 4]), **common))
        elif r < 0.10:
            jobs.append(Job(type=JobType.INTERACTIVE, gpus=rng.choice([1, 2]), **common))
        elif r < 0.13:
            jobs.append(Job(type=JobType.INFERENCE, gpus=1, min_replicas=1, max_replicas=3, **common))
        else:
            jobs.append(Job(type=JobType.BATCH, gpus=rng.choice([1, 1, 2, 4, 8]), **common))
    usage = fair_share_usage(jobs, seed) if fair_share else {}
    return Snapshot(SKUS, tuple(nodes), vcs, tuple(jobs), fair_share_usage=usage)


def fair_share_usage(jobs: list[Job], seed: int) -> dict[tuple[str, str], float]:
    """Decayed GPU-seconds per (VC, user) as the job manager would hand them: the running jobs'
    GPU time so far, plus, for half of the (VC, user) pairs with jobs, up to a week of 8 GPUs'
    earlier use (its own random stream, so the jobs are the same with and without)."""
    rng = random.Random(seed + 1)
    usage: dict[tuple[str, str], float] = {}
    for j in jobs:
        if j.running and j.started_at is not None:
            usage[(j.vc, j.user)] = usage.get((j.vc, j.user), 0.0) + j.gpus * (NOW - j.started_at)
    for key in sorted({(j.vc, j.user) for j in jobs}):
        if rng.random() < 0.5:
            usage[key] = usage.get(key, 0.0) + rng.uniform(0, 8 * 7 * 86400)
    return usage


def keep_reservations(snap: Snapshot) -> tuple[Snapshot, int]:
    """The snapshot as the next pass would read it: the jobs this pass gave an estimate (a
    reservation) marked ``reserved``, as the job manager reads them back from ``jobs.estimated_start``."""
    held = {w.job_id for w in decide(snap, NOW).waits if w.estimated_start is not None}
    return replace(snap, jobs=tuple(replace(j, reserved=True) if j.id in held else j for j in snap.jobs)), len(held)


def one_point(n_jobs: int, n_nodes: int, repeat: int, policy: str | None = None, fair_share: bool = False,
              kept: bool = False, limit_weight: float = 0.0) -> dict:
    t0 = time.perf_counter()
    snap = build_snapshot(n_jobs, n_nodes, policy=policy, fair_share=fair_share, limit_weight=limit_weight)
    build_s = time.perf_counter() - t0
    held = 0
    if kept:
        snap, held = keep_reservations(snap)
    times, cpu_times, last = [], [], None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        last = decide(snap, NOW)
        times.append(time.perf_counter() - t)
        cpu_times.append(time.process_time() - c)
    assert last is not None
    median = statistics.median(times)
    placements = sum(len(s.placements) for s in last.starts)
    reasons: dict[str, int] = {}
    for w in last.waits:
        reasons[w.reason.value] = reasons.get(w.reason.value, 0) + 1
    return {
        "pending": n_jobs,
        "nodes": n_nodes,
        "running": sum(1 for j in snap.jobs if j.running),
        "build_s": round(build_s, 3),
        "pass_median_s": round(median, 4),
        "pass_all_s": [round(t, 4) for t in times],
        # CPU seconds of the pass: on a shared 2-core machine wall time also measures neighbours.
        "pass_cpu_median_s": round(statistics.median(cpu_times), 4),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "starts": len(last.starts),
        "placements": placements,
        "placements_per_s": round(placements / median, 1),
        "stops": len(last.stops),
        "reservations": len(last.reservations),
        "policy": policy or "RF/FIFO mix",
        "fair_share": fair_share,
        "limit_weight": limit_weight,
        "kept_reservations": held,
        "waits": len(last.waits),
        "reasons": reasons,
        "phases_s": {k: round(v, 4) for k, v in last.timings_s.items()},
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def run_point(n_jobs: int, n_nodes: int, repeat: int, policy: str | None = None, fair_share: bool = False,
              kept: bool = False, limit_weight: float = 0.0) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--only", str(n_jobs), str(n_nodes), "--repeat", str(repeat), "--json"]
        + (["--policy", policy] if policy else []) + (["--fair-share"] if fair_share else [])
        + (["--kept"] if kept else []) + (["--limit-weight", str(limit_weight)] if limit_weight else []),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def sim_point(jobs: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, str(HERE / "traces" / "generate.py"), "--scenario", "steady", "--jobs", str(jobs), "--out-dir", tmp],
            check=True,
            capture_output=True,
        )
        t = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "dlts.sim", "--cluster", f"{tmp}/cluster.yaml", "--trace", f"{tmp}/steady.csv",
             "--out", f"{tmp}/r.json"],
            check=True,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - t
        cpu = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
        summary = json.loads(Path(f"{tmp}/r.json").read_text())["summary"]
    return {
        "jobs": jobs,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),  # children's user CPU: the generator (small) and the sim
        "passes": summary["passes"],
        "output": proc.stdout.strip(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs=2, type=int, metavar=("PENDING", "NODES"), help="one point, in this process")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print the point as JSON (used by the curve)")
    ap.add_argument("--no-sim", action="store_true", help="skip the 10,000-job dlts sim run")
    ap.add_argument("--policy", choices=[p.value for p in Policy], default=None,
                    help="every VC on this policy (default: a third FIFO, the rest RF)")
    ap.add_argument("--fair-share", action="store_true",
                    help="hand the pass each user's recent GPU use, as the job manager does (fair share re-ranks "
                         "each VC's queue); without it the order is priority and queue time")
    ap.add_argument("--kept", action="store_true",
                    help="time the next pass: the jobs a first pass gave a reservation hold it (backfill keeps "
                         "reservations until their jobs start)")
    ap.add_argument("--limit-weight", type=float, default=0.0, metavar="W",
                    help="every VC ranks its jobs by queue time + W x limit (shorter limits first); 0: off")
    ap.add_argument("--curve", nargs="*", type=int, default=None, metavar="PENDING NODES",
                    help="pairs of points instead of the default curve, e.g. --curve 20000 2000 100000 10000")
    args = ap.parse_args()
    if args.only:
        point = one_point(args.only[0], args.only[1], args.repeat, args.policy, args.fair_share, args.kept,
                          args.limit_weight)
        print(json.dumps(point) if args.json else json.dumps(point, indent=1))
        return
    print(
        f"{'pending':>8} {'nodes':>6} {'running':>8} {'pass_s':>8} {'cpu_s':>7} {'placed':>7} {'placements/s':>13} "
        f"{'stops':>6} {'peak_RSS_MiB':>13} {'load':>5}"
    )
    curve = CURVE if not args.curve else list(zip(args.curve[::2], args.curve[1::2]))
    for n_jobs, n_nodes in curve:
        p = run_point(n_jobs, n_nodes, args.repeat, args.policy, args.fair_share, args.kept, args.limit_weight)
        print(
            f"{p['pending']:>8} {p['nodes']:>6} {p['running']:>8} {p['pass_median_s']:>8.3f} {p['pass_cpu_median_s']:>7.3f} "
            f"{p['placements']:>7} {p['placements_per_s']:>13.0f} {p['stops']:>6} {p['peak_rss_mib']:>13.1f} "
            f"{p['load_avg_1m']:>5.1f}"
        )
        print(f"         phases: {p['phases_s']}  reasons: {p['reasons']}", flush=True)
    if not args.no_sim:
        s = sim_point(10_000)
        print(f"dlts sim, 10,000 jobs of the steady example trace: {s['wall_s']} s wall, {s['cpu_s']} s CPU ({s['passes']} passes)")
        print(f"         {s['output']}")


if __name__ == "__main__":
    main()
