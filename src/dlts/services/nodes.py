"""Nodes: read (capacity, use, health, repair state and history), cordon/uncordon, repair orders,
node tokens, and the node agent's report (docs/agent.md).

The report's response carries the node's repair orders and the endpoint firewall every node
enforces (services/allowlist.py).

Cordon and repair are real: the job manager's snapshot only places work on ``schedulable`` nodes
(ready, not cordoned by a cluster admin, ``in_service`` or serving its healthy GPUs during a
GPU-scope repair), and repair orders are ``node_orders`` rows that the agent receives in the response
to its next report and answers with ``order_results`` in a later one. The node's state belongs to
the repair loop (services/repair.py, managers/repair.py): an order's result never changes it; the
repair manager validates the node before it returns.

Node tokens are per node, stored as SHA-256 in ``nodes.agent_token_hash``; a token may report for
its own node only (another node's token, or a wrong one: 403).
"""

from __future__ import annotations

import datetime as dt
import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.config import Settings
from dlts.errors import Forbidden, InvalidInput, NotFound, Unauthenticated, WrongState
from dlts.models import Node, NodeEvent, NodeEventKind, NodeFinding, NodeOrder, RepairCycle, iso, utcnow
from dlts.repair.machine import OPEN_ORDER, OrderStatus, agent_lost
from dlts.repositories import repair as repair_repo
from dlts.repositories import usage as usage_repo
from dlts.services import accounting, allowlist, policy
from dlts.services.auth import Principal, hash_token
from dlts.services.transaction import transaction, transactional
from dlts.strict import is_whole_number

NODE_TOKEN_PREFIX = "dltsn_"
REPAIR_ACTIONS = ("reset_gpu", "restart_service", "reboot", "drop_caches", "gpu_diag")
NEEDS_TARGET = {"reset_gpu": "the GPU index or UUID", "restart_service": "the service name",
                "gpu_diag": "LEVEL[:GPU,...], e.g. 1:3 (dcgmi diag level 1-4, on GPU 3; all GPUs without one)"}
DIAG_TARGET = re.compile(r"[1-4](:[^,:]+(,[^,:]+)*)?")
# agent result status -> order status
# what the agent reports for an order (docs/agent.md) -> the order's status here
RESULT_STATUS = {"succeeded": OrderStatus.DONE, "dry_run": OrderStatus.DONE, "failed": OrderStatus.FAILED,
                 "rejected": OrderStatus.FAILED, "skipped": OrderStatus.FAILED, "in_progress": OrderStatus.SENT}
SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
HISTORY_ROWS = 50


@dataclass(frozen=True)
class NodeView:
    name: str
    sku: str
    gpus: int
    gpus_used: int
    gpus_free: int
    cpu: float
    cpu_used: float
    memory_bytes: int
    memory_used_bytes: int
    ib_domain: str
    vc: str | None
    state: str
    # up: the cluster has it ready and its agent is not lost (repair.machine.agent_lost)
    ready: bool
    schedulable: bool
    # the agent's last report's (unknown while its agent is lost)
    health: str
    state_reason: str | None
    cordoned_by: str | None
    unhealthy_gpus: list[int]
    repair_paused: bool
    # the open repair cycle: {"id", "state", "scope", "gpus", "problem", "step", "started_at"} or None
    repair: dict[str, Any] | None
    last_heartbeat_at: str | None
    # why it is not ready (None when ready): its agent is lost, or the cluster has it not ready
    not_ready_reason: str | None = None
    # cluster admins only (None for everybody else)
    details: dict[str, Any] | None = None


@dataclass(frozen=True)
class FindingIn:
    code: str
    severity: str
    device: str | None = None
    action: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OrderResultIn:
    id: str
    status: str
    message: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Report:
    node: str
    agent_version: str
    heartbeat_at: str | None
    boot_id: str
    findings: list[FindingIn]
    metrics: Mapping[str, Any]
    collectors: Mapping[str, Any]
    order_results: list[OrderResultIn]
    fake: bool = False  # the agent read a fake NVML (dlts demo --fake-nvml)


def reported_gpus(metrics: Any) -> list[dict[str, Any]]:
    """The GPUs of a node's last report (``nodes.metrics["gpus"]``), each a dict whose ``index`` is an
    int or None, ``job_id`` an int or None and ``utilization_ratio`` a float in [0, 1] or None.

    Reports are checked by schema (api/schemas.py) before they are stored, but rows written before
    that may hold anything; one node's odd metrics must not break a page for everybody."""
    gpus = metrics.get("gpus") if isinstance(metrics, dict) else None
    if not isinstance(gpus, list):
        return []
    out = []
    for gpu in gpus:
        if not isinstance(gpu, dict):
            continue
        index, job_id, ratio = gpu.get("index"), gpu.get("job_id"), gpu.get("utilization_ratio")
        if isinstance(job_id, str):
            job_id = int(job_id) if is_whole_number(job_id) else None
        elif not isinstance(job_id, int) or isinstance(job_id, bool):
            job_id = None
        usable = isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and 0 <= ratio <= 1
        out.append({**gpu, "index": index if isinstance(index, int) and not isinstance(index, bool) else None,
                    "job_id": job_id, "utilization_ratio": float(ratio) if usable and ratio is not None else None})
    return out


def cycle_brief(cycle: RepairCycle | None) -> dict[str, Any] | None:
    if cycle is None:
        return None
    steps = cycle.steps or []
    step = steps[cycle.step_index]["remediation"] if cycle.step_index < len(steps) else None
    return {"id": cycle.id, "state": cycle.state, "kind": cycle.kind, "scope": cycle.scope, "gpus": list(cycle.gpus or []),
            "problem": cycle.problem, "step": step, "started_at": iso(cycle.started_at)}


def _epoch(value: dt.datetime | None) -> float | None:
    return None if value is None else value.replace(tzinfo=dt.UTC).timestamp()


def agent_lost_reason(node: Node, settings: Settings, now: dt.datetime) -> str | None:
    """Why the node's agent counts as lost, or None: the repair machine's own rule (``agent_lost``)
    on the inputs the repair manager gives it, so the API shows a node lost exactly when the repair
    loop takes (or at its next pass will take) it for lost."""
    lost_after_s = settings.repair.lost_after(settings.node_lost_after_s)
    since_s = _epoch(node.state_changed_at or node.created_at) or 0.0
    if not agent_lost(node.state, _epoch(node.last_heartbeat_at), since_s, _epoch(now) or 0.0, lost_after_s):
        return None
    return f"no report from its agent since {iso(node.last_heartbeat_at) or 'it went lost'} (lost after {lost_after_s:g} s)"


def _view(node: Node, settings: Settings, use: usage_repo.NodeUse | None, details: dict[str, Any] | None,
          cycle: RepairCycle | None = None) -> NodeView:
    gpus_used = len(use.gpu_indices) if use else 0
    lost = agent_lost_reason(node, settings, utcnow())
    why = lost or (None if node.ready else f"the cluster ({node.backend}) has it not ready, or no longer lists it")
    return NodeView(
        name=node.name, sku=node.sku, gpus=node.gpus, gpus_used=gpus_used, gpus_free=max(0, node.gpus - gpus_used),
        cpu=node.cpu, cpu_used=round(use.cpu, 3) if use else 0.0, memory_bytes=node.memory_bytes,
        memory_used_bytes=use.memory_bytes if use else 0, ib_domain=node.ib_domain, vc=node.vc, state=node.state.value,
        ready=why is None, schedulable=node.schedulable, health="unknown" if lost else node.health,
        state_reason=node.state_reason, cordoned_by=node.cordoned_by, unhealthy_gpus=list(node.unhealthy_gpus or []),
        repair_paused=node.repair_paused, repair=cycle_brief(cycle), last_heartbeat_at=iso(node.last_heartbeat_at),
        not_ready_reason=why, details=details,
    )


def _details(session: Session, node: Node, use: usage_repo.NodeUse | None) -> dict[str, Any]:
    findings = session.scalars(sa.select(NodeFinding).where(NodeFinding.node_id == node.id)
                               .order_by(NodeFinding.id.desc()).limit(HISTORY_ROWS))
    orders = session.scalars(sa.select(NodeOrder).where(NodeOrder.node_id == node.id)
                             .order_by(NodeOrder.id.desc()).limit(HISTORY_ROWS))
    return {
        "labels": node.labels or {}, "metrics": node.metrics or {}, "backend": node.backend,
        "has_agent_token": node.agent_token_hash is not None, "job_ids": list(use.job_ids) if use else [],
        "gpu_indices_used": sorted(use.gpu_indices) if use else [],
        "findings": [{"id": f.id, "code": f.code, "severity": f.severity, "device": f.device, "action": f.action,
                      "evidence": f.evidence, "first_seen_at": iso(f.first_seen_at), "last_seen_at": iso(f.last_seen_at),
                      "cleared_at": iso(f.cleared_at)} for f in findings],
        "orders": [_order_json(o) | {"status": o.status, "result": o.result, "created_by": o.created_by,
                                     "created_at": iso(o.created_at), "completed_at": iso(o.completed_at)} for o in orders],
        "events": [{"at": iso(e.at), "kind": e.kind, "from_state": e.from_state, "to_state": e.to_state, "reason": e.reason,
                    "message": e.message, "actor": e.actor, "cycle_id": e.cycle_id}
                   for e in session.scalars(sa.select(NodeEvent).where(NodeEvent.node_id == node.id)
                                            .order_by(NodeEvent.id.desc()).limit(HISTORY_ROWS))],
    }


def _order_json(order: NodeOrder) -> dict[str, Any]:
    """An order as the agent reads it (docs/agent.md)."""
    return {"id": str(order.id), "action": order.action, "target": order.target or "", "dry_run": order.dry_run,
            "reason": (order.result or {}).get("reason", "")}


def list_nodes(session: Session, settings: Settings, principal: Principal, *, after_name: str | None = None,
               limit: int | None = None) -> list[NodeView]:
    """Nodes by name (keyset by name); details (findings, orders, metrics) for cluster admins only."""
    query = sa.select(Node).order_by(Node.name)
    if after_name is not None:
        query = query.where(Node.name > after_name)
    if limit is not None:
        query = query.limit(limit)
    use = usage_repo.node_use(session)
    detailed = policy.can_see_node_details(principal)
    nodes = list(session.scalars(query))
    cycles = {c.node_id: c for c in session.scalars(sa.select(RepairCycle).where(
        RepairCycle.open_node_id.in_([n.id for n in nodes])))} if nodes else {}
    return [_view(n, settings, use.get(n.name), _details(session, n, use.get(n.name)) if detailed else None,
                  cycles.get(n.id)) for n in nodes]


def node_by_name(session: Session, name: str) -> Node:
    return _node(session, name)


def _node(session: Session, name: str) -> Node:
    node = session.scalar(sa.select(Node).where(Node.name == name))
    if node is None:
        raise NotFound(f"No node named {name[:253]!r}.", code="node_not_found")
    return node


def get_node(session: Session, settings: Settings, principal: Principal, name: str) -> NodeView:
    node = _node(session, name)
    use = usage_repo.node_use(session).get(node.name)
    return _view(node, settings, use, _details(session, node, use) if policy.can_see_node_details(principal) else None,
                 repair_repo.open_cycle(session, node.id))


def cordon(session: Session, settings: Settings, principal: Principal, name: str) -> NodeView:
    """No new work on the node; running jobs stay. Idempotent. Independent of repairs: the repair
    loop never lifts a cordon a person set."""
    with transaction(session):
        policy.require_cluster_admin(principal, "cordon a node")
        node = _node(session, name)
        if node.cordoned_by is None:
            node.cordoned_by = principal.name
            repair_repo.add_event(session, node.id, NodeEventKind.CORDON, actor=principal.name, reason="cordoned",
                                  message=f"cordoned by {principal.name}")
    return get_node(session, settings, principal, name)


def uncordon(session: Session, settings: Settings, principal: Principal, name: str) -> NodeView:
    """Lift a cluster admin's cordon. A node in repair stays in repair (``dlts node return`` for a
    node that needs a human)."""
    with transaction(session):
        policy.require_cluster_admin(principal, "uncordon a node")
        node = _node(session, name)
        if node.cordoned_by is not None:
            repair_repo.add_event(session, node.id, NodeEventKind.CORDON, actor=principal.name, reason="uncordoned",
                                  message=f"uncordoned by {principal.name} (cordoned by {node.cordoned_by})")
            node.cordoned_by = None
    return get_node(session, settings, principal, name)


def repair(session: Session, principal: Principal, name: str, action: str, target: str | None = None,
           dry_run: bool = False, reason: str = "") -> dict[str, Any]:
    """Order one action by hand; the agent receives it with its next report. It changes no state:
    to take a node through a whole repair (drain, remediate, validate), start a repair cycle
    (services/repair.py)."""
    with transaction(session):
        policy.require_cluster_admin(principal, "order a node repair")
        if action not in REPAIR_ACTIONS:
            raise InvalidInput(f"action must be one of {', '.join(REPAIR_ACTIONS)}.", details={"field": "action"})
        if action in NEEDS_TARGET and not target:
            raise InvalidInput(f"{action} needs target: {NEEDS_TARGET[action]}.", details={"field": "target"})
        if action == "gpu_diag" and not DIAG_TARGET.fullmatch(target or ""):
            raise InvalidInput(f"gpu_diag target {target!r}: expected {NEEDS_TARGET['gpu_diag']}.", details={"field": "target"})
        node = _node(session, name)
        busy = session.scalar(sa.select(sa.func.count(NodeOrder.id)).where(
            NodeOrder.node_id == node.id, NodeOrder.status.in_(OPEN_ORDER), NodeOrder.dry_run.is_(False)))
        if busy and not dry_run:
            raise WrongState(f"Node {name} already has {busy} repair order(s) in flight; wait for the agent's result.",
                             code="repair_in_progress")
        order = NodeOrder(node_id=node.id, action=action, target=target or None, dry_run=dry_run, status=OrderStatus.PENDING,
                          result={"reason": reason[:500]} if reason else {}, created_by=principal.name)
        session.add(order)
    return _order_json(order) | {"status": order.status, "node": node.name}


# -- node tokens and the agent's report ---------------------------------------------------------

MIN_GIVEN_TOKEN_CHARS = 32


@transactional
def issue_node_token(session: Session, name: str) -> str:
    """A new random token for the node's agent (replaces the old one); shown once, stored hashed."""
    node = _node(session, name)
    token = NODE_TOKEN_PREFIX + secrets.token_urlsafe(32)
    node.agent_token_hash = hash_token(token)
    return token


@transactional
def register_node_token(session: Session, name: str, token: str) -> bool:
    """Register a token made elsewhere (deployment tools derive it from a vaulted seed), replacing the
    old one. Idempotent: returns False, and writes nothing, when the node already has this token."""
    node = _node(session, name)
    if len(token) < MIN_GIVEN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise InvalidInput(f"A node token must be at least {MIN_GIVEN_TOKEN_CHARS} characters without spaces.",
                           details={"field": "token"})
    digest = hash_token(token)
    if node.agent_token_hash is not None and hmac.compare_digest(node.agent_token_hash, digest):
        return False
    node.agent_token_hash = digest
    return True


def authenticate_node(session: Session, name: str, header: str | None) -> Node:
    if not header or not header.startswith("Bearer "):
        raise Unauthenticated("Send 'Authorization: Bearer <node token>'; create one with `dlts node token NODE`.")
    node = session.scalar(sa.select(Node).where(Node.name == name))
    digest = hash_token(header[len("Bearer "):].strip())
    if node is None or node.agent_token_hash is None or not hmac.compare_digest(node.agent_token_hash, digest):
        raise Forbidden(f"This token may not report for node {name[:253]}; issue one with `dlts node token {name[:253]}`.",
                        code="wrong_node_token")
    return node


def _health(findings: list[FindingIn]) -> str:
    worst = max((SEVERITY_RANK.get(f.severity, 0) for f in findings), default=0)
    return {0: "ok", 1: "warning", 2: "critical"}[worst]


def record_report(session: Session, node: Node, report: Report, accept_fake: bool = False) -> list[dict[str, Any]]:
    """Store heartbeat, health, findings history and order results; return the orders to carry out.
    Findings read from a fake NVML are dropped unless the API runs as the demo (``accept_fake``),
    so a test agent pointed at a real cluster can never take a node out of service."""
    with transaction(session):
        if report.node != node.name:
            raise InvalidInput(f"The report names node {report.node[:253]!r} but was posted for {node.name}.", details={"field": "node"})
        if report.fake and not accept_fake:
            report = replace(report, findings=[])
        now = utcnow()
        node.last_heartbeat_at = now
        node.health = _health(report.findings)
        node.metrics = {"agent_version": report.agent_version, "boot_id": report.boot_id, "heartbeat_at": report.heartbeat_at,
                        "collectors": dict(report.collectors), **dict(report.metrics), **({"fake": True} if report.fake else {})}
        # a lost node returns through validation: the repair manager sees this heartbeat
        open_rows = {(f.code, f.device or ""): f for f in session.scalars(
            sa.select(NodeFinding).where(NodeFinding.node_id == node.id, NodeFinding.cleared_at.is_(None)))}
        seen = set()
        for f in report.findings:
            key = (f.code, f.device or "")
            if key in seen:
                continue
            seen.add(key)
            row = open_rows.get(key)
            if row is None:
                session.add(NodeFinding(node_id=node.id, code=f.code, severity=f.severity, device=f.device, evidence=dict(f.evidence),
                                        action=f.action, first_seen_at=now, last_seen_at=now))
            else:
                row.last_seen_at, row.severity, row.evidence, row.action = now, f.severity, dict(f.evidence), f.action
        for key, row in open_rows.items():
            if key not in seen:
                row.cleared_at = now  # gone from this report: the condition cleared
        for result in report.order_results:
            # ids are ours (decimal row ids); anything else ("²", a 20-digit number) is not an order of this API
            order = session.get(NodeOrder, int(result.id)) if is_whole_number(result.id) else None
            if order is None or order.node_id != node.id or order.status not in OPEN_ORDER:
                continue  # unknown, another node's, or already recorded (results are re-sent until a 2xx)
            order.status = RESULT_STATUS.get(result.status, OrderStatus.FAILED)
            order.result = {**(order.result or {}), "agent": dict(result.raw)}
            if order.status in (OrderStatus.DONE, OrderStatus.FAILED):
                order.completed_at = now
        orders = list(session.scalars(sa.select(NodeOrder).where(NodeOrder.node_id == node.id, NodeOrder.status.in_(OPEN_ORDER),
                                                                 NodeOrder.completed_at.is_(None)).order_by(NodeOrder.id).limit(20)))
        for order in orders:
            if order.status == OrderStatus.PENDING:
                order.status = OrderStatus.SENT
        if not report.fake or accept_fake:  # per-job samples into the utilisation history (docs/accounting.md)
            accounting.record_utilisation(session, node.name, report.metrics, now)
    return [_order_json(o) for o in orders]


def answer_report(session: Session, settings: Settings, node: Node, report: Report, accept_fake: bool = False) -> dict[str, Any]:
    """Record the report; answer with the orders to carry out and the endpoint firewall to enforce."""
    orders = record_report(session, node, report, accept_fake)
    return {"orders": orders, "firewall": allowlist.desired_state(session, settings)}
