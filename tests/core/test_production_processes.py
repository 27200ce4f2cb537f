"""The production shape: `dlts api` under gunicorn and `dlts managers` under APScheduler, as two
real processes sharing one database, set up with the operator CLI."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import requests

DLTS = [sys.executable, "-m", "dlts.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_api_and_managers_processes_run_a_job_end_to_end(tmp_path, database_url):
    port, metrics_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLTS_")} | {
        "DLTS_HOME": str(tmp_path), "DLTS_DATABASE_URL": database_url,
        "DLTS_SECRET_KEY": "a-test-secret-key-123456", "DLTS_LISTEN_PORT": str(port), "DLTS_TICK_S": "0.3",
        "DLTS_DEMO_GPUS": "2", "DLTS_RUN_DIR": str(tmp_path / "run"), "DLTS_LOG_DIR": str(tmp_path / "logs"),
        "DLTS_MANAGERS_METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
        # the local backend outside the demo only with this (docs/security-host.md); here the test is every user
        "DLTS_LOCAL_BACKEND_TRUSTED_USERS": "true",
    }

    def cli(*args):
        result = subprocess.run(DLTS + list(args), env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    assert cli("db", "upgrade").startswith("database at revision")
    cli("user", "add", "erin")
    cli("vc", "add", "lab", "--quota", "demo-gpu=2")
    cli("vc", "member", "lab", "erin")
    token = cli("user", "token", "erin").splitlines()[-1]
    api = subprocess.Popen(DLTS + ["api", "--workers", "2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    managers = subprocess.Popen(DLTS + ["managers"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {token}"}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{url}/readyz", timeout=10).status_code == 200:
                    break
            except requests.RequestException:  # not listening yet, or a worker still starting
                pass
            assert api.poll() is None and time.monotonic() < deadline, "gunicorn did not come up"
            time.sleep(0.3)
        # the node appears once the managers' first tick has synced it
        while True:
            r = requests.post(f"{url}/api/v1/jobs", headers=auth, timeout=10,
                              json={"vc": "lab", "image": "x", "command": "echo via-gunicorn", "gpus": 1})
            if r.status_code == 201:
                break
            assert managers.poll() is None and time.monotonic() < deadline, r.text
            time.sleep(0.3)
        job_id = r.json()["id"]
        while (job := requests.get(f"{url}/api/v1/jobs/{job_id}", headers=auth, timeout=10).json())["status"] != "finished":
            assert time.monotonic() < deadline + 30, job
            time.sleep(0.3)
        log = requests.get(f"{url}/api/v1/jobs/{job_id}/log", headers=auth, timeout=10).json()
        assert log["data"] == "via-gunicorn\n"
        # the managers process serves the repair loop's metrics, read from the database at scrape time
        metrics = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        assert 'dlts_nodes{state="in_service"} 1.0' in metrics and "dlts_repair_paused 0.0" in metrics
    finally:
        for proc in (api, managers):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
