"""Shared fixtures: settings, a migrated database (SQLite, or MariaDB via DLTS_TEST_DATABASE_URL),
the Flask app and client, users with tokens, and a live server (real HTTP + job manager + local backend).

This file is loaded for every test, the pure ones too (tests/scheduler, tests/agent, the Lustre
package's tests), so the application, its database layer and Flask are imported inside the fixtures
that use them: those suites run where only their own dependencies are installed
(tests/test_pure_suites.py proves it).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings as hypothesis_settings

if TYPE_CHECKING:
    from dlts.config import Settings

TEST_DATABASE_URL = os.environ.get("DLTS_TEST_DATABASE_URL", "")

# One suite for everyone: the README's test command and CI draw the same examples every run
# (derandomized), so a run passes where CI passes. Searching for new counterexamples is a command of
# its own (``sh .ci/dev explore``, tests/scheduler/explore.py), which sets DLTS_HYPOTHESIS_PROFILE=explore
# and a random seed per round; what it finds becomes an @example. No deadline in either: a replay's
# time is the machine's load, not a property (the explorer's first round failed on a 344 ms example).
hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
hypothesis_settings.register_profile("explore", derandomize=False, print_blob=True, database=None, deadline=None)
hypothesis_settings.load_profile(os.environ.get("DLTS_HYPOTHESIS_PROFILE", "ci"))
IS_MYSQL = TEST_DATABASE_URL.startswith(("mysql", "mariadb"))


@pytest.fixture(scope="session")
def migrated_template(tmp_path_factory) -> str:
    """Run the real Alembic migrations once per session; tests start from that schema."""
    import sqlalchemy as sa

    from dlts import db_migrate

    if IS_MYSQL:
        engine = sa.create_engine(TEST_DATABASE_URL)
        with engine.begin() as conn:
            conn.execute(sa.text("SET FOREIGN_KEY_CHECKS=0"))
            for table in sa.inspect(conn).get_table_names():
                conn.execute(sa.text(f"DROP TABLE `{table}`"))
            conn.execute(sa.text("SET FOREIGN_KEY_CHECKS=1"))
        db_migrate.upgrade(engine)
        engine.dispose()
        return TEST_DATABASE_URL
    path = tmp_path_factory.mktemp("template") / "template.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    db_migrate.upgrade(engine)
    engine.dispose()
    return str(path)


@pytest.fixture
def database_url(migrated_template, tmp_path) -> str:
    import sqlalchemy as sa

    from dlts.models import Base

    if IS_MYSQL:
        engine = sa.create_engine(TEST_DATABASE_URL)
        with engine.begin() as conn:
            conn.execute(sa.text("SET FOREIGN_KEY_CHECKS=0"))
            for table in reversed(Base.metadata.sorted_tables):
                conn.execute(sa.text(f"DELETE FROM `{table.name}`"))
            conn.execute(sa.text("SET FOREIGN_KEY_CHECKS=1"))
        engine.dispose()
        return TEST_DATABASE_URL
    path = tmp_path / "dlts.db"
    shutil.copy(migrated_template, path)
    return f"sqlite:///{path}"


@pytest.fixture
def settings(tmp_path, database_url) -> Settings:
    return make_settings(tmp_path, database_url)


def make_settings(tmp_path: Path, database_url: str) -> Settings:
    """The tests' settings on ``database_url`` (the ``settings`` fixture's; a test with a database of
    its own, such as a throwaway MariaDB server, overrides ``settings`` with these)."""
    # testnode (4 pretend demo-gpu GPUs, 8 cores) and the fake Kubernetes clusters' GPU nodes also
    # run the tests' CPU-only jobs, as in the demo: no cores kept for free GPUs (sku_reserve "*";
    # the default keeps the proportional share)
    from dlts.config import Settings

    # disk_pressure off: the tests must not hold launches (or notify) by the free space of the machine
    # that runs them; tests/core/test_disk_full.py and test_disk_pressure.py turn it on
    return Settings(home=tmp_path / "home", database_url=database_url, secret_key="test-secret-key-0123456789",
                    tick_s=0.2, preempt_grace_s=2.0, demo_gpus=4, demo_sku="demo-gpu", max_body_bytes=64 * 1024,
                    sku_reserve={"*": {"cpu_per_gpu": 0, "memory_per_gpu_bytes": 0}},
                    disk_pressure={"enabled": False})


@pytest.fixture
def app(settings):
    from dlts.app import create_app
    from dlts.db import engine_of

    settings.home.mkdir(parents=True, exist_ok=True)
    application = create_app(settings)
    application.testing = True
    yield application
    engine_of(application).dispose()


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def sessions(app):
    from dlts.db import session_factory

    return session_factory(app)


@dataclass
class World:
    """A small cluster: VC vision (a100 quota), users with tokens and roles."""

    tokens: dict[str, str]

    def auth(self, user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[user]}"}


@pytest.fixture
def world(sessions) -> World:
    """admin (cluster admin), vcadmin (admin of vision), alice and bob (members of vision),
    carol (member of nlp only). Node: the local machine registered by the job manager later."""
    import sqlalchemy as sa

    from dlts.models import Node
    from dlts.services import admin

    tokens = {}
    with sessions() as s:
        admin.add_vc(s, "vision", {"demo-gpu": 4}, cpu_quota=64, memory_quota_bytes=256 * 2**30)
        admin.add_vc(s, "nlp", {"demo-gpu": 2})
        for name in ("admin", "vcadmin", "alice", "bob", "carol"):
            admin.add_user(s, name, admin=(name == "admin"))
            tokens[name] = admin.new_token(s, name, "test")
        admin.add_member(s, "vision", "vcadmin", admin=True)
        admin.add_member(s, "vision", "alice")
        admin.add_member(s, "vision", "bob")
        admin.add_member(s, "nlp", "carol")
        if s.scalar(sa.select(Node.id).where(Node.name == "testnode")) is None:
            s.add(Node(name="testnode", sku="demo-gpu", gpus=4, cpu=8, memory_bytes=32 * 2**30, ib_domain="local",
                       labels={}, metrics={}))
        s.commit()
    return World(tokens)


@dataclass
class LiveServer:
    url: str
    manager: object
    backend: object

    def tick(self, times: int = 1):
        for _ in range(times):
            self.manager.tick()

    def until(self, condition, what: str, timeout_s: float = 180.0):
        """Tick the job manager until ``condition()`` is truthy (its value is returned); the timeout
        is a bound, never a pause."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.tick()
            value = condition()
            if value:
                return value
            assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
            time.sleep(0.05)  # between polls


@pytest.fixture
def managers_entries(monkeypatch):
    """``managers_entries(config_path)``: what `dlts managers --config PATH` would run, by entry id
    (``Periodic``), from its real start-up up to ``run_forever``, which is not entered."""
    from click.testing import CliRunner

    import dlts.managers
    from dlts.cli import main

    def entries(config: Path) -> dict:
        seen: dict = {}
        monkeypatch.setattr(dlts.managers, "run_forever", lambda given, **kw: seen.update({e.id: e for e in given}))
        result = CliRunner().invoke(main, ["--config", str(config), "managers"])
        assert result.exit_code == 0, result.output
        return seen

    return entries


@pytest.fixture
def live(app, settings, sessions):
    """The API over real HTTP on loopback, a job manager with the local backend (ticked by the test)."""
    from werkzeug.serving import make_server

    from dlts.backends.local import LocalBackend
    from dlts.jobmanager import JobManager

    backend = LocalBackend(settings.effective_run_dir, node_name="testnode", demo_gpus=4, demo_sku="demo-gpu")
    manager = JobManager(sessions, backend, settings)
    with sessions() as s:
        manager.sync_nodes(s)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield LiveServer(f"http://127.0.0.1:{server.server_port}", manager, backend)
    server.shutdown()
    backend.shutdown_running(1)


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config, items):
    """Mark every test that reaches the database, so CI can rerun exactly those on MariaDB."""
    for item in items:
        if "database_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.db)
