"""Search the scheduler's properties for new counterexamples, within a time budget.

The test suite draws the same examples every run (the derandomized ``ci`` profile of
tests/conftest.py), so it passes where CI passes. This command searches beyond them: rounds of the
scheduler's hypothesis properties, each round with a new random seed and ``--examples`` examples per
property (the ``explore`` profile), until ``--minutes`` are spent or a property fails. A round still
running when the budget ends is stopped and not counted.

    sh .ci/dev explore [--minutes 20] [--examples 1000] [--seed N]
    .venv/bin/python -m tests.scheduler.explore --minutes 20

A failure prints hypothesis' falsifying example and the command that replays the round; the example
then becomes an ``@example`` of the property (docs/scheduling.md). Exit 0: nothing found; 1: a
counterexample; 2: bad arguments. Run it before resolving any scheduler change and say what it
found (rounds, examples, seeds) in the note.
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROPERTIES = (
    "tests/scheduler/test_properties.py::test_invariants_hold_after_every_pass",
    "tests/scheduler/test_backfill_properties.py::test_reservations_start_by_their_estimate_when_jobs_end_by_their_limit",
    "tests/scheduler/test_forecast.py::test_a_forecast_after_the_last_submission_matches_the_replay",
)


def positive(kind: type) -> object:
    def parse(text: str) -> object:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be more than 0")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="explore", description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=positive(float), default=20.0, help="the time budget (default 20)")
    parser.add_argument("--examples", type=positive(int), default=1000, help="examples per property per round")
    parser.add_argument("--seed", type=int, default=None, help="the first round's seed (default: random)")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.minutes * 60
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    env = {**os.environ, "DLTS_HYPOTHESIS_PROFILE": "explore", "DLTS_PROPERTY_EXAMPLES": str(args.examples)}
    rounds, seeds = 0, []
    print(f"explore: {len(PROPERTIES)} properties, {args.examples} examples each per round, "
          f"{args.minutes:g} minutes", flush=True)
    while True:
        left = deadline - time.monotonic()
        if left < 5:
            break
        argv_round = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "--timeout=0",
                      f"--hypothesis-seed={seed}", *PROPERTIES]
        started = time.monotonic()
        try:
            done = subprocess.run(argv_round, cwd=ROOT, env=env, capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired:
            print(f"round with seed {seed}: stopped by the budget after {time.monotonic() - started:.0f} s "
                  "(not counted)", flush=True)
            break
        took = time.monotonic() - started
        if done.returncode != 0:
            print(done.stdout[-20000:])
            print(done.stderr[-4000:], file=sys.stderr)
            replay = " ".join(shlex.quote(a) for a in argv_round[1:])
            print(f"explore: a counterexample with seed {seed} after {rounds} clean rounds; replay with\n"
                  f"  DLTS_HYPOTHESIS_PROFILE=explore DLTS_PROPERTY_EXAMPLES={args.examples} .venv/bin/python {replay}\n"
                  "then add the falsifying example as an @example of the property", flush=True)
            return 1
        rounds += 1
        seeds.append(seed)
        print(f"round {rounds}: seed {seed}, {len(PROPERTIES) * args.examples} examples, {took:.0f} s, nothing found",
              flush=True)
        seed = (seed * 6364136223846793005 + 1442695040888963407) % 2**32  # the next seed, reproducible from the first
    print(f"explore: nothing found in {rounds} rounds ({rounds * len(PROPERTIES) * args.examples} examples; "
          f"seeds {', '.join(map(str, seeds)) or 'none'})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
