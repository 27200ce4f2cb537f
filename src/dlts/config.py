"""The one typed configuration object, layered: defaults < YAML file < ``DLTS_*`` environment.

``load_settings()`` is called once at start-up by every process (API, managers, demo, CLI). A bad
value stops start-up with a ``ConfigError`` that names the key and where it came from.

The file is ``--config PATH``, else ``$DLTS_CONFIG``, else ``$DLTS_HOME/dlts.yaml`` when ``DLTS_HOME``
is set, else ``/etc/dlts/dlts.yaml`` when it exists. With ``DLTS_HOME`` set (the demo), the database
and logs default to that home, so a second terminal with the same ``DLTS_HOME`` talks to the same
demo.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dlts.backends.k8s_settings import KubernetesSettings, cidr_list
from dlts.config_layers import (
    ENV_PREFIX,
    MOVED_KEYS,
    SYSTEM_CONFIG,
    ConfigError,
    config_path,
    invalid,
    merge_section,
    read_file,
    section_from_env,
)
from dlts.directory_settings import DirectorySettings
from dlts.insight.settings import InsightSettings
from dlts.notify_settings import NotifySettings
from dlts.repair.settings import RepairSettings
from dlts.storage.settings import StorageSettings
from dlts.strict import is_whole_number

LOCAL_BACKEND_REFUSED = (
    "backend: local runs every user's job command on this machine as the DLTS service user, which can read "
    "the database, secret_key and the admin's API tokens, so it is refused outside `dlts demo`. Use "
    "backend: kubernetes for a shared cluster, or, only if every user of this service may act as that "
    "account, set local_backend_trusted_users: true in dlts.yaml (docs/security-host.md)")

DEFAULT_HOME = Path(".dlts")
__all__ = ["ENV_PREFIX", "MOVED_KEYS", "SYSTEM_CONFIG", "ConfigError", "Settings", "config_path", "describe",
           "load_settings", "require_production_secrets", "require_trusted_local_backend"]


class ForecastSettings(BaseModel):
    """The forecast manager (``dlts managers`` and the demo): a start time for every waiting job
    (scheduler/forecast.py, docs/scheduling.md "Forecast start")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    # seconds between forecasts
    interval_s: float = Field(300.0, ge=1, le=86400)
    # at most this many scheduling passes per forecast; jobs it does not reach get none
    max_passes: int = Field(200, ge=1, le=100_000)
    # ends within this share of the time from now are taken by one pass (each pass is late by at most that share)
    precision: float = Field(0.05, gt=0, le=1)
    # a job's run time is predicted as the mean of its owner's last this-many completed runs (0: limits only)
    history_runs: int = Field(2, ge=0, le=100)


class DiskPressureSettings(BaseModel):
    """Room the job manager keeps on the volumes it writes: the log store (``log_dir``), the local
    backend's run directories (``run_dir``) and, with SQLite, the database's directory
    (jobmanager/disk_pressure.py, docs/configuration.md "Disk pressure"). Below a soft threshold:
    the ``dlts_volume_pressure`` gauge says 1, the DltsVolumeLowSpace alert fires and the cluster
    admins get a notice; below a hard one: no new job is launched (their wait reason says which
    volume and how full) until the volume is above it again."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    # free bytes (as a user sees them: f_bavail) below which a volume is under pressure
    soft_free_bytes: int = Field(5 * 1024**3, ge=0)
    hard_free_bytes: int = Field(1024**3, ge=0)
    # free inodes below which a volume is under pressure (file systems that report no inode count
    # are judged by bytes alone)
    soft_free_inodes: int = Field(50_000, ge=0)
    hard_free_inodes: int = Field(10_000, ge=0)
    # seconds between readings (the job manager's tick reads no more often than this)
    interval_s: float = Field(10.0, ge=0, le=3600)

    @model_validator(mode="after")
    def _hard_below_soft(self) -> DiskPressureSettings:
        if self.hard_free_bytes > self.soft_free_bytes:
            raise ValueError("hard_free_bytes must not be above soft_free_bytes")
        if self.hard_free_inodes > self.soft_free_inodes:
            raise ValueError("hard_free_inodes must not be above soft_free_inodes")
        return self


class SkuReserve(BaseModel):
    """Cores and bytes a GPU node of one SKU keeps for each free GPU (``sku_reserve``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu_per_gpu: float | None = Field(None, ge=0)
    memory_per_gpu_bytes: int | None = Field(None, ge=0)


class VcScheduling(BaseModel):
    """Per-VC scheduling settings (``vc_scheduling: {VC: {...}}``), the VC's defaults: unset keys take the
    cluster's, and a value set on the VC itself at runtime (``PATCH /vcs/NAME``) wins
    (``services.vcs.scheduling_of``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fair_share: bool | None = None
    fair_share_max_wait_s: float | None = Field(None, ge=0, le=30 * 86400)
    limit_weight: float | None = Field(None, ge=0, le=10.0)  # dlts.scheduler.model.MAX_LIMIT_WEIGHT
    min_runtime_s: float | None = Field(None, ge=0)
    max_reclaim_delay_s: float | None = Field(None, ge=0)
    max_preemptions: int | None = Field(None, ge=0)


class Settings(BaseModel):
    """Every key of ``dlts.yaml``; the environment variable is ``DLTS_`` + the key in capitals."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # where the demo keeps its state; other paths default to places inside it
    home: Path = DEFAULT_HOME
    # SQLAlchemy URL: sqlite:///path for the demo, mysql+pymysql://user:pass@host/db in production
    database_url: str = ""
    # signs session cookies; required outside the demo and tests (no production default)
    secret_key: str = ""
    listen_host: str = "127.0.0.1"
    listen_port: int = Field(5000, ge=1, le=65535)
    # the portal's session cookie is Secure (sent only over TLS): "auto" when the request came over
    # HTTPS (directly, or per X-Forwarded-Proto from a trusted proxy), true always, false never
    session_cookie_secure: bool | Literal["auto"] = "auto"
    # portal login attempts allowed per user name and per client address in one window of
    # login_limit_window_s seconds; counted in the database (every API worker shares the count)
    # before the password is checked; a successful login clears its user name's count
    login_limit_per_user: int = Field(5, ge=1, le=10_000)
    login_limit_per_ip: int = Field(30, ge=1, le=1_000_000)
    login_limit_window_s: float = Field(300.0, ge=1, le=86400)
    # abuse limits per user and VC, the cluster's defaults; a VC's own max_queued_jobs_per_user /
    # max_submissions_per_minute (dlts vc set, PATCH /vcs/NAME) wins; 0: no limit
    max_queued_jobs_per_user: int = Field(1000, ge=0, le=10_000_000)
    max_submissions_per_minute: int = Field(300, ge=0, le=10_000_000)
    # reverse proxies in front of the API whose X-Forwarded-For/-Proto to trust (nginx: 1); the
    # login limiter and "allow my address" then see the client's address, not the proxy's
    trusted_proxies: int = Field(0, ge=0, le=5)
    # seconds an API worker keeps a bearer token's principal (user, roles) in memory; changes made
    # in another worker apply there within this time (0: look the token up on every request)
    auth_cache_s: float = Field(5.0, ge=0, le=300)
    # request bodies above this are refused with 413
    max_body_bytes: int = Field(1024 * 1024, ge=1024)
    # dlts api (gunicorn, gthread workers): threads per worker, each serving one request at a time, so
    # a slow client holds a thread, never a whole worker (docs/security-host.md#slow-clients)
    api_threads: int = Field(8, ge=1, le=256)
    # a worker silent this long is restarted; a request may take about as long
    api_timeout_s: int = Field(60, ge=1, le=3600)
    # idle keep-alive connections wait this long, in the worker's event loop (not in a thread)
    api_keepalive_s: int = Field(5, ge=0, le=300)
    # attempt logs: <log_dir>/<job id>/attempt-<n>-<log key>.log (plus rotated parts, see dlts.logstore)
    log_dir: Path | None = None
    # an attempt's log keeps at most this many bytes: its head and its newest tail, with a line
    # saying how much of the middle was dropped
    log_max_bytes: int = Field(256 * 1024**2, ge=64 * 1024)
    # free space and inodes kept on the log, run and (SQLite) database volumes: ``disk_pressure:``
    disk_pressure: DiskPressureSettings = Field(default_factory=DiskPressureSettings)
    # an attempt whose job has not started running this long after launch ends with the reason
    # it waited for (image pull, unschedulable, ...), frees its resources and spends a retry
    start_timeout_s: float = Field(600.0, ge=5, le=86400)
    # cluster backend the job manager drives
    backend: Literal["local", "kubernetes"] = "local"
    # backend local outside ``dlts demo``: every member's command runs on this host as the DLTS
    # service user (who can read the database, secret_key and the admin's tokens); refused at
    # start-up unless the operator says every user is trusted with that account
    local_backend_trusted_users: bool = False
    # local backend: where run records (pid, exit code) of attempts live
    run_dir: Path | None = None
    # local backend: the address users reach this machine's job endpoints at (ssh, Jupyter, ports)
    endpoint_host: str = Field("127.0.0.1", min_length=1, max_length=255)
    # seconds between job manager ticks
    tick_s: float = Field(1.0, gt=0, le=3600)
    # SIGTERM, then this many seconds, then SIGKILL (kill, preemption, wall time)
    preempt_grace_s: float = Field(30.0, ge=0, le=3600)
    # CPU-only jobs without explicit cpu/memory get these
    cpu_job_default_cpu: float = Field(1.0, gt=0)
    cpu_job_default_memory_bytes: int = Field(2 * 1024**3, gt=0)
    # backfill (VCs with policy backfill): jobs per pass that cannot start and get a reservation
    reservation_depth: int = Field(8, ge=0, le=1000)
    # every waiting job's forecast start (the forecast manager): ``forecast:`` section
    forecast: ForecastSettings = Field(default_factory=ForecastSettings)
    # which scheduler plugins a pass runs, by profile name (dlts.scheduler.plugins.registry.PROFILES:
    # default, no_fair_share, no_reclaim)
    scheduler_profile: str = "default"
    # backfill: runtime assumed for jobs with no limit when their VC sets none; null: unbounded
    default_runtime_estimate_s: int | None = Field(None, gt=0)
    default_max_retries: int = Field(3, ge=0, le=100)
    # per SKU: cores / bytes a GPU node keeps for each free GPU; CPU-only jobs may use only the rest
    # (unset: the node's cores / GPUs and bytes / GPUs, so a default-sized GPU job always fits).
    # In the environment, JSON: DLTS_SKU_RESERVE='{"a100": {"cpu_per_gpu": 10}}'
    sku_reserve: dict[str, SkuReserve] = Field(default_factory=dict)
    # fair share inside a VC: a user's GPU-seconds count half after this many hours (0: fair share
    # off everywhere); among equal priority, users with less decayed use than an equal share go first
    fair_share_half_life_h: float = Field(168.0, ge=0, le=24 * 365)
    fair_share: bool = True  # the cluster's default per VC (vc_scheduling.VC.fair_share, then the VC's own, win)
    # the cluster's default per VC: a job that has waited this long (seconds since its queue time) is
    # ranked as if its owner had no recent use, so fair share holds no job back longer (null: no bound)
    fair_share_max_wait_s: float | None = Field(None, ge=0, le=30 * 86400)
    # the cluster's default per VC: shorter limits first. Among jobs of equal priority each ranks as if
    # queued limit_weight x its effective limit later (the limit counted up to 7 days; no limit counts
    # 7 days), so short jobs pass long ones that have not waited much longer (0: queue time alone)
    limit_weight: float = Field(0.0, ge=0, le=10.0)  # dlts.scheduler.model.MAX_LIMIT_WEIGHT
    # preemption budget (the cluster's default per VC): a preemptible job runs at least
    # min_runtime_s before it may be preempted, unless the job reclaim is for has waited longer than
    # max_reclaim_delay_s (None: never); a job preempted max_preemptions times (0: no limit) is
    # protected for min_runtime_s of every later run without that exception
    min_runtime_s: float = Field(0.0, ge=0, le=30 * 86400)
    max_reclaim_delay_s: float | None = Field(None, ge=0, le=30 * 86400)
    max_preemptions: int = Field(0, ge=0, le=1000)
    # per VC: {fair_share, fair_share_max_wait_s, limit_weight, min_runtime_s, max_reclaim_delay_s, max_preemptions},
    # which a VC admin overrides
    # at runtime (the VC table's columns, NULL: this entry applies); environment: JSON
    vc_scheduling: dict[str, VcScheduling] = Field(default_factory=dict)
    # demo on a GPU-less machine: pretend the local node has this many GPUs of demo_sku
    demo_gpus: int = Field(0, ge=0, le=64)
    demo_sku: str = "demo-gpu"
    # the Kubernetes backend's settings: the ``kubernetes:`` section (docs/configuration.md#kubernetes)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    # dlts managers serves Prometheus metrics (the repair loop's, docs/repair.md#metrics) on this
    # HOST:PORT at /metrics; "" serves none
    managers_metrics_listen: str = "127.0.0.1:9465"
    # dlts managers may run on several control nodes: a lease in the database makes exactly one act.
    # The holder renews it every lease_s/6; a standby takes over within lease_s of the last renewal
    # when the holder stops or hangs; a holder stops acting before its lease could have run out
    # (docs/reliability.md)
    lease_s: float = Field(15.0, ge=1.0, le=600.0)
    # who holds the lease, as the lease row shows it; "" means HOSTNAME:PID
    lease_holder: str = Field("", max_length=255)
    # the API's /metrics answers clients from these networks (a list, or in DLTS_METRICS_ALLOW_CIDRS
    # a comma-separated string; behind nginx the client is nginx on loopback, see
    # docs/monitoring.md#who-may-scrape) and clients sending this file's token as a Bearer token
    metrics_allow_cidrs: tuple[str, ...] = ("127.0.0.0/8", "::1/128")
    metrics_token_file: Path | None = None
    # the repair manager: rules file, budget, flap window, validation (docs/repair.md)
    repair: RepairSettings = Field(default_factory=RepairSettings)
    # both backends: a node NotReady (or gone) this long loses its attempts (node_lost, requeued at
    # the head of the queue, no retry spent)
    node_lost_after_s: float = Field(300.0, ge=0, le=86400)
    # DB janitor: jobs finished longer ago are deleted, this many rows a transaction, a pause between
    retention_days: int = Field(180, ge=1)
    janitor_batch_rows: int = Field(500, ge=1, le=100_000)
    janitor_pause_s: float = Field(0.01, ge=0, le=60)  # the least pause; it is at least the batch's own time
    # POST /jobs with an Idempotency-Key header: a retry with the same key answers the same job for
    # this many hours; the janitor deletes older keys (docs/api.md#idempotent-submission)
    idempotency_key_ttl_h: float = Field(24.0, gt=0, le=24 * 366)
    # accounting (docs/accounting.md): seconds between bookings of GPU time into the usage rollup, and
    # days the per-minute utilisation history of attempts is kept
    accounting_interval_s: float = Field(60.0, ge=1, le=3600)
    utilisation_retention_days: int = Field(30, ge=1, le=3650)
    # Lustre: the cluster defaults (filesystem, default user quota, ...) for the storage manager,
    # which applies each VC's storage["lustre"] settings every storage_interval_s (None: off)
    lustre_defaults_file: Path | None = None
    storage_interval_s: float = Field(300.0, ge=10)
    # the argv prefix that reaches the Lustre MGS, where pool changes must run (e.g. ["ssh", "-o",
    # "BatchMode=yes", "root@mds1"]; a string is split like a shell line); () = this host is the MGS
    lustre_mgs_command: tuple[str, ...] = ()
    # seconds between reads of Lustre usage per user and per VC (lfs quota) into the storage snapshots
    lustre_usage_interval_s: float = Field(900.0, ge=10)
    # allowlists
    allow_ip_days: int = Field(30, ge=1)
    # job endpoints are reachable from their owner's allowed IPs and from these networks (e.g. the
    # VPN): a list, or in DLTS_ENDPOINT_ALLOW_CIDRS a comma-separated string
    endpoint_allow_cidrs: tuple[str, ...] = ()
    # the TCP ports the node agents guard (the Kubernetes NodePort range): inside it only listed
    # (source, port) pairs get through; "LO-HI" or [LO, HI]
    endpoint_port_range: tuple[int, int] = (30000, 32767)
    # operator-customisable templates (Kubernetes objects, e-mails); None: the packaged ones
    templates_dir: Path | None = None
    # the notifier: SMTP server, sender, rate limits (docs/notifications.md)
    notify: NotifySettings = Field(default_factory=NotifySettings)
    # the storage manager's scans, alerts and expiry of NFS/local roots (docs/storage.md)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    # insight messages on running jobs and the VCs' idle-job policy (docs/monitoring.md#insight)
    insight: InsightSettings = Field(default_factory=InsightSettings)
    # users, groups and VC roles from LDAP: `dlts directory sync` (docs/administration.md)
    directory: DirectorySettings = Field(default_factory=DirectorySettings)

    @field_validator("kubernetes", "storage", "insight", "directory", "forecast", "disk_pressure", mode="before")
    @classmethod
    def _empty_section(cls, value: Any) -> Any:
        # "kubernetes:" with nothing under it is YAML null: the section with every default
        return {} if value is None else value

    @field_validator("sku_reserve", "vc_scheduling", mode="before")
    @classmethod
    def _json_mapping(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return json.loads(value) if value.strip() else {}
            except ValueError:
                raise ValueError('must be a mapping, in the environment JSON like {"a100": {"cpu_per_gpu": 10}}') from None
        return {} if value is None else value

    @field_validator("database_url")
    @classmethod
    def _known_database(cls, value: str) -> str:
        if value and not value.startswith(("sqlite:", "mysql+pymysql:", "mariadb+pymysql:")):
            raise ValueError("must be sqlite:///PATH or mysql+pymysql://USER:PASS@HOST/DB")
        return value

    @field_validator("managers_metrics_listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        if value:
            host, sep, port = value.rpartition(":")
            if not sep or not host or not is_whole_number(port, max_value=65535) or not 1 <= int(port) <= 65535:
                raise ValueError("must be HOST:PORT (e.g. 0.0.0.0:9465), or empty for no metrics endpoint")
        return value

    @field_validator("scheduler_profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        from dlts.scheduler import profile_named

        profile_named(value)  # ValueError naming the known profiles
        return value

    @field_validator("demo_sku")
    @classmethod
    def _sku_name(cls, value: str) -> str:
        if not value or not value.replace("-", "").replace("_", "").isalnum() or value == "cpu":
            raise ValueError("must be letters, digits, '-' or '_' and not 'cpu'")
        return value

    @field_validator("endpoint_allow_cidrs", "metrics_allow_cidrs", mode="before")
    @classmethod
    def _cidr_list(cls, value: Any) -> Any:
        return cidr_list(value)

    @field_validator("lustre_mgs_command", mode="before")
    @classmethod
    def _argv(cls, value: Any) -> Any:
        if isinstance(value, str):
            import shlex

            try:
                return tuple(shlex.split(value))
            except ValueError as exc:
                raise ValueError(f"is not a command line: {exc}") from None
        return value

    @field_validator("endpoint_port_range", mode="before")
    @classmethod
    def _port_range(cls, value: Any) -> Any:
        if isinstance(value, str):
            parts = value.replace(" ", "").split("-")
            if len(parts) != 2 or not all(is_whole_number(p, max_value=65535) for p in parts):
                raise ValueError("must be LO-HI, e.g. 30000-32767")
            value = (int(parts[0]), int(parts[1]))
        if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(p, int) for p in value):
            low, high = value
            if not 1 <= low <= high <= 65535:
                raise ValueError("must be two TCP ports LO <= HI between 1 and 65535")
        return value

    # -- derived paths -------------------------------------------------------------------------
    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.home / 'dlts.db').resolve()}"

    @property
    def effective_log_dir(self) -> Path:
        return (self.log_dir or self.home / "logs").resolve()

    @property
    def effective_run_dir(self) -> Path:
        return (self.run_dir or self.home / "run").resolve()

    @property
    def effective_lease_holder(self) -> str:
        if self.lease_holder:
            return self.lease_holder
        import socket

        return f"{socket.gethostname()}:{os.getpid()}"


# Sections whose keys the environment sets one by one: DLTS_KUBERNETES__NAMESPACE=jobs,
# DLTS_STORAGE__SCAN_INTERVAL_S=600, DLTS_INSIGHT__IDLE_MIN=45, DLTS_DIRECTORY__URL=ldaps://...,
# DLTS_FORECAST__INTERVAL_S=60, DLTS_DISK_PRESSURE__HARD_FREE_BYTES=2147483648 (lists
# such as storage.roots and directory.vc_roles are the file's).
SECTIONS: dict[str, type[BaseModel]] = {"kubernetes": KubernetesSettings, "storage": StorageSettings, "insight": InsightSettings,
            "directory": DirectorySettings, "forecast": ForecastSettings,
            "disk_pressure": DiskPressureSettings}


def _from_env(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings the environment gives, and for each (dotted) key the variable it came from."""
    known = {name.upper(): name for name in Settings.model_fields}
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for name, model in SECTIONS.items():
        section_from_env(name, {key.upper(): key for key in model.model_fields}, environ, values, origins)
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX) or key in ("DLTS_CONFIG", "DLTS_TEST_DATABASE_URL"):
            continue
        rest = key[len(ENV_PREFIX):]
        if "__" in rest:
            continue
        field = known.get(rest)
        if field is not None and field not in SECTIONS:
            values[field] = raw
            origins[field] = key
    return values, origins


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> Settings:
    """Build the settings from defaults, the file, the environment and explicit overrides."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    if environ.get("DLTS_HOME"):
        values["home"] = environ["DLTS_HOME"]
    path = config_path(config_file, environ)
    if path is not None:
        values.update(read_file(path))
    from_env, origins = _from_env(environ)
    for name, value in from_env.items():
        if name in SECTIONS:  # the environment sets single keys of the file's section
            values[name] = merge_section(values.get(name), value)
        else:
            values[name] = value
    values.update(overrides)
    try:
        return Settings(**values)
    except ValidationError as exc:
        raise invalid(exc, origins, path) from None


def describe(settings: Settings) -> list[str]:
    """The effective values as ``key: value`` lines (``dlts config check``), secrets hidden; the
    ``kubernetes:`` section as indented lines under its name."""
    lines = []
    for key, value in settings.model_dump().items():
        if key in SECTIONS:
            lines.append(f"{key}:")
            section = getattr(settings, key).model_dump(mode="json")
            lines.extend(f"  {sub}: {_shown(v)}" for sub, v in section.items())
            continue
        shown = "***" if key == "secret_key" and value else value
        if key == "database_url" and value and "@" in str(value):
            shown = str(value).split("://")[0] + "://***@" + str(value).split("@", 1)[1]
        lines.append(f"{key}: {shown}")
    return lines


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def require_trusted_local_backend(settings: Settings) -> None:
    """Refuse ``backend: local`` outside the demo unless ``local_backend_trusted_users`` is set: the
    local backend isolates no job from the service (``dlts managers``, ``dlts api``)."""
    if settings.backend == "local" and not settings.local_backend_trusted_users:
        raise ConfigError(LOCAL_BACKEND_REFUSED)


def require_production_secrets(settings: Settings) -> None:
    """Refuse to serve a real database with an empty secret key."""
    if settings.database_url.startswith(("mysql", "mariadb")) and len(settings.secret_key) < 16:
        raise ConfigError("secret_key: must be set (16+ characters) when database_url is MySQL/MariaDB")
