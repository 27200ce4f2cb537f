"""Where attempt logs live: ``<log_dir>/<job id>/attempt-<n>.log`` (shared storage in production)."""

from __future__ import annotations

from pathlib import Path

from dlts.config import Settings


def attempt_log_path(settings: Settings, job_id: int, attempt: int) -> Path:
    return settings.effective_log_dir / str(job_id) / f"attempt-{attempt}.log"
