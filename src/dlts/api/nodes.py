"""/api/v1/nodes: read, cordon/uncordon/repair (cluster admin), and the node agent's report."""

from __future__ import annotations

from flask import current_app, g, request
from flask_smorest import Blueprint

from dlts.api import pagination
from dlts.api.auth import authenticate, principal
from dlts.api.schemas import (NodeOrderSchema, NodePageSchema, NodeRepairSchema, NodeReportResponseSchema,
                              NodeReportSchema, NodeSchema, PageArgs)
from dlts.app import settings_of
from dlts.extensions import db
from dlts.services import nodes as node_service

blp = Blueprint("nodes", __name__, description="Nodes")
blp.before_request(authenticate)
SECURITY = [{"bearer": []}]


@blp.route("/nodes")
@blp.arguments(PageArgs, location="query")
@blp.response(200, NodePageSchema)
@blp.doc(security=SECURITY)
def list_nodes(args):
    """Nodes by name: SKU, capacity, use, health, repair state (details for cluster admins)."""
    after = pagination.decode("n", args.get("cursor"))
    items = node_service.list_nodes(db.session, principal(), after_name=after, limit=args["limit"] + 1)
    page = items[: args["limit"]]
    return {"items": page, "next_cursor": pagination.encode("n", page[-1].name) if len(items) > args["limit"] else None}


@blp.route("/nodes/<string:name>")
@blp.response(200, NodeSchema)
@blp.doc(security=SECURITY)
def get_node(name: str):
    """One node (details: findings history, repair orders, metrics, jobs, for cluster admins)."""
    return node_service.get_node(db.session, principal(), name)


@blp.route("/nodes/<string:name>/cordon", methods=["POST"])
@blp.response(200, NodeSchema)
@blp.doc(security=SECURITY)
def cordon(name: str):
    """Stop placing new work on the node (cluster admin); running jobs stay."""
    return node_service.cordon(db.session, principal(), name)


@blp.route("/nodes/<string:name>/uncordon", methods=["POST"])
@blp.response(200, NodeSchema)
@blp.doc(security=SECURITY)
def uncordon(name: str):
    """Return the node to service (cluster admin)."""
    return node_service.uncordon(db.session, principal(), name)


@blp.route("/nodes/<string:name>/repair", methods=["POST"])
@blp.arguments(NodeRepairSchema)
@blp.response(202, NodeOrderSchema)
@blp.doc(security=SECURITY)
def repair(body, name: str):
    """Order a repair action; the node's agent receives it with its next report (cluster admin)."""
    return node_service.repair(db.session, principal(), name, body["action"], body.get("target"), body["dry_run"], body["reason"])


# The agent authenticates with a node token, not a user token: a blueprint of its own.
agent_blp = Blueprint("agent", __name__, description="Node agent reports (node tokens)")


@agent_blp.before_request
def _authenticate_node() -> None:
    name = (request.view_args or {}).get("name", "")
    g.node = node_service.authenticate_node(db.session, name, request.headers.get("Authorization"))


@agent_blp.route("/nodes/<string:name>/report", methods=["POST"])
@agent_blp.arguments(NodeReportSchema)
@agent_blp.response(200, NodeReportResponseSchema)
@agent_blp.doc(security=SECURITY)
def report(body, name: str):
    """Heartbeat, findings, metrics summary and order results; the response carries repair orders and
    the endpoint firewall (docs/agent.md)."""
    findings = [node_service.FindingIn(
        code=f["code"], severity=f["severity"], device=f.get("device"), action=f.get("recommended_action"),
        evidence={**f.get("evidence", {}), **{k: f[k] for k in ("message", "gpu_uuid", "bus_id") if f.get(k)}})
        for f in body["findings"]]
    results = [node_service.OrderResultIn(id=r["id"], status=r["status"], message=r.get("message") or "", raw=r)
               for r in body["order_results"]]
    parsed = node_service.Report(node=body["node"], agent_version=body["agent_version"], heartbeat_at=body.get("heartbeat_at"),
                                 boot_id=body["boot_id"], findings=findings, metrics=body["metrics"],
                                 collectors=body["collectors"], order_results=results)
    return node_service.answer_report(db.session, settings_of(current_app), g.node, parsed)
