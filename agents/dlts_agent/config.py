"""The agent's one typed configuration: defaults, then the YAML file, then environment overrides.

A bad value stops start-up with the key's dotted name and what is expected, never a traceback.
Every key and its default is documented in docs/agent.md and agents/dlts-agent.yaml.example.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

ENV_CONFIG = "DLTS_AGENT_CONFIG"
ENV_NODE_TOKEN = "DLTS_AGENT_NODE_TOKEN"
ENV_API_URL = "DLTS_AGENT_API_URL"
ENV_NODE_NAME = "DLTS_AGENT_NODE_NAME"
DEFAULT_CONFIG_PATH = "/etc/dlts/agent.yaml"


class ConfigError(ValueError):
    """A config value is wrong; the message names the key and says what to write instead."""


@dataclass(frozen=True)
class ExporterConfig:
    enabled: bool = True
    listen_address: str = "0.0.0.0"
    port: int = 9445
    textfile_path: str = ""  # e.g. /run/prometheus/dlts_agent.prom; "" = no textfile


@dataclass(frozen=True)
class HostCollectorConfig:
    enabled: bool = True
    mounts: tuple[str, ...] = ("/",)  # local filesystems only: a hung NFS mount would block statvfs


@dataclass(frozen=True)
class GpuCollectorConfig:
    enabled: bool = True


@dataclass(frozen=True)
class XidCollectorConfig:
    enabled: bool = True
    source: str = "kmsg"  # kmsg | journal | none (NVML events only)
    kmsg_path: str = "/dev/kmsg"
    journalctl: str = "journalctl"
    nvml_events: bool = True
    max_lines_per_round: int = 20000


@dataclass(frozen=True)
class InfinibandCollectorConfig:
    enabled: bool = True
    ignore_ports: tuple[str, ...] = ()  # "mlx5_0/1"


@dataclass(frozen=True)
class LustreCollectorConfig:
    enabled: bool = True


LUSTRE_SERVER_SECTIONS = ("health", "targets", "pools", "ost_stats", "mdt_stats")


@dataclass(frozen=True)
class LustreServerCollectorConfig:
    """The filesystem's server-side metrics on an MGS/MDS/OSS (dlts_lustre's LustreCollector)."""

    enabled: bool = False
    fsname: str = ""  # required when enabled
    mount: str = ""  # a client mount on this server: use the "df" section instead of "targets"
    sections: tuple[str, ...] = LUSTRE_SERVER_SECTIONS
    timeout_s: float = 10.0


@dataclass(frozen=True)
class NfsCollectorConfig:
    enabled: bool = True
    mounts: tuple[str, ...] = ()
    timeout_s: float = 5.0


@dataclass(frozen=True)
class JobsCollectorConfig:
    enabled: bool = True
    # the local backend's run directory: its units' DLTS inits and their descendants are the jobs
    # here; empty: the jobs are the containers of containerd's namespace (Kubernetes)
    local_run_dir: str = ""
    # where containerd keeps each running container's OCI bundle (its `state` setting) and the
    # kubelet's namespace there
    containerd_state_dir: str = "/run/containerd"
    containerd_namespace: str = "k8s.io"


@dataclass(frozen=True)
class CollectorsConfig:
    host: HostCollectorConfig = HostCollectorConfig()
    gpu: GpuCollectorConfig = GpuCollectorConfig()
    xid: XidCollectorConfig = XidCollectorConfig()
    infiniband: InfinibandCollectorConfig = InfinibandCollectorConfig()
    lustre: LustreCollectorConfig = LustreCollectorConfig()
    lustre_server: LustreServerCollectorConfig = LustreServerCollectorConfig()
    nfs: NfsCollectorConfig = NfsCollectorConfig()
    jobs: JobsCollectorConfig = JobsCollectorConfig()


@dataclass(frozen=True)
class Thresholds:
    """Detector thresholds; defaults from ../shared/reference/gpu-health-and-lustre.md F1/F2."""

    ecc_uncorrected_volatile_max: int = 0  # > this -> critical, reset the GPU (GCM default 0)
    ecc_corrected_volatile_max: int = 50_000_000  # total since driver load -> critical (GCM)
    ecc_corrected_rate_per_hour_max: float = 10_000.0  # rate between collections -> warning, watch
    retired_pages_max: int = 10  # SBE + DBE retired pages (pre-Ampere) -> critical (GCM)
    retirement_table_full_pages: int = 62  # with a pending retirement -> RMA (Azure NHC2018)
    remapped_rows_uncorrectable_max: int = 512  # -> RMA (Azure)
    xid_window_s: float = 7200.0  # an XID counts as current for 2 h (Azure)
    xid_repeat_count: int = 3  # a "log only"/"warn" XID repeating this often in the window escalates
    disk_used_warning_ratio: float = 0.90
    disk_used_critical_ratio: float = 0.97


@dataclass(frozen=True)
class ReportConfig:
    enabled: bool = False
    api_url: str = ""  # https://dlts.example.com ; the agent POSTs to {api_url}/api/v1/nodes/{node}/report
    node_token_file: str = "/etc/dlts/node-token"
    interval_s: float = 30.0
    timeout_s: float = 10.0
    backoff_initial_s: float = 2.0
    backoff_max_s: float = 300.0
    allow_insecure_http: bool = False  # plain http is accepted for loopback only unless this is true
    ca_file: str = ""


@dataclass(frozen=True)
class ActionsConfig:
    enabled: bool = True
    restartable_services: tuple[str, ...] = (
        "nvidia-fabricmanager.service",
        "nvidia-persistenced.service",
        "nvidia-dcgm.service",
    )
    nvidia_smi: str = "nvidia-smi"
    systemctl: str = "systemctl"
    command_timeout_s: float = 120.0
    reboot_requires_no_jobs: bool = True
    dcgmi: str = "dcgmi"  # the GPU diagnostic a repair's validation may order (gpu_diag)
    diag_timeout_s: float = 900.0  # one dcgmi diag run (level 1 takes about a minute)


@dataclass(frozen=True)
class FirewallConfig:
    """The endpoint firewall (firewall.py): the API's allowlist as an nftables table on this node."""

    enabled: bool = False
    nft: str = ""  # "" = nft on PATH, else /usr/sbin/nft
    timeout_s: float = 30.0


@dataclass(frozen=True)
class PathsConfig:
    proc: str = "/proc"
    sys: str = "/sys"


@dataclass(frozen=True)
class AgentConfig:
    node_name: str = ""  # "" = the host name
    interval_s: float = 15.0
    expected_gpu_count: int = 0  # 0 = don't check
    state_dir: str = "/var/lib/dlts-agent"
    log_level: str = "INFO"
    exporter: ExporterConfig = ExporterConfig()
    collectors: CollectorsConfig = CollectorsConfig()
    thresholds: Thresholds = Thresholds()
    report: ReportConfig = ReportConfig()
    actions: ActionsConfig = ActionsConfig()
    firewall: FirewallConfig = FirewallConfig()
    paths: PathsConfig = PathsConfig()

    @property
    def effective_node_name(self) -> str:
        return self.node_name or socket.gethostname().split(".")[0]


# ---------------------------------------------------------------------------------------------


def _convert(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping of settings, got {value!r}")
        return _build(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected a whole number, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if origin is tuple:
        (item_tp, _ellipsis) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return tuple(_convert(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value))
    if origin in (typing.Union, types.UnionType):  # pragma: no cover - no optional keys today
        raise ConfigError(f"{key}: unsupported type")
    raise ConfigError(f"{key}: unsupported type {tp!r}")  # pragma: no cover


def _build(cls: Any, data: Mapping[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(f"unknown config key {where}{unknown[0]}; known keys here: {', '.join(sorted(names))}")
    kwargs = {}
    for name in names & set(data):
        kwargs[name] = _convert(data[name], hints[name], f"{prefix}.{name}" if prefix else name)
    return cls(**kwargs)


def _validate(cfg: AgentConfig) -> None:
    def positive(key: str, value: float) -> None:
        if value <= 0:
            raise ConfigError(f"{key}: must be greater than 0, got {value}")

    positive("interval_s", cfg.interval_s)
    positive("report.interval_s", cfg.report.interval_s)
    positive("report.timeout_s", cfg.report.timeout_s)
    positive("report.backoff_initial_s", cfg.report.backoff_initial_s)
    positive("collectors.nfs.timeout_s", cfg.collectors.nfs.timeout_s)
    positive("collectors.lustre_server.timeout_s", cfg.collectors.lustre_server.timeout_s)
    ls = cfg.collectors.lustre_server
    if ls.enabled:
        import re

        if not re.fullmatch(r"[A-Za-z0-9_]{1,8}", ls.fsname):
            raise ConfigError(f"collectors.lustre_server.fsname: the filesystem name (1-8 letters, digits, _), got {ls.fsname!r}")
        allowed = set(LUSTRE_SERVER_SECTIONS) | {"df"}
        unknown = [s for s in ls.sections if s not in allowed]
        if unknown or not ls.sections:
            raise ConfigError(f"collectors.lustre_server.sections: choose from {', '.join(sorted(allowed))}, got {list(ls.sections)}")
        if "df" in ls.sections and ("targets" in ls.sections or not ls.mount):
            raise ConfigError("collectors.lustre_server.sections: df needs collectors.lustre_server.mount and replaces targets")
    positive("actions.command_timeout_s", cfg.actions.command_timeout_s)
    positive("actions.diag_timeout_s", cfg.actions.diag_timeout_s)
    positive("firewall.timeout_s", cfg.firewall.timeout_s)
    if cfg.firewall.enabled and not cfg.report.enabled:
        raise ConfigError(
            "firewall.enabled: the rules arrive in the report's response; enable report "
            "(report.enabled and report.api_url) or set firewall.enabled: false"
        )
    if cfg.report.backoff_max_s < cfg.report.backoff_initial_s:
        raise ConfigError("report.backoff_max_s: must be at least report.backoff_initial_s")
    if cfg.expected_gpu_count < 0:
        raise ConfigError("expected_gpu_count: must be 0 (don't check) or the GPUs this node has")
    if not 0 <= cfg.exporter.port <= 65535:
        raise ConfigError(f"exporter.port: {cfg.exporter.port} is not a TCP port (0-65535)")
    if cfg.exporter.textfile_path and not cfg.exporter.textfile_path.endswith(".prom"):
        raise ConfigError(
            "exporter.textfile_path: node_exporter reads only *.prom files; "
            f"use a name ending in .prom, not {cfg.exporter.textfile_path!r}"
        )
    if cfg.collectors.xid.source not in ("kmsg", "journal", "none"):
        raise ConfigError(f"collectors.xid.source: expected kmsg, journal or none, got {cfg.collectors.xid.source!r}")
    t = cfg.thresholds
    if not 0 < t.disk_used_warning_ratio <= t.disk_used_critical_ratio <= 1:
        raise ConfigError(
            "thresholds.disk_used_warning_ratio and disk_used_critical_ratio: need 0 < warning <= critical <= 1"
        )
    if cfg.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"log_level: expected DEBUG, INFO, WARNING or ERROR, got {cfg.log_level!r}")
    for svc in cfg.actions.restartable_services:
        if not _is_unit_name(svc):
            raise ConfigError(f"actions.restartable_services: {svc!r} is not a systemd unit name like foo.service")
    if cfg.report.enabled:
        _validate_api_url(cfg.report)


def _is_unit_name(name: str) -> bool:
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:-_.@\\")
    return bool(name) and "." in name and set(name) <= allowed and not name.startswith("-")


def _validate_api_url(report: ReportConfig) -> None:
    url = report.api_url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"report.api_url: expected https://HOST[:PORT], got {url!r}")
    if parts.scheme == "http" and not report.allow_insecure_http:
        import ipaddress

        host = parts.hostname
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback:
            raise ConfigError(
                f"report.api_url: {url!r} is plain http; the node token and repair orders must "
                "travel over https. Use https, or set report.allow_insecure_http: true for a lab."
            )


def load_config(path: str | None = None, env: Mapping[str, str] | None = None) -> AgentConfig:
    """Read the YAML file (missing default path = all defaults) and apply environment overrides."""
    env = os.environ if env is None else env
    explicit = path or env.get(ENV_CONFIG)
    path = explicit or DEFAULT_CONFIG_PATH
    data: Mapping[str, Any] = {}
    if os.path.exists(path):
        import yaml  # imported here: the default path may not exist and yaml costs start-up memory

        try:
            with open(path, encoding="utf-8") as f:
                loaded = yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
        except OSError as e:
            raise ConfigError(f"{path}: cannot read the config file: {e.strerror}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, Mapping):
            raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(loaded).__name__}")
        data = loaded
    elif explicit:
        raise ConfigError(f"{path}: config file not found; pass --config PATH or create it")
    return config_from_mapping(data, env)


def config_from_mapping(data: Mapping[str, Any], env: Mapping[str, str] | None = None) -> AgentConfig:
    env = {} if env is None else env
    cfg = _build(AgentConfig, data, "")
    if env.get(ENV_API_URL):
        cfg = dataclasses.replace(cfg, report=dataclasses.replace(cfg.report, api_url=env[ENV_API_URL], enabled=True))
    if env.get(ENV_NODE_NAME):
        cfg = dataclasses.replace(cfg, node_name=env[ENV_NODE_NAME])
    _validate(cfg)
    return cfg


def read_node_token(cfg: ReportConfig, env: Mapping[str, str] | None = None) -> str:
    """The bearer token: $DLTS_AGENT_NODE_TOKEN (systemd EnvironmentFile) or report.node_token_file."""
    env = os.environ if env is None else env
    token = env.get(ENV_NODE_TOKEN, "").strip()
    if token:
        return token
    try:
        with open(cfg.node_token_file, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as e:
        raise ConfigError(
            f"report.node_token_file: cannot read {cfg.node_token_file} ({e.strerror}); create it "
            f"with the token from `dlts node token NODE`, or set {ENV_NODE_TOKEN}"
        ) from None
    if not token:
        raise ConfigError(f"report.node_token_file: {cfg.node_token_file} is empty")
    return token


__all__ = [
    "AgentConfig",
    "ConfigError",
    "Thresholds",
    "config_from_mapping",
    "load_config",
    "read_node_token",
]
