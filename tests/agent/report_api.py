"""A small real HTTP server that plays the control plane's report endpoint in these tests only.

It implements the contract of docs/agent.md: ``POST /api/v1/nodes/{name}/report`` with a bearer
node token (401 without one, 403 for a wrong token or another node's token), stores each report,
records order results idempotently by order id, and answers with the orders that have no result
yet. The real endpoint lives in src/dlts; tests/api/test_node_report.py drives it with the agent's
Reporter end to end.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_PATH = re.compile(r"^/api/v1/nodes/([A-Za-z0-9._-]+)/report$")


class ReportAPI:
    def __init__(self, tokens: dict[str, str]) -> None:
        self.tokens = tokens
        self.reports: list[dict[str, Any]] = []
        self.orders: dict[str, list[dict[str, Any]]] = {}
        self.results: dict[str, dict[str, Any]] = {}
        self.status_override: int | None = None
        self.delay_s = 0.0
        self.requests = 0
        self.lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status: int, code: str, message: str) -> None:
                self._send(status, {"error": {"code": code, "message": message, "details": {}}})

            def do_GET(self) -> None:
                self._error(405, "method_not_allowed", "POST a report")

            def do_POST(self) -> None:
                with api.lock:
                    api.requests += 1
                if api.delay_s:
                    time.sleep(api.delay_s)
                m = _PATH.match(self.path)
                if not m:
                    return self._error(404, "not_found", "no such endpoint")
                node = m.group(1)
                auth = self.headers.get("Authorization", "")
                if not auth.startswith("Bearer "):
                    return self._error(401, "unauthenticated", "send Authorization: Bearer <node token>")
                if api.tokens.get(node) != auth[len("Bearer ") :]:
                    return self._error(403, "forbidden", f"this token may not report for node {node}")
                if api.status_override:
                    return self._error(api.status_override, "unavailable", "database unreachable")
                length = int(self.headers.get("Content-Length", "0"))
                try:
                    body = json.loads(self.rfile.read(length))
                except ValueError:
                    return self._error(400, "invalid_json", "body is not JSON")
                if body.get("node") != node or body.get("schema_version") != 1:
                    return self._error(400, "invalid_report", "node or schema_version mismatch")
                with api.lock:
                    api.reports.append(body)
                    for r in body.get("order_results", []):
                        api.results.setdefault(r["id"], r)  # idempotent: the first delivery wins
                    pending = [o for o in api.orders.get(node, []) if o["id"] not in api.results]
                self._send(200, {"orders": pending})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ReportAPI:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def order(self, node: str, **order: Any) -> None:
        with self.lock:
            self.orders.setdefault(node, []).append(order)
