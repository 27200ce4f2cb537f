"""The insight manager against the database (SQLite, and MariaDB with DLTS_TEST_DATABASE_URL): the
history comes from the accounting's own folding of node reports, the latest report through the API,
the VC's idle policy and the job's exemption through the API; what the manager writes is read back
through the API (insights, events) and the outbox."""

from __future__ import annotations

import datetime as dt
import time

import pytest
import sqlalchemy as sa
from insight_kit import gpu_metrics, history, node_token, report, running_job

from dlts.insight.settings import InsightSettings
from dlts.managers.insight import InsightManager
from dlts.managers.notify import NotifyManager
from dlts.models import Job, JobInsight, JobStatus, OutboxMessage, utcnow
from tests.smtp_server import with_notify

pytestmark = pytest.mark.db


def manager(sessions, settings, **insight) -> InsightManager:
    return InsightManager(sessions, settings.model_copy(update={"insight": InsightSettings(**insight)}))


def set_policy(client, world, user="vcadmin", **policy):
    r = client.patch("/api/v1/vcs/vision", json={"idle_policy": policy}, headers=world.auth(user))
    assert r.status_code == 200, r.get_json()
    return r.get_json()["idle_policy"]


def events(client, world, job_id, kind="insight"):
    items = client.get(f"/api/v1/jobs/{job_id}/events", query_string={"limit": 500}, headers=world.auth("alice")).get_json()["items"]
    return [(e["reason"], e["message"]) for e in reversed(items) if e["kind"] == kind]


def job(client, world, job_id, user="alice"):
    return client.get(f"/api/v1/jobs/{job_id}", headers=world.auth(user)).get_json()


def outbox(sessions, template=None):
    with sessions() as s:
        rows = s.scalars(sa.select(OutboxMessage).order_by(OutboxMessage.id))
        return [r for r in rows if template is None or r.template == template]


def until(step, condition, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while True:
        step()
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_an_idle_job_is_warned_then_paused_and_the_mails_go_out(client, world, sessions, settings, smtp_server):
    job_id = running_job(client, world, sessions)
    idle = gpu_metrics({0: (job_id, 0.0), 1: (job_id, 0.01)})
    token = node_token(sessions)
    history(sessions, 45, idle)
    report(client, token, idle)
    policy = set_policy(client, world, idle_warn_min=30, idle_action_min=0.03, idle_action="pause")
    assert policy == {"idle_warn_min": 30, "idle_action_min": 0.03, "idle_action": "pause", "exempt_types": []}
    insight = manager(sessions, settings)
    frozen = utcnow()
    insight.clock = lambda: frozen  # the first two passes at one instant: the action is 1.8 s away, however loaded
    first = insight.run_once()
    assert (first.raised, first.warned, first.acted) == (1, 1, 0)
    [found] = job(client, world, job_id)["insights"]
    assert found["code"] == "gpus_idle" and "idle" in found["message"] and found["since"]
    assert [r for r, _ in events(client, world, job_id)] == ["gpus_idle", "idle_warning"]
    assert "will be paused at" in events(client, world, job_id)[-1][1]
    [warning] = outbox(sessions, "idle_job_warning")
    assert warning.recipients == ["alice@example.org"]
    # a second pass at once changes nothing: no event, no mail, no action
    again = insight.run_once()
    assert (again.raised, again.warned, again.acted) == (0, 0, 0)
    assert len(events(client, world, job_id)) == 2 and len(outbox(sessions)) == 1
    insight.clock = utcnow
    # idle_action_min after the warning, still idle (the node keeps reporting): paused
    until(lambda: (report(client, token, idle), insight.run_once()),
          lambda: job(client, world, job_id)["status"] == "pausing")
    paused = job(client, world, job_id)
    assert paused["reason"] == "idle_gpus" and "idle-job policy" in paused["reason_detail"]
    transitions = events(client, world, job_id, kind="transition")
    assert transitions[-1][0] == "idle_gpus"
    assert [r for r, _ in events(client, world, job_id)][-1] == "idle_action"
    [stopped] = outbox(sessions, "idle_job_stopped")
    assert stopped.recipients == ["alice@example.org", "vcadmin@example.org"]
    # the real notifier mails both over SMTP
    notifier = NotifyManager(sessions, with_notify(settings, smtp_port=smtp_server.port))
    assert notifier.run_once().sent == 2
    subjects = sorted(m.message["Subject"] for m in smtp_server.received)
    assert any(f"Job {job_id}" in s and "idle GPUs" in s and "paused at" in s for s in subjects), subjects
    assert any(f"Job {job_id}" in s and "was paused" in s for s in subjects), subjects
    # the job is no longer running: its insight clears, with an event saying so
    insight.run_once()
    assert events(client, world, job_id)[-1] == ("gpus_idle_cleared", "Cleared: the job is no longer running.")
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(JobInsight.id))) == 0


def test_the_kill_action_kills_the_job(client, world, sessions, settings):
    job_id = running_job(client, world, sessions)
    idle = gpu_metrics({0: (job_id, 0.0), 1: (job_id, 0.0)})
    token = node_token(sessions)
    history(sessions, 40, idle)
    report(client, token, idle)
    set_policy(client, world, idle_warn_min=10, idle_action_min=0.02, idle_action="kill")
    insight = manager(sessions, settings)
    assert insight.run_once().warned == 1
    until(lambda: (report(client, token, idle), insight.run_once()),
          lambda: job(client, world, job_id)["status"] == "killing")
    assert job(client, world, job_id)["reason"] == "idle_gpus"


def test_a_job_without_reports_is_never_acted_on(client, world, sessions, settings):
    """No history, or a history without a fresh report of the node: no finding, no warning, no action."""
    silent = running_job(client, world, sessions, gpus=(0,))
    stale = running_job(client, world, sessions, gpus=(1,))
    history(sessions, 120, gpu_metrics({1: (stale, 0.0)}))  # two idle hours, but the node never reported since
    set_policy(client, world, idle_warn_min=1, idle_action_min=0.01, idle_action="kill")
    insight = manager(sessions, settings)
    for _ in range(3):
        run = insight.run_once()
        assert (run.jobs, run.stale, run.raised, run.warned, run.acted) == (2, 2, 0, 0, 0)
        time.sleep(0.5)
    for job_id in (silent, stale):
        assert job(client, world, job_id)["status"] == "running" and job(client, world, job_id)["insights"] == []
        assert events(client, world, job_id) == []
    assert outbox(sessions) == []


def test_a_report_older_than_two_intervals_stops_the_policy(client, world, sessions, settings):
    job_id = running_job(client, world, sessions)
    idle = gpu_metrics({0: (job_id, 0.0), 1: (job_id, 0.0)})
    token = node_token(sessions)
    history(sessions, 45, idle)
    set_policy(client, world, idle_warn_min=30, idle_action_min=0.01, idle_action="pause")
    insight = manager(sessions, settings, report_interval_s=1.0)
    report(client, token, idle)  # fresh for two intervals (2 s): a loaded CI machine took > 1 s here
    assert insight.run_once().warned == 1
    time.sleep(3)  # the node is silent for three report intervals: its data is stale
    run = insight.run_once()
    assert (run.stale, run.acted) == (1, 0) and job(client, world, job_id)["status"] == "running"
    report(client, token, idle)
    assert insight.run_once().acted == 1


def test_sparse_reports_keep_one_idle_run_as_the_history_read_moves_on(client, world, sessions, settings):
    """Agents reporting every 3 minutes: the first point the manager reads can be up to two minutes
    after the start of its read, pass after pass. That is the same idle run (the warning stands and
    the action follows), not a new one that starts the policy over."""
    job_id = running_job(client, world, sessions, gpus=(0,), started_min=240)
    idle = gpu_metrics({0: (job_id, 0.0)})
    now = utcnow()
    for k in range(180, 0, -3):
        history(sessions, 1, idle, end=now - dt.timedelta(minutes=k))
    report(client, node_token(sessions), idle)
    set_policy(client, world, idle_warn_min=30, idle_action_min=4, idle_action="pause")
    insight = manager(sessions, settings, report_interval_s=180.0)
    clock = [now]
    insight.clock = lambda: clock[0]
    assert insight.run_once().warned == 1
    for minutes in (1, 2, 3):  # a pass a minute: the read starts a minute later each time
        clock[0] = now + dt.timedelta(minutes=minutes)
        run = insight.run_once()
        assert (run.jobs, run.stale, run.warned, run.acted) == (1, 0, 0, 0), minutes
    clock[0] = now + dt.timedelta(minutes=4, seconds=1)
    assert insight.run_once().acted == 1
    assert job(client, world, job_id)["status"] == "pausing"
    assert len(outbox(sessions, "idle_job_warning")) == 1


def test_exempt_jobs_are_not_acted_on_but_still_get_their_insight(client, world, sessions, settings):
    flagged = running_job(client, world, sessions, gpus=(0,))
    interactive = running_job(client, world, sessions, gpus=(1,), type="interactive")
    idle = gpu_metrics({0: (flagged, 0.0), 1: (interactive, 0.0)})
    token = node_token(sessions)
    history(sessions, 45, idle)
    report(client, token, idle)
    set_policy(client, world, idle_warn_min=5, idle_action_min=0.01, idle_action="kill", exempt_types=["interactive"])
    r = client.patch(f"/api/v1/jobs/{flagged}", json={"idle_exempt": True}, headers=world.auth("vcadmin"))
    assert r.status_code == 200 and r.get_json()["idle_exempt"] is True
    insight = manager(sessions, settings)
    for _ in range(3):
        report(client, token, idle)
        run = insight.run_once()
        assert (run.warned, run.acted) == (0, 0)
        time.sleep(0.5)
    for job_id in (flagged, interactive):
        assert job(client, world, job_id)["status"] == "running"
        assert [i["code"] for i in job(client, world, job_id)["insights"]] == ["gpus_idle"]
    assert outbox(sessions) == []
    # the exemption lifted: the policy applies again
    assert client.patch(f"/api/v1/jobs/{flagged}", json={"idle_exempt": False}, headers=world.auth("admin")).status_code == 200
    report(client, token, idle)
    assert insight.run_once().warned == 1


def test_findings_are_deduplicated_change_and_clear_with_events(client, world, sessions, settings):
    job_id = running_job(client, world, sessions, gpus=(0, 1, 2, 3))
    partly = gpu_metrics({0: (job_id, 0.9), 1: (job_id, 0.0), 2: (job_id, 0.0), 3: (job_id, 0.0)})
    token = node_token(sessions)
    history(sessions, 40, partly)
    report(client, token, partly)
    insight = manager(sessions, settings)
    insight.run_once()
    insight.run_once()
    [(code, message)] = events(client, world, job_id)
    assert code == "gpus_partly_busy" and "Only 1 of this job's 4 GPUs" in message
    # two GPUs busy now (the history of the last 30 min says so): the finding changed, a new event
    more = gpu_metrics({0: (job_id, 0.9), 1: (job_id, 0.8), 2: (job_id, 0.0), 3: (job_id, 0.0)})
    history(sessions, 35, more)
    report(client, token, more)
    insight.run_once()
    assert [c for c, _ in events(client, world, job_id)] == ["gpus_partly_busy", "gpus_partly_busy"]
    assert "Only 2 of this job's 4 GPUs" in events(client, world, job_id)[-1][1]
    # all busy: cleared
    busy = gpu_metrics(dict.fromkeys(range(4), (job_id, 0.9)))
    history(sessions, 35, busy)
    report(client, token, busy)
    insight.run_once()
    assert events(client, world, job_id)[-1][0] == "gpus_partly_busy_cleared"
    assert job(client, world, job_id)["insights"] == []


def test_memory_and_cpu_findings_come_from_the_report_and_history(client, world, sessions, settings):
    job_id = running_job(client, world, sessions, gpus=(0,), cpu=2)
    metrics = gpu_metrics({0: (job_id, 0.3)}, memory_used=79 * 2**30, memory_total=80 * 2**30, cpu=1.95)
    token = node_token(sessions)
    history(sessions, 30, metrics)
    report(client, token, metrics)
    manager(sessions, settings).run_once()
    assert sorted(i["code"] for i in job(client, world, job_id)["insights"]) == ["cpu_bound", "gpu_memory_full"]


def test_a_preemptible_job_is_told_when_guaranteed_work_waits_for_its_gpus(client, world, sessions, settings):
    job_id = running_job(client, world, sessions, gpus=(0, 1, 2, 3), preemptible=True)
    busy = gpu_metrics(dict.fromkeys(range(4), (job_id, 0.9)))
    token = node_token(sessions)
    history(sessions, 5, busy)
    report(client, token, busy)
    insight = manager(sessions, settings)
    insight.run_once()
    assert job(client, world, job_id)["insights"] == []
    # bob's non-preemptible job within vision's quota (4 GPUs) waits: no GPU of the node is free
    r = client.post("/api/v1/jobs", json={"vc": "vision", "image": "x", "command": "true", "gpus": 2}, headers=world.auth("bob"))
    assert r.status_code == 201
    report(client, token, busy)
    insight.run_once()
    [risk] = job(client, world, job_id)["insights"]
    assert risk["code"] == "preemption_risk" and "2 non-preemptible demo-gpu GPUs are queued" in risk["message"]


def test_insights_and_the_exemption_follow_the_visibility_rules(client, world, sessions, settings):
    job_id = running_job(client, world, sessions, gpus=(0,))
    idle = gpu_metrics({0: (job_id, 0.0)})
    history(sessions, 45, idle)
    report(client, node_token(sessions), idle)
    manager(sessions, settings).run_once()
    assert [i["code"] for i in job(client, world, job_id, "vcadmin")["insights"]] == ["gpus_idle"]
    assert "insights" not in job(client, world, job_id, "bob")  # another member sees the public fields only
    for user, status in (("alice", 403), ("bob", 403), ("carol", 404), ("vcadmin", 200), ("admin", 200)):
        r = client.patch(f"/api/v1/jobs/{job_id}", json={"idle_exempt": True}, headers=world.auth(user))
        assert r.status_code == status, (user, r.get_json())
        if status != 200:
            assert r.get_json()["error"]["code"] in ("forbidden", "requires_vc_admin", "job_not_found")
    r = client.patch(f"/api/v1/jobs/{job_id}", json={"idle_exempt": "yes"}, headers=world.auth("vcadmin"))
    assert r.status_code == 400 and "idle_exempt" in str(r.get_json()["error"]["details"])
    changes = [e["message"] for e in client.get(f"/api/v1/jobs/{job_id}/events", headers=world.auth("alice")).get_json()["items"]
               if e["kind"] == "change"]
    assert changes == ["idle_exempt False -> True"]
    with sessions() as s:
        assert s.get(Job, job_id).spec["idle_exempt_by"] == "vcadmin"
        assert s.get(Job, job_id).status is JobStatus.RUNNING


def test_gpus_busy_again_after_the_warning_the_job_is_not_acted_on(client, world, sessions, settings):
    job_id = running_job(client, world, sessions)
    idle = gpu_metrics({0: (job_id, 0.0), 1: (job_id, 0.0)})
    busy = gpu_metrics({0: (job_id, 0.7), 1: (job_id, 0.6)})
    token = node_token(sessions)
    history(sessions, 45, idle)
    report(client, token, idle)
    set_policy(client, world, idle_warn_min=30, idle_action_min=0.01, idle_action="kill")
    insight = manager(sessions, settings)
    assert insight.run_once().warned == 1
    report(client, token, busy)  # this minute's mean is busy now, and so is the last report
    run = insight.run_once()
    assert (run.cleared, run.acted) == (1, 0)
    # the idle finding clears; the hour's low average remains as a finding of its own
    assert events(client, world, job_id)[-2:] == [
        ("gpus_idle_cleared", "Cleared: the job's GPUs are busy again."), (
            "low_utilisation", events(client, world, job_id)[-1][1])]
    for _ in range(3):  # idle again, but the new idle run is seconds old: no warning, no kill
        report(client, token, idle)
        run = insight.run_once()
        assert (run.warned, run.acted) == (0, 0)
        time.sleep(0.3)
    assert job(client, world, job_id)["status"] == "running"
    assert len(outbox(sessions, "idle_job_warning")) == 1 and outbox(sessions, "idle_job_stopped") == []
