"""Heartbeat + findings to the control plane, and the only way repair orders reach the agent.

``POST {api_url}/api/v1/nodes/{node}/report`` with ``Authorization: Bearer <node token>``; the wire
format is the contract in docs/agent.md. The reporter runs in its own thread and always sends the
*latest* snapshot (never a backlog). When the API is down it retries with capped exponential
backoff and jitter; the exporter is never touched by any of this. Results of executed orders ride
along until a 2xx response proves the API stored them. The response's ``firewall`` (the endpoint
allowlist) goes to ``on_firewall`` (firewall.Firewall.update) after every successful report.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlts_agent.actions import ActionExecutor
from dlts_agent.config import ReportConfig
from dlts_agent.metrics import metrics_summary
from dlts_agent.model import AgentSnapshot, OrderResult, ReportStatus

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
MAX_ORDERS_PER_RESPONSE = 20
# the response carries the cluster's whole endpoint allowlist: room for ~400k (source, port) pairs
MAX_RESPONSE_BYTES = 16 * 1024 * 1024


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def build_payload(snap: AgentSnapshot, results: list[OrderResult], heartbeat_s: float, boot_id: str,
                  fake: bool = False) -> dict[str, Any]:
    c = snap.collection
    extra = {"fake": True} if fake else {}  # read from a fake NVML: the API acts on it only in the demo
    return extra | {
        "schema_version": SCHEMA_VERSION,
        "node": snap.node,
        "agent_version": snap.version,
        "heartbeat_at": iso(heartbeat_s),
        "collected_at": iso(c.time_s),
        "boot_id": boot_id,
        "collectors": {
            name: {"status": r.status.value, "errors": list(r.errors[:10])} for name, r in sorted(c.results.items())
        },
        "findings": [f.to_json() for f in snap.findings],
        "metrics": metrics_summary(snap),
        "order_results": [
            {**r.to_json(), "started_at": iso(r.started_at), "finished_at": iso(r.finished_at)} for r in results
        ],
    }


class ReportError(Exception):
    pass


@dataclass
class _Status:
    last_success_s: float | None = None
    last_attempt_s: float | None = None
    consecutive_failures: int = 0
    failures_total: int = 0
    last_error: str | None = None


class Reporter:
    def __init__(
        self,
        cfg: ReportConfig,
        node: str,
        token: str,
        snapshot: Callable[[], AgentSnapshot | None],
        executor: ActionExecutor | None,
        *,
        submit_orders: Callable[[list[Any]], None] | None = None,
        on_firewall: Callable[[Any], object] | None = None,
        boot_id: str = "",
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        fake: bool = False,
    ) -> None:
        self.fake = fake
        self.cfg = cfg
        self.url = f"{cfg.api_url.rstrip('/')}/api/v1/nodes/{urllib.parse.quote(node, safe='')}/report"
        self._token = token
        self.snapshot = snapshot
        self.executor = executor
        self.submit_orders = submit_orders
        self.on_firewall = on_firewall
        self.boot_id = boot_id
        self.clock = clock
        self.rng = rng or random.Random()
        self.wake = threading.Event()  # set to report early (e.g. an order finished)
        self._status = _Status()
        self._lock = threading.Lock()
        self._ssl = ssl.create_default_context(cafile=cfg.ca_file or None) if cfg.api_url.startswith("https") else None

    def status(self) -> ReportStatus:
        with self._lock:
            s = self._status
            return ReportStatus(
                s.last_success_s,
                s.last_attempt_s,
                s.consecutive_failures,
                s.failures_total,
                s.last_error,
                self.executor.executed_total if self.executor else 0,
            )

    def backoff_s(self, failures: int) -> float:
        """Capped exponential backoff with jitter in [d/2, d] so a cluster of agents spreads out."""
        d = min(self.cfg.backoff_max_s, self.cfg.backoff_initial_s * (2 ** max(0, failures - 1)))
        return self.rng.uniform(d / 2, d)

    def report_once(self) -> list[Any]:
        """One POST of the latest state. Returns the orders; raises ReportError on any failure."""
        snap = self.snapshot()
        if snap is None:
            raise ReportError("nothing collected yet")
        results = self.executor.unreported() if self.executor else []
        now = self.clock()
        with self._lock:
            self._status.last_attempt_s = now
        body = json.dumps(build_payload(snap, results, now, self.boot_id, self.fake)).encode()
        req = urllib.request.Request(
            self.url,
            data=body,
            method="POST",
            headers={
                "Authorization": f"Bearer {self._token}",
                "Content-Type": "application/json",
                "Accept": "application/json",
                "User-Agent": f"dlts-agent/{snap.version}",
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=self.cfg.timeout_s, context=self._ssl) as resp:
                raw = resp.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as e:
            detail = _error_message(e)
            if e.code in (401, 403):
                raise ReportError(
                    f"the API refused the node token (HTTP {e.code}: {detail}); check "
                    f"report.node_token_file or DLTS_AGENT_NODE_TOKEN for node {snap.node}"
                ) from None
            raise ReportError(f"HTTP {e.code} from {self.url}: {detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise ReportError(f"cannot reach {self.url}: {reason}") from None
        if self.executor and results:
            self.executor.mark_reported([r.id for r in results])
        with self._lock:
            self._status.last_success_s = self.clock()
            self._status.consecutive_failures = 0
            self._status.last_error = None
        if len(raw) > MAX_RESPONSE_BYTES:
            log.warning("report response is larger than %d bytes; ignoring it (no orders, firewall unchanged)",
                        MAX_RESPONSE_BYTES)
            return []
        data = _parse_response(raw)
        if self.on_firewall is not None and data is not None:
            try:
                self.on_firewall(data.get("firewall"))
            except Exception:  # the firewall must never stop reports or orders
                log.exception("applying the endpoint firewall failed; the previous rules stay")
        return _orders(data)

    def run(self, stop: threading.Event) -> None:
        next_due = 0.0
        while not stop.is_set():
            delay = max(0.0, next_due - time.monotonic())
            if delay:
                self.wake.wait(delay)
                if stop.is_set():
                    break
            self.wake.clear()
            try:
                orders = self.report_once()
            except ReportError as e:
                with self._lock:
                    self._status.consecutive_failures += 1
                    self._status.failures_total += 1
                    self._status.last_error = str(e)
                    failures = self._status.consecutive_failures
                wait = self.backoff_s(failures)
                log.warning("report failed (%d in a row): %s; retrying in %.1f s", failures, e, wait)
                next_due = time.monotonic() + wait
                continue
            if orders and self.submit_orders is not None:
                self.submit_orders(orders)
            next_due = time.monotonic() + self.cfg.interval_s


def _parse_response(raw: bytes) -> dict[str, Any] | None:
    """The response object; None when there is none (empty) or it is not a JSON object."""
    if not raw.strip():
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        log.warning("report response is not JSON; ignoring it (no orders taken, firewall unchanged)")
        return None
    if not isinstance(data, dict):
        log.warning("report response is not a JSON object; ignoring it")
        return None
    return data


def _orders(data: dict[str, Any] | None) -> list[Any]:
    if data is None:
        return []
    orders = data.get("orders", [])
    if not isinstance(orders, list):
        log.warning("report response has no orders list; ignoring it")
        return []
    if len(orders) > MAX_ORDERS_PER_RESPONSE:
        log.warning("report response carries %d orders; taking the first %d", len(orders), MAX_ORDERS_PER_RESPONSE)
    return orders[:MAX_ORDERS_PER_RESPONSE]


def _error_message(e: urllib.error.HTTPError) -> str:
    try:
        data = json.loads(e.read(65536) or b"{}")
        return str(data.get("error", {}).get("message") or e.reason)
    except (ValueError, AttributeError, OSError):
        return str(e.reason)
