"""Purge of old jobs under read load: the DB janitor vs pt-archiver --purge on the same table.

    .venv/bin/python bench/seed_jobs.py             # 1,000,000 jobs, the oldest 500,000 ended 400 days ago
    .venv/bin/python bench/api_purge.py [--tool janitor|pt-archiver] [--pause 0.1] [--read-s 10]

1. gunicorn on loopback; wrk reads random kept jobs (GET /api/v1/jobs/{id}) for --read-s: p99 before.
2. The same wrk load runs again while the purge deletes every job that ended more than 180 days ago
   (with attempts and events); wrk is stopped with SIGINT when the purge ends: p99 during.
3. Reports rows/s (jobs, and all rows), the longest transaction, and the p99 ratio.
A control: --tool cpu-load deletes nothing and instead burns --cpu-share of one core (in 10 ms
periods) in another process for --load-s, to show how much the read p99 of this machine moves
with background CPU work that touches no database at all.
For pt-archiver (Debian percona-toolkit), re-seed the old half first:
    .venv/bin/python bench/seed_jobs.py --append-old 500000
pt-archiver deletes the jobs in its usual form (--purge --limit 500 --commit-each); attempts and
events go by ON DELETE CASCADE.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api_load import add_server_args, lua, parse_wrk, start_gunicorn
from mariadb_profile import apply_for_this_run

ROOT = Path(__file__).resolve().parent.parent


def read_script(low: int, high: int, delay_ms: int = 0) -> str:
    """wrk Lua: GET a random kept job; with ``delay_ms`` each connection waits that long between
    requests (a paced load that leaves the machine idle time, instead of a saturating one)."""
    script = f'math.randomseed(11)\nrequest = function()\n  return wrk.format("GET", "/api/v1/jobs/" .. math.random({low}, {high}))\nend\n'
    if delay_ms:
        script += f"delay = function()\n  return {int(delay_ms)}\nend\n"
    return script


def start_wrk(url: str, script: str, duration_s: int, connections: int) -> subprocess.Popen:
    fh = tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False)  # noqa: SIM115 - wrk reads it after close
    fh.write(script)
    fh.close()
    return subprocess.Popen(["wrk", "-t", "1", "-c", str(connections), "-d", f"{duration_s}s", "--latency", "-s", fh.name, url],
                            stdout=subprocess.PIPE, text=True)


def counts(engine) -> dict:
    with engine.connect() as c:
        return {t: c.scalar(sa.text(f"SELECT count(*) FROM {t}")) for t in ("jobs", "job_attempts", "job_events")}


def run_janitor(db: str, batch_rows: int, pause_s: float) -> dict:
    from dlts.managers.janitor import Janitor

    engine = sa.create_engine(db, pool_pre_ping=True)
    result = Janitor(sessionmaker(bind=engine), 180, batch_rows=batch_rows, pause_s=pause_s).run()
    engine.dispose()
    return {"jobs": result.jobs, "attempts": result.attempts, "events": result.events, "batches": result.batches,
            "elapsed_s": round(result.elapsed_s, 1), "longest_transaction_s": round(result.longest_batch_s, 3),
            "median_transaction_s": round(result.median_batch_s, 3)}


def run_pt_archiver(db: str, batch_rows: int) -> dict:
    u = sa.engine.make_url(db)
    cmd = ["pt-archiver", "--source", f"h={u.host},P={u.port or 3306},u={u.username},D={u.database},t=jobs",
           "--where", "finished_at < NOW() - INTERVAL 180 DAY AND status IN ('killed','finished','failed','error')",
           "--purge", "--limit", str(batch_rows), "--commit-each", "--statistics", "--no-check-charset"]
    if u.password:
        cmd[2] += f",p={u.password}"
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.monotonic() - t0
    if out.returncode != 0:
        raise SystemExit(f"pt-archiver failed: {out.stderr[-2000:]}")
    deleted = [int(x) for x in re.findall(r"^DELETE\s+(\d+)", out.stdout, re.M)]
    return {"jobs": deleted[0] if deleted else None, "elapsed_s": round(elapsed, 1), "statistics": out.stdout[-1500:],
            "longest_transaction_s": None}


def run_cpu_load(share: float, seconds: float, nice: int = 0) -> dict:
    """Busy for ``share`` of every 10 ms period (sleeping the rest) in a child process at ``nice``."""
    code = ("import time\n"
            f"end = time.monotonic() + {seconds}\n"
            "while time.monotonic() < end:\n"
            f"    t = time.monotonic(); busy = t + {share} * 0.01\n"
            "    while time.monotonic() < busy: pass\n"
            "    time.sleep(max(0.0, t + 0.01 - time.monotonic()))\n")
    t0 = time.monotonic()
    subprocess.run(["nice", "-n", str(nice), sys.executable, "-c", code], check=True)
    return {"jobs": 0, "elapsed_s": round(time.monotonic() - t0, 1), "cpu_share": share, "nice": nice,
            "longest_transaction_s": None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_server_args(parser, port=8766)
    parser.add_argument("--tool", choices=["janitor", "pt-archiver", "cpu-load"], default="janitor")
    parser.add_argument("--batch-rows", type=int, default=500)
    parser.add_argument("--pause", type=float, default=0.01,
                        help="janitor's least pause between batches, seconds (the pause is at least the batch's time)")
    parser.add_argument("--cpu-share", type=float, default=0.74,
                        help="cpu-load: fraction of one core to burn (the janitor's purge: MariaDB + janitor CPU / wall = 0.74)")
    parser.add_argument("--load-s", type=float, default=45.0, help="cpu-load: seconds")
    parser.add_argument("--nice", type=int, default=0, help="cpu-load: its nice value (19: the lowest CPU priority)")
    parser.add_argument("--read-s", type=int, default=30, help="seconds of read load before the purge (the baseline)")
    parser.add_argument("--connections", type=int, default=4, help="wrk connections of the read load")
    parser.add_argument("--delay-ms", type=int, default=0, help="pause of each wrk connection between reads (0: saturating load)")
    args = parser.parse_args()
    mariadb = apply_for_this_run(args.db, args.debian_defaults)
    token = json.loads(Path(args.tokens).read_text())["admin"]
    engine = sa.create_engine(args.db)
    before = counts(engine)
    with engine.connect() as c:
        top = c.scalar(sa.text("SELECT max(id) FROM jobs"))
        old = c.scalar(sa.text("SELECT count(*) FROM jobs WHERE finished_at < UTC_TIMESTAMP() - INTERVAL 180 DAY"))
    summary: dict = {"mariadb": mariadb, "tool": args.tool, "batch_rows": args.batch_rows, "rows_before": before, "old_jobs": old,
                     "read_connections": args.connections, "read_delay_ms": args.delay_ms, "gunicorn_workers": args.workers}
    proc = start_gunicorn(args.db, args.port, args.workers)
    url = f"http://127.0.0.1:{args.port}/"
    script = lua(token, read_script(top - 400_000, top, args.delay_ms))
    during = None
    try:
        warm = start_wrk(url, script, 2, args.connections)
        warm.communicate()
        baseline = start_wrk(url, script, args.read_s, args.connections)
        summary["read_before"] = parse_wrk(baseline.communicate()[0])
        print("read before", summary["read_before"], flush=True)
        during = start_wrk(url, script, 3600, args.connections)
        time.sleep(1)
        if args.tool == "janitor":
            summary["pause_s"] = args.pause
            summary["purge"] = run_janitor(args.db, args.batch_rows, args.pause)
        elif args.tool == "cpu-load":
            summary["purge"] = run_cpu_load(args.cpu_share, args.load_s, args.nice)
        else:
            summary["purge"] = run_pt_archiver(args.db, args.batch_rows)
        during.send_signal(signal.SIGINT)
        summary["read_during"] = parse_wrk(during.communicate(timeout=60)[0])
        print("read during", summary["read_during"], flush=True)
    finally:
        # a purge that failed must not leave its read load running (it would load every later run)
        if during is not None and during.poll() is None:
            during.kill()
            during.wait()
        proc.terminate()
        proc.wait(timeout=30)
    after = counts(engine)
    engine.dispose()
    deleted = {t: before[t] - after[t] for t in before}
    purge = summary["purge"]
    summary["rows_deleted"] = deleted
    summary["jobs_per_s"] = round(deleted["jobs"] / purge["elapsed_s"], 1)
    summary["rows_per_s"] = round(sum(deleted.values()) / purge["elapsed_s"], 1)
    summary["read_p99_ratio"] = round(summary["read_during"]["p99_ms"] / summary["read_before"]["p99_ms"], 2)
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
