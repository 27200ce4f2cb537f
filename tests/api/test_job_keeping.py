"""Jobs people keep and find: tags on submit and PUT /jobs/{id}/tags, favourites per user, archive
(hidden from default lists, still in usage), the owner's delete of an ended job (usage kept), the
filters tag=, favourite=true, archived=, the job's events, and GET /jobs/{id}/spec that submits it
again. Hostile bodies for each new route get a 4xx with the envelope and change nothing."""

from __future__ import annotations

import datetime as dt
import json

import pytest
import sqlalchemy as sa

from dlts.models import Job, JobAttempt, JobEvent, JobFavourite, JobStatus, JobTag, UsageJobDay, utcnow
from dlts.services import accounting

from .helpers import assert_envelope, job_count, make_job

JOB = {"vc": "vision", "image": "debian:12", "command": "python train.py"}


def ids(response) -> list[int]:
    assert response.status_code == 200, response.get_data(as_text=True)
    return [item["id"] for item in response.get_json()["items"]]


def test_tags_on_submit_are_cleaned_shown_and_filterable(client, world, sessions):
    tagged = client.post("/api/v1/jobs", json=JOB | {"tags": ["ResNet", "baseline", "resnet", " v1.2_a-b "]},
                         headers=world.auth("alice"))
    assert tagged.status_code == 201, tagged.get_data(as_text=True)
    job = tagged.get_json()
    assert job["tags"] == ["baseline", "resnet", "v1.2_a-b"]  # lowercased, each once, sorted
    other = client.post("/api/v1/jobs", json=JOB | {"tags": ["baseline"]}, headers=world.auth("alice")).get_json()
    plain = client.post("/api/v1/jobs", json=JOB, headers=world.auth("alice")).get_json()
    assert plain["tags"] == []
    listed = client.get("/api/v1/jobs", query_string={"tag": "resnet"}, headers=world.auth("alice"))
    assert ids(listed) == [job["id"]]
    assert listed.get_json()["items"][0]["tags"] == ["baseline", "resnet", "v1.2_a-b"]
    assert ids(client.get("/api/v1/jobs", query_string={"tag": "BASELINE"}, headers=world.auth("alice"))) == [other["id"], job["id"]]
    # another member of the VC sees the tags (public fields) and can filter by them
    assert ids(client.get("/api/v1/jobs", query_string={"tag": "resnet"}, headers=world.auth("bob"))) == [job["id"]]
    # outside the VC: nothing
    assert ids(client.get("/api/v1/jobs", query_string={"tag": "resnet"}, headers=world.auth("carol"))) == []


def test_put_tags_replaces_them_records_an_event_and_works_on_ended_jobs(client, world, sessions, settings):
    job_id = make_job(sessions, settings, "alice", status=JobStatus.FINISHED, tags=("old", "keep"))
    response = client.put(f"/api/v1/jobs/{job_id}/tags", json={"tags": ["keep", "New"]}, headers=world.auth("alice"))
    assert response.status_code == 200 and response.get_json() == {"job_id": job_id, "tags": ["keep", "new"]}
    assert client.get(f"/api/v1/jobs/{job_id}", headers=world.auth("alice")).get_json()["tags"] == ["keep", "new"]
    events = client.get(f"/api/v1/jobs/{job_id}/events", headers=world.auth("alice")).get_json()["items"]
    assert events[0]["kind"] == "change" and events[0]["reason"] == "tags" and events[0]["actor"] == "alice"
    assert "added new" in events[0]["message"] and "removed old" in events[0]["message"]
    # the same tags again: no change, no event
    client.put(f"/api/v1/jobs/{job_id}/tags", json={"tags": ["new", "keep"]}, headers=world.auth("vcadmin"))
    assert len(client.get(f"/api/v1/jobs/{job_id}/events", headers=world.auth("alice")).get_json()["items"]) == len(events)
    # a VC admin may retag; the empty list removes every tag
    assert client.put(f"/api/v1/jobs/{job_id}/tags", json={"tags": []}, headers=world.auth("vcadmin")).get_json()["tags"] == []
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(JobTag).where(JobTag.job_id == job_id)) == 0


def test_favourites_are_per_user_and_filterable(client, world, sessions, settings):
    mine = make_job(sessions, settings, "alice")
    bobs = make_job(sessions, settings, "bob")
    make_job(sessions, settings, "alice")
    assert client.put(f"/api/v1/jobs/{mine}/favourite", headers=world.auth("alice")).get_json() == {"job_id": mine, "favourite": True}
    assert client.put(f"/api/v1/jobs/{mine}/favourite", headers=world.auth("alice")).status_code == 200  # twice is once
    assert client.put(f"/api/v1/jobs/{bobs}/favourite", headers=world.auth("alice")).status_code == 200  # a job alice can see
    assert client.put(f"/api/v1/jobs/{bobs}/favourite", headers=world.auth("bob")).status_code == 200
    assert ids(client.get("/api/v1/jobs", query_string={"favourite": "true"}, headers=world.auth("alice"))) == [bobs, mine]
    assert ids(client.get("/api/v1/jobs", query_string={"favourite": "true"}, headers=world.auth("bob"))) == [bobs]
    detail = client.get(f"/api/v1/jobs/{mine}", headers=world.auth("alice")).get_json()
    assert detail["favourite"] is True
    assert client.get(f"/api/v1/jobs/{mine}", headers=world.auth("vcadmin")).get_json()["favourite"] is False
    assert client.delete(f"/api/v1/jobs/{mine}/favourite", headers=world.auth("alice")).get_json()["favourite"] is False
    assert ids(client.get("/api/v1/jobs", query_string={"favourite": "true"}, headers=world.auth("alice"))) == [bobs]
    assert client.delete(f"/api/v1/jobs/{mine}/favourite", headers=world.auth("alice")).status_code == 200  # twice is once
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(JobFavourite)) == 2


def _ran_for_an_hour(sessions, job_id: int) -> None:
    """The finished job's attempt held one GPU for an hour; the accounting pass books it."""
    now = utcnow()
    with sessions() as s:
        s.execute(sa.update(JobAttempt).where(JobAttempt.job_id == job_id).values(
            started_at=now - dt.timedelta(hours=2), ended_at=now - dt.timedelta(hours=1),
            placements=[{"node": "testnode", "gpu_indices": [0], "cpu": 1, "memory_bytes": 2**30}]))
        s.commit()
        accounting.book(s, now)


def _alice_gpu_hours(client, world) -> float:
    since = (utcnow() - dt.timedelta(days=1)).strftime("%Y-%m-%d")
    items = client.get("/api/v1/usage", query_string={"from": since, "group_by": "user", "user": "alice"},
                       headers=world.auth("alice")).get_json()["items"]
    return sum(item["gpu_hours"] for item in items)


def test_archive_hides_an_ended_job_from_default_lists_and_usage_still_counts_it(client, world, sessions, settings):
    ended = make_job(sessions, settings, "alice", status=JobStatus.FINISHED, gpus=1)
    _ran_for_an_hour(sessions, ended)
    waiting = make_job(sessions, settings, "alice")
    assert _alice_gpu_hours(client, world) == pytest.approx(1.0)
    response = client.post(f"/api/v1/jobs/{ended}/archive", headers=world.auth("alice"))
    assert response.status_code == 200 and response.get_json()["archived_at"]
    assert ids(client.get("/api/v1/jobs", headers=world.auth("alice"))) == [waiting]
    assert ids(client.get("/api/v1/jobs", query_string={"archived": "true"}, headers=world.auth("alice"))) == [ended]
    assert ids(client.get("/api/v1/jobs", query_string={"archived": "all"}, headers=world.auth("alice"))) == [waiting, ended]
    assert client.get(f"/api/v1/jobs/{ended}", headers=world.auth("alice")).status_code == 200  # still readable by id
    assert _alice_gpu_hours(client, world) == pytest.approx(1.0)
    events = client.get(f"/api/v1/jobs/{ended}/events", headers=world.auth("alice")).get_json()["items"]
    assert (events[0]["kind"], events[0]["reason"]) == ("change", "archived")
    assert client.post(f"/api/v1/jobs/{ended}/unarchive", headers=world.auth("alice")).get_json()["archived_at"] is None
    assert ids(client.get("/api/v1/jobs", headers=world.auth("alice"))) == [waiting, ended]
    assert_envelope(client.post(f"/api/v1/jobs/{waiting}/archive", headers=world.auth("alice")), 409, "job_not_ended")
    assert_envelope(client.post(f"/api/v1/jobs/{ended}/archive", headers=world.auth("vcadmin")), 403, "requires_owner")


def test_the_owner_deletes_an_ended_job_its_history_and_log_go_and_usage_stays(client, world, sessions, settings):
    ended = make_job(sessions, settings, "alice", status=JobStatus.FINISHED, gpus=1, tags=("x",), ssh=True)
    _ran_for_an_hour(sessions, ended)
    client.put(f"/api/v1/jobs/{ended}/favourite", headers=world.auth("bob"))
    log_dir = settings.effective_log_dir / str(ended)
    log_dir.mkdir(parents=True)
    (log_dir / "attempt-1.log").write_text("done\n")
    running = make_job(sessions, settings, "alice", status=JobStatus.RUNNING)
    assert_envelope(client.delete(f"/api/v1/jobs/{running}", headers=world.auth("alice")), 409, "job_not_ended")
    assert_envelope(client.delete(f"/api/v1/jobs/{ended}", headers=world.auth("admin")), 403, "requires_owner")
    assert client.delete(f"/api/v1/jobs/{ended}", headers=world.auth("alice")).status_code == 204
    assert_envelope(client.get(f"/api/v1/jobs/{ended}", headers=world.auth("alice")), 404, "job_not_found")
    assert_envelope(client.delete(f"/api/v1/jobs/{ended}", headers=world.auth("alice")), 404)
    with sessions() as s:
        for model in (JobEvent, JobAttempt, JobTag, JobFavourite):
            assert s.scalar(sa.select(sa.func.count()).select_from(model).where(model.job_id == ended)) == 0, model
        assert s.scalar(sa.select(sa.func.count()).select_from(UsageJobDay).where(UsageJobDay.job_id == ended)) >= 1
        assert s.get(Job, running) is not None
    assert not log_dir.exists()
    assert _alice_gpu_hours(client, world) == pytest.approx(1.0)


def test_the_spec_submits_the_same_job_again(client, world, sessions):
    body = JOB | {"name": "resnet-50", "env": {"LR": "0.1"}, "ports": [6006], "ssh": True, "priority": 60,
                  "max_time_s": 7200, "max_retries": 1, "preemptible": True, "memory": "3Gi", "cpu": 2.5,
                  "tags": ["exp1"]}
    first = client.post("/api/v1/jobs", json=body, headers=world.auth("alice")).get_json()
    spec = client.get(f"/api/v1/jobs/{first['id']}/spec", headers=world.auth("alice"))
    assert spec.status_code == 200
    again = client.post("/api/v1/jobs", json=spec.get_json(), headers=world.auth("alice"))
    assert again.status_code == 201, again.get_data(as_text=True)
    second = again.get_json()
    same = ("name", "vc", "image", "command", "type", "gpus", "cpu", "memory_bytes", "priority", "preemptible",
            "max_retries", "max_time_s", "env", "ports", "ssh", "tags", "run_as_root", "ib_domain")
    assert {k: second[k] for k in same} == {k: first[k] for k in same}
    assert second["id"] != first["id"]
    # a default name is not copied: the clone gets its own
    plain = client.post("/api/v1/jobs", json=JOB, headers=world.auth("alice")).get_json()
    assert "name" not in client.get(f"/api/v1/jobs/{plain['id']}/spec", headers=world.auth("alice")).get_json()
    # the detail carries every field of the spec, for clients that build the body themselves
    detail = client.get(f"/api/v1/jobs/{first['id']}", headers=world.auth("alice")).get_json()
    assert {"command", "env", "ports", "ssh", "tags", "ib_domain", "min_replicas", "max_replicas",
            "ephemeral_storage_bytes", "run_as_root", "max_time_s", "max_retries"} <= set(detail)


TAG_CASES = [
    ("not a list", {"tags": "a,b"}, "tags"),
    ("a number", {"tags": [1]}, "tags"),
    ("null", {"tags": None}, "tags"),
    ("an empty tag", {"tags": [""]}, "tags"),
    ("a space inside", {"tags": ["a b"]}, "tags"),
    ("too long", {"tags": ["a" * 33]}, "tags"),
    ("huge", {"tags": ["a" * 20000]}, "tags"),
    ("too many", {"tags": [f"t{i}" for i in range(17)]}, "tags"),
    ("a very long list", {"tags": ["a"] * 5000}, "tags"),
    ("unicode", {"tags": ["тег"]}, "tags"),
    ("a leading dot", {"tags": [".hidden"]}, "tags"),
    ("SQL", {"tags": ["x' OR '1'='1"]}, "tags"),
    ("NUL", {"tags": ["a\x00b"]}, "tags"),
    ("a nested list", {"tags": [["a"]]}, "tags"),
    ("an object", {"tags": {"a": 1}}, "tags"),
]


@pytest.mark.parametrize("name,extra,field", TAG_CASES, ids=[c[0] for c in TAG_CASES])
def test_hostile_tags_on_submit_are_refused_and_nothing_is_written(client, world, sessions, name, extra, field):
    before = job_count(sessions)
    error = assert_envelope(client.post("/api/v1/jobs", json=JOB | extra, headers=world.auth("alice")), 400)
    assert field in json.dumps(error)
    assert job_count(sessions) == before


@pytest.mark.parametrize("name,body,field", TAG_CASES + [
    ("no tags key", {}, "tags"), ("an unknown key", {"tags": [], "labels": ["x"]}, "labels"),
    ("a list body", [], None), ("a string body", "tags", None)], ids=[c[0] for c in TAG_CASES] + [
    "no tags key", "an unknown key", "a list body", "a string body"])
def test_hostile_tag_bodies_are_refused_and_the_tags_stay(client, world, sessions, settings, name, body, field):
    job_id = make_job(sessions, settings, "alice", tags=("keep",))
    error = assert_envelope(client.put(f"/api/v1/jobs/{job_id}/tags", json=body, headers=world.auth("alice")), 400)
    if field:
        assert field in json.dumps(error)
    with sessions() as s:
        assert list(s.scalars(sa.select(JobTag.tag).where(JobTag.job_id == job_id))) == ["keep"]


@pytest.mark.parametrize("query,field", [
    ({"archived": "maybe"}, "archived"), ({"favourite": "perhaps"}, "favourite"), ({"tag": "a" * 33}, "tag"),
    ({"tag": ""}, "tag"), ({"archived": "²"}, "archived")])
def test_bad_list_filters_are_400_naming_the_parameter(client, world, query, field):
    error = assert_envelope(client.get("/api/v1/jobs", query_string=query, headers=world.auth("alice")), 400)
    assert field in json.dumps(error)


@pytest.mark.parametrize("method,path", [("PUT", "favourite"), ("DELETE", "favourite"), ("POST", "archive"),
                                         ("POST", "unarchive"), ("GET", "spec")])
def test_routes_without_a_body_ignore_a_hostile_one(client, world, sessions, settings, method, path):
    job_id = make_job(sessions, settings, "alice", status=JobStatus.FINISHED)
    response = client.open(f"/api/v1/jobs/{job_id}/{path}", method=method, data=b"{\"a\": [[[[[[[[", headers=world.auth("alice"),
                           content_type="application/json")
    assert response.status_code < 500
