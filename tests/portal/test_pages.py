"""Every portal page through the Flask test client, for each role: who sees what, what changes."""

from __future__ import annotations

import datetime as dt
import html
import re

import sqlalchemy as sa
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from dlts.models import (
    AllowedIp,
    EndpointStatus,
    Job,
    JobAttempt,
    JobEndpoint,
    JobStatus,
    Node,
    RateCounter,
    StorageUsage,
    User,
    VirtualCluster,
    utcnow,
)
from dlts.services import accounting

JOB = {"vc": "vision", "type": "batch", "image": "busybox", "command": "echo hello", "gpus": "1"}


def submit(c, **fields) -> int:
    response = c.post("/submit", {**JOB, **fields})
    assert response.status_code == 302, response.get_data(as_text=True)[:2000]
    return int(response.headers["Location"].rsplit("/", 1)[1])


def text(response) -> str:
    return html.unescape(response.get_data(as_text=True))


# -- login, session, CSRF, rate limit ---------------------------------------------------------------

def test_pages_need_a_login_and_come_back_after_it(anon, passwords):
    c = anon()
    response = c.get("/jobs?scope=vc")
    assert response.status_code == 302 and "/login?next=" in response.headers["Location"]
    c.get(response.headers["Location"])
    response = c.post("/login", {"username": "alice", "password": passwords["alice"], "next": "/jobs?scope=vc"})
    assert response.status_code == 302 and response.headers["Location"] == "/jobs?scope=vc"
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and cookie.startswith("dlts_session=")


def test_pages_send_a_strict_content_security_policy_and_no_inline_script(as_user):
    response = as_user("alice").get("/jobs")
    assert "script-src 'self';" in response.headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
    assert response.headers["X-Frame-Options"] == "DENY"
    body = text(response)
    assert re.findall(r"<script[^>]*>", body) == ['<script src="/portal-static/portal.js" defer>']
    assert not re.search(r"\son[a-z]+=", body)  # no inline event handlers


def test_login_refuses_a_wrong_password_and_offsite_next(anon, passwords):
    c = anon()
    response = c.login("alice", "not-the-password")
    assert response.status_code == 401 and "Wrong user name or password." in text(response)
    c.get("/login")
    response = c.post("/login", {"username": "alice", "password": passwords["alice"], "next": "//evil.example/x"})
    assert response.headers["Location"] == "/jobs"


def test_login_is_rate_limited_after_five_failures(app, anon, sessions):
    c = anon()
    for _ in range(5):
        assert c.login("bob", "guess-guess-guess").status_code == 401
    response = c.login("bob")  # even the right password waits now
    assert response.status_code == 429 and "Too many failed logins" in text(response)
    other = anon()
    assert other.login("alice").status_code == 302  # same address, another user: not blocked
    with sessions() as s:  # the window passes
        s.execute(sa.delete(RateCounter))
        s.commit()
    assert c.login("bob").status_code == 302


def test_posts_without_the_csrf_token_are_rejected_and_change_nothing(as_user, sessions):
    c = as_user("alice")
    response = c.post("/submit", JOB, csrf=False)
    assert response.status_code == 400 and "The form expired" in text(response)
    response = c.post("/submit", {**JOB, "csrf_token": "forged"}, csrf=False)
    assert response.status_code == 400
    response = c.post("/tokens", {"name": "x"}, csrf=False)
    assert response.status_code == 400
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(Job.id))) == 0


def test_logout_needs_a_post_and_ends_the_session(as_user):
    c = as_user("alice")
    assert c.get("/logout").status_code == 405
    assert c.post("/logout").status_code == 302
    assert c.get("/jobs").status_code == 302


def test_a_disabled_user_is_logged_out_at_the_next_request(as_user, sessions):
    c = as_user("alice")
    with sessions() as s:
        s.execute(sa.update(User).where(User.name == "alice").values(disabled_at=utcnow()))
        s.commit()
    assert c.get("/jobs").status_code == 302


# -- roles: the hidden quota page and navigation ----------------------------------------------------

def test_quota_page_is_404_and_unlinked_for_everybody_but_cluster_admins(as_user):
    for name in ("alice", "vcadmin", "carol"):
        c = as_user(name)
        response = c.get("/admin/quotas")
        assert response.status_code == 404 and "Not found" in text(response)
        assert "/admin/quotas" not in text(c.get("/jobs"))
        assert c.post("/admin/quotas", {"q:vision:demo-gpu": "1"}).status_code == 404
    admin = as_user("admin")
    assert admin.get("/admin/quotas").status_code == 200
    assert "/admin/quotas" in text(admin.get("/jobs"))


def test_cluster_admin_edits_quotas_and_is_told_when_they_exceed_capacity(as_user, sessions):
    admin = as_user("admin")
    page = text(admin.get("/admin/quotas"))
    assert 'name="q:vision:demo-gpu" inputmode="numeric" value="4"' in page
    response = admin.post("/admin/quotas", {"vcs": ["vision", "nlp"], "q:vision:demo-gpu": "3", "q:nlp:demo-gpu": "3"})
    assert response.status_code == 302
    page = text(admin.get("/admin/quotas"))
    assert "more than the 4 the cluster has" in page  # 3 + 3 > 4: warned, not refused
    response = admin.post("/admin/quotas", {"vcs": ["vision", "nlp"], "q:vision:demo-gpu": "9", "q:nlp:demo-gpu": "x"})
    assert response.status_code == 400
    body = text(response)
    assert "The cluster has 4 demo-gpu GPUs" in body and "'x' is not a whole number" in body
    with sessions() as s:
        quotas = dict(s.execute(sa.select(VirtualCluster.name, VirtualCluster.quota)).all())
    assert quotas == {"vision": {"demo-gpu": 3}, "nlp": {"demo-gpu": 3}}
    # a VC missing from the submitted grid (created meanwhile) keeps its quota; a SKU without nodes is shown
    with sessions() as s:
        s.execute(sa.update(VirtualCluster).where(VirtualCluster.name == "nlp").values(quota={"demo-gpu": 3, "v100": 8}))
        s.commit()
    assert admin.post("/admin/quotas", {"vcs": ["vision"], "q:vision:demo-gpu": "1"}).status_code == 302
    page = text(admin.get("/admin/quotas"))
    assert "v100 <span class=\"warn small\">(no nodes)</span>" in page and "empty the cells to drop it" in page
    with sessions() as s:
        quotas = dict(s.execute(sa.select(VirtualCluster.name, VirtualCluster.quota)).all())
    assert quotas == {"vision": {"demo-gpu": 1}, "nlp": {"demo-gpu": 3, "v100": 8}}
    assert admin.post("/admin/quotas", {"vcs": ["nlp"], "q:nlp:demo-gpu": "2", "q:nlp:v100": ""}).status_code == 302
    with sessions() as s:
        assert s.scalar(sa.select(VirtualCluster.quota).where(VirtualCluster.name == "nlp")) == {"demo-gpu": 2}


# -- submit, list, details ------------------------------------------------------------------------

def test_submit_form_shows_histogram_quota_and_defaults(as_user):
    page = text(as_user("alice").get("/submit"))
    histogram = page
    for free in range(4):
        histogram = histogram.replace(f"0 nodes with {free} free, ", "")
    assert "demo-gpu: 1 nodes with 4 free" in histogram
    assert "VC vision</strong>:" in page and "4</span> of 4 GPUs free" in page
    assert 'for="gpus"' in page and 'id="gpus"' in page


def test_submit_errors_are_shown_next_to_their_fields(as_user, sessions):
    c = as_user("alice")
    response = c.post("/submit", {**JOB, "image": "", "gpus": "two", "env": "NOEQUALS"})
    body = text(response)
    assert response.status_code == 400
    assert 'id="err-gpus"' in body and "Enter a whole number." in body
    assert 'id="err-env"' in body and "Line 1: write NAME=value" in body
    response = c.post("/submit", {**JOB, "gpus": "3", "vc": "vision", "env": "DLTS_X=1"})
    assert response.status_code == 400 and 'id="err-env"' in text(response) and "set by DLTS" in text(response)
    response = c.post("/submit", {**JOB, "gpus": "9"})
    assert response.status_code == 422 and 'id="err-gpus"' in text(response)
    assert "has 4 GPUs; this job asks 9" in text(response)
    response = c.post("/submit", {**JOB, "image": ""})
    assert response.status_code == 400 and 'id="err-image"' in text(response)
    response = c.post("/submit", {**JOB, "vc": "nlp"})  # alice is not in nlp
    assert response.status_code == 404 and 'id="err-vc"' in text(response)
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(Job.id))) == 0


def test_submitted_job_appears_in_lists_with_the_right_visibility(as_user):
    alice = as_user("alice")
    job_id = submit(alice, name="resnet", env="EPOCHS=3\nLR=0.1", max_time_h="1.5", preemptible="on")
    page = text(alice.get(f"/jobs/{job_id}"))
    assert "resnet" in page and "queued" in page and "EPOCHS=3" in page and "1h 30m" in page
    listing = text(alice.get("/jobs"))
    assert f'data-job="{job_id}"' in listing and "1970" not in listing
    bob = as_user("bob")
    assert f'data-job="{job_id}"' not in text(bob.get("/jobs"))  # "mine" only
    assert f'data-job="{job_id}"' in text(bob.get("/jobs?scope=vc"))
    public = text(bob.get(f"/jobs/{job_id}"))
    assert "You see the public fields" in public and "EPOCHS" not in public and "Download full log" not in public
    carol = as_user("carol")
    assert carol.get(f"/jobs/{job_id}").status_code == 404
    assert f'data-job="{job_id}"' not in text(carol.get("/jobs?scope=vc"))
    assert carol.get(f"/jobs/{job_id}/log.json").status_code == 404
    admin = as_user("admin")
    assert f'data-job="{job_id}"' in text(admin.get("/jobs?scope=all"))


def test_jobs_list_filters_pages_by_keyset_and_sorts(as_user, sessions):
    alice = as_user("alice")
    with sessions() as s:
        user_id = s.scalar(sa.select(User.id).where(User.name == "alice"))
        vc_id = s.scalar(sa.select(VirtualCluster.id).where(VirtualCluster.name == "vision"))
        now = utcnow()
        for i in range(120):
            s.add(Job(name=f"j{i}", user_id=user_id, vc_id=vc_id, type="batch" if i % 2 else "interactive",
                      status=JobStatus.FINISHED if i % 3 == 0 else JobStatus.QUEUED, image="x", command="true",
                      gpus=0, cpu=1, memory_bytes=2**30, spec={}, queue_time=now, submitted_at=now))
        s.commit()
    first = text(alice.get("/jobs"))
    ids = [int(x) for x in re.findall(r'data-job="(\d+)"', first)]
    assert len(ids) == 50 and ids == sorted(ids, reverse=True)
    cursor = re.search(r'cursor=([^&"]+)', first).group(1)
    second = [int(x) for x in re.findall(r'data-job="(\d+)"', text(alice.get(f"/jobs?cursor={cursor}")))]
    assert len(second) == 50 and max(second) < min(ids)
    oldest = [int(x) for x in re.findall(r'data-job="(\d+)"', text(alice.get("/jobs?order=oldest")))]
    with sessions() as s:
        first_id = s.scalar(sa.select(sa.func.min(Job.id)))
    assert oldest == sorted(oldest) and oldest[0] == first_id
    finished = text(alice.get("/jobs?status=finished&type=interactive"))
    rows = re.findall(r'data-job="\d+" data-status="(\w+)"', finished)
    assert rows and set(rows) == {"finished"} and len(rows) == 20  # i % 6 == 0 among 120
    assert "No jobs match these filters." in text(alice.get("/jobs?vc=nlp"))
    assert "Unknown status" in text(alice.get("/jobs?status=bogus"))
    assert "not one this API returned" in text(alice.get("/jobs?cursor=@@@"))


def test_column_choice_is_remembered_per_user(as_user):
    alice = as_user("alice")
    submit(alice)
    assert ">Time left</th>" in text(alice.get("/jobs"))
    assert alice.post("/jobs/columns", {"columns": ["priority", "sku"], "next": "/jobs"}).status_code == 302
    page = text(alice.get("/jobs"))
    assert ">Priority</th>" in page and ">SKU</th>" in page and ">Time left</th>" not in page
    assert ">Time left</th>" in text(as_user("bob").get("/jobs?scope=vc"))  # bob keeps the defaults


def test_batch_kill_confirms_then_reports_each_job(as_user, sessions):
    alice, bob = as_user("alice"), as_user("bob")
    mine = [submit(alice), submit(alice)]
    theirs = submit(bob)
    confirm = alice.post("/jobs/batch", {"action": "kill", "ids": [*map(str, mine), str(theirs), "999999"]})
    page = text(confirm)
    assert confirm.status_code == 200 and "Kill 4 jobs?" in page and "not found or not visible to you" in page
    with sessions() as s:  # nothing happened yet
        assert set(s.scalars(sa.select(Job.status))) == {JobStatus.QUEUED}
    result = alice.post("/jobs/batch", {"action": "kill", "confirm": "1", "ids": [*map(str, mine), str(theirs), "999999"]})
    page = text(result)
    assert page.count("badge st-ok\">done") == 2 and page.count("refused") == 2
    assert "Only the job's owner (bob)" in page and "does not exist" in page
    with sessions() as s:
        status = dict(s.execute(sa.select(Job.id, Job.status)).all())
    assert status == {mine[0]: JobStatus.KILLED, mine[1]: JobStatus.KILLED, theirs: JobStatus.QUEUED}


def test_batch_approve_needs_a_vc_admin(as_user, sessions):
    with sessions() as s:
        s.execute(sa.update(VirtualCluster).where(VirtualCluster.name == "vision").values(user_gpu_quota=1))
        s.commit()
    alice = as_user("alice")
    job_id = submit(alice, gpus="2", priority="42")
    assert "unapproved" in text(alice.get(f"/jobs/{job_id}"))
    assert "above the per-user quota" in text(alice.get("/jobs"))
    # another member sees the public fields only: the reason code, not its detail, nor the priority
    bob = as_user("bob")
    bob.post("/jobs/columns", {"columns": ["priority", "timeout"]})
    for page in (text(bob.get("/jobs?scope=vc")), text(bob.get(f"/jobs/{job_id}"))):
        assert "user_quota" in page and "above the per-user quota" not in page and ">42<" not in page
    assert 'id="action-approve"' not in text(alice.get(f"/jobs/{job_id}"))
    page = text(alice.post("/jobs/batch", {"action": "approve", "confirm": "1", "ids": [str(job_id)]}))
    assert "Only an admin of VC vision may approve" in page
    vcadmin = as_user("vcadmin")
    assert 'id="action-approve"' in text(vcadmin.get(f"/jobs/{job_id}"))
    page = text(vcadmin.post("/jobs/batch", {"action": "approve", "confirm": "1", "ids": [str(job_id)]}))
    assert "now queued" in page


def test_single_job_actions_and_wrong_state_messages(as_user):
    alice = as_user("alice")
    job_id = submit(alice)
    response = alice.post(f"/jobs/{job_id}/pause", {"next": f"/jobs/{job_id}"})
    assert response.status_code == 302
    page = text(alice.get(f"/jobs/{job_id}"))
    assert "pause requested; it is now paused" in page and 'id="action-resume"' in page
    alice.post(f"/jobs/{job_id}/kill")
    alice.post(f"/jobs/{job_id}/resume")
    assert "only paused jobs can be resumed" in text(alice.get(f"/jobs/{job_id}"))
    assert alice.post(f"/jobs/{job_id}/explode").status_code == 404
    assert as_user("carol").post(f"/jobs/{job_id}/kill").status_code == 404


def test_log_of_a_job_that_never_ran(as_user):
    alice = as_user("alice")
    job_id = submit(alice)
    data = alice.get(f"/jobs/{job_id}/log.json").get_json()
    assert data["data"] == "" and data["attempt"] == 0
    response = alice.get(f"/jobs/{job_id}/log")
    assert response.status_code == 302
    assert "has no log yet" in text(alice.get(f"/jobs/{job_id}"))
    assert "No log yet: the job has not started." in text(alice.get(f"/jobs/{job_id}"))


def test_job_details_show_attempts_placement_and_messages(as_user, sessions, settings):
    alice = as_user("alice")
    job_id = submit(alice, gpus="2")
    with sessions() as s:
        started = utcnow() - dt.timedelta(minutes=5)
        s.execute(sa.update(Job).where(Job.id == job_id).values(status=JobStatus.RUNNING, attempt=2, started_at=started,
                                                                 max_time_s=3600, retries_used=1))
        s.add(JobAttempt(job_id=job_id, number=1, placements=[{"node": "testnode", "gpu_indices": [0, 1]}],
                         started_at=started, ended_at=started, exit_code=137, end_reason="node_lost", spends_retry=False))
        s.add(JobAttempt(job_id=job_id, number=2, placements=[{"node": "testnode", "gpu_indices": [2, 3]}], started_at=started))
        from dlts.repositories.jobs import add_event

        add_event(s, job_id, "insight", message="GPU utilisation under 5% for 30 minutes")
        add_event(s, job_id, "repair", message="node testnode had an XID 79; the job was moved")
        s.commit()
    log_path = settings.effective_log_dir / str(job_id) / "attempt-2.log"
    log_path.parent.mkdir(parents=True)
    log_path.write_bytes(b"epoch 1\nepoch 2\n")
    page = text(alice.get(f"/jobs/{job_id}"))
    assert "testnode (GPUs 2, 3)" in page and "node_lost" in page and "137" in page
    assert "GPU utilisation under 5%" in page and "XID 79" in page
    assert re.search(r"Time left</dt><dd>5\dm", page)
    data = alice.get(f"/jobs/{job_id}/log.json?offset=8").get_json()
    assert data["data"] == "epoch 2\n" and data["size"] == 16 and data["complete"] is False
    assert data["attempt"] == 2 and data["latest_attempt"] == 2
    tail = alice.get(f"/jobs/{job_id}/log.json?tail=4").get_json()
    assert tail["offset"] == 12 and tail["data"] == "h 2\n"
    first = alice.get(f"/jobs/{job_id}/log.json?attempt=1").get_json()
    assert first["attempt"] == 1 and first["data"] == "" and first["latest_attempt"] == 2
    assert f"/jobs/{job_id}/log?attempt=1" in page
    download = alice.get(f"/jobs/{job_id}/log")
    assert download.data == b"epoch 1\nepoch 2\n" and "attachment" in download.headers["Content-Disposition"]
    # the time-left column in the list, and started shown, finished blank
    listing = text(alice.get("/jobs"))
    assert re.search(r"<td>5\dm \d\ds</td>", listing)


# -- endpoints -------------------------------------------------------------------------------------

def _run(sessions, job_id: int, attempt: int = 1) -> None:
    with sessions() as s:
        s.execute(sa.update(Job).where(Job.id == job_id).values(status=JobStatus.RUNNING, attempt=attempt, started_at=utcnow()))
        s.commit()


def _expose(sessions, job_id: int, name: str, host_port: int, attempt: int = 1) -> None:
    """What the job manager writes once the backend has exposed an endpoint."""
    with sessions() as s:
        s.execute(sa.update(JobEndpoint).where(JobEndpoint.job_id == job_id, JobEndpoint.name == name)
                  .values(status=EndpointStatus.READY, attempt=attempt, host="10.0.0.7", host_port=host_port))
        s.commit()


def test_jupyter_password_is_shown_once_on_the_job_page_never_in_a_url(as_user, sessions):
    alice = as_user("alice")
    job_id = submit(alice, gpus="0")
    page = text(alice.get(f"/jobs/{job_id}"))
    assert 'id="open-endpoint"' in page and "No endpoints: open SSH, Jupyter" in page
    response = alice.post(f"/jobs/{job_id}/endpoints", {"kind": "jupyter", "port": "", "name": ""})
    # the job page is this POST's answer: the password exists in this response only (not in a cookie)
    assert response.status_code == 200 and response.headers["Cache-Control"] == "no-store"
    page = text(response)
    token = re.search(r'id="endpoint-token" readonly value="([^"]+)"', page).group(1)
    assert "Endpoint jupyter (jupyter, port 8888) asked for; it is pending" in page
    with sessions() as s:
        row = s.scalars(sa.select(JobEndpoint).where(JobEndpoint.job_id == job_id)).one()
        import hashlib

        assert row.secret_hash == hashlib.sha256(token.encode()).hexdigest() and row.created_by == "alice"
    again = text(alice.get(f"/jobs/{job_id}"))
    assert token not in again and 'data-endpoint-status="pending"' in again
    # nor any other page
    alice.post(f"/jobs/{job_id}/endpoints", {"kind": "vscode"})
    other = submit(alice, gpus="0")
    assert 'id="endpoint-token"' not in text(alice.get(f"/jobs/{other}"))
    assert 'id="endpoint-token"' not in text(alice.get(f"/jobs/{job_id}"))


def test_job_page_lists_endpoints_with_ssh_command_link_and_close_button(as_user, sessions):
    alice = as_user("alice")
    job_id = submit(alice, gpus="0", ports="6006", ssh="on")
    page = text(alice.get(f"/jobs/{job_id}"))
    assert 'id="no-ssh-key"' in page  # alice has no key: the page says so before anybody tries
    alice.post("/ssh-keys", {"public_key": _public_key(), "name": ""})
    _run(sessions, job_id)
    _expose(sessions, job_id, "ssh", 31022)
    _expose(sessions, job_id, "port-6006", 30606)
    page = text(alice.get(f"/jobs/{job_id}"))
    assert 'id="no-ssh-key"' not in page
    assert 'value="ssh -p 31022 alice@10.0.0.7"' in page and 'href="http://10.0.0.7:30606/"' in page
    assert page.count('data-endpoint-status="ready"') == 2
    endpoint_id = re.search(r'/endpoints/(\d+)/close', page).group(1)
    assert alice.post(f"/jobs/{job_id}/endpoints/{endpoint_id}/close").status_code == 302
    page = text(alice.get(f"/jobs/{job_id}"))
    assert "is closing" in page and 'data-endpoint-status="closing"' in page
    # runs again (attempt 2): the old address is not offered
    _run(sessions, job_id, attempt=2)
    page = text(alice.get(f"/jobs/{job_id}"))
    assert "ssh -p 31022" not in page and "10.0.0.7:30606" not in page
    # a VC admin manages them too; a plain member sees the public page; a stranger gets 404
    assert "Open endpoint" in text(as_user("vcadmin").get(f"/jobs/{job_id}"))
    bob = as_user("bob")
    assert 'id="endpoints"' not in text(bob.get(f"/jobs/{job_id}"))
    refused = text(bob.post(f"/jobs/{job_id}/endpoints", {"kind": "port", "port": "7000"}, follow_redirects=True))
    assert "Only the job's owner (alice)" in refused
    assert bob.post(f"/jobs/{job_id}/endpoints/{endpoint_id}/close").status_code == 302
    assert as_user("carol").post(f"/jobs/{job_id}/endpoints", {"kind": "port", "port": "7000"}).status_code == 404
    assert as_user("carol").post(f"/jobs/{job_id}/endpoints/{endpoint_id}/close").status_code == 404
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(JobEndpoint.id)).where(JobEndpoint.job_id == job_id)) == 2
        assert s.get(JobEndpoint, int(endpoint_id)).status is EndpointStatus.CLOSING


def test_endpoint_form_errors_are_said_and_ended_jobs_offer_no_form(as_user, sessions):
    alice = as_user("alice")
    job_id = submit(alice, gpus="0")
    for fields, words in (({"kind": "port", "port": "80"}, "between 1024 and 65535"),
                          ({"kind": "port", "port": "http"}, "whole number between 1024 and 65535"),
                          ({"kind": "port", "port": ""}, "kind port needs port"),
                          ({"kind": "telnet"}, "kind:"),
                          ({"kind": "port", "port": "7000", "name": "Bad Name"}, "name:"),
                          ({"kind": "ssh"}, "You have no SSH key")):
        page = text(alice.post(f"/jobs/{job_id}/endpoints", fields, follow_redirects=True))
        assert words in page, (fields, page[:3000])
    assert alice.post(f"/jobs/{job_id}/endpoints", {"kind": "port", "port": "7000"},
                                                 csrf=False).status_code == 400
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(JobEndpoint.id))) == 0
    alice.post(f"/jobs/{job_id}/endpoints", {"kind": "port", "port": "7000"})
    alice.post(f"/jobs/{job_id}/kill")
    page = text(alice.get(f"/jobs/{job_id}"))
    assert 'id="open-endpoint"' not in page and 'data-endpoint-status="closed"' in page and "/close" not in page
    page = text(alice.post(f"/jobs/{job_id}/endpoints", {"kind": "port", "port": "7001"}, follow_redirects=True))
    assert "endpoints can only be opened on jobs that have not ended" in page


# -- templates -------------------------------------------------------------------------------------

def test_templates_are_saved_personal_or_shared_and_reload_the_form(as_user):
    alice = as_user("alice")
    response = alice.post("/submit", {**JOB, "command": "python train.py", "save_template": "1", "template_name": "train"})
    assert response.status_code == 200 and "Saved template train." in text(response)
    alice.post("/submit", {**JOB, "command": "python eval.py", "save_template": "1", "template_name": "eval", "share": "on"})
    page = text(alice.get("/submit"))
    train_id = re.search(r'template=(\d+)">train', page).group(1)
    eval_id = re.search(r'template=(\d+)">eval', page).group(1)
    loaded = text(alice.get(f"/submit?template={train_id}"))
    assert "python train.py</textarea>" in loaded
    bob = as_user("bob")
    bob_page = text(bob.get("/submit"))
    assert ">eval</a>" in bob_page and ">train</a>" not in bob_page
    assert bob.get(f"/submit?template={train_id}").status_code == 404
    assert bob.post(f"/templates/{eval_id}/delete").status_code == 302
    assert "Only the template" in text(bob.get("/submit"))
    assert as_user("carol").get(f"/submit?template={eval_id}").status_code == 404
    bad = alice.post("/submit", {**JOB, "save_template": "1", "template_name": "!!"})
    assert bad.status_code == 400 and 'id="err-template_name"' in text(bad)


# -- tokens, SSH keys, allowed IPs ------------------------------------------------------------------

def test_api_token_is_shown_once_works_and_can_be_revoked(as_user, client):
    alice = as_user("alice")
    page = text(alice.post("/tokens", {"name": "laptop", "expires_days": "30"}))
    token = re.search(r'id="new-token" readonly value="(dlts_[^"]+)"', page).group(1)
    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"}).get_json()["name"] == "alice"
    again = text(alice.get("/tokens"))
    assert token not in again and token[:12] in again
    token_id = re.search(r'/tokens/(\d+)/revoke', again).group(1)
    alice.post(f"/tokens/{token_id}/revoke")
    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    assert alice.post("/tokens", {"name": "", "expires_days": ""}).status_code == 400
    assert as_user("bob").post(f"/tokens/{token_id}/revoke").status_code == 404


def _public_key(comment: str = "alice@laptop") -> str:
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    raw = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return f"{raw} {comment}"


def test_ssh_keys_add_with_fingerprint_refuse_bad_ones_and_delete(as_user):
    alice = as_user("alice")
    assert "No SSH keys yet" in text(alice.get("/ssh-keys"))
    response = alice.post("/ssh-keys", {"public_key": _public_key(), "name": ""})
    page = text(alice.get("/ssh-keys"))
    assert response.status_code == 302 and "alice@laptop" in page and "SHA256:" in page
    bad = alice.post("/ssh-keys", {"public_key": "ssh-rsa AAAA-not-base64", "name": ""})
    assert bad.status_code == 400 and 'id="err-public_key"' in text(bad) and "could not be parsed" in text(bad)
    key_id = re.search(r"/ssh-keys/(\d+)/delete", page).group(1)
    assert as_user("bob").post(f"/ssh-keys/{key_id}/delete").status_code == 302
    assert "alice@laptop" in text(alice.get("/ssh-keys"))  # bob could not delete it
    alice.post(f"/ssh-keys/{key_id}/delete")
    assert "No SSH keys yet" in text(alice.get("/ssh-keys"))


def test_allowed_ips_add_mine_cidr_errors_expiry_marker_and_delete(as_user, sessions):
    alice = as_user("alice")
    assert alice.post("/allowed-ips", {"mine": "1"}).status_code == 302
    assert alice.post("/allowed-ips", {"ip": "198.51.100.0/24"}).status_code == 302
    bad = alice.post("/allowed-ips", {"ip": "198.51.100.7/24"})
    assert bad.status_code == 400 and "did you mean 198.51.100.0/24?" in text(bad)
    with sessions() as s:
        s.execute(sa.update(AllowedIp).where(AllowedIp.cidr == "198.51.100.0/24").values(expires_at=utcnow() + dt.timedelta(days=1)))
        s.commit()
    page = text(alice.get("/allowed-ips"))
    assert "127.0.0.1/32" in page and page.count("expires soon") == 1
    entry_id = re.search(r"/allowed-ips/(\d+)/delete", page).group(1)
    alice.post(f"/allowed-ips/{entry_id}/delete")
    assert "127.0.0.1/32" not in text(alice.get("/allowed-ips"))


# -- VC page, settings, notice ----------------------------------------------------------------------

def test_vc_admin_changes_settings_and_members_see_the_notice(as_user, sessions):
    alice = as_user("alice")
    assert alice.get("/vcs/vision/settings").status_code == 403
    assert alice.post("/vcs/vision/settings", {"policy": "FIFO"}).status_code == 403
    assert "/vcs/vision/settings" not in text(alice.get("/vcs/vision"))
    assert as_user("carol").get("/vcs/vision").status_code == 404
    vcadmin = as_user("vcadmin")
    page = text(vcadmin.get("/vcs/vision/settings"))
    assert "FIFO starts jobs strictly in submission order" in page
    response = vcadmin.post("/vcs/vision/settings", {"policy": "FIFO", "max_job_time_h": "24", "max_interactive_gpus": "2",
                                                     "user_gpu_quota": "", "notice": "Maintenance on Friday"})
    assert response.status_code == 302
    with sessions() as s:
        vc = s.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == "vision"))
        assert (vc.policy, vc.max_job_time_s, vc.max_interactive_gpus, vc.user_gpu_quota) == ("FIFO", 86400, 2, None)
    assert "Maintenance on Friday" in text(alice.get("/jobs"))
    assert "Maintenance on Friday" not in text(as_user("carol").get("/jobs"))
    assert 'id="vc-policy">FIFO' in text(alice.get("/vcs/vision"))
    bad = vcadmin.post("/vcs/vision/settings", {"policy": "FIFO", "max_job_time_h": "soon"})
    assert bad.status_code == 400 and 'id="err-max_job_time_s"' in text(bad)


def test_vc_admin_sets_fair_share_and_the_preemption_budget_on_the_settings_tab(as_user, sessions):
    vcadmin = as_user("vcadmin")
    page = text(vcadmin.get("/vcs/vision/settings"))
    assert 'id="vc-scheduling"' in page and "Default: on (the cluster default)." in page
    assert "Empty: the default, never (the cluster default)." in page
    overview = text(as_user("alice").get("/vcs/vision"))
    assert 'id="vc-fair-share">on (cluster default)' in overview
    assert 'id="vc-max-reclaim-delay">never (cluster default)' in overview
    assert 'id="vc-fair-share-max-wait">no bound (cluster default)' in overview
    assert "stops holding a job behind newer work of lighter users" in page
    assert "Empty: the default, no bound (the cluster default)." in page
    assert 'id="vc-limit-weight">0 (by submission time) (cluster default)' in overview
    assert "Shorter limits first" in page and "Empty: the default, 0 (the cluster default)." in page
    response = vcadmin.post("/vcs/vision/settings", {"policy": "RF", "fair_share": "off", "min_runtime_s": "600",
                                                     "max_reclaim_delay_s": "", "max_preemptions": "3",
                                                     "fair_share_max_wait_s": "7200", "limit_weight": "0.25"})
    assert response.status_code == 302
    with sessions() as s:
        vc = s.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == "vision"))
        assert (vc.fair_share, vc.min_runtime_s, vc.max_reclaim_delay_s, vc.max_preemptions) == (False, 600, None, 3)
        assert (vc.fair_share_max_wait_s, vc.limit_weight) == (7200, 0.25)
    overview = text(as_user("alice").get("/vcs/vision"))
    assert 'id="vc-limit-weight">0.25 (set on the VC)' in overview
    assert 'id="vc-fair-share">off (set on the VC)' in overview
    assert 'id="vc-fair-share-max-wait">2h 00m (set on the VC)' in overview
    assert 'id="vc-min-runtime">10m 00s (set on the VC)' in overview
    assert 'id="vc-max-preemptions">3 (set on the VC)' in overview
    page = text(vcadmin.get("/vcs/vision/settings"))
    assert '<option value="off" selected>' in page and 'name="max_preemptions" inputmode="numeric"' in page
    assert 'name="fair_share_max_wait_s" inputmode="numeric"' in page and 'value="7200"' in page
    assert 'name="limit_weight" inputmode="decimal"' in page and 'value="0.25"' in page
    # a post without these boxes (an older form) leaves them as they are
    assert vcadmin.post("/vcs/vision/settings", {"policy": "FIFO"}).status_code == 302
    with sessions() as s:
        vc = s.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == "vision"))
        assert (vc.policy, vc.fair_share, vc.min_runtime_s, vc.max_preemptions) == ("FIFO", False, 600, 3)
        assert (vc.fair_share_max_wait_s, vc.limit_weight) == (7200, 0.25)
    for field, value in (("min_runtime_s", "soon"), ("min_runtime_s", str(30 * 86400 + 1)), ("max_preemptions", "-1"),
                         ("max_reclaim_delay_s", "1.5"), ("fair_share", "maybe"), ("fair_share_max_wait_s", "-1"),
                         ("fair_share_max_wait_s", str(30 * 86400 + 1)), ("fair_share_max_wait_s", "an hour"),
                         ("limit_weight", "-0.5"), ("limit_weight", "11"), ("limit_weight", "a quarter"),
                         ("limit_weight", "inf")):
        bad = vcadmin.post("/vcs/vision/settings", {"policy": "RF", field: value})
        assert bad.status_code == 400 and f'id="err-{field}"' in text(bad), (field, value)
    cleared = vcadmin.post("/vcs/vision/settings", {"policy": "RF", "fair_share": "", "min_runtime_s": "",
                                                    "max_reclaim_delay_s": "", "max_preemptions": "",
                                                    "fair_share_max_wait_s": "", "limit_weight": ""})
    assert cleared.status_code == 302
    with sessions() as s:
        vc = s.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == "vision"))
        assert (vc.policy, vc.fair_share, vc.min_runtime_s, vc.max_reclaim_delay_s, vc.max_preemptions) == \
            ("RF", None, None, None, None)
        assert (vc.fair_share_max_wait_s, vc.limit_weight) == (None, None)


def test_vc_page_lists_running_and_waiting_jobs_and_per_user_use(as_user):
    alice = as_user("alice")
    job_id = submit(alice, name="waiting-one")
    page = text(alice.get("/vcs/vision"))
    assert "waiting-one" in page and f"/jobs/{job_id}" in page and "No running jobs." in page


# -- cluster, storage, GPU hours ------------------------------------------------------------------------

def _report_gpus(sessions, job_id: int, ratios: list[float]) -> None:
    """What the node agent's report leaves in nodes.metrics (docs/agent.md)."""
    gpus = [{"index": i, "utilization_ratio": r, "job_id": str(job_id)} for i, r in enumerate(ratios)]
    with sessions() as s:
        s.execute(sa.update(Node).where(Node.name == "testnode").values(metrics={"gpu_count": 4, "gpus": gpus}))
        s.commit()


def test_cluster_page_shows_capacity_nodes_vc_use_and_admin_only_utilisation(as_user, sessions):
    bob = as_user("bob")
    page = text(bob.get("/cluster"))
    assert "testnode" in page and "demo-gpu" in page and "in_service" in page and "admins only" in page
    assert "Cordon" not in page and bob.post("/nodes/testnode/cordon").status_code == 404
    job_id = submit(as_user("alice"), gpus="2")
    _report_gpus(sessions, job_id, [0.5, 0.7])
    admin = as_user("admin")
    assert "60%" in text(admin.get("/cluster"))
    admin.post("/nodes/testnode/cordon")
    page = text(admin.get("/cluster"))
    assert "Node testnode is now cordoned." in page and "Uncordon" in page


def test_gpu_hours_idle_now_from_agent_reports(as_user, sessions):
    alice = as_user("alice")
    assert "No node agent has reported GPU samples yet" in text(alice.get("/gpu-hours"))
    job_id = submit(alice, gpus="2")
    with sessions() as s:
        s.execute(sa.update(Job).where(Job.id == job_id).values(status=JobStatus.RUNNING, attempt=1, started_at=utcnow()))
        s.commit()
    _report_gpus(sessions, job_id, [0.01, 0.9])
    page = text(alice.get("/gpu-hours"))
    assert re.search(r"<td>alice</td><td>vision</td><td class=\"num\">2</td><td class=\"num warn\">1</td>", page)
    assert "No running job in your VCs" in text(as_user("carol").get("/gpu-hours"))


def test_storage_page_empty_state_then_snapshot_and_csv(as_user, sessions):
    bob = as_user("bob")
    assert "No storage scan has run yet" in text(bob.get("/storage"))
    scanned = dt.datetime(2026, 11, 29, 12, 0, 0)
    with sessions() as s:
        s.add(StorageUsage(scanned_at=scanned, mount="/lustre", vc="vision", user=None, bytes_used=5 * 2**40, files=100))
        s.add(StorageUsage(scanned_at=scanned, mount="/lustre", vc="vision", user="=alice", bytes_used=2**40, files=10))
        s.commit()
    admin = as_user("admin")
    page = text(admin.get("/storage"))
    assert "2026-11-29 12:00:00 UTC" in page and "5.0 TiB" in page
    assert 'id="storage-vcs"' in page and 'id="storage-users"' in page
    csv = admin.get("/storage?format=csv")
    assert csv.mimetype == "text/csv" and "'=alice" in csv.get_data(as_text=True)
    # bob, a member of vision: its total, not another user's row (the API's rule: docs/storage.md)
    page = text(bob.get("/storage"))
    assert "5.0 TiB" in page and "=alice" not in page
    assert "=alice" not in bob.get("/storage?format=csv").get_data(as_text=True)


def test_gpu_hours_from_the_accounting_rollup_of_the_month(as_user, sessions):
    alice = as_user("alice")
    assert "No GPU time was booked" in text(alice.get("/gpu-hours"))
    job_id = submit(alice, gpus="2")
    month = utcnow().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    with sessions() as s:
        s.add(JobAttempt(job_id=job_id, number=1, placements=[{"node": "testnode", "gpu_indices": [0, 1]}],
                         started_at=month - dt.timedelta(hours=1), ended_at=month + dt.timedelta(hours=3)))
        s.commit()
    bob = as_user("bob")
    running = submit(bob, gpus="1")
    with sessions() as s:
        s.add(JobAttempt(job_id=running, number=1, placements=[{"node": "testnode", "gpu_indices": [2]}],
                         started_at=utcnow() - dt.timedelta(minutes=30)))
        s.commit()
        assert "No GPU time was booked" in text(alice.get(f"/gpu-hours?month={month:%Y-%m}"))  # the rollup, not attempts
        accounting.book(s, utcnow())  # what the accounting manager's pass does
    page = text(alice.get(f"/gpu-hours?month={month:%Y-%m}"))
    assert "6.00" in page and "<td>bob</td>" not in page  # 2 GPUs x the 3 hours inside the month; mine only
    page = text(alice.get(f"/gpu-hours?month={month:%Y-%m}&scope=vc"))
    assert "6.00" in page and re.search(r"<td>bob</td><td>vision</td><td class=\"num\">0\.5\d</td>", page)
    assert "No GPU time was booked" in text(as_user("carol").get(f"/gpu-hours?month={month:%Y-%m}&scope=vc"))
    assert "<td>bob</td>" not in text(alice.get(f"/gpu-hours?month={month:%Y-%m}&scope=all"))  # not an admin: mine
    assert "<td>bob</td>" in text(as_user("admin").get(f"/gpu-hours?month={month:%Y-%m}&scope=all"))



def test_owner_and_vc_admin_change_priority_and_max_time_within_their_limits(as_user, sessions):
    alice = as_user("alice")
    job_id = submit(alice)
    assert "Change priority or max time" in text(alice.get(f"/jobs/{job_id}"))
    page = text(alice.post(f"/jobs/{job_id}/settings", {"priority": "500"}, follow_redirects=True))
    assert "Priority 500 is out of range: you may set 1-100" in page
    page = text(alice.post(f"/jobs/{job_id}/settings", {"priority": "50", "max_time_h": "2"}, follow_redirects=True))
    assert f"Job {job_id} updated" in page
    vcadmin = as_user("vcadmin")
    assert "(1–1000)" in text(vcadmin.get(f"/jobs/{job_id}"))
    vcadmin.post(f"/jobs/{job_id}/settings", {"priority": "900"})
    with sessions() as s:
        assert s.execute(sa.select(Job.priority, Job.max_time_s).where(Job.id == job_id)).one() == (900, 7200)
    bob = as_user("bob")
    assert "Change priority" not in text(bob.get(f"/jobs/{job_id}"))
    assert "Only the job's owner" in text(bob.post(f"/jobs/{job_id}/settings", {"priority": "1"}, follow_redirects=True))
    assert as_user("carol").post(f"/jobs/{job_id}/settings", {"priority": "1"}).status_code == 404


def test_hostile_form_values_get_field_errors_not_500s(as_user, sessions):
    alice = as_user("alice")
    for fields, field in (({"max_time_h": "inf"}, "max_time_h"), ({"max_time_h": "nan"}, "max_time_h"),
                          ({"max_time_h": "1e400"}, "max_time_h"), ({"cpu": "nan"}, "cpu"), ({"cpu": "-1"}, "cpu"),
                          ({"gpus": "99999999999999999999999"}, "gpus"), ({"memory": "lots"}, "memory"),
                          ({"ports": "80 x"}, "ports"), ({"priority": "0"}, "priority"), ({"type": "quantum"}, "type"),
                          ({"command": "x" * 20000}, "command"), ({"env": "A=" + "x" * 5000}, "env")):
        response = alice.post("/submit", {**JOB, **fields})
        assert response.status_code in (400, 422), (fields, response.status_code)
        assert f'id="err-{field}"' in text(response), fields
    for hours in ("inf", "-2", "abc"):
        response = as_user("vcadmin").post("/vcs/vision/settings", {"policy": "RF", "max_job_time_h": hours})
        assert response.status_code == 400 and 'id="err-max_job_time_s"' in text(response)
    job_id = submit(alice)
    page = text(alice.post(f"/jobs/{job_id}/settings", {"max_time_h": "inf"}, follow_redirects=True))
    assert "max time a number of hours" in page
    assert alice.get(f"/jobs/{job_id}/log.json?offset=abc").status_code == 400
    assert alice.get("/jobs/99999999999999999999999").status_code == 404
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(Job.id))) == 1
    import base64

    huge = base64.urlsafe_b64encode(b"j:99999999999999999999999").decode().rstrip("=")
    assert "start again from the first page" in text(alice.get(f"/jobs?cursor={huge}"))
    page = text(alice.post("/jobs/batch", {"action": "kill", "confirm": "1", "ids": ["99999999999999999999999", str(job_id)]}))
    assert page.count("badge st-ok") == 1


def test_database_outage_gives_a_503_page_and_the_portal_recovers(as_user, app, monkeypatch):
    alice = as_user("alice")
    from sqlalchemy.exc import OperationalError

    from dlts.services import portal_auth

    def down(*args, **kwargs):
        raise OperationalError("SELECT 1", {}, Exception("server has gone away"))

    monkeypatch.setattr(portal_auth, "principal_for", down)
    response = alice.get("/jobs")
    assert response.status_code == 503 and "Database unavailable" in text(response)
    monkeypatch.undo()
    assert alice.get("/jobs").status_code == 200


def test_vc_page_shows_the_vcs_storage_group_and_scratch_space(as_user, sessions):
    from dlts.services import admin

    with sessions() as s:
        vc = s.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == "vision"))
        vc.gid, vc.ephemeral_storage_bytes = 30000, 20 * 2**30
        admin.replace_vc_storage(s, vc, {
            "nfs": [{"name": "datasets", "server": "10.0.0.5", "path": "/export/datasets", "mount_path": "/datasets",
                     "read_only": True}],
            "host": [{"path": "/mnt/lustre/vision", "mount_path": "/lustre"}],
            "home": {"kind": "nfs", "server": "nfs1.lab", "path": "/export/home", "mount_path": "/home"},
            "lustre": {"pool": "vision", "osts": "0-1", "mdt": 0}}, "test")
    page = text(as_user("bob").get("/vcs/vision"))
    table = page.split('id="vc-storage"', 1)[1].split("</table>", 1)[0]
    assert "10.0.0.5:/export/datasets" in table and "/datasets" in table and "read-only" in table
    assert "/mnt/lustre/vision" in table and "/lustre" in table
    assert "nfs1.lab:/export/home/<user>" in table and "/home/<user>" in table
    assert 'id="vc-gid">30000<' in page and 'id="vc-ephemeral">20.0 GiB<' in page
    assert "Lustre: pool <code>vision</code>" in page


def test_vc_page_says_when_no_storage_is_configured(as_user):
    page = text(as_user("alice").get("/vcs/vision"))
    assert "No shared storage is configured for this VC" in page and 'id="vc-ephemeral">cluster default<' in page
