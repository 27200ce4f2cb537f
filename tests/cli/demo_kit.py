"""A real ``dlts demo`` in a process of its own, for the tests that drive it as a user does
(tests/cli/test_user_cli_demo.py, tests/cli/test_readme_tour.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

DLTS = [sys.executable, "-m", "dlts"]
SRC = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLTS_")}
    path = os.pathsep.join(str(SRC / d) for d in ("src", "agents", "lustre"))
    env["PYTHONPATH"] = path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


class Demo:
    def __init__(self, home: Path, port: int, log: Path):
        self.home, self.port, self.log = home, port, log
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict:
        return base_env() | {"DLTS_HOME": str(self.home), "DLTS_TICK_S": "0.3", "DLTS_PREEMPT_GRACE_S": "2",
                             "DLTS_FORECAST__INTERVAL_S": "1"}

    def start(self, gpus: int = 2) -> str:
        """Start the demo; its stdout (the banner) goes to a file, never a pipe that could fill."""
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(DLTS + ["demo", "--port", str(self.port), "--demo-gpus", str(gpus)], env=self.env(),
                                         stdout=out, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 90
        while True:
            try:
                if requests.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "the demo did not come up: " + self.log.read_text()
            time.sleep(0.2)
        return self.log.read_text()

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=90)
