"""The local backend: each attempt is a real process tree on this machine (the demo's executor).

An attempt lives in ``<run_dir>/<job>-<attempt>/``: ``pid`` (pid and start time, so a reused pid is
never mistaken for the job), ``exit`` (written by the DLTS init when the command ends), ``kill_at``
(the SIGKILL deadline after a SIGTERM) and ``stopped`` (the demo shut down under it). Because the
state is on disk and the job runs in its own session, a restarted job manager adopts running
attempts instead of losing them, and ``launch`` twice never starts two processes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable, Sequence

import psutil

from dlts.backends.base import LaunchSpec, NodeInfo, Observed, RunPhase

log = logging.getLogger(__name__)
INIT_SCRIPT = Path(__file__).with_name("dlts_init.py")
INIT_KILL_AFTER_S = 5.0  # after the SIGKILL deadline, how long the init gets to record the exit


def detect_gpus() -> tuple[str, int] | None:
    """(SKU, count) from NVML when this machine has NVIDIA GPUs, else None."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            return None
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        name = name.decode() if isinstance(name, bytes) else name
        sku = "".join(c if c.isalnum() else "-" for c in name.lower().replace("nvidia", "").strip()).strip("-")
        return sku or "gpu", count
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


class LocalBackend:
    name = "local"

    def __init__(self, run_dir: Path, *, node_name: str | None = None, demo_gpus: int = 0,
                 demo_sku: str = "demo-gpu", clock=time.time):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.node_name = node_name or socket.gethostname().split(".")[0] or "localhost"
        self.clock = clock
        detected = detect_gpus()
        if detected:
            self.sku, self.gpus = detected
        elif demo_gpus:
            self.sku, self.gpus = demo_sku, demo_gpus
        else:
            self.sku, self.gpus = "cpu", 0
        self._children: dict[tuple[int, int], subprocess.Popen] = {}

    # -- paths ----------------------------------------------------------------------------------
    def _dir(self, job_id: int, attempt: int) -> Path:
        return self.run_dir / f"{job_id}-{attempt}"

    @staticmethod
    def _parse(name: str) -> tuple[int, int] | None:
        job, sep, attempt = name.partition("-")
        return (int(job), int(attempt)) if sep and job.isdigit() and attempt.isdigit() else None

    # -- protocol ---------------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> None:
        run = self._dir(spec.job_id, spec.attempt)
        try:
            run.mkdir()
        except FileExistsError:
            return  # launched before (perhaps by a job manager that crashed): nothing to do
        gpu_indices = [i for p in spec.placements for i in p.gpu_indices]
        env = {k: v for k, v in os.environ.items() if not k.startswith("DLTS_")}
        env.update(spec.env)
        env.update({
            "DLTS_JOB_ID": str(spec.job_id), "DLTS_USER": spec.user, "DLTS_VC": spec.vc,
            "DLTS_NUM_GPUS": str(len(gpu_indices)), "DLTS_ATTEMPT": str(spec.attempt),
            "DLTS_PREEMPTIBLE": "1" if spec.preemptible else "0",
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpu_indices)),
        })
        log_path = Path(spec.log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        (run / "spec.json").write_text(json.dumps({"command": spec.command, "log": str(log_path)}))
        with open(log_path, "ab") as out:
            child = subprocess.Popen(
                # -I -S: the init needs only the standard library and must install its signal
                # handlers within milliseconds, before anyone can send it SIGTERM
                [sys.executable, "-I", "-S", str(INIT_SCRIPT), "--exit-file", str(run / "exit"), "--",
                 "/bin/sh", "-c", spec.command],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                cwd=str(log_path.parent), start_new_session=True, close_fds=True,
            )
        self._children[(spec.job_id, spec.attempt)] = child
        started = psutil.Process(child.pid).create_time() if psutil.pid_exists(child.pid) else self.clock()
        tmp = run / "pid.tmp"
        tmp.write_text(f"{child.pid} {started}\n")
        tmp.replace(run / "pid")

    def _process(self, run: Path) -> tuple[psutil.Process | None, float | None]:
        try:
            pid_text, started_text = (run / "pid").read_text().split()
            pid, started = int(pid_text), float(started_text)
        except (FileNotFoundError, ValueError):
            return None, None
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - started) > 1 or proc.status() == psutil.STATUS_ZOMBIE:
                return None, started
            return proc, started
        except psutil.Error:
            return None, started

    def _reap(self) -> None:
        for key, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[key]

    def observe(self) -> Sequence[Observed]:
        self._reap()
        now = self.clock()
        seen = []
        for run in sorted(self.run_dir.iterdir()):
            key = self._parse(run.name)
            if key is None or not run.is_dir():
                continue
            job_id, attempt = key
            exit_file = run / "exit"
            proc, started = self._process(run)
            if exit_file.exists():
                try:
                    code = int(exit_file.read_text().strip())
                except ValueError:
                    code = 1
                if (run / "stopped").exists():
                    seen.append(Observed(job_id, attempt, RunPhase.GONE, code, started, exit_file.stat().st_mtime,
                                         "stopped when the demo shut down", node_lost=True))
                    continue
                phase = RunPhase.SUCCEEDED if code == 0 else RunPhase.FAILED
                seen.append(Observed(job_id, attempt, phase, code, started, exit_file.stat().st_mtime))
            elif proc is not None:
                self._enforce_deadline(run, proc, now)
                seen.append(Observed(job_id, attempt, RunPhase.RUNNING, None, started))
            elif (run / "pid").exists():
                # the process vanished without its init writing an exit code (SIGKILLed init, reboot)
                seen.append(Observed(job_id, attempt, RunPhase.GONE, None, started, now, "the job's process vanished"))
            else:
                seen.append(Observed(job_id, attempt, RunPhase.PENDING))
        return seen

    def _enforce_deadline(self, run: Path, proc: psutil.Process, now: float) -> None:
        try:
            deadline = float((run / "kill_at").read_text())
        except (FileNotFoundError, ValueError):
            return
        if now >= deadline:
            self._kill_tree(proc, include_init=now >= deadline + INIT_KILL_AFTER_S)

    @staticmethod
    def _kill_tree(proc: psutil.Process, include_init: bool) -> None:
        """SIGKILL the job's processes; the init then reaps them and records 137. The init itself
        only when it did not finish by then (it should never need it)."""
        try:
            victims = proc.children(recursive=True) + ([proc] if include_init else [])
        except psutil.Error:
            return
        for victim in victims:
            try:
                victim.kill()
            except psutil.Error:
                pass

    @staticmethod
    def _signal_group(pid: int, sig: int) -> None:
        for target in (lambda: os.killpg(pid, sig), lambda: os.kill(pid, sig)):
            try:
                target()
            except (ProcessLookupError, PermissionError):
                continue

    def terminate(self, job_id: int, attempt: int, grace_s: float) -> None:
        run = self._dir(job_id, attempt)
        if not run.exists() or (run / "exit").exists():
            return
        proc, _ = self._process(run)
        if proc is None:
            return
        if not (run / "kill_at").exists():
            (run / "kill_at").write_text(str(self.clock() + grace_s))
        if grace_s <= 0:
            self._kill_tree(proc, include_init=False)
        else:
            # the init forwards SIGTERM to the job's process group
            self._signal_group(proc.pid, signal.SIGTERM)
        self._reap()

    def forget(self, job_id: int, attempt: int) -> None:
        shutil.rmtree(self._dir(job_id, attempt), ignore_errors=True)
        self._children.pop((job_id, attempt), None)

    def collect_garbage(self, live: Iterable[tuple[int, int]]) -> Sequence[tuple[int, int]]:
        """Stop and remove run records of attempts the database no longer owns."""
        keep = set(live)
        removed = []
        for run in list(self.run_dir.iterdir()):
            key = self._parse(run.name)
            if key is None or key in keep:
                continue
            proc, _ = self._process(run)
            if proc is not None:
                self._kill_tree(proc, include_init=True)
            self.forget(*key)
            removed.append(key)
        return removed

    def nodes(self) -> Sequence[NodeInfo]:
        return [NodeInfo(name=self.node_name, sku=self.sku, gpus=self.gpus, cpu=float(psutil.cpu_count() or 1),
                         memory_bytes=int(psutil.virtual_memory().total), ib_domain="local")]

    def shutdown_running(self, grace_s: float) -> int:
        """Stop every running attempt because the demo stops; they are requeued at the next start."""
        stopped = 0
        for run in self.run_dir.iterdir():
            key = self._parse(run.name)
            if key is None or (run / "exit").exists():
                continue
            proc, _ = self._process(run)
            if proc is None:
                continue
            (run / "stopped").write_text("demo shutdown\n")
            self._signal_group(proc.pid, signal.SIGTERM)
            stopped += 1
        deadline = time.monotonic() + grace_s
        while stopped and time.monotonic() < deadline and any(
                self._process(r)[0] is not None for r in self.run_dir.iterdir() if (r / "stopped").exists()):
            time.sleep(0.1)
        for run in self.run_dir.iterdir():
            if (run / "stopped").exists():
                proc, _ = self._process(run)
                if proc is not None:
                    self._kill_tree(proc, include_init=False)
        self._reap()
        return stopped

    def close(self) -> None:
        self._reap()
