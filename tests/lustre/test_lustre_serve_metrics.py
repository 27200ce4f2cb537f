"""`dlts-lustre serve-metrics`: the collector over HTTP against the fake lfs/lctl; a bad --listen
is refused naming the option; SIGTERM stops it cleanly."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import requests
from click.testing import CliRunner

from dlts_lustre.cli import main


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_metrics_serves_the_collector_and_stops_on_sigterm(fake_lustre):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dlts_lustre.cli", "serve-metrics", str(fake_lustre.mount),
                             "--listen", f"127.0.0.1:{port}", "--section", "health", "--section", "df"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
                break
            except requests.ConnectionError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
                time.sleep(0.2)
        assert 'dlts_lustre_healthy{state="healthy"} 1.0' in text
        assert 'dlts_lustre_target_capacity_bytes{fs="dltsfs",index="0",kind="OST",target="dltsfs-OST0000"}' in text
        assert 'section="pools"' not in text  # only the sections asked for
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    assert "serving dlts_lustre_* metrics" in out


def test_serve_metrics_refuses_a_bad_listen_address(fake_lustre):
    result = CliRunner().invoke(main, ["serve-metrics", str(fake_lustre.mount), "--listen", "nowhere"])
    assert result.exit_code == 2 and "--listen" in result.output and "HOST:PORT" in result.output
