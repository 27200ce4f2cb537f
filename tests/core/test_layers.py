"""The layers of src/dlts, read from the source with ``ast`` (ARCHITECTURE.md, STYLE.md rule 1):

    app -> api | portal -> schemas -> services -> repositories -> models

- nothing below the views (services, repositories, models, scheduler, jobmanager) imports Flask;
- views (api/, portal/) run no query of their own: no ``session.execute/scalar(s)/query/get_one``,
  and import no repository (they call services);
- no commit or rollback anywhere but ``dlts.services.transaction``: use-cases, the job manager's
  tick and the managers' passes open ``transaction()``/``step()`` blocks and never end a transaction
  themselves; the one other call is the connection pool's reset (``TRANSACTION_PLUMBING``);
- no package imports a higher layer, and the api and the portal do not import each other.

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
TRANSACTION_OWNER = "dlts.services.transaction"
# (module, function) that may still call commit()/rollback(): plumbing below the sessions, not a unit of work
TRANSACTION_PLUMBING = {("dlts.db", "rollback_unless_reset")}  # a pooled DBAPI connection returned mid-transaction
# werkzeug.security (password hashes) is a library call, not the web stack: not listed
FLASK = ("flask", "flask_sqlalchemy", "flask_smorest", "flask_wtf", "werkzeug.exceptions", "werkzeug.wrappers",
         "webargs", "wtforms")
QUERY_METHODS = {"execute", "scalar", "scalars", "query", "get_one"}
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
    """``db.session``, ``session``, ``self.session`` (a SQLAlchemy session by the project's naming)."""
    if isinstance(node, ast.Name):
        return node.id == "session"
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
        if _in(module, VIEWS) and target == "dlts.repositories":
            found.append(f"{module}:{line} imports {name}: views call services, not repositories")
        if _in(module, BELOW_VIEWS) and target in VIEWS + ("dlts.app", "dlts.schemas"):
            if not (own and target and RANK[target] > RANK[own]):  # scheduler, jobmanager: not ranked above
                found.append(f"{module}:{line} imports {name}: a higher layer than {module.split('.')[1]}")
    for function, node in _calls(tree):
        if not isinstance(node.func, ast.Attribute):
            continue
        method, owner = node.func.attr, node.func.value
        if _in(module, VIEWS) and module not in VIEW_WHITELIST and method in QUERY_METHODS and _is_session(owner):
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
    ("dlts.app", "from dlts.api import init_api\nfrom dlts.portal import init_portal\n"),
])
def test_a_module_within_the_rules_passes(module, source):
    assert violations(module, source) == []
