"""Portal inputs that answered 500 (issue 16): unicode digits ("²".isdigit() is true, int("²") fails),
a ``next`` with a newline, node metrics of the wrong shape, and what pages showed that the caller
may not see. Every case is a page with a field error, a redirect or a 4xx."""

from __future__ import annotations

import html

import pytest
import sqlalchemy as sa

from dlts.models import Job, Node, RepairCycle
from dlts.services import admin

JOB = {"vc": "vision", "type": "batch", "image": "busybox", "command": "echo hello"}


def text(response) -> str:
    return html.unescape(response.get_data(as_text=True))


def submit(c, **fields) -> int:
    response = c.post("/submit", {**JOB, **fields})
    assert response.status_code == 302, text(response)[:2000]
    return int(response.headers["Location"].rsplit("/", 1)[1])


UNICODE_DIGITS = ["²", "١", "٣٤", "𝟙"]


@pytest.mark.parametrize("digit", UNICODE_DIGITS)
def test_unicode_digits_in_query_strings_are_no_500(as_user, digit):
    alice = as_user("alice")
    job_id = submit(alice)
    assert alice.get(f"/jobs/{job_id}/log?attempt={digit}").status_code in (200, 302)
    assert alice.get(f"/submit?template={digit}").status_code == 400
    for query in (f"offset={digit}", f"tail={digit}", f"attempt={digit}", "offset=" + "9" * 40, "tail=-1"):
        response = alice.get(f"/jobs/{job_id}/log.json?{query}")
        assert response.status_code == 400 and "whole numbers" in response.get_json()["error"], query


@pytest.mark.parametrize("digit", UNICODE_DIGITS)
def test_unicode_digits_in_forms_are_field_errors(as_user, sessions, digit):
    alice = as_user("alice")
    job_id = submit(alice)
    batch = alice.post("/jobs/batch", {"action": "kill", "ids": digit})
    assert batch.status_code == 302
    assert "Tick the jobs" in text(alice.get(batch.headers["Location"]))
    settings = alice.post(f"/jobs/{job_id}/settings", {"priority": digit}, follow_redirects=True)
    assert settings.status_code == 200 and "Priority is a whole number" in text(settings)
    endpoint = alice.post(f"/jobs/{job_id}/endpoints", {"kind": "port", "port": digit}, follow_redirects=True)
    assert endpoint.status_code == 200 and "port: enter the port" in text(endpoint)
    token = alice.post("/tokens", {"name": "t", "expires_days": digit})
    assert token.status_code == 400 and "whole number of days" in text(token)
    form = alice.post("/submit", {**JOB, "gpus": digit, "ports": f"8080 {digit}", "cpu": digit, "max_time_h": digit})
    assert form.status_code == 400
    for name in ("gpus", "ports", "cpu", "max_time_h"):
        assert f'id="err-{name}"' in text(form), name
    vcadmin = as_user("vcadmin")
    for name in ("max_interactive_gpus", "user_gpu_quota"):
        response = vcadmin.post("/vcs/vision/settings", {"policy": "RF", name: digit})
        assert response.status_code == 400 and f'id="err-{name}"' in text(response), name
    cluster_admin = as_user("admin")
    quotas = cluster_admin.post("/admin/quotas", {"vcs": "vision", "q:vision:demo-gpu": digit})
    assert quotas.status_code == 400 and "is not a whole number of GPUs" in text(quotas)
    assert cluster_admin.post("/repair/nodes/testnode/cancel", {"cycle": digit}).status_code == 404
    with sessions() as s:
        assert s.scalar(sa.select(Job.status).where(Job.id == job_id)).value == "queued"
        assert s.scalar(sa.select(sa.func.count(RepairCycle.id))) == 0


@pytest.mark.parametrize("target", ["/jobs\r\nSet-Cookie: x=1", "/jobs\nfoo", "/\\evil.example", "//evil.example/",
                                    "/jobs\x00", "https://evil.example/"])
def test_a_next_that_is_not_a_plain_local_path_is_ignored(as_user, anon, passwords, target):
    alice = as_user("alice")
    job_id = submit(alice)
    response = alice.post(f"/jobs/{job_id}/pause", {"next": target})
    assert response.status_code == 302 and response.headers["Location"].endswith(f"/jobs/{job_id}")
    batch = alice.post("/jobs/batch", {"action": "kill", "ids": "1x", "next": target})
    assert batch.status_code == 302 and batch.headers["Location"].endswith("/jobs")
    logged_in = alice.get("/login", query_string={"next": target})
    assert logged_in.status_code == 302 and logged_in.headers["Location"].endswith("/jobs")
    c = anon()
    c.get("/login")
    login = c.post("/login", {"username": "bob", "password": passwords["bob"], "next": target})
    assert login.status_code == 302 and login.headers["Location"].endswith("/jobs")
    # a plain local path still works
    assert alice.post(f"/jobs/{job_id}/resume", {"next": "/jobs?scope=vc"}).headers["Location"].endswith("/jobs?scope=vc")


WRONG_METRICS = [
    {"gpus": 5},
    {"gpus": "abc"},
    {"gpus": [1, "x", None]},
    {"gpus": [{"job_id": "²", "utilization_ratio": 0.5}]},
    {"gpus": [{"job_id": "1", "utilization_ratio": "high"}]},
    {"gpus": [{"job_id": {"a": 1}, "utilization_ratio": [1]}]},
    {"gpus": [{"job_id": 1, "utilization_ratio": 1e300}]},
    {"gpus": {"0": {"job_id": 1}}},
    [1, 2, 3],
    "a string",
]


@pytest.mark.parametrize("metrics", WRONG_METRICS, ids=[str(m)[:40] for m in WRONG_METRICS])
def test_one_nodes_metrics_of_the_wrong_shape_break_no_page(as_user, sessions, metrics):
    """Rows stored before reports were checked by schema may hold anything."""
    alice = as_user("alice")
    job_id = submit(alice, gpus="1")
    with sessions() as s:
        s.execute(sa.update(Job).where(Job.id == job_id).values(status="running", attempt=1))
        s.add(Node(name="oddnode", sku="demo-gpu", gpus=4, cpu=8, memory_bytes=2**30, ib_domain="x", labels={},
                   metrics=metrics))
        s.commit()
    for who in ("admin", "alice"):
        client = as_user(who)
        for page in ("/cluster", "/gpu-hours", "/gpu-hours?scope=vc"):
            response = client.get(page)
            assert response.status_code == 200, (who, page, text(response)[:300])
    assert as_user("admin").get("/repair/nodes/oddnode").status_code == 200


def test_the_cluster_page_lists_only_the_callers_vcs(as_user, sessions, portal_world):
    with sessions() as s:
        s.execute(sa.update(Node).values(gpus=4))
        s.commit()
    carol = text(as_user("carol").get("/cluster"))
    assert "nlp" in carol and "vision" not in carol
    alice = text(as_user("alice").get("/cluster"))
    assert "vision" in alice and ">nlp<" not in alice
    admin_page = text(as_user("admin").get("/cluster"))
    assert "vision" in admin_page and "nlp" in admin_page


def test_a_user_in_no_vc_sees_capacity_but_no_vc_names(app, sessions, passwords, password_hashes, anon, portal_world):
    from dlts.models import User

    with sessions() as s:
        admin.add_user(s, "loner")
        s.execute(sa.update(User).where(User.name == "loner").values(password_hash=password_hashes["bob"]))
        s.commit()
    c = anon()
    c.get("/login")
    assert c.post("/login", {"username": "loner", "password": passwords["bob"]}).status_code == 302
    page = text(c.get("/cluster"))
    assert "demo-gpu" in page and "vision" not in page and "nlp" not in page


def test_the_job_list_page_carries_no_env_and_no_command(as_user, sessions):
    alice = as_user("alice")
    secret = "s3cr3t-" + "z" * 40
    job_id = submit(alice, command=f"TOKEN={secret} python train.py", env=f"API_KEY={secret}")
    bob = as_user("bob")
    for client, page in ((alice, "/jobs"), (bob, "/jobs?scope=vc"), (bob, "/vcs/vision"), (alice, "/vcs/vision")):
        body = text(client.get(page))
        assert f"/jobs/{job_id}" in body and secret not in body and "TOKEN" not in body, page
    assert f"batch-{job_id}" in text(alice.get("/jobs"))


def test_the_list_query_loads_no_spec_or_command(app, sessions, portal_world, as_user):
    """The repository's page rows come without spec and command: touching them raises, so a page
    can never pull every job's environment into memory by accident."""
    from dlts.repositories import jobs as job_repo

    submit(as_user("alice"), env="A=" + "x" * 3000)
    with sessions() as s:
        [job] = job_repo.list_jobs(s, visible_vc_ids=None, limit=10)
        assert job.name and job.vc.name == "vision"
        with pytest.raises(sa.exc.InvalidRequestError):
            _ = job.spec
        with pytest.raises(sa.exc.InvalidRequestError):
            _ = job.command


def test_oversized_submissions_name_the_field_and_the_limit_on_the_form(as_user, sessions):
    alice = as_user("alice")
    response = alice.post("/submit", {**JOB, "command": "x" * 16385})
    assert response.status_code == 422 and 'id="err-command"' in text(response) and "16384" in text(response)
    response = alice.post("/submit", {**JOB, "env": "\n".join(f"V{i}=1" for i in range(101))})
    assert response.status_code == 422 and 'id="err-env"' in text(response) and "100" in text(response)
    response = alice.post("/submit", {**JOB, "env": "BIG=" + "v" * 4097})
    assert response.status_code == 422 and 'id="err-env"' in text(response) and "4096" in text(response)
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(Job.id))) == 0
