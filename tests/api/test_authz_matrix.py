"""The authorisation matrix of API.md, generated from ONE table: every endpoint x every role.

Roles: anonymous (no token), member (bob: member of vision, not the owner), other_vc (carol: member
of nlp only), vc_admin (admin of vision), cluster_admin, owner (alice, who owns the target job and
is a member of vision). Each cell is the HTTP status the role must get. Targets that a request
changes (a job to kill, a VC to delete, a key to remove) are built fresh for every role, so each
cell is independent of the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import sqlalchemy as sa

from dlts.models import AllowedIp, JobStatus, SshKey, User, utcnow
from dlts.services import admin

from .helpers import make_job, ssh_public_key, unique

ROLES = ("anonymous", "member", "other_vc", "vc_admin", "cluster_admin", "owner")
USER_OF = {"member": "bob", "other_vc": "carol", "vc_admin": "vcadmin", "cluster_admin": "admin", "owner": "alice"}


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: str  # formatted with the prepared targets: {job}, {vc}, {key}, {ip}, {endpoint}, {cred}
    expected: tuple[int, int, int, int, int, int]  # in ROLES order
    body: Callable[[dict], dict] | None = None
    prepare: Callable | None = None  # (sessions, settings) -> dict of targets
    batch_item: bool = False  # the status to check is results[0].http_status of /jobs:batch


def job_in(status: JobStatus):
    def prepare(sessions, settings):
        return {"job": make_job(sessions, settings, "alice", status=status)}
    return prepare


def unapproved_job(sessions, settings):
    with sessions() as s:
        vc = s.scalar(sa.text("SELECT id FROM vcs WHERE name = 'vision'"))
        s.execute(sa.text("UPDATE vcs SET user_gpu_quota = 0 WHERE id = :id"), {"id": vc})
        s.commit()
    return {"job": make_job(sessions, settings, "alice", status=JobStatus.QUEUED, gpus=1)}


def fresh_vc(sessions, settings):
    name = unique("tmpvc")
    with sessions() as s:
        admin.add_vc(s, name, {})
        admin.add_member(s, name, "alice")
        admin.add_member(s, name, "bob")
        admin.add_member(s, name, "vcadmin", admin=True)
    return {"vc": name}


def fresh_user(sessions, settings):
    name = unique("u")
    with sessions() as s:
        admin.add_user(s, name)
    return {"user": name}


def disabled_user(sessions, settings):
    from dlts.services import users

    target = fresh_user(sessions, settings)
    with sessions() as s:
        users.disable_user(s, admin.get_user(s, target["user"]), "test", "test")
    return target


def fresh_vision_member(sessions, settings):
    target = fresh_user(sessions, settings)
    with sessions() as s:
        admin.add_member(s, "vision", target["user"])
    return target


def fresh_group(sessions, settings):
    from dlts.models import Group

    name = unique("g")
    with sessions() as s:
        s.add(Group(name=name))
        s.commit()
    return {"group": name, **fresh_user(sessions, settings)}


def fresh_group_with_user(sessions, settings):
    from dlts.models import Group, GroupMember

    target = fresh_group(sessions, settings)
    with sessions() as s:
        group = s.scalar(sa.select(Group).where(Group.name == target["group"]))
        s.add(GroupMember(group_id=group.id, user_id=admin.get_user(s, target["user"]).id))
        s.commit()
    return target


def fresh_group_bound(sessions, settings):
    from dlts.models import Group, Role, RoleBinding

    target = fresh_group(sessions, settings)
    with sessions() as s:
        group = s.scalar(sa.select(Group).where(Group.name == target["group"]))
        s.add(RoleBinding(role=Role.VC_MEMBER, group_id=group.id, vc_id=admin.get_vc(s, "vision").id))
        s.commit()
    return target


def alice_key(sessions, settings):
    from dlts.services import ssh_keys

    with sessions() as s:
        parsed = ssh_keys.parse_public_key(ssh_public_key())
        uid = s.scalar(sa.select(User.id).where(User.name == "alice"))
        row = SshKey(user_id=uid, name="k", key_type=parsed.key_type, bits=parsed.bits, public_key=parsed.normalized,
                     fingerprint=parsed.fingerprint)
        s.add(row)
        s.commit()
        return {"key": row.id}


def open_repair(sessions, settings):
    from dlts.services import repair as repair_service

    from .helpers import principal

    with sessions() as s:
        open_id = s.scalar(sa.text("SELECT id FROM repair_cycles WHERE open_node_id IS NOT NULL"))
        if open_id is None:  # one open cycle per node: every role tries the same one
            open_id = repair_service.start(s, principal(s, "admin"), "testnode", steps=["ticket"], gpus=[], reason="authz")["id"]
    return {"cycle": open_id}


def held_node(sessions, settings):
    with sessions() as s:
        s.execute(sa.text("UPDATE nodes SET state = 'out_of_service' WHERE name = 'testnode'"))
        s.commit()
    return {}


def alice_ip(sessions, settings):
    import datetime as dt

    with sessions() as s:
        uid = s.scalar(sa.select(User.id).where(User.name == "alice"))
        row = AllowedIp(user_id=uid, cidr=f"198.51.100.{int(unique('')) % 250}/32", expires_at=utcnow() + dt.timedelta(days=1))
        s.add(row)
        s.commit()
        return {"ip": row.id}


def alice_token(sessions, settings):
    from dlts.services import tokens

    from .helpers import principal

    with sessions() as s:
        return {"token": tokens.create_token(s, principal(s, "alice"), unique("t")).id}


def alice_registry_credential(sessions, settings):
    from dlts.services import registry_credentials

    from .helpers import principal

    with sessions() as s:
        return {"cred": registry_credentials.add_mine(s, settings.secret_key, principal(s, "alice"), unique("r") + ".example.com",
                                                      "alice", "s3cret").id}


def vision_registry_credential(sessions, settings):
    from dlts.services import registry_credentials

    from .helpers import principal

    with sessions() as s:
        return {"cred": registry_credentials.add_vc(s, settings.secret_key, principal(s, "admin"), "vision",
                                                    unique("r") + ".example.com", "robot", "s3cret").id}


def with_job(sessions, settings):
    return job_in(JobStatus.QUEUED)(sessions, settings)


def job_with_endpoint(sessions, settings):
    from dlts.services import endpoints

    from .helpers import principal

    job_id = make_job(sessions, settings, "alice", status=JobStatus.RUNNING)
    with sessions() as s:
        view, _ = endpoints.open_endpoint(s, principal(s, "alice"), job_id, "port", 8000)
    return {"job": job_id, "endpoint": view.id}


JOB_BODY = {"vc": "vision", "image": "debian:12", "command": "true"}
#            anonymous member other_vc vc_admin cluster_admin owner
ALL_200 = (401, 200, 200, 200, 200, 200)
TABLE = [
    Case("who am I", "GET", "/api/v1/me", ALL_200),
    Case("list jobs", "GET", "/api/v1/jobs", ALL_200),
    Case("submit a job into vision", "POST", "/api/v1/jobs", (401, 201, 404, 201, 201, 201), body=lambda t: JOB_BODY),
    Case("read a job", "GET", "/api/v1/jobs/{job}", (401, 200, 404, 200, 200, 200), prepare=with_job),
    Case("patch a job's priority", "PATCH", "/api/v1/jobs/{job}", (401, 403, 404, 200, 200, 200),
         body=lambda t: {"priority": 50}, prepare=with_job),
    Case("kill a job", "POST", "/api/v1/jobs/{job}/kill", (401, 403, 404, 202, 202, 202), prepare=with_job),
    Case("pause a job", "POST", "/api/v1/jobs/{job}/pause", (401, 403, 404, 202, 202, 202), prepare=with_job),
    Case("resume a job", "POST", "/api/v1/jobs/{job}/resume", (401, 403, 404, 202, 202, 202), prepare=job_in(JobStatus.PAUSED)),
    Case("approve a job", "POST", "/api/v1/jobs/{job}/approve", (401, 403, 404, 202, 202, 403), prepare=unapproved_job),
    Case("batch-kill a job", "POST", "/api/v1/jobs:batch", (401, 403, 404, 202, 202, 202),
         body=lambda t: {"action": "kill", "ids": [t["job"]]}, prepare=with_job, batch_item=True),
    Case("read a job's events", "GET", "/api/v1/jobs/{job}/events", (401, 200, 404, 200, 200, 200), prepare=with_job),
    Case("read a job's attempts", "GET", "/api/v1/jobs/{job}/attempts", (401, 200, 404, 200, 200, 200), prepare=with_job),
    Case("read a job's log", "GET", "/api/v1/jobs/{job}/log", (401, 403, 404, 200, 200, 200), prepare=with_job),
    Case("read a job's utilisation", "GET", "/api/v1/jobs/{job}/utilisation", (401, 403, 404, 200, 200, 200),
         prepare=with_job),
    Case("list a job's endpoints", "GET", "/api/v1/jobs/{job}/endpoints", (401, 403, 404, 200, 200, 200),
         prepare=job_with_endpoint),
    Case("open a port endpoint", "POST", "/api/v1/jobs/{job}/endpoints", (401, 403, 404, 201, 201, 201),
         body=lambda t: {"kind": "port", "port": 6006}, prepare=job_in(JobStatus.RUNNING)),
    Case("close an endpoint", "DELETE", "/api/v1/jobs/{job}/endpoints/{endpoint}", (401, 403, 404, 202, 202, 202),
         prepare=job_with_endpoint),
    Case("delete an ended job", "DELETE", "/api/v1/jobs/{job}", (401, 403, 404, 403, 403, 204),
         prepare=job_in(JobStatus.FINISHED)),
    Case("delete a running job", "DELETE", "/api/v1/jobs/{job}", (401, 403, 404, 403, 403, 409),
         prepare=job_in(JobStatus.RUNNING)),
    Case("replace a job's tags", "PUT", "/api/v1/jobs/{job}/tags", (401, 403, 404, 200, 200, 200),
         body=lambda t: {"tags": ["baseline", "resnet"]}, prepare=with_job),
    Case("star a job", "PUT", "/api/v1/jobs/{job}/favourite", (401, 200, 404, 200, 200, 200), prepare=with_job),
    Case("unstar a job", "DELETE", "/api/v1/jobs/{job}/favourite", (401, 200, 404, 200, 200, 200), prepare=with_job),
    Case("read a job's spec", "GET", "/api/v1/jobs/{job}/spec", (401, 403, 404, 200, 200, 200), prepare=with_job),
    Case("archive an ended job", "POST", "/api/v1/jobs/{job}/archive", (401, 403, 404, 403, 403, 200),
         prepare=job_in(JobStatus.FINISHED)),
    Case("archive a queued job", "POST", "/api/v1/jobs/{job}/archive", (401, 403, 404, 403, 403, 409), prepare=with_job),
    Case("unarchive an ended job", "POST", "/api/v1/jobs/{job}/unarchive", (401, 403, 404, 403, 403, 200),
         prepare=job_in(JobStatus.FINISHED)),
    Case("list VCs", "GET", "/api/v1/vcs", ALL_200),
    Case("read VC vision", "GET", "/api/v1/vcs/vision", (401, 200, 404, 200, 200, 200)),
    Case("read VC vision's history", "GET", "/api/v1/vcs/vision/events", (401, 200, 404, 200, 200, 200)),
    Case("create a VC", "POST", "/api/v1/vcs", (401, 403, 403, 403, 201, 403), body=lambda t: {"name": unique("newvc")}),
    Case("change VC limits", "PATCH", "/api/v1/vcs/vision", (401, 403, 404, 200, 200, 403),
         body=lambda t: {"user_gpu_quota": 3, "max_job_time_s": 86400}),
    Case("change VC quota", "PATCH", "/api/v1/vcs/vision", (401, 403, 404, 403, 200, 403),
         body=lambda t: {"quota": {"demo-gpu": 4}}),
    Case("delete a VC", "DELETE", "/api/v1/vcs/{vc}", (401, 403, 404, 403, 204, 403), prepare=fresh_vc),
    Case("list my SSH keys", "GET", "/api/v1/me/ssh-keys", ALL_200),
    Case("add an SSH key", "POST", "/api/v1/me/ssh-keys", (401, 201, 201, 201, 201, 201),
         body=lambda t: {"public_key": ssh_public_key()}),
    Case("delete alice's SSH key", "DELETE", "/api/v1/me/ssh-keys/{key}", (401, 404, 404, 404, 404, 204), prepare=alice_key),
    Case("list my allowed IPs", "GET", "/api/v1/me/allowed-ips", ALL_200),
    Case("list alice's allowed IPs", "GET", "/api/v1/me/allowed-ips?user=alice", (401, 403, 403, 403, 200, 200)),
    Case("allow an IP", "POST", "/api/v1/me/allowed-ips", (401, 201, 201, 201, 201, 201), body=lambda t: {"ip": "203.0.113.0/24"}),
    Case("allow an IP for alice", "POST", "/api/v1/me/allowed-ips", (401, 403, 403, 403, 201, 201),
         body=lambda t: {"ip": "2001:db8::/48", "user": "alice"}),
    Case("delete alice's allowed IP", "DELETE", "/api/v1/me/allowed-ips/{ip}", (401, 404, 404, 404, 204, 204), prepare=alice_ip),
    Case("list my tokens", "GET", "/api/v1/me/tokens", ALL_200),
    Case("create a token", "POST", "/api/v1/me/tokens", (401, 201, 201, 201, 201, 201), body=lambda t: {"name": "ci"}),
    Case("revoke alice's token", "DELETE", "/api/v1/me/tokens/{token}", (401, 404, 404, 404, 404, 204), prepare=alice_token),
    Case("list my registry credentials", "GET", "/api/v1/me/registry-credentials", ALL_200),
    Case("add a registry credential", "POST", "/api/v1/me/registry-credentials", (401, 201, 201, 201, 201, 201),
         body=lambda t: {"server": "ghcr.io", "username": "me", "password": "s3cret"}),
    Case("delete alice's registry credential", "DELETE", "/api/v1/me/registry-credentials/{cred}",
         (401, 404, 404, 404, 404, 204), prepare=alice_registry_credential),
    Case("set alice's uid and gid", "PATCH", "/api/v1/users/{user}", (401, 403, 403, 403, 200, 403),
         body=lambda t: {"uid": 5000 + int(unique("")), "gid": 5000}, prepare=lambda sessions, settings: {"user": "alice"}),
    Case("make a user a cluster admin", "PATCH", "/api/v1/users/{user}", (401, 403, 403, 403, 200, 403),
         body=lambda t: {"cluster_admin": True, "email": "x@example.org"}, prepare=fresh_user),
    Case("list users", "GET", "/api/v1/users", (401, 403, 403, 403, 200, 403)),
    Case("create a user", "POST", "/api/v1/users", (401, 403, 403, 403, 201, 403),
         body=lambda t: {"name": unique("newuser"), "email": "new@example.org"}),
    Case("read a user", "GET", "/api/v1/users/{user}", (401, 403, 403, 403, 200, 403), prepare=fresh_user),
    Case("disable a user", "POST", "/api/v1/users/{user}/disable", (401, 403, 403, 403, 200, 403),
         body=lambda t: {"reason": "left"}, prepare=fresh_user),
    Case("enable a user", "POST", "/api/v1/users/{user}/enable", (401, 403, 403, 403, 200, 403), prepare=disabled_user),
    Case("reset a user's password", "POST", "/api/v1/users/{user}/password", (401, 403, 403, 403, 200, 403),
         body=lambda t: {}, prepare=fresh_user),
    Case("list VC vision's members", "GET", "/api/v1/vcs/vision/members", (401, 200, 404, 200, 200, 200)),
    Case("add a member to VC vision", "PUT", "/api/v1/vcs/vision/members/{user}", (401, 403, 404, 200, 200, 403),
         body=lambda t: {"role": "member"}, prepare=fresh_user),
    Case("make a VC admin of vision", "PUT", "/api/v1/vcs/vision/members/{user}", (401, 403, 404, 200, 200, 403),
         body=lambda t: {"role": "admin"}, prepare=fresh_vision_member),
    Case("remove a member of VC vision", "DELETE", "/api/v1/vcs/vision/members/{user}?queued=kill",
         (401, 403, 404, 200, 200, 403), prepare=fresh_vision_member),
    Case("list groups", "GET", "/api/v1/groups", (401, 403, 403, 403, 200, 403)),
    Case("create a group", "POST", "/api/v1/groups", (401, 403, 403, 403, 201, 403), body=lambda t: {"name": unique("grp")}),
    Case("read a group", "GET", "/api/v1/groups/{group}", (401, 403, 403, 403, 200, 403), prepare=fresh_group),
    Case("delete a group", "DELETE", "/api/v1/groups/{group}", (401, 403, 403, 403, 204, 403), prepare=fresh_group),
    Case("add a user to a group", "PUT", "/api/v1/groups/{group}/members/{user}", (401, 403, 403, 403, 200, 403),
         prepare=fresh_group),
    Case("remove a user from a group", "DELETE", "/api/v1/groups/{group}/members/{user}", (401, 403, 403, 403, 200, 403),
         prepare=fresh_group_with_user),
    Case("bind a group to VC vision", "PUT", "/api/v1/groups/{group}/vcs/vision", (401, 403, 403, 403, 200, 403),
         body=lambda t: {"role": "member"}, prepare=fresh_group),
    Case("unbind a group from VC vision", "DELETE", "/api/v1/groups/{group}/vcs/vision", (401, 403, 403, 403, 200, 403),
         prepare=fresh_group_bound),
    Case("replace VC vision's storage", "PUT", "/api/v1/vcs/vision/storage", (401, 403, 404, 403, 200, 403),
         body=lambda t: {"nfs": [{"server": "10.0.0.5", "path": "/export/vision", "mount_path": "/data"}]}),
    Case("list VC vision's registry credentials", "GET", "/api/v1/vcs/vision/registry-credentials",
         (401, 403, 404, 200, 200, 403)),
    Case("add a registry credential to VC vision", "POST", "/api/v1/vcs/vision/registry-credentials",
         (401, 403, 404, 201, 201, 403),
         body=lambda t: {"server": unique("r") + ".example.com", "username": "robot", "password": "s3cret"}),
    Case("delete a registry credential of VC vision", "DELETE", "/api/v1/vcs/vision/registry-credentials/{cred}",
         (401, 403, 404, 204, 204, 403), prepare=vision_registry_credential),
    Case("list nodes", "GET", "/api/v1/nodes", ALL_200),
    Case("read a node", "GET", "/api/v1/nodes/testnode", ALL_200),
    Case("cordon a node", "POST", "/api/v1/nodes/testnode/cordon", (401, 403, 403, 403, 200, 403)),
    Case("uncordon a node", "POST", "/api/v1/nodes/testnode/uncordon", (401, 403, 403, 403, 200, 403)),
    Case("order a node repair", "POST", "/api/v1/nodes/testnode/repair", (401, 403, 403, 403, 202, 403),
         body=lambda t: {"action": "drop_caches", "dry_run": True}),
    Case("list a node's repairs", "GET", "/api/v1/nodes/testnode/repairs", (401, 403, 403, 403, 200, 403)),
    Case("start a node repair", "POST", "/api/v1/nodes/testnode/repairs", (401, 403, 403, 403, 201, 403),
         body=lambda t: {"steps": ["ticket"], "reason": "authz"}),
    Case("cancel a node repair", "POST", "/api/v1/nodes/testnode/repairs/{cycle}/cancel", (401, 403, 403, 403, 200, 403),
         prepare=open_repair),
    Case("return a node", "POST", "/api/v1/nodes/testnode/return", (401, 403, 403, 403, 200, 403), prepare=held_node),
    Case("pause repairs", "POST", "/api/v1/repair/pause", (401, 403, 403, 403, 200, 403), body=lambda t: {}),
    Case("resume repairs", "POST", "/api/v1/repair/resume", (401, 403, 403, 403, 200, 403), body=lambda t: {}),
    Case("repair status", "GET", "/api/v1/repair/status", (401, 403, 403, 403, 200, 403)),
    Case("report as a node with a user token", "POST", "/api/v1/nodes/testnode/report", (401, 403, 403, 403, 403, 403),
         body=lambda t: {"schema_version": 1, "node": "testnode"}),
    Case("cluster status", "GET", "/api/v1/cluster/status", ALL_200),
    Case("storage usage", "GET", "/api/v1/storage/usage", ALL_200),
    Case("GPU usage (accounting)", "GET", "/api/v1/usage", ALL_200),
    Case("storage snapshots", "GET", "/api/v1/storage/snapshots", ALL_200),
]


PATH_TARGETS = {"cycle_id": "{cycle}", "job_id": "{job}", "key_id": "{key}", "entry_id": "{ip}", "token_id": "{token}",
                "endpoint_id": "{endpoint}", "credential_id": "{cred}", "user_name": "{user}",
                "group_name": "{group}"}


def test_the_table_covers_every_api_route(app):
    """A new route without a row here fails this test."""
    covered = {(c.method, c.path.split("?")[0].replace("/vcs/vision", "/vcs/{vc}")) for c in TABLE}
    import re

    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith("/api/v1/") or rule.rule.endswith("openapi.json"):
            continue
        path = re.sub(r"<(?:[^:>]+:)?(\w+)>", lambda m: PATH_TARGETS.get(
            m.group(1), "{vc}" if "vcs" in rule.rule else "testnode"), rule.rule)  # noqa: B023 - re.sub calls it now
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            assert (method, path) in covered, f"{method} {rule.rule} has no row in the authorisation table"


@pytest.mark.parametrize("case", TABLE, ids=[c.name for c in TABLE])
def test_authorisation(client, world, sessions, settings, case: Case):
    wrong = []
    for role, expected in zip(ROLES, case.expected):
        targets = case.prepare(sessions, settings) if case.prepare else {}
        headers = world.auth(USER_OF[role]) if role != "anonymous" else {}
        path = case.path.format(**targets)
        body = case.body(targets) if case.body else None
        response = client.open(path, method=case.method, json=body, headers=headers)
        status = response.status_code
        if case.batch_item and status == 200:
            status = response.get_json()["results"][0]["http_status"]
        if status != expected:
            wrong.append(f"{role}: expected {expected}, got {status} {response.get_data(as_text=True)[:200]}")
        if response.status_code >= 400:
            assert set(response.get_json()["error"]) == {"code", "message", "details"}
    assert not wrong, f"{case.method} {case.path}:\n" + "\n".join(wrong)
