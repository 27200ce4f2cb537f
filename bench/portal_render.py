"""Portal render time with a large jobs table (MariaDB seeded by bench/seed_jobs.py).

    .venv/bin/python bench/seed_jobs.py                     # once: 1,000,000 jobs into dlts_bench
    .venv/bin/python bench/portal_render.py [--url mysql+pymysql://root@127.0.0.1:3306/dlts_bench] [--repeat 20]

Server time of each page: the whole request inside the WSGI app (session, principal and roles from
the database, the page's queries, Jinja rendering), measured around Flask's test client, so no
network or browser time is included. The session cookie is set directly (no password is written to
the benchmark database). Prints one JSON object; the median of ``--repeat`` runs after 2 warm-ups.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

from dlts.app import create_app
from dlts.config import Settings
from dlts.db import engine_of
from dlts.repositories.jobs import encode_cursor

DEFAULT_URL = "mysql+pymysql://root@127.0.0.1:3306/dlts_bench"
BUDGET_MS = 200.0


def timed(client, url: str, repeat: int) -> dict:
    for _ in range(2):
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code, response.get_data(as_text=True)[:300])
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        response = client.get(url)
        samples.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200, url
    samples.sort()
    return {"url": url, "median_ms": round(statistics.median(samples), 1),
            "p95_ms": round(samples[max(0, int(len(samples) * 0.95) - 1)], 1), "bytes": len(response.data)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    settings = Settings(home=Path(tempfile.mkdtemp()), database_url=args.url, secret_key="portal-bench-secret-key")
    app = create_app(settings)
    with engine_of(app).connect() as c:
        jobs = c.scalar(sa.text("SELECT count(*) FROM jobs"))
        max_id = c.scalar(sa.text("SELECT max(id) FROM jobs"))
        ids = dict(c.execute(sa.text("SELECT name, id FROM users WHERE name IN ('admin', 'alice')")).all())
        alice_vc = c.scalar(sa.text("SELECT v.name FROM role_bindings r JOIN vcs v ON v.id = r.vc_id "
                                    "WHERE r.user_id = :u ORDER BY v.name LIMIT 1"), {"u": ids["alice"]})
        # an ended job of alice's with its attempt and events, from the middle of the table
        detail_id = c.scalar(sa.text("SELECT id FROM jobs WHERE user_id = :u AND id <= :mid AND finished_at IS NOT NULL "
                                     "ORDER BY id DESC LIMIT 1"), {"u": ids["alice"], "mid": max_id // 2})
    deep = encode_cursor(max_id // 2)
    cases = {
        "jobs, mine, first page": "/jobs",
        f"jobs, VC {alice_vc}, first page": "/jobs?scope=vc",
        f"jobs, VC {alice_vc}, deep page (ids below the middle)": f"/jobs?scope=vc&cursor={deep}",
        f"jobs, VC {alice_vc}, status finished": "/jobs?scope=vc&status=finished",
        f"jobs, VC {alice_vc}, ended (4 statuses)": "/jobs?scope=vc&status=ended",
        f"jobs, VC {alice_vc}, active (7 statuses)": "/jobs?scope=vc&status=active",
        f"jobs, VC {alice_vc}, user u2 (a member with jobs there)": "/jobs?scope=vc&user=u2",
        f"jobs, VC {alice_vc}, user bob (20k jobs, none there)": "/jobs?scope=vc&user=bob",
        f"jobs, VC {alice_vc}, oldest first": "/jobs?scope=vc&order=oldest",
        "jobs, all (admin), first page": "/jobs?scope=all",
        "jobs, all (admin), deep page": f"/jobs?scope=all&cursor={deep}",
        "job details (ended, with attempt and events)": f"/jobs/{detail_id}",
    }
    # monthly reports: summed over the month's attempts; outside the 200 ms budget (see docs/portal.md)
    reports = {
        "GPU hours, mine (report)": "/gpu-hours",
        "GPU hours, my VCs (report)": "/gpu-hours?scope=vc",
    }
    results = []
    for label, url in cases.items():
        client = app.test_client()
        with client.session_transaction() as session:
            session["uid"] = ids["admin" if "admin" in label else "alice"]
        results.append({"case": label, **timed(client, url, args.repeat)})
    worst = max(r["median_ms"] for r in results)
    for label, url in reports.items():
        client = app.test_client()
        with client.session_transaction() as session:
            session["uid"] = ids["alice"]
        results.append({"case": label, **timed(client, url, max(3, args.repeat // 4))})
    print(json.dumps({"jobs": jobs, "repeat": args.repeat, "budget_ms": BUDGET_MS, "within_budget": worst <= BUDGET_MS,
                      "results": results}, indent=1))


if __name__ == "__main__":
    main()
