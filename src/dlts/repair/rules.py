"""The declarative rules table: which finding leads to which remediation chain.

A rule is keyed by the finding's ``code`` and ``severity`` (and optionally ``when``: the XID number
or the agent's recommended action, for findings whose code alone is too coarse). It says how long
the condition must persist before anything happens (``for_s``; 0 for the critical ones), whether the
fault is one GPU's (``scope: gpu``: only that GPU leaves service) or the node's, and the chain of
remediations, each with the time it may take before the next one is tried. A chain ends with a
human: ``ticket`` (the node goes ``out_of_service``) or ``rma`` (the hardware must be replaced).

Defaults follow ../shared/reference/gpu-health-and-lustre.md F1-F3 (see docs/repair.md for the
table and the reasons). Operators replace or add rules in a YAML file (``repair.rules_file``), for
all SKUs or per SKU. Findings no rule matches are recorded by the API and never acted on.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class Scope(str, enum.Enum):
    GPU = "gpu"  # only the faulty GPUs leave service; the node keeps serving with the others
    NODE = "node"  # the whole node leaves service


class Remediation(str, enum.Enum):
    RESET_GPU = "reset_gpu"  # an agent order per faulty GPU (nvidia-smi --gpu-reset)
    RESTART_SERVICE = "restart_service"  # an agent order (systemctl restart TARGET)
    REBOOT = "reboot"  # an agent order; the whole node must be drained
    TICKET = "ticket"  # a human looks at it: the node goes out_of_service
    RMA = "rma"  # the hardware goes back to the vendor: the node goes rma

    @property
    def is_order(self) -> bool:
        return self in (Remediation.RESET_GPU, Remediation.RESTART_SERVICE, Remediation.REBOOT)

    @property
    def needs_whole_node(self) -> bool:
        """A reboot or a service restart affects every GPU: the node is drained first."""
        return self in (Remediation.RESTART_SERVICE, Remediation.REBOOT)


SEVERITIES = ("info", "warning", "critical")
SEVERITY_RANK = {name: rank for rank, name in enumerate(SEVERITIES)}
DEFAULT_STEP_TIMEOUT_S = {Remediation.RESET_GPU: 600.0, Remediation.RESTART_SERVICE: 600.0,
                          Remediation.REBOOT: 1800.0, Remediation.TICKET: 0.0, Remediation.RMA: 0.0}
HEARTBEAT_LOST = "heartbeat_lost"  # the finding the repair manager makes of a silent agent


class RuleError(ValueError):
    """A rules file or rule is invalid; the message names the rule and the key."""


@dataclass(frozen=True)
class Step:
    remediation: Remediation
    timeout_s: float  # after this without a result the step has failed and the next one is tried
    target: str = ""  # restart_service: the unit

    def describe(self) -> str:
        return self.remediation.value + (f" {self.target}" if self.target else "")


@dataclass(frozen=True)
class Rule:
    code: str
    severity: str
    steps: tuple[Step, ...]
    scope: Scope = Scope.NODE
    for_s: float = 0.0
    when: Mapping[str, Any] = field(default_factory=dict)  # {"xid": 79} or {"action": "reboot"}
    # what the users whose jobs are stopped read: "node g017 GPU 3 <problem>"
    problem: str = ""

    @property
    def key(self) -> str:
        extra = "".join(f"[{k}={v}]" for k, v in sorted(self.when.items()))
        return f"{self.code}/{self.severity}{extra}"

    def matches(self, code: str, severity: str, evidence: Mapping[str, Any], action: str | None) -> bool:
        if code != self.code or severity != self.severity:
            return False
        for k, v in self.when.items():
            seen = action if k == "action" else evidence.get(k)
            if str(seen) != str(v):
                return False
        return True


def _chain(*names: str) -> tuple[Step, ...]:
    steps = []
    for name in names:
        remediation = Remediation(name)
        steps.append(Step(remediation, DEFAULT_STEP_TIMEOUT_S[remediation]))
    return tuple(steps)


GPU_CHAIN = _chain("reset_gpu", "reboot", "ticket")
NODE_CHAIN = _chain("reboot", "ticket")

# The defaults (docs/repair.md explains each row). Critical findings act at once (for_s 0).
DEFAULT_RULES: tuple[Rule, ...] = (
    # F1: uncorrectable ECC: drain, reset (applies a pending remap), re-check; reboot; then a human
    Rule("gpu_ecc_uncorrected", "critical", GPU_CHAIN, Scope.GPU, 0, problem="has uncorrectable ECC errors"),
    Rule("gpu_ecc_corrected_total", "critical", _chain("reset_gpu", "ticket"), Scope.GPU, 0,
         problem="has an excessive number of corrected ECC errors"),
    Rule("gpu_row_remap_pending", "critical", GPU_CHAIN, Scope.GPU, 0, problem="has a memory row remap pending"),
    # F1: remap failure, >512 uncorrectable remapped rows, a full retirement table: RMA candidates
    Rule("gpu_row_remap_failure", "critical", _chain("rma"), Scope.GPU, 0, problem="failed to remap a faulty memory row"),
    Rule("gpu_row_remap_uncorrectable", "critical", _chain("rma"), Scope.GPU, 0,
         problem="has too many memory rows remapped for uncorrectable errors"),
    Rule("gpu_retirement_table_full", "critical", _chain("rma"), Scope.GPU, 0, problem="has a full page retirement table"),
    Rule("gpu_retired_pages", "critical", _chain("ticket"), Scope.GPU, 0, problem="has too many retired memory pages"),
    # F1: a pending page retirement takes effect at the next reboot: not urgent
    Rule("gpu_retired_pages_pending", "warning", _chain("reboot", "ticket"), Scope.NODE, 3600.0,
         problem="has a memory page retirement pending"),
    Rule("gpu_recovery_action", "critical", GPU_CHAIN, Scope.GPU, 0, when={"action": "reset_gpu"},
         problem="asks for a GPU reset"),
    Rule("gpu_recovery_action", "critical", NODE_CHAIN, Scope.NODE, 0, when={"action": "reboot"},
         problem="asks for a node reboot"),
    # F2: critical XIDs reset the GPU; XID 79 (fell off the bus) needs a node reboot
    Rule("gpu_xid", "critical", NODE_CHAIN, Scope.NODE, 0, when={"xid": 79}, problem="fell off the bus (XID 79)"),
    Rule("gpu_xid", "critical", GPU_CHAIN, Scope.GPU, 0, when={"action": "reset_gpu"}, problem="reported a critical XID error"),
    Rule("gpu_xid", "critical", NODE_CHAIN, Scope.NODE, 0, problem="reported a critical XID error"),
    Rule("gpu_fell_off_bus", "critical", NODE_CHAIN, Scope.NODE, 0, problem="fell off the bus"),
    Rule("gpu_lost", "critical", NODE_CHAIN, Scope.NODE, 0, problem="is lost (NVML cannot reach it)"),
    Rule("gpu_count_low", "critical", NODE_CHAIN, Scope.NODE, 0, problem="is missing GPUs"),
    Rule("gpu_telemetry_unavailable", "critical", NODE_CHAIN, Scope.NODE, 0, problem="cannot read its GPUs"),
    # a port down for 10 minutes: distributed jobs would fail on it; a human checks the cable
    Rule("ib_port_down", "warning", _chain("ticket"), Scope.NODE, 600.0, problem="has an InfiniBand port down"),
)


def _step_from(raw: Any, where: str) -> Step:
    if isinstance(raw, str):
        raw = {"do": raw}
    if not isinstance(raw, Mapping):
        raise RuleError(f"{where}: a step is a remediation name or a mapping with 'do'")
    unknown = set(raw) - {"do", "timeout_s", "target"}
    if unknown:
        raise RuleError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: do, timeout_s, target)")
    try:
        remediation = Remediation(raw.get("do"))
    except ValueError:
        raise RuleError(f"{where}.do: {raw.get('do')!r} is not one of {', '.join(r.value for r in Remediation)}") from None
    timeout = raw.get("timeout_s", DEFAULT_STEP_TIMEOUT_S[remediation])
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout < 0:
        raise RuleError(f"{where}.timeout_s: must be a number of seconds >= 0")
    if remediation.is_order and timeout <= 0:
        raise RuleError(f"{where}.timeout_s: an agent order needs a timeout above 0")
    target = str(raw.get("target") or "")
    if remediation is Remediation.RESTART_SERVICE and not target:
        raise RuleError(f"{where}.target: restart_service needs the unit to restart")
    return Step(remediation, float(timeout), target)


def rule_from_mapping(raw: Any, where: str) -> Rule:
    if not isinstance(raw, Mapping):
        raise RuleError(f"{where}: a rule is a mapping (code, severity, steps, ...)")
    known = {"code", "severity", "steps", "scope", "for_s", "when", "problem"}
    unknown = set(raw) - known
    if unknown:
        raise RuleError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(known))})")
    code = raw.get("code")
    if not isinstance(code, str) or not code or len(code) > 64:
        raise RuleError(f"{where}.code: the finding code (1-64 characters)")
    severity = raw.get("severity")
    if severity not in SEVERITIES:
        raise RuleError(f"{where}.severity: one of {', '.join(SEVERITIES)}")
    steps_raw = raw.get("steps")
    if not isinstance(steps_raw, Sequence) or isinstance(steps_raw, str) or not steps_raw:
        raise RuleError(f"{where}.steps: a non-empty list of remediations")
    steps = tuple(_step_from(s, f"{where}.steps[{i}]") for i, s in enumerate(steps_raw))
    for i, step in enumerate(steps[:-1]):
        if not step.remediation.is_order:
            raise RuleError(f"{where}.steps[{i}]: {step.remediation.value} ends the chain; it must be the last step")
    try:
        scope = Scope(raw.get("scope", "node"))
    except ValueError:
        raise RuleError(f"{where}.scope: gpu or node") from None
    for_s = raw.get("for_s", 0)
    if not isinstance(for_s, (int, float)) or isinstance(for_s, bool) or for_s < 0:
        raise RuleError(f"{where}.for_s: seconds >= 0")
    when = raw.get("when") or {}
    if not isinstance(when, Mapping) or set(when) - {"xid", "action"}:
        raise RuleError(f"{where}.when: a mapping of xid and/or action")
    if scope is Scope.GPU and steps[0].remediation is Remediation.RESTART_SERVICE:
        raise RuleError(f"{where}: a gpu-scope rule cannot start with restart_service (it affects the whole node)")
    return Rule(code, severity, steps, scope, float(for_s), dict(when), str(raw.get("problem") or ""))


@dataclass(frozen=True)
class RuleBook:
    """The rules in force: the base table and per-SKU replacements (same key replaces, new adds)."""

    base: tuple[Rule, ...] = DEFAULT_RULES
    per_sku: Mapping[str, tuple[Rule, ...]] = field(default_factory=dict)

    def rules_for(self, sku: str) -> tuple[Rule, ...]:
        extra = self.per_sku.get(sku, ())
        if not extra:
            return self.base
        keys = {r.key for r in extra}
        return tuple(extra) + tuple(r for r in self.base if r.key not in keys)

    def match(self, sku: str, code: str, severity: str, evidence: Mapping[str, Any], action: str | None) -> Rule | None:
        """The most specific matching rule (one with ``when`` before one without), or None."""
        candidates = [r for r in self.rules_for(sku) if r.matches(code, severity, evidence, action)]
        if not candidates:
            return None
        return max(candidates, key=lambda r: len(r.when))


def _merge(base: Sequence[Rule], extra: Sequence[Rule]) -> tuple[Rule, ...]:
    keys = {r.key for r in extra}
    return tuple(extra) + tuple(r for r in base if r.key not in keys)


def rulebook_from_mapping(data: Any, where: str = "rules file") -> RuleBook:
    """``{rules: [...], skus: {SKU: [...]}, replace_defaults: false}``: rules replace the default
    with the same key (code, severity, when) or add to the table."""
    if data is None:
        return RuleBook()
    if not isinstance(data, Mapping):
        raise RuleError(f"{where}: must be a mapping with 'rules' and/or 'skus'")
    unknown = set(data) - {"rules", "skus", "replace_defaults"}
    if unknown:
        raise RuleError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: rules, skus, replace_defaults)")
    rules = [rule_from_mapping(r, f"{where}: rules[{i}]") for i, r in enumerate(data.get("rules") or [])]
    base = tuple(rules) if data.get("replace_defaults") else _merge(DEFAULT_RULES, rules)
    per_sku: dict[str, tuple[Rule, ...]] = {}
    skus = data.get("skus") or {}
    if not isinstance(skus, Mapping):
        raise RuleError(f"{where}: skus must map a SKU name to a list of rules")
    for sku, items in skus.items():
        if not isinstance(items, Sequence) or isinstance(items, str):
            raise RuleError(f"{where}: skus.{sku} must be a list of rules")
        per_sku[str(sku)] = tuple(rule_from_mapping(r, f"{where}: skus.{sku}[{i}]") for i, r in enumerate(items))
    return RuleBook(base, per_sku)


def load_rulebook(path: Path | None) -> RuleBook:
    if path is None:
        return RuleBook()
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise RuleError(f"repair.rules_file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise RuleError(f"repair.rules_file {path}: not valid YAML: {exc}") from None
    return rulebook_from_mapping(data, f"repair.rules_file {path}")
