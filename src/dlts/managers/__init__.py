"""Periodic work of the ``dlts managers`` process, declared in one table with stable ids.

``dlts managers`` runs every entry under APScheduler (one instance at a time per entry, missed runs
coalesced); the demo runs the job manager tick in a thread of its own instead. With a lease
(``dlts.managers.lease``) the entries run only while this process holds it: several processes may
run, exactly one acts.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from apscheduler.schedulers.blocking import BlockingScheduler

if TYPE_CHECKING:
    from dlts.managers.lease import Lease, Watch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Periodic:
    id: str
    interval_s: float
    run: Callable[[], object]
    # a pass of it running longer than lease_s means the process hangs: the lease is not renewed
    watched: bool = False


def run_forever(entries: list[Periodic], metrics: Callable[[], object] | None = None,
                lease: Lease | None = None) -> None:
    """Run every entry until SIGINT/SIGTERM. ``metrics`` starts the process's /metrics server
    (it returns the server, which is shut down on the way out). ``lease``: the entries run only
    while it is held; it is kept every ``lease.poll_s`` and released on the way out."""
    from dlts.managers.lease import Watch

    server = metrics() if metrics is not None else None
    scheduler = BlockingScheduler(timezone="UTC")
    watch = Watch()
    for entry in entries:
        scheduler.add_job(_guarded(entry, lease, watch), "interval", seconds=entry.interval_s, id=entry.id,
                          max_instances=1, coalesce=True, misfire_grace_time=None)
    if lease is not None:
        scheduler.add_job(_keeper(lease, watch), "interval", seconds=lease.poll_s, id="lease.keep", max_instances=1,
                          coalesce=True, misfire_grace_time=None, next_run_time=dt.datetime.now(dt.UTC))
    log.info("managers running: %s", ", ".join(e.id for e in entries))
    try:
        scheduler.start()
    except (KeyboardInterrupt, SystemExit):
        scheduler.shutdown(wait=True)
    finally:
        if lease is not None:
            lease.release()
        if server is not None:
            server.shutdown()  # type: ignore[attr-defined]
            server.server_close()  # type: ignore[attr-defined]


def _guarded(entry: Periodic, lease: Lease | None, watch: Watch) -> Callable[[], None]:
    from dlts import db_faults
    from dlts.managers.lease import LeaseLost

    faults = db_faults.FaultLog(f"manager {entry.id}", log)  # a database refusing writes: a line, not a traceback a pass

    def run() -> None:
        if lease is not None and not lease.held():
            return  # a standby: another process acts
        if entry.watched:
            watch.begin(entry.id)
        try:
            faults.run(step)  # one failing pass must not stop the process; the next run retries
        finally:
            watch.end(entry.id)

    def step() -> None:
        try:
            entry.run()
        except LeaseLost as exc:  # nothing of this pass was written after the loss
            log.warning("manager %s stopped: %s", entry.id, exc)

    return run


def _keeper(lease: Lease, watch: Watch) -> Callable[[], None]:
    def keep() -> None:
        try:
            lease.keep(stalled=watch.stalled(lease.lease_s))
        except Exception as exc:  # noqa: BLE001 - the database is away: the lease runs out locally, the next poll retries
            log.warning("lease %s: could not reach the database: %s", lease.name, exc)

    return keep
