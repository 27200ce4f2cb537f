"""The whole suite as three pytest processes side by side: the README's test command.

Most of the suite's time is spent waiting on real processes, servers and ticks, not on the CPU, so
three processes on two cores finish in about a third more than the time of the longest. The suite
splits by the ``db`` marker (tests/conftest.py puts it on every test that reaches the test
database) and, for the rest, by directory:

* the database tests but the real-Kubernetes ones;
* the Ansible tests that do not reach the database (the converge into a container among them);
* the rest, and the real-Kubernetes tests (marker ``kube``; one cluster at a time).

(On a 2-core machine the three take about 680, 580 and 640 s of test time.)

Each stream has its own pytest base directory and writes its output to a file; a line says when
each ends, then the outputs are printed one after the other, and the slowest tests of all (where
the time goes, like ``--durations``). Exit status: 0 when every stream passed, else the first
failure's.

    .venv/bin/python -m tests.streams [--durations N] [--keep DIR] [-- pytest options for all]

``sh .ci/dev test`` runs this when given no pytest options; with options it runs one pytest with
them (a file, ``-k``, ``-x``, ...). The Ansible converge into a qemu VM (marker ``vm``) is left out,
as there.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (name, marker, paths and options)
STREAMS = (
    ("database tests", "db and not vm and not kube", ()),
    ("the Ansible tests", "not db and not vm", ("tests/ansible",)),
    ("the other tests and the real-Kubernetes ones", "(not db and not vm) or kube", ("--ignore=tests/ansible",)),
)
NO_TESTS = 5  # pytest's exit status when a selection collected nothing


@dataclass
class Stream:
    name: str
    marker: str
    log: Path
    junit: Path
    proc: subprocess.Popen
    started: float
    ended: float | None = None


def slowest(junits: list[Path], n: int) -> list[tuple[float, str]]:
    """The ``n`` slowest test cases of the streams' JUnit reports (setup, call and teardown together)."""
    cases = []
    for path in junits:
        if not path.exists():
            continue
        for case in ET.parse(path).getroot().iter("testcase"):
            name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            cases.append((float(case.get("time") or 0.0), name))
    return sorted(cases, reverse=True)[:n]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streams", description=__doc__.split("\n")[0])
    parser.add_argument("--durations", type=int, default=25, help="how many of the slowest tests to list")
    parser.add_argument("--keep", type=Path, help="keep the streams' logs and JUnit reports in this directory")
    parser.add_argument("pytest_args", nargs="*", help="options given to every pytest process (after --)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="dlts-streams."))
    out = args.keep or work
    out.mkdir(parents=True, exist_ok=True)
    streams = []
    for i, (name, marker, where) in enumerate(STREAMS):
        log, junit = out / f"stream-{i}.log", out / f"stream-{i}.xml"
        cmd = [sys.executable, "-m", "pytest", "-m", marker, f"--basetemp={work / f'base-{i}'}",
               f"--junitxml={junit}", "-p", "no:cacheprovider", *args.pytest_args, *where]
        with log.open("wb") as fh:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        streams.append(Stream(name, marker, log, junit, proc, time.monotonic()))
        print(f"streams: {name} (-m '{marker}') started, output in {log}", flush=True)
    pending = list(streams)
    try:
        while pending:
            for s in list(pending):
                if s.proc.poll() is not None:
                    s.ended = time.monotonic()
                    pending.remove(s)
                    print(f"streams: {s.name} ended (exit {s.proc.returncode}) after {s.ended - s.started:.0f} s", flush=True)
            if pending:
                time.sleep(1.0)
    except KeyboardInterrupt:
        for s in pending:
            s.proc.terminate()
        for s in pending:
            s.proc.wait()
        raise
    failed = 0
    for s in streams:
        print(f"\n== {s.name} (-m '{s.marker}')", flush=True)
        sys.stdout.write(s.log.read_text(errors="replace"))
        rc = s.proc.returncode
        if rc not in (0, NO_TESTS) and not failed:
            failed = rc
    if all(s.proc.returncode == NO_TESTS for s in streams):
        failed = NO_TESTS
    if args.durations:
        print(f"\n== the {args.durations} slowest tests of all streams (seconds: setup, call and teardown)")
        for seconds, name in slowest([s.junit for s in streams], args.durations):
            print(f"{seconds:8.1f}  {name}")
    walls = ", ".join(f"{s.name} {(s.ended or s.started) - s.started:.0f} s" for s in streams)
    print(f"\n== streams: {walls}; {'passed' if not failed else f'FAILED (exit {failed})'}")
    shutil.rmtree(work, ignore_errors=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
