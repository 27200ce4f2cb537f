"""Functions the scanner's worker processes call before listing a directory (``scan_root(before_dir=...)``):
a module of its own so that a worker imports only this. Each acts on directories with a given name."""

from __future__ import annotations

import os
import time


def hang_in_hang(path: str) -> None:
    """A directory named ``hang`` does not answer (a stat on a dead NFS server)."""
    if os.path.basename(path) == "hang":
        time.sleep(60)


def refuse_closed(path: str) -> None:
    """A directory named ``closed`` cannot be read."""
    if os.path.basename(path) == "closed":
        raise PermissionError(13, "Permission denied")


def log_worker(path: str) -> None:
    """Records which worker process listed each directory, in the folder $DLTS_TEST_WALK_LOG."""
    with open(os.path.join(os.environ["DLTS_TEST_WALK_LOG"], str(os.getpid())), "a") as log:
        log.write(path + "\n")


def slow(path: str) -> None:
    """Every directory takes 0.1 s to answer (a slow mount)."""
    time.sleep(0.1)


def log_worker_slowly(path: str) -> None:
    """log_worker, each directory taking 0.02 s: the walk outlasts the scanning process's first look
    at its idle workers even on a loaded machine."""
    log_worker(path)
    time.sleep(0.02)


def log_worker_very_slowly(path: str) -> None:
    """log_worker, each directory taking 0.2 s."""
    log_worker(path)
    time.sleep(0.2)
