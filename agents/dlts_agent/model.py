"""Value types shared by collectors, detectors, the exporter and the reporter.

Everything here is a frozen dataclass or an Enum: a collection is a value that can be compared,
serialised to the report's JSON and rendered as Prometheus text without touching the machine again.
A field that the hardware or driver did not give us is ``None`` (never 0): "no data" must not read
as "healthy".
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


class CollectorStatus(str, enum.Enum):
    OK = "ok"  # ran; individual malformed items may still have been counted as errors
    FAILED = "failed"  # raised: nothing from this collector can be trusted this round
    SKIPPED = "skipped"  # not applicable here (e.g. dlts_lustre not installed)
    DISABLED = "disabled"  # switched off in the config


class Severity(str, enum.Enum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class RecommendedAction(str, enum.Enum):
    """What a human or the repair manager should do about a finding."""

    LOG_ONLY = "log_only"
    WATCH = "watch"
    INVESTIGATE = "investigate"
    RESET_GPU = "reset_gpu"  # drain the GPU's jobs, then reset it
    REBOOT = "reboot"  # drain the node, then reboot (power-cycle for a GPU off the bus)
    TICKET = "ticket"  # hardware ticket / RMA; keep the device out of service
    REMOUNT = "remount"
    FREE_DISK = "free_disk"


class FindingCode(str, enum.Enum):
    GPU_ECC_UNCORRECTED = "gpu_ecc_uncorrected"
    GPU_ECC_CORRECTED_TOTAL = "gpu_ecc_corrected_total"
    GPU_ECC_CORRECTED_RATE = "gpu_ecc_corrected_rate"
    GPU_ROW_REMAP_PENDING = "gpu_row_remap_pending"
    GPU_ROW_REMAP_FAILURE = "gpu_row_remap_failure"
    GPU_ROW_REMAP_UNCORRECTABLE = "gpu_row_remap_uncorrectable"
    GPU_RETIRED_PAGES = "gpu_retired_pages"
    GPU_RETIRED_PAGES_PENDING = "gpu_retired_pages_pending"
    GPU_RETIREMENT_TABLE_FULL = "gpu_retirement_table_full"
    GPU_RECOVERY_ACTION = "gpu_recovery_action"
    GPU_XID = "gpu_xid"
    GPU_FELL_OFF_BUS = "gpu_fell_off_bus"
    GPU_LOST = "gpu_lost"
    GPU_COUNT_LOW = "gpu_count_low"
    GPU_TELEMETRY_UNAVAILABLE = "gpu_telemetry_unavailable"
    IB_PORT_DOWN = "ib_port_down"
    NFS_HUNG = "nfs_hung"
    NFS_NOT_MOUNTED = "nfs_not_mounted"
    DISK_NEARLY_FULL = "disk_nearly_full"
    LUSTRE_UNHEALTHY = "lustre_unhealthy"


@dataclass(frozen=True)
class Finding:
    code: FindingCode
    severity: Severity
    device: str  # "gpu0", "mlx5_0/1", "/mnt/nfs", "node"
    action: RecommendedAction
    message: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    gpu_uuid: str | None = None
    bus_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code.value,
            "severity": self.severity.value,
            "device": self.device,
            "gpu_uuid": self.gpu_uuid,
            "bus_id": self.bus_id,
            "recommended_action": self.action.value,
            "message": self.message,
            "evidence": dict(self.evidence),
        }


# ---------------------------------------------------------------------------------------------
# Samples


@dataclass(frozen=True)
class FilesystemSample:
    mount: str
    size_bytes: int
    free_bytes: int
    used_bytes: int
    free_inodes: int | None = None  # None: the file system reports no inode count


@dataclass(frozen=True)
class HostSample:
    cpu_seconds: Mapping[str, float]  # mode -> seconds since boot, all CPUs together
    cpu_count: int
    memory_total_bytes: int
    memory_available_bytes: int
    load1: float | None
    load5: float | None
    load15: float | None
    filesystems: tuple[FilesystemSample, ...]
    network: Mapping[str, tuple[int, int]]  # device -> (received bytes, transmitted bytes)


@dataclass(frozen=True)
class GpuSample:
    """One GPU as NVML reported it. ``lost`` GPUs carry only what we knew before."""

    index: int
    uuid: str | None
    bus_id: str | None  # normalised "0000:65:00.0"
    name: str | None = None
    lost: bool = False
    lost_reason: str | None = None
    utilization_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    clocks_event_reasons: int | None = None
    # (error type, counter type) -> count; keys: ("corrected"|"uncorrected", "volatile"|"aggregate")
    ecc_errors: Mapping[tuple[str, str], int] = field(default_factory=dict)
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    retired_pages_single_bit: int | None = None
    retired_pages_double_bit: int | None = None
    retired_pages_pending: bool | None = None
    recovery_action: int | None = None
    pids: tuple[int, ...] = ()

    @property
    def device(self) -> str:
        return f"gpu{self.index}"


@dataclass(frozen=True)
class GpuReadout:
    gpus: tuple[GpuSample, ...]
    count: int  # what nvmlDeviceGetCount said
    driver_version: str | None = None


@dataclass(frozen=True)
class XidEvent:
    time_s: float  # wall clock
    bus_id: str | None  # normalised; None when the line did not say
    xid: int | None  # None for a fallen-off-bus message that carries no XID
    source: str  # "kernel" | "nvml"
    message: str
    boot_id: str = ""


@dataclass(frozen=True)
class XidSample:
    recent: tuple[XidEvent, ...]  # inside the detection window, this boot, after the GPU's last reset
    counts: Mapping[tuple[str, int, str], int]  # (bus_id or "unknown", xid, source) -> total since install
    fell_off_bus_counts: Mapping[str, int]  # bus_id -> fallen-off-the-bus messages without an XID
    kernel_log_readable: bool


@dataclass(frozen=True)
class IbPortSample:
    device: str
    port: int
    state: str  # "ACTIVE", "DOWN", "INIT", ...
    phys_state: str | None
    link_layer: str | None
    rate_bytes_per_second: float | None
    transmitted_bytes: int | None
    received_bytes: int | None
    errors: Mapping[str, int]  # counter name -> value

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"


@dataclass(frozen=True)
class NfsMountSample:
    mount: str
    mounted: bool
    responsive: bool
    stat_duration_s: float | None
    fstype: str | None = None


@dataclass(frozen=True)
class LustreTargetSample:
    target: str  # "fs-OST0000-osc-ffff..." as lctl names the client's view of the OST
    read_bytes: int | None
    write_bytes: int | None
    operations: Mapping[str, int]  # counter name -> samples


@dataclass(frozen=True)
class LustreSample:
    healthy: bool
    health_text: str
    unhealthy_devices: tuple[str, ...] = ()
    targets: tuple[LustreTargetSample, ...] = ()


@dataclass(frozen=True)
class JobLabels:
    job_id: str
    user: str
    vc: str
    preemptible: bool


@dataclass(frozen=True)
class JobUsage:
    """Host resources of one job's processes on this node (accounting's utilisation history)."""

    pids: int
    cpu_cores: float | None  # mean cores busy since the previous collection; None on the first one
    memory_bytes: int  # resident set size, summed over the job's processes


@dataclass(frozen=True)
class JobsSample:
    by_gpu_uuid: Mapping[str, JobLabels]
    by_gpu_index: Mapping[int, JobLabels]
    by_pid: Mapping[int, JobLabels]
    usage: Mapping[str, JobUsage] = field(default_factory=dict)  # by job id
    # processes whose environment claims a DLTS job but that no trusted source attributes (they book nothing)
    unattributed: int = 0

    def for_gpu(self, gpu: GpuSample) -> JobLabels | None:
        for pid in gpu.pids:  # NVML's host pids are the most reliable link
            if pid in self.by_pid:
                return self.by_pid[pid]
        if gpu.uuid and gpu.uuid in self.by_gpu_uuid:
            return self.by_gpu_uuid[gpu.uuid]
        return self.by_gpu_index.get(gpu.index)

    @property
    def job_ids(self) -> frozenset[str]:
        return frozenset(
            j.job_id for j in (*self.by_pid.values(), *self.by_gpu_uuid.values(), *self.by_gpu_index.values())
        )


@dataclass(frozen=True)
class CollectorResult:
    name: str
    status: CollectorStatus
    duration_s: float
    sample: Any = None  # HostSample, GpuReadout, ... ; None unless OK
    errors: tuple[str, ...] = ()  # malformed items or the failure, human-readable
    skip_reason: str | None = None


@dataclass(frozen=True)
class Collection:
    """One round of all collectors, at wall-clock ``time_s``."""

    time_s: float
    results: Mapping[str, CollectorResult]

    def sample(self, name: str) -> Any:
        r = self.results.get(name)
        return r.sample if r is not None and r.status is CollectorStatus.OK else None

    def status(self, name: str) -> CollectorStatus:
        r = self.results.get(name)
        return r.status if r is not None else CollectorStatus.DISABLED


@dataclass(frozen=True)
class ReportStatus:
    last_success_s: float | None
    last_attempt_s: float | None
    consecutive_failures: int
    failures_total: int
    last_error: str | None
    orders_executed_total: int


@dataclass(frozen=True)
class FirewallStatus:
    """The endpoint firewall as last applied (firewall.py); read by the exporter."""

    applied_version: str | None
    pairs: int  # (source, port) pairs allowed by the applied rules
    last_apply_ok: bool | None  # None: nothing tried since the agent started
    last_success_s: float | None
    applies_total: int
    failures_total: int
    last_error: str | None
    # times the table was found changed outside the agent (flushed, deleted) and put back
    restores_total: int = 0


@dataclass(frozen=True)
class AgentSnapshot:
    """Everything the exporter, the textfile and the reporter render: one consistent view."""

    node: str
    version: str
    collection: Collection
    findings: tuple[Finding, ...]
    collector_errors_total: Mapping[str, int]
    collector_last_success_s: Mapping[str, float]
    report: ReportStatus | None = None
    firewall: FirewallStatus | None = None


# -- a repair order's result: what actions.ActionExecutor records (state.py persists it) and reports

class OrderStatus(str, enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # tried, and it did not work
    REJECTED = "rejected"  # not tried: invalid, not allowed, or a precondition does not hold
    DRY_RUN = "dry_run"  # not tried on purpose; message says what would have run
    IN_PROGRESS = "in_progress"  # only a reboot, until the agent comes back on a new boot
    SKIPPED = "skipped"  # not tried: the tool it needs is not installed here (gpu_diag without dcgmi)


@dataclass(frozen=True)
class OrderResult:
    id: str
    action: str
    target: str
    status: OrderStatus
    message: str
    dry_run: bool
    started_at: float
    finished_at: float | None
    boot_id: str = ""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        d.pop("boot_id")
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> OrderResult:
        return OrderResult(
            str(d["id"]),
            str(d["action"]),
            str(d.get("target", "")),
            OrderStatus(d["status"]),
            str(d.get("message", "")),
            bool(d.get("dry_run", False)),
            float(d.get("started_at", 0)),
            d.get("finished_at"),
            str(d.get("boot_id", "")),
        )
