"""Queueing a notice: the caller's transaction, whom to tell, what is refused."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from dlts.errors import InvalidInput
from dlts.models import (
    Group,
    GroupMember,
    Job,
    OutboxMessage,
    OutboxStatus,
    Role,
    RoleBinding,
    User,
    VirtualCluster,
)
from dlts.services import admin, notify

NODE = {"node": "g017", "reason": "GPU 3: uncorrectable ECC errors"}


def test_a_notice_is_a_row_only_when_the_callers_transaction_commits(sessions):
    with sessions() as s:
        row_id = notify.enqueue(s, template="node_out_of_service", to=["admin@example.org"], context=NODE)
        assert row_id is not None
        s.rollback()
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(OutboxMessage)) == 0
        row_id = notify.enqueue(s, template="node_out_of_service", to=["admin@example.org"], context=NODE)
        s.commit()
    with sessions() as s:
        row = s.get(OutboxMessage, row_id)
        assert (row.status, row.attempts, row.recipients, row.context) == (OutboxStatus.QUEUED, 0, ["admin@example.org"], NODE)
        assert row.next_attempt_at == row.created_at and row.sent_at is None


def test_empty_entries_and_repeated_addresses_are_dropped_and_nobody_left_is_none(sessions):
    with sessions() as s:
        assert notify.enqueue(s, template="node_out_of_service", to=[None, "", "  "], context=NODE) is None
        row_id = notify.enqueue(s, template="node_out_of_service", context=NODE,
                                to=["a@example.org", None, "A@example.org", " b@example.org "])
        assert s.get(OutboxMessage, row_id).recipients == ["a@example.org", "b@example.org"]


@pytest.mark.parametrize("template, error", [
    ("../../etc/passwd", "must be a-z"), ("_footer", "must be a-z"), ("no_such_notice", "no e-mail template 'no_such_notice'"),
])
def test_a_template_that_does_not_ship_is_refused(sessions, template, error):
    with sessions() as s, pytest.raises(InvalidInput, match=error):
        notify.enqueue(s, template=template, to=["a@example.org"], context=NODE)


def test_a_context_that_is_not_json_is_refused(sessions):
    with sessions() as s, pytest.raises(InvalidInput, match="context must be JSON"):
        notify.enqueue(s, template="node_out_of_service", to=["a@example.org"], context={"node": object()})
    with sessions() as s, pytest.raises(InvalidInput, match="context key"):
        notify.enqueue(s, template="node_out_of_service", to=["a@example.org"], context={"not a name": 1})


def test_one_string_instead_of_a_list_of_addresses_is_refused(sessions):
    with sessions() as s, pytest.raises(InvalidInput, match="list of addresses"):
        notify.enqueue(s, template="node_out_of_service", to="a@example.org", context=NODE)


def test_the_dedup_window_comes_from_the_settings_the_sessions_were_made_with(sessions, settings):
    assert sessions.kw["info"]["dlts_settings"] is settings
    with sessions() as s:
        assert notify.enqueue(s, template="node_out_of_service", to=["a@example.org"], context=NODE, dedup_key="k")
        assert notify.enqueue(s, template="node_out_of_service", to=["a@example.org"], context=NODE, dedup_key="k") is None


def _people(s):
    """admin (cluster admin), root2 (cluster admin through a group, no e-mail), ops (group admin, e-mail),
    old (a disabled cluster admin), vcadmin/alice in vision, carol in nlp."""
    admin.add_vc(s, "vision", {"demo-gpu": 4})
    admin.add_vc(s, "nlp", {"demo-gpu": 2})
    for name, email, is_admin in [("admin", "admin@example.org", True), ("root2", None, False), ("ops", "ops@example.org", False),
                                  ("old", "old@example.org", True), ("vcadmin", "vcadmin@example.org", False),
                                  ("alice", "alice@example.org", False), ("carol", "carol@example.org", False),
                                  ("mallory", "m@example.org\r\nBcc: evil@attacker.example", True)]:
        admin.add_user(s, name, admin=is_admin, email=email)
    s.execute(sa.update(User).where(User.name == "old").values(disabled_at=sa.func.now()))
    group = Group(name="operators")
    s.add(group)
    s.flush()
    for name in ("root2", "ops"):
        s.add(GroupMember(group_id=group.id, user_id=s.scalar(sa.select(User.id).where(User.name == name))))
    s.add(RoleBinding(role=Role.CLUSTER_ADMIN, group_id=group.id))
    admin.add_member(s, "vision", "vcadmin", admin=True)
    admin.add_member(s, "vision", "alice")
    admin.add_member(s, "nlp", "carol")
    s.commit()


def test_cluster_admins_are_the_enabled_ones_with_a_usable_address_directly_or_through_a_group(sessions):
    with sessions() as s:
        _people(s)
        assert notify.cluster_admin_emails(s) == ["admin@example.org", "ops@example.org"]


def test_a_jobs_notice_goes_to_its_owner_and_its_vcs_admins(sessions):
    with sessions() as s:
        _people(s)
        vision = s.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == "vision"))
        alice = s.scalar(sa.select(User).where(User.name == "alice"))
        job = Job(name="resnet", user_id=alice.id, vc_id=vision.id, type="batch", image="img", command="true",
                  cpu=1, memory_bytes=2**30, spec={})
        s.add(job)
        s.commit()
        assert notify.job_notice_emails(s, job) == ["alice@example.org", "vcadmin@example.org"]
        assert notify.vc_member_emails(s, vision.id) == ["alice@example.org", "vcadmin@example.org"]
        s.execute(sa.update(User).where(User.name == "vcadmin").values(email=None))
        assert notify.job_notice_emails(s, job) == ["alice@example.org"]
        row_id = notify.enqueue(s, template="job_stopped_for_repair", to=notify.job_notice_emails(s, job),
                                context={"job_id": job.id, "job_name": job.name, "message": "m"})
        assert s.get(OutboxMessage, row_id).recipients == ["alice@example.org"]
