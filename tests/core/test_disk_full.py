"""Faults at the edges: a full disk, on real full file systems (a small tmpfs each test mounts;
skipped with the reason where it cannot).

* the log and run volume fills while jobs print fast: every job ends by its own exit (none stays
  running), its log and its events say what was cut, the API answers, and once there is room again
  a new job runs to the end;
* a run directory that cannot be made: the job waits in ``scheduling`` with the reason and starts
  once there is room;
* below the hard threshold: new jobs wait with the reason (a volume, its free room, the threshold),
  the gauges and a notice say so, and the jobs start by themselves when the room comes back;
* ``dlts demo`` with its SQLite database on the full volume: reads answer, writes answer 503 with
  the cause, /readyz is not ready, the tick says so once (no traceback a tick), writes and
  readiness come back with the room, and the demo stops cleanly.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa
from full_volume import fill, tmpfs
from live_helpers import get, submit, wait_for
from prometheus_client import REGISTRY

from dlts.config import DiskPressureSettings
from dlts.jobmanager import JobManager
from dlts.models import OutboxMessage, User

MiB = 1024 * 1024
BOUND_S = 120.0  # only a hang reaches it
NO_PRESSURE = {"soft_free_bytes": 0, "hard_free_bytes": 0, "soft_free_inodes": 0, "hard_free_inodes": 0, "interval_s": 0}


@pytest.fixture
def volume(tmp_path):
    """The log store and the run directories on an 8 MiB tmpfs."""
    with tmpfs(tmp_path / "vol", "8m") as path:
        yield path


@pytest.fixture
def settings(tmp_path, database_url, volume):
    from dlts.config import Settings

    return Settings(home=tmp_path / "home", database_url=database_url, secret_key="test-secret-key-0123456789",
                    tick_s=0.2, preempt_grace_s=2.0, demo_gpus=4, demo_sku="demo-gpu", max_body_bytes=64 * 1024,
                    sku_reserve={"*": {"cpu_per_gpu": 0, "memory_per_gpu_bytes": 0}},
                    log_dir=volume / "logs", run_dir=volume / "run", disk_pressure=NO_PRESSURE)


def _until(what: str, check, tick=None, bound_s: float = BOUND_S):
    deadline = time.monotonic() + bound_s
    while True:
        if tick is not None:
            tick()
        seen = check()
        if seen:
            return seen
        assert time.monotonic() < deadline, f"{what}: not within {bound_s:g} s"
        time.sleep(0.1)


def _log(live, world, job_id) -> str:
    """The attempt's whole stored log, slice by slice."""
    text, offset = "", 0
    while True:
        r = requests.get(f"{live.url}/api/v1/jobs/{job_id}/log", params={"offset": offset}, headers=world.auth("alice"),
                         timeout=10)
        assert r.status_code == 200, r.text
        if not r.json()["data"]:
            return text
        text, offset = text + r.json()["data"], r.json()["next_offset"]


def _events(live, world, job_id, user="alice") -> list[dict]:
    r = requests.get(f"{live.url}/api/v1/jobs/{job_id}/events", headers=world.auth(user), timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["items"]


def _wait_file(path: Path) -> str:
    return f"while [ ! -e {path} ]; do sleep 0.05; done"


BURST = "head -c 3000000 /dev/zero | tr '\\0' x; echo"  # 3 MB at once: more than the volume has left


def test_jobs_printing_while_the_log_volume_fills_end_by_their_own_exit_and_their_logs_say_what_was_cut(
        live, world, volume, tmp_path, caplog):
    go, more = tmp_path / "go", tmp_path / "more"
    waiter = submit(live, world, gpus=1, max_retries=0,
                    command=f"echo started; {_wait_file(go)}; {BURST}; {_wait_file(more)}; echo after the cut")
    ends = submit(live, world, gpus=1, max_retries=0, command=f"echo started; {_wait_file(go)}; {BURST}; echo done")
    fails = submit(live, world, gpus=1, max_retries=0, command=f"echo started; {_wait_file(go)}; {BURST}; exit 3")
    jobs = (waiter, ends, fails)
    for job in jobs:
        _until(f"job {job['id']} running with its first line stored",
               lambda job=job: get(live, world, job["id"])["status"] == "running" and _log(live, world, job["id"]),
               live.tick)
    filler = fill(volume)
    go.touch()  # all three print 3 MB into a full volume

    _until("the jobs that exit after the burst ended", lambda: get(live, world, ends["id"])["status"] == "finished"
           and get(live, world, fails["id"])["status"] == "failed", live.tick)
    assert get(live, world, fails["id"])["exit_code"] == 3  # its own code, not a lost job's
    assert get(live, world, waiter["id"])["status"] == "running"  # it runs on: its output is read and dropped
    dropping = f"job {waiter['id']} attempt 1: its output is being dropped: No space left on device"
    _until("the manager's log says the running job loses output", lambda: dropping in caplog.text, live.tick)
    live.tick(3)
    assert caplog.text.count(dropping) == 1  # once, not once a tick
    listed = requests.get(f"{live.url}/api/v1/jobs", headers=world.auth("alice"), timeout=10)
    assert listed.status_code == 200 and {j["id"] for j in listed.json()["items"]} >= {j["id"] for j in jobs}
    for job in (ends, fails):
        [cut] = [e for e in _events(live, world, job["id"]) if e["reason"] == "log_cut"]
        assert re.fullmatch(r"attempt 1: \d+ bytes of output were not stored: No space left on device", cut["message"])
        assert _log(live, world, job["id"]).startswith("started\n")

    filler.unlink()  # the room comes back while the first job still runs
    more.touch()
    done = wait_for(live, world, waiter["id"], {"finished", "failed"}, timeout_s=BOUND_S)
    assert done["status"] == "finished" and done["exit_code"] == 0
    text = _log(live, world, waiter["id"])
    assert text.startswith("started\n") and text.endswith("after the cut\n")
    assert re.search(r"\n\[dlts\] \d+ bytes of output were not stored here: No space left on device\n", text)

    fresh = submit(live, world, gpus=1, command="echo fresh")
    assert wait_for(live, world, fresh["id"], {"finished", "failed"}, timeout_s=BOUND_S)["status"] == "finished"
    assert _log(live, world, fresh["id"]) == "fresh\n"
    statuses = {j["id"]: get(live, world, j["id"])["status"] for j in (*jobs, fresh)}
    assert statuses == {waiter["id"]: "finished", ends["id"]: "finished", fails["id"]: "failed", fresh["id"]: "finished"}


def test_a_run_directory_that_cannot_be_made_keeps_the_job_scheduling_with_the_reason_until_there_is_room(
        live, world, volume):
    filler = fill(volume)
    job = submit(live, world, gpus=1, command="echo made")
    seen = _until("the launch's reason on the job", lambda: (j := get(live, world, job["id"]))["reason"] and j,
                  live.tick)
    assert seen["status"] == "scheduling" and seen["reason"] == "disk_full"
    assert "cannot make the run directory" in seen["reason_detail"]
    assert "No space left on device" in seen["reason_detail"]
    assert not any(p.name.startswith(f"{job['id']}-") for p in live.backend.run_dir.iterdir())  # nothing half-made
    live.tick(3)
    assert [e["reason"] for e in _events(live, world, job["id"]) if e["kind"] == "reason"] == ["disk_full"]  # once
    filler.unlink()
    assert wait_for(live, world, job["id"], {"finished", "failed"}, timeout_s=BOUND_S)["status"] == "finished"
    assert _log(live, world, job["id"]) == "made\n"


def test_below_the_hard_threshold_new_jobs_wait_with_the_reason_and_start_by_themselves_when_room_returns(
        live, world, sessions, settings, volume):
    pressure = {"soft_free_bytes": 4 * MiB, "hard_free_bytes": 2 * MiB, "soft_free_inodes": 0, "hard_free_inodes": 0,
                "interval_s": 0}
    manager = JobManager(sessions, live.backend,
                         settings.model_copy(update={"disk_pressure": DiskPressureSettings(**pressure)}))
    with sessions() as s:
        s.scalar(sa.select(User).where(User.name == "admin")).email = "admin@example.org"
        s.commit()
    log_volume = {"volume": "log", "path": str(settings.effective_log_dir)}
    filler = fill(volume, leave_bytes=MiB)  # 1 MiB left: below the hard threshold
    job = submit(live, world, gpus=1, command="echo resumed")
    manager.tick()
    manager.tick()
    seen = get(live, world, job["id"])
    host = manager.pressure.host
    assert seen["status"] == "queued" and seen["reason"] == "disk_pressure"
    assert re.match(rf"log volume full on {host}: 1\.0 MiB free, below the hard threshold of 2\.0 MiB; "
                    rf"run volume full on {host}: ", seen["reason_detail"]), seen["reason_detail"]
    assert seen["queue_position"] == 1
    assert [e["reason"] for e in _events(live, world, job["id"]) if e["kind"] == "reason"] == ["disk_pressure"]
    assert REGISTRY.get_sample_value("dlts_volume_pressure", log_volume) == 2
    assert REGISTRY.get_sample_value("dlts_volume_free_bytes", log_volume) == MiB
    with sessions() as s:
        notices = s.scalars(sa.select(OutboxMessage).where(OutboxMessage.template == "disk_pressure")).all()
        assert sorted(n.context["volume"] for n in notices) == ["log", "run"]  # once each, not once a tick
        assert all(n.recipients == ["admin@example.org"] and n.context["level"] == "hard" for n in notices)

    filler.unlink()
    _until("the held job finished", lambda: get(live, world, job["id"])["status"] == "finished", manager.tick)
    assert _log(live, world, job["id"]) == "resumed\n"
    assert REGISTRY.get_sample_value("dlts_volume_pressure", log_volume) == 0


# -- the demo's SQLite database on a full volume ----------------------------------------------------

class Demo:
    """``dlts demo`` as a real process, its output in a file (a pipe nobody reads would block it)."""

    def __init__(self, home: Path, output: Path):
        self.home, self.output = home, output
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("DLTS_")}
        env |= {"DLTS_HOME": str(home), "DLTS_TICK_S": "0.2", "DLTS_PREEMPT_GRACE_S": "2",
                "DLTS_FORECAST__ENABLED": "false", "DLTS_INSIGHT__ENABLED": "false"}
        env |= {f"DLTS_DISK_PRESSURE__{k.upper()}": str(v) for k, v in NO_PRESSURE.items()}
        self.env = env
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.output, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "dlts.cli", "demo", "--port", str(self.port),
                                          "--demo-gpus", "2"], env=self.env, stdout=out, stderr=subprocess.STDOUT)
        _until("the demo answers", self._ready, bound_s=90)

    def _ready(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, self.text()
        try:
            return requests.get(f"{self.url}/readyz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def auth(self, name: str) -> dict[str, str]:
        token = (self.home / ("demo-token" if name == "admin" else f"{name}-token")).read_text().strip()
        return {"Authorization": f"Bearer {token}"}

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=90)


def _tick_errors(demo: Demo) -> float:
    text = requests.get(f"{demo.url}/metrics", timeout=10).text
    m = re.search(r'^dlts_jobmanager_tick_errors_total\{error="database_refuses_writes"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def test_the_demo_with_its_database_on_a_full_volume_reads_refuses_writes_with_the_cause_and_recovers(tmp_path):
    from tests.conftest import IS_MYSQL

    if IS_MYSQL:
        pytest.skip("the demo's database is SQLite; MariaDB's full disk is its server's")
    with tmpfs(tmp_path / "demo", "24m") as home:
        demo = Demo(home / "home", tmp_path / "demo.out")
        demo.start()
        try:
            _full_database(demo, tmp_path / "go")
        finally:
            code = demo.stop()
    out = demo.text()
    assert code == 0, out[-4000:]
    assert "Traceback" not in out, out[-6000:]
    assert out.count("job manager: the database refuses writes, its disk is full") == 1, out[-6000:]
    assert out.count("job manager: the database accepts writes again") == 1
    assert "stopped (0 running job(s) will be requeued" in out


def _full_database(demo: Demo, go: Path) -> None:
    alice, admin = demo.auth("alice"), demo.auth("admin")
    body = {"vc": "default", "image": "any", "gpus": 0}
    job = requests.post(f"{demo.url}/api/v1/jobs", headers=alice, json=body | {"command": f"{_wait_file(go)}; echo ended"},
                        timeout=10).json()
    _until("the job runs", lambda: requests.get(f"{demo.url}/api/v1/jobs/{job['id']}", headers=alice,
                                                timeout=10).json()["status"] == "running")
    # a young demo's SQLite WAL (under 1000 pages: never checkpointed yet) grows with every commit, so
    # once the volume is full every write needs a page it cannot get
    filler = fill(demo.home.parent)
    go.touch()  # it ends while nothing can be written: the tick's record of it is refused

    for url, auth in ((f"/api/v1/jobs/{job['id']}", alice), ("/api/v1/jobs", alice), ("/api/v1/me", admin),
                      ("/api/v1/nodes", admin)):  # admin's token was never used: its last-use stamp is refused
        r = requests.get(f"{demo.url}{url}", headers=auth, timeout=10)
        assert r.status_code == 200, (url, r.text)
    refused = requests.post(f"{demo.url}/api/v1/jobs", headers=alice, json=body | {"command": "true"}, timeout=10)
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "30"
    error = refused.json()["error"]
    assert error["code"] == "database_read_only" and error["details"] == {"cause": "disk_full"}
    assert "its disk is full" in error["message"] and "Reading still works" in error["message"]
    ready = requests.get(f"{demo.url}/readyz", timeout=10)
    assert ready.status_code == 503 and ready.json()["error"]["code"] == "database_read_only", ready.text
    assert ready.json()["error"]["details"] == {"cause": "disk_full"}
    _until("three refused ticks", lambda: _tick_errors(demo) >= 3)
    said = demo.text()
    assert said.count("job manager: the database refuses writes") == 1 and "Traceback" not in said, said[-6000:]
    assert requests.get(f"{demo.url}/api/v1/jobs/{job['id']}", headers=alice, timeout=10).json()["status"] == "running"

    filler.unlink()
    _until("ready again", lambda: requests.get(f"{demo.url}/readyz", timeout=10).status_code == 200)
    ended = _until("the job's end recorded", lambda: (j := requests.get(
        f"{demo.url}/api/v1/jobs/{job['id']}", headers=alice, timeout=10).json())["status"] in ("finished", "failed") and j)
    assert ended["status"] == "finished" and ended["exit_code"] == 0
    again = requests.post(f"{demo.url}/api/v1/jobs", headers=alice, json=body | {"command": "echo again"}, timeout=10)
    assert again.status_code == 201, again.text
    _until("the new job finished", lambda: requests.get(f"{demo.url}/api/v1/jobs/{again.json()['id']}", headers=alice,
                                                        timeout=10).json()["status"] == "finished")
