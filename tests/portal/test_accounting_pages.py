"""Portal pages over the accounting rollup: GPU hours (booked, used, idle, preemptible share, by month
with a chart, CSV) and the job page's utilisation charts (docs/accounting.md)."""

from __future__ import annotations

import datetime as dt
import html
import re

import sqlalchemy as sa

from dlts.models import Job, JobAttempt, JobStatus, utcnow
from dlts.services import accounting
from dlts.services import nodes as node_service

JOB = {"vc": "vision", "type": "batch", "image": "busybox", "command": "echo hello", "gpus": "2"}


def _text(response) -> str:
    return html.unescape(response.get_data(as_text=True))


def _running_job(c, sessions, started: dt.datetime) -> int:
    response = c.post("/submit", JOB)
    assert response.status_code == 302
    job_id = int(response.headers["Location"].rsplit("/", 1)[1])
    with sessions() as s:
        s.add(JobAttempt(job_id=job_id, number=1, placements=[{"node": "testnode", "gpu_indices": [0, 1]}],
                         started_at=started))
        s.execute(sa.update(Job).where(Job.id == job_id).values(status=JobStatus.RUNNING, attempt=1, started_at=started))
        s.commit()
    return job_id


def _report(app, sessions, job_id: int, ratios: list[float]) -> None:
    with sessions() as s:
        token = node_service.issue_node_token(s, "testnode")
    gpus = [{"index": i, "utilization_ratio": r, "memory_used_bytes": 2**30, "job_id": str(job_id)} for i, r in enumerate(ratios)]
    body = {"schema_version": 1, "node": "testnode", "metrics": {
        "gpus": gpus, "jobs": [{"job_id": str(job_id), "pids": 3, "cpu_cores": 1.5, "memory_bytes": 3 * 2**30}]}}
    r = app.test_client().post("/api/v1/nodes/testnode/report", json=body, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.get_json()


def test_gpu_hours_page_shows_booked_used_idle_by_month_with_a_chart_and_csv(app, as_user, sessions):
    alice = as_user("alice")
    now = utcnow()
    started = now - dt.timedelta(minutes=10)
    job_id = _running_job(alice, sessions, started)
    _report(app, sessions, job_id, [0.25, 0.75])
    with sessions() as s:
        accounting.book(s, now + dt.timedelta(minutes=3))  # the report's minute is closed by then
    page = _text(alice.get("/gpu-hours"))
    assert 'id="gpu-hours-chart"' in page and re.search(r'<rect [^>]*class="busy"', page)
    month = now.strftime("%Y-%m")
    row = re.search(rf"<tr><td>{month}</td>(.*?)</tr>", page).group(1)
    booked, used, idle = (float(x) for x in re.findall(r'<td class="num[^"]*">([\d.]+)</td>', row)[:3])
    with sessions() as s:
        attempt = s.scalar(sa.select(JobAttempt).where(JobAttempt.job_id == job_id))
        assert booked == round(attempt.gpu_ms / 3_600_000, 2) > 0
        assert used == round(attempt.busy_gpu_ms / 3_600_000, 2) and attempt.busy_gpu_ms > 0
        assert idle == round((attempt.sampled_gpu_ms - attempt.busy_gpu_ms) / 3_600_000, 2)
    assert re.search(r"<td>alice</td><td>vision</td>", page)
    csv = alice.get("/gpu-hours?format=csv")
    assert csv.mimetype == "text/csv" and "alice,vision" in csv.get_data(as_text=True)
    assert "No GPU time was booked in the twelve months" in _text(as_user("carol").get("/gpu-hours"))


def test_the_job_page_charts_the_current_attempts_utilisation_for_its_owner_only(app, as_user, sessions):
    alice = as_user("alice")
    job_id = _running_job(alice, sessions, utcnow() - dt.timedelta(minutes=2))
    assert 'id="no-utilisation"' in _text(alice.get(f"/jobs/{job_id}"))
    _report(app, sessions, job_id, [0.5, 1.0])
    page = _text(alice.get(f"/jobs/{job_id}"))
    assert 'id="utilisation"' in page
    for title in ("GPU utilisation", "GPU memory", "CPU", "Host memory"):
        assert f'aria-label="{title} of attempt 1"' in page
    assert page.count("<polyline") == 2 + 2 + 1 + 1  # two GPUs twice, CPU, host memory
    assert "testnode GPU 0" in page and "testnode GPU 1" in page
    assert 'id="utilisation"' not in _text(as_user("bob").get(f"/jobs/{job_id}"))  # a member sees public fields only
