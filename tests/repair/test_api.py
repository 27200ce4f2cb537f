"""The repair API: node views carry state and the current repair; hostile inputs are refused with
the error envelope and write nothing; wrong states are 409; the OpenAPI document describes it."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from dlts.models import NodeEvent, RepairCycle


def _envelope(response, status, code=None):
    assert response.status_code == status, response.get_data(as_text=True)[:500]
    error = response.get_json()["error"]
    assert set(error) == {"code", "message", "details"} and error["message"]
    assert "Traceback" not in response.get_data(as_text=True)
    if code:
        assert error["code"] == code, error
    return error


def _cycles(sessions) -> int:
    with sessions() as s:
        return s.scalar(sa.select(sa.func.count(RepairCycle.id)))


HOSTILE_STARTS = [
    ("an unknown remediation", {"steps": ["format_disk"]}, "steps"),
    ("ticket before an order", {"steps": ["ticket", "reboot"]}, "steps"),
    ("no steps", {"steps": []}, "steps"),
    ("too many steps", {"steps": ["reboot"] * 9}, "steps"),
    ("a GPU the node lacks", {"steps": ["reset_gpu"], "gpus": [4]}, "gpus"),
    ("a negative GPU", {"steps": ["reset_gpu"], "gpus": [-1]}, "gpus"),
    ("a GPU twice", {"steps": ["reset_gpu"], "gpus": [1, 1]}, "gpus"),
    ("a GPU as text", {"steps": ["reset_gpu"], "gpus": ["1"]}, "gpus"),
    ("a service restart without a unit", {"steps": ["restart_service"]}, "steps"),
    ("a huge reason", {"steps": ["ticket"], "reason": "x" * 501}, "reason"),
    ("steps as a string", {"steps": "reboot"}, "steps"),
    ("an unknown key", {"steps": ["ticket"], "force": True}, "force"),
]


@pytest.mark.parametrize("name,body,field", HOSTILE_STARTS, ids=[c[0] for c in HOSTILE_STARTS])
def test_hostile_repair_starts_are_400_and_write_nothing(client, world, sessions, name, body, field):
    error = _envelope(client.post("/api/v1/nodes/testnode/repairs", json=body, headers=world.auth("admin")), 400)
    assert field in str(error["details"]) or field in error["message"]
    assert _cycles(sessions) == 0


def test_wrong_states_and_unknown_ids(client, world, sessions):
    admin = world.auth("admin")
    _envelope(client.post("/api/v1/nodes/nosuch/repairs", json={"steps": ["ticket"]}, headers=admin), 404, "node_not_found")
    _envelope(client.post("/api/v1/nodes/testnode/return", json={}, headers=admin), 409, "node_not_held")
    _envelope(client.post("/api/v1/nodes/testnode/repairs/999999/cancel", headers=admin), 404, "repair_not_found")
    _envelope(client.post("/api/v1/nodes/testnode/repairs/-1/cancel", headers=admin), 404)
    _envelope(client.post("/api/v1/repair/pause", json={"node": "nosuch"}, headers=admin), 404, "node_not_found")
    started = client.post("/api/v1/nodes/testnode/repairs", json={"steps": ["reset_gpu", "ticket"], "gpus": [2],
                                                                   "reason": "flaky GPU"}, headers=admin)
    assert started.status_code == 201
    cycle = started.get_json()
    assert (cycle["kind"], cycle["scope"], cycle["gpus"], cycle["state"], cycle["started_by"]) == (
        "manual", "gpu", [2], "quarantined", "admin")
    _envelope(client.post("/api/v1/nodes/testnode/repairs", json={"steps": ["ticket"]}, headers=admin), 409, "node_not_in_service")
    node = client.get("/api/v1/nodes/testnode", headers=world.auth("bob")).get_json()
    assert (node["state"], node["repair"]["id"], node["repair"]["step"], node["unhealthy_gpus"], node["details"]) == (
        "quarantined", cycle["id"], "reset_gpu", [2], None)
    assert client.post(f"/api/v1/nodes/testnode/repairs/{cycle['id']}/cancel", headers=admin).status_code == 200
    _envelope(client.post(f"/api/v1/nodes/testnode/repairs/{cycle['id']}/cancel", headers=admin), 409, "repair_ended")
    admin_view = client.get("/api/v1/nodes/testnode", headers=admin).get_json()
    assert [e["to_state"] for e in admin_view["details"]["events"] if e["kind"] == "transition"] == ["in_service", "quarantined"]
    assert admin_view["repair"] is None and admin_view["unhealthy_gpus"] == []


def test_pause_and_status(client, world, sessions):
    admin = world.auth("admin")
    status = client.post("/api/v1/repair/pause", json={"reason": "datacenter work"}, headers=admin).get_json()
    assert (status["paused"], status["paused_by"], status["reason"]) == (True, "admin", "datacenter work")
    client.post("/api/v1/repair/pause", json={"node": "testnode"}, headers=admin)
    status = client.get("/api/v1/repair/status", headers=admin).get_json()
    assert status["paused_nodes"] == ["testnode"] and status["states"]["in_service"] == 1
    assert status["budget"] == [{"sku": "demo-gpu", "nodes": 1, "budget": 1, "in_repair": 0}]
    status = client.post("/api/v1/repair/resume", json={}, headers=admin).get_json()
    assert status["paused"] is False and status["paused_nodes"] == ["testnode"]
    with sessions() as s:
        assert [e.reason for e in s.scalars(sa.select(NodeEvent).where(NodeEvent.kind == "pause"))] == ["paused"]


def test_the_openapi_document_describes_the_repair_routes(client):
    spec = client.get("/api/v1/openapi.json").get_json()
    for path in ("/api/v1/nodes/{name}/repairs", "/api/v1/nodes/{name}/repairs/{cycle_id}/cancel",
                 "/api/v1/nodes/{name}/return", "/api/v1/repair/pause", "/api/v1/repair/resume", "/api/v1/repair/status"):
        assert path in spec["paths"], path
    node = spec["components"]["schemas"]["Node"]["properties"]
    assert {"state", "repair", "unhealthy_gpus", "state_reason"} <= set(node)
