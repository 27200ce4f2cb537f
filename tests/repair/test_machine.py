"""The pure core: the rules table, the transition table and the decision per node, table-driven.
Cases are named by the behaviour they prove; views are built by small builders."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dlts.repair.machine import (
    TRANSITIONS,
    Context,
    Cycle,
    DiagRun,
    Finding,
    Health,
    JobOnNode,
    LastReturn,
    NodeView,
    StepRun,
    agent_lost,
    counts_against_budget,
    decide,
    schedulable,
)
from dlts.repair.machine import (
    NodeState as N,
)
from dlts.repair.rules import (
    DEFAULT_RULES,
    GPU_CHAIN,
    NODE_CHAIN,
    Remediation,
    RuleBook,
    RuleError,
    Scope,
    rulebook_from_mapping,
)
from dlts.repair.settings import RepairSettings

NOW = 1_000_000.0
# (the GPU diagnostic's part of the validation has tests of its own, at the end)
SETTINGS = RepairSettings(quiet_period_s=60, validation_timeout_s=900, flap_window_s=3600, validation_diag="off")


def ctx(**kw) -> Context:
    return Context(now=kw.pop("now", NOW), rules=kw.pop("rules", RuleBook()), settings=kw.pop("settings", SETTINGS),
                   lost_after_s=kw.pop("lost_after_s", 300.0), **kw)


def finding(code="gpu_ecc_uncorrected", severity="critical", device="gpu3", age_s=5.0, **kw) -> Finding:
    return Finding(code, severity, device, NOW - age_s, kw.pop("last_seen_s", NOW - 1), **kw)


def node(state=N.IN_SERVICE, **kw) -> NodeView:
    kw.setdefault("health", Health(report_s=NOW - 2, gpu_count=8, gpu_driver_ok=True))
    return NodeView("g017", "a100", 8, state, kw.pop("state_since_s", NOW - 100), **kw)


def cycle(scope=Scope.GPU, gpus=(3,), steps=GPU_CHAIN, step_index=0, **kw) -> Cycle:
    return Cycle(7, scope, gpus, steps, step_index, "critical", "GPU 3 has uncorrectable ECC errors", NOW - 500, **kw)


def job(job_id, gpus=(3,), preemptible=False, whole_node=False, stopping=False) -> JobOnNode:
    return JobOnNode(job_id, tuple(gpus), preemptible, whole_node, stopping)


# -- the rules table ------------------------------------------------------------------------------

RULE_CASES = [
    ("an uncorrectable ECC error resets the GPU, then reboots, then asks a human", "gpu_ecc_uncorrected", "critical",
     {}, None, Scope.GPU, ["reset_gpu", "reboot", "ticket"], 0),
    ("a row remap failure goes straight to RMA", "gpu_row_remap_failure", "critical", {}, "ticket", Scope.GPU, ["rma"], 0),
    ("XID 79 (off the bus) reboots the node", "gpu_xid", "critical", {"xid": 79}, "reboot", Scope.NODE,
     ["reboot", "ticket"], 0),
    ("XID 48 resets the GPU", "gpu_xid", "critical", {"xid": 48}, "reset_gpu", Scope.GPU, ["reset_gpu", "reboot", "ticket"], 0),
    ("a pending page retirement waits an hour, then reboots", "gpu_retired_pages_pending", "warning", {}, "reboot",
     Scope.NODE, ["reboot", "ticket"], 3600),
    ("an IB port down for 10 minutes needs a human", "ib_port_down", "warning", {}, "investigate", Scope.NODE, ["ticket"], 600),
]


@pytest.mark.parametrize("name,code,severity,evidence,action,scope,steps,for_s", RULE_CASES, ids=[c[0] for c in RULE_CASES])
def test_default_rules(name, code, severity, evidence, action, scope, steps, for_s):
    rule = RuleBook().match("a100", code, severity, evidence, action)
    assert rule is not None
    assert (rule.scope, [s.remediation.value for s in rule.steps], rule.for_s) == (scope, steps, for_s)


@pytest.mark.parametrize("code,severity", [("gpu_xid", "info"), ("disk_nearly_full", "critical"), ("lustre_unhealthy", "critical"),
                                           ("something_new", "critical"), ("gpu_ecc_uncorrected", "warning")])
def test_findings_the_table_does_not_know_are_never_acted_on(code, severity):
    assert RuleBook().match("a100", code, severity, {}, None) is None
    view = node(findings=(finding(code, severity, age_s=10_000),))
    assert decide(view, ctx()).to_state is None


def test_critical_rules_act_at_once_and_every_default_chain_ends_with_a_human_or_an_order():
    for rule in DEFAULT_RULES:
        if rule.severity == "critical":
            assert rule.for_s == 0, rule.key
        assert all(s.remediation.is_order for s in rule.steps[:-1]), rule.key


def test_a_rules_file_replaces_a_default_adds_rules_and_overrides_per_sku():
    book = rulebook_from_mapping({
        "rules": [{"code": "gpu_ecc_uncorrected", "severity": "critical", "scope": "node",
                   "steps": [{"do": "reboot", "timeout_s": 120}, "ticket"]},
                  {"code": "nfs_hung", "severity": "critical", "for_s": 30, "steps": ["reboot", "ticket"]}],
        "skus": {"h100": [{"code": "gpu_ecc_uncorrected", "severity": "critical", "scope": "gpu",
                           "steps": [{"do": "reset_gpu", "timeout_s": 60}, "rma"]}]},
    })
    a100 = book.match("a100", "gpu_ecc_uncorrected", "critical", {}, None)
    assert (a100.scope, [(s.remediation.value, s.timeout_s) for s in a100.steps]) == (Scope.NODE, [("reboot", 120), ("ticket", 0)])
    h100 = book.match("h100", "gpu_ecc_uncorrected", "critical", {}, None)
    assert [s.remediation for s in h100.steps] == [Remediation.RESET_GPU, Remediation.RMA]
    assert book.match("a100", "nfs_hung", "critical", {}, None).for_s == 30
    assert book.match("a100", "gpu_row_remap_failure", "critical", {}, None) is not None  # defaults kept


@pytest.mark.parametrize("bad,says", [
    ({"rules": [{"code": "x", "severity": "fatal", "steps": ["reboot"]}]}, "severity"),
    ({"rules": [{"code": "x", "severity": "critical", "steps": ["ticket", "reboot"]}]}, "must be the last step"),
    ({"rules": [{"code": "x", "severity": "critical", "steps": ["explode"]}]}, "is not one of"),
    ({"rules": [{"code": "x", "severity": "critical", "steps": [{"do": "reboot", "timeout_s": 0}]}]}, "timeout above 0"),
    ({"rules": [{"code": "x", "severity": "critical", "steps": ["restart_service"]}]}, "needs the unit"),
    ({"rules": [{"code": "x", "severity": "critical", "steps": []}]}, "non-empty"),
    ({"rules": [{"code": "x", "severity": "critical", "steps": ["reboot"], "colour": 1}]}, "unknown key"),
    ({"rulez": []}, "unknown key"),
])
def test_a_bad_rules_file_names_the_rule_and_key(bad, says):
    with pytest.raises(RuleError, match=says):
        rulebook_from_mapping(bad)


@pytest.mark.parametrize("value,nodes,budget", [("2", 100, 2), ("10%", 100, 10), ("10%", 5, 1), ("0", 10, 0), ("50%", 3, 1)])
def test_the_budget_is_a_number_or_a_share_of_the_sku(value, nodes, budget):
    assert RepairSettings(max_nodes_in_repair=value).budget_for(nodes) == budget


@pytest.mark.parametrize("value", ["-1", "150%", "1.5", "lots"])
def test_a_bad_budget_is_refused(value):
    with pytest.raises(ValueError):
        RepairSettings(max_nodes_in_repair=value)


# -- the transition table ---------------------------------------------------------------------------

def test_only_a_human_or_validation_leaves_out_of_service_and_rma():
    assert TRANSITIONS[N.OUT_OF_SERVICE] == {N.VALIDATING, N.RMA}
    assert TRANSITIONS[N.RMA] == {N.VALIDATING, N.OUT_OF_SERVICE}
    assert TRANSITIONS[N.LOST] == {N.VALIDATING, N.QUARANTINED}  # quarantined: back with a fault, its rule chain
    assert all(N.IN_SERVICE not in TRANSITIONS[s] for s in (N.OUT_OF_SERVICE, N.RMA, N.LOST))


def test_every_decided_transition_is_in_the_table():
    """Walk every state with a spread of inputs; any state change decide() returns must be allowed."""
    views = []
    for state in N:
        for c in (None, cycle(), cycle(scope=Scope.NODE, gpus=(), steps=NODE_CHAIN),
                  cycle(step=StepRun(0, Remediation.RESET_GPU, NOW - 10, NOW + 10, ("done",))),
                  cycle(step=StepRun(0, Remediation.RESET_GPU, NOW - 10, NOW + 10, ("failed",))),
                  cycle(step_index=2), cycle(validation_since_s=NOW - 100)):
            for health in (Health(report_s=NOW - 1, gpu_count=8, gpu_driver_ok=True), Health(report_s=NOW - 1000)):
                views.append(node(state, cycle=c, health=health, findings=(finding(),), jobs=(job(1),)))
    for view in views:
        d = decide(view, ctx())
        if d.to_state is not None:
            assert d.to_state in TRANSITIONS[view.state], (view.state, d)


def test_schedulable_and_budget_by_scope():
    assert schedulable(N.IN_SERVICE, None)
    assert schedulable(N.DRAINING, "gpu") and not schedulable(N.DRAINING, "node")
    assert schedulable(N.RMA, "gpu") and not schedulable(N.LOST, "gpu")
    assert counts_against_budget(N.REMEDIATING, "gpu") and counts_against_budget(N.OUT_OF_SERVICE, "node")
    assert not counts_against_budget(N.QUARANTINED, "node") and not counts_against_budget(N.RMA, "gpu")


# -- decisions, state by state --------------------------------------------------------------------------

def test_a_dbe_on_gpu3_quarantines_only_that_gpu_with_the_reset_chain():
    view = node(findings=(finding(), finding("gpu_row_remap_pending"), finding("gpu_xid", evidence={"xid": 48},
                                                                                 action="reset_gpu")))
    d = decide(view, ctx())
    assert d.to_state is N.QUARANTINED and d.notices == ("node_out_of_service",)
    assert (d.open_cycle.scope, d.open_cycle.gpus, d.open_cycle.step_index) == (Scope.GPU, (3,), 0)
    assert d.open_cycle.problem == "GPU 3 has uncorrectable ECC errors"
    assert [s.remediation.value for s in d.open_cycle.steps] == ["reset_gpu", "reboot", "ticket"]


def test_a_node_fault_with_a_gpu_fault_takes_the_whole_node():
    d = decide(node(findings=(finding(), finding("gpu_fell_off_bus", device="gpu5"))), ctx())
    assert d.open_cycle.scope is Scope.NODE and d.open_cycle.gpus == ()


def test_a_remap_failure_with_an_ecc_error_takes_the_rma_chain():
    d = decide(node(findings=(finding(), finding("gpu_row_remap_failure", device="gpu6"))), ctx())
    assert [s.remediation.value for s in d.open_cycle.steps] == ["rma"] and d.open_cycle.gpus == (3, 6)


def test_a_warning_waits_for_its_hold_down():
    early = node(findings=(finding("gpu_retired_pages_pending", "warning", age_s=3599),))
    assert decide(early, ctx()).to_state is None
    late = node(findings=(finding("gpu_retired_pages_pending", "warning", age_s=3601),))
    assert decide(late, ctx()).to_state is N.QUARANTINED


def test_pause_stops_new_actions_but_finishes_those_in_flight():
    assert decide(node(findings=(finding(),), paused=True), ctx()).waiting == "paused"
    assert decide(node(N.QUARANTINED, cycle=cycle(), paused=True), ctx()).to_state is None
    assert decide(node(N.REMEDIATING, cycle=cycle(), paused=True), ctx()).start_step is None
    # in flight: a drain goes on, a running order is awaited, a validation returns the node
    assert decide(node(N.DRAINING, cycle=cycle(), jobs=(job(1),), paused=True), ctx()).stop_jobs == (1,)
    done = cycle(step=StepRun(0, Remediation.RESET_GPU, NOW - 10, NOW + 10, ("done",)))
    assert decide(node(N.REMEDIATING, cycle=done, paused=True), ctx()).to_state is N.VALIDATING
    valid = cycle(validation_since_s=NOW - 100)
    assert decide(node(N.VALIDATING, cycle=valid, paused=True), ctx()).to_state is N.IN_SERVICE


def test_quarantined_nodes_wait_for_the_budget():
    assert decide(node(N.QUARANTINED, cycle=cycle()), ctx(budget_free=False)).waiting == "budget"
    assert decide(node(N.QUARANTINED, cycle=cycle()), ctx(budget_free=True)).to_state is N.DRAINING


def test_a_gpu_drain_stops_jobs_on_that_gpu_and_distributed_jobs_preemptible_first():
    jobs = (job(1, (0, 1)), job(2, (3,)), job(3, (2, 3), preemptible=True), job(4, range(8), whole_node=True))
    view = node(N.DRAINING, cycle=cycle(), jobs=jobs)
    assert decide(view, ctx()).stop_jobs == (3,)  # preemptible first
    jobs = (job(1, (0, 1)), job(2, (3,)), job(3, (2, 3), preemptible=True, stopping=True), job(4, range(8), whole_node=True))
    assert decide(replace(view, jobs=jobs), ctx()).stop_jobs == ()  # wait for the preemptible one to leave
    jobs = (job(1, (0, 1)), job(2, (3,)), job(4, range(8), whole_node=True))
    assert decide(replace(view, jobs=jobs), ctx()).stop_jobs == (2, 4)  # job 1 is on healthy GPUs: it stays
    assert decide(replace(view, jobs=(job(1, (0, 1)),)), ctx()).to_state is N.REMEDIATING


def test_a_node_drain_stops_every_job():
    view = node(N.DRAINING, cycle=cycle(scope=Scope.NODE, gpus=(), steps=NODE_CHAIN), jobs=(job(1, (0,)), job(2, (5,))))
    assert decide(view, ctx()).stop_jobs == (1, 2)


def test_remediation_orders_then_validates_or_escalates():
    view = node(N.REMEDIATING, cycle=cycle())
    assert decide(view, ctx()).start_step == 0
    running = cycle(step=StepRun(0, Remediation.RESET_GPU, NOW - 10, NOW + 10, ("sent",)))
    assert not decide(replace(view, cycle=running), ctx()).changes_anything
    failed = cycle(step=StepRun(0, Remediation.RESET_GPU, NOW - 10, NOW + 10, ("failed",), ("in use by job 4",)))
    d = decide(replace(view, cycle=failed), ctx())
    assert (d.advance_to, d.end_step[0], d.notices) == (1, "failed", ("node_escalated",))
    late = cycle(step=StepRun(0, Remediation.RESET_GPU, NOW - 700, NOW - 100, ("sent",)))
    assert decide(replace(view, cycle=late), ctx()).end_step[0] == "timed_out"


def test_a_gpu_fault_escalated_to_a_reboot_drains_the_whole_node_first():
    d = decide(node(N.REMEDIATING, cycle=cycle(step_index=1)), ctx())
    assert (d.to_state, d.widen_to_node) == (N.DRAINING, True)


def test_the_chain_ends_out_of_service_or_rma():
    d = decide(node(N.REMEDIATING, cycle=cycle(step_index=2)), ctx())
    assert (d.to_state, d.end_cycle, d.notices) == (N.OUT_OF_SERVICE, "out_of_service", ("node_needs_human",))
    rma = cycle(steps=RuleBook().match("a100", "gpu_row_remap_failure", "critical", {}, None).steps)
    assert decide(node(N.REMEDIATING, cycle=rma), ctx()).to_state is N.RMA


VALIDATION_CASES = [
    ("healthy after the quiet period returns the node", Health(report_s=NOW - 1, gpu_count=8, gpu_driver_ok=True), (), N.IN_SERVICE),
    ("a report inside the quiet period waits", Health(report_s=NOW - 90, gpu_count=8, gpu_driver_ok=True), (), None),
    ("a missing GPU fails", Health(report_s=NOW - 1, gpu_count=7, gpu_driver_ok=True), (), N.REMEDIATING),
    ("a silent driver fails", Health(report_s=NOW - 1, gpu_count=8, gpu_driver_ok=False), (), N.REMEDIATING),
    ("a pending remap on the GPU fails", Health(report_s=NOW - 1, gpu_count=8, gpu_driver_ok=True, remap_pending=(3,)), (), N.REMEDIATING),
    ("a pending remap on another GPU does not fail a GPU repair",
     Health(report_s=NOW - 1, gpu_count=8, gpu_driver_ok=True, remap_pending=(5,)), (), N.IN_SERVICE),
    ("the ECC finding still present fails",
     Health(report_s=NOW - 1, gpu_count=8, gpu_driver_ok=True), (finding(age_s=500),), N.REMEDIATING),
    ("a new XID since the reset fails, even if it cleared",
     Health(report_s=NOW - 1, gpu_count=8, gpu_driver_ok=True),
     (finding("gpu_xid", age_s=30, evidence={"xid": 48}, action="reset_gpu", cleared_s=NOW - 5),), N.REMEDIATING),
    ("an unknown finding does not fail", Health(report_s=NOW - 1, gpu_count=8, gpu_driver_ok=True),
     (finding("disk_nearly_full", device="/"),), N.IN_SERVICE),
]


@pytest.mark.parametrize("name,health,findings,expected", VALIDATION_CASES, ids=[c[0] for c in VALIDATION_CASES])
def test_validation(name, health, findings, expected):
    view = node(N.VALIDATING, cycle=cycle(validation_since_s=NOW - 120), health=health, findings=findings)
    assert decide(view, ctx()).to_state is expected


def test_validation_without_a_report_times_out_and_escalates():
    view = node(N.VALIDATING, cycle=cycle(validation_since_s=NOW - 1000), health=Health(report_s=NOW - 1001))
    d = decide(view, ctx(lost_after_s=10_000))
    assert d.to_state is N.REMEDIATING and d.advance_to == 1


def test_a_flapping_node_escalates_instead_of_repeating():
    last = LastReturn(NOW - 600, 0, GPU_CHAIN, Scope.GPU, (3,))
    d = decide(node(findings=(finding(),), last_return=last), ctx())
    assert (d.open_cycle.step_index, d.open_cycle.flap) == (1, True) and "escalated" in d.message
    # outside the window, or on another GPU: from the start
    assert decide(node(findings=(finding(),), last_return=replace(last, returned_s=NOW - 4000)), ctx()).open_cycle.step_index == 0
    assert decide(node(findings=(finding(),), last_return=replace(last, gpus=(5,))), ctx()).open_cycle.step_index == 0


def test_a_silent_agent_makes_the_node_lost_and_its_return_validates():
    view = node(jobs=(job(1), job(2, stopping=True)), health=Health(report_s=NOW - 301))
    d = decide(view, ctx())
    assert (d.to_state, d.stop_jobs, d.stop_reason, d.record_heartbeat_lost) == (N.LOST, (1,), "node_lost", True)
    assert decide(node(health=Health(report_s=None)), ctx()).to_state is None  # never reported: no agent to lose
    # a reboot is silent: remediating waits for its step's deadline instead
    assert decide(node(N.REMEDIATING, cycle=cycle(), health=Health(report_s=NOW - 301)), ctx()).to_state is None
    back = node(N.LOST, state_since_s=NOW - 50, health=Health(report_s=NOW - 1, gpu_count=8, gpu_driver_ok=True))
    d = decide(back, ctx())
    assert (d.to_state, d.open_cycle.kind, d.begin_validation) == (N.VALIDATING, "return", True)
    assert decide(node(N.LOST, state_since_s=NOW - 50, health=Health(report_s=NOW - 400)), ctx()).to_state is None


AGENT_LOST_CASES = [
    ("an agent silent past lost_after_s is lost", N.IN_SERVICE, NOW - 301, True),
    ("an agent silent for exactly lost_after_s is not yet", N.IN_SERVICE, NOW - 300, False),
    ("an agent that never reported cannot go silent", N.IN_SERVICE, None, False),
    ("silence while draining counts", N.DRAINING, NOW - 301, True),
    ("silence while validating counts", N.VALIDATING, NOW - 301, True),
    ("a remediating node may be silent (a reboot)", N.REMEDIATING, NOW - 301, False),
    ("a node held for a human is not checked", N.OUT_OF_SERVICE, NOW - 301, False),
    ("a lost node stays lost until its agent reports", N.LOST, NOW - 400, True),
    ("a lost node whose agent reported since is back", N.LOST, NOW - 1, False),
]


@pytest.mark.parametrize("name, state, report_s, lost", AGENT_LOST_CASES, ids=[c[0] for c in AGENT_LOST_CASES])
def test_agent_lost_is_the_rule_decide_acts_on(name, state, report_s, lost):
    """The API shows a node lost by ``agent_lost`` (services/nodes.py); decide takes a node in a
    checked state for lost on exactly the same answer."""
    assert agent_lost(state, report_s, NOW - 50, NOW, 300.0) is lost
    if state in (N.IN_SERVICE, N.DRAINING, N.VALIDATING):
        view = node(state, health=Health(report_s=report_s),
                    cycle=None if state is N.IN_SERVICE else cycle(validation_since_s=NOW - 100))
        assert (decide(view, ctx()).to_state is N.LOST) is lost


def test_a_node_back_from_lost_whose_agent_reads_no_gpus_returns_without_a_diagnostic_it_would_reject():
    """The demo's agent for pretend GPUs (collectors.gpu.enabled: false) rejects every GPU
    diagnostic; auto validates such a node on its report alone, required fails it (docs/repair.md)."""
    back = cycle(Scope.NODE, (), (), 0, validation_since_s=NOW - 100, kind="return")
    view = node(N.VALIDATING, cycle=back, health=Health(report_s=NOW - 2, gpus_unread=True))
    auto = decide(view, ctx(settings=DIAG))
    assert (auto.to_state, auto.order_diag) == (N.IN_SERVICE, False)
    assert "its agent reads no GPUs: no GPU diagnostic" in auto.message
    required = decide(view, ctx(settings=DIAG.model_copy(update={"validation_diag": "required"})))
    assert required.to_state is N.OUT_OF_SERVICE and "reads no GPUs" in required.message
    # an agent that reads its GPUs still gets the diagnostic
    assert decide(replace(view, health=Health(report_s=NOW - 2, gpu_count=8, gpu_driver_ok=True)),
                  ctx(settings=DIAG)).order_diag


def test_a_lost_node_back_with_a_fault_enters_that_faults_rule_chain_not_out_of_service():
    health = Health(report_s=NOW - 1, gpu_count=8, gpu_driver_ok=True)
    back = node(N.LOST, state_since_s=NOW - 50, health=health, findings=(finding(age_s=1.0),), jobs=(job(1),))
    d = decide(back, ctx())
    assert (d.to_state, d.open_cycle.kind, d.open_cycle.scope, d.open_cycle.gpus) == (N.QUARANTINED, "rule", Scope.GPU, (3,))
    assert d.open_cycle.steps == GPU_CHAIN and d.open_cycle.step_index == 0 and not d.begin_validation
    assert (d.stop_jobs, d.stop_reason, d.notices) == ((1,), "node_lost", ("node_out_of_service",))
    # a warning's hold-down does not apply to a returning node (it would fail validation anyway)
    ib = finding("ib_port_down", "warning", "mlx5_0", age_s=1.0)
    assert decide(replace(back, findings=(ib,)), ctx()).open_cycle.rule_key == "ib_port_down/warning"
    # a finding no rule knows does not hold it: it validates as before
    assert decide(replace(back, findings=(finding("disk_nearly_full", "warning", "node"),)), ctx()).to_state is N.VALIDATING
    # paused: it waits lost (its jobs still leave)
    paused = decide(replace(back, paused=True), ctx())
    assert (paused.to_state, paused.waiting, paused.stop_jobs) == (None, "paused", (1,))
    # the fault shows up while the lost node validates: its rule's chain too, the return cycle ends "fault"
    ret = Cycle(9, Scope.NODE, (), (), 0, "critical", "stopped reporting", NOW - 200, validation_since_s=NOW - 120,
                kind="return")
    during = node(N.VALIDATING, cycle=ret, health=health, findings=(finding(age_s=30.0),))
    d = decide(during, ctx())
    assert (d.to_state, d.end_cycle, d.open_cycle.steps) == (N.QUARANTINED, "fault", GPU_CHAIN)
    assert (N.LOST, N.QUARANTINED) in {(a, b) for a, bs in TRANSITIONS.items() for b in bs}


def test_a_returned_node_that_fails_validation_goes_back_to_a_human():
    ret = Cycle(9, Scope.NODE, (), (), 0, "critical", "returned by a human", NOW - 200, validation_since_s=NOW - 120, kind="return")
    view = node(N.VALIDATING, cycle=ret, health=Health(report_s=NOW - 1, gpu_count=6, gpu_driver_ok=True))
    assert decide(view, ctx()).to_state is N.OUT_OF_SERVICE


# -- the scheduler never assigns an unhealthy GPU ----------------------------------------------------

def test_the_placement_never_assigns_an_unhealthy_gpu_and_reclaim_does_not_free_it():
    from dlts.scheduler import decide as schedule
    from dlts.scheduler import model as core

    skus = {"a100": core.SkuShape("a100", 8, 64, 512 * 2**30)}
    node_ = core.Node("g017", "a100", 8, 64, 512 * 2**30, unhealthy_gpus=(3,))
    vcs = {"v": core.Vc("v", {"a100": 16})}

    def job(i, gpus, **kw):
        return core.Job(i, "v", "u", core.JobType.BATCH, "a100", gpus, 8, 64 * 2**30, queue_time=float(i), **kw)

    # seven single-GPU jobs fit, on every GPU but 3; an eighth waits
    decisions = schedule(core.Snapshot(skus, (node_,), vcs, tuple(job(i, 1) for i in range(8))), NOW)
    used = sorted(i for s in decisions.starts for p in s.placements for i in p.gpu_indices)
    assert used == [0, 1, 2, 4, 5, 6, 7] and len(decisions.waits) == 1
    # a whole-node (8 GPU) job cannot start there, even by preempting the job that holds GPU 3
    squatter = job(50, 1, preemptible=True, running=True, started_at=NOW - 10,
                   placements=(core.Placement("g017", (3,), 8, 64 * 2**30),))
    decisions = schedule(core.Snapshot(skus, (node_,), vcs, (squatter, job(51, 8))), NOW)
    assert decisions.starts == () and decisions.stops == ()
    # distributed jobs (whole nodes) never get the node
    gang = core.Job(60, "v", "u", core.JobType.DISTRIBUTED, "a100", 8, 64, 512 * 2**30, queue_time=1.0, nodes=1)
    assert schedule(core.Snapshot(skus, (node_,), vcs, (gang,)), NOW).starts == ()


# -- the GPU diagnostic in the validation ---------------------------------------------------------

DIAG = SETTINGS.model_copy(update={"validation_diag": "auto", "validation_diag_timeout_s": 600})


def validating(diag=None, **kw) -> NodeView:
    return node(N.VALIDATING, cycle=cycle(validation_since_s=NOW - 100, diag=diag), **kw)


def test_a_healthy_report_orders_the_diagnostic_and_waits_for_it():
    first = decide(validating(), ctx(settings=DIAG))
    assert (first.order_diag, first.to_state) == (True, None) and first.changes_anything
    running = decide(validating(DiagRun(NOW - 30, "sent")), ctx(settings=DIAG))
    assert (running.order_diag, running.to_state, running.waiting) == (False, None, "the GPU diagnostic runs")
    assert not running.changes_anything


def test_a_passed_diagnostic_returns_the_node_and_says_so():
    done = decide(validating(DiagRun(NOW - 30, "done", "succeeded", "dcgmi diag -r 1 -j -i 3: 9 tests passed")),
                  ctx(settings=DIAG))
    assert (done.to_state, done.end_cycle) == (N.IN_SERVICE, "returned")
    assert "the GPU diagnostic passed (dcgmi diag -r 1 -j -i 3: 9 tests passed)" in done.message


@pytest.mark.parametrize("run, why", [
    (DiagRun(NOW - 30, "failed", "failed", "dcgmi diag -r 1 -j: failed: Page Retirement/Row Remap (GPU 3)"),
     "the GPU diagnostic: dcgmi diag -r 1 -j: failed: Page Retirement/Row Remap (GPU 3)"),
    (DiagRun(NOW - 30, "failed", "rejected", "in use: gpu3 (job 7)"), "the GPU diagnostic: in use: gpu3 (job 7)"),
    (DiagRun(NOW - 601, "sent"), "the GPU diagnostic had no result after 600 s"),
])
def test_a_failed_or_silent_diagnostic_fails_the_validation_and_escalates(run, why):
    d = decide(validating(run), ctx(settings=DIAG))
    assert d.reason == "escalated" and d.advance_to == 1 and why in d.message


def test_without_dcgmi_auto_returns_and_required_escalates():
    skipped = DiagRun(NOW - 30, "done", "skipped", "dcgmi is not installed on this node")
    auto = decide(validating(skipped), ctx(settings=DIAG))
    assert auto.to_state is N.IN_SERVICE and "dcgmi not installed: no GPU diagnostic" in auto.message
    required = decide(validating(skipped), ctx(settings=DIAG.model_copy(update={"validation_diag": "required"})))
    assert required.reason == "escalated" and "required (repair.validation_diag)" in required.message


def test_a_report_problem_fails_before_any_diagnostic_and_off_never_orders_one():
    sick = validating(health=Health(report_s=NOW - 2, gpu_count=7, gpu_driver_ok=True))
    d = decide(sick, ctx(settings=DIAG))
    assert not d.order_diag and d.reason == "escalated" and "7 of 8 GPUs visible" in d.message
    assert decide(validating(), ctx(settings=DIAG.model_copy(update={"validation_diag": "off"}))).to_state is N.IN_SERVICE
