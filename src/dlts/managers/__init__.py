"""Periodic work of the ``dlts managers`` process, declared in one table with stable ids.

``dlts managers`` runs every entry under APScheduler (one instance at a time per entry, missed runs
coalesced); the demo runs the job manager tick in a thread of its own instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from apscheduler.schedulers.blocking import BlockingScheduler

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Periodic:
    id: str
    interval_s: float
    run: Callable[[], object]


def run_forever(entries: list[Periodic], metrics: Callable[[], object] | None = None) -> None:
    """Run every entry until SIGINT/SIGTERM. ``metrics`` starts the process's /metrics server
    (it returns the server, which is shut down on the way out)."""
    server = metrics() if metrics is not None else None
    scheduler = BlockingScheduler(timezone="UTC")
    for entry in entries:
        scheduler.add_job(_guarded(entry), "interval", seconds=entry.interval_s, id=entry.id,
                          max_instances=1, coalesce=True, misfire_grace_time=None)
    log.info("managers running: %s", ", ".join(e.id for e in entries))
    try:
        scheduler.start()
    except (KeyboardInterrupt, SystemExit):
        scheduler.shutdown(wait=True)
    finally:
        if server is not None:
            server.shutdown()  # type: ignore[attr-defined]
            server.server_close()  # type: ignore[attr-defined]


def _guarded(entry: Periodic) -> Callable[[], None]:
    def run() -> None:
        try:
            entry.run()
        except Exception:  # one failing pass must not stop the process; the next run retries
            log.exception("manager %s failed", entry.id)

    return run
