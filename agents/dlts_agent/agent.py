"""The agent process: builds collectors from the config, runs collection rounds, keeps the latest
snapshot, and wires the exporter, the textfile, the reporter and the action executor around it.

Threads: the main thread collects every ``interval_s``; the metrics server thread serves the latest
snapshot, rendered by prometheus-client once per collection (a scrape never waits for a collection
or for the API); the reporter thread posts it and applies the endpoint firewall the API answers with
(``firewall.enabled``), and the main thread checks every interval that its table is still in force;
the executor thread carries out orders one at a time.
A systemd watchdog ping follows each round. ``registry`` exposes the same snapshot to tests
(``registry.get_sample_value``).
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from dlts_agent import __version__
from dlts_agent.actions import ActionExecutor
from dlts_agent.collectors.base import Collector, run_collector
from dlts_agent.collectors.gpu import GpuCollector
from dlts_agent.collectors.host import HostCollector
from dlts_agent.collectors.infiniband import InfinibandCollector
from dlts_agent.collectors.jobs import JobsCollector
from dlts_agent.collectors.lustre import LustreCollector
from dlts_agent.collectors.lustre_server import LustreServerCollector
from dlts_agent.collectors.nfs import NfsCollector
from dlts_agent.collectors.xid import XidCollector
from dlts_agent.config import AgentConfig, read_node_token
from dlts_agent.detectors import detect
from dlts_agent.firewall import Firewall
from dlts_agent.kernel_log import read_boot_id
from dlts_agent.metrics import make_registry, render_bytes, serve_metrics, write_textfile
from dlts_agent.model import AgentSnapshot, Collection, CollectorResult, CollectorStatus
from dlts_agent.nvml import Nvml
from dlts_agent.reporter import Reporter
from dlts_agent.state import AgentState

log = logging.getLogger(__name__)

COLLECTOR_ORDER = ("host", "gpu", "xid", "infiniband", "nfs", "lustre", "lustre_server", "jobs")


class Agent:
    def __init__(
        self,
        cfg: AgentConfig,
        *,
        nvml_lib: Any = None,
        persistent: bool = True,
        clock: Callable[[], float] = time.time,
        lustre_client: Callable[[], Any] | None = None,
        lustre_server_client: Callable[[], Any] | None = None,
    ) -> None:
        self.cfg = cfg
        self.clock = clock
        self.node = cfg.effective_node_name
        state_path = os.path.join(cfg.state_dir, "state.json") if persistent else None
        self.state = AgentState.load(state_path)
        self.nvml_lib = nvml_lib
        self.nvml = Nvml(nvml_lib) if cfg.collectors.gpu.enabled or cfg.collectors.xid.nvml_events else None
        self.collectors: dict[str, Collector] = {}
        cc, paths = cfg.collectors, cfg.paths
        if cc.host.enabled:
            self.collectors["host"] = HostCollector(paths.proc, cc.host.mounts)
        if cc.gpu.enabled and self.nvml is not None:
            self.collectors["gpu"] = GpuCollector(self.nvml)
        if cc.xid.enabled:
            self.collectors["xid"] = XidCollector(
                self.state,
                source=cc.xid.source,
                kmsg_path=cc.xid.kmsg_path,
                journalctl=cc.xid.journalctl,
                nvml=self.nvml if cc.xid.nvml_events else None,
                window_s=cfg.thresholds.xid_window_s,
                proc_root=paths.proc,
                max_lines_per_round=cc.xid.max_lines_per_round,
                clock=clock,
            )
        if cc.infiniband.enabled:
            self.collectors["infiniband"] = InfinibandCollector(paths.sys, cc.infiniband.ignore_ports)
        if cc.nfs.enabled and cc.nfs.mounts:
            self.collectors["nfs"] = NfsCollector(cc.nfs.mounts, cc.nfs.timeout_s, paths.proc)
        if cc.lustre.enabled:
            self.collectors["lustre"] = LustreCollector(lustre_client)
        if cc.lustre_server.enabled:
            ls = cc.lustre_server
            self.collectors["lustre_server"] = LustreServerCollector(
                ls.fsname, ls.sections, mount=ls.mount, timeout_s=ls.timeout_s, client_factory=lustre_server_client
            )
        if cc.jobs.enabled:
            self.collectors["jobs"] = JobsCollector(
                paths.proc, local_run_dir=cc.jobs.local_run_dir, containerd_state_dir=cc.jobs.containerd_state_dir,
                containerd_namespace=cc.jobs.containerd_namespace)
        self._lock = threading.Lock()
        self._latest: AgentSnapshot | None = None
        self._previous: Collection | None = None
        self._errors_total: dict[str, int] = {}
        self._last_success: dict[str, float] = {}
        self._last_logged: dict[str, tuple[Any, ...]] = {}
        self._save_error: str | None = None
        self.registry = make_registry(self.latest)
        self._rendered: tuple[Any, bytes] | None = None  # (cache key, exposition text)
        self.executor = ActionExecutor(
            cfg.actions, self.state, self.latest, proc_root=paths.proc, clock=clock, boot_id=self.boot_id
        )
        self.reporter: Reporter | None = None
        # the endpoint firewall (nft) is built in run(): constructing an Agent touches nothing
        self.firewall: Firewall | None = None
        self._orders: queue.Queue[Any] = queue.Queue()
        self.exporter_port: int | None = None
        self.ready = threading.Event()  # set once the first collection is served

    # -- collection -----------------------------------------------------------------------------

    def boot_id(self) -> str:
        try:
            return read_boot_id(self.cfg.paths.proc)
        except OSError:
            return ""

    def latest(self) -> AgentSnapshot | None:
        with self._lock:
            snap = self._latest
        if snap is not None and (self.reporter is not None or self.firewall is not None):
            snap = AgentSnapshot(
                snap.node,
                snap.version,
                snap.collection,
                snap.findings,
                snap.collector_errors_total,
                snap.collector_last_success_s,
                self.reporter.status() if self.reporter is not None else None,
                self.firewall.status() if self.firewall is not None else None,
            )
        return snap

    def render(self) -> bytes:
        """The exposition text of the latest snapshot, rendered once per collection (and per change
        of the reporter's status), however many scrapers ask."""
        snap = self.latest()
        if snap is None:
            return b""
        key = (snap.collection.time_s, snap.report, snap.firewall)
        with self._lock:
            cached = self._rendered
        if cached is not None and cached[0] == key:
            return cached[1]
        body = render_bytes(snap)
        with self._lock:
            self._rendered = (key, body)
        return body

    def collect_once(self) -> AgentSnapshot:
        now = self.clock()
        results: dict[str, CollectorResult] = {}
        for name in COLLECTOR_ORDER:
            c = self.collectors.get(name)
            if c is None:
                results[name] = CollectorResult(name, CollectorStatus.DISABLED, 0.0)
                continue
            r = run_collector(c)
            results[name] = r
            self._log_change(name, r)
            if r.status is CollectorStatus.FAILED:
                self._errors_total[name] = self._errors_total.get(name, 0) + 1
            elif r.status is CollectorStatus.OK:
                self._errors_total[name] = self._errors_total.get(name, 0) + len(r.errors)
                self._last_success[name] = now
        collection = Collection(now, results)
        findings = detect(collection, self._previous, self.cfg.thresholds, self.cfg.expected_gpu_count)
        if results["gpu"].status is CollectorStatus.OK:
            self._previous = collection  # rates need two good GPU readings
        snap = AgentSnapshot(
            self.node, __version__, collection, tuple(findings), dict(self._errors_total), dict(self._last_success)
        )
        with self._lock:
            self._latest = snap
        try:
            self.state.save()
            self._save_error = None
        except OSError as e:
            if str(e) != self._save_error:  # once per distinct problem, not every round
                self._save_error = str(e)
                log.error(
                    "cannot save state to %s: %s; kernel lines may be counted again after a restart",
                    self.state.path,
                    e,
                )
        if self.cfg.exporter.textfile_path:
            try:
                write_textfile(self.cfg.exporter.textfile_path, self.render())
            except OSError as e:
                log.error("cannot write %s: %s", self.cfg.exporter.textfile_path, e)
        return snap

    def _log_change(self, name: str, r: CollectorResult) -> None:
        """Log a collector's trouble when it starts or changes, not every round (a CPU node without
        NVML would otherwise log the same failure every interval_s)."""
        key = (r.status, r.errors, r.skip_reason)
        if self._last_logged.get(name) == key:
            return
        before = self._last_logged.get(name)
        self._last_logged[name] = key
        if r.status is CollectorStatus.FAILED:
            log.warning("collector %s failed: %s", name, "; ".join(r.errors))
        elif r.status is CollectorStatus.SKIPPED:
            log.info("collector %s skipped: %s", name, r.skip_reason)
        elif r.errors:
            log.warning("collector %s skipped malformed input: %s", name, "; ".join(r.errors[:5]))
        elif before is not None:
            log.info("collector %s is OK again", name)

    def close(self) -> None:
        for c in self.collectors.values():
            try:
                c.close()
            except Exception as e:  # noqa: BLE001 - shutting down; say it and go on
                log.debug("closing %s: %s", getattr(c, "name", c), e)

    # -- the long-running service -----------------------------------------------------------------

    def submit_orders(self, orders: list[Any]) -> None:
        for o in orders:
            self._orders.put(o)

    def _executor_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                order = self._orders.get(timeout=0.5)
            except queue.Empty:
                continue
            self.executor.execute(order)
            if self.reporter is not None:
                self.reporter.wake.set()  # tell the API the result now, not at the next interval

    def _check_firewall(self) -> None:
        """A table flushed or deleted by hand opens the guarded ports: put it back every interval."""
        if self.firewall is None:
            return
        try:
            self.firewall.check()
        except Exception:  # the loop must go on measuring whatever nft does
            log.exception("checking the endpoint firewall failed")

    def run(self, stop: threading.Event) -> None:
        self.executor.resolve_reboots()
        if self.cfg.firewall.enabled:
            self.firewall = Firewall(self.cfg.firewall, self.cfg.state_dir, clock=self.clock)
            self.firewall.restore()  # closes the guarded ports after a reboot, before the first report
        if self.cfg.report.enabled:
            token = read_node_token(self.cfg.report)
            self.reporter = Reporter(
                self.cfg.report,
                self.node,
                token,
                self.latest,
                self.executor,
                submit_orders=self.submit_orders,
                on_firewall=self.firewall.update if self.firewall is not None else None,
                boot_id=self.boot_id(),
                clock=self.clock,
                fake=bool(getattr(self.nvml_lib, "is_fake", False)),
            )
        self.collect_once()  # the first scrape must see data, and READY means "measuring"
        threads: list[threading.Thread] = []
        if self.cfg.exporter.enabled:
            server = serve_metrics(self.cfg.exporter.listen_address, self.cfg.exporter.port, self.render)
            self.exporter_port = server.server_port
            log.info("exporter listening on %s:%d", self.cfg.exporter.listen_address, server.server_port)
        else:
            server = None
        if self.reporter is not None:
            threads.append(threading.Thread(target=self.reporter.run, args=(stop,), name="reporter", daemon=True))
            threads.append(threading.Thread(target=self._executor_loop, args=(stop,), name="executor", daemon=True))
        for t in threads:
            t.start()
        sd_notify("READY=1")
        self.ready.set()
        try:
            while not stop.wait(self.cfg.interval_s):
                self.collect_once()
                self._check_firewall()
                sd_notify("WATCHDOG=1")
        finally:
            sd_notify("STOPPING=1")
            if self.reporter is not None:
                self.reporter.wake.set()
            if server is not None:
                server.shutdown()
            for t in threads:
                t.join(timeout=5)
            self.close()


def sd_notify(message: str) -> bool:
    """The sd_notify(3) protocol without libsystemd: one datagram to $NOTIFY_SOCKET."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    if path.startswith("@"):
        path = "\0" + path[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(path)
            s.sendall(message.encode())
        return True
    except OSError as e:
        log.debug("sd_notify(%s): %s", message, e)
        return False
