"""`pip install .` must carry everything: every subpackage, migrations, portal templates."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TREES = {"dlts": ROOT / "src" / "dlts", "dlts_agent": ROOT / "agents" / "dlts_agent", "dlts_lustre": ROOT / "lustre" / "dlts_lustre",
         "dlts_testing": ROOT / "agents" / "dlts_testing"}


@pytest.fixture(scope="module")
def wheel_build(tmp_path_factory) -> tuple[Path, str]:
    """The wheel, and what the build printed (``-v``: setuptools' warnings included)."""
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(out), str(ROOT)],
                          check=True, capture_output=True, text=True, timeout=300)
    return next(out.glob("dlts-*.whl")), done.stdout + done.stderr


@pytest.fixture(scope="module")
def wheel(wheel_build) -> Path:
    return wheel_build[0]


def test_the_build_prints_no_packaging_warnings(wheel_build):
    """Data directories (migrations/versions, portal templates and static, templates/) are declared
    packages: setuptools' "Package '...' is absent from the packages configuration" (about 200 lines
    each time) no longer buries the first screen of `pip install .`."""
    _, output = wheel_build
    warnings = [line.strip() for line in output.splitlines()
                if "absent from the" in line or "_Warning" in line or "SetuptoolsDeprecationWarning" in line]
    assert warnings == [], "\n".join(warnings[:20])


def test_the_wheel_holds_every_package_the_migrations_and_the_templates(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for tree in TREES.values():
        for init in tree.rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            relative = init.relative_to(tree.parent)
            assert str(relative) in names, f"{relative} is missing from the wheel: list its package in setup.cfg"
    assert "dlts/migrations/env.py" in names
    assert any(n.startswith("dlts/migrations/versions/0001") for n in names)
    assert "dlts/migrations/script.py.mako" in names
    for template in (ROOT / "src" / "dlts" / "portal" / "templates").rglob("*.html"):
        assert str(template.relative_to(ROOT / "src")) in names
    assert "dlts/templates/kubernetes/pod.yaml.j2" in names  # the repository's templates/, for operators
    assert "dlts/portal/static/vendor/pico/pico.min.css" in names  # no CDN: the CSS ships with us
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "dlts = dlts.cli:main" in text and "dlts-agent" in text and "dlts-lustre" in text


def test_the_installed_wheel_imports_and_migrates(wheel, tmp_path):
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    code = (
        "import dlts, dlts.cli, dlts.app, dlts_agent, dlts_lustre, sqlalchemy as sa;"
        "from dlts import db_migrate;"
        f"assert dlts.__file__.startswith({str(target)!r}), dlts.__file__;"
        f"e = sa.create_engine('sqlite:///{tmp_path}/x.db'); db_migrate.upgrade(e);"
        "print(db_migrate.current_revision(e) == db_migrate.head_revision() is not None)"
    )
    env = os.environ | {"PYTHONPATH": str(target)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"
