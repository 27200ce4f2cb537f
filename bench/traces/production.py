"""Write production-shaped ``dlts sim`` traces (deterministic: fixed seeds).

    python bench/traces/production.py                       # rewrites production.csv + production_cluster.yaml
    python bench/traces/production.py --jobs 20000 --days 60 --out-dir /tmp/prod --seed 7
    # production_28d.csv: 28 days below capacity, every job with a limit (docs/benchmarks.md)
    python bench/traces/production.py --load 0.8 --days 28 --max-share 0.5 --no-limit 0 --name production_28d

The shape follows what published GPU-cluster traces report (Philly 2017, PAI 2020, Helios 2020):

* GPU time is heavy-tailed: about 70 % of jobs ask 1 GPU and most of those run under an hour
  (log-normal run time, median ~15 min), while a long tail runs for days (capped at 6 days,
  inside the VCs' 7-day limit). Gangs of 8-64 GPUs (1-8 whole nodes of 8 GPUs) are a few percent
  of jobs but a large share of GPU time.
* Arrivals are bursty: a diurnal rate (busy working hours, quiet nights) plus sweeps, where one
  user submits 10-60 similar jobs within minutes.
* Several VCs of different sizes; a tenth of jobs preemptible; most users set a ``max_time_s``
  (a rounded-up guess 1.2-3x the real run), the rest run under the VC's limit.

``--load L`` solves the job count for an offered load of L (GPU time submitted / capacity over the
horizon; the closest of a few draws, since one multi-day gang moves it by a few percent) and
gives each VC jobs in proportion to its quota, so no VC is overloaded in the long run (bursts
and heavy-tailed jobs still push single VCs over it for days). ``--max-share S`` caps a job at S
of its VC's quota (whole 8-GPU nodes; a team with 64 GPUs does not submit 64-GPU gangs that
need its whole quota empty). ``--no-limit`` is the share of jobs without a ``max_time_s``;
``--limit-over LO HI`` and ``--limit-round`` shape the users' guesses.

The cluster (production_cluster.yaml): 64 a100 nodes (512 GPUs) in 4 IB domains of 16 nodes, 4
VCs whose quotas add up to the cluster (vision 192, nlp 160, speech 96, research 64), every VC on
RF (``dlts sim --compare FIFO,RF,backfill`` overrides it), 7-day limit, a 4-hour runtime estimate
for jobs without one, tick 60 s.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
DAY = 86400.0

CLUSTER_YAML = """\
# Production-shaped cluster for dlts sim (written by bench/traces/production.py).
skus:
  a100: {gpus: 8, cpu: 96, memory_gb: 900}
nodes:
  - {prefix: g, count: 64, sku: a100, ib_domains: 4}     # g000..g063 in pod0..pod3, 16 nodes each
vcs:
  - {name: vision, quota: {a100: 192}, policy: RF, max_job_time_s: 604800, default_runtime_estimate_s: 14400}
  - {name: nlp, quota: {a100: 160}, policy: RF, max_job_time_s: 604800, default_runtime_estimate_s: 14400}
  - {name: speech, quota: {a100: 96}, policy: RF, max_job_time_s: 604800, default_runtime_estimate_s: 14400}
  - {name: research, quota: {a100: 64}, policy: RF, max_job_time_s: 604800, default_runtime_estimate_s: 14400}
tick_s: 60
reservation_depth: 8
"""

VCS = (("vision", 0.36), ("nlp", 0.30), ("speech", 0.20), ("research", 0.14))
# (total GPUs, probability); 16 and up are gangs of whole 8-GPU nodes
SIZES = ((1, 0.70), (2, 0.08), (4, 0.07), (8, 0.07), (16, 0.04), (32, 0.025), (64, 0.015))
HEADER = ["id", "submit_s", "vc", "user", "type", "sku", "gpus", "nodes", "duration_s", "max_time_s",
          "priority", "preemptible"]


def _pick(rng: random.Random, table):
    r = rng.random()
    acc = 0.0
    for value, p in table:
        acc += p
        if r < acc:
            return value
    return table[-1][0]


def _duration(rng: random.Random, gpus: int) -> float:
    """Log-normal run time; bigger jobs run longer (median 15 min at 1 GPU, ~5 h at 64)."""
    median = 900.0 * (1 + gpus) ** 0.85
    d = rng.lognormvariate(math.log(median), 1.8)
    return float(min(max(60.0, round(d)), 6 * DAY))


LIMIT = {"over": (1.2, 3.0), "round_s": 3600.0}  # a user's guess: 1.2-3x the run, rounded up to the hour


def _limit(rng: random.Random, duration: float, no_limit: float = 0.3) -> int | None:
    if rng.random() < no_limit:
        return None  # the VC's 7-day limit applies
    guess = duration * rng.uniform(*LIMIT["over"])
    step = LIMIT["round_s"]
    return int(min(7 * DAY, math.ceil(guess / step) * step))  # users round up (to the hour)


def _rate(t: float) -> float:
    """Relative arrival rate: busy 09-19h, quiet at night, weekends at half."""
    hour = (t % DAY) / 3600.0
    day = int(t // DAY) % 7
    diurnal = 1.6 if 9 <= hour < 19 else 0.45
    return diurnal * (0.5 if day >= 5 else 1.0)


def generate(jobs: int, days: float, seed: int, vcs=VCS, no_limit: float = 0.3,
             max_share: float | None = None) -> list[list]:
    rng = random.Random(seed)
    horizon = days * DAY
    users = {vc: [f"{vc[:2]}user{i}" for i in range(12)] for vc, _ in vcs}
    # mean arrival gap for `jobs` jobs over the horizon (sweeps add about 40 % more jobs each)
    rows: list[list] = []
    t = 0.0
    next_id = 1
    base_gap = horizon / (jobs * 0.62)
    while len(rows) < jobs:
        t += rng.expovariate(_rate(t) / base_gap)
        if t > horizon:
            t = rng.uniform(0, horizon)  # fill up to `jobs` (keeps the count exact)
        vc = _pick(rng, vcs)
        user = rng.choice(users[vc])
        sweep = rng.random() < 0.03
        count = rng.randint(10, 60) if sweep else 1
        gpus0 = _pick(rng, SIZES) if not sweep else _pick(rng, SIZES[:4])
        if max_share is not None:  # a team's jobs are at most this share of its VC's quota
            gpus0 = min(gpus0, max(8, int(QUOTA[vc] * max_share) // 8 * 8))
        pre = rng.random() < 0.10
        for k in range(count):
            if len(rows) >= jobs:
                break
            gpus = gpus0
            duration = _duration(rng, gpus)
            submit = t + (k * rng.uniform(5, 60) if sweep else 0.0)
            if gpus >= 16:
                jtype, per_node, nodes = "distributed", 8, gpus // 8
            else:
                jtype = "interactive" if (gpus == 1 and rng.random() < 0.06) else "batch"
                per_node, nodes = gpus, 0
                if jtype == "interactive":
                    duration = min(duration, 4 * 3600.0)
            limit = _limit(rng, duration, no_limit)
            rows.append([f"job_{seed}_{next_id:06d}", round(submit, 1), vc, user, jtype, "a100", per_node, nodes,
                         duration, limit if limit is not None else "", 100, "true" if pre else "false"])
            next_id += 1
    rows.sort(key=lambda r: (r[1], r[0]))
    return rows


QUOTA = {"vision": 192, "nlp": 160, "speech": 96, "research": 64}
QUOTA_SHARES = tuple((name, gpus / 512) for name, gpus in QUOTA.items())


def offered(rows: list[list], days: float, gpus: int = 512) -> dict[str, float]:
    """GPU time submitted over the horizon as a share of the capacity: the cluster's and each
    VC's (against its quota)."""
    quota = dict(QUOTA_SHARES)
    total = 0.0
    per_vc = dict.fromkeys(quota, 0.0)
    for r in rows:
        g = int(r[6]) * max(1, int(r[7] or 0)) * float(r[8])
        total += g
        per_vc[r[2]] += g
    cap = gpus * days * DAY
    return {"cluster": total / cap, **{vc: v / (cap * quota[vc]) for vc, v in per_vc.items()}}


def generate_at_load(load: float, days: float, seed: int, no_limit: float, max_share: float | None) -> list[list]:
    """Jobs in each VC in proportion to its quota, as many as make the GPU time submitted
    ``load`` times the cluster's capacity over ``days`` (the job count is solved for; the
    shape of each job is the same as ``generate``'s)."""
    n = 1000
    best: tuple[float, list[list]] | None = None
    for _ in range(12):  # one heavy-tailed job moves the total: keep the closest draw
        rows = generate(n, days, seed, QUOTA_SHARES, no_limit, max_share)
        got = offered(rows, days)["cluster"]
        if best is None or abs(got - load) < best[0]:
            best = (abs(got - load), rows)
        if abs(got - load) < 0.01:
            break
        n = max(100, round(n * load / got))
    assert best is not None
    return best[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=4000)
    ap.add_argument("--days", type=float, default=11.0)
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--out-dir", type=Path, default=HERE)
    ap.add_argument("--name", default="production")
    ap.add_argument("--load", type=float, default=None,
                    help="solve the job count for this offered load (GPU time / capacity), VC shares by quota")
    ap.add_argument("--no-limit", type=float, default=0.3, help="share of jobs without a max_time_s")
    ap.add_argument("--max-share", type=float, default=None,
                    help="cap a job at this share of its VC's quota (whole nodes, at least 8 GPUs)")
    ap.add_argument("--limit-over", type=float, nargs=2, default=LIMIT["over"], metavar=("LO", "HI"),
                    help="a max_time_s is the run times U(LO, HI) (default 1.2 3.0)")
    ap.add_argument("--limit-round", type=float, default=LIMIT["round_s"], help="rounded up to this (s)")
    args = ap.parse_args()
    LIMIT["over"], LIMIT["round_s"] = tuple(args.limit_over), args.limit_round
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"{args.name}_cluster.yaml").write_text(CLUSTER_YAML)
    with open(args.out_dir / f"{args.name}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        if args.load is not None:
            rows = generate_at_load(args.load, args.days, args.seed, args.no_limit, args.max_share)
        else:
            rows = generate(args.jobs, args.days, args.seed, VCS, args.no_limit)
        w.writerows(rows)
    load = ", ".join(f"{k} {v:.2f}" for k, v in offered(rows, args.days).items())
    print(f"wrote {args.out_dir / (args.name + '.csv')} ({len(rows)} jobs; offered load {load}) and "
          f"{args.name}_cluster.yaml")


if __name__ == "__main__":
    main()
