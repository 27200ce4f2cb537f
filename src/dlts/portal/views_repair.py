"""The Node Repair page (nodes per state, the queue, the budget, recent cycles, the pause) and a
node's page (findings, repair cycles with their steps, jobs, events) for cluster admins; everybody
else gets a 404. The forms call the same services as the REST API (services/repair.py)."""

from __future__ import annotations

from flask import abort, current_app, flash, redirect, render_template, request, url_for

from dlts.errors import DltsError
from dlts.extensions import db, settings_of
from dlts.models import NodeState
from dlts.portal.core import admin_only_404, bp, flash_error, principal
from dlts.services import nodes as node_service
from dlts.services import repair as repair_service
from dlts.strict import is_whole_number


@bp.route("/repair")
@admin_only_404
def repair():
    status = repair_service.status(db.session(), principal(), settings_of(current_app))
    nodes = [n for n in node_service.list_nodes(db.session(), settings_of(current_app), principal())
             if n.state != NodeState.IN_SERVICE or n.unhealthy_gpus]
    return render_template("repair.html", status=status, nodes=nodes)


@bp.route("/repair/<action>", methods=["POST"])
@admin_only_404
def repair_action(action: str):
    if action not in ("pause", "resume"):
        abort(404)
    try:
        repair_service.set_pause(db.session(), principal(), action == "pause", None, request.form.get("reason", "")[:500])
        flash(f"Repairs {'paused' if action == 'pause' else 'resumed'} everywhere.", "ok")
    except DltsError as exc:
        flash_error(exc)
    return redirect(url_for("portal.repair"))


@bp.route("/repair/nodes/<name>")
@admin_only_404
def repair_node(name: str):
    node = node_service.get_node(db.session(), settings_of(current_app), principal(), name)
    cycles = repair_service.list_cycles(db.session(), principal(), name, limit=20)
    return render_template("repair_node.html", node=node, cycles=cycles)


@bp.route("/repair/nodes/<name>/<action>", methods=["POST"])
@admin_only_404
def repair_node_action(name: str, action: str):
    who, reason = principal(), request.form.get("reason", "")[:500]
    try:
        if action == "return":
            repair_service.return_node(db.session(), who, name, reason)
            flash(f"Node {name} is validating; it returns to service after a healthy report.", "ok")
        elif action == "cancel":
            cycle_id = request.form.get("cycle", "")
            if not is_whole_number(cycle_id):
                abort(404)
            repair_service.cancel(db.session(), who, name, int(cycle_id))
            flash(f"Repair {cycle_id} of node {name} cancelled.", "ok")
        elif action in ("pause", "resume"):
            repair_service.set_pause(db.session(), who, action == "pause", name, reason)
            flash(f"Repairs {'paused' if action == 'pause' else 'resumed'} on node {name}.", "ok")
        else:
            abort(404)
    except DltsError as exc:
        flash_error(exc)
    return redirect(url_for("portal.repair_node", name=name))
