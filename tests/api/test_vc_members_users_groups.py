"""VC members, user administration and groups through the API, as admins use them: who gains and loses
access (at once in this worker: the principal cache is cleared), what happens to jobs, what is recorded."""

from __future__ import annotations

import sqlalchemy as sa

from dlts.models import ApiToken, Job, JobStatus, PortalSession, User, VcEvent
from dlts.services import admin, portal_auth
from dlts.services.portal_auth import start_session

from .helpers import assert_envelope, make_job, principal


def _token(sessions, name: str) -> dict[str, str]:
    with sessions() as s:
        if s.scalar(sa.select(User.id).where(User.name == name)) is None:
            admin.add_user(s, name)
        return {"Authorization": f"Bearer {admin.new_token(s, name, 'test')}"}


def _status(sessions, job_id: int) -> JobStatus:
    with sessions() as s:
        return s.get(Job, job_id).status


def test_a_vc_admin_adds_promotes_and_removes_a_member_who_gains_and_loses_access_at_once(client, world, sessions, settings):
    dave = _token(sessions, "dave")
    assert client.get("/api/v1/vcs/vision", headers=dave).status_code == 404  # cached as a non-member now
    response = client.put("/api/v1/vcs/vision/members/dave", json={"role": "member"}, headers=world.auth("vcadmin"))
    assert response.status_code == 200, response.get_json()
    assert response.get_json() == {"user": "dave", "role": "member", "direct_role": "member", "groups": [],
                                   "disabled": False, "email": None}
    assert client.get("/api/v1/vcs/vision", headers=dave).status_code == 200
    assert client.patch("/api/v1/vcs/vision", json={"user_gpu_quota": 2}, headers=dave).status_code == 403
    assert client.put("/api/v1/vcs/vision/members/dave", json={"role": "admin"}, headers=world.auth("vcadmin")).status_code == 200
    assert client.patch("/api/v1/vcs/vision", json={"user_gpu_quota": 2}, headers=dave).status_code == 200
    listed = {m["user"]: m["role"] for m in client.get("/api/v1/vcs/vision/members", headers=world.auth("bob")).get_json()["items"]}
    assert listed == {"alice": "member", "bob": "member", "dave": "admin", "vcadmin": "admin"}
    assert "dave" in client.get("/api/v1/vcs/vision", headers=world.auth("bob")).get_json()["admins"]

    queued = make_job(sessions, settings, "dave", status=JobStatus.QUEUED)
    paused = make_job(sessions, settings, "dave", status=JobStatus.PAUSED)
    running = make_job(sessions, settings, "dave", status=JobStatus.RUNNING)
    response = client.delete("/api/v1/vcs/vision/members/dave?queued=kill", headers=world.auth("vcadmin"))
    body = response.get_json()
    assert response.status_code == 200, body
    assert body["removed"] and body["queued"] == "kill" and body["still_member_via"] == []
    assert sorted(body["queued_jobs"]) == sorted(body["killed_jobs"]) == sorted([queued, paused])
    assert body["running_jobs"] == [running]
    assert _status(sessions, queued) is JobStatus.KILLED and _status(sessions, paused) is JobStatus.KILLED
    assert _status(sessions, running) is JobStatus.RUNNING  # it finishes
    assert client.get("/api/v1/vcs/vision", headers=dave).status_code == 404
    assert client.post("/api/v1/jobs", json={"vc": "vision", "image": "debian:12", "command": "true"}, headers=dave).status_code == 404
    with sessions() as s:
        events = [(e.field, e.actor, e.new_value) for e in s.scalars(sa.select(VcEvent).where(VcEvent.vc == "vision",
                                                                                              VcEvent.field == "member")
                                                                   .order_by(VcEvent.id))]
    assert events == [("member", "vcadmin", {"user": "dave", "role": "member"}),
                      ("member", "vcadmin", {"user": "dave", "role": "admin"}),
                      ("member", "vcadmin", {"user": "dave", "role": None, "queued": "kill"})]


def test_removing_a_member_can_keep_their_queued_jobs_and_says_so(client, world, sessions, settings):
    queued = make_job(sessions, settings, "bob", status=JobStatus.QUEUED)
    body = client.delete("/api/v1/vcs/vision/members/bob", headers=world.auth("admin")).get_json()
    assert body["queued"] == "keep" and body["queued_jobs"] == [queued] and body["killed_jobs"] == []
    assert _status(sessions, queued) is JobStatus.QUEUED
    assert client.get("/api/v1/vcs/vision", headers=world.auth("bob")).status_code == 404
    error = assert_envelope(client.delete("/api/v1/vcs/vision/members/bob?queued=maybe", headers=world.auth("admin")), 400)
    assert "queued" in str(error)
    assert_envelope(client.put("/api/v1/vcs/vision/members/nobody", json={"role": "member"},
                               headers=world.auth("vcadmin")), 404, "user_not_found")


def test_membership_follows_a_group_bound_to_a_vc_role(client, world, sessions, settings):
    erin = _token(sessions, "erin")
    cluster = world.auth("admin")
    assert client.post("/api/v1/groups", json={"name": "vision-team"}, headers=cluster).status_code == 201
    assert client.put("/api/v1/groups/vision-team/vcs/vision", json={"role": "member"}, headers=cluster).status_code == 200
    assert client.get("/api/v1/vcs/vision", headers=erin).status_code == 404
    group = client.put("/api/v1/groups/vision-team/members/erin", headers=cluster).get_json()
    assert group["members"] == ["erin"] and group["vcs"] == [{"vc": "vision", "role": "member", "source": None}]
    assert client.get("/api/v1/vcs/vision", headers=erin).status_code == 200
    assert client.post("/api/v1/jobs", json={"vc": "vision", "image": "debian:12", "command": "true"}, headers=erin).status_code == 201
    assert client.patch("/api/v1/vcs/vision", json={"notice": "hi"}, headers=erin).status_code == 403
    members = {m["user"]: m for m in client.get("/api/v1/vcs/vision/members", headers=cluster).get_json()["items"]}
    assert members["erin"]["role"] == "member" and members["erin"]["direct_role"] is None
    assert members["erin"]["groups"] == [{"group": "vision-team", "role": "member"}]
    # the group made admin: erin is an admin of vision
    client.put("/api/v1/groups/vision-team/vcs/vision", json={"role": "admin"}, headers=cluster)
    assert client.patch("/api/v1/vcs/vision", json={"notice": "hi"}, headers=erin).status_code == 200
    # a direct membership as well; removing it leaves the group's, and the jobs alone
    client.put("/api/v1/vcs/vision/members/erin", json={"role": "member"}, headers=cluster)
    queued = make_job(sessions, settings, "erin", status=JobStatus.QUEUED)
    body = client.delete("/api/v1/vcs/vision/members/erin?queued=kill", headers=cluster).get_json()
    assert body["still_member_via"] == ["vision-team"] and body["killed_jobs"] == []
    assert _status(sessions, queued) is JobStatus.QUEUED
    assert client.get("/api/v1/vcs/vision", headers=erin).status_code == 200
    # out of the group: out of the VC
    assert client.delete("/api/v1/groups/vision-team/members/erin", headers=cluster).status_code == 200
    assert client.get("/api/v1/vcs/vision", headers=erin).status_code == 404
    client.put("/api/v1/groups/vision-team/members/erin", headers=cluster)
    assert client.get("/api/v1/vcs/vision", headers=erin).status_code == 200
    assert client.delete("/api/v1/groups/vision-team/vcs/vision", headers=cluster).status_code == 200
    assert client.get("/api/v1/vcs/vision", headers=erin).status_code == 404
    client.put("/api/v1/groups/vision-team/vcs/vision", json={"role": "member"}, headers=cluster)
    assert client.delete("/api/v1/groups/vision-team", headers=cluster).status_code == 204
    assert client.get("/api/v1/vcs/vision", headers=erin).status_code == 404
    assert_envelope(client.get("/api/v1/groups/vision-team", headers=cluster), 404, "group_not_found")


def test_a_group_can_carry_the_cluster_admin_role_into_every_check(client, world, sessions):
    with sessions() as s:
        from dlts.models import Group, GroupMember, Role, RoleBinding

        group = Group(name="ops")
        s.add(group)
        s.flush()
        s.add(RoleBinding(role=Role.CLUSTER_ADMIN, group_id=group.id))
        s.add(GroupMember(group_id=group.id, user_id=admin.get_user(s, "carol").id))
        s.commit()
    assert client.get("/api/v1/users", headers=world.auth("carol")).status_code == 200
    users = {u["name"]: u for u in client.get("/api/v1/users", headers=world.auth("admin")).get_json()["items"]}
    assert users["carol"]["cluster_admin"] and users["carol"]["groups"] == ["ops"]
    assert client.get("/api/v1/groups/ops", headers=world.auth("admin")).get_json()["cluster_admin"] is True


def test_disabling_a_user_revokes_tokens_ends_sessions_holds_waiting_jobs_and_enabling_releases_them(
        client, world, sessions, settings):
    queued = make_job(sessions, settings, "alice", status=JobStatus.QUEUED)
    running = make_job(sessions, settings, "alice", status=JobStatus.RUNNING)
    own_pause = make_job(sessions, settings, "alice", status=JobStatus.PAUSED)
    with sessions() as s:
        start_session(s, principal(s, "alice"), __import__("datetime").timedelta(hours=1))
    assert client.get("/api/v1/me", headers=world.auth("alice")).status_code == 200  # cached
    response = client.post("/api/v1/users/alice/disable", json={"reason": "left the lab"}, headers=world.auth("admin"))
    body = response.get_json()
    assert response.status_code == 200, body
    assert body["tokens_revoked"] == 1 and body["sessions_ended"] == 1
    assert body["held_jobs"] == [queued] and body["running_jobs"] == [running]
    assert body["user"]["disabled"] and body["user"]["disabled_reason"] == "left the lab"
    assert_envelope(client.get("/api/v1/me", headers=world.auth("alice")), 401)
    with sessions() as s:
        job = s.get(Job, queued)
        assert (job.status, job.reason) == (JobStatus.PAUSED, "user_disabled")
        assert s.get(Job, running).status is JobStatus.RUNNING
        assert s.scalar(sa.select(sa.func.count(PortalSession.id))) == 0
        assert s.scalar(sa.select(sa.func.count(ApiToken.id)).where(ApiToken.revoked_at.is_(None),
                                                                   ApiToken.user_id == admin.get_user(s, "alice").id)) == 0
    listed = client.get("/api/v1/users?disabled=true", headers=world.auth("admin")).get_json()["items"]
    assert [u["name"] for u in listed] == ["alice"]
    body = client.post("/api/v1/users/alice/enable", headers=world.auth("admin")).get_json()
    assert body["released_jobs"] == [queued] and not body["user"]["disabled"]
    assert _status(sessions, queued) is JobStatus.QUEUED
    assert _status(sessions, own_pause) is JobStatus.PAUSED  # paused by its owner: stays so
    assert_envelope(client.get("/api/v1/me", headers=world.auth("alice")), 401)  # revoked tokens stay revoked


def test_the_last_cluster_admin_and_oneself_cannot_be_disabled_or_unmade(client, world):
    cluster = world.auth("admin")
    assert_envelope(client.post("/api/v1/users/admin/disable", json={}, headers=cluster), 409, "cannot_disable_self")
    assert_envelope(client.patch("/api/v1/users/admin", json={"cluster_admin": False}, headers=cluster), 409,
                    "last_cluster_admin")
    assert client.patch("/api/v1/users/bob", json={"cluster_admin": True}, headers=cluster).get_json()["cluster_admin"]
    assert client.get("/api/v1/users", headers=world.auth("bob")).status_code == 200  # at once
    assert client.patch("/api/v1/users/bob", json={"cluster_admin": False}, headers=cluster).status_code == 200
    assert client.get("/api/v1/users", headers=world.auth("bob")).status_code == 403


def test_creating_a_user_and_resetting_a_password(client, world, sessions):
    cluster = world.auth("admin")
    response = client.post("/api/v1/users", json={"name": "frank", "email": "frank@example.org", "uid": 4242, "gid": 4242,
                                                  "generate_password": True}, headers=cluster)
    body = response.get_json()
    assert response.status_code == 201, body
    assert body["password_login"] and len(body["password"]) >= 12 and body["uid"] == 4242
    with sessions() as s:
        portal_auth.authenticate_password(s, "frank", body["password"])
    assert_envelope(client.post("/api/v1/users", json={"name": "frank"}, headers=cluster), 409, "user_exists")
    reset = client.post("/api/v1/users/frank/password", json={}, headers=cluster).get_json()
    assert reset["password"] and reset["password"] != body["password"]
    with sessions() as s:
        portal_auth.authenticate_password(s, "frank", reset["password"])
    assert client.post("/api/v1/users/frank/password", json={"password": "a-long-enough-secret"},
                       headers=cluster).get_json()["password"] is None
    with sessions() as s:
        portal_auth.authenticate_password(s, "frank", "a-long-enough-secret")
    patched = client.patch("/api/v1/users/frank", json={"email": "f@example.com", "uid": 4343}, headers=cluster).get_json()
    assert (patched["email"], patched["uid"], patched["gid"]) == ("f@example.com", 4343, 4242)


def test_a_directory_group_refuses_hand_made_membership_changes(client, world, sessions):
    from dlts.models import Group

    with sessions() as s:
        s.add(Group(name="ldap-team", source="directory"))
        s.commit()
    assert_envelope(client.put("/api/v1/groups/ldap-team/members/bob", headers=world.auth("admin")), 409,
                    "group_from_directory")


def test_deleting_a_vc_with_live_jobs_is_refused(client, world, sessions, settings):
    make_job(sessions, settings, "alice", status=JobStatus.QUEUED)
    assert_envelope(client.delete("/api/v1/vcs/vision", headers=world.auth("admin")), 409, "vc_has_jobs")
