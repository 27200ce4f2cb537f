"""The portal's submit form sends one Idempotency-Key per rendered form (a double submit makes one
job); the job page's star, tags, archive, delete and Clone / resubmit; the job list's tag, starred
and archived filters. Bad input gets a message, never a 500."""

from __future__ import annotations

import html
import re

import sqlalchemy as sa

from dlts.models import Job, JobEvent, JobStatus, JobTag
from tests.api.helpers import make_job

JOB = {"vc": "vision", "type": "batch", "image": "busybox", "command": "echo hello", "gpus": "1"}
KEY_RE = re.compile(r'name="idempotency_key" value="([^"]+)"')


def text(response) -> str:
    return html.unescape(response.get_data(as_text=True))


def count_jobs(sessions) -> int:
    with sessions() as s:
        return s.scalar(sa.select(sa.func.count(Job.id)))


def form_key(c) -> str:
    match = KEY_RE.search(c.get("/submit").get_data(as_text=True))
    assert match, "the submit form has no idempotency key"
    return match.group(1)


def test_the_same_rendered_form_submitted_twice_makes_one_job(as_user, sessions):
    alice = as_user("alice")
    key = form_key(alice)
    assert key != form_key(alice)  # one per rendered form
    first = alice.post("/submit", {**JOB, "idempotency_key": key})
    assert first.status_code == 302
    job_id = int(first.headers["Location"].rsplit("/", 1)[1])
    again = alice.post("/submit", {**JOB, "idempotency_key": key})  # a double click, a reload, a retry
    assert again.status_code == 302 and again.headers["Location"].endswith(f"/jobs/{job_id}")
    assert "already submitted" in text(alice.get(f"/jobs/{job_id}"))
    assert count_jobs(sessions) == 1
    # the same form changed and sent again: refused with a message and a fresh key; the next press is a new job
    changed = alice.post("/submit", {**JOB, "command": "echo other", "idempotency_key": key})
    assert changed.status_code == 422 and f"already submitted as job {job_id}" in text(changed)
    fresh = KEY_RE.search(changed.get_data(as_text=True)).group(1)
    assert fresh != key
    assert alice.post("/submit", {**JOB, "command": "echo other", "idempotency_key": fresh}).status_code == 302
    assert count_jobs(sessions) == 2
    # a mangled key is answered on the form, never a 500
    bad = alice.post("/submit", {**JOB, "idempotency_key": "no spaces allowed"})
    assert bad.status_code == 400 and "Submit again" in text(bad)


def test_clone_opens_the_form_prefilled_and_submits_the_same_spec(as_user, sessions):
    alice = as_user("alice")
    response = alice.post("/submit", {**JOB, "name": "resnet", "env": "EPOCHS=3\nLR=0.1", "max_time_h": "1.5",
                                      "preemptible": "on", "ports": "6006", "tags": "ResNet, baseline",
                                      "idempotency_key": form_key(alice)})
    job_id = int(response.headers["Location"].rsplit("/", 1)[1])
    page = text(alice.get(f"/jobs/{job_id}"))
    assert f'/submit?from={job_id}' in page and "baseline" in page and "resnet" in page
    form = alice.get(f"/submit?from={job_id}")
    body = text(form)
    assert form.status_code == 200 and "echo hello" in body and "EPOCHS=3\nLR=0.1" in body
    assert 'value="resnet"' in body and 'value="baseline, resnet"' in body and 'value="1.5"' in body and 'value="6006"' in body
    values = {}
    for tag in re.findall(r"<input[^>]*>", form.get_data(as_text=True)):  # what a browser would send of the inputs
        name, value = re.search(r'name="(\w+)"', tag), re.search(r'value="([^"]*)"', tag)
        if name and value and 'type="checkbox"' not in tag:
            values[name.group(1)] = html.unescape(value.group(1))
    values.pop("csrf_token", None)
    values.pop("save_template", None)  # the other button of the form
    values.update({"command": "echo hello", "env": "EPOCHS=3\nLR=0.1", "preemptible": "on", "type": "batch", "vc": "vision"})
    clone = alice.post("/submit", values)
    assert clone.status_code == 302, re.findall(r"id=\"err-[^<]*<", text(clone)) or values
    clone_id = int(clone.headers["Location"].rsplit("/", 1)[1])
    with sessions() as s:
        a, b = s.get(Job, job_id), s.get(Job, clone_id)
        same = ("name", "image", "command", "gpus", "cpu", "memory_bytes", "preemptible", "max_time_s", "priority")
        assert {k: getattr(b, k) for k in same} == {k: getattr(a, k) for k in same}
        assert b.spec["env"] == a.spec["env"] and b.spec["ports"] == a.spec["ports"]
        assert sorted(s.scalars(sa.select(JobTag.tag).where(JobTag.job_id == clone_id))) == ["baseline", "resnet"]
    # another member sees the public page: no clone button, and the spec is not theirs to copy
    bob = as_user("bob")
    assert f"/submit?from={job_id}" not in text(bob.get(f"/jobs/{job_id}"))
    assert bob.get(f"/submit?from={job_id}").status_code == 403
    assert as_user("carol").get(f"/submit?from={job_id}").status_code == 404
    for bad in ("²", "0", "x", "99999999999999999999999"):
        assert alice.get(f"/submit?from={bad}").status_code == 400


def test_star_tags_archive_and_delete_from_the_job_page_and_the_list_filters(as_user, sessions, settings):
    alice = as_user("alice")
    ended = make_job(sessions, settings, "alice", status=JobStatus.FINISHED)
    waiting = make_job(sessions, settings, "alice")
    page = text(alice.get(f"/jobs/{ended}"))
    assert 'id="archive"' in page and 'id="delete"' in page
    assert 'id="archive"' not in text(alice.get(f"/jobs/{waiting}"))  # not ended
    assert alice.post(f"/jobs/{ended}/favourite", {"on": "1"}).status_code == 302
    assert alice.post(f"/jobs/{ended}/tags", {"tags": "exp1, Baseline"}).status_code == 302
    listing = text(alice.get("/jobs?favourite=true"))
    assert f'data-job="{ended}"' in listing and f'data-job="{waiting}"' not in listing
    listing = text(alice.get("/jobs?tag=baseline"))
    assert f'data-job="{ended}"' in listing and f'data-job="{waiting}"' not in listing
    # a bad tag on the form: a message on the job page, the tags unchanged
    alice.post(f"/jobs/{ended}/tags", {"tags": "ok, not/ok"})
    assert "not allowed" in text(alice.get(f"/jobs/{ended}"))
    with sessions() as s:
        assert sorted(s.scalars(sa.select(JobTag.tag).where(JobTag.job_id == ended))) == ["baseline", "exp1"]
    assert alice.post(f"/jobs/{ended}/archive").status_code == 302
    assert f'data-job="{ended}"' not in text(alice.get("/jobs"))
    assert f'data-job="{ended}"' in text(alice.get("/jobs?archived=true"))
    assert f'data-job="{ended}"' in text(alice.get("/jobs?archived=all"))
    assert f'data-job="{ended}"' not in text(alice.get("/jobs?archived=²"))  # unknown: the default
    with sessions() as s:
        kinds = list(s.scalars(sa.select(JobEvent.reason).where(JobEvent.job_id == ended, JobEvent.kind == "change")))
        assert kinds == ["tags", "archived"]
    assert "archived" in text(alice.get(f"/jobs/{ended}"))  # the job page's events show it
    # bob may star it (he can see it) but not archive, tag or delete it
    bob = as_user("bob")
    assert bob.post(f"/jobs/{ended}/favourite", {"on": "1"}).status_code == 302
    bob.post(f"/jobs/{ended}/delete")
    bob.post(f"/jobs/{waiting}/tags", {"tags": "bobs"})
    with sessions() as s:
        assert s.get(Job, ended) is not None
        assert list(s.scalars(sa.select(JobTag.tag).where(JobTag.job_id == waiting))) == []
    assert as_user("carol").post(f"/jobs/{ended}/favourite", {"on": "1"}).status_code == 404
    response = alice.post(f"/jobs/{ended}/delete")
    assert response.status_code == 302 and response.headers["Location"].endswith("/jobs")
    with sessions() as s:
        assert s.get(Job, ended) is None
    assert alice.post(f"/jobs/{waiting}/delete").status_code == 302  # refused: a message, the job stays
    with sessions() as s:
        assert s.get(Job, waiting) is not None
    assert alice.get("/jobs?tag=" + "x" * 500).status_code == 200
