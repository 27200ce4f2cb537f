"""gunicorn settings for the API (``gunicorn --config python:dlts.gunicorn_conf``): with
``PROMETHEUS_MULTIPROC_DIR`` set (the systemd unit sets it to an emptied runtime directory), a
worker that exits has its live gauges dropped from /metrics (prometheus_client's multiprocess mode)."""

from __future__ import annotations

import os


def child_exit(_server, worker) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
