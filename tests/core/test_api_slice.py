"""The REST slice of the foundation: auth, the error envelope, body limit, roles, pagination."""

from __future__ import annotations

import json

import pytest


def post_job(client, world, user="alice", **body):
    payload = {"vc": "vision", "image": "debian:12", "command": "true"} | body
    return client.post("/api/v1/jobs", json=payload, headers=world.auth(user))


def assert_envelope(response, status, code=None):
    assert response.status_code == status, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert set(error) == {"code", "message", "details"} and error["message"]
    if code:
        assert error["code"] == code
    assert "Traceback" not in response.get_data(as_text=True)
    return error


def test_probes_answer_without_a_token(client):
    assert client.get("/healthz").get_json() == {"status": "ok"}
    assert client.get("/readyz").get_json() == {"status": "ready"}


@pytest.mark.parametrize("header", [None, "Bearer nope", "Basic abc", "Bearer "])
def test_no_or_a_bad_token_is_401_with_the_envelope(client, world, header):
    headers = {"Authorization": header} if header else {}
    for path in ("/api/v1/me", "/api/v1/jobs", "/api/v1/jobs/1", "/api/v1/jobs/1/log"):
        assert_envelope(client.get(path, headers=headers), 401, "unauthenticated")
    assert_envelope(client.post("/api/v1/jobs", json={}, headers=headers), 401)


def test_a_token_revoked_through_the_api_stops_working_at_once(client, world):
    assert client.get("/api/v1/me", headers=world.auth("alice")).status_code == 200  # now cached
    mine = client.get("/api/v1/me/tokens", headers=world.auth("alice")).get_json()["items"]
    assert client.delete(f"/api/v1/me/tokens/{mine[0]['id']}", headers=world.auth("alice")).status_code == 204
    assert_envelope(client.get("/api/v1/me", headers=world.auth("alice")), 401)


def test_a_change_made_by_another_worker_applies_within_auth_cache_s(settings, world, sessions):
    """Another API worker (here: a direct database write) revokes a token and grants a role: this
    worker, which cached the principal, sees both once auth_cache_s has passed, not before."""
    import time

    import sqlalchemy as sa

    from dlts.app import create_app
    from dlts.models import ApiToken, Role, RoleBinding, User, VirtualCluster, utcnow

    ttl = 2.0
    client = create_app(settings.model_copy(update={"auth_cache_s": ttl})).test_client()
    # Each entry is cached during its request: alice's no earlier than first_cached, carol's no later
    # than last_cached (a loaded machine may take seconds between the two).
    first_cached = time.monotonic()
    assert client.get("/api/v1/me", headers=world.auth("alice")).status_code == 200
    assert [v["name"] for v in client.get("/api/v1/me", headers=world.auth("carol")).get_json()["vcs"]] == ["nlp"]
    last_cached = time.monotonic()
    with sessions() as s:
        alice = s.scalar(sa.select(User.id).where(User.name == "alice"))
        carol = s.scalar(sa.select(User.id).where(User.name == "carol"))
        s.execute(sa.update(ApiToken).where(ApiToken.user_id == alice).values(revoked_at=utcnow()))
        vision = s.scalar(sa.select(VirtualCluster.id).where(VirtualCluster.name == "vision"))
        s.add(RoleBinding(role=Role.VC_MEMBER, user_id=carol, vc_id=vision))
        s.commit()
    if time.monotonic() - first_cached < ttl - 0.2:  # (a very slow machine may already be past the TTL)
        assert client.get("/api/v1/me", headers=world.auth("alice")).status_code == 200  # still cached
    time.sleep(max(0.0, last_cached + ttl + 0.1 - time.monotonic()))
    assert_envelope(client.get("/api/v1/me", headers=world.auth("alice")), 401)
    assert [v["name"] for v in client.get("/api/v1/me", headers=world.auth("carol")).get_json()["vcs"]] == ["nlp", "vision"]


def test_auth_cache_s_0_looks_the_token_up_on_every_request(settings, world, sessions):
    import sqlalchemy as sa

    from dlts.app import create_app
    from dlts.models import ApiToken, utcnow

    client = create_app(settings.model_copy(update={"auth_cache_s": 0})).test_client()
    assert client.get("/api/v1/me", headers=world.auth("alice")).status_code == 200
    with sessions() as s:
        s.execute(sa.update(ApiToken).values(revoked_at=utcnow()))
        s.commit()
    assert_envelope(client.get("/api/v1/me", headers=world.auth("alice")), 401)


def test_an_expired_token_is_refused_even_while_cached(client, world, sessions):
    import datetime as dt

    import sqlalchemy as sa

    from dlts.models import ApiToken, User, utcnow
    from dlts.services import admin

    with sessions() as s:
        token = admin.new_token(s, "bob", "short")
        bob = s.scalar(sa.select(User.id).where(User.name == "bob"))
        s.execute(sa.update(ApiToken).where(ApiToken.user_id == bob, ApiToken.name == "short")
                  .values(expires_at=utcnow() + dt.timedelta(seconds=1)))
        s.commit()
    headers = {"Authorization": f"Bearer {token}"}
    assert client.get("/api/v1/me", headers=headers).status_code == 200  # cached with its expiry
    import time
    time.sleep(1.2)
    assert_envelope(client.get("/api/v1/me", headers=headers), 401)


def test_me_lists_roles_and_vcs(client, world):
    me = client.get("/api/v1/me", headers=world.auth("vcadmin")).get_json()
    assert me["name"] == "vcadmin" and me["cluster_admin"] is False
    assert me["vcs"][0]["name"] == "vision" and me["vcs"][0]["roles"] == ["vc_admin", "vc_member"]
    assert client.get("/api/v1/me", headers=world.auth("admin")).get_json()["cluster_admin"] is True


def test_an_oversize_body_is_413_and_nothing_is_written(client, world, settings):
    big = "x" * (settings.max_body_bytes + 1)
    error = assert_envelope(post_job(client, world, command=big), 413, "body_too_large")
    assert error["details"]["limit_bytes"] == settings.max_body_bytes
    assert client.get("/api/v1/jobs", headers=world.auth("alice")).get_json()["items"] == []


@pytest.mark.parametrize("body,field", [
    ({"gpus": "two"}, "gpus"),
    ({"gpus": -1}, "gpus"),
    ({"gpus": 10**12}, "gpus"),
    ({"priority": 0}, "priority"),
    ({"type": "mining"}, "type"),
    ({"unknown_field": 1}, "unknown_field"),
    ({"memory": "lots"}, "memory"),
    ({"env": {"1BAD": "x"}}, "env"),
    ({"env": {"DLTS_JOB_ID": "x"}}, "env"),
    ({"name": "n" * 500}, "name"),
    ({"command": ""}, "command"),
])
def test_bad_fields_are_400_naming_the_field_and_nothing_is_written(client, world, body, field):
    error = assert_envelope(post_job(client, world, **body), 400, "invalid_input")
    assert field in error["details"]["fields"]
    assert client.get("/api/v1/jobs", headers=world.auth("alice")).get_json()["items"] == []


def test_a_body_that_is_not_json_is_400(client, world):
    r = client.post("/api/v1/jobs", data="{not json", headers=world.auth("alice") | {"Content-Type": "application/json"})
    assert_envelope(r, 400)


def test_quota_refusals_state_the_numbers(client, world):
    error = assert_envelope(post_job(client, world, gpus=4, sku="demo-gpu", user="carol", vc="nlp"), 422, "quota_exceeds_vc")
    assert "VC nlp has 2 demo-gpu GPUs; this job asks 4" in error["message"]
    assert "or mark it preemptible" in error["message"] and error["details"]["preemptible_could_run"] is True
    # preemptible jobs may go beyond the VC's quota
    assert post_job(client, world, gpus=4, user="carol", vc="nlp", preemptible=True).status_code == 201
    error = assert_envelope(post_job(client, world, gpus=8), 422, "gpus_exceed_node")
    assert "has 4 GPUs" in error["message"]
    assert_envelope(post_job(client, world, sku="h100", gpus=1), 400, "unknown_sku")


def test_members_may_set_priority_up_to_100_and_vc_admins_up_to_1000(client, world):
    error = assert_envelope(post_job(client, world, priority=500), 422, "priority_out_of_range")
    assert error["details"]["max"] == 100
    assert post_job(client, world, user="vcadmin", priority=500).status_code == 201


def test_a_user_outside_the_vc_gets_404_for_its_jobs_and_cannot_submit_into_it(client, world):
    job = post_job(client, world).get_json()
    for path in (f"/api/v1/jobs/{job['id']}", f"/api/v1/jobs/{job['id']}/log"):
        assert_envelope(client.get(path, headers=world.auth("carol")), 404)
    assert_envelope(client.post(f"/api/v1/jobs/{job['id']}/kill", headers=world.auth("carol")), 404)
    assert_envelope(post_job(client, world, user="carol"), 404, "vc_not_found")
    assert client.get("/api/v1/jobs", headers=world.auth("carol")).get_json()["items"] == []


def test_another_member_sees_public_fields_only_and_cannot_kill(client, world):
    job = post_job(client, world, env={"SECRET": "s3cr3t"}).get_json()
    seen = client.get(f"/api/v1/jobs/{job['id']}", headers=world.auth("bob")).get_json()
    assert seen["visibility"] == "public" and seen["user"] == "alice"
    assert "env" not in seen and "command" not in seen and "s3cr3t" not in json.dumps(seen)
    assert_envelope(client.post(f"/api/v1/jobs/{job['id']}/kill", headers=world.auth("bob")), 403)
    assert_envelope(client.get(f"/api/v1/jobs/{job['id']}/log", headers=world.auth("bob")), 403)
    # the VC admin and the cluster admin see everything and may kill
    assert client.get(f"/api/v1/jobs/{job['id']}", headers=world.auth("vcadmin")).get_json()["env"] == {"SECRET": "s3cr3t"}
    assert client.post(f"/api/v1/jobs/{job['id']}/kill", headers=world.auth("admin")).status_code == 202


def test_a_queued_job_is_killed_at_once(client, world):
    job = post_job(client, world).get_json()
    killed = client.post(f"/api/v1/jobs/{job['id']}/kill", headers=world.auth("alice")).get_json()
    assert killed["status"] == "killed" and killed["finished_at"] and killed["started_at"] is None


def test_user_quota_overruns_wait_for_a_vc_admin(client, world, sessions):
    from dlts.services import admin

    with sessions() as s:
        vc = admin.get_vc(s, "vision")
        vc.user_gpu_quota = 2
        s.commit()
    ok = post_job(client, world, gpus=2).get_json()
    over = post_job(client, world, gpus=2).get_json()
    assert ok["status"] == "queued"
    assert over["status"] == "unapproved" and over["reason"] == "user_quota"
    assert "above the per-user quota of 2" in over["reason_detail"]
    assert_envelope(client.post(f"/api/v1/jobs/{over['id']}/approve", headers=world.auth("alice")), 403, "approval_requires_vc_admin")
    approved = client.post(f"/api/v1/jobs/{over['id']}/approve", headers=world.auth("vcadmin"))
    assert approved.status_code == 202 and approved.get_json()["status"] == "queued"
    assert_envelope(client.post(f"/api/v1/jobs/{over['id']}/approve", headers=world.auth("vcadmin")), 409)


def test_pause_and_resume_of_a_queued_job(client, world):
    job = post_job(client, world).get_json()
    assert client.post(f"/api/v1/jobs/{job['id']}/pause", headers=world.auth("alice")).get_json()["status"] == "paused"
    assert client.post(f"/api/v1/jobs/{job['id']}/resume", headers=world.auth("alice")).get_json()["status"] == "queued"
    assert_envelope(client.post(f"/api/v1/jobs/{job['id']}/resume", headers=world.auth("alice")), 409)


def test_keyset_pagination_walks_every_job_once_in_a_stable_order(client, world):
    ids = [post_job(client, world, name=f"j{i}").get_json()["id"] for i in range(7)]
    seen, cursor = [], None
    while True:
        r = client.get("/api/v1/jobs", query_string={"limit": 3, **({"cursor": cursor} if cursor else {})},
                       headers=world.auth("alice")).get_json()
        seen += [j["id"] for j in r["items"]]
        cursor = r["next_cursor"]
        if not cursor:
            break
    assert seen == sorted(ids, reverse=True)
    assert_envelope(client.get("/api/v1/jobs?cursor=garbage!!", headers=world.auth("alice")), 400, "invalid_cursor")
    assert_envelope(client.get("/api/v1/jobs?limit=501", headers=world.auth("alice")), 400)
    filtered = client.get("/api/v1/jobs?status=queued,running&user=alice&vc=vision", headers=world.auth("alice")).get_json()
    assert len(filtered["items"]) == 7
    assert_envelope(client.get("/api/v1/jobs?status=bogus", headers=world.auth("alice")), 400)


def test_the_openapi_document_describes_the_job_routes(client):
    doc = client.get("/api/v1/openapi.json").get_json()
    assert doc["openapi"].startswith("3.")
    assert {"/api/v1/jobs", "/api/v1/jobs/{job_id}", "/api/v1/jobs/{job_id}/kill", "/api/v1/me"} <= set(doc["paths"])
    body = doc["components"]["schemas"]["JobSubmit"]
    assert {"vc", "image", "command"} <= set(body["required"])


def test_the_database_gone_is_503_and_the_api_recovers(app, client, world, monkeypatch):
    import sqlalchemy as sa

    from dlts.extensions import db

    with app.app_context():
        real = db.engine.url
    # an address where nothing listens (TCP port 1, and no unix socket)
    broken = (real.set(database="/nonexistent/dir/x.db") if real.drivername.startswith("sqlite")
              else real.set(host="127.0.0.1", port=1, query={}))
    with app.app_context():
        engine = db.engine
        original = engine.pool
        engine.pool = sa.create_engine(broken, connect_args={"connect_timeout": 1} if "mysql" in real.drivername else {}).pool
        try:
            assert_envelope(client.get("/api/v1/me", headers=world.auth("alice")), 503, "database_unavailable")
            assert client.get("/readyz").status_code == 503
        finally:
            engine.pool = original
    assert client.get("/api/v1/me", headers=world.auth("alice")).status_code == 200
