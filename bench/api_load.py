"""REST API latency and submission rate at a million jobs: gunicorn on loopback, wrk as the load generator.

    .venv/bin/python bench/seed_jobs.py                      # once: 1,000,000 jobs into dlts_bench
    .venv/bin/python bench/api_load.py [--duration 10] [--connections 4] [--workers 2xcores+1]

Scenarios (each a bounded wrk run; p50/p99 from wrk --latency):
  get_job      GET /api/v1/jobs/{random id}                (cluster admin, ids of kept jobs)
  list_first   GET /api/v1/jobs?limit=50                   (newest page)
  list_deep    GET /api/v1/jobs?limit=50&cursor=...        (900,000 rows deep, keyset)
  list_member  GET /api/v1/jobs?limit=50                   (a VC member: only their VC's jobs)
  list_deep_filtered  ...?vc=vc1&status=finished&cursor=... (the same depth, two filters)
  post_job     POST /api/v1/jobs                           (a member submits; 201 = committed)
Then keyset vs OFFSET at depth 900k on the same query, timed in SQL (the API offers keyset only).
The submission rate against Slurm's sbatch is bench/api_submit.py.
Prints a JSON summary; --out writes it too.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pymysql
import requests
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mariadb_profile import apply_for_this_run

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "mysql+pymysql://root@127.0.0.1:3306/dlts_bench"


def add_server_args(parser: argparse.ArgumentParser, port: int) -> None:
    """The options every API benchmark shares: the database, its tokens, the gunicorn it starts."""
    parser.add_argument("--db", default=DEFAULT_URL)
    parser.add_argument("--tokens", default="/tmp/dlts_bench_tokens.json")
    parser.add_argument("--port", type=int, default=port)
    parser.add_argument("--workers", type=int, default=os.cpu_count() * 2 + 1, help="gunicorn workers (production: 2 x cores + 1)")
    parser.add_argument("--debian-defaults", action="store_true",
                        help="leave MariaDB as it is (else: the mariadb role's buffer pool and isolation, restored at exit)")
    parser.add_argument("--out")


def start_gunicorn(db_url: str, port: int, workers: int) -> subprocess.Popen:
    env = os.environ | {"DLTS_DATABASE_URL": db_url, "DLTS_SECRET_KEY": "bench-secret-key-0123456789",
                        "DLTS_HOME": "/tmp/dlts_bench_home", "DLTS_MAX_BODY_BYTES": str(1024 * 1024),
                        # the benchmark's one user submits far beyond the per-user abuse limits
                        "DLTS_MAX_SUBMISSIONS_PER_MINUTE": "0", "DLTS_MAX_QUEUED_JOBS_PER_USER": "0"}
    proc = subprocess.Popen([str(ROOT / ".venv/bin/gunicorn"), "-w", str(workers), "-b", f"127.0.0.1:{port}",
                             "--log-level", "warning", "dlts.app:create_app()"], env=env, cwd=ROOT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc
        except requests.RequestException:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit("gunicorn did not become ready in 60 s")


def wrk(url: str, script: str, duration_s: int, connections: int) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        fh.write(script)
    out = subprocess.run(["wrk", "-t", "1", "-c", str(connections), "-d", f"{duration_s}s", "--latency", "-s", fh.name, url],
                         capture_output=True, text=True, check=True).stdout
    os.unlink(fh.name)
    return parse_wrk(out)


def _ms(value: str, unit: str) -> float:
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def parse_wrk(out: str) -> dict:
    pct = {m.group(1): _ms(m.group(2), m.group(3)) for m in re.finditer(r"^\s+(50|75|90|99)%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)}
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    total = int(re.search(r"(\d+) requests in", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    return {"p50_ms": pct.get("50"), "p99_ms": pct.get("99"), "requests_per_s": rps, "requests": total,
            "non_2xx": int(bad.group(1)) if bad else 0, "socket_errors": errors.group(1) if errors else None}


def lua(token: str, body: str) -> str:
    return f'wrk.headers["Authorization"] = "Bearer {token}"\nwrk.headers["Content-Type"] = "application/json"\n' + body


def cursor_for(job_id: int) -> str:
    return base64.urlsafe_b64encode(f"j:{job_id}".encode()).decode().rstrip("=")


def sql_keyset_vs_offset(db_url: str, depth: int, runs: int) -> dict:
    u = sa.engine.make_url(db_url)
    conn = pymysql.connect(host=u.host, port=u.port or 3306, user=u.username, password=u.password or "", database=u.database)
    cur = conn.cursor()
    cur.execute("SELECT max(id) FROM jobs")
    top = cur.fetchone()[0]
    cur.execute("SELECT id FROM jobs ORDER BY id DESC LIMIT 1 OFFSET %s", (depth,))
    boundary = cur.fetchone()[0]
    columns = "id, name, user_id, vc_id, type, status, gpus, sku, submitted_at, finished_at, spec"
    queries = {
        "offset": (f"SELECT {columns} FROM jobs ORDER BY id DESC LIMIT 51 OFFSET {depth}", ()),
        "keyset": (f"SELECT {columns} FROM jobs WHERE id < %s ORDER BY id DESC LIMIT 51", (boundary + 1,)),
    }
    result = {"depth": depth, "max_id": top}
    for name, (sql, params) in queries.items():
        times = []
        rows = None
        for _ in range(runs):
            t0 = time.perf_counter()
            cur.execute(sql, params)
            rows = cur.fetchall()
            times.append((time.perf_counter() - t0) * 1000)
        result[name] = {"median_ms": round(statistics.median(times), 2), "max_ms": round(max(times), 2), "first_id": rows[0][0]}
    assert result["offset"]["first_id"] == result["keyset"]["first_id"], "the two queries must return the same page"
    result["offset_over_keyset"] = round(result["offset"]["median_ms"] / result["keyset"]["median_ms"], 1)
    conn.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_server_args(parser, port=8765)
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk scenario")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--only", default="", help="comma-separated scenario names")
    args = parser.parse_args()
    mariadb = apply_for_this_run(args.db, args.debian_defaults)
    tokens = json.loads(Path(args.tokens).read_text())
    engine = sa.create_engine(args.db)
    with engine.connect() as c:
        top = c.scalar(sa.text("SELECT max(id) FROM jobs"))
        count = c.scalar(sa.text("SELECT count(*) FROM jobs"))
        deep = c.scalar(sa.text("SELECT id FROM jobs ORDER BY id DESC LIMIT 1 OFFSET 900000")) if count > 900000 else None
    engine.dispose()
    base = f"http://127.0.0.1:{args.port}"
    only = set(filter(None, args.only.split(",")))
    summary: dict = {"mariadb": mariadb, "jobs_in_table": count, "gunicorn_workers": args.workers, "wrk_connections": args.connections,
                     "duration_s": args.duration}
    proc = start_gunicorn(args.db, args.port, args.workers)
    try:
        low = max(1, top - 400_000)
        scenarios = {
            "get_job": (tokens["admin"], "math.randomseed(7)\nrequest = function()\n"
                        f'  return wrk.format("GET", "/api/v1/jobs/" .. math.random({low}, {top}))\nend\n', "/"),
            "list_first": (tokens["admin"], "", "/api/v1/jobs?limit=50"),
            "list_member": (tokens["alice"], "", "/api/v1/jobs?limit=50"),
            "post_job": (tokens["alice"],
                         'wrk.method = "POST"\nwrk.body = \'{"vc": "vc0", "image": "busybox", "command": "true"}\'\n',
                         "/api/v1/jobs"),
        }
        if deep is not None:
            scenarios["list_deep_filtered"] = (
                tokens["admin"], "", f"/api/v1/jobs?limit=50&vc=vc1&status=finished&cursor={cursor_for(deep + 1)}")
            scenarios["list_deep"] = (tokens["admin"], "", f"/api/v1/jobs?limit=50&cursor={cursor_for(deep + 1)}")
        for name, (token, script, path) in scenarios.items():
            if only and name not in only:
                continue
            wrk(base + path, lua(token, script), 2, args.connections)  # warm-up
            summary[name] = wrk(base + path, lua(token, script), args.duration, args.connections)
            print(name, summary[name], flush=True)
        if (not only or "keyset_vs_offset" in only) and deep is not None:
            summary["keyset_vs_offset"] = sql_keyset_vs_offset(args.db, 900_000, 5)
            print("keyset_vs_offset", summary["keyset_vs_offset"], flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    sys.exit(main())
