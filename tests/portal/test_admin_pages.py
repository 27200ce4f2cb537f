"""The administration pages: a VC's members (its admins), Users, Groups and VCs (cluster admins), hidden
from everybody else; each change made through the form and checked where it takes effect."""

from __future__ import annotations

import html
import re

import sqlalchemy as sa

from dlts.models import Group, Job, JobStatus, PortalSession, User, VirtualCluster
from dlts.services import admin as admin_service
from dlts.services.auth import principal_for
from tests.api.helpers import make_job


def text(response) -> str:
    return html.unescape(response.get_data(as_text=True))


def is_member(sessions, user: str, vc: str = "vision") -> tuple[bool, bool]:
    with sessions() as s:
        who = principal_for(s, admin_service.get_user(s, user))
        return who.is_vc_member(vc), who.is_vc_admin(vc)


ADMIN_PAGES = ("/admin/users", "/admin/users/alice", "/admin/groups", "/admin/vcs")


def test_admin_pages_are_404_and_unlinked_for_everybody_but_cluster_admins(as_user, sessions):
    with sessions() as s:
        s.add(Group(name="team"))
        s.commit()
    for name in ("alice", "vcadmin", "carol"):
        c = as_user(name)
        nav = text(c.get("/jobs"))
        for page in ADMIN_PAGES + ("/admin/groups/team",):
            assert c.get(page).status_code == 404, (name, page)
            assert f'href="{page}"' not in nav
        assert c.post("/admin/users", {"name": "mallory"}).status_code == 404
        assert c.post("/admin/users/bob", {"action": "disable"}).status_code == 404
        assert c.post("/admin/groups/team", {"action": "delete"}).status_code == 404
        assert c.post("/admin/vcs", {"action": "delete", "vc": "vision", "confirm": "vision"}).status_code == 404
    with sessions() as s:
        assert s.scalar(sa.select(User.id).where(User.name == "mallory")) is None
        assert admin_service.get_user(s, "bob").disabled_at is None
        assert s.scalar(sa.select(VirtualCluster.id).where(VirtualCluster.name == "vision")) is not None
    admin = as_user("admin")
    nav = text(admin.get("/jobs"))
    for page in ("/admin/users", "/admin/groups", "/admin/vcs"):
        assert f'href="{page}"' in nav and admin.get(page).status_code == 200


def test_members_page_is_for_vc_admins_and_changes_membership(as_user, sessions, settings):
    assert as_user("carol").get("/vcs/vision/members").status_code == 404
    bob = as_user("bob")
    assert bob.get("/vcs/vision/members").status_code == 403
    assert "/vcs/vision/members" not in text(bob.get("/vcs/vision"))
    assert bob.post("/vcs/vision/members", {"action": "put", "user": "carol", "role": "admin"}).status_code == 403
    assert is_member(sessions, "carol") == (False, False)

    vcadmin = as_user("vcadmin")
    page = text(vcadmin.get("/vcs/vision"))
    assert 'href="/vcs/vision/members"' in page
    response = vcadmin.post("/vcs/vision/members", {"action": "put", "user": "carol", "role": "member"})
    assert response.status_code == 302
    assert "carol is now a member of VC vision" in text(vcadmin.get("/vcs/vision/members"))
    assert is_member(sessions, "carol") == (True, False)
    vcadmin.post("/vcs/vision/members", {"action": "put", "user": "carol", "role": "admin"})
    assert is_member(sessions, "carol") == (True, True)
    carol = as_user("carol")
    assert carol.get("/vcs/vision/members").status_code == 200  # a VC admin now

    job = make_job(sessions, settings, "carol", status=JobStatus.QUEUED)
    vcadmin.post("/vcs/vision/members", {"action": "remove", "user": "carol", "queued": "kill"})
    page = text(vcadmin.get("/vcs/vision/members"))
    assert f"carol removed from VC vision; waiting jobs killed: {job}" in page
    assert is_member(sessions, "carol") == (False, False)
    with sessions() as s:
        assert s.get(Job, job).status is JobStatus.KILLED
    assert carol.get("/vcs/vision").status_code == 404  # at the next request
    response = vcadmin.post("/vcs/vision/members", {"action": "put", "user": "nobody", "role": "member"})
    assert response.status_code == 404 and "No user named 'nobody'" in text(response)
    assert vcadmin.post("/vcs/vision/members", {"action": "put", "user": "bob", "role": "admin"}, csrf=False).status_code == 400
    assert is_member(sessions, "bob") == (True, False)


def test_cluster_admin_creates_disables_enables_and_resets_users(as_user, anon, sessions, settings):
    admin = as_user("admin")
    response = admin.post("/admin/users", {"name": "dora", "email": "dora@example.org", "uid": "4100", "gid": "4100"})
    assert response.status_code == 201
    password = re.search(r'id="new-password" readonly value="([^"]+)"', response.get_data(as_text=True)).group(1)
    assert "dora" in text(admin.get("/admin/users"))
    dora = anon()
    dora.get("/login")
    assert dora.post("/login", {"username": "dora", "password": password}).status_code == 302
    assert dora.get("/jobs").status_code == 200
    bad = admin.post("/admin/users", {"name": "Bad Name", "uid": "12"})
    assert bad.status_code == 400 and 'id="err-name"' in text(bad)

    alice = as_user("alice")
    job = make_job(sessions, settings, "alice", status=JobStatus.QUEUED)
    response = admin.post("/admin/users/alice", {"action": "disable", "reason": "left"})
    assert response.status_code == 302
    page = text(admin.get("/admin/users/alice"))
    assert "User alice disabled" in page and "1 waiting jobs held" in page and "left" in page
    assert alice.get("/jobs").status_code == 302  # logged out
    with sessions() as s:
        assert s.get(Job, job).status is JobStatus.PAUSED
        assert s.scalar(sa.select(sa.func.count(PortalSession.id)).where(
            PortalSession.user_id == admin_service.get_user(s, "alice").id)) == 0
    admin.post("/admin/users/alice", {"action": "enable"})
    assert "User alice enabled; 1 held jobs back in the queue" in text(admin.get("/admin/users/alice"))
    with sessions() as s:
        assert s.get(Job, job).status is JobStatus.QUEUED

    response = admin.post("/admin/users/dora", {"action": "password"})
    assert response.status_code == 200
    new = re.search(r'id="new-password" readonly value="([^"]+)"', response.get_data(as_text=True)).group(1)
    assert new != password and dora.get("/jobs").status_code == 302  # the old session ended
    response = admin.post("/admin/users/dora", {"action": "update", "email": "d@example.org", "uid": "4200", "gid": "4200",
                                                "cluster_admin": "on"})
    assert response.status_code == 302
    with sessions() as s:
        user = admin_service.get_user(s, "dora")
        assert (user.email, user.uid) == ("d@example.org", 4200) and principal_for(s, user).is_cluster_admin
    response = admin.post("/admin/users/admin", {"action": "disable"})
    assert response.status_code == 409 and "cannot disable yourself" in text(response)


def test_cluster_admin_manages_groups_and_membership_follows_them(as_user, sessions):
    admin = as_user("admin")
    assert admin.post("/admin/groups", {"name": "nlp-team"}).status_code == 302
    admin.post("/admin/groups/nlp-team", {"action": "add", "user": "alice"})
    admin.post("/admin/groups/nlp-team", {"action": "bind", "vc": "nlp", "role": "admin"})
    page = text(admin.get("/admin/groups/nlp-team"))
    assert "alice" in page and "nlp: admin" in page
    assert is_member(sessions, "alice", "nlp") == (True, True)
    alice = as_user("alice")
    assert 'href="/vcs/nlp"' in text(alice.get("/jobs"))
    assert alice.get("/vcs/nlp/members").status_code == 200
    admin.post("/admin/groups/nlp-team", {"action": "unbind", "vc": "nlp"})
    assert is_member(sessions, "alice", "nlp") == (False, False)
    assert alice.get("/vcs/nlp").status_code == 404
    response = admin.post("/admin/groups", {"name": "Nope Nope"})
    assert response.status_code == 400 and "must start with a lowercase letter" in text(response)
    admin.post("/admin/groups/nlp-team", {"action": "delete"})
    assert admin.get("/admin/groups/nlp-team").status_code == 404


def test_cluster_admin_creates_and_deletes_vcs_refused_while_jobs_live(as_user, sessions, settings):
    admin = as_user("admin")
    assert admin.post("/admin/vcs", {"action": "create", "name": "speech", "quota": "demo-gpu=2", "policy": "FIFO"}).status_code == 302
    with sessions() as s:
        vc = s.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == "speech"))
        assert (vc.quota, vc.policy) == ({"demo-gpu": 2}, "FIFO")
    response = admin.post("/admin/vcs", {"action": "create", "name": "big", "quota": "demo-gpu=99"})
    assert response.status_code == 422 and "The cluster has 4 demo-gpu GPUs" in text(response)
    make_job(sessions, settings, "alice", status=JobStatus.QUEUED)
    response = admin.post("/admin/vcs", {"action": "delete", "vc": "vision", "confirm": "vision"})
    assert response.status_code == 409 and "still has 1 jobs" in text(response)
    response = admin.post("/admin/vcs", {"action": "delete", "vc": "speech", "confirm": "wrong"})
    assert response.status_code == 400 and "Type the VC's name" in text(response)
    assert admin.post("/admin/vcs", {"action": "delete", "vc": "speech", "confirm": "speech"}).status_code == 302
    with sessions() as s:
        assert s.scalar(sa.select(VirtualCluster.id).where(VirtualCluster.name == "speech")) is None


HOSTILE_FORMS = [
    ("/admin/users", {"name": "eve\x00", "uid": "5000", "gid": "5000"}, 400),
    ("/admin/users", {"name": "eve", "uid": "9" * 40, "gid": "5000"}, 400),
    ("/admin/users", {"name": "eve", "uid": "-5", "gid": "5000"}, 400),
    ("/admin/users", {"name": "eve", "email": "eve@example.org\r\nBcc: x@y.org"}, 400),
    ("/admin/users", {"name": "e" * 5000}, 400),
    ("/admin/users/bob", {"action": "update", "uid": "0", "gid": "0"}, 400),
    ("/admin/users/bob", {"action": "disable", "reason": "a\x00b"}, 400),
    ("/admin/users/bob", {"action": "disable", "reason": "r" * 400}, 400),
    ("/admin/users/bob", {"action": "explode"}, 400),
    ("/admin/users/nobody", {"action": "enable"}, 404),
    ("/admin/groups", {"name": "gr\u00fcppe"}, 400),
    ("/admin/groups/nope", {"action": "add", "user": "bob"}, 404),
    ("/admin/vcs", {"action": "create", "name": "x1", "quota": "demo-gpu=abc"}, 400),
    ("/admin/vcs", {"action": "create", "name": "x1", "quota": "demo-gpu=1", "policy": "LIFO"}, 400),
    ("/admin/vcs", {"action": "create", "name": "../x"}, 400),
    ("/vcs/vision/members", {"action": "put", "user": "bob", "role": "owner"}, 400),
    ("/vcs/vision/members", {"action": "remove", "user": "bob", "queued": "maybe"}, 400),
    ("/vcs/vision/members", {"action": "put", "user": "u" * 5000, "role": "member"}, 404),
]


def test_hostile_admin_forms_are_refused_with_a_message_and_change_nothing(as_user, sessions):
    def state():
        with sessions() as s:
            return (tuple(s.execute(sa.select(User.name, User.uid, User.email, User.disabled_at).order_by(User.name))),
                    tuple(s.scalars(sa.select(Group.name).order_by(Group.name))),
                    tuple(s.scalars(sa.select(VirtualCluster.name).order_by(VirtualCluster.name))),
                    is_member(sessions, "bob"))

    admin = as_user("admin")
    before = state()
    for url, form, status in HOSTILE_FORMS:
        response = admin.post(url, form)
        if response.status_code == 302:  # refusals from redirects are flashed on the next page
            response = admin.get(response.headers["Location"])
        assert response.status_code == status, (url, form, response.status_code, text(response)[-1500:])
        assert "Traceback" not in text(response)
    assert state() == before
