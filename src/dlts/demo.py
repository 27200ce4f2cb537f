"""``dlts demo``: the whole service in one process on one machine.

SQLite under ``$DLTS_HOME`` (default ``./.dlts``), the API on 127.0.0.1, the job manager in a thread,
jobs as local processes. The first start creates the cluster admin ``admin`` and the user ``alice``
in VC ``default`` whose quota is this machine's capacity, and writes their API tokens to
``$DLTS_HOME/demo-token`` and ``$DLTS_HOME/alice-token``, and gives both random portal passwords,
printed once and kept in ``$DLTS_HOME/demo-credentials`` (``user:password`` lines, mode 600). State
survives restarts.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import secrets
import signal
import threading
from pathlib import Path

import click
import sqlalchemy as sa
from werkzeug.serving import WSGIRequestHandler, make_server

from dlts import db_faults, db_migrate
from dlts.app import create_app
from dlts.backends.local import LocalBackend
from dlts.config import Settings, SkuReserve
from dlts.db import engine_of, session_factory
from dlts.hosts import is_loopback_host
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
    """Runs ``tick`` every ``interval_s`` (the job manager's by default; the repair manager's too)."""

    def __init__(self, manager: JobManager | None, interval_s: float, *, name: str = "jobmanager", tick=None):
        super().__init__(name=name, daemon=True)
        self.manager, self.interval_s = manager, interval_s
        if tick is None:
            assert manager is not None, "a TickThread without a tick of its own runs the manager's"
            tick = manager.tick
        self.tick = tick
        self.stopping = threading.Event()

    def run(self) -> None:
        faults = db_faults.FaultLog(f"{self.name} tick", log)  # a database refusing writes: a line, not a traceback a pass
        while not self.stopping.is_set():
            faults.run(self.tick)
            self.stopping.wait(self.interval_s)


def agent_mode(node, settings: Settings, scenario_name: str | None) -> str:
    """What the demo's node agent reads: ``fake`` (the fake NVML scenario asked for), ``nvml`` (the
    machine's real GPUs, through the real NVML), or ``host`` (no GPU telemetry: the machine has no
    GPU, or only the pretend ones of ``demo_gpus``, which no NVML can see; the agent does not
    pretend to observe them, and reports heartbeats and host health only)."""
    if scenario_name:
        return "fake"
    if node.gpus and node.sku != settings.demo_sku:
        return "nvml"
    return "host"


class QuietReportsHandler(WSGIRequestHandler):
    """The demo's access log without the node agent's answered report of every second (logged at
    debug level: ``dlts -v demo`` shows them); a report the API refused is still logged."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if self.command == "POST" and self.path.endswith("/report") and str(code).startswith("2"):
            logging.getLogger("werkzeug").debug("%s %s %s", self.command, self.path, code)
            return
        super().log_request(code, size)


def start_agent(settings: Settings, sessions, node, url: str, scenario_name: str | None = None):
    """The real node agent for the demo's node, reporting to the demo's API every second.

    With ``scenario_name`` it reads that fake NVML scenario (``dlts_testing.fake_nvml``; its reports
    say so and only the demo's API acts on them) and its GPU resets act on the fake GPUs
    (``FakeDriver``; a reboot is refused). Without, it reads the real NVML where the machine has
    GPUs, and nothing GPU-related where it has none or only pretend ones; it carries out no repair
    action then (``actions.enabled: false``: a demo does not reset or reboot your machine): a real
    fault takes the node through quarantine to ``out_of_service``, for you to look at. The agent
    reads this machine's /proc (it sees the demo's jobs) but not its kernel log."""
    from dlts.services import nodes as node_service
    from dlts_agent.agent import Agent
    from dlts_agent.config import config_from_mapping

    mode = agent_mode(node, settings, scenario_name)
    lib = deferred = None
    if mode == "fake":
        from dlts_testing.fake_nvml import DeferredFaults, scenario

        assert scenario_name is not None  # agent_mode says "fake" only for a named scenario
        faulty = scenario(scenario_name)
        faulty.gpus = faulty.gpus[: node.gpus]
        deferred = DeferredFaults(faulty)  # each faulty GPU fails once a job runs on it
        lib = deferred.lib
    home = settings.home.resolve() / "agent"
    home.mkdir(parents=True, exist_ok=True)
    (home / "kmsg").touch()
    with sessions() as session:
        token = node_service.issue_node_token(session, node.name)
    _write_secret(home / "node-token", token)
    gpus = len(lib.gpus) if lib is not None else node.gpus if mode == "nvml" else 0
    cfg = config_from_mapping({
        "node_name": node.name, "interval_s": 1, "state_dir": str(home), "expected_gpu_count": gpus,
        "exporter": {"enabled": False}, "firewall": {"enabled": False},
        "actions": {"enabled": mode == "fake"},
        "collectors": {"host": {"mounts": [str(settings.home.resolve())]},
                       "gpu": {"enabled": mode != "host"},
                       # this demo's jobs only (not another demo's or a test run's on this machine)
                       "jobs": {"local_run_dir": str(settings.effective_run_dir.resolve())},
                       "xid": {"source": "kmsg", "kmsg_path": str(home / "kmsg"), "nvml_events": mode != "host"}},
        "report": {"enabled": True, "api_url": url, "node_token_file": str(home / "node-token"), "interval_s": 1},
    })
    agent = Agent(cfg, nvml_lib=lib)
    if lib is not None:
        from dlts_testing.fake_nvml import FakeDriver

        agent.executor.runner = FakeDriver(lib)
    stop = threading.Event()

    def run(stop: threading.Event) -> None:
        if deferred is not None:
            threading.Thread(target=faults_on_use, args=(deferred, sessions, node.name, stop), name="fake-faults",
                             daemon=True).start()
        agent.run(stop)

    thread = threading.Thread(target=run, args=(stop,), name="agent", daemon=True)
    return agent, stop, thread, mode


def faults_on_use(deferred, sessions, node_name: str, stop: threading.Event, poll_s: float = 0.5) -> None:
    """The fake scenario's faults appear on a GPU once a job runs on it, so the story a newcomer
    watches is the one that matters: a job on the GPU, the fault, the job moved off, the repair."""
    import sqlalchemy as sa

    from dlts.models import JobAttempt

    while deferred.pending and not stop.wait(poll_s):
        try:
            with sessions() as session:
                running = session.scalars(sa.select(JobAttempt.placements).where(
                    JobAttempt.started_at.is_not(None), JobAttempt.ended_at.is_(None))).all()
        except sa.exc.SQLAlchemyError:  # the database is busy: the next poll sees it
            continue
        for placements in running:
            for placement in placements or []:
                if placement.get("node") == node_name:
                    for index in placement.get("gpu_indices") or []:
                        deferred.use(int(index))


def private_state(settings: Settings) -> None:
    """Only the demo's user may read its state: tokens, the secret key, the database, logs and run
    directories (umask 077 for every file the demo and its jobs make, and 0700/0600 on what an
    earlier start, or a CLI command in a second terminal, made with a looser umask)."""
    os.umask(0o077)
    home = settings.home.resolve()
    dirs = [home, settings.effective_log_dir, settings.effective_run_dir, home / "agent"]
    for directory in dirs:
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
    url = settings.effective_database_url
    if url.startswith("sqlite:///"):
        database = Path(url[len("sqlite:///"):])
        for path in (database, Path(f"{database}-wal"), Path(f"{database}-shm"), Path(f"{database}-journal")):
            if path.exists():
                os.chmod(path, 0o600)


def _interrupt(_signum, _frame):
    raise KeyboardInterrupt


def run_demo(settings: Settings, fake_nvml: str | None = None) -> None:
    if not is_loopback_host(settings.listen_host) and not settings.local_backend_trusted_users:
        # reachable from other machines, the demo serves other people: its jobs run as you
        raise click.ClickException(
            f"listen_host: {settings.listen_host} lets other machines reach the demo, whose jobs run on this machine "
            "as you (they can read your files and the demo's admin token); keep the demo on 127.0.0.1, or set "
            "local_backend_trusted_users: true if everyone who can reach it may act as you (docs/security-host.md)")
    home = settings.home.resolve()
    private_state(settings)
    if not settings.secret_key:
        settings = settings.model_copy(update={"secret_key": demo_secret_key(home)})
    if fake_nvml:
        from dlts_agent.nvml import real_gpu_devices
        from dlts_testing.fake_nvml import SCENARIOS

        devices = real_gpu_devices()
        if devices:
            raise click.ClickException(f"--fake-nvml is refused on a machine with NVIDIA devices ({devices[0]}): "
                                       "run the demo without it, and the agent reads the real GPUs")
        if fake_nvml not in SCENARIOS:
            raise click.ClickException(f"unknown fake NVML scenario {fake_nvml!r}; choose one of {', '.join(SCENARIOS)}")
        # a cycle a newcomer can watch: a pass every 2 s, a 10 s quiet period (or less if configured)
        repair = settings.repair.model_copy(update={"interval_s": min(settings.repair.interval_s, 2.0),
                                                    "quiet_period_s": min(settings.repair.quiet_period_s, 10.0)})
        settings = settings.model_copy(update={"repair": repair, "demo_gpus": settings.demo_gpus or 8})
    if not settings.sku_reserve:
        # one machine for everything: keep no cores for its (pretend or real) GPUs, so CPU-only jobs
        # run in the demo (on a cluster GPU nodes keep cpu_per_gpu per free GPU; docs/scheduling.md)
        settings = settings.model_copy(update={"sku_reserve": {"*": SkuReserve(cpu_per_gpu=0, memory_per_gpu_bytes=0)}})
    app = create_app(settings)
    app.config["DLTS_DEMO"] = True  # the API acts on reports of the demo's fake-NVML agent
    db_migrate.upgrade(engine_of(app))
    backend = LocalBackend(settings.effective_run_dir, demo_gpus=settings.demo_gpus, demo_sku=settings.demo_sku,
                           endpoint_host=settings.endpoint_host)
    sessions = session_factory(app)
    with sessions() as session:
        created = bootstrap(session, backend, home)
    manager = JobManager(sessions, backend, settings)
    manager.sync_nodes(sessions())
    from dlts.managers.metrics import managers_registry
    from dlts.metrics import instrumented

    # no managers process here: the demo's /metrics also serves what `dlts managers` would
    app.extensions["dlts_metrics_registry"] = managers_registry(sessions)
    ticker = TickThread(manager, settings.tick_s, tick=instrumented("jobmanager.tick", manager.tick))
    from dlts.managers.repair import RepairManager

    repairer = TickThread(None, settings.repair.interval_s, name="repair",
                          tick=instrumented("repair.tick", RepairManager(sessions, settings).run_once))
    from dlts.managers.accounting import AccountingManager

    accountant = TickThread(None, settings.accounting_interval_s, name="accounting",
                            tick=instrumented("accounting.book",
                                              AccountingManager(sessions, settings.utilisation_retention_days).run_once))
    from dlts.managers.insight import InsightManager

    insight = TickThread(None, settings.insight.interval_s, name="insight",
                         tick=instrumented("insight.run", InsightManager(sessions, settings).run_once))
    from dlts.jobmanager.forecast import ForecastManager

    # every waiting job's forecast start; every 30 s at most here, so a newcomer sees one soon
    forecasts = ForecastManager(sessions, settings)
    forecaster = TickThread(None, min(settings.forecast.interval_s, 30.0), name="forecast",
                            tick=instrumented("forecast.run", forecasts.run_once))
    server = make_server(settings.listen_host, settings.listen_port, app, threaded=True,
                         request_handler=QuietReportsHandler)
    url = f"http://{settings.listen_host}:{server.server_port}"
    node = backend.nodes()[0]
    _agent, agent_stop, agent_thread, agent_reads = start_agent(settings, sessions, node, url, fake_nvml)
    gpus = "no GPUs" if node.gpus == 0 else f"{node.gpus} {node.sku} GPUs" + (
        " (pretend GPUs from demo_gpus; nothing runs on a real GPU)" if node.sku == settings.demo_sku else "")
    click.echo(f"DLTS demo {'created' if created else 'resumed'} in {home}")
    click.echo(f"  node {node.name}: {gpus}, {node.cpu:g} cores; VC 'default' gets all of it")
    click.echo(f"  API:   {url}/api/v1   (OpenAPI: {url}/api/v1/openapi.json)")
    click.echo(f"  admin API token: {(home / 'demo-token').read_text().strip()}   "
               f"(also in {home / 'demo-token'}; alice's in {home / 'alice-token'})")
    click.echo(f"  portal: {url}/   sign in as alice (member of VC default) or admin (cluster admin); "
               f"their passwords are in {home / 'demo-credentials'} (user:password lines)")
    if created:
        for line in (home / "demo-credentials").read_text().split():
            click.echo(f"    {line}")
    click.echo(f"  CLI:   dlts login {url} --token-file {home / 'alice-token'}"
               "   then: dlts submit --image pytorch/pytorch --wait -- echo hello")
    click.echo(f"  try:   curl -H \"Authorization: Bearer $(cat {home / 'alice-token'})\" {url}/api/v1/me")
    if agent_reads == "fake":
        click.echo(f"  node agent: fake NVML scenario {fake_nvml!r} (a faulty GPU fails once a job runs on it: submit one); "
                   f"watch the repair loop with `dlts node show {node.name}` or {url}/repair")
    elif agent_reads == "nvml":
        click.echo(f"  node agent: this machine's GPUs (NVML); it carries out no repair action in the demo "
                   f"(`dlts node show {node.name}`)")
    else:
        click.echo("  node agent: no GPU telemetry (" + ("pretend GPUs: no NVML sees them" if node.gpus else "no GPUs")
                   + f"); heartbeats and host health (`dlts node show {node.name}`); "
                   "--fake-nvml SCENARIO shows a repair cycle")
    click.echo("Ctrl-C stops the demo (running jobs are stopped and requeued at the next start).", err=False)
    ticker.start()
    if settings.repair.enabled:
        repairer.start()
    accountant.start()
    if settings.insight.enabled:
        insight.start()
    if settings.forecast.enabled:
        forecaster.start()
    agent_thread.start()
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    # `kill -USR1 <pid>`: every thread's stack on stderr (what a stuck demo is waiting for)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        click.echo("stopping: job manager, then running jobs ...")
        server.server_close()
        ticker.stopping.set()
        repairer.stopping.set()
        accountant.stopping.set()
        insight.stopping.set()
        forecaster.stopping.set()
        agent_stop.set()
        agent_thread.join(timeout=10)
        ticker.join(timeout=30)
        if repairer.is_alive():
            repairer.join(timeout=30)
        if forecaster.is_alive():
            forecaster.join(timeout=30)
        forecasts.close()
        stopped = backend.shutdown_running(min(settings.preempt_grace_s, 10))
        click.echo(f"stopped ({stopped} running job(s) will be requeued at the next start)")
