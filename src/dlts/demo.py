"""``dlts demo``: the whole service in one process on one machine.

SQLite under ``$DLTS_HOME`` (default ``./.dlts``), the API on 127.0.0.1, the job manager in a thread,
jobs as local processes. The first start creates the cluster admin ``admin`` and the user ``alice``
in VC ``default`` whose quota is this machine's capacity, and writes their API tokens to
``$DLTS_HOME/demo-token`` and ``$DLTS_HOME/alice-token``, and gives both random portal passwords,
printed once and kept in ``$DLTS_HOME/demo-credentials`` (``user:password`` lines, mode 600). State
survives restarts.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import threading
from pathlib import Path

import click
import sqlalchemy as sa
from werkzeug.serving import make_server

from dlts import db_migrate
from dlts.app import create_app
from dlts.backends.local import LocalBackend
from dlts.config import Settings
from dlts.db import engine_of, session_factory
from dlts.jobmanager import JobManager
from dlts.models import User
from dlts.services import admin, portal_auth

log = logging.getLogger(__name__)


def _write_secret(path: Path, value: str) -> None:
    path.write_text(value + "\n")
    os.chmod(path, 0o600)


def demo_secret_key(home: Path) -> str:
    path = home / "secret-key"
    if path.exists():
        return path.read_text().strip()
    key = secrets.token_urlsafe(32)
    _write_secret(path, key)
    return key


def bootstrap(session, backend: LocalBackend, home: Path) -> bool:
    """Create admin, alice and VC default on the first start. Returns True when it did."""
    if session.scalar(sa.select(User.id).limit(1)) is not None:
        return False
    node = backend.nodes()[0]
    quota = {node.sku: node.gpus} if node.gpus else {}
    admin.add_user(session, "admin", admin=True)
    admin.add_user(session, "alice")
    admin.add_vc(session, "default", quota, cpu_quota=node.cpu, memory_quota_bytes=node.memory_bytes)
    admin.add_member(session, "default", "alice")
    admin.add_member(session, "default", "admin", admin=True)
    _write_secret(home / "demo-token", admin.new_token(session, "admin", "demo"))
    _write_secret(home / "alice-token", admin.new_token(session, "alice", "demo"))
    # portal logins: random passwords, shown once at this first start and kept in demo-credentials
    lines = []
    for name in ("admin", "alice"):
        password = portal_auth.random_password()
        portal_auth.set_password(session, name, password)
        lines.append(f"{name}:{password}")
    _write_secret(home / "demo-credentials", "\n".join(lines))
    return True


class TickThread(threading.Thread):
    def __init__(self, manager: JobManager, interval_s: float):
        super().__init__(name="jobmanager", daemon=True)
        self.manager, self.interval_s = manager, interval_s
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.manager.tick()
            except Exception:
                log.exception("job manager tick failed; retrying")
            self.stopping.wait(self.interval_s)


def _interrupt(_signum, _frame):
    raise KeyboardInterrupt


def run_demo(settings: Settings) -> None:
    home = settings.home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    if not settings.secret_key:
        settings = settings.model_copy(update={"secret_key": demo_secret_key(home)})
    app = create_app(settings)
    db_migrate.upgrade(engine_of(app))
    backend = LocalBackend(settings.effective_run_dir, demo_gpus=settings.demo_gpus, demo_sku=settings.demo_sku,
                           endpoint_host=settings.endpoint_host)
    sessions = session_factory(app)
    with sessions() as session:
        created = bootstrap(session, backend, home)
    manager = JobManager(sessions, backend, settings)
    manager.sync_nodes(sessions())
    ticker = TickThread(manager, settings.tick_s)
    server = make_server(settings.listen_host, settings.listen_port, app, threaded=True)
    url = f"http://{settings.listen_host}:{server.server_port}"
    node = backend.nodes()[0]
    gpus = "no GPUs" if node.gpus == 0 else f"{node.gpus} {node.sku} GPUs" + (
        " (pretend GPUs from demo_gpus; nothing runs on a real GPU)" if node.sku == settings.demo_sku else "")
    click.echo(f"DLTS demo {'created' if created else 'resumed'} in {home}")
    click.echo(f"  node {node.name}: {gpus}, {node.cpu:g} cores; VC 'default' gets all of it")
    click.echo(f"  API:   {url}/api/v1   (OpenAPI: {url}/api/v1/openapi.json)")
    click.echo(f"  admin API token: {(home / 'demo-token').read_text().strip()}   (also in {home / 'demo-token'}; alice's in {home / 'alice-token'})")
    click.echo(f"  portal: {url}/   logins (user:password) in {home / 'demo-credentials'}")
    if created:
        for line in (home / "demo-credentials").read_text().split():
            click.echo(f"    {line}")
    click.echo(f"  try:   curl -H \"Authorization: Bearer $(cat {home / 'alice-token'})\" {url}/api/v1/me")
    click.echo("Ctrl-C stops the demo (running jobs are stopped and requeued at the next start).", err=False)
    ticker.start()
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        click.echo("stopping: job manager, then running jobs ...")
        server.server_close()
        ticker.stopping.set()
        ticker.join(timeout=30)
        stopped = backend.shutdown_running(min(settings.preempt_grace_s, 10))
        click.echo(f"stopped ({stopped} running job(s) will be requeued at the next start)")
