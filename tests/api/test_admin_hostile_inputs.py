"""Hostile bodies for the administration endpoints (members, users, groups): a clear 4xx with the
envelope naming the field, and nothing written."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from dlts.models import Group, GroupMember, RoleBinding, User, VcEvent

from .helpers import assert_envelope

LONG = "x" * 5000
BODIES = [
    # (endpoint name, method, path, body, status, field)
    ("member: no role", "PUT", "/api/v1/vcs/vision/members/carol", {}, 400, "role"),
    ("member: owner role", "PUT", "/api/v1/vcs/vision/members/carol", {"role": "owner"}, 400, "role"),
    ("member: role as a number", "PUT", "/api/v1/vcs/vision/members/carol", {"role": 1}, 400, "role"),
    ("member: role as a list", "PUT", "/api/v1/vcs/vision/members/carol", {"role": ["admin"]}, 400, "role"),
    ("member: unknown field", "PUT", "/api/v1/vcs/vision/members/carol", {"role": "member", "cluster": True}, 400, "cluster"),
    ("member: a list body", "PUT", "/api/v1/vcs/vision/members/carol", [{"role": "member"}], 400, None),
    ("member: SQL in the user", "PUT", "/api/v1/vcs/vision/members/carol' OR '1'='1", {"role": "member"}, 404, None),
    ("member: huge user name", "PUT", "/api/v1/vcs/vision/members/" + "u" * 3000, {"role": "member"}, 404, None),
    ("member: unicode user name", "PUT", "/api/v1/vcs/vision/members/b\u043eb\u202e", {"role": "member"}, 404, None),
    ("member: queued=both", "DELETE", "/api/v1/vcs/vision/members/bob?queued=both", None, 400, "queued"),
    ("user: bad name", "POST", "/api/v1/users", {"name": "Bad Name"}, 400, "name"),
    ("user: path in the name", "POST", "/api/v1/users", {"name": "../etc"}, 400, "name"),
    ("user: huge name", "POST", "/api/v1/users", {"name": "a" * 5000}, 400, "name"),
    ("user: name as a number", "POST", "/api/v1/users", {"name": 7}, 400, "name"),
    ("user: uid 0", "POST", "/api/v1/users", {"name": "zed", "uid": 0, "gid": 0}, 400, "uid"),
    ("user: uid as a string", "POST", "/api/v1/users", {"name": "zed", "uid": "5000", "gid": 5000}, 400, "uid"),
    ("user: uid enormous", "POST", "/api/v1/users", {"name": "zed", "uid": 10**30, "gid": 5000}, 400, "uid"),
    ("user: uid without gid", "POST", "/api/v1/users", {"name": "zed", "uid": 5000}, 400, "gid"),
    ("user: not an e-mail", "POST", "/api/v1/users", {"name": "zed", "email": "not-an-email"}, 400, "email"),
    ("user: e-mail with a newline", "POST", "/api/v1/users", {"name": "zed", "email": "a@b.org\nBcc: x@y.org"}, 400, "email"),
    ("user: huge e-mail", "POST", "/api/v1/users", {"name": "zed", "email": LONG + "@x.org"}, 400, "email"),
    ("user: short password", "POST", "/api/v1/users", {"name": "zed", "password": "short"}, 400, "password"),
    ("user: password and generate", "POST", "/api/v1/users",
     {"name": "zed", "password": "long-enough-password", "generate_password": True}, 400, "password"),
    ("user: admin as a string", "POST", "/api/v1/users", {"name": "zed", "cluster_admin": "yes"}, 400, "cluster_admin"),
    ("user: admin as 1", "POST", "/api/v1/users", {"name": "zed", "cluster_admin": 1}, 400, "cluster_admin"),
    ("patch: bad e-mail", "PATCH", "/api/v1/users/bob", {"email": "@@"}, 400, "email"),
    ("patch: admin as null", "PATCH", "/api/v1/users/bob", {"cluster_admin": None}, 400, "cluster_admin"),
    ("patch: unknown field", "PATCH", "/api/v1/users/bob", {"password_hash": "x"}, 400, "password_hash"),
    ("patch: empty", "PATCH", "/api/v1/users/bob", {}, 400, "body"),
    ("patch: unknown user", "PATCH", "/api/v1/users/nobody", {"email": "a@b.org"}, 404, None),
    ("disable: huge reason", "POST", "/api/v1/users/bob/disable", {"reason": LONG}, 400, "reason"),
    ("disable: NUL in the reason", "POST", "/api/v1/users/bob/disable", {"reason": "a\x00b"}, 400, "reason"),
    ("disable: reason as an object", "POST", "/api/v1/users/bob/disable", {"reason": {"a": 1}}, 400, "reason"),
    ("password: too short", "POST", "/api/v1/users/bob/password", {"password": "123"}, 400, "password"),
    ("password: too long", "POST", "/api/v1/users/bob/password", {"password": "p" * 300}, 400, "password"),
    ("password: as a number", "POST", "/api/v1/users/bob/password", {"password": 123456789012345}, 400, "password"),
    ("group: bad name", "POST", "/api/v1/groups", {"name": "Ops Team"}, 400, "name"),
    ("group: huge name", "POST", "/api/v1/groups", {"name": "g" * 5000}, 400, "name"),
    ("group: unicode name", "POST", "/api/v1/groups", {"name": "gr\u00fcppe"}, 400, "name"),
    ("group: no name", "POST", "/api/v1/groups", {}, 400, "name"),
    ("group role: bad role", "PUT", "/api/v1/groups/team/vcs/vision", {"role": "cluster_admin"}, 400, "role"),
    ("group role: unknown VC", "PUT", "/api/v1/groups/team/vcs/nope", {"role": "member"}, 404, None),
    ("group member: unknown user", "PUT", "/api/v1/groups/team/members/nobody", None, 404, None),
    ("group member: unknown group", "PUT", "/api/v1/groups/nope/members/bob", None, 404, None),
]


def _counts(sessions):
    with sessions() as s:
        return tuple(s.scalar(sa.select(sa.func.count()).select_from(t)) for t in (User, Group, GroupMember, RoleBinding, VcEvent)) + (
            s.scalar(sa.select(sa.func.count()).select_from(User).where(User.disabled_at.is_not(None))),
            tuple(s.execute(sa.select(User.name, User.email, User.password_hash).order_by(User.name))))


@pytest.mark.parametrize("name,method,path,body,status,field", BODIES, ids=[b[0] for b in BODIES])
def test_hostile_admin_bodies_are_refused_and_nothing_is_written(client, world, sessions, name, method, path, body, status, field):
    with sessions() as s:
        if s.scalar(sa.select(Group.id).where(Group.name == "team")) is None:
            s.add(Group(name="team"))
            s.commit()
    before = _counts(sessions)
    response = client.open(path, method=method, json=body, headers=world.auth("admin"))
    error = assert_envelope(response, status)
    if field:
        assert field in json.dumps(error), error
    assert _counts(sessions) == before


@pytest.mark.parametrize("raw", [b'{"role": NaN}', b'[' * 10000, b'{"name": "\\ud800"}'])
def test_malformed_json_to_admin_endpoints_is_a_400(client, world, sessions, raw):
    before = _counts(sessions)
    for path, method in (("/api/v1/vcs/vision/members/bob", "PUT"), ("/api/v1/users", "POST"), ("/api/v1/groups", "POST")):
        response = client.open(path, method=method, data=raw, content_type="application/json", headers=world.auth("admin"))
        assert_envelope(response, 400)
    assert _counts(sessions) == before
