"""Seed a MariaDB database with N jobs (default 1,000,000), their attempts and events, for the API benchmarks.

    .venv/bin/python bench/seed_jobs.py [--url mysql+pymysql://root@127.0.0.1:3306/dlts_bench] [--jobs 1000000]

Creates the database if needed (never use the CI's `test` database), runs the Alembic migrations,
adds users (admin, alice, bob, u0..u47), VCs (vc0..vc3) and 16 nodes, then inserts jobs with
multi-row INSERTs in chunks. The first half of the ids ended 400 days ago (what the janitor purges
with retention_days=180); the rest ended within the last 100 days, except the newest 1,000, which
are queued. Every ended job has one attempt and two events (submitted, finished); queued ones one
event. Writes the API tokens to --tokens (JSON) for bench/api_load.py.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import time
from pathlib import Path

import pymysql
import sqlalchemy as sa

DEFAULT_URL = "mysql+pymysql://root@127.0.0.1:3306/dlts_bench"
CHUNK = 2000

JOB_COLUMNS = ("id", "name", "user_id", "vc_id", "type", "status", "reason", "image", "command", "sku", "gpus", "nodes", "cpu",
               "memory_bytes", "priority", "preemptible", "max_retries", "retries_used", "queue_time", "submitted_at",
               "started_at", "finished_at", "exit_code", "attempt", "spec", "updated_at")
ATTEMPT_COLUMNS = ("job_id", "number", "placements", "created_at", "started_at", "ended_at", "exit_code", "end_reason", "spends_retry")
EVENT_COLUMNS = ("job_id", "at", "kind", "from_status", "to_status", "reason", "message", "actor")


def create_database(url: sa.engine.URL) -> None:
    server = sa.create_engine(url.set(database="mysql"))
    with server.begin() as conn:
        conn.execute(sa.text(f"CREATE DATABASE IF NOT EXISTS `{url.database}` CHARACTER SET utf8mb4"))
    server.dispose()


def setup_world(url: str) -> tuple[dict[str, str], list[int], list[int]]:
    from dlts import db_migrate
    from dlts.models import Node
    from dlts.services import admin

    engine = sa.create_engine(url)
    db_migrate.upgrade(engine)
    tokens: dict[str, str] = {}
    with sa.orm.Session(engine) as s:
        if s.scalar(sa.text("SELECT count(*) FROM users")) == 0:
            for i in range(4):
                admin.add_vc(s, f"vc{i}", {"a100": 32})
            for name in ["admin", "alice", "bob"] + [f"u{i}" for i in range(48)]:
                admin.add_user(s, name, admin=(name == "admin"))
            for i, name in enumerate(["alice", "bob"] + [f"u{i}" for i in range(48)]):
                admin.add_member(s, f"vc{i % 4}", name)
            for i in range(16):
                s.add(Node(name=f"node{i:02d}", sku="a100", gpus=8, cpu=96, memory_bytes=1024 * 2**30, ib_domain="ib0",
                           labels={}, metrics={}))
            s.commit()
        for name in ("admin", "alice", "bob"):
            tokens[name] = admin.new_token(s, name, "bench")
        user_ids = list(s.scalars(sa.text("SELECT id FROM users WHERE name <> 'admin' ORDER BY id")))
        vc_of_user = {uid: s.scalar(sa.text("SELECT vc_id FROM role_bindings WHERE user_id = :u AND vc_id IS NOT NULL LIMIT 1"), {"u": uid})
                      for uid in user_ids}
    engine.dispose()
    return tokens, user_ids, [vc_of_user[u] for u in user_ids]


def insert_many(cursor, table: str, columns: tuple[str, ...], rows: list[tuple]) -> None:
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})"
    cursor.executemany(sql, rows)  # PyMySQL turns this into multi-row INSERT statements


def seed(url: str, jobs: int, first_id: int, old_fraction: float, rng: random.Random, user_ids: list[int], vc_ids: list[int],
         queued_tail: int = 1000) -> float:
    u = sa.engine.make_url(url)
    conn = pymysql.connect(host=u.host, port=u.port or 3306, user=u.username, password=u.password or "", database=u.database,
                           autocommit=False, max_allowed_packet=64 * 2**20)
    cursor = conn.cursor()
    cursor.execute("SET SESSION unique_checks=0, foreign_key_checks=0")
    now = dt.datetime.utcnow().replace(microsecond=0)
    old_until = first_id + int(jobs * old_fraction)
    queued_from = first_id + jobs - queued_tail
    started = time.monotonic()
    for chunk_start in range(first_id, first_id + jobs, CHUNK):
        job_rows, attempt_rows, event_rows = [], [], []
        for job_id in range(chunk_start, min(chunk_start + CHUNK, first_id + jobs)):
            k = rng.randrange(len(user_ids))
            user, vc = user_ids[k], vc_ids[k]
            if job_id < old_until:
                finished = now - dt.timedelta(days=400, seconds=(old_until - job_id) * 10)
            else:
                finished = now - dt.timedelta(seconds=(first_id + jobs - job_id) * 8)
            submitted = finished - dt.timedelta(seconds=rng.randrange(60, 36000))
            queued = job_id >= queued_from
            status = "queued" if queued else rng.choice(("finished", "finished", "finished", "failed", "killed"))
            gpus = rng.choice((0, 1, 2, 4, 8))
            job_rows.append((job_id, f"train-{job_id}", user, vc, "batch", status, None, "nvcr.io/pytorch:24.01",
                             f"python train.py --seed {job_id}", "a100" if gpus else None, gpus, 0, 12.0 * max(gpus, 1),
                             (128 * 2**30) * max(gpus, 1) // 8, 100, 0, 3, 0, submitted, submitted,
                             None if queued else submitted + dt.timedelta(seconds=30), None if queued else finished,
                             None if queued else (0 if status == "finished" else 1), 0 if queued else 1,
                             '{"env": {}, "ports": [], "ssh": false}', finished))
            event_rows.append((job_id, submitted, "transition", None, None, None, "submitted", f"user{user}"))
            if not queued:
                attempt_rows.append((job_id, 1, json.dumps([{"node": f"node{job_id % 16:02d}", "gpu_indices": list(range(gpus)),
                                                             "cpu": 12.0, "memory_bytes": 2**34}]),
                                     submitted, submitted + dt.timedelta(seconds=30), finished, job_rows[-1][22], status,
                                     status != "finished"))
                event_rows.append((job_id, finished, "transition", "running", status, status, None, "jobmanager"))
        insert_many(cursor, "jobs", JOB_COLUMNS, job_rows)
        insert_many(cursor, "job_attempts", ATTEMPT_COLUMNS, attempt_rows)
        insert_many(cursor, "job_events", EVENT_COLUMNS, event_rows)
        conn.commit()
        done = min(chunk_start + CHUNK, first_id + jobs) - first_id
        if done % 100_000 == 0:
            print(f"  {done} jobs, {done / (time.monotonic() - started):.0f} jobs/s", flush=True)
    conn.close()
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--old-fraction", type=float, default=0.5, help="share of jobs that ended 400 days ago")
    parser.add_argument("--tokens", default="/tmp/dlts_bench_tokens.json")
    parser.add_argument("--append-old", type=int, default=0,
                        help="only add this many old (400-day) jobs below the smallest id (re-seed after a purge)")
    args = parser.parse_args()
    url = sa.engine.make_url(args.url)
    if url.database in (None, "test"):
        raise SystemExit("refusing to seed the CI's `test` database; use e.g. .../dlts_bench")
    create_database(url)
    tokens, user_ids, vc_ids = setup_world(args.url)
    Path(args.tokens).write_text(json.dumps(tokens))
    rng = random.Random(42)
    if args.append_old:
        engine = sa.create_engine(args.url)
        with engine.connect() as c:
            lowest = c.scalar(sa.text("SELECT min(id) FROM jobs")) or 1
        engine.dispose()
        if lowest <= args.append_old:
            raise SystemExit(f"no id room below {lowest} for {args.append_old} jobs")
        elapsed = seed(args.url, args.append_old, lowest - args.append_old, 1.0, rng, user_ids, vc_ids, queued_tail=0)
        print(f"added {args.append_old} old jobs in {elapsed:.1f} s")
        return
    engine = sa.create_engine(args.url)
    with engine.connect() as c:
        existing = c.scalar(sa.text("SELECT count(*) FROM jobs"))
    engine.dispose()
    if existing:
        print(f"{existing} jobs already there; tokens refreshed in {args.tokens}")
        return
    elapsed = seed(args.url, args.jobs, 1, args.old_fraction, rng, user_ids, vc_ids)
    print(f"seeded {args.jobs} jobs (+ attempts, events) in {elapsed:.1f} s = {args.jobs / elapsed:.0f} jobs/s; tokens in {args.tokens}")


if __name__ == "__main__":
    main()
