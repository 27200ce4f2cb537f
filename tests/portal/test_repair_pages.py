"""The Node Repair page and a node's page: cluster admins only (404 for everybody else), the
queue, the budget, cycles with steps, findings, events; return, cancel and pause from the forms."""

from __future__ import annotations

import html

import sqlalchemy as sa

from dlts.models import Node, NodeFinding, utcnow
from dlts.services import repair as repair_service
from dlts.services.auth import principal_for


def text(response) -> str:
    assert response.status_code == 200, response.get_data(as_text=True)[:500]
    return html.unescape(response.get_data(as_text=True))


def admin_principal(s):
    from dlts.models import User

    return principal_for(s, s.scalar(sa.select(User).where(User.name == "admin")))


def test_repair_pages_are_for_cluster_admins_only(as_user):
    bob = as_user("bob")
    for url in ("/repair", "/repair/nodes/testnode"):
        assert bob.get(url).status_code == 404
    assert bob.post("/repair/pause").status_code == 404
    assert bob.post("/repair/nodes/testnode/return").status_code == 404
    assert "Repair</a>" not in text(bob.get("/cluster"))


def test_the_repair_page_shows_the_loop_and_its_forms_act(as_user, sessions):
    with sessions() as s:
        node = s.scalar(sa.select(Node).where(Node.name == "testnode"))
        s.add(NodeFinding(node_id=node.id, code="gpu_ecc_uncorrected", severity="critical", device="gpu2",
                          evidence={"message": "2 uncorrected ECC errors"}, first_seen_at=utcnow(), last_seen_at=utcnow()))
        s.commit()
        cycle = repair_service.start(s, admin_principal(s), "testnode", steps=["reset_gpu", "ticket"], gpus=[2],
                                     reason="ECC")
    admin = as_user("admin")
    page = text(admin.get("/repair"))
    assert "running" in page and "testnode" in page and "GPU 2 repair started by admin: ECC" in page
    assert "reset_gpu → ticket" in page
    node_page = text(admin.get("/repair/nodes/testnode"))
    assert "quarantined" in node_page and "gpu_ecc_uncorrected" in node_page and "2 uncorrected ECC errors" in node_page
    assert f"Cancel repair {cycle['id']}" in node_page and "in_service → quarantined" in node_page
    admin.post("/repair/pause", {"reason": "maintenance"})
    assert "paused" in text(admin.get("/repair")) and "maintenance" in text(admin.get("/repair"))
    admin.post("/repair/resume")
    admin.post("/repair/nodes/testnode/cancel", {"cycle": str(cycle["id"])})
    page = text(admin.get("/repair/nodes/testnode"))
    assert f"Repair {cycle['id']} of node testnode cancelled." in page and "cancelled" in page
    admin.post("/repair/nodes/testnode/return")
    assert "only out_of_service or rma" in text(admin.get("/repair/nodes/testnode"))  # refused, said why
    with sessions() as s:
        s.execute(sa.text("UPDATE nodes SET state = 'rma' WHERE name = 'testnode'"))
        s.commit()
    assert "Return to service" in text(admin.get("/repair/nodes/testnode"))
    admin.post("/repair/nodes/testnode/return", {"reason": "board swapped"})
    assert "is validating" in text(admin.get("/repair/nodes/testnode"))
    admin.post("/repair/nodes/testnode/pause")
    assert "Resume repairs here" in text(admin.get("/repair/nodes/testnode"))


def test_a_lost_node_is_shown_not_ready_with_its_last_report_on_the_portal(as_user, sessions):
    """The same rule as the API's (repair.machine.agent_lost): silent for more than lost_after_s."""
    import datetime as dt

    from dlts.models import NodeState, iso

    last = utcnow() - dt.timedelta(seconds=400)
    with sessions() as s:
        node = s.scalar(sa.select(Node).where(Node.name == "testnode"))
        node.last_heartbeat_at, node.health = last, "ok"
        node.state, node.state_changed_at = NodeState.LOST, utcnow()
        s.commit()
    reason = f"no report from its agent since {iso(last)} (lost after 300 s)"
    admin = as_user("admin")
    for url in ("/cluster", "/repair", "/repair/nodes/testnode"):
        assert f"not ready: {reason}" in text(admin.get(url)), url
    assert f"not ready: {reason}" in text(as_user("bob").get("/cluster"))  # everybody sees the cluster's nodes
