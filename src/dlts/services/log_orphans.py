"""Orphaned logs: files in the log store that no attempt row names.

Every attempt's log is named by its job id, its number and its log key (``dlts.logstore``). A
database restored from a backup brings back the attempts it had, with their keys; the jobs it
discarded (submitted, or run again, after the backup, or after the chosen point in time) leave logs
that no row names any more. Their ids are handed out again, to new jobs whose attempts have new
keys, so such a log is never shown; it is an *orphan*. So is the directory of a job whose rows the
janitor deleted but whose files it had not removed yet when it stopped.

``find`` lists them (``dlts db orphan-logs``); ``purge`` removes the ones last written before a
cutoff (the janitor's pass, ``retention_days`` after, as it removes ended jobs with their logs).
The store is read before the rows, batch by batch: an attempt's row is committed before its first
file is made, so a file found is never taken for an orphan because its row came after the read.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from dlts import logstore
from dlts.repositories import jobs as job_repo

log = logging.getLogger(__name__)

BATCH_JOBS = 500  # job directories read, and looked up in one query, at a time


@dataclass(frozen=True)
class OrphanLog:
    stored: logstore.StoredAttempt
    job_exists: bool  # a job of this id is in the database (an id given out again after a restore)

    @property
    def modified_at(self) -> dt.datetime:
        """When it was last written (UTC, as the database's times)."""
        return dt.datetime.fromtimestamp(self.stored.modified, dt.UTC).replace(tzinfo=None)

    @property
    def why(self) -> str:
        s = self.stored
        if not self.job_exists:
            return f"job {s.job_id} is not in the database"
        if s.key is None:
            return f"job {s.job_id} has no attempt {s.attempt} from before log keys"
        return f"job {s.job_id} has no attempt {s.attempt} with log key {s.key}"

    def as_json(self) -> dict[str, object]:
        s = self.stored
        return {"job_id": s.job_id, "attempt": s.attempt, "log_key": s.key, "files": list(s.names),
                "size_bytes": s.size_bytes, "modified_at": self.modified_at.isoformat() + "Z",
                "job_exists": self.job_exists, "why": self.why}


def find(sessions: Callable[[], Session], log_dir: Path, *, batch: int = BATCH_JOBS) -> Iterator[OrphanLog]:
    """Every orphaned log in the store, by job id and attempt."""
    ids = logstore.stored_job_ids(log_dir)
    for i in range(0, len(ids), batch):
        chunk = ids[i:i + batch]
        stored = {job_id: _stored(log_dir, job_id) for job_id in chunk}  # the files first, then the rows
        with sessions() as session:
            jobs, named = job_repo.log_names(session, chunk)
        for job_id in chunk:
            for attempt in stored[job_id]:
                if (job_id, attempt.attempt, attempt.key) not in named:
                    yield OrphanLog(attempt, job_id in jobs)


def purge(sessions: Callable[[], Session], log_dir: Path, before: dt.datetime) -> list[OrphanLog]:
    """Remove the orphaned logs last written before ``before``; return them. The directory of a
    job that is not in the database goes with its last log (when nothing else is left in it)."""
    removed = []
    for orphan in find(sessions, log_dir):
        if orphan.modified_at >= before:
            continue
        try:
            logstore.remove_attempt(log_dir, orphan.stored, remove_empty_dir=not orphan.job_exists)
        except OSError as exc:  # UnsafeLog too: a directory replaced by a link is not entered
            log.warning("orphaned log of job %s attempt %s not removed: %s",
                        orphan.stored.job_id, orphan.stored.attempt, exc)
            continue
        removed.append(orphan)
    return removed


def _stored(log_dir: Path, job_id: int) -> list[logstore.StoredAttempt]:
    try:
        return logstore.stored_attempts(log_dir, job_id)
    except logstore.UnsafeLog as exc:  # replaced by a link since it was listed: not read through it
        log.warning("log directory of job %s skipped: %s", job_id, exc)
        return []
