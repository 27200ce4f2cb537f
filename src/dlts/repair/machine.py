"""The node state machine: one transition table and one pure decision per node and tick.

``decide(node, ctx)`` reads a frozen view of one node (state, open findings, the jobs on it, its
last report, the open repair cycle) and returns what should happen next: a state change with a
reason, and the effects that go with it (open a cycle, stop jobs, start a remediation step, end a
step or the cycle, notices). The impure shell (``dlts.managers.repair``) applies a decision in one
transaction guarded by a compare-and-set on the node's state, so a crash anywhere leaves either
the old state (the next tick decides again, the same way) or the new one.

States (docs/repair.md):

    in_service -> quarantined -> draining -> remediating -> validating -> in_service
                                                 |  ^            |
                                                 |  +-- next step (escalation) <-+
                                                 +-> out_of_service | rma          (only a human clears)
    lost: the agent stopped reporting; it returns through validating when it reports again.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from dlts.repair.rules import (
    HEARTBEAT_LOST,
    SEVERITY_RANK,
    Remediation,
    Rule,
    RuleBook,
    Scope,
    Step,
)
from dlts.repair.settings import RepairSettings
from dlts.strict import is_whole_number

MAX_GPU_INDEX = 1023


class NodeState(str, enum.Enum):
    IN_SERVICE = "in_service"
    QUARANTINED = "quarantined"  # cordoned by DLTS; waits for the budget, then drains
    DRAINING = "draining"  # its jobs (or the faulty GPUs' jobs) are being stopped and requeued
    REMEDIATING = "remediating"  # an order to the agent is in flight
    VALIDATING = "validating"  # waiting for a healthy report after the quiet period
    OUT_OF_SERVICE = "out_of_service"  # needs a human (ticket); returned with `dlts node return`
    RMA = "rma"  # hardware to be replaced; returned with `dlts node return`
    LOST = "lost"  # no heartbeat for lost_after_s


class OrderStatus(enum.StrEnum):
    """Where an order to a node's agent stands (``node_orders.status``)."""

    PENDING = "pending"  # written, not yet handed to the agent
    SENT = "sent"  # in a heartbeat answer; the agent is carrying it out
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


OPEN_ORDER = (OrderStatus.PENDING, OrderStatus.SENT)


class CycleKind(enum.StrEnum):
    RULE = "rule"  # a finding matched a rule
    MANUAL = "manual"  # an operator started it (POST /nodes/{name}/repairs)
    RETURN = "return"  # a human's return or a lost node back: validate only


class CycleOutcome(enum.StrEnum):
    """How a repair cycle ended (``repair_cycles.outcome``)."""

    RETURNED = "returned"
    OUT_OF_SERVICE = "out_of_service"
    RMA = "rma"
    LOST = "lost"
    CANCELLED = "cancelled"
    FAULT = "fault"  # a node back from lost showed a fault while validating: a rule's cycle replaces it


class StepResult(enum.StrEnum):
    """How a remediation step ended (``repair_steps.result``)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


N = NodeState
# from -> allowed targets; every state write goes through this table (compare-and-set)
TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    N.IN_SERVICE: frozenset({N.QUARANTINED, N.LOST}),
    N.QUARANTINED: frozenset({N.DRAINING, N.IN_SERVICE, N.LOST}),
    N.DRAINING: frozenset({N.REMEDIATING, N.IN_SERVICE, N.LOST}),
    # remediating -> draining: the next step needs the whole node (a GPU fault escalated to a reboot)
    N.REMEDIATING: frozenset({N.VALIDATING, N.DRAINING, N.OUT_OF_SERVICE, N.RMA, N.IN_SERVICE, N.LOST}),
    # -> quarantined: a node back from lost shows a fault during validation: its rule's chain
    N.VALIDATING: frozenset({N.IN_SERVICE, N.REMEDIATING, N.OUT_OF_SERVICE, N.LOST, N.QUARANTINED}),
    N.OUT_OF_SERVICE: frozenset({N.VALIDATING, N.RMA}),
    N.RMA: frozenset({N.VALIDATING, N.OUT_OF_SERVICE}),
    N.LOST: frozenset({N.VALIDATING, N.QUARANTINED}),  # quarantined: it reports again with a fault
}
# a cycle is open in these states
IN_REPAIR = frozenset({N.QUARANTINED, N.DRAINING, N.REMEDIATING, N.VALIDATING})
# taken out of service through the budget (quarantined nodes wait for it)
COUNTS_AGAINST_BUDGET = frozenset({N.DRAINING, N.REMEDIATING, N.VALIDATING})
# where a node-scope repair keeps counting: a human has to look at it first
HELD_FOR_HUMAN = frozenset({N.OUT_OF_SERVICE, N.RMA})
# states in which a GPU-scope repair leaves the node serving with its other GPUs
GPU_SCOPE_SERVING = IN_REPAIR | HELD_FOR_HUMAN
# a silent agent is acted on in these (remediating waits for its step's deadline: a reboot is silent)
LOST_CHECKED = frozenset({N.IN_SERVICE, N.QUARANTINED, N.DRAINING, N.VALIDATING})
STEP_RANK = {Remediation.RESET_GPU: 0, Remediation.RESTART_SERVICE: 1, Remediation.REBOOT: 2,
             Remediation.TICKET: 3, Remediation.RMA: 4}


def allowed(current: NodeState, target: NodeState) -> bool:
    return target in TRANSITIONS[current]


def counts_against_budget(state: NodeState, scope: str | None) -> bool:
    return state in COUNTS_AGAINST_BUDGET or (state in HELD_FOR_HUMAN and scope != Scope.GPU.value)


def schedulable(state: NodeState, scope: str | None) -> bool:
    """May the scheduler place new work on the node (its healthy GPUs, for a GPU-scope repair)?"""
    return state is N.IN_SERVICE or (scope == Scope.GPU.value and state in GPU_SCOPE_SERVING)


def gpu_index(device: str | None) -> int | None:
    """The agent names GPUs "gpu3"; anything else ("gpu²", a 30-digit index) is not one GPU."""
    if device and device.startswith("gpu") and is_whole_number(device[3:], max_value=MAX_GPU_INDEX):
        return int(device[3:])
    return None


# -- the view of one node ------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str
    device: str | None
    first_seen_s: float
    last_seen_s: float
    evidence: Mapping = field(default_factory=dict)
    action: str | None = None
    cleared_s: float | None = None  # None: still open

    @property
    def gpu(self) -> int | None:
        return gpu_index(self.device)

    def describe(self) -> str:
        return f"{self.code} ({self.severity}) on {self.device or 'node'}"


@dataclass(frozen=True)
class JobOnNode:
    job_id: int
    gpu_indices: tuple[int, ...]
    preemptible: bool
    whole_node: bool  # a distributed job: it leaves with the node whatever the fault
    stopping: bool  # already asked to stop (by a repair, a kill, a preemption) or on its way out


@dataclass(frozen=True)
class Health:
    """The agent's latest report (None fields: not reported)."""

    report_s: float | None = None
    gpu_count: int | None = None
    gpu_driver_ok: bool | None = None
    remap_pending: tuple[int, ...] = ()
    lost_gpus: tuple[int, ...] = ()
    # its GPU collector is switched off (collectors.gpu.enabled: false; the demo's agent for pretend
    # GPUs): the agent reads no GPU, and rejects a GPU diagnostic ("no current GPU reading")
    gpus_unread: bool = False


@dataclass(frozen=True)
class StepRun:
    index: int
    remediation: Remediation
    started_s: float
    deadline_s: float
    order_statuses: tuple[str, ...] = ()  # OrderStatus values
    order_messages: tuple[str, ...] = ()


@dataclass(frozen=True)
class DiagRun:
    """The validation's GPU diagnostic order (``gpu_diag``), from when it was ordered."""

    ordered_s: float
    status: str  # the order's (an OrderStatus value)
    agent_status: str = ""  # the agent's: succeeded | failed | rejected | skipped (dcgmi not installed)
    message: str = ""


@dataclass(frozen=True)
class Cycle:
    id: int
    scope: Scope
    gpus: tuple[int, ...]
    steps: tuple[Step, ...]
    step_index: int
    severity: str
    problem: str
    started_s: float
    step: StepRun | None = None  # the current step, while it runs
    validation_since_s: float | None = None
    kind: str = CycleKind.RULE
    diag: DiagRun | None = None  # this validation's GPU diagnostic, once ordered


@dataclass(frozen=True)
class LastReturn:
    """The node's previous cycle that ended with a return to service."""

    returned_s: float
    step_index: int
    steps: tuple[Step, ...]
    scope: Scope
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class NodeView:
    name: str
    sku: str
    gpus: int
    state: NodeState
    state_since_s: float
    findings: tuple[Finding, ...] = ()  # open, plus those cleared since the cycle's validation began
    jobs: tuple[JobOnNode, ...] = ()
    health: Health = Health()
    has_agent: bool = True
    paused: bool = False  # this node's pause, or the global one
    cycle: Cycle | None = None
    last_return: LastReturn | None = None


@dataclass(frozen=True)
class Context:
    now: float
    rules: RuleBook
    settings: RepairSettings
    lost_after_s: float
    budget_free: bool = True  # may this node leave service now (the shell counts its SKU)


# -- what to do -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpenCycle:
    scope: Scope
    gpus: tuple[int, ...]
    steps: tuple[Step, ...]
    step_index: int
    severity: str
    problem: str
    rule_key: str
    triggers: tuple[Finding, ...]
    kind: str = "rule"
    flap: bool = False


@dataclass(frozen=True)
class Decision:
    to_state: NodeState | None = None  # None: stay (effects may still apply)
    reason: str = ""  # short code for the event: findings, budget, drained, order_done, ...
    message: str = ""
    open_cycle: OpenCycle | None = None
    stop_jobs: tuple[int, ...] = ()
    stop_reason: str = "node_repair"  # node_repair | node_lost
    start_step: int | None = None  # the step index whose orders to create now
    end_step: tuple[StepResult, str] | None = None  # (how the step ended, message)
    advance_to: int | None = None  # the cycle's next step index (escalation)
    widen_to_node: bool = False
    begin_validation: bool = False
    end_cycle: CycleOutcome | None = None
    notices: tuple[str, ...] = ()  # node_out_of_service | node_escalated | node_needs_human
    record_heartbeat_lost: bool = False
    order_diag: bool = False  # order the validation's GPU diagnostic (gpu_diag) now
    waiting: str = ""  # why nothing happens (budget, paused, quiet period, draining N jobs)

    @property
    def changes_anything(self) -> bool:
        return any((self.to_state, self.open_cycle, self.stop_jobs, self.start_step is not None, self.end_step,
                    self.advance_to is not None, self.widen_to_node, self.begin_validation, self.end_cycle,
                    self.record_heartbeat_lost, self.order_diag))


STAY = Decision()


def actionable(node: NodeView, ctx: Context, *, hold_down: bool = True) -> list[tuple[Finding, Rule]]:
    """Open findings a rule acts on (that persisted for its ``for_s`` when ``hold_down``)."""
    out = []
    for f in node.findings:
        if f.cleared_s is not None:
            continue
        rule = ctx.rules.match(node.sku, f.code, f.severity, f.evidence, f.action)
        if rule is None:
            continue
        if hold_down and ctx.now - f.first_seen_s < rule.for_s:
            continue
        out.append((f, rule))
    return out


def reported_since(report_s: float | None, since_s: float) -> bool:
    """Has the agent reported after ``since_s`` (a lost node's: since it went lost)?"""
    return report_s is not None and report_s > since_s


def agent_lost(state: NodeState, report_s: float | None, state_since_s: float, now: float, lost_after_s: float) -> bool:
    """THE rule of a lost node, which ``decide`` acts on and the API shows (services/nodes.py):
    a ``lost`` node whose agent has not reported since it went lost; or a node in a state where
    silence is acted on (``LOST_CHECKED``) whose agent, having reported before, has been silent
    for more than ``lost_after_s`` (the repair manager marks it lost at its next pass). A node
    whose agent never reported cannot go silent; a remediating one may be silent (a reboot)."""
    if state is N.LOST:
        return not reported_since(report_s, state_since_s)
    return state in LOST_CHECKED and report_s is not None and now - report_s > lost_after_s


def _heartbeat_lost(node: NodeView, ctx: Context) -> bool:
    if not node.has_agent:
        return False  # a node without an agent cannot go silent
    return agent_lost(node.state, node.health.report_s, node.state_since_s, ctx.now, ctx.lost_after_s)


def _go_lost(node: NodeView, ctx: Context) -> Decision:
    age = ctx.now - (node.health.report_s or ctx.now)
    return Decision(
        N.LOST, HEARTBEAT_LOST, f"no report from the agent for {age:.0f} s (lost after {ctx.lost_after_s:g} s)",
        stop_jobs=tuple(j.job_id for j in node.jobs if not j.stopping), stop_reason="node_lost",
        end_cycle=CycleOutcome.LOST if node.cycle is not None else None, record_heartbeat_lost=True,
        notices=("node_out_of_service",))


def _plan(node: NodeView, ctx: Context, found: list[tuple[Finding, Rule]]) -> OpenCycle:
    worst = max(SEVERITY_RANK[f.severity] for f, _ in found)
    top = [(f, r) for f, r in found if SEVERITY_RANK[f.severity] == worst]
    finding, rule = max(top, key=lambda fr: (STEP_RANK[fr[1].steps[0].remediation], fr[1].scope is Scope.NODE))
    node_scope = any(r.scope is Scope.NODE or f.gpu is None for f, r in found)
    scope = Scope.NODE if node_scope else Scope.GPU
    gpus = tuple(sorted({f.gpu for f, _ in found if f.gpu is not None})) if scope is Scope.GPU else ()
    start, flap = 0, False
    last = node.last_return
    if last is not None and ctx.now - last.returned_s <= ctx.settings.flap_window_s and (
            scope is Scope.NODE or last.scope is Scope.NODE or set(gpus) & set(last.gpus)):
        flap = True
        start = last.step_index + 1 if last.steps == rule.steps else 1
    where = f"GPU {', '.join(map(str, gpus))}" if gpus else ""
    problem = f"{where} {rule.problem or 'has a fault (' + finding.code + ')'}".strip()
    return OpenCycle(scope, gpus, rule.steps, start, SEVERITIES_BY_RANK[worst], problem, rule.key,
                     tuple(f for f, _ in found), flap=flap)


SEVERITIES_BY_RANK = {rank: name for name, rank in SEVERITY_RANK.items()}


def _targets(node: NodeView) -> list[JobOnNode]:
    cycle = node.cycle
    if cycle is None or cycle.scope is Scope.NODE:
        return list(node.jobs)
    bad = set(cycle.gpus)
    return [j for j in node.jobs if j.whole_node or bad & set(j.gpu_indices)]


def _escalate(node: NodeView, ctx: Context, why: str, end_step: tuple[StepResult, str] | None) -> Decision:
    cycle = node.cycle
    assert cycle is not None
    nxt = cycle.step_index + 1
    if cycle.kind == CycleKind.RETURN or nxt >= len(cycle.steps):
        return Decision(N.OUT_OF_SERVICE, "chain_exhausted", f"{why}; no remediation left: a human must look at it",
                        end_step=end_step, end_cycle=CycleOutcome.OUT_OF_SERVICE, notices=("node_needs_human",))
    target = N.REMEDIATING if node.state is not N.REMEDIATING else None
    return Decision(target, "escalated", f"{why}; next: {cycle.steps[nxt].describe()}", end_step=end_step,
                    advance_to=nxt, notices=("node_escalated",))


LOST_PROBLEM = "stopped reporting"  # the problem of the validate-only cycle of a node back from lost


def _quarantine_returning(node: NodeView, ctx: Context, why: str, stop_jobs: tuple[int, ...] = (),
                          end_cycle: CycleOutcome | None = None) -> Decision:
    """A node back from ``lost`` with a fault: quarantined into the chain of the fault's rule."""
    plan = _plan(node, ctx, actionable(node, ctx, hold_down=False))
    what = "; ".join(f.describe() for f in plan.triggers)
    return Decision(N.QUARANTINED, "findings", f"{why} {what}", open_cycle=plan, stop_jobs=stop_jobs,
                    stop_reason="node_lost", end_cycle=end_cycle, notices=("node_out_of_service",))


def decide(node: NodeView, ctx: Context) -> Decision:
    s = node.state
    if s in LOST_CHECKED and _heartbeat_lost(node, ctx):
        return _go_lost(node, ctx)
    if s is N.IN_SERVICE:
        found = actionable(node, ctx)
        if not found:
            return STAY
        if node.paused:
            return Decision(waiting="paused")
        plan = _plan(node, ctx, found)
        what = "; ".join(f.describe() for f in plan.triggers)
        flap = " (failed again soon after its last repair: escalated)" if plan.flap else ""
        return Decision(N.QUARANTINED, "findings", f"{what}{flap}", open_cycle=plan, notices=("node_out_of_service",))
    if s is N.LOST:
        if reported_since(node.health.report_s, node.state_since_s):
            remaining = tuple(j.job_id for j in node.jobs if not j.stopping)
            # back with a fault a rule acts on (no hold-down: a returning node must be clean): that
            # rule's chain, as for a node in service, instead of a validation bound to fail
            if actionable(node, ctx, hold_down=False):
                if node.paused:
                    return Decision(stop_jobs=remaining, stop_reason="node_lost", waiting="paused")
                return _quarantine_returning(node, ctx, "the agent reports again with", remaining)
            plan = OpenCycle(Scope.NODE, (), (), 0, "critical", LOST_PROBLEM, "lost", (), kind=CycleKind.RETURN)
            return Decision(N.VALIDATING, "reported_again", "the agent reports again; validating before return",
                            open_cycle=plan, begin_validation=True, stop_jobs=remaining, stop_reason="node_lost")
        remaining = tuple(j.job_id for j in node.jobs if not j.stopping)
        return Decision(stop_jobs=remaining, stop_reason="node_lost") if remaining else STAY
    if s in HELD_FOR_HUMAN:
        return STAY
    cycle = node.cycle
    if cycle is None:  # a repair state without a cycle (a cancelled cycle raced a tick): back to service
        return Decision(N.IN_SERVICE, "no_cycle", "no open repair cycle") if allowed(s, N.IN_SERVICE) else STAY
    if s is N.QUARANTINED:
        if node.paused:
            return Decision(waiting="paused")
        if not ctx.budget_free:
            return Decision(waiting="budget")
        return Decision(N.DRAINING, "admitted", f"draining for: {cycle.problem}")
    if s is N.DRAINING:
        targets = _targets(node)
        if not targets:
            return Decision(N.REMEDIATING, "drained", "no job left on the " +
                            ("node" if cycle.scope is Scope.NODE else f"GPU(s) {', '.join(map(str, cycle.gpus))}"))
        preemptible = [j for j in targets if j.preemptible]
        todo = [j for j in preemptible if not j.stopping] if preemptible else [j for j in targets if not j.stopping]
        if todo:
            return Decision(stop_jobs=tuple(j.job_id for j in todo), waiting=f"draining {len(targets)} job(s)")
        return Decision(waiting=f"draining {len(targets)} job(s)")
    if s is N.REMEDIATING:
        return _remediating(node, ctx, cycle)
    if s is N.VALIDATING:
        return _validating(node, ctx, cycle)
    return STAY


def _remediating(node: NodeView, ctx: Context, cycle: Cycle) -> Decision:
    run = cycle.step
    if run is None:
        if cycle.step_index >= len(cycle.steps):
            return Decision(N.OUT_OF_SERVICE, "chain_exhausted", "no remediation left: a human must look at it",
                            end_cycle=CycleOutcome.OUT_OF_SERVICE, notices=("node_needs_human",))
        step = cycle.steps[cycle.step_index]
        if step.remediation is Remediation.TICKET:
            return Decision(N.OUT_OF_SERVICE, "ticket", f"{cycle.problem}: a human must look at it",
                            end_cycle=CycleOutcome.OUT_OF_SERVICE, notices=("node_needs_human",))
        if step.remediation is Remediation.RMA:
            return Decision(N.RMA, "rma", f"{cycle.problem}: the hardware must be replaced (RMA)",
                            end_cycle=CycleOutcome.RMA, notices=("node_needs_human",))
        if node.paused:
            return Decision(waiting="paused")
        if step.remediation.needs_whole_node and cycle.scope is Scope.GPU:
            return Decision(N.DRAINING, "widened", f"{step.describe()} needs the whole node: draining it",
                            widen_to_node=True)
        return Decision(start_step=cycle.step_index, waiting=f"{step.describe()} ordered")
    statuses = run.order_statuses
    if statuses and all(st == OrderStatus.DONE for st in statuses):
        return Decision(N.VALIDATING, "remediated", f"{run.remediation.value} succeeded; validating",
                        end_step=(StepResult.SUCCEEDED, "; ".join(m for m in run.order_messages if m)), begin_validation=True)
    if any(st in (OrderStatus.FAILED, OrderStatus.CANCELLED) for st in statuses):
        why = f"{run.remediation.value} failed: " + "; ".join(m for m in run.order_messages if m)
        return _escalate(node, ctx, why.rstrip(": "), (StepResult.FAILED, why))
    if ctx.now >= run.deadline_s:
        why = f"{run.remediation.value} had no result after {run.deadline_s - run.started_s:g} s"
        return _escalate(node, ctx, why, (StepResult.TIMED_OUT, why))
    return Decision(waiting=f"{run.remediation.value} in progress")


def validation_problems(node: NodeView, ctx: Context, cycle: Cycle) -> list[str]:
    """Why the node may not return yet (empty: healthy). F3: GPU count, driver, remap pending 0,
    no new XID or ECC (or any finding a rule acts on) since the remediation."""
    since = cycle.validation_since_s or 0.0
    h = node.health
    targets = set(cycle.gpus) if cycle.scope is Scope.GPU else None
    problems = []
    if node.gpus > 0:
        if h.gpu_driver_ok is False:
            problems.append("the GPU driver does not answer (NVML)")
        if h.gpu_count is not None and h.gpu_count != node.gpus:
            problems.append(f"{h.gpu_count} of {node.gpus} GPUs visible")
        pending = [g for g in h.remap_pending if targets is None or g in targets]
        if pending:
            problems.append(f"row remap pending on GPU {', '.join(map(str, pending))}")
        lost = [g for g in h.lost_gpus if targets is None or g in targets]
        if lost:
            problems.append(f"GPU {', '.join(map(str, lost))} lost")
    for f in node.findings:
        if ctx.rules.match(node.sku, f.code, f.severity, f.evidence, f.action) is None:
            continue
        if targets is not None and f.gpu not in targets:
            continue
        still = f.cleared_s is None and f.last_seen_s >= since
        new = f.first_seen_s >= since
        if still or new:
            problems.append(f"{f.describe()} {'still present' if still else 'seen again'} since the remediation")
    return problems


def _validating(node: NodeView, ctx: Context, cycle: Cycle) -> Decision:
    since = cycle.validation_since_s if cycle.validation_since_s is not None else node.state_since_s
    due = since + ctx.settings.quiet_period_s
    report = node.health.report_s
    if report is None or report < due:
        if ctx.now - since > ctx.settings.validation_timeout_s:
            return _escalate(node, ctx, f"no report from the agent within {ctx.settings.validation_timeout_s:g} s", None)
        return Decision(waiting="quiet period")
    problems = validation_problems(node, ctx, cycle)
    if problems:
        if cycle.kind == CycleKind.RETURN and cycle.problem == LOST_PROBLEM and actionable(node, ctx, hold_down=False) \
                and not node.paused:
            # back from lost, and a fault a rule acts on showed up while it validated: that rule's chain
            return _quarantine_returning(node, ctx, "validation after lost found", end_cycle=CycleOutcome.FAULT)
        return _escalate(node, ctx, "validation failed: " + "; ".join(problems), None)
    diag = _diag_verdict(node, ctx, cycle)
    if isinstance(diag, Decision):
        return diag
    return Decision(N.IN_SERVICE, "validated", f"healthy after the quiet period{diag}: back in service",
                    end_cycle=CycleOutcome.RETURNED)


def _diag_verdict(node: NodeView, ctx: Context, cycle: Cycle) -> Decision | str:
    """The GPU diagnostic's part of the validation, once the report is healthy: order it, wait for
    it, or fail on it (a Decision); or what it adds to the return's message (a string)."""
    mode = ctx.settings.validation_diag
    if mode == "off" or node.gpus == 0:
        return ""
    run = cycle.diag
    if run is None and node.health.gpus_unread:  # an order its agent is bound to reject
        if mode == "required":
            return _escalate(node, ctx, "validation failed: the GPU diagnostic is required (repair.validation_diag) "
                                        "and the node's agent reads no GPUs (its gpu collector is disabled)", None)
        return " (its agent reads no GPUs: no GPU diagnostic)"
    if run is None:  # (part of the validation in flight: ordered while paused too)
        return Decision(order_diag=True, waiting="the GPU diagnostic is ordered")
    if run.status in OPEN_ORDER:
        if ctx.now - run.ordered_s > ctx.settings.validation_diag_timeout_s:
            return _escalate(node, ctx, f"validation failed: the GPU diagnostic had no result after "
                                        f"{ctx.settings.validation_diag_timeout_s:g} s", None)
        return Decision(waiting="the GPU diagnostic runs")
    if run.agent_status == "skipped":
        if mode == "required":
            return _escalate(node, ctx, "validation failed: the GPU diagnostic is required (repair.validation_diag) "
                                        f"and {run.message or 'dcgmi is not installed on the node'}", None)
        return " (dcgmi not installed: no GPU diagnostic)"
    if run.status == OrderStatus.DONE and run.agent_status == "succeeded":
        return f" and the GPU diagnostic passed ({run.message})" if run.message else " and the GPU diagnostic passed"
    return _escalate(node, ctx, f"validation failed: the GPU diagnostic: {run.message or run.agent_status or run.status}",
                     None)
