"""The ``dlts`` command: demo, api, managers, db, user, vc, config (and sim, render when present).

Every command reads the same layered settings (``--config``, ``DLTS_*``, ``DLTS_HOME``), so an operator
can add users to a running demo from a second terminal with the same ``DLTS_HOME``. Errors print one
line naming the field and exit non-zero; no traceback reaches the user.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import sys
from collections.abc import Callable
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from dlts.config_layers import ConfigError
from dlts.errors import DltsError

if TYPE_CHECKING:
    from dlts.config import Settings
    from dlts.storage.settings import StorageSettings


class Context:
    def __init__(self, config_file: str | None):
        self.config_file = config_file
        self._settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            from dlts.config import load_settings  # every section's model: ~0.07 s of CPU, so not at import

            try:
                self._settings = load_settings(self.config_file)
            except ConfigError as exc:
                raise click.ClickException(str(exc)) from None
        return self._settings

    @property
    def storage_settings(self) -> StorageSettings:
        """The ``storage:`` section alone (the same file and ``DLTS_STORAGE__*`` variables), for a
        command that needs nothing else: the other sections are neither built nor checked."""
        if self._settings is not None:
            return self._settings.storage
        from dlts.config_layers import load_section
        from dlts.storage.settings import StorageSettings

        try:
            return load_section("storage", StorageSettings, self.config_file)
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from None

    @contextmanager
    def sessions(self):
        """A session factory on the configured database, for commands that run a manager's pass."""
        from sqlalchemy.orm import sessionmaker

        with self.session() as session:  # reachable, and the demo's SQLite schema upgraded
            factory = sessionmaker(bind=session.get_bind(), expire_on_commit=False,
                                   info={"dlts_settings": self.settings})
            yield factory

    @contextmanager
    def session(self):
        """A session on the configured database (schema upgraded on demand for the demo's SQLite)."""
        from sqlalchemy.exc import OperationalError

        from dlts import db_migrate
        from dlts.app import create_app
        from dlts.db import engine_of, session_factory

        app = create_app(self.settings)
        engine = engine_of(app)
        try:
            if self.settings.effective_database_url.startswith("sqlite"):
                self.settings.home.mkdir(parents=True, exist_ok=True)
                db_migrate.upgrade(engine)
            with session_factory(app)() as session:
                yield session
        except DltsError as exc:
            raise click.ClickException(exc.message) from None
        except OperationalError as exc:
            raise click.ClickException(f"cannot reach the database ({exc.orig}); check database_url") from None
        finally:
            engine.dispose()


pass_ctx = click.make_pass_decorator(Context)


class OnDemandGroup(click.Group):
    """A group some of whose commands are added when first needed: before it lists its commands, or
    looks up a name it does not have yet, it runs its ``on_demand`` registrations (once each)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_demand: list[Callable[[], None]] = []

    def load_on_demand(self) -> None:
        while self.on_demand:
            self.on_demand.pop(0)()

    def list_commands(self, ctx: click.Context) -> list[str]:
        self.load_on_demand()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands:
            self.load_on_demand()
        return super().get_command(ctx, name)


class SectionedGroup(OnDemandGroup):
    """``dlts --help`` lists the user commands (they talk to the REST API, from anywhere) apart from
    the server commands (they run on the control host with the database's credentials). A command
    is a user command when it carries ``dlts_section = "user"``; a server group's user subcommands
    (``vc show``) are listed with the user commands too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # name -> a function returning the command, imported when first asked for
        self.lazy: dict[str, Callable[[], click.Command]] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands:
            self.load_on_demand()
        if name not in self.commands and name in self.lazy:
            self.add_command(self.lazy[name](), name)
        return super().get_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        user_rows, server_rows = [], []
        limit = 150  # the whole first sentence; the formatter wraps it
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is None or command.hidden:
                continue
            row = (name, command.get_short_help_str(limit))
            if getattr(command, "dlts_section", None) == "user":
                user_rows.append(row)
                continue
            server_rows.append(row)
            if isinstance(command, click.Group):
                for sub_name in command.list_commands(ctx):
                    sub = command.get_command(ctx, sub_name)
                    if sub is not None and getattr(sub, "dlts_section", None) == "user":
                        user_rows.append((f"{name} {sub_name}", sub.get_short_help_str(limit)))
        if user_rows:
            with formatter.section("User commands (the REST API; run `dlts login URL` first)"):
                formatter.write_dl(sorted(user_rows))
        if server_rows:
            with formatter.section("Server commands (on the control host, with the database)"):
                formatter.write_dl(server_rows)


@click.group(cls=SectionedGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_file", type=click.Path(dir_okay=False), envvar="DLTS_CONFIG",
              help="YAML config file (default: $DLTS_HOME/dlts.yaml or /etc/dlts/dlts.yaml).")
@click.option("-v", "--verbose", is_flag=True, help="Log debug messages.")
@click.pass_context
def main(ctx: click.Context, config_file: str | None, verbose: bool) -> None:
    """DLTS: Deep Learning Training Service.

    User commands talk to the REST API with a stored token (`dlts login URL`), from any machine;
    server commands run where the service runs and use its configuration. Exit codes and shell
    completion: docs/cli.md."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.DEBUG if verbose else logging.WARNING)
    ctx.obj = Context(config_file)


# -- services ---------------------------------------------------------------------------------

@main.command()
@click.option("--port", type=click.IntRange(0, 65535), help="API port (default: listen_port, 5000).")
@click.option("--demo-gpus", type=click.IntRange(0, 64), help="Pretend the machine has N GPUs (no real GPU use).")
@click.option("--fake-nvml", "fake_nvml", metavar="SCENARIO",
              help="Run the node agent on a fake NVML scenario (dbe-gpu3, remap-failure, ...) to watch a repair cycle; "
                   "refused where NVIDIA devices exist.")
@pass_ctx
def demo(ctx: Context, port: int | None, demo_gpus: int | None, fake_nvml: str | None) -> None:
    """Run everything embedded: API, job manager, repair manager, local jobs, SQLite under $DLTS_HOME."""
    from dlts.demo import run_demo

    settings = ctx.settings
    updates = {k: v for k, v in {"listen_port": port, "demo_gpus": demo_gpus}.items() if v is not None}
    run_demo(settings.model_copy(update=updates) if updates else settings, fake_nvml=fake_nvml)


@main.command()
@click.option("--workers", type=click.IntRange(1, 256), help="gunicorn workers (default: 2 x cores + 1).")
@pass_ctx
def api(ctx: Context, workers: int | None) -> None:
    """Serve the REST API and portal under gunicorn on listen_host:listen_port."""
    import multiprocessing
    import os
    import shutil
    import tempfile

    from gunicorn.app.base import BaseApplication

    from dlts.app import create_app
    from dlts.config import require_production_secrets, require_trusted_local_backend

    settings = ctx.settings
    try:
        require_production_secrets(settings)
        require_trusted_local_backend(settings)  # the API takes the jobs a local backend would run
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None

    metrics_dir = None
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR") and "prometheus_client" not in sys.modules:
        # every worker writes its metrics here and /metrics sums them (docs/monitoring.md); set
        # before prometheus_client is imported, which fixes the mode at import time. Ours, so
        # removed when the server exits; one the operator set (the systemd unit's) is theirs
        metrics_dir = tempfile.mkdtemp(prefix="dlts-api-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    master = os.getpid()
    from dlts.gunicorn_conf import child_exit, post_request, pre_request

    class Server(BaseApplication):
        def load_config(self):
            self.cfg.set("bind", f"{settings.listen_host}:{settings.listen_port}")
            self.cfg.set("workers", workers or multiprocessing.cpu_count() * 2 + 1)
            # gthread: a connection holds a thread only while its request is read and served, idle
            # keep-alive ones wait in the worker's event loop; with sync workers two clients sending
            # their headers a byte a second stalled a 2-worker API (docs/security-host.md)
            self.cfg.set("worker_class", "gthread")
            self.cfg.set("threads", settings.api_threads)
            self.cfg.set("timeout", settings.api_timeout_s)
            self.cfg.set("graceful_timeout", min(settings.api_timeout_s, 30))
            self.cfg.set("keepalive", settings.api_keepalive_s)
            self.cfg.set("accesslog", "-")
            self.cfg.set("child_exit", child_exit)
            # the request in serving, for dlts.unread_body to close a connection left with an unread body
            self.cfg.set("pre_request", pre_request)
            self.cfg.set("post_request", post_request)

        def load(self):
            return create_app(settings)

    try:
        Server().run()
    finally:
        # gunicorn's workers are forks of this process that leave through sys.exit, so through this
        # frame (and atexit) too: only the master, once its workers are gone, removes the directory
        if metrics_dir is not None and os.getpid() == master:
            shutil.rmtree(metrics_dir, ignore_errors=True)


@main.command()
@pass_ctx
def managers(ctx: Context) -> None:
    """Run the job manager and the other periodic managers. Run it on several control nodes:
    exactly one acts (the holder of the lease in the database), the others stand by."""
    from dlts.app import create_app
    from dlts.backend_factory import make_backend
    from dlts.db import engine_of, session_factory
    from dlts.jobmanager import JobManager
    from dlts.managers import Periodic, run_forever
    from dlts.managers.accounting import AccountingManager
    from dlts.managers.janitor import Janitor
    from dlts.managers.lease import FencedBackend, Lease, bound_idle_write_transactions
    from dlts.services import allowlist

    settings = ctx.settings
    try:
        backend = make_backend(settings)  # backend: local is refused unless local_backend_trusted_users
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    app = create_app(settings)
    lease = Lease(session_factory(app), settings.effective_lease_holder, settings.lease_s)
    # a process frozen mid-transaction must not hold row locks past its lease (MariaDB/MySQL)
    bound_idle_write_transactions(engine_of(app), settings.lease_s)
    # every state write of every manager checks the lease in its transaction; every backend call
    # is made only while the lease is held with margin
    sessions = lease.fenced_sessions(session_factory(app))
    manager = JobManager(sessions, FencedBackend(backend, lease), settings)
    from dlts.services.jobs import SUBMIT_WINDOW_S

    janitor = Janitor(sessions, settings.retention_days, batch_rows=settings.janitor_batch_rows,
                      pause_s=settings.janitor_pause_s, log_dir=settings.effective_log_dir,
                      idempotency_key_ttl_h=settings.idempotency_key_ttl_h,
                      # a rate counter outlives the longest window any limit counts in (and an hour)
                      counter_window_s=max(settings.login_limit_window_s, SUBMIT_WINDOW_S, 3600.0))
    entries = [Periodic("jobmanager.tick", settings.tick_s, manager.tick, watched=True),
               Periodic("janitor.purge", 3600.0, janitor.run),
               Periodic("allowlist.purge_expired", 600.0, functools.partial(allowlist.purge_expired_entries, sessions)),
               Periodic("accounting.book", settings.accounting_interval_s,
                        AccountingManager(sessions, settings.utilisation_retention_days).run_once)]
    if settings.forecast.enabled:
        from dlts.jobmanager.forecast import ForecastManager

        # every waiting job's forecast start (jobs.forecast_start), in its own thread of the managers
        entries.append(Periodic("forecast.run", settings.forecast.interval_s, ForecastManager(sessions, settings).run_once))
    if settings.repair.enabled:
        from dlts.managers.repair import RepairManager
        from dlts.repair.rules import RuleError

        try:
            repair = RepairManager(sessions, settings)  # a bad rules file stops start-up, naming the rule
        except RuleError as exc:
            raise click.ClickException(str(exc)) from None
        entries.append(Periodic("repair.tick", settings.repair.interval_s, repair.run_once, watched=True))
    from dlts.managers.storage import periodic_entries as storage_entries

    entries.extend(storage_entries(settings, sessions))  # scans, expiry (storage.roots), Lustre
    from dlts.managers.directory import periodic_entries as directory_entries

    entries.extend(directory_entries(settings, sessions))  # users and groups from LDAP (directory.url)
    from dlts.managers.notify import NotifyManager
    from dlts.services.notify import TemplateError

    try:  # off (no notify.smtp_host), it only purges old rows; notices stay queued in the outbox
        notifier = NotifyManager(sessions, settings)
        notifier.check()  # an unreadable password file or templates_dir stops start-up, naming the key
    except (ConfigError, TemplateError) as exc:
        raise click.ClickException(str(exc)) from None
    entries.append(Periodic("notify.send", settings.notify.interval_s, notifier.run_once))
    if settings.insight.enabled:
        from dlts.managers.insight import InsightManager

        # insight messages on running jobs and the VCs' idle-job policy (fenced sessions: its warnings,
        # pauses and kills are state writes like the job manager's)
        entries.append(Periodic("insight.run", settings.insight.interval_s, InsightManager(sessions, settings).run_once))
    from dlts.metrics import instrumented

    # dlts_manager_runs_total
    entries = [dataclasses.replace(e, run=instrumented(e.id, e.run)) for e in entries]
    run_forever(entries, metrics=functools.partial(_serve_managers_metrics, settings, lease.sessions)
                if settings.managers_metrics_listen else None, lease=lease)


def _serve_managers_metrics(settings, sessions):
    """The managers process's /metrics on ``managers_metrics_listen``: its own instruments (ticks,
    scheduler, Kubernetes, manager runs) and the collectors that read the database at scrape time
    (jobs, GPU allocation, the repair loop); docs/monitoring.md."""
    from prometheus_client import start_http_server

    from dlts.managers.metrics import managers_registry

    registry = managers_registry(sessions)
    host, _, port = settings.managers_metrics_listen.rpartition(":")
    try:
        server, _thread = start_http_server(int(port), addr=host.strip("[]"), registry=registry)
    except OSError as exc:
        raise click.ClickException(f"managers_metrics_listen: cannot listen on "
                                   f"{settings.managers_metrics_listen}: {exc.strerror}") from None
    return server


# -- database -----------------------------------------------------------------------------------

@main.group()
def db() -> None:
    """Database schema, and the log store checked against the database (after a restore)."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
@pass_ctx
def db_upgrade(ctx: Context, revision: str) -> None:
    """Apply Alembic migrations up to REVISION."""
    from sqlalchemy.exc import OperationalError

    from dlts import db_migrate
    from dlts.app import create_app
    from dlts.db import engine_of

    if ctx.settings.effective_database_url.startswith("sqlite"):
        ctx.settings.home.mkdir(parents=True, exist_ok=True)
    engine = engine_of(create_app(ctx.settings))
    try:
        db_migrate.upgrade(engine, revision)
        click.echo(f"database at revision {db_migrate.current_revision(engine)}")
    except OperationalError as exc:
        raise click.ClickException(f"cannot reach the database ({exc.orig}); check database_url") from None


@db.command("orphan-logs")
@click.option("--json", "as_json", is_flag=True, help="The list as JSON.")
@pass_ctx
def db_orphan_logs(ctx: Context, as_json: bool) -> None:
    """List the logs in the log store that no attempt in the database names (after a restore from a backup).

    They are never shown for a job; the janitor removes each retention_days after it was last written
    (docs/backup.md, "Logs after a restore")."""
    import datetime as dt
    import json

    from dlts.services import log_orphans

    log_dir, retention = ctx.settings.effective_log_dir, dt.timedelta(days=ctx.settings.retention_days)
    with ctx.sessions() as sessions:
        orphans = list(log_orphans.find(sessions, log_dir))
    if as_json:
        click.echo(json.dumps({"log_dir": str(log_dir), "orphans": [o.as_json() for o in orphans]}, indent=2))
        return
    for o in orphans:
        click.echo(f"{log_dir / str(o.stored.job_id)}: attempt {o.stored.attempt}, {len(o.stored.names)} files, "
                   f"{o.stored.size_bytes} bytes, last written {o.modified_at:%Y-%m-%d %H:%M} UTC: {o.why}; "
                   f"removed by the janitor after {o.modified_at + retention:%Y-%m-%d}")
    total = sum(o.stored.size_bytes for o in orphans)
    click.echo(f"{len(orphans)} orphaned logs ({total} bytes) in {log_dir}" if orphans
               else f"no orphaned logs in {log_dir}")


# -- users and VCs --------------------------------------------------------------------------------

@main.group()
def user() -> None:
    """Users and their API tokens."""


POSIX_ID = click.IntRange(0, 2**31 - 1)  # the service refuses 0-999 with a message that says why


@user.command("add")
@click.argument("name")
@click.option("--admin", is_flag=True, help="Make the user a cluster admin.")
@click.option("--email")
@click.option("--uid", type=POSIX_ID, help="The uid the user's jobs run as (1000 or more; with --gid).")
@click.option("--gid", type=POSIX_ID, help="The user's primary gid (1000 or more; with --uid).")
@pass_ctx
def user_add(ctx: Context, name: str, admin: bool, email: str | None, uid: int | None, gid: int | None) -> None:
    """Add user NAME (optionally a cluster admin, with the uid/gid their jobs run as)."""
    from dlts.services import admin as admin_service

    with ctx.session() as session:
        admin_service.add_user(session, name, admin=admin, email=email, uid=uid, gid=gid)
    click.echo(f"user {name} added" + (" (cluster admin)" if admin else "") + (f", uid {uid} gid {gid}" if uid else ""))


@user.command("set")
@click.argument("name")
@click.option("--uid", type=POSIX_ID, help="The uid the user's jobs run as (1000 or more).")
@click.option("--gid", type=POSIX_ID, help="The user's primary gid (1000 or more).")
@pass_ctx
def user_set(ctx: Context, name: str, uid: int | None, gid: int | None) -> None:
    """Set the uid/gid NAME's jobs run as; idempotent, prints 'updated' or 'unchanged' (for Ansible)."""
    from dlts.services import admin as admin_service

    changes = {k: v for k, v in (("uid", uid), ("gid", gid)) if v is not None}
    if not changes:
        raise click.UsageError("give --uid and/or --gid")
    with ctx.session() as session:
        _, said = admin_service.set_user(session, name, changes)
    click.echo(f"user {name} updated: {'; '.join(said)}" if said else f"user {name} unchanged")


@user.command("token")
@click.argument("name")
@click.option("--expires-days", type=click.IntRange(1, 3650))
@click.option("--label", default="cli", show_default=True, help="Name shown in token lists.")
@pass_ctx
def user_token(ctx: Context, name: str, expires_days: int | None, label: str) -> None:
    """Print a new API token for NAME (shown once; only its hash is stored)."""
    from dlts.services import admin as admin_service

    with ctx.session() as session:
        click.echo(admin_service.new_token(session, name, label, expires_days))


@user.command("password")
@click.argument("name")
@click.option("--random", "generate", is_flag=True, help="Generate a random password and print it once.")
@pass_ctx
def user_password(ctx: Context, name: str, generate: bool) -> None:
    """Set NAME's portal password (asked twice, or --random); stored only as a scrypt hash."""
    from dlts.services import portal_auth

    if generate:
        password = portal_auth.random_password()
    else:
        password = click.prompt(f"New portal password for {name}", hide_input=True, confirmation_prompt=True)
    with ctx.session() as session:
        portal_auth.set_password(session, name, password)
    click.echo(f"password of {name} set" + (f": {password}" if generate else ""))


@main.group(cls=OnDemandGroup)
def vc() -> None:
    """Virtual clusters (`vc show` and `vc tune` ask the REST API; the others use the database)."""


@vc.command("add")
@click.argument("name")
@click.option("--quota", "quota", multiple=True, metavar="SKU=GPUS", help="GPU quota per SKU; repeat for more SKUs.")
@click.option("--policy", type=click.Choice(["RF", "FIFO", "backfill"]), default="RF", show_default=True)
@pass_ctx
def vc_add(ctx: Context, name: str, quota: tuple[str, ...], policy: str) -> None:
    """Add VC NAME with a GPU quota per SKU and a scheduling policy."""
    from dlts.services import admin as admin_service

    with ctx.session() as session:
        admin_service.add_vc(session, name, admin_service.parse_quota(quota), policy=policy)
    click.echo(f"VC {name} added")


@vc.command("set")
@click.argument("name")
@click.option("--quota", "quota", multiple=True, metavar="SKU=GPUS",
              help="GPU quota per SKU; repeat for more SKUs. The whole quota: SKUs not given go to 0.")
@click.option("--policy", type=click.Choice(["RF", "FIFO", "backfill"]), help="Scheduling policy (default: RF for a new VC, else kept).")
@click.option("--gid", help="The VC's group (1000 or more), a supplementary group of its jobs; 'none' clears it "
                            "(default: kept).")
@click.option("--ephemeral-storage", "ephemeral", metavar="BYTES",
              help="Scratch space per job pod and the most a job may ask (bytes or '50Gi'); 'none': the cluster "
                   "default (default: kept).")
@click.option("--max-queued-jobs-per-user", "max_queued", metavar="N",
              help="Jobs one user may have waiting (queued or unapproved) in the VC; 0: no limit; 'none': the "
                   "cluster's max_queued_jobs_per_user (default: kept).")
@click.option("--max-submissions-per-minute", "max_rate", metavar="N",
              help="Submissions one user may make to the VC per minute; 0: no limit; 'none': the cluster's "
                   "max_submissions_per_minute (default: kept).")
@pass_ctx
def vc_set(ctx: Context, name: str, quota: tuple[str, ...], policy: str | None, gid: str | None,
           ephemeral: str | None, max_queued: str | None, max_rate: str | None) -> None:
    """Create VC NAME or bring its quota and policy (and group, scratch space) to these values; idempotent,
    prints 'added', 'updated' or 'unchanged' (for Ansible)."""
    from dlts.services import admin as admin_service

    extra: dict[str, Any] = {}
    if gid is not None:
        extra["gid"] = _optional_int("--gid", gid)
    if ephemeral is not None:
        extra["ephemeral_storage_bytes"] = _optional_bytes("--ephemeral-storage", ephemeral)
    if max_queued is not None:
        extra["max_queued_jobs_per_user"] = _optional_int("--max-queued-jobs-per-user", max_queued)
    if max_rate is not None:
        extra["max_submissions_per_minute"] = _optional_int("--max-submissions-per-minute", max_rate)
    with ctx.session() as session:
        result = admin_service.set_vc(session, name, admin_service.parse_quota(quota), policy=policy, **extra)
    if not result.changes:
        click.echo(f"VC {name} unchanged")
    else:
        click.echo(f"VC {name} {'added' if result.created else 'updated'}: {'; '.join(result.changes)}")


def _optional_int(option: str, value: str) -> int | None:
    if value.lower() == "none":
        return None
    from dlts.strict import is_whole_number

    if not is_whole_number(value):
        raise click.BadParameter(f"{value!r} is not a whole number or 'none'", param_hint=option)
    return int(value)


def _optional_bytes(option: str, value: str) -> int | None:
    from marshmallow import ValidationError

    from dlts.schemas import Memory
    from dlts.strict import is_whole_number

    if value.lower() == "none":
        return None
    try:
        return Memory(max_bytes=2**50).deserialize(int(value) if is_whole_number(value) else value)
    except ValidationError as exc:
        raise click.BadParameter(f"{value!r} {' '.join(exc.messages)}", param_hint=option) from None


@vc.command("storage")
@click.argument("vc_name", metavar="VC")
@click.option("--json", "document", metavar="JSON", help="The storage document (nfs, host, home, and lustre), "
                                                         "replacing the VC's; without a lustre key the VC's Lustre "
                                                         "settings are kept. See docs/kubernetes.md.")
@click.option("--show", is_flag=True, help="Print the VC's storage document as JSON.")
@pass_ctx
def vc_storage(ctx: Context, vc_name: str, document: str | None, show: bool) -> None:
    """Set or show the storage VC's jobs mount: NFS exports, host directories, the users' homes, Lustre.
    Idempotent: prints 'updated' or 'unchanged' (for Ansible)."""
    import json

    from dlts.services import admin as admin_service

    if (document is None) == (not show):
        raise click.UsageError("give --json JSON to set the storage, or --show to print it")
    parsed = None
    if document is not None:
        try:
            parsed = json.loads(document)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--json") from None
    with ctx.session() as session:
        vc = admin_service.get_vc(session, vc_name)
        if parsed is None:
            click.echo(json.dumps(vc.storage or {}, indent=2, sort_keys=True))
            return
        changed = admin_service.replace_vc_storage(session, vc, parsed, "cli")
    click.echo(f"VC {vc_name} storage {'updated' if changed else 'unchanged'}")


@vc.command("member")
@click.argument("vc_name", metavar="VC")
@click.argument("user_name", metavar="USER")
@click.option("--admin", is_flag=True, help="Make the user an admin of the VC.")
@pass_ctx
def vc_member(ctx: Context, vc_name: str, user_name: str, admin: bool) -> None:
    """Make USER a member (or, with --admin, an admin) of VC."""
    from dlts.services import admin as admin_service

    with ctx.session() as session:
        admin_service.add_member(session, vc_name, user_name, admin=admin)
    click.echo(f"{user_name} is {'an admin' if admin else 'a member'} of VC {vc_name}")


@vc.command("lustre")
@click.argument("vc_name", metavar="VC")
@click.option("--pool", required=True, help="OST pool name for the VC (1-15 characters).")
@click.option("--osts", required=True, help="OST indices of the pool, e.g. 0,1 or 0-3.")
@click.option("--mdt", default="0", show_default=True, help="MDT index of the VC's directory, or 'spread'.")
@click.option("--directory", help="Directory relative to the mount (default: <vc_root>/<VC>).")
@click.option("--project-id", type=click.IntRange(1, 4294967294), help="Lustre project ID for the VC's quota.")
@click.option("--stripe-count", type=click.IntRange(-1, 2000), help="Default stripe count of new files.")
@click.option("--default-dir-stripe-count", type=click.IntRange(-1, 256),
              help="Stripe new subdirectories over this many MDTs (lfs setdirstripe -D -c N; -1: all MDTs).")
@pass_ctx
def vc_lustre(ctx: Context, vc_name: str, pool: str, osts: str, mdt: str, directory: str | None,
              project_id: int | None, stripe_count: int | None, default_dir_stripe_count: int | None) -> None:
    """Pin VC's Lustre directory to an OST pool and an MDT; `dlts managers` applies it."""
    from dlts.services import admin as admin_service
    from dlts.strict import is_whole_number

    settings = {"pool": pool, "osts": osts, "mdt": int(mdt) if is_whole_number(mdt) else mdt, "directory": directory,
                "project_id": project_id, "stripe_count": stripe_count,
                "default_dir_stripe_count": default_dir_stripe_count}
    with ctx.session() as session:
        stored = admin_service.set_vc_lustre(session, vc_name, settings)
    click.echo(f"VC {vc_name} Lustre settings: {stored}")


@main.group()
def directory() -> None:
    """Users, groups and VC roles from the LDAP directory (the directory: section)."""


@directory.command("sync")
@click.option("--dry-run", is_flag=True, help="Report what would change; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="The report as JSON.")
@pass_ctx
def directory_sync(ctx: Context, dry_run: bool, as_json: bool) -> None:
    """Sync users (uid, gid, e-mail) and groups from LDAP once. Exit 3: stopped by max_disable_percent."""
    import json

    from dlts.managers.directory import DirectoryError, DirectorySync

    cfg = ctx.settings.directory
    if not cfg.enabled:
        raise click.ClickException("directory.url is not set: there is no directory to sync from (docs/administration.md)")
    with ctx.sessions() as sessions:
        try:
            report = DirectorySync(sessions, cfg).sync(dry_run=dry_run)
        except DirectoryError as exc:
            raise click.ClickException(exc.message) from None
    click.echo(json.dumps(report.as_json(), indent=2) if as_json else "\n".join(report.lines()))
    if report.stopped:
        sys.exit(3)


# -- configuration ------------------------------------------------------------------------------------

@main.group()
def node() -> None:
    """Nodes and their agents."""


@node.command("token")
@click.argument("name")
@click.option("--token-file", type=click.File("r"),
              help="Register the token in this file ('-': standard input) instead of making one; idempotent, "
                   "prints 'registered' or 'unchanged' (for Ansible).")
@pass_ctx
def node_token(ctx: Context, name: str, token_file) -> None:
    """Print a new agent token for node NAME (shown once; replaces the old one; only its hash is stored)."""
    from dlts.services import nodes as node_service

    with ctx.session() as session:
        if token_file is None:
            click.echo(node_service.issue_node_token(session, name))
            return
        changed = node_service.register_node_token(session, name, token_file.read().strip())
    click.echo(f"token of node {name} {'registered' if changed else 'unchanged'}")


def _operator():
    """The CLI runs on the control host with the database's credentials: a cluster admin, named
    after the operating-system user in the audit trail."""
    import getpass

    from dlts.services.auth import Principal

    return Principal(user_id=0, name=f"cli:{getpass.getuser()}"[:64], is_cluster_admin=True)


@node.command("list")
@pass_ctx
def node_list(ctx: Context) -> None:
    """Nodes with their state, whether ready (if not, why), GPUs in use, health and current repair."""
    from dlts.services import nodes as node_service

    with ctx.session() as session:
        rows = node_service.list_nodes(session, ctx.settings, _operator())
    click.echo(f"{'NODE':<20} {'SKU':<12} {'STATE':<15} {'READY':<5} {'GPUS':>7} {'HEALTH':<9} REPAIR")
    for n in rows:
        repair = n.repair["problem"] if n.repair else (n.state_reason or "")
        if not n.ready:  # (a lost node's own reason says less: not since when)
            repair = f"not ready: {n.not_ready_reason}" + (f"; {repair}" if repair and n.state != "lost" else "")
        flags = (" [cordoned by " + n.cordoned_by + "]" if n.cordoned_by else "") + (" [paused]" if n.repair_paused else "")
        bad = f" (GPU {','.join(map(str, n.unhealthy_gpus))} out)" if n.unhealthy_gpus else ""
        click.echo(f"{n.name:<20} {n.sku:<12} {n.state:<15} {'yes' if n.ready else 'no':<5} {f'{n.gpus_used}/{n.gpus}':>7} "
                   f"{n.health:<9} {repair}{bad}{flags}")


@node.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the node and its repair cycles as JSON.")
@pass_ctx
def node_show(ctx: Context, name: str, as_json: bool) -> None:
    """One node: state, open findings, recent events and repair cycles."""
    import dataclasses
    import json

    from dlts.services import nodes as node_service
    from dlts.services import repair as repair_service

    with ctx.session() as session:
        view = node_service.get_node(session, ctx.settings, _operator(), name)
        cycles = repair_service.list_cycles(session, _operator(), name, limit=10)
    if as_json:
        click.echo(json.dumps({"node": dataclasses.asdict(view), "repairs": cycles}, indent=2, default=str))
        return
    click.echo(f"{view.name}: {view.state} ({view.state_reason or 'no reason recorded'}); health {view.health}; "
               f"GPUs {view.gpus_used}/{view.gpus} used; last heartbeat {view.last_heartbeat_at or 'never'}")
    if not view.ready:
        click.echo(f"  not ready: {view.not_ready_reason}")
    if view.unhealthy_gpus:
        click.echo(f"  unhealthy GPUs (never assigned): {', '.join(map(str, view.unhealthy_gpus))}")
    details = view.details or {}
    open_findings = [f for f in details.get("findings", []) if f["cleared_at"] is None]
    click.echo(f"open findings: {len(open_findings)}")
    for f in open_findings:
        click.echo(f"  {f['severity']:<8} {f['code']:<28} {f['device'] or 'node':<8} since {f['first_seen_at']}")
    click.echo("repairs:")
    for c in cycles:
        chain = " -> ".join(st["remediation"] for st in c["chain"]) or "validate"
        click.echo(f"  #{c['id']} {c['started_at']} {c['kind']} {c['scope']}: {c['problem']} [{chain}] "
                   f"{c['outcome'] or c['state']}")
        for st in c["steps"]:
            click.echo(f"     step {st['number']} {st['remediation']} {st['target'] or ''}: {st['result'] or 'running'}"
                       f"{' - ' + st['message'] if st['message'] else ''}")
    click.echo("events:")
    for e in reversed(details.get("events", [])[:15]):
        move = f"{e['from_state']} -> {e['to_state']}" if e["to_state"] else e["kind"]
        click.echo(f"  {e['at']} {move}: {e['message'] or e['reason'] or ''} ({e['actor']})")


@node.command("repair")
@click.argument("name")
@click.option("--step", "steps", multiple=True, type=click.Choice(["reset_gpu", "restart_service", "reboot", "ticket", "rma"]),
              help="A remediation of the chain, in order (repeat; default: reboot, then ticket).")
@click.option("--gpu", "gpus", multiple=True, type=click.IntRange(0, 63), help="Repair only this GPU (repeat for more).")
@click.option("--target", help="restart_service: the unit to restart.")
@click.option("--reason", default="", help="Why (shown in the node's history).")
@pass_ctx
def node_repair(ctx: Context, name: str, steps: tuple[str, ...], gpus: tuple[int, ...], target: str | None, reason: str) -> None:
    """Start a repair cycle on NAME by hand: quarantine, drain, then the chain (budget and pause apply)."""
    from dlts.services import repair as repair_service

    with ctx.session() as session:
        cycle = repair_service.start(session, _operator(), name, steps=list(steps) or ["reboot", "ticket"],
                                     gpus=list(gpus), target=target, reason=reason)
    click.echo(f"repair {cycle['id']} of node {name} started: {cycle['problem']}; the repair manager takes it from here")


@node.command("return")
@click.argument("name")
@click.option("--reason", default="", help="What was done (shown in the node's history).")
@pass_ctx
def node_return(ctx: Context, name: str, reason: str) -> None:
    """Return an out_of_service or rma node: it validates, then serves again."""
    from dlts.services import repair as repair_service

    with ctx.session() as session:
        repair_service.return_node(session, _operator(), name, reason)
    click.echo(f"node {name} is validating; it returns to service after a healthy report and the quiet period")


@node.command("cancel-repair")
@click.argument("name")
@click.argument("cycle_id", type=int)
@pass_ctx
def node_cancel_repair(ctx: Context, name: str, cycle_id: int) -> None:
    """Cancel repair CYCLE_ID of NAME: its orders are withdrawn and the node returns to service."""
    from dlts.services import repair as repair_service

    with ctx.session() as session:
        repair_service.cancel(session, _operator(), name, cycle_id)
    click.echo(f"repair {cycle_id} of node {name} cancelled; the node is in service")


@main.group()
def repair() -> None:
    """The repair loop: pause, resume, status."""


@repair.command("pause")
@click.argument("node_name", metavar="[NODE]", required=False)
@click.option("--reason", default="")
@pass_ctx
def repair_pause(ctx: Context, node_name: str | None, reason: str) -> None:
    """Stop new repair actions (everywhere, or on NODE); actions in flight finish."""
    from dlts.services import repair as repair_service

    with ctx.session() as session:
        repair_service.set_pause(session, _operator(), True, node_name, reason)
    click.echo(f"repairs paused {'on node ' + node_name if node_name else 'everywhere'}")


@repair.command("resume")
@click.argument("node_name", metavar="[NODE]", required=False)
@pass_ctx
def repair_resume(ctx: Context, node_name: str | None) -> None:
    """Resume repairs (everywhere, or on NODE)."""
    from dlts.services import repair as repair_service

    with ctx.session() as session:
        repair_service.set_pause(session, _operator(), False, node_name)
    click.echo(f"repairs resumed {'on node ' + node_name if node_name else 'everywhere'}")


@repair.command("status")
@pass_ctx
def repair_status(ctx: Context) -> None:
    """Nodes per state, the budget per SKU, the queue and the latest cycles."""
    from dlts.services import repair as repair_service

    with ctx.session() as session:
        st = repair_service.status(session, _operator(), ctx.settings)
    pause = f"PAUSED by {st['paused_by']} at {st['paused_at']}: {st['reason'] or ''}" if st["paused"] else "running"
    click.echo(f"repair loop: {pause}{' (dry run)' if st['dry_run'] else ''}")
    if st["paused_nodes"]:
        click.echo(f"paused nodes: {', '.join(st['paused_nodes'])}")
    click.echo("nodes: " + ", ".join(f"{k} {v}" for k, v in st["states"].items() if v))
    for b in st["budget"]:
        click.echo(f"budget {b['sku']}: {b['in_repair']} of {b['budget']} in repair ({b['nodes']} nodes)")
    click.echo(f"queue: {', '.join(q['node'] + ' (' + q['severity'] + ')' for q in st['queue']) or 'empty'}")
    for c in st["recent"][:10]:
        click.echo(f"  #{c['id']} {c['node']} {c['problem']}: {c['outcome'] or c['state']}")


def _cheap_exit() -> None:
    """At interpreter exit, freeze the objects there are then (the start-up's: click, pydantic and its
    models, ~30,000) out of the garbage collector's reach. The interpreter's last collections would
    otherwise traverse each of them, and free the cycles the modules' teardown leaves (classes,
    functions), memory the operating system takes back at once anyway: ~0.05 s of CPU per `dlts
    storage scan` (docs/benchmarks.md, *Storage scan*). What matters at exit still happens: the
    atexit handlers run (multiprocessing's, logging's: registered earlier, they run after this one),
    standard output and standard error are flushed, modules are torn down and objects outside cycles
    finalized; only the finalizers of objects in cycles are not run, which Python never promises at
    exit (this command leaves none that writes: its workers' pipes are closed, its output flushed).
    Registered once per process, so a caller running the command in-process (tests) is only
    affected at its own exit."""
    global _cheap_exit_registered
    if not _cheap_exit_registered:
        import atexit
        import gc

        atexit.register(gc.freeze)
        _cheap_exit_registered = True


_cheap_exit_registered = False


@main.group()
def storage() -> None:
    """Storage scans and expiry of the storage.roots by hand (docs/storage.md)."""


@storage.command("scan")
@click.argument("paths", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the whole aggregation as JSON.")
@click.option("--record", is_flag=True, help="Record the scans of configured roots as snapshots (as dlts managers does).")
@pass_ctx
def storage_scan(ctx: Context, paths: tuple[str, ...], as_json: bool, record: bool) -> None:
    """Scan PATHs: usage by user, VC and top-level directory, the biggest directories, the oldest files.

    A configured root uses its owner and VC mapping; another path is scanned as a local root."""
    import json
    import os

    from dlts.storage.scan import scan_path
    from dlts.storage.scan_result import COMPLETE

    _cheap_exit()
    # the storage: section alone; the whole configuration (the database's) only for a configured root
    storage_settings = ctx.storage_settings
    if record:
        unknown = [p for p in paths if storage_settings.root(os.path.abspath(p)) is None]
        if unknown:
            raise click.UsageError(f"--record: {', '.join(unknown)} is not in storage.roots")
    results = []
    configured = [storage_settings.root(os.path.abspath(p)) for p in paths]
    if any(configured):
        storage_settings = ctx.settings.storage  # every section checked, as every other server command does
        configured = [storage_settings.root(os.path.abspath(p)) for p in paths]
    with ctx.sessions() if any(configured) else contextlib.nullcontext() as sessions:
        manager = None
        if sessions is not None:  # the database's users name the uids (the manager and its models load only then)
            from dlts.managers.storage import StorageManager

            manager = StorageManager(sessions, ctx.settings)
        for path, root in zip(paths, configured):
            if record and manager is not None and root is not None:
                result = manager.scan_and_record(root)
            else:
                names = {}
                if manager is not None and root is not None and sessions is not None:
                    with sessions() as session:
                        names = manager.uid_names(session)
                result = scan_path(os.path.abspath(path), storage_settings, uid_names=names)
            results.append(result)
    for result in results:
        if as_json:
            continue
        from dlts.managers.storage import human_bytes

        click.echo(f"{result.root}: {result.status}{' (' + result.message + ')' if result.message else ''}, "
                   f"{result.total.files} files in {result.dirs} dirs, {human_bytes(result.total.allocated_bytes)} "
                   f"allocated ({human_bytes(result.total.apparent_bytes)} apparent), {result.errors} unreadable, "
                   f"{result.other_fs.count} other file systems, {result.duration_s:.1f} s")
        for (vc, user), totals in sorted(result.by_owner.items(), key=lambda kv: -kv[1].allocated_bytes):
            click.echo(f"  user {user}{' (' + vc + ')' if vc else ''}: {human_bytes(totals.allocated_bytes)}, {totals.files} files")
        for d in result.top_dirs:
            click.echo(f"  dir {d['path']}: {human_bytes(d['allocated_bytes'])}, {d['files']} files ({d['owner']})")
    if as_json:
        docs = [r.to_dict() for r in results]
        click.echo(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2))
    if any(r.status != COMPLETE for r in results):
        sys.exit(1)


@storage.command("expire")
@click.argument("root", type=click.Path(file_okay=False))
@click.option("--older-than-days", type=click.FloatRange(min=0, min_open=True), help="Instead of the root's expire_after_days.")
@click.option("--dry-run", is_flag=True, help="List exactly what would be deleted; delete, record and mail nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report (and, with --dry-run, every path) as JSON.")
@pass_ctx
def storage_expire(ctx: Context, root: str, older_than_days: float | None, dry_run: bool, as_json: bool) -> None:
    """Expire old data under ROOT's expire_paths (a root of storage.roots), as dlts managers does."""
    import json
    import os

    from dlts.managers.storage import StorageManager, human_bytes
    from dlts.storage.scan_result import shown

    configured = ctx.settings.storage.root(os.path.abspath(root))
    if configured is None:
        known = ", ".join(str(r.path) for r in ctx.settings.storage.roots) or "none"
        raise click.UsageError(f"ROOT {root} is not in storage.roots (configured: {known})")
    if not configured.expire_paths:
        raise click.UsageError(f"storage.roots {configured.path}: no expire_paths configured")
    if configured.expire_after_days is None and older_than_days is None:
        raise click.UsageError(f"storage.roots {configured.path}: no expire_after_days; give --older-than-days")
    items: list[dict] = []

    def on_item(path: str, kind: str, size: int, owner: str) -> None:
        if as_json:
            items.append({"path": shown(path), "kind": kind, "bytes": size, "owner": shown(owner)})
        else:
            click.echo(f"{'would delete' if dry_run else 'deleted'} {kind} {shown(path)} {size} {shown(owner)}")

    with ctx.sessions() as sessions:
        report = StorageManager(sessions, ctx.settings).expire_and_record(
            configured, older_than_days=older_than_days, dry_run=dry_run, on_item=on_item)
    if as_json:
        click.echo(json.dumps({**report.to_dict(), "items": items}, indent=2))
        return
    for owner, totals in sorted(report.deleted.items()):
        click.echo(f"{owner}: {totals.files} file(s), {totals.dirs} dir(s), {human_bytes(totals.bytes)}"
                   f"{' would go' if dry_run else ' deleted'}")
    for owner, totals in sorted(report.held.items()):
        click.echo(f"{owner}: {totals.files} expired file(s) wait for their owner's warning to be "
                   f"{configured.warn_days:g} days old")
    for owner, warning in sorted(report.warnings.items()):
        click.echo(f"{owner}: warned of {warning.files} file(s)" + (" (not sent: dry run)" if dry_run else ""))
    if report.errors:
        click.echo(f"{len(report.errors)} problem(s): " + "; ".join(report.errors[:10]), err=True)


@main.group()
def config() -> None:
    """Configuration."""


@config.command("check")
@pass_ctx
def config_check(ctx: Context) -> None:
    """Validate the configuration and print the effective values (secrets hidden)."""
    from dlts.config import describe

    for line in describe(ctx.settings):
        click.echo(line)


def _render_command() -> click.Command:
    """`dlts render` (needs the k8s extra), or a stand-in saying how to install it."""
    import importlib.util

    if importlib.util.find_spec("kubernetes") is not None:
        from dlts.render_cli import render_command

        return render_command

    @click.command("render", context_settings={"ignore_unknown_options": True}, add_help_option=False)
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def render_unavailable(args) -> None:
        """Print the Kubernetes objects of a job (needs: pip install 'dlts[k8s]')."""
        raise click.ClickException("dlts render needs the Kubernetes client: pip install 'dlts[k8s]'")

    return render_unavailable


def _sim_command() -> click.Command:
    from dlts.sim.cli import sim_command

    return sim_command


# `dlts sim` (the scheduler's trace replayer) and `dlts render` load when they are run or listed: the
# Kubernetes client alone took half a second of every other command's start (the user CLI's too)
main.lazy = {"render": _render_command, "sim": _sim_command}


_user_commands_registered = False


def _register_user_commands() -> None:
    """The user CLI (src/dlts/client): submit, jobs, logs, ... over the REST API. Registered when
    ``dlts`` or ``dlts vc`` first lists its commands or meets a name it lacks, so a server command
    (``dlts storage scan``) does not import the client, yaml among it (~0.03 s of CPU)."""
    global _user_commands_registered
    if _user_commands_registered:
        return
    _user_commands_registered = True
    from dlts.client.commands import register

    register(main, vc)


main.on_demand.append(_register_user_commands)
vc.on_demand.append(_register_user_commands)  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
