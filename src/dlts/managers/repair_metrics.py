"""Prometheus metrics of the repair loop, read from the database at scrape time (a custom
collector, as prometheus client_python recommends for state that lives elsewhere).

    dlts_nodes{state}                                   nodes per repair state
    dlts_repair_queue_nodes                             quarantined nodes waiting for the budget
    dlts_repair_paused                                  1 while repairs are paused everywhere
    dlts_repair_cycles_total{outcome}                   ended cycles (returned, out_of_service, rma, lost, cancelled, fault)
    dlts_repair_cycle_duration_seconds{outcome}         summary (_sum, _count) of ended cycles' durations
    dlts_repair_steps_total{remediation,result}         remediation steps by result (succeeded, failed, timed_out, cancelled)

Register it on the registry the managers process serves (``registry.register(RepairMetrics(sessions))``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import sqlalchemy as sa
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from sqlalchemy.orm import Session

from dlts.models import Node, NodeState, RepairControl, RepairCycle, RepairStep
from dlts.repair.machine import CycleOutcome, StepResult
from dlts.repair.rules import Remediation

# every known label value is exported from the start (0 until it happens), so that increase()
# sees the first cycle and dashboards show 0 rather than nothing
OUTCOMES = tuple(o.value for o in CycleOutcome)
STEP_RESULTS = tuple(r.value for r in StepResult)


class RepairMetrics:
    def __init__(self, session_factory: Callable[[], Session]):
        self.session_factory = session_factory

    def describe(self) -> list[Metric]:
        return []  # read at scrape time only (no query when the collector is registered)

    def collect(self) -> Iterator[Metric]:
        with self.session_factory() as s:
            states = dict(s.execute(sa.select(Node.state, sa.func.count(Node.id)).group_by(Node.state)).all())
            nodes = GaugeMetricFamily("dlts_nodes", "Nodes per repair state.", labels=["state"])
            for state in NodeState:
                nodes.add_metric([state.value], states.get(state, 0))
            yield nodes
            yield GaugeMetricFamily("dlts_repair_queue_nodes", "Quarantined nodes waiting for the repair budget.",
                                    value=states.get(NodeState.QUARANTINED, 0))
            control = s.get(RepairControl, 1)
            yield GaugeMetricFamily("dlts_repair_paused", "1 while repairs are paused everywhere.",
                                    value=1 if control is not None and control.paused else 0)
            cycles = CounterMetricFamily("dlts_repair_cycles", "Repair cycles that ended, by outcome.", labels=["outcome"])
            durations = SummaryMetricFamily("dlts_repair_cycle_duration_seconds",
                                            "Duration of ended repair cycles, by outcome.", labels=["outcome"])
            ended = s.execute(sa.select(RepairCycle.outcome, RepairCycle.started_at, RepairCycle.ended_at)
                              .where(RepairCycle.ended_at.isnot(None))).all()
            by_outcome: dict[str, list[float]] = {}
            for outcome, started, finished in ended:
                assert finished is not None  # the query's condition
                by_outcome.setdefault(outcome or "unknown", []).append((finished - started).total_seconds())
            for outcome in OUTCOMES:  # every known outcome from the start: 0 until the first
                by_outcome.setdefault(outcome, [])
            for outcome, values in sorted(by_outcome.items()):
                cycles.add_metric([outcome], len(values))
                durations.add_metric([outcome], count_value=len(values), sum_value=sum(values))
            yield cycles
            yield durations
            steps = CounterMetricFamily("dlts_repair_steps", "Remediation steps that ended, by remediation and result.",
                                        labels=["remediation", "result"])
            counts = {(r.value, result): 0 for r in Remediation for result in STEP_RESULTS}
            for remediation, result, count in s.execute(
                    sa.select(RepairStep.remediation, RepairStep.result, sa.func.count(RepairStep.id))
                    .where(RepairStep.ended_at.isnot(None)).group_by(RepairStep.remediation, RepairStep.result)):
                counts[(remediation, result or "unknown")] = count
            for (remediation, result), count in sorted(counts.items()):
                steps.add_metric([remediation, result], count)
            yield steps
