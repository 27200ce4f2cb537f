"""The portal's side of insight: the job page shows the insight manager's current findings and lets
a VC admin exempt the job; the VC settings page sets the idle-job policy (the VC service checks it)."""

from __future__ import annotations

import datetime as dt
import html

import pytest
import sqlalchemy as sa

from dlts.managers.insight import InsightManager
from dlts.models import Job, JobAttempt, JobStatus, VcEvent, VirtualCluster, utcnow
from dlts.services import accounting
from dlts.services import nodes as node_service

pytestmark = pytest.mark.db


def text(response) -> str:
    return html.unescape(response.get_data(as_text=True))


def test_the_job_page_shows_the_current_insight_and_a_vc_admin_exempts_the_job(as_user, client, world, sessions, settings):
    r = client.post("/api/v1/jobs", json={"vc": "vision", "image": "x", "command": "sleep 1", "gpus": 1},
                    headers=world.auth("alice"))
    job_id = r.get_json()["id"]
    now = utcnow()
    with sessions() as s:
        s.add(JobAttempt(job_id=job_id, number=1, started_at=now - dt.timedelta(hours=1),
                         placements=[{"node": "testnode", "gpu_indices": [0]}]))
        s.execute(sa.update(Job).where(Job.id == job_id).values(status=JobStatus.RUNNING, attempt=1,
                                                                 started_at=now - dt.timedelta(hours=1)))
        s.commit()
        token = node_service.issue_node_token(s, "testnode")
    metrics = {"gpus": [{"index": 0, "job_id": str(job_id), "utilization_ratio": 0.0}], "job_ids": [str(job_id)]}
    with sessions() as s:
        for k in range(45, 0, -1):
            accounting.record_utilisation(s, "testnode", metrics, now - dt.timedelta(minutes=k))
        s.commit()
    r = client.post("/api/v1/nodes/testnode/report", json={"schema_version": 1, "node": "testnode", "metrics": metrics},
                    headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200
    InsightManager(sessions, settings).run_once()
    page = text(as_user("alice").get(f"/jobs/{job_id}"))
    assert 'id="current-insights"' in page and "gpus idle" in page and "kill it so that others can use the GPUs" in page
    assert 'id="idle-exempt"' not in page  # the owner may not exempt her own job
    vcadmin = as_user("vcadmin")
    assert 'id="idle-exempt"' in text(vcadmin.get(f"/jobs/{job_id}"))
    page = text(vcadmin.post(f"/jobs/{job_id}/idle-exempt", {"exempt": "1"}, follow_redirects=True))
    assert "now exempt from" in page and "Put back under the idle-job policy" in page
    with sessions() as s:
        assert s.get(Job, job_id).spec["idle_exempt"] is True
    refused = text(as_user("alice").post(f"/jobs/{job_id}/idle-exempt", {"exempt": "0"}, follow_redirects=True))
    assert "Only an admin of VC vision may exempt" in refused
    assert as_user("carol").post(f"/jobs/{job_id}/idle-exempt", {"exempt": "0"}).status_code == 404


def test_the_vc_settings_page_sets_the_idle_policy(as_user, sessions):
    vcadmin = as_user("vcadmin")
    page = text(vcadmin.get("/vcs/vision/settings"))
    assert 'id="idle-policy"' in page and "warn, then pause" in page
    base = {"policy": "RF", "notice": ""}
    r = vcadmin.post("/vcs/vision/settings", {**base, "idle_action": "pause", "idle_warn_min": "45", "idle_action_min": "15",
                                              "idle_exempt_types": "interactive"})
    assert r.status_code == 302, text(r)[:2000]
    with sessions() as s:
        vc = s.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == "vision"))
        assert vc.idle_policy == {"idle_warn_min": 45.0, "idle_action_min": 15.0, "idle_action": "pause",
                                  "exempt_types": ["interactive"]}
    assert "warn after 45 min idle, then pause 15 min later (not interactive jobs)" in text(vcadmin.get("/vcs/vision"))
    bad = vcadmin.post("/vcs/vision/settings", {**base, "idle_action": "kill", "idle_warn_min": "-3"})
    assert bad.status_code == 400 and 'id="err-idle_policy.idle_warn_min"' in text(bad)
    bad = vcadmin.post("/vcs/vision/settings", {**base, "idle_action": "kill", "idle_warn_min": "soon"})
    assert bad.status_code == 400 and "is a number of minutes" in text(bad)
    assert vcadmin.post("/vcs/vision/settings", {**base, "idle_action": "off"}).status_code == 302
    with sessions() as s:
        assert s.scalar(sa.select(VirtualCluster.idle_policy).where(VirtualCluster.name == "vision")) is None
        changes = [(e.actor, e.field) for e in s.scalars(sa.select(VcEvent).where(VcEvent.field == "idle_policy"))]
        assert changes == [("vcadmin", "idle_policy"), ("vcadmin", "idle_policy")]
