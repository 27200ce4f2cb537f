"""``dlts managers --config PATH`` as a chaos story runs it: the real CLI, with one fault at the
launch seam when ``DLTS_CHAOS_KILL_IN_LAUNCH`` is above 0: at each unit start the process SIGKILLs
itself, with that chance (seeded by ``DLTS_CHAOS_SEED``), either after the unit's ``mkdir`` and
before its init (so before any pid record: a half-made unit) or just after the init started (the
job runs, the job manager recorded nothing of it)."""

from __future__ import annotations

import os
import random
import signal
import sys


def install_faults(chance: float, seed: int) -> None:
    from dlts.backends.local import LocalBackend

    rng = random.Random(seed)
    start = LocalBackend._start

    def faulty_start(self, unit, *args, **kwargs):
        if rng.random() < chance:
            print(f"chaos: SIGKILL between mkdir and the pid record of {unit}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        start(self, unit, *args, **kwargs)
        if rng.random() < chance:
            print(f"chaos: SIGKILL just after starting the init of {unit}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    LocalBackend._start = faulty_start


if __name__ == "__main__":
    chance = float(os.environ.get("DLTS_CHAOS_KILL_IN_LAUNCH") or 0)
    if chance > 0:
        install_faults(chance, int(os.environ.get("DLTS_CHAOS_SEED") or 0))
    import logging

    from dlts.cli import main

    logging.getLogger("apscheduler").setLevel(logging.WARNING)  # a line per pass: the lease's lines matter here
    main(["--config", sys.argv[1], "managers"], prog_name="dlts")
