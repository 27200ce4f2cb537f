"""The collector protocol and the runner that times it and contains its failures."""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from dlts_agent.model import CollectorResult, CollectorStatus

log = logging.getLogger(__name__)


class Skip(Exception):
    """The collector does not apply on this node (e.g. dlts_lustre not installed)."""


class Collector(Protocol):
    name: str

    def collect(self) -> tuple[Any, list[str]]:
        """Return (sample, errors about malformed items). Raise when nothing can be trusted."""

    def close(self) -> None: ...


def run_collector(collector: Collector) -> CollectorResult:
    """Run and time one collector. Logging is the caller's: it knows what changed since last round."""
    start = time.perf_counter()
    try:
        sample, errors = collector.collect()
    except Skip as e:
        return CollectorResult(collector.name, CollectorStatus.SKIPPED, time.perf_counter() - start, skip_reason=str(e))
    except Exception as e:  # noqa: BLE001 - one failing collector must never fail the agent
        log.debug("collector %s failed: %s: %s", collector.name, type(e).__name__, e)
        return CollectorResult(
            collector.name, CollectorStatus.FAILED, time.perf_counter() - start, errors=(f"{type(e).__name__}: {e}",)
        )
    return CollectorResult(
        collector.name, CollectorStatus.OK, time.perf_counter() - start, sample=sample, errors=tuple(errors)
    )
