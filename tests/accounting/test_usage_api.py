"""GET /api/v1/usage: grouping, ranges from the month and day rows, visibility, bad input, and CSV
whose text cells never run as spreadsheet formulas."""

from __future__ import annotations

import csv
import datetime as dt
import io
import time

import pytest
import requests
import sqlalchemy as sa

from dlts.models import Job, User, VirtualCluster
from dlts.repositories import accounting as accounting_repo
from dlts.services import accounting


def _ids(sessions):
    with sessions() as s:
        users = dict(s.execute(sa.select(User.name, User.id)).all())
        vcs = dict(s.execute(sa.select(VirtualCluster.name, VirtualCluster.id)).all())
    return users, vcs


def _book(sessions, rows):
    """Rollup rows as a booking pass adds them (the same upsert), for range and visibility checks."""
    with sessions() as s:
        for row in rows:
            day = row["day"]
            base = {k: row[k] for k in ("user_id", "vc_id", "sku", "preemptible")} | {
                "gpu_ms": row["gpu_ms"], "busy_gpu_ms": row.get("busy", 0), "sampled_gpu_ms": row.get("sampled", 0)}
            accounting_repo.add_totals(s, [base | {"period": "day", "start": day},
                                           base | {"period": "month", "start": day.replace(day=1)}])
            accounting_repo.add_job_days(s, [base | {"job_id": row.get("job_id", 1), "day": day}])
        s.commit()


H = 3_600_000  # one GPU-hour in GPU-milliseconds


def test_ranges_mix_month_and_day_rows_and_groups_add_up(client, world, sessions):
    users, vcs = _ids(sessions)
    alice, bob, vision = users["alice"], users["bob"], vcs["vision"]
    _book(sessions, [
        {"day": dt.date(2026, 10, 31), "user_id": alice, "vc_id": vision, "sku": "a100", "preemptible": False, "gpu_ms": 1 * H},
        {"day": dt.date(2026, 11, 1), "user_id": alice, "vc_id": vision, "sku": "a100", "preemptible": False, "gpu_ms": 2 * H,
         "busy": H, "sampled": 2 * H},
        {"day": dt.date(2026, 11, 15), "user_id": alice, "vc_id": vision, "sku": "a100", "preemptible": True, "gpu_ms": 4 * H},
        {"day": dt.date(2026, 11, 30), "user_id": bob, "vc_id": vision, "sku": "v100", "preemptible": False, "gpu_ms": 8 * H},
        {"day": dt.date(2026, 12, 2), "user_id": bob, "vc_id": vision, "sku": "v100", "preemptible": False, "gpu_ms": 16 * H},
    ])
    auth = world.auth("admin")

    def hours(**params):
        r = client.get("/api/v1/usage", query_string=params, headers=auth)
        assert r.status_code == 200, r.get_json()
        return r.get_json()

    november = hours(**{"from": "2026-11", "to": "2026-11", "group_by": "user"})
    assert november["from"] == "2026-11-01" and november["to"] == "2026-11-30"
    assert {r["user"]: r["gpu_hours"] for r in november["items"]} == {"alice": 6.0, "bob": 8.0}
    a = next(r for r in november["items"] if r["user"] == "alice")
    assert (a["busy_gpu_hours"], a["idle_gpu_hours"], a["unmeasured_gpu_hours"], a["preemptible_gpu_hours"]) == (1.0, 1.0, 4.0, 4.0)
    assert a["preemptible_share"] == pytest.approx(4 / 6, abs=1e-4)
    # day rows at both ends around a whole month of month rows
    span = hours(**{"from": "2026-10-31", "to": "2026-12-02", "group_by": "sku"})
    assert {r["sku"]: r["gpu_hours"] for r in span["items"]} == {"a100": 7.0, "v100": 24.0}
    by_month = hours(**{"from": "2026-10-31", "to": "2026-12-01", "group_by": "month"})
    assert [(r["month"], r["gpu_hours"]) for r in by_month["items"]] == [("2026-10", 1.0), ("2026-11", 14.0)]
    by_day = hours(**{"from": "2026-11-01", "to": "2026-11-15", "group_by": "day,preemptible"})
    assert [(r["day"], r["preemptible"], r["gpu_hours"]) for r in by_day["items"]] == [
        ("2026-11-01", False, 2.0), ("2026-11-15", True, 4.0)]
    assert hours(**{"from": "2026-11", "to": "2026-11", "user": "bob", "group_by": "vc"})["items"][0]["gpu_hours"] == 8.0
    assert hours(**{"from": "2026-11", "user": "nobody"})["items"] == []


def test_members_see_their_vcs_and_cluster_admins_everything(client, world, sessions):
    users, vcs = _ids(sessions)
    day = dt.date(2026, 11, 10)
    _book(sessions, [
        {"day": day, "user_id": users["alice"], "vc_id": vcs["vision"], "sku": "a100", "preemptible": False, "gpu_ms": H, "job_id": 1},
        {"day": day, "user_id": users["carol"], "vc_id": vcs["nlp"], "sku": "a100", "preemptible": False, "gpu_ms": H, "job_id": 2},
    ])
    q = {"from": "2026-11", "group_by": "vc,user"}

    def seen(user, **extra):
        r = client.get("/api/v1/usage", query_string=q | extra, headers=world.auth(user))
        assert r.status_code == 200
        return {(i["vc"], i["user"]) for i in r.get_json()["items"]}

    assert seen("admin") == {("vision", "alice"), ("nlp", "carol")}
    assert seen("bob") == {("vision", "alice")}  # a member of vision sees vision's use, like its jobs
    assert seen("carol") == {("nlp", "carol")}
    assert seen("carol", vc="vision") == set()  # not carol's VC: nothing, not an error
    jobs = client.get("/api/v1/usage", query_string={"from": "2026-11", "group_by": "job"}, headers=world.auth("carol"))
    assert [i["job_id"] for i in jobs.get_json()["items"]] == [2]
    assert client.get("/api/v1/usage").status_code == 401


@pytest.mark.parametrize("params, field", [
    ({"group_by": "colour"}, "group_by"),
    ({"group_by": "user,,nope"}, "group_by"),
    ({"from": "2026-13"}, "from"),
    ({"from": "yesterday"}, "from"),
    ({"from": "2026-11-05", "to": "2026-11-01"}, "to"),
    ({"format": "xlsx"}, "format"),
    ({"limit": "0"}, "limit"),
])
def test_bad_parameters_are_400_naming_the_field(client, world, params, field):
    r = client.get("/api/v1/usage", query_string=params, headers=world.auth("alice"))
    assert r.status_code == 400, r.get_json()
    body = r.get_json()["error"]
    assert field in str(body.get("details")) or field in body["message"]


NASTY = ["=HYPERLINK(\"http://evil\")", "+1+2", "-3", "@SUM(A1)", "\tcmd", "\rcmd", "plain"]


def test_usage_csv_escapes_formula_cells(live, world, sessions, settings):
    """Jobs named like formulas run on the real job manager and are booked; the CSV quotes every
    such cell, leaves the rest as they were."""
    from dlts.managers.accounting import AccountingManager

    ids = []
    for name in NASTY:
        r = requests.post(f"{live.url}/api/v1/jobs", json={"name": name, "vc": "vision", "image": "debian:12",
                                                          "command": "sleep 1"}, headers=world.auth("alice"), timeout=10)
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    deadline = time.monotonic() + 30
    while True:
        live.tick()
        with sessions() as s:
            if all(j.finished_at for j in s.scalars(sa.select(Job).where(Job.id.in_(ids)))):
                break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    AccountingManager(sessions, 30).run_once()
    r = requests.get(f"{live.url}/api/v1/usage", params={"group_by": "job", "format": "csv"},
                     headers=world.auth("alice"), timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/csv")
    assert "attachment" in r.headers["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(r.text, newline="")))
    names = {row["job_name"] for row in rows}
    assert names == {"'" + n for n in NASTY[:-1]} | {"plain"}
    assert all(row["user"] == "alice" and row["vc"] == "vision" for row in rows)
    for row in rows:
        assert not row["job_name"].startswith(accounting.FORMULA_LEADS)


def test_safe_cell_quotes_every_formula_lead_and_nothing_else():
    for lead in accounting.FORMULA_LEADS:
        assert accounting.safe_cell(lead + "x") == "'" + lead + "x"
    assert accounting.safe_cell("a=b") == "a=b"
    assert accounting.safe_cell(None) == ""
    assert accounting.safe_cell(-3.5) == -3.5  # numbers are numbers, not formulas
