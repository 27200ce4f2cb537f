"""The import graph of the three packages (dlts, dlts_agent, dlts_lustre), read from the source with ``ast``:
no import circles between modules, and no arrow that ARCHITECTURE.md's layers forbid.

Every import is an arrow: at the top of a module, inside a function (a local import still runs,
only later), and under ``if TYPE_CHECKING:`` too (the reader of an annotation still needs the other
module, and a circle hidden there comes back the day the type is needed at run time). One arrow
is left out: the implicit one from ``a.b.c`` to its packages ``a`` and ``a.b``, which Python imports
first; a package's ``__init__`` that re-exports its modules would otherwise form a circle with each.

``from pkg import name`` is an arrow to ``pkg.name`` when that is a module, else to ``pkg``.
A circle is a strongly connected component of more than one module. ``ALLOWED_CYCLES`` lists the
ones tolerated for now (none), each with its reason: a new one fails here, naming its modules and
one import of each arrow inside it. ``tests/core/test_layers.py`` checks the same source for the
layers of ``src/dlts`` at the level of its packages (and queries in views, transactions).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"dlts": ROOT / "src", "dlts_agent": ROOT / "agents", "dlts_lustre": ROOT / "lustre"}
SKIPPED_DIRS = {"migrations"}  # Alembic's revisions: loaded by Alembic from files, not imported

# Circles tolerated for now: frozenset of modules -> why, and what would resolve it. Empty: every
# circle found when this check was written (five two-module ones) was resolved by a move.
ALLOWED_CYCLES: dict[frozenset[str], str] = {}

_PURE = ("dlts.scheduler", "dlts.repair", "dlts.insight", "dlts.sim")
_DATABASE = ("dlts.models", "dlts.repositories", "dlts.db", "dlts.extensions")
_WEB = ("dlts.api", "dlts.portal", "dlts.app", "dlts.schemas")
_SHELLS = ("dlts.jobmanager", "dlts.managers", "dlts.backends", "dlts.storage", "dlts.logstore", "dlts.cli",
           "dlts.demo")

# what acts on the cluster (the backends' settings and renderers are values, not listed)
_CLUSTER = ("dlts.jobmanager", "dlts.backends.base", "dlts.backends.local", "dlts.backends.kubernetes",
            "dlts.backends.k8s_watch")

# (importer prefix, imported prefixes, the reason, from ARCHITECTURE.md and docs/architecture.md)
FORBIDDEN: list[tuple[str, tuple[str, ...], str]] = [
    *[(core, (*_DATABASE, "dlts.services", *_WEB, *_SHELLS, "dlts.config", "dlts.metrics"),
       "a pure core takes values and returns decisions: no database, no web, no I/O, no configuration")
      for core in _PURE],
    ("dlts.models", ("dlts.repositories", "dlts.services", *_WEB, "dlts.jobmanager", "dlts.managers",
                     "dlts.backends"),
     "models import the pure cores' types only (api/portal -> services -> repositories -> models)"),
    ("dlts.repositories", ("dlts.services", *_WEB, "dlts.jobmanager", "dlts.managers"),
     "repositories query for services, the job manager and the portal; they call none of them"),
    ("dlts.services", (*_WEB, "dlts.jobmanager", "dlts.managers", "dlts.cli", "dlts.demo"),
     "use-cases are called by the views and the shells, never the other way"),
    ("dlts.api", ("dlts.repositories", "dlts.portal", *_CLUSTER),
     "a view parses, authorises, calls one service and renders; the API never touches the cluster"),
    ("dlts.portal", ("dlts.repositories", "dlts.api", *_CLUSTER),
     "a view parses, authorises, calls one service and renders; the portal never touches the cluster"),
    ("dlts.backends", ("dlts.config", "dlts.services", *_DATABASE, *_WEB, "dlts.jobmanager", "dlts.managers"),
     "a backend is handed its values; config.py reads the backends' settings (k8s_settings), so "
     "an arrow back up is a circle"),
    ("dlts.config", ("dlts.services", *_DATABASE, *_WEB, "dlts.jobmanager", "dlts.managers", "dlts.cli"),
     "every process loads the one Settings; its sections come from below it"),
    ("dlts.client", (*_DATABASE, "dlts.services", *_WEB, *_SHELLS, "dlts.config"),
     "the user's commands are an HTTP client of the REST API: no database, no server configuration"),
    ("dlts_agent", ("dlts",), "the node agent reaches the control plane over HTTP only"),
    ("dlts_lustre", ("dlts", "dlts_agent"), "the Lustre wrapper stands alone; DLTS and the agent use it"),
]


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def modules() -> dict[str, tuple[Path, bool]]:
    """{module name: (its file, whether it is a package's __init__)} of the three packages."""
    found = {}
    for package, base in PACKAGES.items():
        for path in sorted((base / package).rglob("*.py")):
            if SKIPPED_DIRS & set(path.relative_to(base).parts):
                continue
            parts = list(path.relative_to(base).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found[".".join(parts)] = (path, is_package)
    return found


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterable[tuple[int, str, list[str]]]:
    """(line, module named, names imported from it) for every import statement, wherever it is."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from a package's __init__, "." is the package itself
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            yield node.lineno, name, [alias.name for alias in node.names]


def _known(name: str, known: Iterable[str]) -> str | None:
    """The module of ours that ``name`` names (``a.b.Class`` -> ``a.b``), or None."""
    known = set(known)
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(sources: dict[str, tuple[str, bool]], where: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
    """{module: {module it imports: "file:line" of one such import}} from {module: (source, is_package)}."""
    graph: dict[str, dict[str, str]] = {}
    for module, (source, is_package) in sources.items():
        arrows = graph.setdefault(module, {})
        for line, name, names in _imported_names(ast.parse(source), module, is_package):
            targets = [f"{name}.{n}" if f"{name}.{n}" in sources else name for n in names] or [name]
            for target in filter(None, (_known(t, sources) for t in targets)):
                if target != module:
                    arrows.setdefault(target, f"{(where or {}).get(module, module)}:{line}")
    return graph


def cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in graph.get(module, {}):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for module in sorted(graph):
            if module not in index:
                visit(module)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def cycle_problems(graph: dict[str, dict[str, str]], allowed: dict[frozenset[str], str]) -> list[str]:
    return [" <-> ".join(c) + ": " + "; ".join(f"{u} -> {v} ({graph[u][v]})" for u in c for v in graph[u] if v in c)
            for c in cycles(graph) if frozenset(c) not in allowed]


def forbidden_arrows(graph: dict[str, dict[str, str]]) -> list[str]:
    return [f"{importer} -> {imported} ({at}): {reason}"
            for importer, arrows in sorted(graph.items()) for imported, at in arrows.items()
            for prefix, targets, reason in FORBIDDEN
            if _under(importer, prefix) and any(_under(imported, t) for t in targets)]


def _the_graph() -> dict[str, dict[str, str]]:
    found = modules()
    sources = {m: (path.read_text(), is_package) for m, (path, is_package) in found.items()}
    return import_graph(sources, {m: str(path.relative_to(ROOT)) for m, (path, _) in found.items()})


def test_no_import_circle_between_modules():
    graph = _the_graph()
    assert {"dlts.scheduler.core", "dlts_agent.actions", "dlts_lustre.client"} <= set(graph) and len(graph) > 150
    assert cycle_problems(graph, ALLOWED_CYCLES) == []


def test_every_allowed_circle_is_still_there():
    """An allowance outlives its circle only by mistake: a resolved one is taken out of the list."""
    present = {frozenset(c) for c in cycles(_the_graph())}
    assert [sorted(c) for c in ALLOWED_CYCLES if c not in present] == []


def test_no_arrow_the_layers_forbid():
    assert forbidden_arrows(_the_graph()) == []


# -- the checks can fail ----------------------------------------------------------------------------

SYNTHETIC = {
    "dlts": ("", True),
    "dlts.config": ("from dlts.backends import k8s_settings\n", False),
    "dlts.backends": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dlts.config import Settings\n",
                      True),
    "dlts.backends.k8s_settings": ("import os\n", False),
    "dlts.storage": ("", True),
    "dlts.storage.scan": ("def scan_root():\n    from . import parallel\n", False),
    "dlts.storage.parallel": ("from .scan import Totals\n", False),
    "dlts.scheduler": ("from dlts.scheduler.core import decide\n", True),  # a package re-exporting its module
    "dlts.scheduler.core": ("from dlts.scheduler import model\nfrom dlts.models import Job\n", False),
    "dlts.scheduler.model": ("", False),
    "dlts.models": ("from dlts.scheduler.model import Placement\n", True),
    "dlts_lustre": ("import dlts.config\n", True),
}


def test_a_circle_is_found_in_functions_and_under_type_checking_but_not_through_a_package():
    graph = import_graph(SYNTHETIC)
    assert graph["dlts.config"] == {"dlts.backends.k8s_settings": "dlts.config:1"}  # a module, not its package
    assert graph["dlts.backends"] == {"dlts.config": "dlts.backends:3"}
    assert graph["dlts.scheduler.core"] == {"dlts.scheduler.model": "dlts.scheduler.core:1",
                                            "dlts.models": "dlts.scheduler.core:2"}
    # backends -> config -> backends.k8s_settings is no circle: the package's __init__ is not an arrow
    # nor is the scheduler package re-exporting its core, which imports a module beside it
    assert cycles(graph) == [["dlts.storage.parallel", "dlts.storage.scan"]]
    problems = cycle_problems(graph, {})
    assert any(p.startswith("dlts.storage.parallel <-> dlts.storage.scan: ") and "dlts.storage.scan:2" in p
               for p in problems), problems
    assert cycle_problems(graph, {frozenset({"dlts.storage.parallel", "dlts.storage.scan"}): "why"}) == []


def test_a_forbidden_arrow_is_named_with_its_reason():
    found = forbidden_arrows(import_graph(SYNTHETIC))
    assert any(f.startswith("dlts.backends -> dlts.config (dlts.backends:3): a backend is handed its values")
               for f in found), found
    assert any(f.startswith("dlts.scheduler.core -> dlts.models (dlts.scheduler.core:2): a pure core") for f in found)
    assert any(f.startswith("dlts_lustre -> dlts.config") for f in found)
    assert not any(f.startswith(("dlts.models -> dlts.scheduler", "dlts.config -> ")) for f in found)

