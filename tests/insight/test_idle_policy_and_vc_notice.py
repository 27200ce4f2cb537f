"""The VC's idle-job policy through the VC settings API (who may set it, what is refused, the VC
events), and the VC notice mailed to the VC's members through the notifier, once per notice."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from dlts.managers.notify import NotifyManager
from dlts.models import OutboxMessage
from tests.smtp_server import with_notify

pytestmark = pytest.mark.db


def patch(client, world, user, body, vc="vision"):
    return client.patch(f"/api/v1/vcs/{vc}", json=body, headers=world.auth(user))


def test_vc_admins_set_the_idle_policy_and_each_change_is_a_vc_event(client, world):
    r = patch(client, world, "vcadmin", {"idle_policy": {"idle_warn_min": 45, "idle_action": "pause"}})
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["idle_policy"] == {"idle_warn_min": 45, "idle_action_min": 60, "idle_action": "pause",
                                           "exempt_types": []}
    # keys merge into the current policy
    r = patch(client, world, "admin", {"idle_policy": {"exempt_types": ["interactive", "interactive"], "idle_action_min": 7.5}})
    assert r.get_json()["idle_policy"] == {"idle_warn_min": 45, "idle_action_min": 7.5, "idle_action": "pause",
                                           "exempt_types": ["interactive"]}
    assert client.get("/api/v1/vcs/vision", headers=world.auth("alice")).get_json()["idle_policy"]["idle_warn_min"] == 45
    r = patch(client, world, "vcadmin", {"idle_policy": None})
    assert r.status_code == 200 and r.get_json()["idle_policy"] is None
    events = client.get("/api/v1/vcs/vision/events", headers=world.auth("vcadmin")).get_json()["items"]
    policy_events = [(e["actor"], e["old"], e["new"]) for e in reversed(events) if e["field"] == "idle_policy"]
    assert [(a, (o or {}).get("idle_action_min"), (n or {}).get("idle_action_min")) for a, o, n in policy_events] == [
        ("vcadmin", None, 60), ("admin", 60, 7.5), ("vcadmin", 7.5, None)]


@pytest.mark.parametrize("user, status", [("alice", 403), ("bob", 403), ("carol", 404)])
def test_only_vc_admins_set_the_idle_policy(client, world, user, status):
    r = patch(client, world, user, {"idle_policy": {"idle_action": "kill"}})
    assert r.status_code == status, r.get_json()
    assert client.get("/api/v1/vcs/vision", headers=world.auth("vcadmin")).get_json()["idle_policy"] is None


@pytest.mark.parametrize("policy, field", [
    ({"idle_warn_min": 0}, "idle_warn_min"),
    ({"idle_warn_min": -5}, "idle_warn_min"),
    ({"idle_action_min": 10**9}, "idle_action_min"),
    ({"idle_warn_min": "soon"}, "idle_warn_min"),
    ({"idle_action": "reboot"}, "idle_action"),
    ({"exempt_types": ["gpu"]}, "exempt_types"),
    ({"exempt_types": "batch"}, "exempt_types"),
    ({"idle_after": 5}, "idle_after"),
    ("pause", "idle_policy"),
])
def test_a_bad_idle_policy_is_refused_naming_the_field(client, world, policy, field):
    r = patch(client, world, "vcadmin", {"idle_policy": policy})
    assert r.status_code in (400, 422), r.get_json()
    assert field in str(r.get_json()["error"]["details"]), r.get_json()


def test_the_service_checks_the_policy_too(sessions, world):
    """The portal calls the service directly: it refuses what the API schema would (naming the key)."""
    from dlts.errors import InvalidInput
    from dlts.services import vcs

    for bad, field in (({"idle_warn_min": True}, "idle_policy.idle_warn_min"), ({"x": 1}, "idle_policy.x"),
                       ({"idle_action": "none", "exempt_types": ["x"]}, "idle_policy.exempt_types")):
        with pytest.raises(InvalidInput) as err:
            vcs.check_idle_policy(bad, None)
        assert err.value.details["field"] == field
    assert vcs.check_idle_policy({}, None) == vcs.IDLE_POLICY_DEFAULTS | {"exempt_types": []}


@pytest.fixture
def with_addresses(world, sessions):
    from dlts.models import User

    with sessions() as s:
        for user in s.scalars(sa.select(User)):
            user.email = f"{user.name}@example.org"
        s.commit()
    return world


def test_a_vc_notice_is_mailed_to_each_member_once(client, with_addresses, sessions, settings, smtp_server):
    world = with_addresses
    r = patch(client, world, "vcadmin", {"notice": "Maintenance on Friday 08:00-10:00 UTC: save your work."})
    assert r.status_code == 200
    with sessions() as s:
        rows = list(s.scalars(sa.select(OutboxMessage).where(OutboxMessage.template == "vc_notice")))
    # the members of vision (not carol), one mail each: nobody sees the others' addresses
    assert sorted(r.recipients[0] for r in rows) == ["alice@example.org", "bob@example.org", "vcadmin@example.org"]
    assert all(len(r.recipients) == 1 for r in rows)
    notifier = NotifyManager(sessions, with_notify(settings, smtp_port=smtp_server.port))
    assert notifier.run_once().sent == 3
    mail = next(m for m in smtp_server.received if m.rcpt_tos == ["bob@example.org"])
    assert "Notice for VC vision" in mail.message["Subject"]
    assert "Hello bob" in mail.body and "Maintenance on Friday" in mail.body and "vcadmin" in mail.body
    # the same notice again (cleared and set back): not mailed again; a new notice is
    patch(client, world, "vcadmin", {"notice": None})
    patch(client, world, "vcadmin", {"notice": "Maintenance on Friday 08:00-10:00 UTC: save your work."})
    patch(client, world, "vcadmin", {"notice": "Maintenance moved to Monday."})
    with sessions() as s:
        texts = [r.context["message"] for r in s.scalars(sa.select(OutboxMessage).where(
            OutboxMessage.template == "vc_notice").order_by(OutboxMessage.id))]
    assert texts.count("Maintenance on Friday 08:00-10:00 UTC: save your work.") == 3
    assert texts.count("Maintenance moved to Monday.") == 3
    assert notifier.run_once().sent == 3


def test_a_notice_refused_by_the_schema_queues_no_mail(client, with_addresses, sessions):
    r = patch(client, with_addresses, "alice", {"notice": "hello"})
    assert r.status_code == 403
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(OutboxMessage.id))) == 0
