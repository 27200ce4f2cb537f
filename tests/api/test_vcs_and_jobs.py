"""VC administration (quota in proportion to node shape, overrides, events, next-tick effect) and the
job endpoints added on top of the foundation: PATCH, batch, events, attempts."""

from __future__ import annotations

import sqlalchemy as sa

from dlts.models import JobAttempt, JobStatus

from .helpers import assert_envelope, make_job

GIB = 2**30


def test_quota_cpu_and_memory_follow_the_sku_node_shape_and_can_be_overridden(client, world):
    # testnode: 4 demo-gpu GPUs, 8 cores, 32 GiB -> 2 GPUs carry 4 cores and 16 GiB
    r = client.patch("/api/v1/vcs/nlp", json={"quota": {"demo-gpu": 2}}, headers=world.auth("admin"))
    assert r.status_code == 200, r.get_json()
    vc = r.get_json()
    assert vc["skus"][0] == {"sku": "demo-gpu", "gpus": 2, "cpu": 4.0, "memory_bytes": 16 * GIB, "gpus_used": 0,
                             "preemptible_gpus_used": 0, "gpus_queued": 0}
    assert (vc["cpu_quota"], vc["cpu_quota_source"]) == (4.0, "derived")
    assert (vc["memory_quota_bytes"], vc["memory_quota_source"]) == (16 * GIB, "derived")
    vc = client.patch("/api/v1/vcs/nlp", json={"cpu_quota": 6, "memory_quota_bytes": "20Gi"}, headers=world.auth("admin")).get_json()
    assert (vc["cpu_quota"], vc["cpu_quota_source"], vc["memory_quota_bytes"]) == (6.0, "override", 20 * GIB)
    vc = client.patch("/api/v1/vcs/nlp", json={"cpu_quota": None}, headers=world.auth("admin")).get_json()
    assert (vc["cpu_quota"], vc["cpu_quota_source"]) == (4.0, "derived")


def test_quota_refusals_state_the_numbers(client, world):
    error = assert_envelope(client.patch("/api/v1/vcs/nlp", json={"quota": {"demo-gpu": 64}}, headers=world.auth("admin")),
                            422, "quota_exceeds_cluster")
    assert "has 4 demo-gpu GPUs" in error["message"] and "64" in error["message"]
    error = assert_envelope(client.patch("/api/v1/vcs/nlp", json={"quota": {"h100": 8}}, headers=world.auth("admin")),
                            400, "unknown_sku")
    assert "demo-gpu" in error["message"]
    assert_envelope(client.patch("/api/v1/vcs/nlp", json={"policy": "LIFO"}, headers=world.auth("admin")), 400)
    assert_envelope(client.patch("/api/v1/vcs/nlp", json={}, headers=world.auth("admin")), 400)
    assert_envelope(client.patch("/api/v1/vcs/vision", json={}, headers=world.auth("bob")), 403)  # empty is no way around the role


def test_vc_admin_changes_are_recorded_as_events_and_take_effect_for_the_next_submission(client, world):
    auth = world.auth("vcadmin")
    r = client.patch("/api/v1/vcs/vision", json={"user_gpu_quota": 0, "policy": "FIFO", "max_interactive_gpus": 1}, headers=auth)
    assert r.status_code == 200 and r.get_json()["policy"] == "FIFO"
    events = client.get("/api/v1/vcs/vision/events", headers=auth).get_json()["items"]
    changed = {e["field"]: (e["old"], e["new"], e["actor"]) for e in events}
    assert changed["user_gpu_quota"] == (None, 0, "vcadmin") and changed["policy"] == ("RF", "FIFO", "vcadmin")
    job = client.post("/api/v1/jobs", json={"vc": "vision", "image": "x", "command": "true", "gpus": 1},
                      headers=world.auth("alice")).get_json()
    assert job["status"] == "unapproved"
    error = assert_envelope(client.post("/api/v1/jobs", json={"vc": "vision", "image": "x", "command": "true", "gpus": 2,
                                                              "type": "interactive"}, headers=world.auth("alice")), 422)
    assert "at most 1 GPUs for interactive" in error["message"]


def test_vc_usage_per_sku_and_per_user(client, world, sessions, settings):
    job_id = make_job(sessions, settings, "alice", status=JobStatus.RUNNING, gpus=2)
    with sessions() as s:
        s.execute(sa.update(JobAttempt).where(JobAttempt.job_id == job_id).values(
            placements=[{"node": "testnode", "gpu_indices": [0, 1], "cpu": 4, "memory_bytes": 16 * GIB}]))
        s.commit()
    make_job(sessions, settings, "bob", status=JobStatus.QUEUED, gpus=1)
    vc = client.get("/api/v1/vcs/vision", headers=world.auth("bob")).get_json()
    sku = next(s for s in vc["skus"] if s["sku"] == "demo-gpu")
    assert (sku["gpus"], sku["gpus_used"], sku["gpus_queued"]) == (4, 2, 1)
    assert [u["user"] for u in vc["users"]] == ["alice"] and vc["users"][0]["gpus"] == 2
    assert set(vc["members"]) == {"alice", "bob", "vcadmin"} and vc["admins"] == ["vcadmin"]
    # cluster status: capacity, use and fragmentation (4-GPU node with 2 free)
    status = client.get("/api/v1/cluster/status", headers=world.auth("carol")).get_json()
    demo = next(s for s in status["skus"] if s["sku"] == "demo-gpu")
    assert (demo["gpus"], demo["gpus_used"], demo["gpus_free"]) == (4, 2, 2)
    assert demo["fragmentation"] == {"0": 0, "1": 0, "2": 1, "3": 0, "4": 0}
    assert [v["vc"] for v in status["vcs"]] == ["nlp"]  # carol is in nlp only: no other VC's name or quota
    status = client.get("/api/v1/cluster/status", headers=world.auth("bob")).get_json()
    vision = next(v for v in status["vcs"] if v["vc"] == "vision")
    assert vision["gpus_used"] == {"demo-gpu": 2} and vision["gpus_queued"] == {"demo-gpu": 1}
    node = client.get("/api/v1/nodes/testnode", headers=world.auth("bob")).get_json()
    assert (node["gpus_used"], node["gpus_free"], node["details"]) == (2, 2, None)
    node = client.get("/api/v1/nodes/testnode", headers=world.auth("admin")).get_json()
    assert node["details"]["job_ids"] == [job_id] and node["details"]["gpu_indices_used"] == [0, 1]


def test_create_and_delete_a_vc(client, world, sessions, settings):
    auth = world.auth("admin")
    r = client.post("/api/v1/vcs", json={"name": "speech", "quota": {"demo-gpu": 1}, "policy": "FIFO"}, headers=auth)
    assert r.status_code == 201 and r.get_json()["quota"] == {"demo-gpu": 1}
    assert_envelope(client.post("/api/v1/vcs", json={"name": "speech"}, headers=auth), 409, "vc_exists")
    assert_envelope(client.post("/api/v1/vcs", json={"name": "Bad Name"}, headers=auth), 400)
    assert client.delete("/api/v1/vcs/speech", headers=auth).status_code == 204
    assert_envelope(client.get("/api/v1/vcs/speech", headers=auth), 404, "vc_not_found")
    make_job(sessions, settings, "carol", vc="nlp")
    error = assert_envelope(client.delete("/api/v1/vcs/nlp", headers=auth), 409, "vc_has_jobs")
    assert "1 jobs" in error["message"]


def test_vcs_list_is_keyset_paginated(client, world):
    auth = world.auth("admin")
    for name in ("a1", "b2", "c3"):
        client.post("/api/v1/vcs", json={"name": name}, headers=auth)
    names, cursor = [], None
    while True:
        page = client.get("/api/v1/vcs", query_string={"limit": 2, **({"cursor": cursor} if cursor else {})}, headers=auth).get_json()
        names += [v["name"] for v in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert names == ["a1", "b2", "c3", "nlp", "vision"]
    assert_envelope(client.get("/api/v1/vcs", query_string={"cursor": "bm90LWEtdmMtY3Vyc29y"}, headers=auth), 400, "invalid_cursor")


def test_patch_priority_owner_up_to_100_vc_admin_up_to_1000(client, world, sessions, settings):
    job_id = make_job(sessions, settings, "alice")
    error = assert_envelope(client.patch(f"/api/v1/jobs/{job_id}", json={"priority": 101}, headers=world.auth("alice")),
                            422, "priority_out_of_range")
    assert "1-100" in error["message"]
    r = client.patch(f"/api/v1/jobs/{job_id}", json={"priority": 900, "max_time_s": 3600}, headers=world.auth("vcadmin"))
    assert r.status_code == 200 and (r.get_json()["priority"], r.get_json()["max_time_s"]) == (900, 3600)
    events = client.get(f"/api/v1/jobs/{job_id}/events", headers=world.auth("alice")).get_json()["items"]
    assert events[0]["kind"] == "change" and "priority 100 -> 900" in events[0]["message"]
    assert_envelope(client.patch(f"/api/v1/jobs/{job_id}", json={}, headers=world.auth("alice")), 400)
    assert_envelope(client.patch(f"/api/v1/jobs/{job_id}", json={"status": "running"}, headers=world.auth("alice")), 400)
    ended = make_job(sessions, settings, "alice", status=JobStatus.FINISHED)
    assert_envelope(client.patch(f"/api/v1/jobs/{ended}", json={"priority": 5}, headers=world.auth("alice")), 409, "job_already_ended")


def test_batch_gives_one_result_per_id_and_never_fails_all_for_one(client, world, sessions, settings):
    mine = make_job(sessions, settings, "alice")
    ended = make_job(sessions, settings, "alice", status=JobStatus.FINISHED)
    others = make_job(sessions, settings, "carol", vc="nlp")
    r = client.post("/api/v1/jobs:batch", json={"action": "kill", "ids": [mine, ended, others, 99999999, mine]},
                    headers=world.auth("alice"))
    assert r.status_code == 200
    body = r.get_json()
    by_id = {x["id"]: x for x in body["results"]}
    assert len(body["results"]) == 4 and (body["succeeded"], body["failed"]) == (1, 3)
    assert by_id[mine]["ok"] and by_id[mine]["status"] == "killed"
    assert (by_id[ended]["http_status"], by_id[ended]["code"]) == (409, "job_already_ended")
    assert by_id[others]["http_status"] == 404 and by_id[99999999]["http_status"] == 404
    assert_envelope(client.post("/api/v1/jobs:batch", json={"action": "explode", "ids": [mine]}, headers=world.auth("alice")), 400)
    assert_envelope(client.post("/api/v1/jobs:batch", json={"action": "kill", "ids": list(range(1, 502))},
                                headers=world.auth("alice")), 400)


def test_events_and_attempts_paginate_and_members_see_only_public_parts(client, world, sessions, settings):
    job_id = make_job(sessions, settings, "alice", status=JobStatus.FINISHED)
    with sessions() as s:
        s.execute(sa.update(JobAttempt).where(JobAttempt.job_id == job_id).values(
            placements=[{"node": "testnode", "gpu_indices": [], "cpu": 1, "memory_bytes": 1}], end_reason="finished"))
        s.add(JobAttempt(job_id=job_id, number=2, placements=[{"node": "testnode", "gpu_indices": [], "cpu": 1, "memory_bytes": 1}]))
        s.commit()
    seen, cursor = [], None
    while True:
        page = client.get(f"/api/v1/jobs/{job_id}/events", query_string={"limit": 1, **({"cursor": cursor} if cursor else {})},
                          headers=world.auth("alice")).get_json()
        seen += page["items"]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert [e["to_status"] for e in seen] == ["finished", "running", "scheduling", None]
    assert [e["id"] for e in seen] == sorted((e["id"] for e in seen), reverse=True)
    public = client.get(f"/api/v1/jobs/{job_id}/events", headers=world.auth("bob")).get_json()["items"]
    assert all(e["kind"] == "transition" and "actor" not in e for e in public)
    page = client.get(f"/api/v1/jobs/{job_id}/attempts", query_string={"limit": 1}, headers=world.auth("alice")).get_json()
    assert page["items"][0]["number"] == 1 and page["items"][0]["placements"][0]["node"] == "testnode"
    page2 = client.get(f"/api/v1/jobs/{job_id}/attempts", query_string={"cursor": page["next_cursor"]},
                       headers=world.auth("alice")).get_json()
    assert [a["number"] for a in page2["items"]] == [2] and page2["next_cursor"] is None
    public = client.get(f"/api/v1/jobs/{job_id}/attempts", headers=world.auth("bob")).get_json()["items"]
    assert all(a["placements"] == [] for a in public)
    assert_envelope(client.get(f"/api/v1/jobs/{job_id}/events", query_string={"cursor": page["next_cursor"]}, headers=world.auth("alice")),
                    400, "invalid_cursor")
