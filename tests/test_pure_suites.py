"""The pure suites run without the web stack: the scheduler core's tests, the node agent's and the
Lustre package's need neither Flask nor the database layer, and neither do the conftests above them;
the scheduler core's do not need the configuration (``dlts.config``, pydantic) either.

Each suite runs in a child pytest whose import system refuses those packages as if they were not
installed (a finder first on ``sys.meta_path``, loaded with ``-p`` before any conftest); the child
also records which of them ended up imported anyway. The scheduler's suite runs whole; the agent's
and the Lustre package's are collected (every module and conftest imported), since their tests drive
subprocesses that do not depend on what this process can import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# the web stack and the database layer, and the parts of dlts built on them
FORBIDDEN = ("flask", "flask_sqlalchemy", "flask_smorest", "flask_wtf", "werkzeug", "sqlalchemy", "alembic",
             "marshmallow", "kubernetes", "dlts.app", "dlts.api", "dlts.portal", "dlts.db", "dlts.models",
             "dlts.repositories", "dlts.services")
# the scheduler's suite needs the pure core only: not the configuration (pydantic) either; a test of a
# setting that names a scheduler profile sits with the configuration's tests (tests/core/test_config.py)
SCHEDULER_FORBIDDEN = (*FORBIDDEN, "pydantic", "dlts.config")

GUARD = textwrap.dedent('''
    import json, os, sys
    FORBIDDEN = tuple(json.loads(os.environ["PURE_GUARD_FORBIDDEN"]))

    def _forbidden(name):
        return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)

    class RefuseForbidden:
        def find_spec(self, name, path=None, target=None):
            if _forbidden(name):
                raise ModuleNotFoundError(f"No module named {name!r} (refused: a pure suite must not need it)",
                                          name=name)
            return None

    sys.meta_path.insert(0, RefuseForbidden())

    def pytest_sessionfinish(session, exitstatus):
        loaded = sorted(m for m in sys.modules if _forbidden(m))
        with open(os.environ["PURE_GUARD_REPORT"], "w") as f:
            json.dump(loaded, f)
''')

# tests/lustre also holds two tests of DLTS's storage manager with the fake lfs (database and all)
LUSTRE_PACKAGE_TESTS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "lustre").glob("test_*.py")
                              if p.name not in ("test_storage_manager.py", "test_lustre_usage_snapshots.py"))


def run_guarded(tmp_path: Path, *args: str, forbidden: tuple[str, ...] = FORBIDDEN,
                ) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    (tmp_path / "pure_guard.py").write_text(GUARD)
    report = tmp_path / "loaded.json"
    env = dict(os.environ, PURE_GUARD_FORBIDDEN=json.dumps(forbidden), PURE_GUARD_REPORT=str(report),
               PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "pure_guard",
                           "-p", "no:schemathesis", "-p", "no:anyio", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    loaded = json.loads(report.read_text()) if report.exists() else ["(the child wrote no report)"]
    return proc, loaded


@pytest.mark.slow
def test_the_scheduler_suite_runs_without_flask_the_database_layer_or_the_configuration(tmp_path):
    proc, loaded = run_guarded(tmp_path, "tests/scheduler", forbidden=SCHEDULER_FORBIDDEN)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and loaded == [], (loaded, proc.stdout[-2000:])


@pytest.mark.parametrize("paths", [["tests/agent"], LUSTRE_PACKAGE_TESTS], ids=["agent", "lustre"])
def test_the_agent_and_lustre_suites_import_without_flask_or_the_database_layer(tmp_path, paths):
    proc, loaded = run_guarded(tmp_path, "--collect-only", *paths)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " collected" in proc.stdout or "tests collected" in proc.stdout, proc.stdout[-2000:]
    assert loaded == [], loaded


def test_the_guard_refuses_what_it_forbids(tmp_path):
    """The check above can fail: a test module that imports Flask is an error in the guarded child."""
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "test_imports_flask.py").write_text("import flask\n\n\ndef test_nothing():\n    pass\n")
    proc, _ = run_guarded(tmp_path, "--rootdir", str(probe), "-c", os.devnull, str(probe))
    assert proc.returncode != 0 and "refused: a pure suite must not need it" in proc.stdout, proc.stdout[-2000:]
