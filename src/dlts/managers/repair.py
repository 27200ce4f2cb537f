"""The repair manager: findings and heartbeats -> rules -> the node state machine -> effects.

Each tick (``run_once``, every ``repair.interval_s`` in ``dlts managers``) reads every node with its
open findings, the jobs on it, its latest report and its open repair cycle, asks the pure core
(``dlts.repair.machine.decide``) what comes next, and applies each node's decision in ONE
transaction guarded by a compare-and-set on the node's state: the transition and its node event,
the cycle and step rows, the agent orders (``node_orders``, delivered in the agent's next report
response), the stop requests of the jobs to drain (``job_attempts.stop_requested``, carried out by
the job manager, which alone touches the cluster), the jobs' ``repair`` events and the notices (the
notifier's outbox rows). A crash before the commit leaves the old state and the next tick decides
the same again; after it, the next tick goes on from the new one. So every step runs exactly once.

Quarantined nodes leave service in the order of ``services.repair.queue_key`` while their SKU's
budget (``repair.max_nodes_in_repair``) allows. ``repair.dry_run`` records what would be done as
node events of kind ``dry_run`` and changes nothing.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dlts.config import Settings
from dlts.managers.lease import LeaseLost
from dlts.models import (
    EndReason,
    EventKind,
    Job,
    JobStatus,
    JobType,
    Node,
    NodeEvent,
    NodeEventKind,
    NodeFinding,
    NodeOrder,
    NodeState,
    RepairCycle,
    RepairStep,
)
from dlts.repair import machine as core
from dlts.repair.rules import (
    HEARTBEAT_LOST,
    Remediation,
    RuleBook,
    Scope,
    load_rulebook,
)
from dlts.repositories import jobs as job_repo
from dlts.repositories import repair as repo
from dlts.services import notify, transaction
from dlts.services.nodes import reported_gpus
from dlts.services.repair import queue_key

log = logging.getLogger(__name__)
N = NodeState
ACTOR = "repair"
STOP_REASONS = ("node_repair", "node_lost")  # attempt.stop_requested values the job manager requeues
MAX_STEPS_PER_TICK = 6  # a node may go through this many decisions in one tick (quarantine, drain, order, ...)


def epoch(value: dt.datetime | None) -> float | None:
    return None if value is None else value.replace(tzinfo=dt.UTC).timestamp()


def from_epoch(value: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(value, dt.UTC).replace(tzinfo=None)


def health_of(node: Node) -> core.Health:
    """The agent's latest report as the validation reads it (docs/agent.md report format)."""
    metrics = node.metrics if isinstance(node.metrics, dict) else {}
    gpus = reported_gpus(metrics)
    reported = metrics.get("collectors")
    collectors: dict[str, Any] = reported if isinstance(reported, dict) else {}
    gpu = collectors.get("gpu")
    gpu_collector = gpu.get("status") if isinstance(gpu, dict) else None
    count = metrics.get("gpu_count")
    return core.Health(
        report_s=epoch(node.last_heartbeat_at),
        gpu_count=count if isinstance(count, int) else None,
        gpu_driver_ok=None if gpu_collector in (None, "disabled", "skipped") else gpu_collector == "ok",
        remap_pending=tuple(g["index"] for g in gpus if g.get("row_remap_pending") and g["index"] is not None),
        lost_gpus=tuple(g["index"] for g in gpus if g.get("lost") and g["index"] is not None),
        gpus_unread=gpu_collector == "disabled",
    )


def finding_of(row: NodeFinding) -> core.Finding:
    return core.Finding(row.code, row.severity, row.device, epoch(row.first_seen_at) or 0.0, epoch(row.last_seen_at) or 0.0,
                        dict(row.evidence or {}), row.action, epoch(row.cleared_at))


DIAG_ACTION = "gpu_diag"  # the agent's order that runs dcgmi diag (docs/agent.md)


class Notices:
    """The repair loop's notices through the central notifier: outbox rows written by
    ``dlts.services.notify.enqueue`` in the caller's transaction (so a notice exists exactly when the
    decision commits), sent later by ``managers.notify``. ``enabled`` False (``repair.notify: false``):
    notices are only logged."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def to_admins(self, session: Session, template: str, context: dict[str, Any], dedup_key: str) -> None:
        log.info("repair notice %s: node %s: %s", template, context.get("node"), context.get("reason"))
        if self.enabled:
            notify.enqueue(session, template=template, to=notify.cluster_admin_emails(session), context=context,
                           dedup_key=dedup_key)

    def to_job(self, session: Session, job: Job, context: dict[str, Any], dedup_key: str) -> None:
        log.info("repair notice job_stopped_for_repair: job %s: %s", job.id, context.get("message"))
        if self.enabled:
            notify.enqueue(session, template="job_stopped_for_repair", to=notify.job_notice_emails(session, job),
                           context=context, dedup_key=dedup_key)


@dataclass
class TickResult:
    decisions: dict[str, core.Decision] = field(default_factory=dict)  # node -> what was decided (applied or not)
    applied: list[str] = field(default_factory=list)  # nodes whose decision was committed
    failed: list[str] = field(default_factory=list)


class RepairManager:
    def __init__(self, session_factory: Callable[[], Session], settings: Settings, *,
                 clock: Callable[[], float] = time.time, rules: RuleBook | None = None,
                 fail_after: Callable[[str, str], None] | None = None):
        self.session_factory = session_factory
        self.settings = settings
        self.repair = settings.repair
        self.clock = clock
        self.rules = rules if rules is not None else load_rulebook(self.repair.rules_file)
        self.notices = Notices(self.repair.notify)
        self.lost_after_s = self.repair.lost_after(settings.node_lost_after_s)
        # tests: called as (node, effect) before each effect is written, to crash a tick anywhere
        self.fail_after = fail_after

    # -- the tick ---------------------------------------------------------------------------------
    def run_once(self) -> TickResult:
        result = TickResult()
        if not self.repair.enabled:
            return result
        session = self.session_factory()
        try:
            self._tick(session, result)
        finally:
            session.close()
        return result

    def _tick(self, session: Session, result: TickResult) -> None:
        now_s = self.clock()
        nodes = list(session.scalars(sa.select(Node).order_by(Node.name).execution_options(populate_existing=True)))
        if not nodes:
            return
        paused_all = repo.paused_globally(session) is not None
        cycles = {c.node_id: c for c in session.scalars(sa.select(RepairCycle).where(RepairCycle.open_node_id.isnot(None)))}
        window_start = from_epoch(now_s - self.repair.validation_timeout_s - self.repair.quiet_period_s - 3600)
        findings: dict[int, list[NodeFinding]] = {}
        for row in session.scalars(sa.select(NodeFinding).where(sa.or_(NodeFinding.cleared_at.is_(None),
                                                                       NodeFinding.cleared_at >= window_start))):
            findings.setdefault(row.node_id, []).append(row)
        jobs = repo.active_attempts_on(session)
        last_returns = self._last_returns(session, now_s)
        sku_size: dict[str, int] = {}
        for n in nodes:
            sku_size[n.sku] = sku_size.get(n.sku, 0) + 1
        in_repair = {n.id: core.counts_against_budget(n.state, n.repair_scope) for n in nodes}

        def budget_free(node: Node) -> bool:
            used = sum(1 for other in nodes if other.sku == node.sku and in_repair[other.id])
            return used < self.repair.budget_for(sku_size[node.sku])

        # Every node but the queue first (returns free budget; new quarantines join the queue),
        # then the quarantined ones in admission order (most severe, then longest waiting).
        for node in nodes:
            if node.state is not N.QUARANTINED:
                self._node_steps(session, node, cycles.get(node.id), findings.get(node.id, []), jobs.get(node.name, []),
                                 last_returns.get(node.id), paused_all, now_s, budget_free, in_repair, result,
                                 until_queued=True)
        queue = [(n, c) for n in nodes if n.state is N.QUARANTINED and (c := repo.open_cycle(session, n.id)) is not None]
        for node, _cycle in sorted(queue, key=lambda q: queue_key(q[1])):
            self._node_steps(session, node, None, None, [], last_returns.get(node.id), paused_all, now_s, budget_free,
                             in_repair, result)

    def _node_steps(self, session: Session, node: Node, cycle: RepairCycle | None, rows: list[NodeFinding] | None,
                    on_node: list, last_return: core.LastReturn | None, paused_all: bool, now_s: float,
                    budget_free: Callable[[Node], bool], in_repair: dict[int, bool], result: TickResult,
                    until_queued: bool = False) -> None:
        """Decide and apply, again while the node moves on (drained, ordered, ...), up to
        MAX_STEPS_PER_TICK; ``until_queued``: stop when it joins the queue (admitted later, in order)."""
        if rows is None:
            cycle, rows, on_node = self._reload(session, node, now_s)
        for _ in range(MAX_STEPS_PER_TICK):
            view = self._view(session, node, cycle, rows, on_node, last_return, paused_all)
            ctx = core.Context(now=now_s, rules=self.rules, settings=self.repair, lost_after_s=self.lost_after_s,
                               budget_free=budget_free(node))
            decision = core.decide(view, ctx)
            result.decisions[node.name] = decision
            if not decision.changes_anything:
                break
            if self.repair.dry_run:
                self._dry_run(session, node, decision)
                break
            try:
                applied = self._apply(session, node, cycle, view, decision, now_s, on_node)
            except LeaseLost:  # another managers process acts now: stop this pass, nothing written (rolled back)
                raise
            except Exception:  # the step rolled back
                result.failed.append(node.name)
                log.exception("repair: node %s: applying %s failed; the next tick retries", node.name, decision.reason)
                if self.fail_after is not None:
                    raise
                break
            if not applied:
                break
            result.applied.append(node.name)
            in_repair[node.id] = core.counts_against_budget(node.state, node.repair_scope)
            if until_queued and node.state is N.QUARANTINED:
                break
            # the next step may follow at once (drained, ordered, ...): this node's rows again
            cycle, rows, on_node = self._reload(session, node, now_s)

    def _reload(self, session: Session, node: Node, now_s: float) -> tuple[RepairCycle | None, list[NodeFinding], list]:
        session.refresh(node)
        cycle = repo.open_cycle(session, node.id)
        window_start = from_epoch(now_s - self.repair.validation_timeout_s - self.repair.quiet_period_s - 3600)
        rows = list(session.scalars(sa.select(NodeFinding).where(
            NodeFinding.node_id == node.id,
            sa.or_(NodeFinding.cleared_at.is_(None), NodeFinding.cleared_at >= window_start))))
        return cycle, rows, repo.active_attempts_on(session, [node.name]).get(node.name, [])

    def _last_returns(self, session: Session, now_s: float) -> dict[int, core.LastReturn]:
        since = from_epoch(now_s - self.repair.flap_window_s)
        out: dict[int, core.LastReturn] = {}
        for c in session.scalars(sa.select(RepairCycle).where(RepairCycle.outcome == core.CycleOutcome.RETURNED,
                                                              RepairCycle.ended_at >= since,
                                                              RepairCycle.kind != core.CycleKind.RETURN).order_by(RepairCycle.id)):
            out[c.node_id] = core.LastReturn(epoch(c.ended_at) or 0.0, c.step_index, repo.steps_of(c), Scope(c.scope),
                                             tuple(c.gpus or []))
        return out

    def _view(self, session: Session, node: Node, cycle: RepairCycle | None, rows: list[NodeFinding], jobs: list,
              last_return: core.LastReturn | None, paused_all: bool) -> core.NodeView:
        since = epoch(cycle.validation_since) if cycle is not None else None
        found = tuple(finding_of(r) for r in rows
                      if r.cleared_at is None or (since is not None and (epoch(r.cleared_at) or 0.0) >= since))
        on_node = tuple(core.JobOnNode(job.id, tuple(p.get("gpu_indices") or ()), job.preemptible,
                                       job.type == JobType.DISTRIBUTED or job.nodes > 0,
                                       attempt.stop_requested is not None or job.status in (JobStatus.KILLING, JobStatus.PAUSING))
                        for job, attempt, p in jobs)
        return core.NodeView(node.name, node.sku, node.gpus, node.state, epoch(node.state_changed_at or node.created_at) or 0.0,
                             findings=found, jobs=on_node, health=health_of(node), has_agent=node.last_heartbeat_at is not None,
                             paused=paused_all or node.repair_paused, cycle=self._cycle_view(session, cycle) if cycle else None,
                             last_return=last_return)

    def _cycle_view(self, session: Session, cycle: RepairCycle) -> core.Cycle:
        run = None
        step = repo.current_step(session, cycle)
        if step is not None:
            orders = list(session.scalars(sa.select(NodeOrder).where(NodeOrder.id.in_([int(i) for i in step.order_ids or []]))
                                          .order_by(NodeOrder.id).execution_options(populate_existing=True)))
            messages = tuple(str(((o.result or {}).get("agent") or {}).get("message") or "") for o in orders)
            run = core.StepRun(step.number, Remediation(step.remediation), epoch(step.started_at) or 0.0,
                               epoch(step.deadline_at) or 0.0, tuple(o.status for o in orders), messages)
        return core.Cycle(cycle.id, Scope(cycle.scope), tuple(cycle.gpus or []), repo.steps_of(cycle), cycle.step_index,
                          cycle.severity, cycle.problem, epoch(cycle.started_at) or 0.0, run, epoch(cycle.validation_since),
                          cycle.kind, self._diag_view(session, cycle))

    @staticmethod
    def _diag_view(session: Session, cycle: RepairCycle) -> core.DiagRun | None:
        """The GPU diagnostic ordered for this cycle's current validation (the latest since it began)."""
        if cycle.validation_since is None:
            return None
        order = session.scalar(sa.select(NodeOrder).where(
            NodeOrder.node_id == cycle.node_id, NodeOrder.action == DIAG_ACTION, NodeOrder.created_by == ACTOR,
            NodeOrder.created_at >= cycle.validation_since).order_by(NodeOrder.id.desc()).limit(1)
            .execution_options(populate_existing=True))
        if order is None:
            return None
        agent = (order.result or {}).get("agent") or {}
        return core.DiagRun(epoch(order.created_at) or 0.0, order.status, str(agent.get("status") or ""),
                            str(agent.get("message") or "")[:1000])

    # -- effects ----------------------------------------------------------------------------------
    def _check(self, node: Node, effect: str) -> None:
        if self.fail_after is not None:
            self.fail_after(node.name, effect)

    def _apply(self, session: Session, node: Node, cycle: RepairCycle | None, view: core.NodeView, d: core.Decision,
               now_s: float, jobs: list) -> bool:
        """One decision in the rows, in one step: committed, or rolled back (False: a row had changed
        meanwhile; an exception: raised)."""
        before = node.state
        with transaction.step(session):
            if not self._apply_rows(session, node, cycle, view, d, now_s, jobs):
                return False
        log.info("repair: node %s: %s%s: %s", node.name, before.value,
                 f" -> {d.to_state.value}" if d.to_state else "", d.message or d.reason or d.waiting)
        return True

    def _apply_rows(self, session: Session, node: Node, cycle: RepairCycle | None, view: core.NodeView,
                    d: core.Decision, now_s: float, jobs: list) -> bool:
        now = from_epoch(now_s)
        before = node.state
        if d.record_heartbeat_lost:
            self._check(node, "heartbeat_lost")
            self._heartbeat_lost_finding(session, node, now, now_s)
        if d.end_step is not None and cycle is not None:
            self._check(node, "end_step")
            step = repo.current_step(session, cycle)
            if step is not None:
                step.ended_at, step.result, step.message = now, d.end_step[0], d.end_step[1][:1024]
                repo.cancel_orders(session, step.order_ids, now)
        if d.open_cycle is not None:
            self._check(node, "open_cycle")
            plan = d.open_cycle
            triggers = [{"code": f.code, "severity": f.severity, "device": f.device,
                         "message": str(f.evidence.get("message") or "")[:300]} for f in plan.triggers]
            if cycle is not None and d.end_cycle:  # a new cycle replaces an open one: the old one ends first
                repo.end_cycle(session, cycle, d.end_cycle, d.message, now)
                session.flush()
            assert d.to_state is not None  # every decision that opens a cycle moves the node
            try:
                cycle = repo.start_cycle(session, node, kind=plan.kind, scope=plan.scope.value, gpus=list(plan.gpus),
                                         steps=plan.steps, step_index=plan.step_index, severity=plan.severity,
                                         problem=plan.problem, rule_key=plan.rule_key, triggers=triggers, actor=ACTOR,
                                         to_state=d.to_state, reason=d.reason, message=d.message, flap=plan.flap, now=now,
                                         validation_since=now if d.begin_validation else None)
            except IntegrityError:
                cycle = None
            if cycle is None:
                transaction.discard(session)
                return False
        elif d.to_state is not None:
            self._check(node, "transition")
            values: dict[str, Any] = {}
            if d.to_state is N.IN_SERVICE:
                values = {"repair_scope": None, "unhealthy_gpus": []}
            elif d.widen_to_node or d.to_state is N.LOST:
                values = {"repair_scope": Scope.NODE.value}
            if not repo.set_state(session, node, d.to_state, actor=ACTOR, reason=d.reason, message=d.message,
                                  cycle_id=cycle.id if cycle else None, values=values, now=now):
                transaction.discard(session)
                return False
        if cycle is not None and cycle.open_node_id is not None:
            if d.to_state is not None:
                cycle.state = d.to_state.value
            if before is N.QUARANTINED and d.to_state is N.DRAINING:
                cycle.queued_until = now
            if d.widen_to_node:
                cycle.scope = Scope.NODE.value
            if d.advance_to is not None:
                cycle.step_index = d.advance_to
                if d.to_state is None:
                    repo.add_event(session, node.id, NodeEventKind.STEP, actor=ACTOR, reason=d.reason, message=d.message,
                                   cycle_id=cycle.id, at=now)
            if d.begin_validation and d.open_cycle is None:
                cycle.validation_since = now
            if d.end_cycle is not None and d.open_cycle is None:  # (with a new cycle: the old one ended above)
                repo.end_cycle(session, cycle, d.end_cycle, d.message, now)
        if d.stop_jobs:
            self._check(node, "stop_jobs")
            self._stop_jobs(session, node, cycle, d, jobs, now)
        if d.start_step is not None and cycle is not None:
            self._check(node, "start_step")
            self._start_step(session, node, cycle, d.start_step, now, now_s)
        if d.order_diag and cycle is not None:
            self._check(node, "order_diag")
            self._order_diag(session, node, cycle, now)
        if before is N.VALIDATING and (d.to_state not in (None, N.VALIDATING) or d.advance_to is not None) \
                and view.cycle is not None and view.cycle.diag is not None:
            # the validation is over (passed, escalated, timed out): an unfinished diagnostic is not sent again
            repo.cancel_orders(session, self._open_diag_ids(session, node), now)
        for template in d.notices:
            self._check(node, "notice")
            self._notice(session, node, cycle, d, template)
        self._check(node, "commit")
        return True

    def _heartbeat_lost_finding(self, session: Session, node: Node, now: dt.datetime, now_s: float) -> None:
        exists = session.scalar(sa.select(NodeFinding.id).where(NodeFinding.node_id == node.id, NodeFinding.code == HEARTBEAT_LOST,
                                                                NodeFinding.cleared_at.is_(None)))
        if exists is None:
            age = now_s - (epoch(node.last_heartbeat_at) or now_s)
            session.add(NodeFinding(node_id=node.id, code=HEARTBEAT_LOST, severity="critical", device="node",
                                    evidence={"message": f"no report for {age:.0f} s", "last_heartbeat_at":
                                              node.last_heartbeat_at.isoformat() if node.last_heartbeat_at else None,
                                              "lost_after_s": self.lost_after_s},
                                    action="investigate", first_seen_at=now, last_seen_at=now))

    def _stop_jobs(self, session: Session, node: Node, cycle: RepairCycle | None, d: core.Decision, jobs: list,
                   now: dt.datetime) -> None:
        wanted = set(d.stop_jobs)
        problem = cycle.problem if cycle is not None and d.stop_reason == EndReason.NODE_REPAIR else "stopped reporting"
        message = (f"node {node.name} {problem}; your job was stopped and requeued at the head of its queue "
                   "(no retry spent)")
        stopped = []
        for job, attempt, _placement in jobs:
            if job.id not in wanted or attempt.stop_requested is not None:
                continue
            attempt.stop_requested = d.stop_reason
            job_repo.add_event(session, job.id, EventKind.REPAIR, reason=d.stop_reason, actor=ACTOR, message=message)
            self.notices.to_job(session, job, {"job_id": job.id, "job_name": job.name, "vc": job.vc.name, "user": job.user.name,
                                               "message": message, "node": node.name, "cycle_id": cycle.id if cycle else None},
                                dedup_key=f"repair:job:{job.id}:{job.attempt}")
            stopped.append(job.id)
        if stopped:
            repo.add_event(session, node.id, NodeEventKind.STEP, actor=ACTOR, reason=d.stop_reason,
                           message=f"stopping job(s) {', '.join(map(str, stopped))} (requeued at the head of their queues)",
                           cycle_id=cycle.id if cycle else None, at=now)

    def _start_step(self, session: Session, node: Node, cycle: RepairCycle, index: int, now: dt.datetime, now_s: float) -> None:
        step = repo.steps_of(cycle)[index]
        if step.remediation is Remediation.RESET_GPU:
            targets = [str(g) for g in cycle.gpus or []] or [str(g) for g in range(node.gpus)]
        elif step.remediation is Remediation.RESTART_SERVICE:
            targets = [step.target]
        else:
            targets = [""]
        why = f"repair {cycle.id}: {cycle.problem}"[:500]
        orders = [NodeOrder(node_id=node.id, action=step.remediation.value, target=t or None, dry_run=False,
                            status=core.OrderStatus.PENDING, result={"reason": why}, created_by=ACTOR, created_at=now)
                  for t in targets]
        session.add_all(orders)
        session.flush()
        session.add(RepairStep(cycle_id=cycle.id, number=index, remediation=step.remediation.value,
                               target=", ".join(t for t in targets if t) or None, order_ids=[o.id for o in orders],
                               started_at=now, deadline_at=from_epoch(now_s + step.timeout_s)))
        session.flush()  # the unique (cycle, number) refuses a second start of the same step
        what = step.remediation.value + (f" of GPU {', '.join(targets)}" if step.remediation is Remediation.RESET_GPU else
                                         f" {step.target}" if step.target else "")
        repo.add_event(session, node.id, NodeEventKind.STEP, actor=ACTOR, reason="ordered",
                       message=f"ordered {what} (order {', '.join(str(o.id) for o in orders)}; "
                               f"timeout {step.timeout_s:g} s)", cycle_id=cycle.id, at=now)

    @staticmethod
    def _open_diag_ids(session: Session, node: Node) -> list[int]:
        return list(session.scalars(sa.select(NodeOrder.id).where(
            NodeOrder.node_id == node.id, NodeOrder.action == DIAG_ACTION, NodeOrder.created_by == ACTOR,
            NodeOrder.status.in_(core.OPEN_ORDER))))

    def _order_diag(self, session: Session, node: Node, cycle: RepairCycle, now: dt.datetime) -> None:
        """``dcgmi diag`` on the repaired GPUs (a GPU-scope cycle: its GPUs; the others keep serving
        jobs), or on every GPU of a drained node."""
        gpus = [str(g) for g in cycle.gpus or []] if cycle.scope == Scope.GPU.value else []
        target = f"{self.repair.validation_diag_level}" + (f":{','.join(gpus)}" if gpus else "")
        order = NodeOrder(node_id=node.id, action=DIAG_ACTION, target=target, dry_run=False, status=core.OrderStatus.PENDING,
                          result={"reason": f"repair {cycle.id}: validation"}, created_by=ACTOR, created_at=now)
        session.add(order)
        session.flush()
        where = f"GPU {', '.join(gpus)}" if gpus else "every GPU"
        repo.add_event(session, node.id, NodeEventKind.STEP, actor=ACTOR, reason="diag_ordered",
                       message=f"ordered the GPU diagnostic (dcgmi diag -r {self.repair.validation_diag_level}) on {where} "
                               f"(order {order.id}; timeout {self.repair.validation_diag_timeout_s:g} s)",
                       cycle_id=cycle.id, at=now)

    def _notice(self, session: Session, node: Node, cycle: RepairCycle | None, d: core.Decision, template: str) -> None:
        steps = cycle.steps if cycle is not None else []
        index = d.advance_to if d.advance_to is not None else (cycle.step_index if cycle is not None else 0)
        step = steps[index]["remediation"] if cycle is not None and index < len(steps) else None
        context = {"node": node.name, "reason": d.message, "state": node.state.value, "step": step,
                   "cycle_id": cycle.id if cycle else None,
                   "findings": [f"{t['code']} ({t['severity']}) on {t['device'] or 'node'}" for t in (cycle.triggers if cycle else [])]}
        key = f"repair:{node.name}:{cycle.id if cycle else 0}:{template}:{node.state.value}:{index}"
        self.notices.to_admins(session, template, context, key)

    def _dry_run(self, session: Session, node: Node, d: core.Decision) -> None:
        what = []
        if d.to_state is not None:
            what.append(f"{node.state.value} -> {d.to_state.value}")
        if d.stop_jobs:
            what.append(f"stop job(s) {', '.join(map(str, d.stop_jobs))}")
        if d.start_step is not None:
            what.append(f"start step {d.start_step}")
        if d.open_cycle is not None:
            what.append("chain " + " -> ".join(s.describe() for s in d.open_cycle.steps[d.open_cycle.step_index:]))
        message = f"dry run: would {'; '.join(what)} ({d.reason}: {d.message})"[:1024]
        last = session.scalar(sa.select(NodeEvent.message).where(NodeEvent.node_id == node.id, NodeEvent.kind == NodeEventKind.DRY_RUN)
                              .order_by(NodeEvent.id.desc()).limit(1))
        if last != message:
            with transaction.step(session):
                repo.add_event(session, node.id, NodeEventKind.DRY_RUN, actor=ACTOR, reason=d.reason, message=message)
