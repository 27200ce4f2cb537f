"""The metrics endpoints as production runs them: the API under the gunicorn command line of the
dlts-api unit (several workers, multiprocess mode: any scrape sums every worker), and `dlts
managers` serving its instruments and the database collectors on managers_metrics_listen."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.timeout(180)]
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sample(text: str, name: str, **labels) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def wait_for(url: str, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if requests.get(url, timeout=5).status_code == 200:
                return
        except (requests.ConnectionError, requests.Timeout):
            pass
        if proc.poll() is not None:
            pytest.fail(proc.stdout.read())
        assert time.monotonic() < deadline, f"{url} did not answer"
        time.sleep(0.2)


def stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


@pytest.fixture
def config(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    path = tmp_path / "dlts.yaml"
    # (the local backend outside the demo only with local_backend_trusted_users: docs/security-host.md)
    path.write_text(f"home: {home}\nsecret_key: test-secret-key-0123456789abcdef\ntick_s: 0.5\n"
                    f"managers_metrics_listen: 127.0.0.1:{free_port()}\nlocal_backend_trusted_users: true\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DLTS_", "PROMETHEUS_MULTIPROC"))} | {
        "DLTS_CONFIG": str(path)}
    subprocess.run([sys.executable, "-m", "dlts.cli", "db", "upgrade"], env=env, check=True, capture_output=True, timeout=120)
    return path, env


def test_gunicorn_workers_in_multiprocess_mode_are_summed_by_any_scrape(tmp_path, config):
    _, env = config
    port = free_port()
    multiproc = tmp_path / "multiproc"
    multiproc.mkdir()
    # the dlts-api unit's command line (ansible/roles/dlts_control/templates/dlts-api.service.j2)
    proc = subprocess.Popen([str(VENV_BIN / "gunicorn"), "--workers", "3", "--bind", f"127.0.0.1:{port}",
                             "--config", "python:dlts.gunicorn_conf", "dlts.app:create_app()"],
                            env=env | {"PROMETHEUS_MULTIPROC_DIR": str(multiproc)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(f"{url}/healthz", proc)
        before = sample(requests.get(f"{url}/metrics", timeout=5).text, "dlts_http_requests_total",
                        endpoint="/healthz", status="200")
        for _ in range(30):  # a connection each: spread over the workers
            assert requests.get(f"{url}/healthz", timeout=5).status_code == 200
        counted = []
        for _ in range(6):
            text = requests.get(f"{url}/metrics", timeout=5).text
            counted.append(sample(text, "dlts_http_requests_total", endpoint="/healthz", status="200"))
        # every scrape sees all 30, whichever worker answers it
        assert counted == [before + 30] * 6, (before, counted)
        assert sample(text, "dlts_db_pool_connections_max") is not None
        assert len({p.name.split("_")[-1] for p in multiproc.glob("*.db")}) >= 2  # several workers wrote
    finally:
        out = stop(proc)
    assert "Traceback" not in out, out[-3000:]


def test_dlts_managers_serves_ticks_runs_and_the_database_collectors(config):
    path, env = config
    listen = next(line.split(": ", 1)[1] for line in path.read_text().splitlines()
                  if line.startswith("managers_metrics_listen"))
    proc = subprocess.Popen([sys.executable, "-m", "dlts.cli", "managers"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://{listen}/metrics"
        wait_for(url, proc)
        deadline = time.monotonic() + 60
        while True:
            text = requests.get(url, timeout=5).text
            ticks = sample(text, "dlts_manager_runs_total", manager="jobmanager.tick", result="ok") or 0
            if ticks >= 2:
                break
            assert time.monotonic() < deadline, text[-3000:]
            time.sleep(0.5)
        assert sample(text, "dlts_jobmanager_ticks_total") >= 2
        assert sample(text, "dlts_jobmanager_tick_duration_seconds_count") >= 2
        assert sample(text, "dlts_scheduler_pass_duration_seconds_count") >= 1
        assert sample(text, "dlts_db_query_duration_seconds_count", operation="select") > 0
        assert sample(text, "dlts_node_capacity_gpus") is not None  # the local node, from the database
        assert sample(text, "dlts_nodes", state="in_service") == 1  # the repair loop's collector
        assert sample(text, "dlts_manager_runs_total", manager="janitor.purge", result="error") == 0
        assert sample(text, "dlts_scheduler_stops_total", reason="preempted") == 0
    finally:
        out = stop(proc)
    assert "Traceback" not in out, out[-3000:]
