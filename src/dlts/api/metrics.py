"""``GET /metrics``: the API's Prometheus metrics, to the scrapers the configuration names.

Who may scrape: a client whose address is in ``metrics_allow_cidrs`` (default loopback only: nginx
on the same host, which has its own allowlist of monitoring hosts), or one that sends
``Authorization: Bearer <token>`` with the token in ``metrics_token_file``. Anyone else gets 403.
What it shows is aggregate: counts and latencies per URL rule, status and SQL statement kind; no
user, job or token.
"""

from __future__ import annotations

import hmac
import ipaddress
import os

from flask import Blueprint, Flask, Response, current_app, request

from dlts.api.errors import envelope
from dlts.config import ConfigError

bp = Blueprint("metrics", __name__)


def init_app(app: Flask) -> None:
    from prometheus_client import REGISTRY, CollectorRegistry

    settings = app.extensions["dlts_settings"]
    token = ""
    if settings.metrics_token_file is not None:
        try:
            token = settings.metrics_token_file.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"metrics_token_file: cannot read {settings.metrics_token_file}: {exc.strerror}") from None
        if not token:
            raise ConfigError(f"metrics_token_file: {settings.metrics_token_file} is empty; put the scrape token in it")
    app.extensions["dlts_metrics_token"] = token
    app.extensions["dlts_metrics_networks"] = tuple(ipaddress.ip_network(c) for c in settings.metrics_allow_cidrs)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = REGISTRY
    # the demo replaces it with one that also reads the database (dlts.managers.metrics.managers_registry)
    app.extensions.setdefault("dlts_metrics_registry", registry)
    app.register_blueprint(bp)


def _allowed() -> bool:
    token = current_app.extensions["dlts_metrics_token"]
    sent = request.headers.get("Authorization", "")
    if token and sent.startswith("Bearer ") and hmac.compare_digest(sent[7:].strip().encode(), token.encode()):
        return True
    try:
        address = ipaddress.ip_address((request.remote_addr or "").split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in current_app.extensions["dlts_metrics_networks"])


@bp.get("/metrics")
def metrics():
    if not _allowed():
        return envelope(403, "forbidden", "/metrics is served only to the addresses in metrics_allow_cidrs and to "
                        "scrapers that send the token of metrics_token_file as a Bearer token.")
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return Response(generate_latest(current_app.extensions["dlts_metrics_registry"]), mimetype=CONTENT_TYPE_LATEST)
