"""The forecast manager: a start time for every waiting job, refreshed every ``forecast.interval_s``.

Each run reads the snapshot the job manager's pass reads (``load_snapshot``), the run times of the
waiting and running jobs' owners' last ``forecast.history_runs`` finished jobs, runs
``scheduler.forecast`` (the scheduler's own passes, forward in time) and stores each queued job's
forecast start in ``jobs.forecast_start`` (NULL where the forecast does not reach it). The
scheduler never reads that column: a forecast holds nothing, unlike a backfill reservation
(``jobs.estimated_start``). The API shows the reservation where there is one, else the forecast
(``estimated_start`` with ``estimated_start_source``); docs/scheduling.md "Forecast start".

The forecast itself (many scheduling passes: 20 s at 20,000 waiting jobs) runs in a child process
of its own, started once and kept: in a thread of the managers process it would hold the GIL and
make the job manager's passes twice as slow while it runs (measured: docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from sqlalchemy.orm import Session

from dlts import metrics
from dlts.config import Settings
from dlts.jobmanager.snapshot import from_epoch, load_snapshot
from dlts.repositories import jobs as job_repo
from dlts.scheduler import profile_named
from dlts.scheduler.forecast import Forecast, UserRuntimes, forecast
from dlts.scheduler.model import Snapshot
from dlts.scheduler.reservations import INF
from dlts.services.transaction import step

log = logging.getLogger(__name__)
WRITE_BATCH = 1000  # forecast rows written per transaction


@dataclass(frozen=True)
class ForecastRun:
    waiting: int
    forecast: int  # waiting jobs given a start
    changed: int  # rows written
    passes: int
    horizon: float  # epoch seconds the forecast reached (inf: every job it could reach)
    seconds: float


class ForecastManager:
    def __init__(self, session_factory: Callable[[], Session], settings: Settings,
                 clock: Callable[[], float] = time.time) -> None:
        self.session_factory = session_factory
        self.settings = settings
        self.clock = clock
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _child(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                # spawn: the managers process has threads (a fork could copy a held lock)
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_quiet_child)
            return self._pool

    def close(self) -> None:
        """Stop the child process (a later run starts a new one)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def run_once(self) -> ForecastRun:
        t0 = time.perf_counter()
        cfg = self.settings.forecast
        with self.session_factory() as session:
            with step(session):  # read: one consistent view
                snapshot = load_snapshot(session, self.settings)
                users = sorted({j.user for j in snapshot.jobs})
                history = job_repo.recent_run_times(session, users, cfg.history_runs)
            now = self.clock()
            runtimes = None  # history_runs 0: limits only
            if cfg.history_runs > 0:
                runtimes = UserRuntimes(cfg.history_runs)
                for user, runs in history.items():
                    for seconds in runs:
                        runtimes.add(user, seconds)
            try:
                got = self._child().submit(forecast_in_child, snapshot, now, self.settings.scheduler_profile,
                                           runtimes, cfg.max_passes, cfg.precision).result()
            except BrokenProcessPool:
                self.close()  # the child died (killed, out of memory): the next run starts another
                raise
            waiting = {j.id for j in snapshot.jobs if not j.running}
            with step(session):
                stored = job_repo.stored_forecasts(session)
            # rows in id order (as the job manager's pass writes them), a step per batch, so the two
            # never hold many of the same rows' locks for long
            changes = []
            for job_id in sorted(waiting & stored.keys()):
                new = from_epoch(got.starts[job_id]) if job_id in got.starts else None
                if not job_repo.same_second(stored[job_id], new):
                    changes.append((job_id, new))
            for k in range(0, len(changes), WRITE_BATCH):
                with step(session):
                    job_repo.set_forecasts(session, changes[k:k + WRITE_BATCH])
            changed = len(changes)
        run = ForecastRun(len(waiting), len(got.starts), changed, got.passes, got.horizon, time.perf_counter() - t0)
        metrics.FORECAST_JOBS.labels("forecast").set(run.forecast)
        metrics.FORECAST_JOBS.labels("unknown").set(run.waiting - run.forecast)
        metrics.FORECAST_PASSES.set(run.passes)
        if run.waiting:
            log.info("forecast: %d of %d waiting jobs given a start in %d passes (%.2f s)%s, %d rows changed",
                     run.forecast, run.waiting, run.passes, run.seconds,
                     "" if run.horizon == INF else f"; the rest start after {from_epoch(run.horizon):%Y-%m-%d %H:%M} UTC",
                     run.changed)
        return run


def forecast_in_child(snapshot: Snapshot, now: float, profile: str, runtimes: UserRuntimes | None, max_passes: int,
                      precision: float) -> Forecast:
    """``scheduler.forecast``, run in the manager's child process (arguments and result pickled)."""
    return forecast(snapshot, now, profile_named(profile), runtime=runtimes, max_passes=max_passes, precision=precision)


def _quiet_child() -> None:
    # Ctrl-C in a terminal reaches the whole process group: the parent stops the child, which must
    # not print a KeyboardInterrupt traceback of its own
    signal.signal(signal.SIGINT, signal.SIG_IGN)
