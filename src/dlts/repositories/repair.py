"""Node state writes (compare-and-set through the transition table, each with a node event) and
the queries the repair manager and the repair services share. Never commits: the caller owns the
transaction, so a state change and its effects land together or not at all."""

from __future__ import annotations

import datetime as dt
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from dlts.models import (
    ACTIVE,
    Job,
    JobAttempt,
    Node,
    NodeEvent,
    NodeEventKind,
    NodeState,
    RepairControl,
    RepairCycle,
    RepairStep,
    utcnow,
)
from dlts.repair.machine import OPEN_ORDER, CycleOutcome, OrderStatus, allowed
from dlts.repair.rules import Remediation, Step


class IllegalTransition(ValueError):
    pass


def add_event(session: Session, node_id: int, kind: str, *, actor: str, reason: str | None = None,
              message: str | None = None, from_state: str | None = None, to_state: str | None = None,
              cycle_id: int | None = None, at: dt.datetime | None = None) -> None:
    session.add(NodeEvent(node_id=node_id, kind=kind, actor=actor[:64], reason=(reason or None) and reason[:64],
                          message=(message or None) and message[:1024], from_state=from_state, to_state=to_state,
                          cycle_id=cycle_id, at=at or utcnow()))


def set_state(session: Session, node: Node, target: NodeState, *, actor: str, reason: str, message: str,
              cycle_id: int | None = None, values: dict[str, Any] | None = None, now: dt.datetime | None = None) -> bool:
    """``UPDATE nodes SET state=target WHERE id=? AND state=<what we read>`` plus a transition event.
    False (and nothing written) when another writer changed the state first."""
    current = node.state
    if not allowed(current, target):
        raise IllegalTransition(f"node {node.name}: {current.value} -> {target.value} is not a transition")
    now = now or utcnow()
    changes = {"state": target, "state_reason": message[:512], "state_changed_at": now, **(values or {})}
    # an UPDATE's result is a CursorResult (Session.execute is typed for any statement)
    result = cast(CursorResult[Any], session.execute(
        sa.update(Node).where(Node.id == node.id, Node.state == current).values(**changes)
        .execution_options(synchronize_session=False)))
    if result.rowcount != 1:
        return False
    for key, value in changes.items():
        set_committed_value(node, key, value)
    add_event(session, node.id, NodeEventKind.TRANSITION, actor=actor, reason=reason, message=message, from_state=current.value,
              to_state=target.value, cycle_id=cycle_id, at=now)
    return True


def open_cycle(session: Session, node_id: int) -> RepairCycle | None:
    return session.scalar(sa.select(RepairCycle).where(RepairCycle.open_node_id == node_id))


def current_step(session: Session, cycle: RepairCycle) -> RepairStep | None:
    """The step of the cycle's current index that has not ended yet."""
    return session.scalar(sa.select(RepairStep).where(RepairStep.cycle_id == cycle.id, RepairStep.number == cycle.step_index,
                                                      RepairStep.ended_at.is_(None)))


def steps_of(cycle: RepairCycle) -> tuple[Step, ...]:
    return tuple(Step(Remediation(s["remediation"]), float(s.get("timeout_s", 0)), s.get("target") or "")
                 for s in cycle.steps or [])


def steps_json(steps) -> list[dict]:
    return [{"remediation": s.remediation.value, "timeout_s": s.timeout_s, "target": s.target} for s in steps]


def paused_globally(session: Session) -> RepairControl | None:
    row = session.get(RepairControl, 1)
    return row if row is not None and row.paused else None


def active_attempts_on(session: Session, node_names: list[str] | None = None) -> dict[str, list[tuple[Job, JobAttempt, dict]]]:
    """node name -> [(job, current attempt, its placement there)] of every live job."""
    rows = session.execute(sa.select(Job, JobAttempt).join(
        JobAttempt, sa.and_(JobAttempt.job_id == Job.id, JobAttempt.number == Job.attempt)).where(Job.status.in_(ACTIVE))
        .execution_options(populate_existing=True)).all()
    out: dict[str, list[tuple[Job, JobAttempt, dict]]] = {}
    for job, attempt in rows:
        for p in attempt.placements or []:
            if node_names is None or p["node"] in node_names:
                out.setdefault(p["node"], []).append((job, attempt, p))
    return out


def start_cycle(session: Session, node: Node, *, kind: str, scope: str, gpus: list[int], steps, step_index: int,
                severity: str, problem: str, rule_key: str | None, triggers: list[dict], actor: str,
                to_state: NodeState, reason: str, message: str, flap: bool = False, now: dt.datetime | None = None,
                validation_since: dt.datetime | None = None) -> RepairCycle | None:
    """Open a cycle and move the node into it, in the caller's transaction. None when the node's
    state changed meanwhile; the unique ``open_node_id`` refuses a second open cycle (IntegrityError)."""
    now = now or utcnow()
    cycle = RepairCycle(node_id=node.id, open_node_id=node.id, kind=kind, rule=rule_key, scope=scope, gpus=list(gpus),
                        severity=severity, problem=problem[:512], triggers=triggers, steps=steps_json(steps),
                        step_index=step_index, state=to_state.value, flap=flap, started_by=actor[:64], started_at=now,
                        validation_since=validation_since)
    session.add(cycle)
    session.flush()
    if not set_state(session, node, to_state, actor=actor, reason=reason, message=message, cycle_id=cycle.id, now=now,
                     values={"repair_scope": scope, "unhealthy_gpus": sorted(set(node.unhealthy_gpus or []) | set(gpus))}):
        return None
    return cycle


def end_cycle(session: Session, cycle: RepairCycle, outcome: CycleOutcome, message: str, now: dt.datetime | None = None) -> None:
    now = now or utcnow()
    cycle.open_node_id = None
    cycle.state = "ended"
    cycle.outcome = outcome
    cycle.ended_at = now
    cycle.message = message[:1024]


def cancel_orders(session: Session, order_ids: list, now: dt.datetime | None = None) -> None:
    """Orders of a step that no longer counts: never sent again; a late result is ignored."""
    ids = [int(i) for i in order_ids or []]
    if ids:
        from dlts.models import NodeOrder

        session.execute(sa.update(NodeOrder).where(NodeOrder.id.in_(ids), NodeOrder.status.in_(OPEN_ORDER))
                        .values(status=OrderStatus.CANCELLED, completed_at=now or utcnow()).execution_options(synchronize_session=False))
