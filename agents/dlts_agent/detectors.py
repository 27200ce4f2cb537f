"""Detectors: pure functions from samples and thresholds to findings.

No I/O, no clock: everything comes in through the arguments, so each rule is tested with a table
of samples. Corrected-error counts are judged as rates between two collections, never as totals
(aggregate counters persist in the InfoROM for the GPU's whole life). Rules and thresholds follow
../shared/reference/gpu-health-and-lustre.md (F1 ECC/remap/retired pages, F2 XID table).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from dlts_agent.config import Thresholds
from dlts_agent.model import (
    Collection,
    CollectorStatus,
    Finding,
    FindingCode,
    GpuReadout,
    GpuSample,
    HostSample,
    IbPortSample,
    LustreSample,
    NfsMountSample,
    XidEvent,
    XidSample,
)
from dlts_agent.model import (
    RecommendedAction as A,
)
from dlts_agent.model import (
    Severity as S,
)


@dataclass(frozen=True)
class XidRule:
    severity: S
    action: A
    meaning: str
    repeat_severity: S | None = None  # when it repeats xid_repeat_count times in the window
    repeat_action: A | None = None


# F2: NVIDIA's resolution bucket, cross-checked with the skip lists of the device plugin and GCM
XID_RULES: dict[int, XidRule] = {
    13: XidRule(S.INFO, A.LOG_ONLY, "graphics engine exception (application fault)", S.WARNING, A.INVESTIGATE),
    31: XidRule(S.INFO, A.LOG_ONLY, "GPU memory page fault (application fault)"),
    43: XidRule(S.INFO, A.LOG_ONLY, "GPU stopped processing (channel reset)"),
    45: XidRule(S.INFO, A.LOG_ONLY, "preemptive cleanup after a previous error; follow the root-cause XID"),
    48: XidRule(S.CRITICAL, A.RESET_GPU, "double-bit ECC error"),
    62: XidRule(S.CRITICAL, A.RESET_GPU, "internal micro-controller halt", S.CRITICAL, A.REBOOT),
    63: XidRule(S.WARNING, A.RESET_GPU, "row remap / page retirement recorded; reset at the next drain"),
    64: XidRule(S.CRITICAL, A.RESET_GPU, "row remap / page retirement failure", S.CRITICAL, A.TICKET),
    68: XidRule(S.INFO, A.LOG_ONLY, "NVDEC exception"),
    74: XidRule(S.CRITICAL, A.RESET_GPU, "NVLink error", S.CRITICAL, A.TICKET),
    79: XidRule(S.CRITICAL, A.REBOOT, "GPU has fallen off the bus", S.CRITICAL, A.TICKET),
    92: XidRule(S.WARNING, A.WATCH, "high single-bit ECC rate"),
    94: XidRule(S.WARNING, A.RESET_GPU, "contained ECC error; reset after the job to remap"),
    95: XidRule(S.CRITICAL, A.RESET_GPU, "uncontained ECC error"),
    109: XidRule(S.WARNING, A.WATCH, "context-switch timeout", S.WARNING, A.RESET_GPU),
    119: XidRule(S.CRITICAL, A.RESET_GPU, "GSP RPC timeout", S.CRITICAL, A.REBOOT),
    120: XidRule(S.CRITICAL, A.RESET_GPU, "GSP error", S.CRITICAL, A.REBOOT),
    140: XidRule(S.CRITICAL, A.RESET_GPU, "unrecovered ECC error"),
    154: XidRule(S.WARNING, A.INVESTIGATE, "GPU recovery action changed; see the recovery-action finding"),
}
UNKNOWN_XID = XidRule(S.WARNING, A.INVESTIGATE, "XID not in the agent's table")

# F1: NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values (r570+)
RECOVERY_ACTIONS: dict[int, tuple[str, S, A]] = {
    1: ("GPU_RESET", S.CRITICAL, A.RESET_GPU),
    2: ("NODE_REBOOT", S.CRITICAL, A.REBOOT),
    3: ("DRAIN_P2P", S.WARNING, A.INVESTIGATE),
    4: ("DRAIN_AND_RESET", S.CRITICAL, A.RESET_GPU),
    5: ("RECOVER_IMEX_DOMAIN", S.WARNING, A.INVESTIGATE),
    6: ("BUS_RESET", S.CRITICAL, A.REBOOT),
    7: ("SYSTEM_REBOOT", S.CRITICAL, A.REBOOT),
}

_SEVERITY_ORDER = {S.CRITICAL: 0, S.WARNING: 1, S.INFO: 2}


def detect(
    current: Collection, previous: Collection | None, thresholds: Thresholds, expected_gpu_count: int = 0
) -> list[Finding]:
    """All findings for one collection, most severe first."""
    findings: list[Finding] = []
    gpu: GpuReadout | None = current.sample("gpu")
    prev_gpu: GpuReadout | None = previous.sample("gpu") if previous is not None else None
    dt_s = current.time_s - previous.time_s if previous is not None else 0.0
    if gpu is not None:
        prev_by_uuid = {g.uuid: g for g in prev_gpu.gpus} if prev_gpu is not None else {}
        for g in gpu.gpus:
            findings += detect_gpu(g, prev_by_uuid.get(g.uuid), dt_s, thresholds)
        findings += detect_gpu_count(gpu, expected_gpu_count)
    elif current.status("gpu") is CollectorStatus.FAILED and expected_gpu_count > 0:
        err = current.results["gpu"].errors
        findings.append(
            Finding(
                FindingCode.GPU_TELEMETRY_UNAVAILABLE,
                S.CRITICAL,
                "node",
                A.INVESTIGATE,
                f"cannot read the {expected_gpu_count} GPUs this node should have: {err[0] if err else 'NVML failed'}",
                {"expected_gpus": expected_gpu_count, "error": err[0] if err else ""},
            )
        )
    xid: XidSample | None = current.sample("xid")
    if xid is not None:
        findings += detect_xid(xid.recent, thresholds, gpu)
    ib = current.sample("infiniband")
    if ib is not None:
        findings += detect_ib(ib)
    nfs = current.sample("nfs")
    if nfs is not None:
        findings += detect_nfs(nfs)
    host: HostSample | None = current.sample("host")
    if host is not None:
        findings += detect_disk(host, thresholds)
    lustre: LustreSample | None = current.sample("lustre")
    if lustre is not None and not lustre.healthy:
        findings.append(
            Finding(
                FindingCode.LUSTRE_UNHEALTHY,
                S.CRITICAL,
                "lustre",
                A.INVESTIGATE,
                f"Lustre client health_check says {lustre.health_text!r}",
                {"health_check": lustre.health_text, "unhealthy_devices": list(lustre.unhealthy_devices)},
            )
        )
    findings.sort(key=lambda f: (_SEVERITY_ORDER[f.severity], f.device, f.code.value))
    return findings


def _gpu_finding(g: GpuSample, code: FindingCode, sev: S, action: A, message: str, evidence: dict) -> Finding:
    return Finding(
        code,
        sev,
        g.device,
        action,
        f"{g.device} ({g.bus_id or 'unknown bus'}): {message}",
        evidence,
        gpu_uuid=g.uuid,
        bus_id=g.bus_id,
    )


def detect_gpu(g: GpuSample, prev: GpuSample | None, dt_s: float, t: Thresholds) -> list[Finding]:
    out: list[Finding] = []
    if g.lost:
        out.append(
            _gpu_finding(
                g,
                FindingCode.GPU_LOST,
                S.CRITICAL,
                A.REBOOT,
                f"NVML lost the GPU ({g.lost_reason}); drain the node and reboot",
                {"reason": g.lost_reason},
            )
        )
        return out
    unc = g.ecc_errors.get(("uncorrected", "volatile"))
    if unc is not None and unc > t.ecc_uncorrected_volatile_max:
        out.append(
            _gpu_finding(
                g,
                FindingCode.GPU_ECC_UNCORRECTED,
                S.CRITICAL,
                A.RESET_GPU,
                f"{unc} uncorrected ECC errors since the driver loaded; drain, reset, re-check remap",
                {"uncorrected_volatile": unc, "threshold": t.ecc_uncorrected_volatile_max},
            )
        )
    corr = g.ecc_errors.get(("corrected", "volatile"))
    if corr is not None and corr > t.ecc_corrected_volatile_max:
        out.append(
            _gpu_finding(
                g,
                FindingCode.GPU_ECC_CORRECTED_TOTAL,
                S.CRITICAL,
                A.RESET_GPU,
                f"{corr} corrected ECC errors since the driver loaded",
                {"corrected_volatile": corr, "threshold": t.ecc_corrected_volatile_max},
            )
        )
    prev_corr = prev.ecc_errors.get(("corrected", "volatile")) if prev is not None else None
    if corr is not None and prev_corr is not None and dt_s > 0 and corr >= prev_corr:
        rate = (corr - prev_corr) / dt_s * 3600.0
        if rate > t.ecc_corrected_rate_per_hour_max:
            out.append(
                _gpu_finding(
                    g,
                    FindingCode.GPU_ECC_CORRECTED_RATE,
                    S.WARNING,
                    A.WATCH,
                    f"corrected ECC errors at {rate:.0f}/h",
                    {
                        "rate_per_hour": round(rate, 1),
                        "delta": corr - prev_corr,
                        "interval_s": round(dt_s, 3),
                        "threshold_per_hour": t.ecc_corrected_rate_per_hour_max,
                    },
                )
            )
    if g.row_remap_pending:
        out.append(
            _gpu_finding(
                g,
                FindingCode.GPU_ROW_REMAP_PENDING,
                S.CRITICAL,
                A.RESET_GPU,
                "row remap pending; it takes effect only after a GPU reset",
                {"row_remap_pending": 1, "uncorrectable_rows": g.remapped_rows_uncorrectable},
            )
        )
    if g.row_remap_failure:
        out.append(
            _gpu_finding(
                g,
                FindingCode.GPU_ROW_REMAP_FAILURE,
                S.CRITICAL,
                A.TICKET,
                "row remap failed; RMA candidate: open a ticket and keep the GPU out of service",
                {"row_remap_failure": 1, "uncorrectable_rows": g.remapped_rows_uncorrectable},
            )
        )
    if g.remapped_rows_uncorrectable is not None and g.remapped_rows_uncorrectable > t.remapped_rows_uncorrectable_max:
        out.append(
            _gpu_finding(
                g,
                FindingCode.GPU_ROW_REMAP_UNCORRECTABLE,
                S.CRITICAL,
                A.TICKET,
                f"{g.remapped_rows_uncorrectable} rows remapped for uncorrectable errors",
                {"uncorrectable_rows": g.remapped_rows_uncorrectable, "threshold": t.remapped_rows_uncorrectable_max},
            )
        )
    if g.retired_pages_single_bit is not None or g.retired_pages_double_bit is not None:
        sbe = g.retired_pages_single_bit or 0
        dbe = g.retired_pages_double_bit or 0
        evidence = {"single_bit": sbe, "double_bit": dbe, "pending": int(bool(g.retired_pages_pending))}
        if sbe + dbe >= t.retirement_table_full_pages and g.retired_pages_pending:
            out.append(
                _gpu_finding(
                    g,
                    FindingCode.GPU_RETIREMENT_TABLE_FULL,
                    S.CRITICAL,
                    A.TICKET,
                    f"{sbe + dbe} pages retired with one pending: the retirement table is full",
                    {**evidence, "threshold": t.retirement_table_full_pages},
                )
            )
        elif sbe + dbe > t.retired_pages_max:
            out.append(
                _gpu_finding(
                    g,
                    FindingCode.GPU_RETIRED_PAGES,
                    S.CRITICAL,
                    A.TICKET,
                    f"{sbe + dbe} retired pages (single-bit {sbe}, double-bit {dbe})",
                    {**evidence, "threshold": t.retired_pages_max},
                )
            )
    if g.retired_pages_pending:
        out.append(
            _gpu_finding(
                g,
                FindingCode.GPU_RETIRED_PAGES_PENDING,
                S.WARNING,
                A.REBOOT,
                "a page retirement is pending; it takes effect after a reboot or driver reload",
                {"pending": 1},
            )
        )
    if g.recovery_action:
        name, sev, action = RECOVERY_ACTIONS.get(
            g.recovery_action, (f"UNKNOWN_{g.recovery_action}", S.WARNING, A.INVESTIGATE)
        )
        out.append(
            _gpu_finding(
                g,
                FindingCode.GPU_RECOVERY_ACTION,
                sev,
                action,
                f"the driver asks for recovery action {name}",
                {"recovery_action": g.recovery_action, "name": name},
            )
        )
    return out


def detect_gpu_count(gpu: GpuReadout, expected: int) -> list[Finding]:
    visible = sum(1 for g in gpu.gpus if not g.lost)
    if expected <= 0 or visible >= expected:
        return []
    return [
        Finding(
            FindingCode.GPU_COUNT_LOW,
            S.CRITICAL,
            "node",
            A.REBOOT,
            f"{visible} of {expected} GPUs usable; drain and reboot (power-cycle), ticket if it recurs",
            {
                "expected": expected,
                "nvml_count": gpu.count,
                "usable": visible,
                "lost": [g.index for g in gpu.gpus if g.lost],
            },
        )
    ]


def detect_xid(events: Iterable[XidEvent], t: Thresholds, gpu: GpuReadout | None = None) -> list[Finding]:
    """One finding per (bus, XID) and per bus that fell off; both sources count as one stream."""
    per_source: dict[tuple[str | None, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    last_msg: dict[tuple[str | None, int], str] = {}
    fell: dict[str | None, int] = defaultdict(int)
    for ev in events:
        if ev.xid is None:
            fell[ev.bus_id] += 1
            continue
        per_source[(ev.bus_id, ev.xid)][ev.source] += 1
        last_msg[(ev.bus_id, ev.xid)] = ev.message
    by_bus = {g.bus_id: g for g in gpu.gpus} if gpu is not None else {}
    out: list[Finding] = []
    for (bus, code), sources in per_source.items():
        count = max(sources.values())  # the kernel log and NVML report the same event
        rule = XID_RULES.get(code, UNKNOWN_XID)
        sev, action = rule.severity, rule.action
        if count >= t.xid_repeat_count and rule.repeat_action is not None:
            sev, action = rule.repeat_severity or sev, rule.repeat_action
        g = by_bus.get(bus)
        device = g.device if g is not None else f"pci:{bus}" if bus else "gpu?"
        out.append(
            Finding(
                FindingCode.GPU_XID,
                sev,
                device,
                action,
                f"XID {code} ({rule.meaning}) x{count} in the last {t.xid_window_s / 3600:g} h",
                {
                    "xid": code,
                    "count": count,
                    "window_s": t.xid_window_s,
                    "sources": dict(sources),
                    "last_message": last_msg[(bus, code)][:300],
                },
                gpu_uuid=g.uuid if g is not None else None,
                bus_id=bus,
            )
        )
    for bus, count in fell.items():
        g = by_bus.get(bus)
        device = g.device if g is not None else f"pci:{bus}" if bus else "gpu?"
        out.append(
            Finding(
                FindingCode.GPU_FELL_OFF_BUS,
                S.CRITICAL,
                device,
                A.REBOOT,
                f"kernel says the GPU at {bus or 'an unknown bus id'} fell off the bus; drain and power-cycle",
                {"messages": count},
                gpu_uuid=g.uuid if g is not None else None,
                bus_id=bus,
            )
        )
    return out


def detect_ib(ports: Iterable[IbPortSample]) -> list[Finding]:
    return [
        Finding(
            FindingCode.IB_PORT_DOWN,
            S.WARNING,
            p.name,
            A.INVESTIGATE,
            f"InfiniBand port {p.name} is {p.state} (physical {p.phys_state or 'unknown'})",
            {"state": p.state, "phys_state": p.phys_state, "link_layer": p.link_layer},
        )
        for p in ports
        if p.state != "ACTIVE"
    ]


def detect_nfs(mounts: Iterable[NfsMountSample]) -> list[Finding]:
    out = []
    for m in mounts:
        if not m.mounted:
            out.append(
                Finding(
                    FindingCode.NFS_NOT_MOUNTED,
                    S.CRITICAL,
                    m.mount,
                    A.REMOUNT,
                    f"{m.mount} is not mounted",
                    {"mounted": 0},
                )
            )
        elif not m.responsive:
            out.append(
                Finding(
                    FindingCode.NFS_HUNG,
                    S.CRITICAL,
                    m.mount,
                    A.REMOUNT,
                    f"{m.mount} ({m.fstype}) did not answer stat(); the server or network is hung",
                    {"mounted": 1, "responsive": 0, "fstype": m.fstype},
                )
            )
    return out


def detect_disk(host: HostSample, t: Thresholds) -> list[Finding]:
    out = []
    for fs in host.filesystems:
        if fs.size_bytes <= 0:
            continue
        ratio = fs.used_bytes / fs.size_bytes
        if ratio >= t.disk_used_warning_ratio:
            sev = S.CRITICAL if ratio >= t.disk_used_critical_ratio else S.WARNING
            out.append(
                Finding(
                    FindingCode.DISK_NEARLY_FULL,
                    sev,
                    fs.mount,
                    A.FREE_DISK,
                    f"{fs.mount} is {ratio:.1%} full ({fs.free_bytes / 1024**3:.1f} GiB free)",
                    {
                        "used_ratio": round(ratio, 4),
                        "free_bytes": fs.free_bytes,
                        "warning_ratio": t.disk_used_warning_ratio,
                        "critical_ratio": t.disk_used_critical_ratio,
                    },
                )
            )
    return out


__all__ = [
    "RECOVERY_ACTIONS",
    "XID_RULES",
    "detect",
    "detect_disk",
    "detect_gpu",
    "detect_gpu_count",
    "detect_ib",
    "detect_nfs",
    "detect_xid",
]
