"""Write the example ``dlts sim`` scenarios (deterministic: fixed seeds).

    python bench/traces/generate.py                      # rewrites the two committed scenarios
    python bench/traces/generate.py --scenario steady --jobs 10000 --out-dir /tmp/big

Both scenarios share one cluster (cluster.yaml): 4 VCs (two RF, two FIFO), 2 GPU SKUs (a100 with
8 GPUs a node, v100 with 4) plus CPU-only nodes, 3 IB domains, and two a100 nodes hard-assigned to
VC ``research``.

* ``steady``: Poisson arrivals of every job type (batch, interactive, distributed, inference,
  CPU-only), a quarter preemptible, some with a ``max_time_s`` shorter than their run (wall-time
  kills).
* ``bursts``: a flood of preemptible jobs fills the cluster, then a burst of non-preemptible jobs
  within quota forces reclaim; a large gang at the head of a FIFO VC blocks the small jobs behind
  it while the RF VCs keep starting theirs; interactive bursts hit the interactive cap.
"""

from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent

CLUSTER_YAML = """\
# Example cluster for dlts sim (written by bench/traces/generate.py).
skus:
  a100: {gpus: 8, cpu: 96, memory_gb: 900}
  v100: {gpus: 4, cpu: 48, memory_gb: 400}
  cpu:  {gpus: 0, cpu: 64, memory_gb: 256}
nodes:
  - {prefix: a, count: 12, sku: a100, ib_domains: 3}     # a000..a011 in pod0..pod2
  - {prefix: v, count: 9, sku: v100, ib_domains: 3}      # v000..v008 in pod0..pod2
  - {prefix: c, count: 4, sku: cpu, ib_domain: cpu-pod}
  - {name: r000, sku: a100, ib_domain: pod2, vc: research}
  - {name: r001, sku: a100, ib_domain: pod2, vc: research}
vcs:
  - {name: vision, quota: {a100: 40, v100: 8, cpu: 64}, policy: RF, max_job_time_s: 86400,
     max_interactive_gpus: 4, user_gpu_quota: 32}
  - {name: speech, quota: {a100: 24, v100: 12, cpu: 64}, policy: FIFO, max_job_time_s: 43200,
     max_interactive_gpus: 4}
  - {name: nlp, quota: {a100: 24, v100: 12, cpu: 64}, policy: RF, max_job_time_s: 86400,
     max_interactive_gpus: 2}
  - {name: research, quota: {a100: 24, v100: 4, cpu: 64}, policy: FIFO, max_job_time_s: 172800,
     max_interactive_gpus: 2}
tick_s: 10
"""

VCS = ["vision", "speech", "nlp", "research"]
USERS = {vc: [f"{vc[:2]}user{i}" for i in range(4)] for vc in VCS}
HEADER = [
    "id", "submit_s", "vc", "user", "type", "sku", "gpus", "nodes", "duration_s", "max_time_s",
    "priority", "preemptible", "min_replicas", "max_replicas",
]


def _row(rng: random.Random, job_id: int, t: float, **force) -> dict:
    vc = force.get("vc") or rng.choice(VCS)
    kind = force.get("type") or rng.choices(
        ["batch", "interactive", "distributed", "inference", "cpu"], weights=[50, 10, 10, 10, 20]
    )[0]
    sku = force.get("sku") or rng.choices(["a100", "v100"], weights=[70, 30])[0]
    per_node = 8 if sku == "a100" else 4
    row = {
        "id": job_id,
        "submit_s": round(t, 1),
        "vc": vc,
        "user": rng.choice(USERS[vc]),
        "type": "batch",
        "sku": sku,
        "gpus": 1,
        "nodes": 0,
        "duration_s": round(rng.lognormvariate(8.0, 0.8), 1),  # median ~50 min
        "max_time_s": "",
        "priority": rng.choices([100, 200, 50], weights=[80, 10, 10])[0],
        "preemptible": "true" if rng.random() < 0.25 else "false",
        "min_replicas": "",
        "max_replicas": "",
    }
    if kind == "batch":
        row["gpus"] = rng.choice([1, 1, 2, 4, per_node])
        if rng.random() < 0.08:  # a limit shorter than the run: killed for wall time
            row["max_time_s"] = int(row["duration_s"] * rng.uniform(0.3, 0.9)) + 1
    elif kind == "interactive":
        row.update(type="interactive", gpus=rng.choice([1, 2]), preemptible="false",
                   duration_s=round(rng.uniform(1800, 7200), 1))
    elif kind == "distributed":
        row.update(type="distributed", gpus=per_node, nodes=rng.choice([2, 2, 3, 4]),
                   duration_s=round(rng.lognormvariate(8.5, 0.6), 1))
    elif kind == "inference":
        lo = rng.choice([1, 2])
        row.update(type="inference", gpus=rng.choice([1, 2]), min_replicas=lo, max_replicas=lo + rng.choice([1, 2, 3]),
                   duration_s=round(rng.uniform(3600, 4 * 3600), 1))
    else:
        row.update(sku="", gpus=0, duration_s=round(rng.uniform(300, 3600), 1), preemptible="false")
    row.update({k: v for k, v in force.items() if k in row})
    return row


def steady(jobs: int, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    rows, t = [], 0.0
    for i in range(1, jobs + 1):
        t += rng.expovariate(1 / 180.0)  # a job every 3 min: about 85 % of the GPUs busy
        rows.append(_row(rng, i, t))
    return rows


def bursts(jobs: int, seed: int = 11) -> list[dict]:
    rng = random.Random(seed)
    rows: list[dict] = []
    i = 0

    def add(t: float, **force) -> None:
        nonlocal i
        i += 1
        rows.append(_row(rng, i, t, **force))

    # 1. A flood of preemptible work from every VC fills the GPUs.
    for k in range(60):
        add(k * 5.0, type="batch", preemptible="true", gpus=rng.choice([4, 8]), sku="a100",
            duration_s=round(rng.uniform(6000, 12000), 1))
    for k in range(15):
        add(k * 7.0, type="batch", preemptible="true", gpus=4, sku="v100", duration_s=round(rng.uniform(6000, 12000), 1))
    # 2. Non-preemptible work within each VC's quota arrives: reclaim must make room.
    for k in range(16):
        add(1800 + k * 3.0, vc=VCS[k % 4], type="batch", preemptible="false", gpus=8, sku="a100",
            duration_s=round(rng.uniform(1800, 3600), 1))
    for k in range(4):
        add(1900 + k, vc=VCS[k], type="distributed", preemptible="false", sku="a100", gpus=8, nodes=2,
            duration_s=2400.0)
    # 3. FIFO blocking: a big gang heads speech's queue, small jobs queue behind it while the RF
    #    VC vision keeps starting the same small jobs.
    add(3000, vc="speech", type="distributed", preemptible="false", sku="a100", gpus=8, nodes=3, duration_s=3000.0)
    for k in range(8):
        add(3001 + k, vc="speech", type="batch", preemptible="false", sku="a100", gpus=1, duration_s=600.0)
        add(3001 + k, vc="vision", type="batch", preemptible="false", sku="a100", gpus=1, duration_s=600.0)
    # 4. Interactive bursts against the cap, inference services that scale with idle capacity.
    for k in range(10):
        add(4000 + k, vc=VCS[k % 4], type="interactive", sku="v100", gpus=2)
    for k in range(4):
        add(4100 + k, vc=VCS[k], type="inference", sku="v100", gpus=1, min_replicas=1, max_replicas=4,
            preemptible="false")
    # 5. The rest: steady mixed traffic.
    t = 4200.0
    while i < jobs:
        t += rng.expovariate(1 / 180.0)
        add(t)
    return rows


SCENARIOS = {"steady": steady, "bursts": bursts}


def write(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=HEADER)
        w.writeheader()
        w.writerows(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), help="only this scenario (default: both)")
    ap.add_argument("--jobs", type=int, default=400, help="jobs per scenario (default 400)")
    ap.add_argument("--out-dir", type=Path, default=HERE)
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "cluster.yaml").write_text(CLUSTER_YAML)
    for name in [args.scenario] if args.scenario else sorted(SCENARIOS):
        write(SCENARIOS[name](args.jobs), args.out_dir / f"{name}.csv")
        print(f"wrote {args.out_dir / (name + '.csv')} ({args.jobs} jobs)")


if __name__ == "__main__":
    main()
