"""``dlts managers --config PATH`` as a chaos story runs it: the real CLI, with one fault at the
launch seam when ``DLTS_CHAOS_KILL_IN_LAUNCH`` is above 0: at each unit start the process SIGKILLs
itself, with that chance (seeded by ``DLTS_CHAOS_SEED``), after the unit's ``mkdir`` and before its
init (so before any pid record: a half-made unit), or with half that chance just after the init
started (the job runs, the job manager recorded nothing of it). ``DLTS_CHAOS_KILL_FIRST_LAUNCH=1``:
it dies at its first unit start, between the mkdir and the pid record, for sure.

``managers_child.py --zygote``: imports DLTS once, then forks one such managers process per line
read from stdin (a JSON object: config, log, env) and prints its pid. Thirty kill -9s need thirty
fresh processes; on a busy 2-core machine an interpreter start with DLTS's imports takes seconds,
a fork milliseconds. The zygote reaps its children.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys


def install_faults(chance: float, seed: int, first: bool) -> None:
    from dlts.backends.local import LocalBackend

    rng = random.Random(seed)
    start = LocalBackend._start

    def faulty_start(self, unit, *args, **kwargs):
        if first or rng.random() < chance:
            print(f"chaos: SIGKILL between mkdir and the pid record of {unit}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        start(self, unit, *args, **kwargs)
        if rng.random() < chance / 2:
            print(f"chaos: SIGKILL just after starting the init of {unit}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    LocalBackend._start = faulty_start


def run(config: str) -> None:
    import logging

    from dlts.cli import main

    chance = float(os.environ.get("DLTS_CHAOS_KILL_IN_LAUNCH") or 0)
    first = os.environ.get("DLTS_CHAOS_KILL_FIRST_LAUNCH") == "1"
    if chance > 0 or first:
        install_faults(chance, int(os.environ.get("DLTS_CHAOS_SEED") or 0), first)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)  # a line per pass: the lease's lines matter here
    main(["--config", config, "managers"], prog_name="dlts")


def zygote() -> None:
    import dlts.backends.local
    import dlts.cli
    import dlts.jobmanager
    import dlts.managers.janitor
    import dlts.managers.lease
    import dlts.managers.notify
    import dlts.managers.repair  # noqa: F401
    from dlts.app import create_app  # noqa: F401

    def reap(_sig, _frame) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    signal.signal(signal.SIGCHLD, reap)
    print("ready", flush=True)
    for line in sys.stdin:
        order = json.loads(line)
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.environ.update(order["env"])
            fd = os.open(order["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            try:
                run(order["config"])
            finally:
                os._exit(0)
        print(pid, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--zygote":
        zygote()
    else:
        run(sys.argv[1])
