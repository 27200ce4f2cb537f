"""Hostile inputs: oversize bodies, deep JSON, huge strings, wrong types, SQL-ish strings, unicode,
negative and enormous numbers, unknown VCs and SKUs. Each gets a clear 4xx with the envelope, and
nothing is written."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from dlts.models import Job, JobEndpoint, JobEvent, JobStatus, SshKey, VirtualCluster

from .helpers import assert_envelope, job_count, make_job

JOB = {"vc": "vision", "image": "debian:12", "command": "true"}

CASES = [
    ("unknown field", JOB | {"gpus_please": 4}, 400, "gpus_please"),
    ("gpus as a string", JOB | {"gpus": "4"}, 400, "gpus"),
    ("gpus as a float", JOB | {"gpus": 1.5}, 400, "gpus"),
    ("gpus as true", JOB | {"gpus": True}, 400, "gpus"),
    ("negative gpus", JOB | {"gpus": -1}, 400, "gpus"),
    ("enormous gpus", JOB | {"gpus": 10**40}, 400, "gpus"),
    ("enormous priority", JOB | {"priority": 2**63}, 400, "priority"),
    ("NaN cpu", None, 400, "cpu"),
    ("infinite memory", JOB | {"memory": "1e999"}, 400, "memory"),
    ("negative memory", JOB | {"memory": -5}, 400, "memory"),
    ("huge command", JOB | {"command": "x" * 20000}, 422, "command"),
    ("huge vc name", JOB | {"vc": "v" * 5000}, 400, "vc"),
    ("env as a list", JOB | {"env": ["A=1"]}, 400, "env"),
    ("env name injection", JOB | {"env": {"A;rm -rf /": "1"}}, 400, "env"),
    ("ports out of range", JOB | {"ports": [0, 70000]}, 400, "ports"),
    ("a list body", [JOB], 400, None),
    ("a string body", "hello", 400, None),
    ("null vc", JOB | {"vc": None}, 400, "vc"),
    ("SQL in the VC name", JOB | {"vc": "vision' OR '1'='1"}, 404, "vc"),
    ("SQL comment in the VC name", JOB | {"vc": "vision; DROP TABLE jobs; --"}, 404, "vc"),
    ("unicode VC name", JOB | {"vc": "визия\u202e"}, 404, "vc"),
    ("unknown SKU", JOB | {"gpus": 1, "sku": "h100"}, 400, "sku"),
    ("more GPUs than the VC has", JOB | {"gpus": 4, "type": "distributed", "nodes": 3}, 422, "gpus"),
    ("NUL in a string", JOB | {"image": "debian\x00:12"}, None, None),
]


@pytest.mark.parametrize("name,body,status,field", CASES, ids=[c[0] for c in CASES])
def test_hostile_job_submissions_are_refused_and_nothing_is_written(client, world, sessions, name, body, status, field):
    before = job_count(sessions)
    if body is None:  # Python's json accepts NaN; a hostile client can send it
        data = json.dumps(JOB | {"cpu": float("nan")})
        response = client.post("/api/v1/jobs", data=data, content_type="application/json", headers=world.auth("alice"))
    else:
        response = client.post("/api/v1/jobs", json=body, headers=world.auth("alice"))
    if status is None:  # accepted or refused, but never a 5xx, and the stored value is exactly what was sent
        assert response.status_code in (201, 400), response.get_data(as_text=True)
        return
    error = assert_envelope(response, status)
    if field:
        assert field in json.dumps(error), error
    assert job_count(sessions) == before


def test_quota_refusal_states_the_numbers(client, world):
    error = assert_envelope(client.post("/api/v1/jobs", json=JOB | {"gpus": 4, "type": "distributed", "nodes": 2},
                                        headers=world.auth("alice")), 422, "quota_exceeds_vc")
    assert "VC vision has 4 demo-gpu GPUs; this job asks 8" in error["message"]
    # one demo-gpu node: a preemptible 2-node job could never run, so the refusal must not suggest it
    assert "marking it preemptible would not help: only 1 demo-gpu node(s) open to VC vision" in error["message"]
    assert error["details"]["preemptible_could_run"] is False


def test_deeply_nested_json_is_a_400_not_a_crash(client, world, sessions):
    deep = "[" * 20000 + "]" * 20000
    response = client.post("/api/v1/jobs", data=deep, content_type="application/json", headers=world.auth("alice"))
    assert_envelope(response, 400)
    nested = '{"vc": "vision", "image": "x", "command": "true", "env": ' + '{"a":' * 5000 + "1" + "}" * 5000 + "}"
    assert_envelope(client.post("/api/v1/jobs", data=nested, content_type="application/json", headers=world.auth("alice")), 400)
    assert job_count(sessions) == 0


def test_oversize_bodies_are_413_on_every_writing_endpoint(client, world, settings, sessions):
    big = {"public_key": "ssh-ed25519 " + "A" * settings.max_body_bytes}
    for method, path in (("POST", "/api/v1/me/ssh-keys"), ("POST", "/api/v1/vcs"), ("PATCH", "/api/v1/vcs/vision"),
                         ("POST", "/api/v1/jobs:batch"), ("POST", "/api/v1/nodes/testnode/report")):
        response = client.open(path, method=method, json=big, headers=world.auth("admin"))
        assert response.status_code in (413, 403), (path, response.status_code)  # the node report authenticates first
        if path != "/api/v1/nodes/testnode/report":
            assert_envelope(response, 413, "body_too_large")
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(SshKey.id))) == 0


def test_malformed_json_and_wrong_content_types(client, world):
    assert_envelope(client.post("/api/v1/jobs", data="{not json", content_type="application/json", headers=world.auth("alice")), 400)
    response = client.post("/api/v1/jobs", data="vc=vision", content_type="application/x-www-form-urlencoded", headers=world.auth("alice"))
    assert 400 <= response.status_code < 500


@pytest.mark.parametrize("query", ["limit=0", "limit=501", "limit=-1", "limit=abc", "status=exploded", "type=nuke",
                                   "cursor=%27%20OR%201%3D1", "cursor=" + "A" * 100, "vc=%00", "user=' OR 1=1 --"])
def test_hostile_list_queries(client, world, query):
    response = client.get(f"/api/v1/jobs?{query}", headers=world.auth("alice"))
    if query.startswith(("vc=", "user=")):
        assert response.status_code == 200 and response.get_json()["items"] == []
    else:
        assert_envelope(response, 400)


@pytest.mark.parametrize("body", [
    {"quota": {"demo-gpu": -1}}, {"quota": {"demo-gpu": 10**30}}, {"quota": {"x" * 100: 1}}, {"quota": ["demo-gpu"]},
    {"quota": {"demo-gpu": "4"}}, {"max_job_time_s": -5}, {"user_gpu_quota": 1.5}, {"notice": "n" * 3000},
    {"policy": "RF'; DROP TABLE vcs; --"}, {"name": "renamed"},
])
def test_hostile_vc_changes_are_refused_and_nothing_changes(client, world, sessions, body):
    with sessions() as s:
        before = s.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == "vision"))
        snapshot = (before.quota, before.policy, before.max_job_time_s, before.user_gpu_quota, before.notice)
    assert_envelope(client.patch("/api/v1/vcs/vision", json=body, headers=world.auth("admin")), 400)
    with sessions() as s:
        after = s.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == "vision"))
        assert (after.quota, after.policy, after.max_job_time_s, after.user_gpu_quota, after.notice) == snapshot
        assert s.scalar(sa.text("SELECT count(*) FROM vc_events")) == 0


def test_unknown_ids_and_names_are_404_with_the_envelope(client, world):
    auth = world.auth("admin")
    for path in ("/api/v1/jobs/99999999", "/api/v1/jobs/99999999/events", "/api/v1/vcs/nosuch", "/api/v1/nodes/nosuch",
                 "/api/v1/nothing-here"):
        assert_envelope(client.get(path, headers=auth), 404)
    assert_envelope(client.get("/api/v1/jobs/18446744073709551616", headers=auth), 404)
    assert_envelope(client.delete("/api/v1/me/ssh-keys/5", headers=auth), 404)


def test_nothing_is_written_by_refused_batches(client, world, sessions):
    assert_envelope(client.post("/api/v1/jobs:batch", json={"action": "kill", "ids": ["1; DROP TABLE jobs"]},
                                headers=world.auth("alice")), 400)
    assert_envelope(client.post("/api/v1/jobs:batch", json={"action": "kill", "ids": []}, headers=world.auth("alice")), 400)
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(JobEvent.id))) == 0
        assert s.scalar(sa.select(sa.func.count(Job.id))) == 0


@pytest.mark.parametrize("body,field", [
    ({"kind": "telnet"}, "kind"),
    ({"kind": None}, "kind"),
    ({}, "kind"),
    ({"kind": "port", "port": 80}, "port"),
    ({"kind": "port", "port": 70000}, "port"),
    ({"kind": "port", "port": "8080"}, "port"),
    ({"kind": "port", "port": 8080.5}, "port"),
    ({"kind": "port", "port": -1}, "port"),
    ({"kind": "port", "port": 2**70}, "port"),
    ({"kind": "port"}, "port"),
    ({"kind": "ssh", "port": 2222}, "port"),
    ({"kind": "jupyter", "port": 8888}, "port"),
    ({"kind": "port", "port": 8080, "name": "n" * 5000}, "name"),
    ({"kind": "port", "port": 8080, "name": "Web"}, "name"),
    ({"kind": "port", "port": 8080, "name": "web; rm -rf /"}, "name"),
    ({"kind": "port", "port": 8080, "name": "-web"}, "name"),
    ({"kind": "port", "port": 8080, "name": "wéb"}, "name"),
    ({"kind": "port", "port": 8080, "name": ""}, "name"),
    ({"kind": "vscode", "token": "mine"}, "token"),
    ({"kind": "port", "port": 8080, "host_port": 22}, "host_port"),
    (["ssh"], None),
])
def test_hostile_endpoint_requests_are_400_and_nothing_is_written(client, world, sessions, settings, body, field):
    job_id = make_job(sessions, settings, "alice", status=JobStatus.RUNNING)
    with sessions() as s:
        events_before = s.scalar(sa.select(sa.func.count(JobEvent.id)))
    error = assert_envelope(client.post(f"/api/v1/jobs/{job_id}/endpoints", json=body, headers=world.auth("alice")), 400)
    if field:
        assert field in json.dumps(error), error
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(JobEndpoint.id))) == 0
        assert s.scalar(sa.select(sa.func.count(JobEvent.id))) == events_before


def test_hostile_endpoint_ids_are_404(client, world, sessions, settings):
    job_id = make_job(sessions, settings, "alice", status=JobStatus.RUNNING)
    auth = world.auth("alice")
    for path in (f"/api/v1/jobs/{job_id}/endpoints/0", f"/api/v1/jobs/{job_id}/endpoints/18446744073709551616",
                 f"/api/v1/jobs/{job_id}/endpoints/-1", f"/api/v1/jobs/{job_id}/endpoints/1%20OR%201=1"):
        assert_envelope(client.delete(path, headers=auth), 404)


@pytest.mark.parametrize("body,field", [
    (JOB | {"ephemeral_storage_bytes": -1}, "ephemeral_storage_bytes"),
    (JOB | {"ephemeral_storage_bytes": "lots"}, "ephemeral_storage_bytes"),
    (JOB | {"ephemeral_storage_bytes": 2**70}, "ephemeral_storage_bytes"),
    (JOB | {"run_as_root": "yes please"}, "run_as_root"),
])
def test_hostile_identity_asks_are_400_and_nothing_is_written(client, world, sessions, body, field):
    error = assert_envelope(client.post("/api/v1/jobs", json=body, headers=world.auth("alice")), 400)
    assert field in json.dumps(error), error
    assert job_count(sessions) == 0


STORAGE_CASES = [
    ("a list", ["nfs"], None),
    ("unknown key", {"ceph": []}, "ceph"),
    ("nfs not a list", {"nfs": {"server": "x"}}, "nfs"),
    ("nfs entry without server", {"nfs": [{"path": "/export", "mount_path": "/data"}]}, "storage.nfs[0].server"),
    ("relative path", {"nfs": [{"server": "nfs1", "path": "export", "mount_path": "/data"}]}, "storage.nfs[0].path"),
    ("dot-dot in the path", {"host": [{"path": "/srv/../etc", "mount_path": "/data"}]}, "storage.host[0].path"),
    ("dot-dot in the mount", {"host": [{"path": "/srv/a", "mount_path": "/data/../etc"}]}, "storage.host[0].mount_path"),
    ("mount over /etc", {"host": [{"path": "/srv/a", "mount_path": "/etc/ssl"}]}, "storage.host[0].mount_path"),
    ("mount over the root", {"host": [{"path": "/srv/a", "mount_path": "/"}]}, "storage.host[0].mount_path"),
    ("mount over DLTS's own", {"host": [{"path": "/srv/a", "mount_path": "/dlts-runtime"}]}, "storage.host[0].mount_path"),
    ("NUL in a path", {"host": [{"path": "/srv/a\x00b", "mount_path": "/data"}]}, "storage.host[0].path"),
    ("huge path", {"host": [{"path": "/" + "a" * 5000, "mount_path": "/data"}]}, "storage.host[0].path"),
    ("name not a DNS label", {"host": [{"name": "Data_1", "path": "/srv/a", "mount_path": "/data"}]}, "storage.host[0].name"),
    ("name injection", {"host": [{"name": "a; rm -rf /", "path": "/srv/a", "mount_path": "/data"}]}, "storage.host[0].name"),
    ("two entries, one name", {"host": [{"name": "d", "path": "/srv/a", "mount_path": "/a"},
                                        {"name": "d", "path": "/srv/b", "mount_path": "/b"}]}, "storage.host[1].name"),
    ("two entries, one mount", {"host": [{"path": "/srv/a", "mount_path": "/a"}, {"path": "/srv/b", "mount_path": "/a"}]},
     "storage.host[1].mount_path"),
    ("host with a server", {"host": [{"server": "nfs1", "path": "/srv/a", "mount_path": "/a"}]}, "storage.host[0].server"),
    ("server not a host name", {"nfs": [{"server": "nfs1; reboot", "path": "/e", "mount_path": "/a"}]}, "storage.nfs[0].server"),
    ("read_only as a string", {"nfs": [{"server": "nfs1", "path": "/e", "mount_path": "/a", "read_only": "no"}]},
     "storage.nfs[0].read_only"),
    ("home of kind ceph", {"home": {"kind": "ceph", "path": "/export/home", "mount_path": "/home"}}, "storage.home.kind"),
    ("nfs home without server", {"home": {"kind": "nfs", "path": "/export/home", "mount_path": "/home"}}, "storage.home.server"),
    ("host home with a server", {"home": {"kind": "host", "server": "nfs1", "path": "/h", "mount_path": "/home"}},
     "storage.home.server"),
    ("a mount inside the homes", {"home": {"kind": "host", "path": "/h", "mount_path": "/home"},
                                  "host": [{"path": "/srv/a", "mount_path": "/home/shared"}]}, "storage.home.mount_path"),
    ("bad lustre settings", {"lustre": {"pool": "p" * 40, "osts": "0"}}, "storage.lustre"),
    ("lustre settings for another VC", {"lustre": {"name": "nlp", "pool": "p", "osts": "0"}}, "storage.lustre.name"),
    ("too many entries", {"host": [{"path": f"/srv/{i}", "mount_path": f"/m{i}"} for i in range(40)]}, "host"),
]


@pytest.mark.parametrize("name,body,field", STORAGE_CASES, ids=[c[0] for c in STORAGE_CASES])
def test_hostile_storage_documents_are_400_and_nothing_changes(client, world, sessions, name, body, field):
    error = assert_envelope(client.put("/api/v1/vcs/vision/storage", json=body, headers=world.auth("admin")), 400)
    if field:
        assert field in json.dumps(error), error
    with sessions() as s:
        assert s.scalar(sa.select(VirtualCluster.storage).where(VirtualCluster.name == "vision")) == {}
        assert s.scalar(sa.text("SELECT count(*) FROM vc_events")) == 0


@pytest.mark.parametrize("body,field", [
    ({"server": "ghcr.io", "username": "me"}, "password"),
    ({"server": "ghcr.io", "username": "me", "password": ""}, "password"),
    ({"server": "ghcr.io", "username": "me", "password": "x" * 5000}, "password"),
    ({"server": "ghcr.io", "username": "me", "password": "line1\nline2-s3cret"}, "password"),
    ({"server": "ghcr.io", "username": "me:you", "password": "p"}, "username"),
    ({"server": "ghcr.io evil.com", "username": "me", "password": "p"}, "server"),
    ({"server": "ghcr.io/../../etc", "username": "me", "password": "p"}, "server"),
    ({"server": "", "username": "me", "password": "p"}, "server"),
    ({"server": 5, "username": "me", "password": "p"}, "server"),
    ({"server": "ghcr.io", "username": "me", "password": "p", "scope": "vc"}, "scope"),
    (["ghcr.io"], None),
])
def test_hostile_registry_credentials_are_400_and_nothing_is_written(client, world, sessions, body, field):
    from dlts.models import RegistryCredential

    for path, who in (("/api/v1/me/registry-credentials", "alice"), ("/api/v1/vcs/vision/registry-credentials", "vcadmin")):
        response = client.post(path, json=body, headers=world.auth(who))
        error = assert_envelope(response, 400)
        if field:
            assert field in json.dumps(error), error
        if isinstance(body, dict) and len(body.get("password", "")) > 8:
            assert body["password"][-8:] not in response.get_data(as_text=True)  # a refused password is not echoed
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(RegistryCredential.id))) == 0


@pytest.mark.parametrize("body,field", [
    ({"uid": 0, "gid": 1000}, "uid"), ({"uid": 999, "gid": 1000}, "uid"), ({"uid": 2**31, "gid": 1000}, "uid"),
    ({"uid": "1000", "gid": 1000}, "uid"), ({"uid": 1000.5, "gid": 1000}, "uid"), ({"uid": -1, "gid": 1000}, "uid"),
    ({"uid": 1000}, "gid"), ({"uid": 1000, "gid": 0}, "gid"), ({"name": "root"}, "name"), ({}, "body"),
])
def test_hostile_identity_changes_are_400_and_nothing_changes(client, world, sessions, body, field):
    from dlts.models import User

    error = assert_envelope(client.patch("/api/v1/users/alice", json=body, headers=world.auth("admin")), 400)
    assert field in json.dumps(error), error
    with sessions() as s:
        assert s.execute(sa.select(User.uid, User.gid).where(User.name == "alice")).one() == (None, None)


DIGEST = "sha256:" + "0a1b2c3d" * 8


@pytest.mark.parametrize("image", [f"registry.example.com/team/serve@{DIGEST}", f"pytorch/pytorch:2.3@{DIGEST}",
                                   f"localhost:5000/serve:1@sha512:{'ef' * 64}"])
def test_an_image_given_by_digest_is_accepted_and_kept_exactly(client, world, image):
    response = client.post("/api/v1/jobs", json=JOB | {"image": image}, headers=world.auth("alice"))
    assert response.status_code == 201, response.get_data(as_text=True)
    job = client.get(f"/api/v1/jobs/{response.get_json()['id']}", headers=world.auth("alice")).get_json()
    assert job["image"] == image


@pytest.mark.parametrize("image,says", [
    ("serve@sha256:abc", "64 lowercase hex digits"),
    (f"serve@{DIGEST.upper()}", "64 lowercase hex digits"),
    (f"serve@md5:{'a' * 32}", "must be a digest"),
    ("team/Serve:1", "lowercase"),
    ("serve:1:2", "not an image reference"),
    ("serve /bin/sh", "no spaces"),
    ("registry.example.com//serve", "not an image reference"),
])
def test_a_malformed_image_is_400_naming_the_field_and_nothing_is_written(client, world, sessions, image, says):
    before = job_count(sessions)
    error = assert_envelope(client.post("/api/v1/jobs", json=JOB | {"image": image}, headers=world.auth("alice")), 400)
    assert "image" in json.dumps(error["details"]) and says in json.dumps(error), error
    assert job_count(sessions) == before
