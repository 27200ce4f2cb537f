"""The accounting manager: books GPU time into the usage rollup and purges old utilisation history.

Each run books every attempt not fully booked yet up to now (services/accounting.py ``book``: one
transaction per batch of attempts, the rollup increments and the attempts' marks together), then
deletes utilisation minutes older than ``utilisation_retention_days``. Running it twice, or after a
crash, books nothing twice.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

from sqlalchemy.orm import Session

from dlts.models import utcnow
from dlts.services import accounting

log = logging.getLogger(__name__)


class AccountingManager:
    def __init__(self, session_factory: Callable[[], Session], retention_days: int, *,
                 batch: int = accounting.DEFAULT_BATCH, clock: Callable[[], dt.datetime] = utcnow):
        self.session_factory = session_factory
        self.retention_days = retention_days
        self.batch = batch
        self.clock = clock

    def run_once(self) -> accounting.BookResult:
        now = self.clock()
        with self.session_factory() as session:
            result = accounting.book(session, now, batch=self.batch)
            purged = accounting.purge_utilisation(session, now, self.retention_days)
        if result.attempts or purged or result.conflicts:
            log.info("accounting: booked %d attempts (%d closed, %.1f GPU-h), purged %d utilisation points, %d conflicts",
                     result.attempts, result.closed, result.gpu_ms / 3_600_000, purged, result.conflicts)
        return result
