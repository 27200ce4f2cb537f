"""Jobs collector: which DLTS job each process on this node belongs to, and which GPUs it holds.

A process belongs to a job only by what its own processes cannot write (docs/agent.md, "Job
attribution"); its environment is never trusted, since any process can set ``DLTS_JOB_ID``:

* Kubernetes (containerd): ``/proc/PID/cgroup`` names the process's
  container (the last path component: the containerd container id, bare under the cgroupfs
  driver, ``cri-containerd-<id>.scope`` under systemd) below its pod's ``pod<uid>`` cgroup. The
  container's OCI bundle, which containerd writes as root, is
  ``<containerd_state_dir>/io.containerd.runtime.v2.task/<namespace>/<id>/config.json``: its
  ``process.env`` is the environment the kubelet gave the container (the job's ``DLTS_*`` labels
  and the device plugin's ``NVIDIA_VISIBLE_DEVICES``) and its annotations name the pod. A bundle is
  read once per container (it does not change while the container lives).
* Local backend (with ``local_run_dir``: the demo, a managers host running jobs): each unit directory under the run directory
  holds the ``pid`` record its DLTS init wrote (pid, start time, start ticks) and the ``spec.json``
  the backend wrote, whose ``job_env`` holds the unit's labels and ``CUDA_VISIBLE_DEVICES``. The
  inits are child subreapers, so every process of the unit descends from its init: a process
  belongs to the unit's job iff it descends from the live init the record names.

GPUs come from the trusted environment only: ``NVIDIA_VISIBLE_DEVICES`` UUIDs (the device plugin's)
or, where that is absent, ``CUDA_VISIBLE_DEVICES`` (the local backend's host indices). NVML's
running-process pids on a GPU link it to a job only through the pid's attribution here
(``JobsSample.by_pid``). A process whose environment claims a job but which neither source
attributes books nothing; it is counted (``JobsSample.unattributed``) and logged once.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from dlts_agent.model import JobLabels, JobsSample, JobUsage

log = logging.getLogger(__name__)

_MARKER = b"DLTS_JOB_ID="
RUNTIME_DIR = "io.containerd.runtime.v2.task"  # containerd's runtime v2 task state, one bundle per container
# the container id a cgroup path ends in: bare (cgroupfs driver) or cri-containerd-<id>.scope (systemd)
_CONTAINER = re.compile(r"^(?:cri-containerd-)?([0-9a-f]{64})(?:\.scope)?$")
SANDBOX_UID = "io.kubernetes.cri.sandbox-uid"


@dataclass(frozen=True)
class _Attribution:
    labels: JobLabels
    uuids: tuple[str, ...]
    indices: tuple[int, ...]
    junk: tuple[str, ...]
    pod_uid: str = ""  # Kubernetes: the pod the bundle names (its cgroup must be below that pod's)


class JobsCollector:
    name = "jobs"

    def __init__(self, proc_root: str = "/proc", *, clock: Callable[[], float] = time.monotonic,
                 clock_ticks: int | None = None, page_bytes: int | None = None, local_run_dir: str = "",
                 containerd_state_dir: str = "/run/containerd", containerd_namespace: str = "k8s.io") -> None:
        self.proc_root = proc_root
        self.local_run_dir = local_run_dir
        self.containerd_state_dir = containerd_state_dir
        self.containerd_namespace = containerd_namespace
        self.clock = clock
        self.clock_ticks = clock_ticks or _sysconf("SC_CLK_TCK", 100)
        self.page_bytes = page_bytes or _sysconf("SC_PAGE_SIZE", 4096)
        self._ticks: dict[int, tuple[int, int]] = {}  # pid -> (start time, CPU ticks) at the last collection
        self._at: float | None = None
        self._logged: set[str] = set()  # problems logged already: each once while it lasts
        self._bundles: dict[str, _Attribution | None] = {}  # container id -> its job (None: not a DLTS job)

    def collect(self) -> tuple[JobsSample, list[str]]:
        now = self.clock()
        errors: list[str] = []
        stats = self._stats()
        owner = self._local_owners(stats, errors) if self.local_run_dir else {}
        for pid, contained in self._container_owners(stats, errors).items():
            owner.setdefault(pid, contained)
        ticks: dict[int, tuple[int, int]] = {}
        usage: dict[str, list] = {}  # job id -> [pids, delta ticks, any delta known, rss bytes]
        by_pid: dict[int, JobLabels] = {}
        by_uuid: dict[str, JobLabels] = {}
        by_index: dict[int, JobLabels] = {}
        claims: list[str] = []
        for pid, (_, start, cpu) in stats.items():
            found = owner.get(pid)
            if found is None:
                claimed = self._claim(pid)
                if claimed is not None:
                    claims.append(f"pid {pid} claims job {claimed[:64]!r} in its environment but belongs to no job; "
                                  "nothing booked")
                continue
            by_pid[pid] = found.labels
            self._add_usage(pid, start, cpu, found.labels.job_id, ticks, usage)
            for uuid in found.uuids:
                by_uuid[uuid] = found.labels
            for index in found.indices:
                by_index[index] = found.labels
            # the job stays known (a reboot still waits for it); only its unreadable GPU entries go
            errors.extend(f"job {found.labels.job_id}: malformed CUDA_VISIBLE_DEVICES entry {dev[:32]!r} skipped"
                          for dev in found.junk)
        for problem in (set(errors) | set(claims)) - self._logged:
            log.warning("jobs collector: %s", problem)
        self._logged = set(errors) | set(claims)
        elapsed = now - self._at if self._at is not None else 0.0
        self._ticks, self._at = ticks, now
        jobs = {job: JobUsage(pids=n, memory_bytes=rss,
                              cpu_cores=round(d / self.clock_ticks / elapsed, 3) if known and elapsed > 0 else None)
                for job, (n, d, known, rss) in usage.items()}
        return JobsSample(by_gpu_uuid=by_uuid, by_gpu_index=by_index, by_pid=by_pid, usage=jobs,
                          unattributed=len(claims)), errors

    # -- /proc ------------------------------------------------------------------------------------
    def _stats(self) -> dict[int, tuple[int, int, int]]:
        """pid -> (parent pid, start ticks since boot, CPU ticks) of every live process."""
        stats: dict[int, tuple[int, int, int]] = {}
        for entry in os.listdir(self.proc_root):
            if not (entry.isascii() and entry.isdigit()):
                continue
            try:
                with open(os.path.join(self.proc_root, entry, "stat"), "rb") as f:
                    # the fields after the command name, which may hold spaces and parentheses
                    fields = f.read().rsplit(b")", 1)[1].split()
                if fields[0] == b"Z":
                    continue  # a zombie runs nothing and has no children left: no one's process
                # ppid, utime + stime, starttime
                stats[int(entry)] = (int(fields[1]), int(fields[19]), int(fields[11]) + int(fields[12]))
            except (OSError, IndexError, ValueError):
                continue  # exited meanwhile
        return stats

    def _claim(self, pid: int) -> str | None:
        """The job a process's environment claims (a hint, never trusted); None when it claims none,
        or, with ``local_run_dir``, when it names another local backend's run directory (a second
        demo's or a test run's job: not this node's business)."""
        try:
            with open(os.path.join(self.proc_root, str(pid), "environ"), "rb") as f:
                raw = f.read()
        except OSError:
            return None
        if _MARKER not in raw:
            return None
        env = _parse_environ(raw)
        if self.local_run_dir and env.get("DLTS_RUN_DIR") not in (None, self.local_run_dir):
            return None
        return env.get("DLTS_JOB_ID", "")

    # -- local backend ----------------------------------------------------------------------------
    def _local_owners(self, stats: dict[int, tuple[int, int, int]], errors: list[str]) -> dict[int, _Attribution]:
        """pid -> its unit's job: the processes that descend from a unit's live DLTS init."""
        inits: dict[int, _Attribution] = {}
        for unit in _local_units(self.local_run_dir):
            record = _pid_record(unit)
            if record is None:
                continue
            pid, ticks = record
            if pid not in stats or stats[pid][1] != ticks:
                continue  # the init ended; a process now holding its pid is not the job's
            try:
                with open(os.path.join(unit, "spec.json"), "rb") as f:
                    job_env = json.load(f)["job_env"]
                inits[pid] = _attribution({str(k): str(v) for k, v in job_env.items()})
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                errors.append(f"{unit}: no job labels in spec.json ({type(e).__name__}); its processes skipped")
        owner: dict[int, _Attribution] = {}
        if not inits:
            return owner
        seen: dict[int, _Attribution | None] = {}
        for pid in stats:
            chain: list[int] = []
            found: _Attribution | None = None
            at = pid
            while at > 0 and at not in seen and len(chain) <= len(stats):
                chain.append(at)
                if at in inits:
                    found = inits[at]
                    break
                at = stats[at][0] if at in stats else 0
            else:
                if at in seen:
                    found = seen[at]
            for p in chain:
                seen[p] = found
            if found is not None:
                owner[pid] = found
        return owner

    # -- Kubernetes (containerd) ------------------------------------------------------------------
    def _container_owners(self, stats: dict[int, tuple[int, int, int]], errors: list[str]) -> dict[int, _Attribution]:
        """pid -> its container's job, for the processes in a DLTS job's container."""
        owner: dict[int, _Attribution] = {}
        live: set[str] = set()
        for pid in stats:
            found = self._container_of(pid)
            if found is None:
                continue
            container, path = found
            live.add(container)
            attribution = self._bundle(container, errors)
            if attribution is None:
                continue
            if attribution.pod_uid and not _in_pod(path, attribution.pod_uid):
                errors.append(f"pid {pid}: container {container[:12]} outside its pod's cgroup; process skipped")
                continue
            owner[pid] = attribution
        for gone in set(self._bundles) - live:
            del self._bundles[gone]
        return owner

    def _container_of(self, pid: int) -> tuple[str, str] | None:
        """(container id, cgroup path) of a process in a container; None outside any, or when its
        cgroup hierarchies name different containers."""
        try:
            with open(os.path.join(self.proc_root, str(pid), "cgroup")) as f:
                lines = f.read().splitlines()
        except OSError:
            return None
        found: dict[str, str] = {}
        for line in lines:
            path = line.split(":", 2)[-1]
            m = _CONTAINER.match(path.rstrip("/").rsplit("/", 1)[-1])
            if m:
                found[m.group(1)] = path
        return next(iter(found.items())) if len(found) == 1 else None

    def _bundle(self, container: str, errors: list[str]) -> _Attribution | None:
        if container in self._bundles:
            return self._bundles[container]
        path = os.path.join(self.containerd_state_dir, RUNTIME_DIR, self.containerd_namespace, container, "config.json")
        try:
            with open(path, "rb") as f:
                spec = json.load(f)
        except FileNotFoundError:
            return None  # another runtime's or namespace's container: not cached, it may be one yet
        except (OSError, ValueError) as e:
            errors.append(f"container {container[:12]}: unreadable bundle ({type(e).__name__}); its processes skipped")
            return None
        attribution: _Attribution | None = None
        try:
            env = dict(item.partition("=")[::2] for item in spec["process"]["env"] if isinstance(item, str))
            # inside a container CUDA_VISIBLE_DEVICES indices are renumbered: only the device plugin's UUIDs count
            env.pop("CUDA_VISIBLE_DEVICES", None)
            if env.get("DLTS_JOB_ID", "").strip():
                attribution = _attribution(env, str((spec.get("annotations") or {}).get(SANDBOX_UID, "")))
        except (KeyError, TypeError, AttributeError):
            pass  # no process environment: not a DLTS job's container (a pod sandbox has one)
        self._bundles[container] = attribution
        return attribution

    def _add_usage(self, pid: int, start: int, cpu: int, job_id: str, ticks: dict[int, tuple[int, int]],
                   usage: dict[str, list]) -> None:
        entry = usage.setdefault(job_id, [0, 0, False, 0])
        entry[0] += 1
        ticks[pid] = (start, cpu)
        before = self._ticks.get(pid)
        if before is not None and before[0] == start and cpu >= before[1]:
            entry[1] += cpu - before[1]
            entry[2] = True
        try:
            with open(os.path.join(self.proc_root, str(pid), "statm"), "rb") as f:
                entry[3] += int(f.read().split()[1]) * self.page_bytes
        except (OSError, IndexError, ValueError):
            pass

    def close(self) -> None:
        pass


def _local_units(run_dir: str) -> list[str]:
    """The local backend's unit directories: ``<job>-<attempt>/`` and its ``replicas/<index>/``
    (src/dlts/backends/local.py lays them out)."""
    units: list[str] = []
    try:
        attempts = os.listdir(run_dir)
    except OSError:
        return units
    for name in attempts:
        job, sep, attempt = name.partition("-")
        if not (sep and job.isdigit() and attempt.isdigit()):
            continue
        run = os.path.join(run_dir, name)
        units.append(run)
        try:
            units += [os.path.join(run, "replicas", r) for r in os.listdir(os.path.join(run, "replicas")) if r.isdigit()]
        except OSError:
            pass
    return units


def _pid_record(unit: str) -> tuple[int, int] | None:
    """(pid, start ticks since boot) from a unit's ``pid`` record. The DLTS init writes it
    (``PID START_TIME TICKS``, dlts_init._start_record); the backend reads it in
    LocalBackend._identify. The agent is installed without the dlts package, hence this reader of
    its own. A record without ticks (an init older than them) cannot be matched exactly: skipped."""
    try:
        with open(os.path.join(unit, "pid")) as f:
            fields = f.read().split()
        return int(fields[0]), int(fields[2])
    except (OSError, ValueError, IndexError):
        return None


def _in_pod(cgroup_path: str, pod_uid: str) -> bool:
    """Whether a cgroup path is below the pod's cgroup (``pod<uid>``; systemd writes the uid's dashes as
    underscores: ``kubepods-besteffort-pod<uid>.slice``)."""
    parts = cgroup_path.split("/")
    wanted = (f"pod{pod_uid}", f"pod{pod_uid.replace('-', '_')}")
    return any(part.removesuffix(".slice").endswith(wanted) for part in parts)


def _attribution(env: dict[str, str], pod_uid: str = "") -> _Attribution:
    labels, uuids, indices, junk = _labels_and_gpus(env)
    return _Attribution(labels, tuple(uuids), tuple(indices), tuple(junk), pod_uid)


def _labels_and_gpus(env: dict[str, str]) -> tuple[JobLabels, list[str], list[int], list[str]]:
    """(labels, GPU UUIDs, GPU indices, CUDA_VISIBLE_DEVICES entries that are neither) from a job's
    trusted environment (its container's bundle, or what the local backend wrote)."""
    labels = JobLabels(
        job_id=env.get("DLTS_JOB_ID", "").strip(),
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
        if sep and key.startswith(b"DLTS_"):
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip() and v.strip() not in ("all", "none", "void")]
