"""What ``dlts managers`` (and the demo) serve on ``/metrics``: the process's instruments
(``dlts.metrics``) plus the collectors that read the database at scrape time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dlts.metrics import ClusterMetrics, Include


def managers_registry(session_factory: Callable[[], Any]) -> Any:
    """What ``dlts managers`` (and the demo) serve: this process's instruments plus the collectors
    that read the database (cluster state, the repair loop)."""
    from prometheus_client import REGISTRY, CollectorRegistry

    from dlts.managers.repair_metrics import RepairMetrics

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Include(REGISTRY))
    registry.register(ClusterMetrics(session_factory))
    registry.register(RepairMetrics(session_factory))
    return registry
