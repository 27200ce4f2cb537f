"""GET /api/v1/usage latency at a million jobs, and what booking the rollup costs (docs/accounting.md).

    .venv/bin/python bench/usage_query.py [--url mysql+pymysql://root@127.0.0.1:3306/dlts_bench_accounting]
                                          [--jobs 1000000] [--repeat 20] [--out result.json]

1. Seeds the database with bench/seed_jobs.py (once; its own database, never the CI's `test`).
2. Books every attempt into the rollup with the real booking code (services/accounting.py ``book``,
   what the accounting manager runs after migration 0008e: the backfill), timed.
3. Turns the 1,000 queued jobs into running ones (an open attempt started an hour ago, a node
   report's utilisation minute each) and times two booking passes: the first books the hour, the
   second the seconds since (the steady-state tick).
4. Serves the API over loopback HTTP (werkzeug, threaded) and times each usage query ``--repeat``
   times after one warm-up: p50, p95, max in ms.
Prints a JSON summary; --out writes it too.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "mysql+pymysql://root@127.0.0.1:3306/dlts_bench_accounting"


def seed(url: str, jobs: int, tokens: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "bench" / "seed_jobs.py"), "--url", url, "--jobs", str(jobs),
                    "--tokens", str(tokens)], check=True)


def backfill(sessions) -> dict:
    from dlts.models import utcnow
    from dlts.services import accounting

    started = time.monotonic()
    total = accounting.BookResult()
    with sessions() as s:
        open_before = s.scalar(sa.text("SELECT count(*) FROM job_attempts WHERE accounting_open"))
        while True:
            r = accounting.book(s, utcnow(), batch=2000, max_batches=50)
            total.attempts += r.attempts
            total.closed += r.closed
            total.gpu_ms += r.gpu_ms
            if r.closed == 0:  # what is left runs: the steady state, timed below
                break
            print(f"  booked {total.attempts} attempts, {total.attempts / (time.monotonic() - started):.0f}/s", flush=True)
        rows = {t: s.scalar(sa.text(f"SELECT count(*) FROM {t}")) for t in ("usage_totals", "usage_job_days")}
    elapsed = time.monotonic() - started
    return {"open_attempts": open_before, "booked": total.attempts, "closed": total.closed, "seconds": round(elapsed, 1),
            "attempts_per_s": round(total.attempts / elapsed) if elapsed else None, "rows": rows,
            "gpu_hours": round(total.gpu_ms / 3_600_000)}


def running_tick(sessions) -> dict:
    """1,000 running attempts with a utilisation minute each; two passes timed."""
    from dlts.models import utcnow
    from dlts.services import accounting

    now = utcnow()
    hour_ago = now - dt.timedelta(hours=1)
    with sessions() as s:
        queued = list(s.scalars(sa.text("SELECT id FROM jobs WHERE status = 'queued' ORDER BY id LIMIT 1000")))
        if queued:
            s.execute(sa.text("UPDATE jobs SET status = 'running', attempt = 1, started_at = :t WHERE id IN :ids")
                      .bindparams(sa.bindparam("ids", expanding=True)), {"t": hour_ago, "ids": queued})
            s.execute(sa.text("INSERT INTO job_attempts (job_id, number, placements, created_at, started_at, accounting_open,"
                              " gpu_ms, busy_gpu_ms, sampled_gpu_ms) VALUES (:j, 1, :p, :t, :t, 1, 0, 0, 0)"),
                      [{"j": j, "p": json.dumps([{"node": f"node{j % 16:02d}", "gpu_indices": [0, 1]}]), "t": hour_ago}
                       for j in queued])
            s.commit()
        running = list(s.execute(sa.text("SELECT j.id, a.id FROM jobs j JOIN job_attempts a ON a.job_id = j.id AND "
                                         "a.number = j.attempt WHERE j.status = 'running'")))
        minute = accounting.floor_minute(now - dt.timedelta(minutes=5))
        s.execute(sa.text("DELETE FROM utilisation_points WHERE minute = :m"), {"m": minute})
        s.execute(sa.text("INSERT INTO utilisation_points (attempt_id, node, minute, samples, gpus, cpu_samples, cpu_cores,"
                          " memory_bytes) VALUES (:a, 'node00', :m, 2, :g, 2, 1.0, 1000000)"),
                  [{"a": a, "m": minute, "g": json.dumps({"0": [2, 0.9, 1e9], "1": [2, 0.1, 1e9]})} for _, a in running])
        s.commit()
    timings = []
    for _ in range(2):
        with sessions() as s:
            t0 = time.perf_counter()
            r = accounting.book(s, utcnow())
            timings.append({"ms": round((time.perf_counter() - t0) * 1000, 1), "attempts": r.attempts})
    return {"running_attempts": len(running), "passes": timings}


SCENARIOS = [
    ("admin_users_this_month", "admin", {"group_by": "user"}),
    ("admin_users_last_30_days", "admin", {"group_by": "user", "from": "{d30}", "to": "{today}"}),
    ("admin_vc_by_month_13_months", "admin", {"group_by": "vc,month", "from": "{m13}", "to": "{today}"}),
    ("admin_sku_preemptible_400_days", "admin", {"group_by": "sku,preemptible", "from": "{d400}", "to": "{today}"}),
    ("admin_user_by_day_30_days_csv", "admin", {"group_by": "user,day", "from": "{d30}", "to": "{today}", "format": "csv"}),
    ("member_users_last_30_days", "alice", {"group_by": "user", "from": "{d30}", "to": "{today}"}),
    ("member_own_jobs_30_days", "alice", {"group_by": "job", "user": "alice", "from": "{d30}", "to": "{today}"}),
    ("admin_jobs_30_days_limit_1000", "admin", {"group_by": "job", "from": "{d30}", "to": "{today}"}),
]


def serve(app):
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def time_queries(base: str, tokens: dict[str, str], repeat: int) -> dict:
    today = dt.date.today()
    values = {"today": today.isoformat(), "d30": (today - dt.timedelta(days=30)).isoformat(),
              "d400": (today - dt.timedelta(days=400)).isoformat(),
              "m13": (today.replace(day=1) - dt.timedelta(days=365)).replace(day=1).strftime("%Y-%m")}
    results = {}
    with requests.Session() as http:
        for name, who, params in SCENARIOS:
            params = {k: v.format(**values) for k, v in params.items()}
            headers = {"Authorization": f"Bearer {tokens[who]}"}
            r = http.get(f"{base}/api/v1/usage", params=params, headers=headers, timeout=60)  # warm-up
            r.raise_for_status()
            rows = len(r.text.splitlines()) - 1 if params.get("format") == "csv" else len(r.json()["items"])
            ms = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                http.get(f"{base}/api/v1/usage", params=params, headers=headers, timeout=60).raise_for_status()
                ms.append((time.perf_counter() - t0) * 1000)
            ms.sort()
            results[name] = {"rows": rows, "p50_ms": round(statistics.median(ms), 1),
                             "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 1), "max_ms": round(ms[-1], 1)}
            print(f"  {name}: {results[name]}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--tokens", default="/tmp/dlts_bench_accounting_tokens.json")
    parser.add_argument("--out")
    args = parser.parse_args()
    if sa.engine.make_url(args.url).database in (None, "test"):
        raise SystemExit("refusing to use the CI's `test` database; use e.g. .../dlts_bench_accounting")
    tokens_path = Path(args.tokens)
    t0 = time.monotonic()
    seed(args.url, args.jobs, tokens_path)
    summary: dict = {"jobs": args.jobs, "seed_s": round(time.monotonic() - t0, 1)}

    from dlts.app import create_app
    from dlts.config import Settings
    from dlts.db import session_factory

    home = Path("/tmp/dlts_bench_accounting_home")
    home.mkdir(exist_ok=True)
    app = create_app(Settings(home=home, database_url=args.url, secret_key="bench-secret-key-0123456789"))
    sessions = session_factory(app)
    print("booking the rollup (backfill) ...", flush=True)
    summary["backfill"] = backfill(sessions)
    print(f"  {summary['backfill']}", flush=True)
    summary["running_tick"] = running_tick(sessions)
    print(f"  {summary['running_tick']}", flush=True)
    server = serve(app)
    try:
        summary["queries"] = time_queries(f"http://127.0.0.1:{server.server_port}", json.loads(tokens_path.read_text()),
                                          args.repeat)
    finally:
        server.shutdown()
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
