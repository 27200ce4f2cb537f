"""Jobs collector: which DLTS job holds which GPU on this node.

Backends start every job process with ``DLTS_JOB_ID``, ``DLTS_USER``, ``DLTS_VC`` and
``DLTS_PREEMPTIBLE`` in its environment (the contract in docs/agent.md). We scan
``/proc/*/environ`` for them and link a job to GPUs in this order of trust:
1. NVML's running-process pids on each GPU (host pids; the GPU collector supplies them),
2. ``NVIDIA_VISIBLE_DEVICES`` when it lists GPU UUIDs (what the Kubernetes device plugin sets),
3. ``CUDA_VISIBLE_DEVICES`` indices, only when NVIDIA_VISIBLE_DEVICES is absent (inside a container
   the indices are renumbered, so they mean nothing on the host).
"""

from __future__ import annotations

import os

from dlts_agent.model import JobLabels, JobsSample

_MARKER = b"DLTS_JOB_ID="


class JobsCollector:
    name = "jobs"

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root

    def collect(self) -> tuple[JobsSample, list[str]]:
        errors: list[str] = []
        by_pid: dict[int, JobLabels] = {}
        by_uuid: dict[str, JobLabels] = {}
        by_index: dict[int, JobLabels] = {}
        for entry in os.listdir(self.proc_root):
            if not entry.isdigit():
                continue
            try:
                with open(os.path.join(self.proc_root, entry, "environ"), "rb") as f:
                    raw = f.read()
            except OSError:
                continue  # exited meanwhile, or a kernel thread: not ours
            if _MARKER not in raw:
                continue
            env = _parse_environ(raw)
            job_id = env.get("DLTS_JOB_ID", "").strip()
            if not job_id:
                errors.append(f"pid {entry}: empty DLTS_JOB_ID")
                continue
            labels = JobLabels(
                job_id=job_id,
                user=env.get("DLTS_USER", ""),
                vc=env.get("DLTS_VC", ""),
                preemptible=env.get("DLTS_PREEMPTIBLE", "").lower() in ("1", "true", "yes"),
            )
            by_pid[int(entry)] = labels
            nvidia = env.get("NVIDIA_VISIBLE_DEVICES")
            if nvidia is not None:
                for dev in _split(nvidia):
                    if dev.startswith(("GPU-", "MIG-")):
                        by_uuid[dev] = labels
                continue
            cuda = env.get("CUDA_VISIBLE_DEVICES")
            if cuda is not None:
                for dev in _split(cuda):
                    if dev.isdigit():
                        by_index[int(dev)] = labels
                    elif dev.startswith(("GPU-", "MIG-")):
                        by_uuid[dev] = labels
                    else:
                        errors.append(f"pid {entry}: malformed CUDA_VISIBLE_DEVICES entry {dev!r}")
        return JobsSample(by_gpu_uuid=by_uuid, by_gpu_index=by_index, by_pid=by_pid), errors

    def close(self) -> None:
        pass


def _parse_environ(raw: bytes) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.startswith((b"DLTS_", b"CUDA_VISIBLE_DEVICES", b"NVIDIA_VISIBLE_DEVICES")):
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip() and v.strip() not in ("all", "none", "void")]
