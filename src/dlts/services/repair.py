"""Repair use-cases for cluster admins: list a node's cycles, start one by hand, cancel one, return a
node that needs a human, pause and resume (everywhere or one node), and the loop's status.

The repair manager (managers/repair.py) does the rest; these services write the same rows through
the same compare-and-set (repositories/repair.py), so a human and the manager can never both move
a node.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dlts.config import Settings
from dlts.errors import InvalidInput, NotFound, WrongState
from dlts.models import (
    Node,
    NodeEventKind,
    NodeState,
    RepairControl,
    RepairCycle,
    RepairStep,
    iso,
    utcnow,
)
from dlts.repair.machine import IN_REPAIR, CycleKind, CycleOutcome, StepResult, counts_against_budget
from dlts.repair.rules import RuleError, Scope, Step, rule_from_mapping
from dlts.repositories import repair as repo
from dlts.services import nodes as node_service
from dlts.services import policy
from dlts.services.auth import Principal
from dlts.services.transaction import transaction

N = NodeState
RECENT_CYCLES = 20


def cycle_json(cycle: RepairCycle, node_name: str, steps: list[RepairStep]) -> dict[str, Any]:
    duration = None
    if cycle.ended_at is not None:
        duration = round((cycle.ended_at - cycle.started_at).total_seconds(), 3)
    return {
        "id": cycle.id, "node": node_name, "kind": cycle.kind, "rule": cycle.rule, "scope": cycle.scope,
        "gpus": list(cycle.gpus or []), "severity": cycle.severity, "problem": cycle.problem,
        "triggers": list(cycle.triggers or []), "chain": list(cycle.steps or []), "step_index": cycle.step_index,
        "state": cycle.state, "flap": cycle.flap, "started_by": cycle.started_by, "started_at": iso(cycle.started_at),
        "validation_since": iso(cycle.validation_since), "ended_at": iso(cycle.ended_at), "duration_s": duration,
        "outcome": cycle.outcome, "message": cycle.message,
        "steps": [{"number": s.number, "remediation": s.remediation, "target": s.target,
                   "order_ids": [str(i) for i in s.order_ids or []], "started_at": iso(s.started_at),
                   "deadline_at": iso(s.deadline_at), "ended_at": iso(s.ended_at), "result": s.result,
                   "message": s.message} for s in steps],
    }


def _cycles_json(session: Session, cycles: list[RepairCycle], names: dict[int, str]) -> list[dict[str, Any]]:
    steps: dict[int, list[RepairStep]] = {}
    if cycles:
        for step in session.scalars(sa.select(RepairStep).where(RepairStep.cycle_id.in_([c.id for c in cycles]))
                                    .order_by(RepairStep.cycle_id, RepairStep.number, RepairStep.id)):
            steps.setdefault(step.cycle_id, []).append(step)
    return [cycle_json(c, names.get(c.node_id, "?"), steps.get(c.id, [])) for c in cycles]


def list_cycles(session: Session, principal: Principal, name: str, limit: int = 50) -> list[dict[str, Any]]:
    policy.require_cluster_admin(principal, "read a node's repair history")
    node = node_service.node_by_name(session, name)
    cycles = list(session.scalars(sa.select(RepairCycle).where(RepairCycle.node_id == node.id)
                                  .order_by(RepairCycle.id.desc()).limit(limit)))
    return _cycles_json(session, cycles, {node.id: node.name})


def _chain(steps: list[str], target: str | None, gpus: list[int]) -> tuple[Step, ...]:
    try:
        rule = rule_from_mapping({"code": "manual", "severity": "critical", "scope": "gpu" if gpus else "node",
                                  "steps": [{"do": s, **({"target": target} if s == "restart_service" and target else {})}
                                            for s in steps]}, "steps")
    except RuleError as exc:
        raise InvalidInput(str(exc), details={"field": "steps"}) from None
    return rule.steps


def start(session: Session, principal: Principal, name: str, *, steps: list[str], gpus: list[int],
          target: str | None = None, reason: str = "") -> dict[str, Any]:
    """Start a cycle by hand: the node is quarantined now and follows ``steps`` (the budget and
    the pause apply as to any cycle)."""
    with transaction(session):
        policy.require_cluster_admin(principal, "start a node repair")
        node = node_service.node_by_name(session, name)
        if node.state is not N.IN_SERVICE:
            raise WrongState(f"Node {name} is {node.state.value}; a repair starts from in_service "
                             f"(`dlts node return {name}` for a node that needs a human).", code="node_not_in_service")
        if gpus and (max(gpus) >= node.gpus or len(set(gpus)) != len(gpus)):
            raise InvalidInput(f"gpus: node {name} has GPUs 0-{max(node.gpus - 1, 0)}, each listed once.", details={"field": "gpus"})
        chain = _chain(steps, target, gpus)
        where = f"GPU {', '.join(map(str, sorted(gpus)))} " if gpus else ""
        problem = f"{where}repair started by {principal.name}" + (f": {reason}" if reason else "")
        try:
            cycle = repo.start_cycle(session, node, kind=CycleKind.MANUAL, scope=(Scope.GPU if gpus else Scope.NODE).value,
                                     gpus=sorted(gpus), steps=chain, step_index=0, severity="critical", problem=problem,
                                     rule_key=None, triggers=[], actor=principal.name, to_state=N.QUARANTINED,
                                     reason="manual", message=problem)
        except IntegrityError:
            cycle = None
        if cycle is None:
            raise WrongState(f"Node {name} changed state meanwhile; look at it and try again.", code="node_state_changed")
    return cycle_json(cycle, node.name, [])


def cancel(session: Session, principal: Principal, name: str, cycle_id: int) -> dict[str, Any]:
    """End an open cycle: orders not yet carried out are withdrawn, the node returns to service
    (jobs already stopped stay requeued)."""
    with transaction(session):
        policy.require_cluster_admin(principal, "cancel a node repair")
        node = node_service.node_by_name(session, name)
        cycle = session.get(RepairCycle, cycle_id)
        if cycle is None or cycle.node_id != node.id:
            raise NotFound(f"Node {name} has no repair cycle {cycle_id}.", code="repair_not_found")
        if cycle.open_node_id is None:
            raise WrongState(f"Repair {cycle_id} of node {name} already ended ({cycle.outcome}).", code="repair_ended")
        if node.state not in IN_REPAIR:
            raise WrongState(f"Node {name} is {node.state.value}; only a repair in progress can be cancelled.",
                             code="repair_not_cancellable")
        now = utcnow()
        step = repo.current_step(session, cycle)
        if step is not None:
            step.ended_at, step.result, step.message = now, StepResult.CANCELLED, f"cancelled by {principal.name}"
            repo.cancel_orders(session, step.order_ids, now)
        message = f"repair {cycle.id} cancelled by {principal.name}"
        if not repo.set_state(session, node, N.IN_SERVICE, actor=principal.name, reason="cancelled", message=message,
                              cycle_id=cycle.id, values={"repair_scope": None, "unhealthy_gpus": []}, now=now):
            raise WrongState(f"Node {name} changed state meanwhile; look at it and try again.", code="node_state_changed")
        repo.end_cycle(session, cycle, CycleOutcome.CANCELLED, message, now)
    return cycle_json(cycle, node.name, [step] if step else [])


def return_node(session: Session, principal: Principal, name: str, reason: str = "") -> dict[str, Any]:
    """A human says an out_of_service or rma node is fixed: it validates (quiet period, healthy
    report), then returns to service; a failed validation puts it back out of service."""
    with transaction(session):
        policy.require_cluster_admin(principal, "return a node to service")
        node = node_service.node_by_name(session, name)
        if node.state not in (N.OUT_OF_SERVICE, N.RMA):
            raise WrongState(f"Node {name} is {node.state.value}; only out_of_service or rma nodes are returned by hand.",
                             code="node_not_held")
        now = utcnow()
        message = f"returned by {principal.name}" + (f": {reason}" if reason else "") + "; validating"
        try:
            cycle = repo.start_cycle(session, node, kind=CycleKind.RETURN, scope=Scope.NODE.value, gpus=[], steps=(), step_index=0,
                                     severity="info", problem=f"returned by {principal.name}", rule_key=None, triggers=[],
                                     actor=principal.name, to_state=N.VALIDATING, reason="returned", message=message,
                                     now=now, validation_since=now)
        except IntegrityError:
            cycle = None
        if cycle is None:
            raise WrongState(f"Node {name} changed state meanwhile; look at it and try again.", code="node_state_changed")
    return cycle_json(cycle, node.name, [])


def set_pause(session: Session, principal: Principal, paused: bool, node_name: str | None = None,
              reason: str = "") -> dict[str, Any]:
    """Pause (or resume) new repair actions everywhere, or on one node; actions in flight finish."""
    with transaction(session):
        policy.require_cluster_admin(principal, "pause or resume repairs")
        verb = "paused" if paused else "resumed"
        if node_name:
            node = node_service.node_by_name(session, node_name)
            if node.repair_paused != paused:
                node.repair_paused = paused
                repo.add_event(session, node.id, NodeEventKind.PAUSE, actor=principal.name, reason=verb,
                               message=f"repairs {verb} by {principal.name}" + (f": {reason}" if reason else ""))
        else:
            row = session.get(RepairControl, 1)
            if row is None:
                row = RepairControl(id=1, paused=False)
                session.add(row)
            row.paused, row.paused_by, row.paused_at = paused, principal.name, utcnow()
            row.reason = reason[:512] or None
    return status(session, principal, None)


def status(session: Session, principal: Principal, settings: Settings | None) -> dict[str, Any]:
    """Nodes per state, the budget per SKU, the queue (quarantined nodes in admission order), recent cycles."""
    policy.require_cluster_admin(principal, "read the repair status")
    nodes = list(session.scalars(sa.select(Node).order_by(Node.name)))
    states = Counter(n.state.value for n in nodes)
    control = session.get(RepairControl, 1)
    open_cycles = {c.node_id: c for c in session.scalars(sa.select(RepairCycle).where(RepairCycle.open_node_id.isnot(None)))}
    repair_settings = settings.repair if settings is not None else None
    budget = []
    for sku in sorted({n.sku for n in nodes}):
        members = [n for n in nodes if n.sku == sku]
        budget.append({"sku": sku, "nodes": len(members),
                       "budget": repair_settings.budget_for(len(members)) if repair_settings else None,
                       "in_repair": sum(1 for n in members if counts_against_budget(n.state, n.repair_scope))})
    queue = sorted((n for n in nodes if n.state is N.QUARANTINED and n.id in open_cycles),
                   key=lambda n: queue_key(open_cycles[n.id]))
    names = {n.id: n.name for n in nodes}
    recent = list(session.scalars(sa.select(RepairCycle).order_by(RepairCycle.id.desc()).limit(RECENT_CYCLES)))
    return {
        "paused": bool(control and control.paused), "paused_by": control.paused_by if control else None,
        "paused_at": iso(control.paused_at) if control else None, "reason": control.reason if control else None,
        "dry_run": bool(repair_settings and repair_settings.dry_run),
        "paused_nodes": [n.name for n in nodes if n.repair_paused], "states": {s.value: states.get(s.value, 0) for s in N},
        "budget": budget,
        "queue": [{"node": n.name, "sku": n.sku, "severity": open_cycles[n.id].severity, "problem": open_cycles[n.id].problem,
                   "since": iso(open_cycles[n.id].started_at)} for n in queue],
        "recent": [{k: v for k, v in c.items() if k != "steps"} for c in _cycles_json(session, recent, names)],
    }


SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def queue_key(cycle: RepairCycle) -> tuple[int, dt.datetime, int]:
    """Admission order of quarantined nodes: most severe first, then the longest waiting."""
    return (SEVERITY_ORDER.get(cycle.severity, 3), cycle.started_at, cycle.id)


__all__ = ["cancel", "cycle_json", "list_cycles", "queue_key", "return_node", "set_pause", "start", "status"]
