"""The layers of src/dlts, read from the source with ``ast`` (ARCHITECTURE.md, STYLE.md rule 1):

    app -> api | portal -> schemas -> services -> repositories -> models

- nothing below the views (services, repositories, models, scheduler, jobmanager) imports Flask;
- views (api/, portal/) run no query of their own: no ``execute/scalar(s)/query/get_one`` on anything,
  no ``get/add/delete/merge/flush`` on a session (``db.session``, ``db.session()``), no sqlalchemy
  import but its errors, and no repository (they call services);
- no commit or rollback anywhere but ``dlts.services.transaction``: use-cases, the job manager's
  tick and the managers' passes open ``transaction()``/``step()`` blocks and never end a transaction
  themselves; the one other call is the connection pool's reset (``TRANSACTION_PLUMBING``);
- no package imports a higher layer, and the api and the portal do not import each other; only the
  entry points (app, cli, demo, gunicorn_conf) import the web layer or the app;
- no import cycle between two packages (below).

Every rule is checked once against a synthetic module that breaks it, so a checker that sees nothing
fails here rather than passing quietly.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

# higher number = higher layer; a module may import only its own layer's or lower ones
RANK = {"dlts.models": 0, "dlts.repositories": 1, "dlts.services": 2, "dlts.schemas": 3,
        "dlts.api": 4, "dlts.portal": 4, "dlts.app": 5}
VIEWS = ("dlts.api", "dlts.portal")
BELOW_VIEWS = ("dlts.services", "dlts.repositories", "dlts.models", "dlts.scheduler", "dlts.jobmanager")
ENTRY_POINTS = ("dlts.app", "dlts.cli", "dlts.demo", "dlts.gunicorn_conf")  # the processes' mains
TRANSACTION_OWNER = "dlts.services.transaction"
# (module, function) that may still call commit()/rollback(): plumbing below the sessions, not a unit of work
TRANSACTION_PLUMBING = {("dlts.db", "rollback_unless_reset")}  # a pooled DBAPI connection returned mid-transaction
# werkzeug.security (password hashes) is a library call, not the web stack: not listed
FLASK = ("flask", "flask_sqlalchemy", "flask_smorest", "flask_wtf", "werkzeug.exceptions", "werkzeug.wrappers",
         "webargs", "wtforms")
# a query, on whatever it is called: a view has no other use for these names (``session.execute``,
# ``db.session().scalars``, ``s.scalar_one`` of ``s = db.session()`` alike)
QUERY_METHODS = {"execute", "scalar", "scalars", "query", "get_one", "scalar_one", "scalar_one_or_none"}
# a write or a read by key, on a session only (a service may be named ``delete``: ``groups.delete(...)``)
SESSION_METHODS = {"get", "add", "add_all", "delete", "merge", "flush"}
VIEW_WHITELIST = {"dlts.api.health"}  # nothing: /readyz asks services.cluster.database_answers


def _in(module: str, packages: tuple[str, ...] | str) -> bool:
    packages = (packages,) if isinstance(packages, str) else packages
    return any(module == p or module.startswith(p + ".") for p in packages)


def _layer(module: str) -> str | None:
    for package in RANK:
        if _in(module, package):
            return package
    return None


def _imports(tree: ast.AST, module: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):  # imports inside functions count as much as those at the top
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = module.split(".")[: -node.level]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((node.lineno, name))
            found += [(node.lineno, f"{name}.{alias.name}") for alias in node.names]
    return found


def _is_session(node: ast.AST) -> bool:
    """``db.session``, ``db.session()``, ``self.session`` (a SQLAlchemy session by the project's naming).
    The bare name ``session`` in a view is Flask's cookie session (``session.get("uid")``)."""
    if isinstance(node, ast.Call):
        node = node.func
    return isinstance(node, ast.Attribute) and node.attr == "session"


def _calls(tree: ast.AST, function: str | None = None):
    """(name of the innermost enclosing function or None, call) for every call in ``tree``."""
    for child in ast.iter_child_nodes(tree):
        inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
        if isinstance(child, ast.Call):
            yield function, child
        yield from _calls(child, inner)


def violations(module: str, source: str) -> list[str]:
    """Every broken rule in one module's source, as readable lines."""
    tree = ast.parse(source)
    found = []
    own = _layer(module)
    for line, name in _imports(tree, module):
        if _in(module, BELOW_VIEWS) and _in(name, FLASK):
            found.append(f"{module}:{line} imports {name}: no Flask below the views")
        target = _layer(name)
        if own and target and target != own:
            if RANK[target] > RANK[own]:
                found.append(f"{module}:{line} imports {name}: a higher layer than {own}")
            elif RANK[target] == RANK[own]:
                found.append(f"{module}:{line} imports {name}: {own} and {target} do not import each other")
        if target in VIEWS + ("dlts.app",) and not _in(module, VIEWS + ENTRY_POINTS):
            found.append(f"{module}:{line} imports {name}: only the entry points import the web layer and the app")
        if _in(module, VIEWS) and _in(name, "sqlalchemy") and not _in(name, "sqlalchemy.exc"):
            found.append(f"{module}:{line} imports {name}: views build no query (only sqlalchemy.exc's errors)")
        if _in(module, VIEWS) and target == "dlts.repositories":
            found.append(f"{module}:{line} imports {name}: views call services, not repositories")
        if _in(module, BELOW_VIEWS) and target in VIEWS + ("dlts.app", "dlts.schemas"):
            if not (own and target and RANK[target] > RANK[own]):  # scheduler, jobmanager: not ranked above
                found.append(f"{module}:{line} imports {name}: a higher layer than {module.split('.')[1]}")
    for function, node in _calls(tree):
        if not isinstance(node.func, ast.Attribute):
            continue
        method, owner = node.func.attr, node.func.value
        if _in(module, VIEWS) and module not in VIEW_WHITELIST and (
                method in QUERY_METHODS or (method in SESSION_METHODS and _is_session(owner))):
            found.append(f"{module}:{node.lineno} runs session.{method}: views call a service")
        if method in ("commit", "rollback") and not node.args and module != TRANSACTION_OWNER \
                and (module, function) not in TRANSACTION_PLUMBING:
            found.append(f"{module}:{node.lineno} calls {method}(): only services.transaction ends a transaction")
    return list(dict.fromkeys(found))  # an import of several names from one module: said once per name


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted((SRC / "dlts").rglob("*.py")):
        if "migrations" in path.parts:
            continue
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append((".".join(parts), path))
    return out


def test_the_source_keeps_the_layers():
    modules = _modules()
    assert len(modules) > 100 and any(m == "dlts.services.transaction" for m, _ in modules)
    problems = [v for module, path in modules for v in violations(module, path.read_text())]
    assert problems == []


@pytest.mark.parametrize(("module", "source", "expected"), [
    ("dlts.services.example", "from flask import g\n", "no Flask below the views"),
    ("dlts.repositories.example", "def f():\n    from werkzeug.exceptions import NotFound\n", "no Flask below the views"),
    ("dlts.jobmanager.example", "import flask\n", "no Flask below the views"),
    ("dlts.scheduler.example", "from flask_sqlalchemy import SQLAlchemy\n", "no Flask below the views"),
    ("dlts.api.example", "def v():\n    return db.session.execute(q)\n", "views call a service"),
    ("dlts.portal.example", "def v(session):\n    return session.scalars(q)\n", "views call a service"),
    ("dlts.api.example", "def v():\n    return db.session().execute(q)\n", "views call a service"),  # the project's spelling
    ("dlts.portal.example", "def v():\n    s = db.session()\n    return s.scalar_one(q)\n", "views call a service"),
    ("dlts.api.example", "def v(i):\n    return db.session().get(Job, i)\n", "views call a service"),
    ("dlts.portal.example", "def v(job):\n    db.session.add(job)\n", "views call a service"),
    ("dlts.api.example", "import sqlalchemy as sa\n", "views build no query"),
    ("dlts.portal.example", "from sqlalchemy import select\n", "views build no query"),
    ("dlts.portal.example", "def v():\n    db.session.rollback()\n", "only services.transaction"),
    ("dlts.api.example", "def v():\n    db.session.commit()\n", "only services.transaction"),
    ("dlts.portal.example", "from dlts.repositories.cluster import sku_shapes\n", "not repositories"),
    ("dlts.repositories.example", "def w(session):\n    session.commit()\n", "only services.transaction"),
    ("dlts.jobmanager.manager", "class M:\n    def tick(self, s):\n        s.commit()\n", "only services.transaction"),
    ("dlts.managers.repair", "def f(session):\n    session.rollback()\n", "only services.transaction"),
    ("dlts.services.jobs", "def kill(session):\n    session.commit()\n", "only services.transaction"),
    ("dlts.db", "def other(c):\n    c.rollback()\n", "only services.transaction"),  # the exception names its function
    ("dlts.services.example", "from dlts.api.jobs import job_dict\n", "a higher layer than dlts.services"),
    ("dlts.repositories.example", "def f():\n    from dlts.services import jobs\n", "a higher layer than dlts.repositories"),
    ("dlts.models.example", "from ..services import jobs\n", "a higher layer than dlts.models"),
    ("dlts.api.example", "from dlts.app import create_app\n", "a higher layer than dlts.api"),
    ("dlts.portal.example", "from dlts.api.schemas import JobSchema\n", "do not import each other"),
    ("dlts.services.example", "from dlts.schemas import JobSubmitSchema\n", "a higher layer than dlts.services"),
    ("dlts.jobmanager.example", "from dlts.portal import core\n", "a higher layer than jobmanager"),
    ("dlts.managers.example", "from dlts.api.schemas import NodeSchema\n", "only the entry points import the web layer"),
    ("dlts.backends.example", "def f():\n    from dlts.app import create_app\n", "only the entry points import"),
    ("dlts.storage.example", "from dlts import portal\n", "only the entry points import the web layer"),
], ids=lambda v: v if isinstance(v, str) and v.startswith("dlts.") else "")
def test_a_module_that_breaks_a_rule_is_named(module, source, expected):
    found = violations(module, source)
    assert any(expected in v for v in found), found


@pytest.mark.parametrize(("module", "source"), [
    ("dlts.services.example", "from dlts.repositories import jobs\nfrom dlts.models import Job\n"),
    ("dlts.services.transaction", "def f(session):\n    session.commit()\n    session.rollback()\n"),
    ("dlts.db", "def rollback_unless_reset(c, _r, _s):\n    c.rollback()\n"),
    ("dlts.jobmanager.example", "def f(session, x):\n    x.commit(session)\n"),  # not a session's commit()
    ("dlts.api.example", "from dlts.services import jobs\nfrom dlts.schemas import JobSubmitSchema\nfrom flask import g\n"),
    ("dlts.portal.example", "def v():\n    return session.get('uid')\n"),  # the cookie session, not a query
    ("dlts.api.example", "def v(g):\n    groups.delete(db.session(), g)\n"),  # a service named delete
    ("dlts.api.example", "from sqlalchemy.exc import OperationalError\n"),  # an error to render, not a query
    ("dlts.app", "from dlts.api import init_api\nfrom dlts.portal import init_portal\n"),
    ("dlts.cli", "def api():\n    from dlts.app import create_app\n"),
    ("dlts.demo", "from dlts.app import create_app\n"),
])
def test_a_module_within_the_rules_passes(module, source):
    assert violations(module, source) == []


# -- no import cycle between the packages of src/dlts ------------------------------------------------
# A unit is a top-level subpackage (dlts.api, dlts.services, dlts.backends, ...) or a top-level module
# (dlts.config, dlts.metrics, ...). Every import counts, those inside functions too (they run), but not
# those under ``if TYPE_CHECKING:``: an annotation names a type and runs none of its module's code.


def _unit(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _runtime_imports(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node.test)
               for stmt in node.body for n in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from a package's __init__ "." is the package itself
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            # "from dlts import metrics" imports the unit dlts.metrics
            found += [(node.lineno, f"{name}.{a.name}") for a in node.names] if name == "dlts" else [(node.lineno, name)]
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def package_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, dict[str, str]]:
    """{unit: {unit it imports: "module:line" of one such import}} from {module: (source, is_package)}."""
    graph: dict[str, dict[str, str]] = {}
    for module, (source, is_package) in sources.items():
        for line, name in _runtime_imports(ast.parse(source), module, is_package):
            if not name.startswith("dlts.") or _unit(name) == _unit(module):
                continue
            graph.setdefault(_unit(module), {}).setdefault(_unit(name), f"{module}:{line}")
    return graph


def cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one unit (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(unit: str) -> None:
        index[unit] = low[unit] = len(index)
        stack.append(unit)
        for other in graph.get(unit, {}):
            if other not in index:
                visit(other)
                low[unit] = min(low[unit], low[other])
            elif other in stack:
                low[unit] = min(low[unit], index[other])
        if low[unit] == index[unit]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == unit:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for unit in sorted(graph):
        if unit not in index:
            visit(unit)
    return found


def _sources() -> dict[str, tuple[str, bool]]:
    return {module: (path.read_text(), path.name == "__init__.py") for module, path in _modules()}


def test_no_import_cycle_between_the_packages():
    graph = package_graph(_sources())
    assert {"dlts.api", "dlts.portal", "dlts.services", "dlts.backends", "dlts.jobmanager"} <= set(graph)
    problems = [" <-> ".join(c) + ": " + "; ".join(f"{u} -> {v} ({graph[u][v]})" for u in c for v in graph[u] if v in c)
                for c in cycles(graph)]
    assert problems == []


def test_a_cycle_between_packages_is_found_and_a_type_checking_import_is_not_one():
    sources = {
        "dlts.services.jobs": ("from dlts.backends.base import LaunchSpec\n", False),
        "dlts.backends.render": ("def f():\n    from ..services import jobs\n", False),  # inside a function: it runs
        "dlts.config": ("from dlts.backends import k8s_settings\n", False),
        "dlts.backends": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dlts.config import Settings\n", True),
        "dlts.models.job": ("from dlts import metrics\n", False),
    }
    graph = package_graph(sources)
    assert graph["dlts.backends"] == {"dlts.services": "dlts.backends.render:2"}
    assert graph["dlts.models"] == {"dlts.metrics": "dlts.models.job:1"}
    assert cycles(graph) == [["dlts.backends", "dlts.services"]]
