"""monitoring/: the rule files pass `promtool check rules`, their unit tests pass `promtool test
rules`, every alert is tested firing and not firing and carries a severity, a summary and a runbook
line documented in docs/monitoring.md, and every metric the rules read is one DLTS exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RULES = sorted((ROOT / "monitoring" / "prometheus" / "rules").glob("*.yml"))
FEDERATION = sorted((ROOT / "monitoring" / "prometheus" / "federation").glob("*.yml"))
ALERTS = ROOT / "monitoring" / "prometheus" / "rules" / "dlts-alerts.yml"
SEVERITIES = {"critical", "warning", "info"}
# where the exported metric names are spelled (the agent, the Lustre collector, the control plane)
SOURCES = [ROOT / "agents" / "dlts_agent" / "metrics.py", ROOT / "lustre" / "dlts_lustre" / "metrics.py",
           ROOT / "src" / "dlts" / "metrics.py", ROOT / "src" / "dlts" / "managers" / "repair_metrics.py"]


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is required (apt-get install prometheus)")
    return path


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120, cwd=HERE)


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"] if "alert" in rule]


def all_rules() -> list[dict]:
    return [rule for path in RULES + FEDERATION for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"]]


def test_the_rule_files_pass_promtool_check_rules():
    assert RULES and FEDERATION
    result = run("check", "rules", *map(str, RULES + FEDERATION))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("unit_tests", ["alerts_test.yml", "recording_test.yml", "federation_test.yml"])
def test_the_rule_unit_tests_pass_promtool_test_rules(unit_tests):
    result = run("test", "rules", unit_tests)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_is_tested_firing_and_not_firing():
    fired, silent = set(), set()
    for case in yaml.safe_load((HERE / "alerts_test.yml").read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert names - fired == set(), "alerts never tested firing"
    assert names - silent == set(), "alerts never tested not firing"
    assert (fired | silent) - names == set(), "tests of alerts that do not exist"


def test_every_alert_has_a_severity_a_summary_and_a_documented_runbook_line():
    doc = (ROOT / "docs" / "monitoring.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
               for line in doc.splitlines() if line.startswith("#")}
    for rule in alert_rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert annotations["summary"].strip() and len(annotations["runbook"].split()) >= 8, name
        assert annotations["runbook_url"] == f"docs/monitoring.md#{name.lower()}", name
        assert name.lower() in anchors, f"docs/monitoring.md has no section for {name}"
        assert f"`{name}`" in doc or f"### {name}" in doc


def test_the_rules_read_only_metrics_dlts_exports():
    exported = set()
    for source in SOURCES:
        exported |= set(re.findall(r'"(dlts_[a-z0-9_]+)"', source.read_text()))
    known = exported | {n + suffix for n in exported for suffix in ("_total", "_bucket", "_count", "_sum")}
    recorded = {rule["record"] for rule in all_rules() if "record" in rule}
    for rule in all_rules():
        expr = rule["expr"]
        for name in re.findall(r"(?<![\w:])(dlts_[a-z0-9_]+)\b(?!\s*[=~!]|\s*:)", re.sub(r'"[^"]*"', '""', expr)):
            assert name in known, f"{rule.get('alert') or rule.get('record')}: {name} is not exported by DLTS"
        for name in re.findall(r"\b([a-z_]+:dlts_[a-z0-9_]+:[a-z0-9_]+)\b", expr):
            assert name in recorded, f"{rule.get('alert') or rule.get('record')}: {name} is recorded by no rule"


def test_the_control_planes_metric_names_are_not_the_agents_or_lustres():
    """A name exported by two kinds of process with different labels breaks every join on it
    (dlts_node_gpus once came from both the agents and the managers)."""
    def names(*paths: Path) -> set[str]:
        return {n for p in paths for n in re.findall(r'"(dlts_[a-z0-9_]+)"', p.read_text())}

    control = names(ROOT / "src" / "dlts" / "metrics.py", ROOT / "src" / "dlts" / "managers" / "repair_metrics.py")
    data = names(ROOT / "agents" / "dlts_agent" / "metrics.py", ROOT / "lustre" / "dlts_lustre" / "metrics.py")
    assert len(control) > 30 and len(data) > 30
    assert control & data == set()
