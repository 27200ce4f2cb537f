"""Shared pieces of the chaos stories: real ``dlts managers`` processes (optionally told to SIGKILL
themselves inside ``LocalBackend.launch``), the real API over HTTP for submissions, the lease row,
and the ledger every job appends its (job id, attempt) to, so that a story can prove each command
ran once per recorded attempt. A uniquely named module (not conftest) so test files import it."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import requests
import sqlalchemy as sa
import yaml
from werkzeug.serving import make_server

from dlts.config import Settings
from dlts.models import ACTIVE, Job, JobAttempt, JobStatus, ManagersLease, Node

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CHILD = HERE / "managers_child.py"


def ledger_command(ledger: Path, sleep_s: float) -> str:
    """The job: one line "JOB ATTEMPT" in the ledger per run of the command, then some work."""
    return f'echo "$DLTS_JOB_ID $DLTS_ATTEMPT" >> {ledger}; sleep {sleep_s}'


def write_config(path: Path, settings: Settings, **extra) -> Path:
    """The dlts.yaml the managers processes read: the test's database and home, the local backend
    with 4 pretend GPUs, no /metrics port (several processes on one machine), repair off."""
    cfg = {"home": str(settings.home), "database_url": settings.database_url, "secret_key": settings.secret_key,
           "tick_s": 0.2, "preempt_grace_s": 2.0, "demo_gpus": 4, "demo_sku": "demo-gpu",
           "managers_metrics_listen": "", "repair": {"enabled": False}, "log_dir": str(settings.effective_log_dir),
           "run_dir": str(settings.effective_run_dir)}
    if "local_backend_trusted_users" in Settings.model_fields:  # the local backend runs the test's own jobs
        cfg["local_backend_trusted_users"] = True
    cfg.update(extra)
    path.write_text(yaml.safe_dump(cfg))
    return path


@dataclass
class Managers:
    """One ``dlts managers`` process (tests/chaos/managers_child.py runs the real CLI)."""

    holder: str
    proc: subprocess.Popen
    log: Path

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def wait_ready(self, timeout_s: float = 120) -> None:
        """Until it runs its scheduler (an interpreter start with DLTS's imports takes seconds on a
        busy machine): from then on it polls the lease."""
        deadline = time.monotonic() + timeout_s
        while "managers running" not in self.log_text():
            assert self.proc.poll() is None, self.log_text()[-2000:]
            assert time.monotonic() < deadline, f"{self.holder} did not start in {timeout_s} s"
            time.sleep(0.05)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class Forked:
    """A managers process the zygote forked (not our child: the zygote reaps it)."""

    def __init__(self, pid: int):
        self.pid = pid

    def poll(self) -> int | None:
        try:
            return 0 if psutil.Process(self.pid).status() == psutil.STATUS_ZOMBIE else None
        except psutil.NoSuchProcess:
            return 0

    def send_signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.01)
        return 0


@dataclass
class Cluster:
    config: Path
    logs: Path
    started: list[Managers] = field(default_factory=list)
    _zygote: subprocess.Popen | None = None

    def _env(self, holder: str, kill_in_launch: float, seed: int, kill_first_launch: bool) -> dict[str, str]:
        return {"DLTS_LEASE_HOLDER": holder, "DLTS_CHAOS_KILL_IN_LAUNCH": str(kill_in_launch),
                "DLTS_CHAOS_SEED": str(seed), "DLTS_CHAOS_KILL_FIRST_LAUNCH": "1" if kill_first_launch else "0"}

    @staticmethod
    def _base_env() -> dict[str, str]:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "agents"), str(ROOT / "lustre"),
                                                             os.environ.get("PYTHONPATH", "")]))
        env.pop("DLTS_HOME", None)
        return env

    def start(self, holder: str, kill_in_launch: float = 0.0, seed: int = 0, kill_first_launch: bool = False) -> Managers:
        """A managers process named ``holder`` in the lease row. ``kill_in_launch``: the chance it
        SIGKILLs itself at each unit start, between the unit's mkdir and its pid record, or just
        after the init started (seeded); ``kill_first_launch``: at its first unit start, for sure."""
        env = {**self._base_env(), **self._env(holder, kill_in_launch, seed, kill_first_launch)}
        log = self.logs / f"managers-{holder}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen([sys.executable, str(CHILD), str(self.config)], env=env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        managers = Managers(holder, proc, log)
        self.started.append(managers)
        return managers

    def fork(self, holder: str, kill_in_launch: float = 0.0, seed: int = 0, kill_first_launch: bool = False) -> Managers:
        """As ``start``, forked from a zygote that imported DLTS once (a fresh process in milliseconds)."""
        if self._zygote is None:
            self._zygote = subprocess.Popen([sys.executable, str(CHILD), "--zygote"], env=self._base_env(),
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert self._zygote.stdout.readline().strip() == "ready"
        log = self.logs / f"managers-{holder}.log"
        order = {"config": str(self.config), "log": str(log),
                 "env": self._env(holder, kill_in_launch, seed, kill_first_launch)}
        self._zygote.stdin.write(json.dumps(order) + "\n")
        self._zygote.stdin.flush()
        managers = Managers(holder, Forked(int(self._zygote.stdout.readline())), log)  # type: ignore[arg-type]
        self.started.append(managers)
        return managers

    def close(self) -> None:
        for m in self.started:
            m.kill()
        if self._zygote is not None:
            self._zygote.kill()
            self._zygote.wait(10)


def lease_row(sessions) -> tuple[str, int, float] | None:
    """(holder, token, expires_at) of the managers' lease, None before anyone took it."""
    with sessions() as s:
        row = s.get(ManagersLease, "managers")
        return None if row is None else (row.holder, row.token, row.expires_at)


def wait_for_holder(sessions, holder: str, timeout_s: float, also=None, logs=()) -> float:
    """Seconds until the lease row names ``holder`` (``also()`` is called on each poll: a process
    that must stay alive, a submitter). ``logs``: the managers whose log tails a failure shows."""
    began = time.monotonic()
    while True:
        row = lease_row(sessions)
        if row is not None and row[0] == holder:
            return time.monotonic() - began
        if also is not None:
            also()
        if time.monotonic() - began >= timeout_s:
            tails = "".join(f"\n--- {m.holder}:\n" + "\n".join(m.log_text().splitlines()[-25:]) for m in logs)
            raise AssertionError(f"{holder} did not take the lease in {timeout_s} s: {row}{tails}")
        time.sleep(0.05)


def wait_for_node(sessions, timeout_s: float) -> None:
    """Until the managers' job manager has registered this machine's node (its first tick)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with sessions() as s:
            if s.scalar(sa.select(sa.func.count(Node.id)).where(Node.ready.is_(True), Node.sku == "demo-gpu")):
                return
        assert time.monotonic() < deadline, "the managers registered no node"
        time.sleep(0.1)


def ledger_runs(ledger: Path) -> collections.Counter:
    if not ledger.exists():
        return collections.Counter()
    return collections.Counter(tuple(int(x) for x in line.split()) for line in ledger.read_text().splitlines() if line.strip())


def attempts_of(sessions, job_ids) -> dict[tuple[int, int], JobAttempt]:
    with sessions() as s:
        rows = list(s.scalars(sa.select(JobAttempt).where(JobAttempt.job_id.in_(list(job_ids)))))
        s.expunge_all()
    return {(a.job_id, a.number): a for a in rows}


def statuses(sessions, job_ids) -> dict[int, JobStatus]:
    with sessions() as s:
        return dict(s.execute(sa.select(Job.id, Job.status).where(Job.id.in_(list(job_ids)))).all())


def wait_all_ended(sessions, job_ids, timeout_s: float, also=None) -> float:
    began = time.monotonic()
    while True:
        st = statuses(sessions, job_ids)
        if len(st) == len(job_ids) and not any(v in ACTIVE or v is JobStatus.QUEUED for v in st.values()):
            return time.monotonic() - began
        if also is not None:
            also()
        assert time.monotonic() - began < timeout_s, collections.Counter(v.value for v in st.values())
        time.sleep(0.2)


def assert_once_per_attempt(sessions, job_ids, ledger: Path) -> dict[str, int]:
    """Every job finished; each recorded attempt's command ran exactly once and nothing ran
    outside a recorded attempt; no attempt left open. Returns figures for the report."""
    st = statuses(sessions, job_ids)
    assert {v for v in st.values()} == {JobStatus.FINISHED}, collections.Counter(v.value for v in st.values())
    attempts = attempts_of(sessions, job_ids)
    runs = ledger_runs(ledger)
    twice = {k: n for k, n in runs.items() if n != 1}
    assert not twice, f"commands run more than once: {twice}"
    assert set(runs) == set(attempts), (sorted(set(runs) - set(attempts)), sorted(set(attempts) - set(runs)))
    assert all(a.ended_at is not None for a in attempts.values())
    return {"jobs": len(job_ids), "attempts": len(attempts), "runs": sum(runs.values())}


class Submitter:
    """Submits jobs through the real API (HTTP) from a thread, one every ``every_s``; keeps the id
    of each accepted one and the status of each answer."""

    def __init__(self, url: str, token: str, command: str, count: int, every_s: float, gpus: int = 1):
        self.url, self.token, self.command, self.count, self.every_s, self.gpus = url, token, command, count, every_s, gpus
        self.accepted: list[int] = []
        self.answers: collections.Counter = collections.Counter()
        self.log: list[tuple[float, int]] = []  # (monotonic, status) of each answer; 0: no answer
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._stop = threading.Event()

    def start(self) -> Submitter:
        self._thread.start()
        return self

    def _run(self) -> None:
        session = requests.Session()
        for i in range(self.count):
            if self._stop.is_set():
                return
            try:
                r = session.post(f"{self.url}/api/v1/jobs", headers={"Authorization": f"Bearer {self.token}"}, timeout=30,
                                 json={"vc": "vision", "image": "debian:12", "command": self.command, "gpus": self.gpus,
                                       "name": f"chaos-{i}"})
                status = r.status_code
                if status == 201:
                    self.accepted.append(r.json()["id"])
                elif not _envelope(r):
                    status = -status  # an answer without the API's error envelope
            except requests.RequestException:
                status = 0
            self.answers[status] += 1
            self.log.append((time.monotonic(), status))
            time.sleep(self.every_s)

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the submitter did not finish"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def _envelope(r: requests.Response) -> bool:
    try:
        return bool(r.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return False


class ApiServer:
    """The real Flask app over HTTP on loopback, in a thread (no job manager with it)."""

    def __init__(self, app):
        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def __enter__(self) -> ApiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()


def figures(name: str, values: dict) -> None:
    """Append this run's figures (for docs/reliability.md) to $DLTS_CHAOS_FIGURES, when set."""
    target = os.environ.get("DLTS_CHAOS_FIGURES")
    line = json.dumps({"test": name, **values}, sort_keys=True)
    print(f"chaos figures: {line}")
    if target:
        with open(target, "a") as fh:
            fh.write(line + "\n")
