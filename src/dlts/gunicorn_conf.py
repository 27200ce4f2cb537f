"""gunicorn settings for the API (``gunicorn --config python:dlts.gunicorn_conf``; ``dlts api`` sets
the same hooks). Every module-level name that is a gunicorn setting is taken as one.

- ``child_exit``: with ``PROMETHEUS_MULTIPROC_DIR`` set (the systemd unit sets it to an emptied
  runtime directory), a worker that exits has its live gauges dropped from /metrics
  (prometheus_client's multiprocess mode).
- ``pre_request``/``post_request``: the request being served in this thread, so that
  ``dlts.unread_body`` can have gunicorn close a connection whose request body was left unread.
"""

from __future__ import annotations

import os

from dlts import unread_body


def child_exit(_server, worker) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)


def pre_request(worker, req) -> None:
    worker.log.debug("%s %s", req.method, req.path)  # gunicorn's default pre_request
    unread_body.serving(req)


def post_request(_worker, _req, _environ, _resp) -> None:
    unread_body.serving(None)
