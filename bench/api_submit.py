"""Submission rate, DLTS vs Slurm, measured in interleaved rounds on the same machine.

    .venv/bin/python bench/seed_jobs.py          # once: 1,000,000 jobs into dlts_bench
    .venv/bin/python bench/api_submit.py [--rounds 5] [--jobs 400] [--workers N] [--tuned]

Each round submits --jobs jobs four times, back to back: DLTS with 1 client, Slurm with 1 client,
DLTS with 8 clients, Slurm with 8 clients. Interleaving puts both systems under the same machine
load in every round; the report gives each scenario's median jobs/s and the median of the
per-round ratios DLTS/Slurm.

- DLTS: gunicorn on loopback with the production worker count (2 x cores + 1, as `dlts api` and
  the dlts_control role), MariaDB database dlts_bench (1M jobs). A client is its own process with
  one keep-alive HTTP connection (http.client); a job counts once POST /api/v1/jobs answered 201,
  i.e. after its row and event were committed (innodb_flush_log_at_trx_commit=1: durable).
- Slurm: `sbatch -Q -o /dev/null --wrap=true` against the local slurmctld + slurmd of
  bench/api_slurm.py (tools-here.md section 4; --tuned: batch_sched_delay=0,sched_min_interval=0);
  a client is a thread forking sbatch, which returns once slurmctld accepted the job.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import api_slurm
from api_load import add_server_args, start_gunicorn
from mariadb_profile import apply_for_this_run

BODY = json.dumps({"vc": "vc0", "image": "busybox", "command": "true", "gpus": 0})


def _dlts_client(port: int, token: str, jobs: int, start: multiprocessing.Event, out: multiprocessing.Queue) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    conn.request("GET", "/readyz")  # connect before the clock starts
    conn.getresponse().read()
    ok = 0
    start.wait()
    for _ in range(jobs):
        conn.request("POST", "/api/v1/jobs", body=BODY, headers=headers)
        response = conn.getresponse()
        response.read()
        ok += response.status == 201
    out.put(ok)


def dlts_rate(port: int, token: str, jobs: int, clients: int) -> dict:
    per = jobs // clients
    start, out = multiprocessing.Event(), multiprocessing.Queue()
    procs = [multiprocessing.Process(target=_dlts_client, args=(port, token, per, start, out)) for _ in range(clients)]
    for p in procs:
        p.start()
    time.sleep(0.5)  # every client connected
    t0 = time.perf_counter()
    start.set()
    accepted = sum(out.get(timeout=300) for _ in procs)
    elapsed = time.perf_counter() - t0
    for p in procs:
        p.join()
    return {"clients": clients, "accepted": accepted, "failed": per * clients - accepted,
            "elapsed_s": round(elapsed, 3), "jobs_per_s": round(accepted / elapsed, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_server_args(parser, port=8766)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=400, help="jobs per run (each client submits jobs / clients)")
    parser.add_argument("--tuned", action="store_true", help="Slurm with batch_sched_delay=0,sched_min_interval=0")
    args = parser.parse_args()
    mariadb = apply_for_this_run(args.db, args.debian_defaults)
    token = json.loads(Path(args.tokens).read_text())["alice"]
    gunicorn = start_gunicorn(args.db, args.port, args.workers)
    slurm = api_slurm.start(args.tuned)
    runs: dict[str, list[dict]] = {"dlts_1": [], "slurm_1": [], "dlts_8": [], "slurm_8": []}
    try:
        dlts_rate(args.port, token, 40, 1)  # warm-up: every worker imported, pools open
        for r in range(args.rounds):
            for clients in (1, 8):
                runs[f"dlts_{clients}"].append(dlts_rate(args.port, token, args.jobs, clients))
                runs[f"slurm_{clients}"].append(api_slurm.submit(slurm["env"], args.jobs, clients))
                subprocess.run(["scancel", "--user=root"], env=slurm["env"], check=False)
            print(f"round {r + 1}:", {k: v[-1]["jobs_per_s"] for k, v in runs.items()}, flush=True)
    finally:
        api_slurm.stop(slurm)
        gunicorn.terminate()
        gunicorn.wait(timeout=30)
    summary: dict = {"mariadb": mariadb, "rounds": args.rounds, "jobs_per_run": args.jobs, "gunicorn_workers": args.workers,
                     "slurm_tuned": args.tuned, "runs": runs}
    for clients in (1, 8):
        d = [x["jobs_per_s"] for x in runs[f"dlts_{clients}"]]
        s = [x["jobs_per_s"] for x in runs[f"slurm_{clients}"]]
        summary[f"clients_{clients}"] = {
            "dlts_median_jobs_per_s": statistics.median(d), "slurm_median_jobs_per_s": statistics.median(s),
            "ratio_median": round(statistics.median(a / b for a, b in zip(d, s)), 2),
            "ratio_min": round(min(a / b for a, b in zip(d, s)), 2),
            "dlts_failed": sum(x["failed"] for x in runs[f"dlts_{clients}"]),
        }
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
