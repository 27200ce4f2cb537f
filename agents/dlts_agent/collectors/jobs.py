"""Jobs collector: which DLTS job holds which GPU on this node.

Backends start every job process with ``DLTS_JOB_ID``, ``DLTS_USER``, ``DLTS_VC`` and
``DLTS_PREEMPTIBLE`` in its environment (the contract in docs/agent.md). We scan
``/proc/*/environ`` for them and link a job to GPUs in this order of trust:
1. NVML's running-process pids on each GPU (host pids; the GPU collector supplies them),
2. ``NVIDIA_VISIBLE_DEVICES`` when it lists GPU UUIDs (what the Kubernetes device plugin sets),
3. ``CUDA_VISIBLE_DEVICES`` indices, only when NVIDIA_VISIBLE_DEVICES is absent (inside a container
   the indices are renumbered, so they mean nothing on the host).
With ``local_run_dir`` only the processes whose ``DLTS_RUN_DIR`` names it count: a demo's agent then
sees its own local backend's jobs, not those of another demo or test run on the same machine.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from dlts_agent.model import JobLabels, JobsSample, JobUsage

log = logging.getLogger(__name__)

_MARKER = b"DLTS_JOB_ID="


class JobsCollector:
    name = "jobs"

    def __init__(self, proc_root: str = "/proc", *, clock: Callable[[], float] = time.monotonic,
                 clock_ticks: int | None = None, page_bytes: int | None = None, local_run_dir: str = "") -> None:
        self.proc_root = proc_root
        self.local_run_dir = local_run_dir
        self.clock = clock
        self.clock_ticks = clock_ticks or _sysconf("SC_CLK_TCK", 100)
        self.page_bytes = page_bytes or _sysconf("SC_PAGE_SIZE", 4096)
        self._ticks: dict[int, tuple[int, int]] = {}  # pid -> (start time, CPU ticks) at the last collection
        self._at: float | None = None
        self._logged: set[str] = set()  # problems logged already: each once while it lasts

    def collect(self) -> tuple[JobsSample, list[str]]:
        now = self.clock()
        ticks: dict[int, tuple[int, int]] = {}
        usage: dict[str, list] = {}  # job id -> [pids, delta ticks, any delta known, rss bytes]
        errors: list[str] = []
        by_pid: dict[int, JobLabels] = {}
        by_uuid: dict[str, JobLabels] = {}
        by_index: dict[int, JobLabels] = {}
        for entry in os.listdir(self.proc_root):
            if not (entry.isascii() and entry.isdigit()):
                continue
            try:
                with open(os.path.join(self.proc_root, entry, "environ"), "rb") as f:
                    raw = f.read()
            except OSError:
                continue  # exited meanwhile, or a kernel thread: not ours
            if _MARKER not in raw:
                continue
            env = _parse_environ(raw)
            if self.local_run_dir and env.get("DLTS_RUN_DIR") != self.local_run_dir:
                continue  # another local backend's job (a second demo, a test run): not this node's
            try:
                labels, uuids, indices, junk = _labels_and_gpus(env)
            except ValueError as e:  # junk in one process's environment skips that process only
                errors.append(f"pid {entry}: {e}; process skipped")
                continue
            by_pid[int(entry)] = labels
            self._add_usage(int(entry), labels.job_id, ticks, usage)
            for uuid in uuids:
                by_uuid[uuid] = labels
            for index in indices:
                by_index[index] = labels
            # the job stays known (a reboot still waits for it); only its unreadable GPU entries go
            errors.extend(f"pid {entry}: malformed CUDA_VISIBLE_DEVICES entry {dev[:32]!r} skipped" for dev in junk)
        for problem in set(errors) - self._logged:
            log.warning("jobs collector: %s", problem)
        self._logged = set(errors)
        elapsed = now - self._at if self._at is not None else 0.0
        self._ticks, self._at = ticks, now
        jobs = {job: JobUsage(pids=n, memory_bytes=rss,
                              cpu_cores=round(d / self.clock_ticks / elapsed, 3) if known and elapsed > 0 else None)
                for job, (n, d, known, rss) in usage.items()}
        return JobsSample(by_gpu_uuid=by_uuid, by_gpu_index=by_index, by_pid=by_pid, usage=jobs), errors

    def _add_usage(self, pid: int, job_id: str, ticks: dict[int, tuple[int, int]], usage: dict[str, list]) -> None:
        entry = usage.setdefault(job_id, [0, 0, False, 0])
        entry[0] += 1
        base = os.path.join(self.proc_root, str(pid))
        try:
            with open(os.path.join(base, "stat"), "rb") as f:
                # the fields after the command name, which may hold spaces and parentheses
                fields = f.read().rsplit(b")", 1)[1].split()
            cpu, start = int(fields[11]) + int(fields[12]), int(fields[19])  # utime + stime, starttime
        except (OSError, IndexError, ValueError):
            cpu = start = -1
        if start >= 0:
            ticks[pid] = (start, cpu)
            before = self._ticks.get(pid)
            if before is not None and before[0] == start and cpu >= before[1]:
                entry[1] += cpu - before[1]
                entry[2] = True
        try:
            with open(os.path.join(base, "statm"), "rb") as f:
                entry[3] += int(f.read().split()[1]) * self.page_bytes
        except (OSError, IndexError, ValueError):
            pass

    def close(self) -> None:
        pass


def _labels_and_gpus(env: dict[str, str]) -> tuple[JobLabels, list[str], list[int], list[str]]:
    """(labels, GPU UUIDs, GPU indices, CUDA_VISIBLE_DEVICES entries that are neither) of one job
    process; ValueError when the process cannot be trusted at all (no job id)."""
    job_id = env.get("DLTS_JOB_ID", "").strip()
    if not job_id:
        raise ValueError("empty DLTS_JOB_ID")
    labels = JobLabels(
        job_id=job_id,
        user=env.get("DLTS_USER", ""),
        vc=env.get("DLTS_VC", ""),
        preemptible=env.get("DLTS_PREEMPTIBLE", "").lower() in ("1", "true", "yes"),
    )
    uuids: list[str] = []
    indices: list[int] = []
    junk: list[str] = []
    nvidia = env.get("NVIDIA_VISIBLE_DEVICES")
    if nvidia is not None:
        uuids = [dev for dev in _split(nvidia) if dev.startswith(("GPU-", "MIG-"))]
        return labels, uuids, indices, junk
    for dev in _split(env.get("CUDA_VISIBLE_DEVICES") or ""):
        # str.isdigit() is true for '²' and other digits int() refuses: ASCII digits only
        if dev.isascii() and dev.isdigit() and len(dev) <= 4:
            indices.append(int(dev))
        elif dev.startswith(("GPU-", "MIG-")):
            uuids.append(dev)
        else:
            junk.append(dev)
    return labels, uuids, indices, junk


def _sysconf(name: str, default: int) -> int:
    try:
        return int(os.sysconf(name))
    except (ValueError, OSError, AttributeError):
        return default


def _parse_environ(raw: bytes) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.startswith((b"DLTS_", b"CUDA_VISIBLE_DEVICES", b"NVIDIA_VISIBLE_DEVICES")):
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip() and v.strip() not in ("all", "none", "void")]
