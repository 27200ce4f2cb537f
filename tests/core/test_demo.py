"""`dlts demo` as a real process: first start, a second terminal, restart keeps every job."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

DLTS = [sys.executable, "-m", "dlts.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Demo:
    def __init__(self, home: Path, port: int):
        self.home, self.port = home, port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DLTS_")}
        return env | {"DLTS_HOME": str(self.home), "DLTS_PREEMPT_GRACE_S": "2", "DLTS_TICK_S": "0.3"}

    def start(self) -> str:
        self.proc = subprocess.Popen(DLTS + ["demo", "--port", str(self.port), "--demo-gpus", "2"], env=self.env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    break
            except (requests.ConnectionError, requests.Timeout):  # not listening yet, or slow to answer on a busy machine
                pass
            assert self.proc.poll() is None, self.proc.stdout.read()
            assert time.monotonic() < deadline, "demo did not come up"
            time.sleep(0.2)
        return (self.home / "alice-token").read_text().strip()

    def stop(self) -> str:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        out, _ = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, out
        return out

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(DLTS + list(args), env=self.env(), capture_output=True, text=True, timeout=60)


def wait_status(demo, token, job_id, statuses, timeout_s=30, attempt=None):
    deadline = time.monotonic() + timeout_s
    while True:
        job = requests.get(f"{demo.url}/api/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"}, timeout=5).json()
        if job["status"] in statuses and attempt in (None, job["attempt"]):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.2)


def test_demo_runs_jobs_survives_a_restart_and_takes_users_from_a_second_terminal(tmp_path):
    demo = Demo(tmp_path / "home", free_port())
    token = demo.start()
    try:
        auth = {"Authorization": f"Bearer {token}"}
        admin_token = (demo.home / "demo-token").read_text().strip()
        assert (demo.home / "demo-token").stat().st_mode & 0o077 == 0
        me = requests.get(f"{demo.url}/api/v1/me", headers=auth, timeout=5).json()
        assert me["vcs"][0]["quota"] == {"demo-gpu": 2}
        done = requests.post(f"{demo.url}/api/v1/jobs", headers=auth, timeout=5,
                             json={"vc": "default", "image": "any", "command": "echo kept", "gpus": 1}).json()
        wait_status(demo, token, done["id"], {"finished"})
        long = requests.post(f"{demo.url}/api/v1/jobs", headers=auth, timeout=5,
                             json={"vc": "default", "image": "any", "command": "sleep 600", "gpus": 0}).json()
        wait_status(demo, token, long["id"], {"running"})
        # a second terminal adds a user to the running demo
        assert demo.cli("user", "add", "dave").returncode == 0
        assert demo.cli("vc", "member", "default", "dave").returncode == 0
        dave = demo.cli("user", "token", "dave").stdout.strip()
        assert requests.get(f"{demo.url}/api/v1/me", headers={"Authorization": f"Bearer {dave}"}, timeout=5).status_code == 200
        bad = demo.cli("vc", "add", "x", "--quota", "nonsense")
        assert bad.returncode != 0 and "quota" in bad.stderr and "Traceback" not in bad.stderr
        # the real node agent reports for the demo's node; with pretend GPUs it claims no GPU readings
        admin_auth = {"Authorization": f"Bearer {admin_token}"}
        deadline = time.monotonic() + 20
        while not (node := requests.get(f"{demo.url}/api/v1/nodes", headers=admin_auth, timeout=5).json()["items"][0]
                   ).get("last_heartbeat_at"):
            assert time.monotonic() < deadline, node
            time.sleep(0.3)
        node = requests.get(f"{demo.url}/api/v1/nodes/{node['name']}", headers=admin_auth, timeout=5).json()
        assert node["state"] == "in_service" and node["details"]["metrics"].get("fake") is not True
        assert node["details"]["findings"] == [] or all(f["severity"] != "critical" for f in node["details"]["findings"])
    finally:
        out = demo.stop()
    assert "1 running job(s) will be requeued" in out
    assert "node agent: no GPU telemetry (pretend GPUs" in out
    token = demo.start()
    try:
        auth = {"Authorization": f"Bearer {token}"}
        assert requests.get(f"{demo.url}/api/v1/jobs/{done['id']}", headers=auth, timeout=5).json()["status"] == "finished"
        # the API answers before the first tick: until then the job still reads running, attempt 1
        again = wait_status(demo, token, long["id"], {"running"}, attempt=2)
        assert again["retries_used"] == 0
        assert again["attempts"][0]["end_reason"] == "node_lost"
        assert again["queue_time"] == long["queue_time"]
        admin_auth = {"Authorization": f"Bearer {admin_token}"}
        assert requests.get(f"{demo.url}/api/v1/me", headers=admin_auth, timeout=5).json()["cluster_admin"] is True
    finally:
        demo.stop()


def test_the_demo_keeps_its_state_private_to_its_user(tmp_path):
    """Tokens, the secret key, the database, logs and run directories: 0600 files, 0700 directories,
    whatever the umask of the shell that started the demo (a home made earlier is tightened too)."""
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    demo = Demo(home, free_port())
    old = os.umask(0o022)
    try:
        token = demo.start()
    finally:
        os.umask(old)
    try:
        auth = {"Authorization": f"Bearer {token}"}
        job = requests.post(f"{demo.url}/api/v1/jobs", headers=auth, timeout=5,
                            json={"vc": "default", "image": "any", "command": "echo private > out.txt; echo logged; sleep 600",
                                  "gpus": 0}).json()
        wait_status(demo, token, job["id"], {"running"})
        deadline = time.monotonic() + 20
        while not (list((home / "run").rglob("out.txt")) and list((home / "logs").rglob("attempt-*"))):
            assert time.monotonic() < deadline, "the job wrote nothing"
            time.sleep(0.2)
        loose = []
        for path in [home, *home.rglob("*")]:
            mode = path.stat().st_mode & 0o777
            if mode & 0o077:
                loose.append(f"{path.relative_to(tmp_path)} {mode:o}")
        assert loose == []
        for name in ("dlts.db", "demo-token", "alice-token", "secret-key", "demo-credentials", "agent/node-token"):
            assert (home / name).stat().st_mode & 0o777 == 0o600, name
        for name in ("logs", "run", "agent"):
            assert (home / name).stat().st_mode & 0o777 == 0o700, name
        logs = list((home / "logs").rglob("attempt-*"))
        assert logs and all(p.stat().st_mode & 0o777 == 0o600 for p in logs)
    finally:
        demo.stop()
