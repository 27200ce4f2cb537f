"""The DB janitor: deletes jobs that ended more than ``retention_days`` ago, with their attempts,
events, endpoints and log files, in small batches so that foreground queries are never blocked for long.

Each batch is one short transaction: pick up to ``batch_rows`` ended jobs by ``finished_at`` (an
indexed range scan), delete their events, attempts, endpoints and the jobs by primary key, commit, then sleep
as long as the batch took, and at least ``pause_s``: the purge holds the database at most half of
the time, and backs off by itself when the database is busy (batches take longer, so do the pauses;
pt-archiver's --sleep-coef 1). Readers and writers get the CPU, locks and I/O in between. Log directories are
removed after the commit (a crash in between leaves a directory the next pass no longer knows
about, never a row without its log). A pass stops after ``max_batches`` so one run cannot hold the
managers process forever; the next run continues.

After the jobs, the same batches and pauses purge short-lived rows: portal sessions that have
expired (``portal_sessions.expires_at``), rate counters whose window ended long ago (older than
``counter_window_s``, the longest window any counter uses), and idempotency keys older than
``idempotency_key_ttl_h``. Each is read by an indexed range (``portal_sessions.expires_at``,
``rate_counters.window_start``, ``idempotency_keys.created_at``) and deleted by its key.

Last, orphaned logs (``services.log_orphans``: files in the log store that no attempt row names,
left by a database restored from a backup, or by a crash between a batch's commit and the removal
of its log directories) go once they were last written before the same cutoff as the jobs.
"""

from __future__ import annotations

import datetime as dt
import logging
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.models import TERMINAL, IdempotencyKey, Job, PortalSession, RateCounter, utcnow
from dlts.services import log_orphans, transaction
from dlts.services.job_keeping import delete_jobs

log = logging.getLogger(__name__)

DEFAULT_BATCH_ROWS = 500
DEFAULT_PAUSE_S = 0.01


@dataclass(frozen=True)
class PurgeResult:
    jobs: int
    attempts: int
    events: int
    batches: int
    elapsed_s: float
    longest_batch_s: float  # the longest transaction, from the first DELETE to COMMIT
    median_batch_s: float = 0.0
    endpoints: int = 0
    sessions: int = 0  # expired portal sessions
    rate_counters: int = 0  # counters whose window ended
    idempotency_keys: int = 0  # keys older than idempotency_key_ttl_h
    orphan_logs: int = 0  # attempts' logs no row names, last written before the cutoff

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.elapsed_s if self.elapsed_s > 0 else 0.0


class Janitor:
    def __init__(self, session_factory: Callable[[], Session], retention_days: int, *,
                 batch_rows: int = DEFAULT_BATCH_ROWS, pause_s: float = DEFAULT_PAUSE_S,
                 log_dir: Path | None = None, max_batches: int = 10_000,
                 idempotency_key_ttl_h: float = 24.0, counter_window_s: float = 300.0,
                 clock: Callable[[], dt.datetime] = utcnow, sleep: Callable[[float], None] = time.sleep,
                 timer: Callable[[], float] = time.monotonic):
        if retention_days < 1:
            raise ValueError("retention_days must be at least 1")
        if not 1 <= batch_rows <= 100_000:
            raise ValueError("batch_rows must be between 1 and 100000")
        if pause_s < 0:
            raise ValueError("pause_s must not be negative")
        if idempotency_key_ttl_h <= 0 or counter_window_s <= 0:
            raise ValueError("idempotency_key_ttl_h and counter_window_s must be positive")
        self.session_factory = session_factory
        self.retention_days = retention_days
        self.batch_rows = batch_rows
        self.pause_s = pause_s
        self.log_dir = log_dir
        self.max_batches = max_batches
        self.idempotency_key_ttl_h = idempotency_key_ttl_h
        self.counter_window_s = counter_window_s
        self.clock = clock
        self.sleep = sleep
        self.timer = timer

    def cutoff(self) -> dt.datetime:
        return self.clock() - dt.timedelta(days=self.retention_days)

    def run(self) -> PurgeResult:
        """One pass: batches until nothing older than the cutoff is left (or ``max_batches``)."""
        cutoff = self.cutoff()
        started = time.monotonic()
        jobs = attempts = events = endpoints = batches = 0
        durations: list[float] = []
        terminal = [s.value for s in TERMINAL]
        while batches < self.max_batches:
            with self.session_factory() as session:
                ids = list(session.scalars(
                    sa.select(Job.id).where(Job.finished_at < cutoff, Job.status.in_(terminal))
                    .order_by(Job.finished_at).limit(self.batch_rows)))
                if not ids:
                    break
                t0 = self.timer()
                with transaction.step(session):
                    # children first, explicitly: each count is known, and no cascade runs inside the jobs DELETE
                    counts = delete_jobs(session, ids)
                events += counts["events"]
                attempts += counts["attempts"]
                endpoints += counts["endpoints"]
                jobs += counts["jobs"]
                durations.append(self.timer() - t0)
            batches += 1
            self._remove_logs(ids)
            if len(ids) < self.batch_rows:
                break
            pause = max(self.pause_s, durations[-1])
            if pause > 0:
                self.sleep(pause)
        now = self.clock()
        short_lived = [
            # (table, its key column, the condition of an expired row, the column read in order)
            ("sessions", PortalSession.id, PortalSession.expires_at <= now, PortalSession.expires_at),
            ("rate_counters", RateCounter.key,
             RateCounter.window_start < now - dt.timedelta(seconds=self.counter_window_s), RateCounter.window_start),
            ("idempotency_keys", IdempotencyKey.id,
             IdempotencyKey.created_at < now - dt.timedelta(hours=self.idempotency_key_ttl_h), IdempotencyKey.created_at),
        ]
        purged: dict[str, int] = {}
        for name, key, expired, order in short_lived:
            count, batches = self._purge_rows(key, expired, order, batches, durations)
            purged[name] = count
        orphans = self._purge_orphan_logs(cutoff)
        longest = max(durations, default=0.0)
        result = PurgeResult(jobs, attempts, events, batches, time.monotonic() - started, longest,
                             statistics.median(durations) if durations else 0.0, endpoints, **purged,
                             orphan_logs=orphans)
        if any(purged.values()):
            log.info("janitor: deleted %d expired portal sessions, %d rate counters, %d idempotency keys",
                     purged["sessions"], purged["rate_counters"], purged["idempotency_keys"])
        if jobs:
            log.info("janitor: deleted %d jobs (%d attempts, %d events, %d endpoints) older than %s in %d batches, %.1f s; "
                     "longest batch %.3f s", jobs, attempts, events, endpoints, cutoff.date(), batches, result.elapsed_s, longest)
        return result

    def _purge_rows(self, key, expired, order, batches: int, durations: list[float]) -> tuple[int, int]:
        """Delete the rows of ``key``'s table that match ``expired``, ``batch_rows`` per transaction, with
        the jobs' pauses between batches and within the same ``max_batches``: (rows deleted, batches)."""
        deleted = 0
        while batches < self.max_batches:
            with self.session_factory() as session:
                keys = list(session.scalars(sa.select(key).where(expired).order_by(order).limit(self.batch_rows)))
            if not keys:
                break
            if durations:  # between batches (of any table), as long as the last one took, at least pause_s
                pause = max(self.pause_s, durations[-1])
                if pause > 0:
                    self.sleep(pause)
            with self.session_factory() as session:
                t0 = self.timer()
                with transaction.step(session):
                    deleted += transaction.rowcount(session.execute(
                        sa.delete(key.class_).where(key.in_(keys), expired).execution_options(synchronize_session=False)))
                durations.append(self.timer() - t0)
            batches += 1
            if len(keys) < self.batch_rows:
                break
        return deleted, batches

    def _purge_orphan_logs(self, cutoff: dt.datetime) -> int:
        if self.log_dir is None:
            return 0
        removed = log_orphans.purge(self.session_factory, self.log_dir, cutoff)
        if removed:
            log.info("janitor: removed %d orphaned logs (%d bytes) last written before %s: %s", len(removed),
                     sum(o.stored.size_bytes for o in removed), cutoff.date(),
                     ", ".join(f"job {o.stored.job_id} attempt {o.stored.attempt}" for o in removed[:10])
                     + (", ..." if len(removed) > 10 else ""))
        return len(removed)

    def _remove_logs(self, ids: list[int]) -> None:
        if self.log_dir is None:
            return
        for job_id in ids:
            path = self.log_dir / str(job_id)
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
