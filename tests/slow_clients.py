"""Slow-client helpers shared by tests/core/test_api_slow_clients.py (against `dlts api`) and
tests/ansible/test_nginx_slow_clients.py (through the nginx the Ansible role configures): a
slowloris attacker, a normal client timing its requests meanwhile, and `dlts api` as a process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

DLTS = [sys.executable, "-m", "dlts.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlowLoris:
    """Sockets that each send a request's headers one byte per interval and never finish them."""

    def __init__(self, connect, count: int, interval_s: float = 1.0) -> None:
        self.connect, self.count, self.interval_s = connect, count, interval_s
        self.stop = threading.Event()
        self.sockets: list[socket.socket] = []
        self.closed_by_server: list[float] = []  # seconds after the start that the server hung up
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SlowLoris:
        self.started = time.monotonic()
        self.sockets = [self.connect() for _ in range(self.count)]
        self._thread.start()
        time.sleep(self.interval_s * 1.5)  # every socket has begun a request
        return self

    def _run(self) -> None:
        request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n" + b"X-Slow: " + b"a" * 4096
        position = 0
        live = list(self.sockets)
        while live and not self.stop.is_set():
            byte = request[position % len(request):position % len(request) + 1]
            for sock in list(live):
                try:
                    sock.sendall(byte)
                except OSError:
                    self.closed_by_server.append(time.monotonic() - self.started)
                    live.remove(sock)
            position += 1
            self.stop.wait(self.interval_s)

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self._thread.join(10)
        for sock in self.sockets:
            sock.close()


STALLED_S = 10.0  # a normal request that took this long was stalled by the slow clients
NORMAL_MAX_S = 5.0


def answers_while(slow: SlowLoris, get, duration_s: float) -> list[float]:
    """Seconds each normal request took during ``duration_s`` of the attack (a timeout: STALLED_S).
    Callers require each under NORMAL_MAX_S: far below a stall, with room for a busy CI machine."""
    took = []
    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        start = time.monotonic()
        try:
            assert get(timeout=STALLED_S).status_code == 200
            took.append(time.monotonic() - start)
        except requests.RequestException:
            took.append(STALLED_S)
        time.sleep(0.3)
    return took


def start_api(tmp_path: Path, port: int, workers: int = 2, settings: dict[str, str] | None = None) -> subprocess.Popen:
    """``settings``: more DLTS_* variables (from a rendered dlts.yaml)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLTS_")} | {
        "DLTS_HOME": str(tmp_path / "home"), "DLTS_LISTEN_PORT": str(port), "DLTS_LOCAL_BACKEND_TRUSTED_USERS": "true",
        "DLTS_SECRET_KEY": "a-test-secret-key-123456"} | (settings or {})
    (tmp_path / "home").mkdir(exist_ok=True)
    subprocess.run(DLTS + ["db", "upgrade"], env=env, check=True, capture_output=True, timeout=120)
    api = subprocess.Popen(DLTS + ["api", "--workers", str(workers)], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            if requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                return api
        except requests.RequestException:
            pass
        assert api.poll() is None and time.monotonic() < deadline, "dlts api did not come up"
        time.sleep(0.2)


def stop_api(api: subprocess.Popen) -> None:
    api.send_signal(signal.SIGTERM)
    try:
        api.wait(timeout=30)
    except subprocess.TimeoutExpired:
        api.kill()
        api.wait()
