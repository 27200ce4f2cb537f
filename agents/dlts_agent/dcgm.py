"""``dcgmi diag -r LEVEL -j``: what the GPU diagnostic found, from its JSON output.

The output is one JSON document, sometimes after a warning line (DCGM prints those on stdout too):
``{"DCGM GPU Diagnostic" (DCGM 3) or "DCGM Diagnostic" (DCGM 4): {"test_categories": [{"category":
"Deployment", "tests": [{"name": "...", "results": [{"gpu_ids": "0,1" or 3, "status": "PASS",
"warnings": [...], "info": [...]}], "test_summary": {"status": "Pass"}}, null, ...]}], "version":
"3.1.0"}}``; DCGM 4 names the GPU of a result ``entity_id`` and adds a ``test_summary``
per test and warnings as objects (``{"warning": "...", "error_id": 95}``). Statuses are spelled
PASS/Pass, FAIL/Fail, WARN/Warn, SKIP/SKIPPED/Skip, "Not Run"; test lists may hold nulls. A test
fails when any of its results (or its summary) fails.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

ROOT_KEYS = ("DCGM GPU Diagnostic", "DCGM Diagnostic")


class DiagOutputError(ValueError):
    """The output holds no diagnostic result (not JSON, or no test categories)."""


@dataclass
class DiagResult:
    version: str = ""
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # "Test name (GPU 3: first warning)"
    warned: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def ran(self) -> int:
        return len(self.passed) + len(self.failed) + len(self.warned)


def _status(value: object) -> str:
    s = str(value or "").strip().lower()
    if s.startswith("pass"):
        return "pass"
    if s.startswith("fail"):
        return "fail"
    if s.startswith("warn"):
        return "warn"
    return "skip"  # SKIP, SKIPPED, Not Run, anything else: nothing established


def _words(result: dict) -> str:
    for key in ("warnings", "info"):
        items = result.get(key)
        if isinstance(items, list):
            for item in items:
                text = item.get("warning") or item.get("message") if isinstance(item, dict) else item
                if text:
                    return " ".join(str(text).split())[:200]
    return ""


def parse_diag(output: str) -> DiagResult:
    start = output.find("{")
    if start < 0:
        raise DiagOutputError("no JSON in the output")
    try:
        doc = json.loads(output[start:])
    except ValueError as exc:
        raise DiagOutputError(f"not JSON: {exc}") from None
    root = next((doc[k] for k in ROOT_KEYS if isinstance(doc, dict) and isinstance(doc.get(k), dict)), None)
    if root is None or not isinstance(root.get("test_categories"), list):
        raise DiagOutputError("no test_categories in the output")
    out = DiagResult(version=str(root.get("version") or ""))
    for category in root["test_categories"]:
        if not isinstance(category, dict):
            continue
        for test in category.get("tests") or []:
            if not isinstance(test, dict):
                continue  # DCGM 3 lists hold nulls between the tests
            name = str(test.get("name") or "unnamed test")
            results = [r for r in test.get("results") or [] if isinstance(r, dict)]
            statuses = [(_status(r.get("status")), r) for r in results]
            summary = test.get("test_summary")
            if isinstance(summary, dict) and "status" in summary:
                statuses.append((_status(summary.get("status")), summary))
            kinds = {s for s, _ in statuses}
            if "fail" in kinds:
                bad = [(r.get("gpu_ids", r.get("entity_id")), _words(r)) for s, r in statuses
                       if s == "fail" and r is not summary]
                where = "; ".join(f"GPU {g}" + (f": {w}" if w else "") for g, w in bad if g is not None)
                out.failed.append(f"{name} ({where})" if where else name)
            elif "warn" in kinds:
                out.warned.append(name)
            elif "pass" in kinds:
                out.passed.append(name)
            else:
                out.skipped.append(name)
    return out
