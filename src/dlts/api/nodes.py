"""/api/v1/nodes: read, cordon/uncordon/repair orders, repair cycles (list, start, cancel, return),
/api/v1/repair: pause, resume, status (cluster admin), and the node agent's report."""

from __future__ import annotations

from flask import current_app, g, request

from dlts.api import pagination
from dlts.api.auth import authenticate, principal
from dlts.api.blueprint import Blueprint
from dlts.api.schemas import (
    NodeOrderSchema,
    NodePageSchema,
    NodeRepairSchema,
    NodeReportResponseSchema,
    NodeReportSchema,
    NodeSchema,
    PageArgs,
    RepairCycleListSchema,
    RepairCycleSchema,
    RepairPauseSchema,
    RepairReturnSchema,
    RepairStartSchema,
    RepairStatusSchema,
)
from dlts.extensions import db, settings_of
from dlts.services import nodes as node_service
from dlts.services import repair as repair_service

blp = Blueprint("nodes", __name__, description="Nodes")
blp.before_request(authenticate)
SECURITY: list[dict[str, list[str]]] = [{"bearer": []}]


@blp.route("/nodes")
@blp.arguments(PageArgs, location="query")
@blp.response(200, NodePageSchema)
@blp.doc(security=SECURITY)
def list_nodes(args):
    """Nodes by name: SKU, capacity, use, health, repair state (details for cluster admins)."""
    after = pagination.decode("n", args.get("cursor"))
    items = node_service.list_nodes(db.session(), settings_of(current_app), principal(), after_name=after, limit=args["limit"] + 1)
    page = items[: args["limit"]]
    return {"items": page, "next_cursor": pagination.encode("n", page[-1].name) if len(items) > args["limit"] else None}


@blp.route("/nodes/<string:name>")
@blp.response(200, NodeSchema)
@blp.doc(security=SECURITY)
def get_node(name: str):
    """One node (details: findings history, repair orders, metrics, jobs, for cluster admins)."""
    return node_service.get_node(db.session(), settings_of(current_app), principal(), name)


@blp.route("/nodes/<string:name>/cordon", methods=["POST"])
@blp.response(200, NodeSchema)
@blp.doc(security=SECURITY)
def cordon(name: str):
    """Stop placing new work on the node (cluster admin); running jobs stay."""
    return node_service.cordon(db.session(), settings_of(current_app), principal(), name)


@blp.route("/nodes/<string:name>/uncordon", methods=["POST"])
@blp.response(200, NodeSchema)
@blp.doc(security=SECURITY)
def uncordon(name: str):
    """Return the node to service (cluster admin)."""
    return node_service.uncordon(db.session(), settings_of(current_app), principal(), name)


@blp.route("/nodes/<string:name>/repair", methods=["POST"])
@blp.arguments(NodeRepairSchema)
@blp.response(202, NodeOrderSchema)
@blp.doc(security=SECURITY)
def repair(body, name: str):
    """Order a repair action; the node's agent receives it with its next report (cluster admin)."""
    return node_service.repair(db.session(), principal(), name, body["action"], body.get("target"), body["dry_run"], body["reason"])


@blp.route("/nodes/<string:name>/repairs")
@blp.response(200, RepairCycleListSchema)
@blp.doc(security=SECURITY)
def list_repairs(name: str):
    """The node's repair cycles, newest first, with their steps, times and results (cluster admin)."""
    return {"items": repair_service.list_cycles(db.session(), principal(), name)}


@blp.route("/nodes/<string:name>/repairs", methods=["POST"])
@blp.arguments(RepairStartSchema, required=False)
@blp.response(201, RepairCycleSchema)
@blp.doc(security=SECURITY)
def start_repair(body, name: str):
    """Start a repair cycle by hand (cluster admin): quarantine now, then the given chain; the
    budget and the pause apply. 409 unless the node is in service."""
    return repair_service.start(db.session(), principal(), name, steps=body["steps"], gpus=body["gpus"],
                                target=body.get("target"), reason=body["reason"])


@blp.route("/nodes/<string:name>/repairs/<int:cycle_id>/cancel", methods=["POST"])
@blp.response(200, RepairCycleSchema)
@blp.doc(security=SECURITY)
def cancel_repair(name: str, cycle_id: int):
    """Cancel an open cycle (cluster admin): its orders are withdrawn, the node returns to service."""
    return repair_service.cancel(db.session(), principal(), name, cycle_id)


@blp.route("/nodes/<string:name>/return", methods=["POST"])
@blp.arguments(RepairReturnSchema, required=False)
@blp.response(200, RepairCycleSchema)
@blp.doc(security=SECURITY)
def return_node(body, name: str):
    """A human returns an out_of_service or rma node (cluster admin): it validates, then serves."""
    return repair_service.return_node(db.session(), principal(), name, body["reason"])


@blp.route("/repair/pause", methods=["POST"])
@blp.arguments(RepairPauseSchema, required=False)
@blp.response(200, RepairStatusSchema)
@blp.doc(security=SECURITY)
def pause_repairs(body):
    """Stop new repair actions everywhere, or on ``node`` (cluster admin); those in flight finish."""
    return repair_service.set_pause(db.session(), principal(), True, body.get("node"), body["reason"])


@blp.route("/repair/resume", methods=["POST"])
@blp.arguments(RepairPauseSchema, required=False)
@blp.response(200, RepairStatusSchema)
@blp.doc(security=SECURITY)
def resume_repairs(body):
    """Resume repairs everywhere, or on ``node`` (cluster admin)."""
    return repair_service.set_pause(db.session(), principal(), False, body.get("node"), body["reason"])


@blp.route("/repair/status")
@blp.response(200, RepairStatusSchema)
@blp.doc(security=SECURITY)
def repair_status():
    """Nodes per state, the budget per SKU, the queue, recent cycles, the pauses (cluster admin)."""
    return repair_service.status(db.session(), principal(), settings_of(current_app))


# The agent authenticates with a node token, not a user token: a blueprint of its own.
agent_blp = Blueprint("agent", __name__, description="Node agent reports (node tokens)")


@agent_blp.before_request
def _authenticate_node() -> None:
    name = (request.view_args or {}).get("name", "")
    g.node = node_service.authenticate_node(db.session(), name, request.headers.get("Authorization"))


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
                                 collectors=body["collectors"], order_results=results, fake=body["fake"])
    return node_service.answer_report(db.session(), settings_of(current_app), g.node, parsed,
                                      accept_fake=bool(current_app.config.get("DLTS_DEMO")))
