"""Utilisation history end to end: the real agent's jobs collector reads a real job's processes
(started by the job manager's local backend), its reporter posts them with GPU samples to the API
over HTTP, the report folds them into minute points, the job's API and the accounting pass read them;
and the agent's per-job CPU/memory sums on a fake /proc."""

from __future__ import annotations

import datetime as dt
import json
import time

import requests
import sqlalchemy as sa

from dlts.managers.accounting import AccountingManager
from dlts.models import JobAttempt, UtilisationPoint, utcnow
from dlts.services import accounting
from dlts.services import nodes as node_service


def _submit(live, world, **body):
    payload = {"vc": "vision", "image": "debian:12", "command": "true"} | body
    r = requests.post(f"{live.url}/api/v1/jobs", json=payload, headers=world.auth("alice"), timeout=10)
    assert r.status_code == 201, r.text
    return r.json()


def _wait(live, world, job_id, statuses, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while True:
        live.tick()
        job = requests.get(f"{live.url}/api/v1/jobs/{job_id}", headers=world.auth("alice"), timeout=10).json()
        if job["status"] in statuses:
            return job
        assert time.monotonic() < deadline, f"job {job_id} stuck in {job['status']}"
        time.sleep(0.1)


def _snapshot(collection_results, node="testnode"):
    from dlts_agent.model import AgentSnapshot, Collection

    return AgentSnapshot(node, "test", Collection(time.time(), collection_results), (), {}, {})


def test_the_agent_reports_a_jobs_gpus_and_host_use_into_minute_points_that_accounting_books(
        live, world, sessions, settings, tmp_path):
    from dlts_agent.collectors.jobs import JobsCollector
    from dlts_agent.config import ReportConfig
    from dlts_agent.model import CollectorResult, CollectorStatus, GpuReadout, GpuSample
    from dlts_agent.reporter import Reporter

    with sessions() as s:
        token = node_service.issue_node_token(s, "testnode")
    stop = tmp_path / "stop"  # the job keeps a core busy until the test has read it (at most 60 s)
    job = _submit(live, world, command=f"python3 -c 'import os, time; t=time.time()\n"
                                       f"while time.time()-t<60 and not os.path.exists(\"{stop}\"): pass'", gpus=2)
    running = _wait(live, world, job["id"], {"running"})
    mine = set(running["placements"][0]["gpu_indices"])
    collector = JobsCollector(local_run_dir=str(settings.effective_run_dir))  # this test run's backend only
    deadline = time.monotonic() + 60
    while True:  # until the busy loop runs (not its shell, nor python still starting): then it has CPU to book
        busy = collector.collect()[0].usage.get(str(job["id"]))
        if busy is not None and busy.cpu_cores:
            break
        assert time.monotonic() < deadline, f"job {job['id']}'s busy loop showed no CPU use in 60 s: {busy}"
        time.sleep(0.3)
    time.sleep(1.0)  # a loaded machine still gives a busy loop ticks within a second
    ratios = iter([0.5, 1.0])
    snap = {}

    def collect():
        jobs, errors = collector.collect()
        assert errors == [] and str(job["id"]) in jobs.usage
        ratio = next(ratios)
        gpus = tuple(GpuSample(index=i, uuid=f"GPU-{i}", bus_id=None, utilization_ratio=ratio if i in mine else 0.0,
                               memory_used_bytes=(i + 1) * 2**30) for i in range(4))
        snap["now"] = _snapshot({"gpu": CollectorResult("gpu", CollectorStatus.OK, 0.0, GpuReadout(gpus, 4)),
                                 "jobs": CollectorResult("jobs", CollectorStatus.OK, 0.0, jobs)})
        return jobs

    reporter = Reporter(ReportConfig(enabled=True, api_url=live.url, timeout_s=5), "testnode", token,
                        lambda: snap["now"], None)
    first = collect()
    reporter.report_once()
    time.sleep(0.3)
    collect()
    reporter.report_once()
    usage = first.usage[str(job["id"])]
    assert usage.pids >= 1 and usage.memory_bytes > 0 and usage.cpu_cores is not None and usage.cpu_cores > 0

    # the history as the job's owner reads it: the job's own GPUs, their mean, CPU and host memory
    r = requests.get(f"{live.url}/api/v1/jobs/{job['id']}/utilisation", headers=world.auth("alice"), timeout=10)
    assert r.status_code == 200, r.text
    history = r.json()
    assert history["attempt"] == 1 and history["interval_s"] == 60 and history["points"]
    samples = [g for p in history["points"] for g in p["gpus"]]
    assert {g["index"] for g in samples} == mine and all(g["node"] == "testnode" for g in samples)
    with sessions() as s:
        points = list(s.scalars(sa.select(UtilisationPoint)))
        assert sum(p.samples for p in points) == 2
        if len(points) == 1:  # both reports in one minute: the point is their mean
            assert {g["utilization_ratio"] for g in samples} == {0.75}
            assert {g["memory_used_bytes"] for g in samples} == {(i + 1) * 2**30 for i in mine}
    assert all(p["cpu_cores"] is not None and p["memory_bytes"] > 0 for p in history["points"])
    # bob is a member of vision, not the owner: 403; carol is outside the VC: 404
    assert requests.get(f"{live.url}/api/v1/jobs/{job['id']}/utilisation", headers=world.auth("bob"), timeout=10).status_code == 403
    assert requests.get(f"{live.url}/api/v1/jobs/{job['id']}/utilisation", headers=world.auth("carol"), timeout=10).status_code == 404
    assert requests.get(f"{live.url}/api/v1/jobs/{job['id']}/utilisation", params={"attempt": 9},
                        headers=world.auth("alice"), timeout=10).json()["error"]["details"]["field"] == "attempt"

    stop.touch()
    _wait(live, world, job["id"], {"finished"})
    later = utcnow() + dt.timedelta(minutes=5)
    AccountingManager(sessions, 30, clock=lambda: later).run_once()
    with sessions() as s:
        attempt = s.scalar(sa.select(JobAttempt).where(JobAttempt.job_id == job["id"]))
        assert not attempt.accounting_open
        start, end = accounting._ms(attempt.started_at), accounting._ms(attempt.ended_at)
        busy = sampled = 0
        for p in s.scalars(sa.select(UtilisationPoint)):
            m = accounting._ms(p.minute)
            covered = max(0, min(m + 60_000, end) - max(m, start))
            for _n, ratio, _mem in p.gpus.values():
                busy += round(ratio * covered)
                sampled += covered
        assert attempt.busy_gpu_ms == busy > 0 and attempt.sampled_gpu_ms == sampled
        assert attempt.busy_gpu_ms <= attempt.sampled_gpu_ms <= attempt.gpu_ms == 2 * (end - start)
    rows = requests.get(f"{live.url}/api/v1/usage", params={"group_by": "job"}, headers=world.auth("alice"),
                        timeout=10).json()["items"]
    assert [(r["job_id"], r["busy_gpu_seconds"], r["gpu_seconds"]) for r in rows] == [
        (job["id"], busy / 1000, 2 * (end - start) / 1000)]


def test_old_utilisation_points_are_purged_after_the_retention(sessions, world):
    now = utcnow()
    with sessions() as s:
        for age_days in (1, 29, 31, 40):
            s.add(UtilisationPoint(attempt_id=1, node="n", minute=accounting.floor_minute(now - dt.timedelta(days=age_days)),
                                   samples=1, gpus={}, cpu_samples=0))
        s.commit()
        assert accounting.purge_utilisation(s, now, 30, batch=1) == 2
        assert sorted((now - p.minute).days for p in s.scalars(sa.select(UtilisationPoint))) == [1, 29]


def test_the_jobs_collector_sums_cpu_and_resident_memory_per_job(tmp_path):
    from dlts_agent.collectors.jobs import JobsCollector

    def proc(pid: int, ppid: int, utime: int, stime: int, start: int, rss_pages: int, job: str = "") -> None:
        d = tmp_path / str(pid)
        d.mkdir(exist_ok=True)
        (d / "environ").write_bytes(f"DLTS_JOB_ID={job}\0DLTS_USER=alice\0DLTS_VC=vision\0".encode())
        # the command name holds a space and a parenthesis: fields are counted after the last ')'
        fields = ["S", str(ppid), "1", "1", "0", "-1", "0", "0", "0", "0", "0", str(utime), str(stime), "0", "0", "20",
                  "0", "1", "0", str(start), "0"]
        (d / "stat").write_text(f"{pid} (py thon) x) " + " ".join(fields) + "\n")
        (d / "statm").write_text(f"1000 {rss_pages} 10 1 0 100 0\n")

    def unit(job: str, init: int, start: int) -> None:
        """A local backend unit whose DLTS init (no CPU, no memory) is ``init``: its pid record and labels."""
        proc(init, 1, 0, 0, start, 0, job)
        d = tmp_path / "run" / f"{job}-1"
        d.mkdir(parents=True, exist_ok=True)
        (d / "pid").write_text(f"{init} 1700000000.0 {start}\n")
        (d / "spec.json").write_text(json.dumps({"job_env": {"DLTS_JOB_ID": job, "DLTS_USER": "alice", "DLTS_VC": "vision"}}))

    clock = iter([100.0, 102.0, 104.0])
    collector = JobsCollector(str(tmp_path), clock=lambda: next(clock), clock_ticks=100, page_bytes=4096,
                              local_run_dir=str(tmp_path / "run"))
    unit("7", 20, 4000)
    unit("8", 21, 4001)
    proc(10, 20, 100, 50, 5000, 256)
    proc(11, 20, 10, 0, 5001, 128)
    proc(12, 21, 0, 0, 6000, 1)
    first, errors = collector.collect()
    assert errors == []
    assert first.usage["7"].cpu_cores is None and first.usage["7"].memory_bytes == 384 * 4096 and first.usage["7"].pids == 3
    proc(10, 20, 300, 150, 5000, 256)  # +300 ticks in 2 s: 1.5 cores
    proc(11, 20, 110, 0, 5001, 128)  # +100 ticks: 0.5 cores
    proc(12, 21, 500, 0, 6001, 1)  # a new process under the old pid: counts from the next collection
    second, _ = collector.collect()
    assert second.usage["7"].cpu_cores == 2.0
    assert second.usage["8"].cpu_cores == 0.0  # its init's; none of the new process's 500 ticks
    (tmp_path / "11" / "stat").unlink()  # vanished: CPU and memory from the others
    third, errors = collector.collect()
    assert errors == [] and third.usage["7"].cpu_cores == 0.0
    from dlts_agent.metrics import metrics_summary
    from dlts_agent.model import CollectorResult, CollectorStatus

    summary = metrics_summary(_snapshot({"jobs": CollectorResult("jobs", CollectorStatus.OK, 0.0, second)}))
    assert summary["jobs"] == [{"job_id": "7", "pids": 3, "cpu_cores": 2.0, "memory_bytes": 384 * 4096},
                               {"job_id": "8", "pids": 2, "cpu_cores": 0.0, "memory_bytes": 4096}]


def test_junk_gpu_samples_are_refused_and_junk_job_samples_skipped(client, world, sessions, settings):
    """The report's schema refuses GPU samples of the wrong type or range (400 naming the field,
    nothing stored: docs/security.md); the per-job samples it does not type are read defensively,
    junk in them is no value, never a refused report."""
    from dlts.models import Job, JobStatus

    with sessions() as s:
        token = node_service.issue_node_token(s, "testnode")
    r = client.post("/api/v1/jobs", json={"vc": "vision", "image": "debian:12", "command": "true", "gpus": 1},
                    headers=world.auth("alice"))
    job_id = r.get_json()["id"]
    with sessions() as s:
        s.add(JobAttempt(job_id=job_id, number=1, placements=[{"node": "testnode", "gpu_indices": [0]}], started_at=utcnow()))
        s.execute(sa.update(Job).where(Job.id == job_id).values(status=JobStatus.RUNNING, attempt=1))
        s.commit()
    auth = {"Authorization": f"Bearer {token}"}
    junk_gpus = [{"index": 1, "job_id": str(job_id), "utilization_ratio": "high", "memory_used_bytes": 2**62},
                 {"index": 0, "job_id": str(job_id), "utilization_ratio": 7.0}]
    r = client.post("/api/v1/nodes/testnode/report", headers=auth,
                    json={"schema_version": 1, "node": "testnode", "metrics": {"gpus": junk_gpus}})
    assert r.status_code == 400 and "gpus" in str(r.get_json()["error"]["details"]), r.get_json()
    gpus = [{"index": 0, "job_id": str(job_id), "utilization_ratio": 1.0},
            {"index": 2, "job_id": "424242", "utilization_ratio": 0.9}]  # not a running job: ignored
    for metrics in ({"gpus": gpus, "jobs": "nope"}, {"jobs": [1, {"job_id": str(job_id), "cpu_cores": -2}]},
                    {"jobs": [{"job_id": str(job_id), "cpu_cores": 1.0, "memory_bytes": 10}]}):
        body = {"schema_version": 1, "node": "testnode", "metrics": metrics}
        r = client.post("/api/v1/nodes/testnode/report", json=body, headers=auth)
        assert r.status_code == 200, r.get_json()
    with sessions() as s:
        (point,) = s.scalars(sa.select(UtilisationPoint))
        assert point.gpus == {"0": [1, 1.0, None]}
        assert point.samples == 3 and point.cpu_samples == 2 and point.cpu_cores == 1.0 and point.memory_bytes == 10


def test_readings_that_are_not_finite_non_negative_numbers_are_no_value():
    for junk in (float("inf"), float("nan"), -1, True, "1", None, 2**62, {}):
        assert accounting._number(junk) is None and accounting._number(junk, integer=True) is None
    assert accounting._number(0.5) == 0.5 and accounting._number(3.9, integer=True) == 3
