"""Prometheus rendering of an ``AgentSnapshot``: metric names, labels, the registry, the textfile.

Names follow docs/agent.md: ``dlts_node_*`` for the machine and the agent itself, ``dlts_gpu_*``
per GPU, base units in the name (``_bytes``, ``_seconds``, ``_celsius``, ``_watts``, ``_ratio``),
counters end in ``_total``. A value NVML did not give is absent, not 0. No timestamps (node_exporter's
textfile collector rejects them). GPU series carry ``gpu, uuid, bus_id`` and the holding job's
``job_id, user, vc, preemptible`` ("" when the GPU is free).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

if TYPE_CHECKING:
    from http.server import ThreadingHTTPServer

from dlts_agent.model import (
    AgentSnapshot,
    CollectorStatus,
    FirewallStatus,
    GpuReadout,
    GpuSample,
    HostSample,
    IbPortSample,
    JobsSample,
    LustreSample,
    NfsMountSample,
    XidSample,
)

GPU_LABELS = ["gpu", "uuid", "bus_id", "job_id", "user", "vc", "preemptible"]


def families(snap: AgentSnapshot) -> Iterator[Metric]:
    c = snap.collection
    yield from _agent_families(snap)
    host = c.sample("host")
    if host is not None:
        yield from _host_families(host)
    gpu = c.sample("gpu")
    jobs = c.sample("jobs")
    if gpu is not None:
        yield from _gpu_families(gpu, jobs)
    xid = c.sample("xid")
    if xid is not None:
        yield from _xid_families(xid, gpu)
    ib = c.sample("infiniband")
    if ib is not None:
        yield from _ib_families(ib)
    nfs = c.sample("nfs")
    if nfs is not None:
        yield from _nfs_families(nfs)
    lustre = c.sample("lustre")
    if lustre is not None:
        yield from _lustre_families(lustre)
    lustre_server = c.sample("lustre_server")
    if lustre_server is not None:  # dlts_lustre's families, collected this round (dlts_lustre_*)
        yield from lustre_server
    if jobs is not None:
        yield from _jobs_families(jobs)


def _agent_families(snap: AgentSnapshot) -> Iterator[Metric]:
    info = GaugeMetricFamily(
        "dlts_node_agent_info", "The DLTS node agent's version and node name.", labels=["version", "node"]
    )
    info.add_metric([snap.version, snap.node], 1)
    yield info
    last = GaugeMetricFamily(
        "dlts_node_collection_timestamp_seconds", "Wall-clock time of the collection these metrics come from."
    )
    last.add_metric([], snap.collection.time_s)
    yield last
    success = GaugeMetricFamily(
        "dlts_node_collector_success",
        "1 if the collector ran in the last collection, 0 if it failed.",
        labels=["collector"],
    )
    skipped = GaugeMetricFamily(
        "dlts_node_collector_skipped",
        "1 if the collector does not apply on this node (see the agent log for why).",
        labels=["collector"],
    )
    duration = GaugeMetricFamily(
        "dlts_node_collector_duration_seconds",
        "How long the collector took in the last collection.",
        labels=["collector"],
    )
    errors = CounterMetricFamily(
        "dlts_node_collector_errors",
        "Collector failures plus malformed inputs it skipped, since the agent started.",
        labels=["collector"],
    )
    last_ok = GaugeMetricFamily(
        "dlts_node_collector_last_success_timestamp_seconds",
        "Wall-clock time the collector last succeeded.",
        labels=["collector"],
    )
    for name, r in sorted(snap.collection.results.items()):
        if r.status is CollectorStatus.DISABLED:
            continue
        if r.status is CollectorStatus.SKIPPED:
            skipped.add_metric([name], 1)
        else:
            success.add_metric([name], 1 if r.status is CollectorStatus.OK else 0)
        duration.add_metric([name], r.duration_s)
        errors.add_metric([name], snap.collector_errors_total.get(name, 0))
        if name in snap.collector_last_success_s:
            last_ok.add_metric([name], snap.collector_last_success_s[name])
    yield from (success, skipped, duration, errors, last_ok)
    findings = GaugeMetricFamily(
        "dlts_node_findings", "Current findings by code and severity.", labels=["code", "severity"]
    )
    counts: dict[tuple[str, str], int] = {}
    for f in snap.findings:
        key = (f.code.value, f.severity.value)
        counts[key] = counts.get(key, 0) + 1
    for (code, sev), n in sorted(counts.items()):
        findings.add_metric([code, sev], n)
    yield findings
    if snap.report is not None:
        rep = snap.report
        rep_ok = GaugeMetricFamily(
            "dlts_node_report_last_success_timestamp_seconds",
            "Wall-clock time of the last report the API accepted (0 = never).",
        )
        rep_ok.add_metric([], rep.last_success_s or 0)
        rep_fail = CounterMetricFamily("dlts_node_report_failures", "Reports that failed, since the agent started.")
        rep_fail.add_metric([], rep.failures_total)
        orders = CounterMetricFamily("dlts_node_orders_executed", "Repair orders executed, since the agent started.")
        orders.add_metric([], rep.orders_executed_total)
        yield from (rep_ok, rep_fail, orders)
    if snap.firewall is not None:
        yield from _firewall_families(snap.firewall)


def _firewall_families(fw: FirewallStatus) -> Iterator[Metric]:
    yield _g(
        "dlts_node_firewall_rules",
        "(source network, port) pairs the applied endpoint firewall lets through to the guarded ports.",
        fw.pairs,
    )
    if fw.last_apply_ok is not None:
        yield _g(
            "dlts_node_firewall_last_apply_success",
            "1 if the last endpoint firewall change was applied, 0 if nft (or the API's data) failed.",
            1 if fw.last_apply_ok else 0,
        )
    yield _g(
        "dlts_node_firewall_last_success_timestamp_seconds",
        "Wall-clock time the endpoint firewall was last applied (0 = not since the agent started).",
        fw.last_success_s or 0,
    )
    applies = CounterMetricFamily("dlts_node_firewall_applies", "Endpoint firewall changes applied with nft.")
    applies.add_metric([], fw.applies_total)
    failures = CounterMetricFamily(
        "dlts_node_firewall_apply_failures", "Endpoint firewall changes not applied (nft failed or bad data)."
    )
    failures.add_metric([], fw.failures_total)
    restores = CounterMetricFamily(
        "dlts_node_firewall_restores",
        "Times the endpoint firewall's nftables table was found changed outside the agent (flushed, deleted) "
        "and put back.",
    )
    restores.add_metric([], fw.restores_total)
    yield from (applies, failures, restores)


def _host_families(h: HostSample) -> Iterator[Metric]:
    cpu = CounterMetricFamily("dlts_node_cpu_seconds", "CPU time by mode, all CPUs together.", labels=["mode"])
    for mode, v in sorted(h.cpu_seconds.items()):
        cpu.add_metric([mode], v)
    yield cpu
    yield _g("dlts_node_cpus", "Logical CPUs.", h.cpu_count)
    yield _g("dlts_node_memory_total_bytes", "Physical memory.", h.memory_total_bytes)
    yield _g("dlts_node_memory_available_bytes", "Memory available without swapping.", h.memory_available_bytes)
    load = GaugeMetricFamily("dlts_node_load_average", "Load average.", labels=["period"])
    for period, avg in (("1m", h.load1), ("5m", h.load5), ("15m", h.load15)):
        if avg is not None:
            load.add_metric([period], avg)
    yield load
    size = GaugeMetricFamily("dlts_node_filesystem_size_bytes", "Filesystem size.", labels=["mount"])
    free = GaugeMetricFamily("dlts_node_filesystem_free_bytes", "Filesystem space free.", labels=["mount"])
    used = GaugeMetricFamily("dlts_node_filesystem_used_ratio", "Used fraction of the filesystem.", labels=["mount"])
    inodes = GaugeMetricFamily("dlts_node_filesystem_free_inodes", "Inodes free on the filesystem (absent where it "
                               "reports none).", labels=["mount"])
    for fs in h.filesystems:
        size.add_metric([fs.mount], fs.size_bytes)
        free.add_metric([fs.mount], fs.free_bytes)
        if fs.size_bytes > 0:
            used.add_metric([fs.mount], fs.used_bytes / fs.size_bytes)
        if fs.free_inodes is not None:
            inodes.add_metric([fs.mount], fs.free_inodes)
    yield from (size, free, used, inodes)
    rx = CounterMetricFamily("dlts_node_network_receive_bytes", "Bytes received.", labels=["device"])
    tx = CounterMetricFamily("dlts_node_network_transmit_bytes", "Bytes sent.", labels=["device"])
    for dev, (r, t) in sorted(h.network.items()):
        rx.add_metric([dev], r)
        tx.add_metric([dev], t)
    yield from (rx, tx)


def _gpu_label_values(g: GpuSample, jobs: JobsSample | None) -> list[str]:
    j = jobs.for_gpu(g) if jobs is not None else None
    return [
        str(g.index),
        g.uuid or "",
        g.bus_id or "",
        j.job_id if j else "",
        j.user if j else "",
        j.vc if j else "",
        ("true" if j.preemptible else "false") if j else "",
    ]


def _gpu_families(readout: GpuReadout, jobs: JobsSample | None) -> Iterator[Metric]:
    yield _g("dlts_node_gpus", "GPUs NVML counts on this node (lost ones included).", readout.count)
    info = GaugeMetricFamily("dlts_gpu_info", "GPU model and driver.", labels=GPU_LABELS + ["name", "driver_version"])
    lost = GaugeMetricFamily("dlts_gpu_lost", "1 if NVML lost the GPU (e.g. it fell off the bus).", labels=GPU_LABELS)
    specs: list[tuple[str, str, Callable[[GpuSample], Any]]] = [
        ("dlts_gpu_utilization_ratio", "Fraction of time a kernel was running.", lambda g: g.utilization_ratio),
        ("dlts_gpu_memory_used_bytes", "Framebuffer memory used.", lambda g: g.memory_used_bytes),
        ("dlts_gpu_memory_total_bytes", "Framebuffer memory.", lambda g: g.memory_total_bytes),
        ("dlts_gpu_temperature_celsius", "GPU temperature.", lambda g: g.temperature_celsius),
        ("dlts_gpu_power_watts", "Power draw.", lambda g: g.power_watts),
        (
            "dlts_gpu_clocks_event_reasons",
            "Bitmask of nvmlClocksEventReason* why clocks are lowered.",
            lambda g: g.clocks_event_reasons,
        ),
        ("dlts_gpu_row_remap_pending", "1 if a row remap waits for a GPU reset.", lambda g: _b(g.row_remap_pending)),
        ("dlts_gpu_row_remap_failure", "1 if a row remap failed (RMA candidate).", lambda g: _b(g.row_remap_failure)),
        (
            "dlts_gpu_retired_pages_pending",
            "1 if a page retirement waits for a reboot.",
            lambda g: _b(g.retired_pages_pending),
        ),
        (
            "dlts_gpu_recovery_action",
            "NVML GPU recovery action (0 none, 1 reset, 2 reboot, 3 drain P2P, 4 drain+reset).",
            lambda g: g.recovery_action,
        ),
    ]
    gauges = [(GaugeMetricFamily(n, h, labels=GPU_LABELS), fn) for n, h, fn in specs]
    ecc = CounterMetricFamily(
        "dlts_gpu_ecc_errors",
        "ECC errors; counter=volatile resets when the driver loads.",
        labels=GPU_LABELS + ["type", "counter"],
    )
    rows = GaugeMetricFamily(
        "dlts_gpu_remapped_rows", "Rows remapped, by the kind of error that caused it.", labels=GPU_LABELS + ["type"]
    )
    retired = GaugeMetricFamily(
        "dlts_gpu_retired_pages", "Retired framebuffer pages (pre-Ampere), by cause.", labels=GPU_LABELS + ["cause"]
    )
    for g in readout.gpus:
        lv = _gpu_label_values(g, jobs)
        lost.add_metric(lv, 1 if g.lost else 0)
        if g.lost:
            continue
        info.add_metric(lv + [g.name or "", readout.driver_version or ""], 1)
        for fam, fn in gauges:
            v = fn(g)
            if v is not None:
                fam.add_metric(lv, v)
        for (etype, ctype), v in sorted(g.ecc_errors.items()):
            ecc.add_metric(lv + [etype, ctype], v)
        if g.remapped_rows_correctable is not None:
            rows.add_metric(lv + ["correctable"], g.remapped_rows_correctable)
        if g.remapped_rows_uncorrectable is not None:
            rows.add_metric(lv + ["uncorrectable"], g.remapped_rows_uncorrectable)
        if g.retired_pages_single_bit is not None:
            retired.add_metric(lv + ["single_bit"], g.retired_pages_single_bit)
        if g.retired_pages_double_bit is not None:
            retired.add_metric(lv + ["double_bit"], g.retired_pages_double_bit)
    yield info
    yield lost
    for fam, _ in gauges:
        yield fam
    yield from (ecc, rows, retired)


def _xid_families(x: XidSample, readout: GpuReadout | None) -> Iterator[Metric]:
    by_bus = {g.bus_id: g for g in readout.gpus} if readout is not None else {}
    fam = CounterMetricFamily(
        "dlts_gpu_xid_errors",
        "XID events per code; the kernel log and NVML see the same events, so don't add sources.",
        labels=["gpu", "uuid", "bus_id", "xid", "source"],
    )
    for (bus, xid, source), n in sorted(x.counts.items()):
        g = by_bus.get(bus)
        fam.add_metric([str(g.index) if g else "", (g.uuid or "") if g else "", bus, str(xid), source], n)
    yield fam
    fell = CounterMetricFamily(
        "dlts_gpu_fell_off_bus_messages", "Kernel 'fallen off the bus' messages without an XID.", labels=["bus_id"]
    )
    for bus, n in sorted(x.fell_off_bus_counts.items()):
        fell.add_metric([bus], n)
    yield fell
    yield _g(
        "dlts_node_kernel_log_readable",
        "1 if the agent can read the kernel log for XIDs.",
        1 if x.kernel_log_readable else 0,
    )


def _ib_families(ports: tuple[IbPortSample, ...]) -> Iterator[Metric]:
    labels = ["device", "port"]
    up = GaugeMetricFamily("dlts_node_infiniband_port_up", "1 if the port state is ACTIVE.", labels=labels + ["state"])
    rate = GaugeMetricFamily("dlts_node_infiniband_port_rate_bytes_per_second", "Link rate.", labels=labels)
    tx = CounterMetricFamily("dlts_node_infiniband_port_transmit_bytes", "Data sent.", labels=labels)
    rx = CounterMetricFamily("dlts_node_infiniband_port_receive_bytes", "Data received.", labels=labels)
    errs = CounterMetricFamily("dlts_node_infiniband_port_errors", "Port error counters.", labels=labels + ["counter"])
    for p in ports:
        lv = [p.device, str(p.port)]
        up.add_metric(lv + [p.state], 1 if p.state == "ACTIVE" else 0)
        if p.rate_bytes_per_second is not None:
            rate.add_metric(lv, p.rate_bytes_per_second)
        if p.transmitted_bytes is not None:
            tx.add_metric(lv, p.transmitted_bytes)
        if p.received_bytes is not None:
            rx.add_metric(lv, p.received_bytes)
        for name, v in sorted(p.errors.items()):
            errs.add_metric(lv + [name], v)
    yield from (up, rate, tx, rx, errs)


def _nfs_families(mounts: tuple[NfsMountSample, ...]) -> Iterator[Metric]:
    mounted = GaugeMetricFamily("dlts_node_nfs_mounted", "1 if the configured mount is mounted.", labels=["mount"])
    ok = GaugeMetricFamily("dlts_node_nfs_responsive", "1 if stat() answered within the timeout.", labels=["mount"])
    dur = GaugeMetricFamily("dlts_node_nfs_stat_duration_seconds", "How long stat() took.", labels=["mount"])
    for m in mounts:
        mounted.add_metric([m.mount], 1 if m.mounted else 0)
        ok.add_metric([m.mount], 1 if m.responsive else 0)
        if m.stat_duration_s is not None:
            dur.add_metric([m.mount], m.stat_duration_s)
    yield from (mounted, ok, dur)


def _lustre_families(s: LustreSample) -> Iterator[Metric]:
    yield _g("dlts_node_lustre_healthy", "1 if lctl health_check says healthy.", 1 if s.healthy else 0)
    rd = CounterMetricFamily(
        "dlts_node_lustre_target_read_bytes", "Bytes this client read from the target.", labels=["target"]
    )
    wr = CounterMetricFamily(
        "dlts_node_lustre_target_write_bytes", "Bytes this client wrote to the target.", labels=["target"]
    )
    ops = CounterMetricFamily(
        "dlts_node_lustre_target_operations",
        "Client operations on the target, by kind.",
        labels=["target", "operation"],
    )
    for t in s.targets:
        if t.read_bytes is not None:
            rd.add_metric([t.target], t.read_bytes)
        if t.write_bytes is not None:
            wr.add_metric([t.target], t.write_bytes)
        for op, n in sorted(t.operations.items()):
            ops.add_metric([t.target, op], n)
    yield from (rd, wr, ops)


def _jobs_families(jobs: JobsSample) -> Iterator[Metric]:
    yield _g("dlts_node_jobs", "DLTS jobs with processes on this node.", len(jobs.job_ids))
    yield _g("dlts_node_unattributed_job_processes",
             "Processes whose environment names a DLTS job but that belong to no job's container or init (booked nowhere).",
             jobs.unattributed)


def _g(name: str, doc: str, value: float) -> GaugeMetricFamily:
    fam = GaugeMetricFamily(name, doc)
    fam.add_metric([], value)
    return fam


def _b(v: bool | None) -> int | None:
    return None if v is None else int(v)


# ---------------------------------------------------------------------------------------------


class SnapshotCollector:
    """A prometheus_client collector that renders whatever snapshot ``get`` returns at scrape time."""

    def __init__(self, get: Callable[[], AgentSnapshot | None]) -> None:
        self._get = get

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: the families depend on the hardware found

    def collect(self) -> Iterator[Metric]:
        snap = self._get()
        if snap is not None:
            yield from families(snap)


def make_registry(get: Callable[[], AgentSnapshot | None]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(get))
    return registry


def render_prom(snap: AgentSnapshot) -> str:
    return render_bytes(snap).decode()


def render_bytes(snap: AgentSnapshot) -> bytes:
    from prometheus_client.exposition import generate_latest

    return generate_latest(make_registry(lambda: snap))


def write_textfile(path: str, body: bytes) -> None:
    """Atomic for node_exporter's textfile collector: write ``.PATH.tmp`` (not ``*.prom``, so never
    read half-written) in the same directory, then rename it over PATH."""
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(body)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def serve_metrics(address: str, port: int, render: Callable[[], bytes]) -> ThreadingHTTPServer:
    """A read-only HTTP endpoint: GET/HEAD ``/metrics`` (and ``/``). Any other method gets 501 from
    the standard library handler; nothing on this port can change the node. A thread per request,
    so a slow client cannot hold up Prometheus; each is cut off after ``timeout`` seconds.
    """
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        server_version = "dlts-agent"
        timeout = 10

        def log_message(self, format: str, *args: Any) -> None:  # `format`: the stdlib's signature
            pass

        def _reply(self, with_body: bool) -> None:
            if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                self.send_error(404, "only /metrics is served here")
                return
            body = render()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def do_GET(self) -> None:
            self._reply(True)

        def do_HEAD(self) -> None:
            self._reply(False)

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="exporter", daemon=True).start()
    return server


# ---------------------------------------------------------------------------------------------
# JSON (``--once --format json`` and the report's metrics summary)


def snapshot_json(snap: AgentSnapshot) -> dict[str, Any]:
    c = snap.collection
    out: dict[str, Any] = {
        "node": snap.node,
        "agent_version": snap.version,
        "time_s": c.time_s,
        "collectors": {
            name: {
                "status": r.status.value,
                "duration_s": round(r.duration_s, 6),
                "errors": list(r.errors),
                "skip_reason": r.skip_reason,
            }
            for name, r in sorted(c.results.items())
        },
        "findings": [f.to_json() for f in snap.findings],
        "metrics": metrics_summary(snap),
    }
    return out


def metrics_summary(snap: AgentSnapshot) -> dict[str, Any]:
    """The small per-node summary the report carries (the full series stay in Prometheus)."""
    c = snap.collection
    summary: dict[str, Any] = {}
    host: HostSample | None = c.sample("host")
    if host is not None:
        summary["cpu_count"] = host.cpu_count
        summary["load1"] = host.load1
        summary["memory_total_bytes"] = host.memory_total_bytes
        summary["memory_available_bytes"] = host.memory_available_bytes
        summary["filesystems"] = [
            {"mount": f.mount, "size_bytes": f.size_bytes, "free_bytes": f.free_bytes, "free_inodes": f.free_inodes}
            for f in host.filesystems
        ]
    gpu: GpuReadout | None = c.sample("gpu")
    jobs: JobsSample | None = c.sample("jobs")
    if gpu is not None:
        summary["gpu_count"] = gpu.count
        summary["driver_version"] = gpu.driver_version
        summary["gpus"] = [_gpu_json(g, jobs) for g in gpu.gpus]
    if jobs is not None:
        summary["job_ids"] = sorted(jobs.job_ids)
        # host resources per job, for the control plane's utilisation history (docs/agent.md)
        summary["jobs"] = [{"job_id": job, "pids": u.pids, "cpu_cores": u.cpu_cores, "memory_bytes": u.memory_bytes}
                           for job, u in sorted(jobs.usage.items())]
    return summary


def _gpu_json(g: GpuSample, jobs: JobsSample | None) -> dict[str, Any]:
    j = jobs.for_gpu(g) if jobs is not None else None
    return {
        "index": g.index,
        "uuid": g.uuid,
        "bus_id": g.bus_id,
        "name": g.name,
        "lost": g.lost,
        "utilization_ratio": g.utilization_ratio,
        "memory_used_bytes": g.memory_used_bytes,
        "memory_total_bytes": g.memory_total_bytes,
        "temperature_celsius": g.temperature_celsius,
        "power_watts": g.power_watts,
        "ecc_errors": {f"{t}_{c}": v for (t, c), v in sorted(g.ecc_errors.items())},
        "row_remap_pending": g.row_remap_pending,
        "row_remap_failure": g.row_remap_failure,
        "remapped_rows_uncorrectable": g.remapped_rows_uncorrectable,
        "retired_pages_single_bit": g.retired_pages_single_bit,
        "retired_pages_double_bit": g.retired_pages_double_bit,
        "retired_pages_pending": g.retired_pages_pending,
        "recovery_action": g.recovery_action,
        "job_id": j.job_id if j else None,
    }


def render_json(snap: AgentSnapshot) -> str:
    return json.dumps(snapshot_json(snap), indent=2, sort_keys=True)
