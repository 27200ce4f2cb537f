"""The ``ClusterBackend`` contract suite's clusters: the local backend with real processes, and the
Kubernetes backend with the official client against the fake API server (``tests.fakes``).

Each ``Cluster`` gives the same handles: ``backend``, ``spec(...)`` (a LaunchSpec for its node,
logging where the backend's log store is), ``settle(until, timeout_s)`` (let time pass: real
time for processes, the fake clock and kubelet for pods, until ``until(observed)`` holds) and
``log(job_id, attempt)`` (the stored log, read as the API reads it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dlts.backends.base import ClusterBackend, LaunchSpec, Observed
from dlts.logstore import head_path, iter_log
from dlts.scheduler.model import Placement

ROOT = Path(__file__).resolve().parents[2]

GIB = 1024**3


@dataclass
class Cluster:
    kind: str
    backend: ClusterBackend
    log_dir: Path
    node: str
    advance: Callable[[float], None]  # let this much time pass

    def spec(self, job_id: int, command: str, *, attempt: int = 1, **kw) -> LaunchSpec:
        values = {"job_id": job_id, "attempt": attempt, "user": "alice", "vc": "vision", "type": "batch",
                  "image": "python:3.11", "command": command,
                  "placements": (Placement(node=self.node, gpu_indices=(), cpu=1.0, memory_bytes=GIB),),
                  "log_path": str(head_path(self.log_dir, job_id, attempt, key=self.log_key(job_id, attempt))),
                  "log_key": self.log_key(job_id, attempt), "uid": 1000, "gid": 1000}
        values.update(kw)
        return LaunchSpec(**values)

    def observe(self) -> dict[tuple[int, int], Observed]:
        return {(o.job_id, o.attempt): o for o in self.backend.observe()}

    def settle(self, until: Callable[[dict[tuple[int, int], Observed]], bool], timeout_s: float = 20.0,
               step_s: float = 0.5) -> dict[tuple[int, int], Observed]:
        waited = 0.0
        while True:
            seen = self.observe()
            if until(seen):
                return seen
            if waited >= timeout_s:
                raise AssertionError(f"{self.kind}: not settled after {timeout_s} s: {seen}")
            self.advance(step_s)
            waited += step_s

    @staticmethod
    def log_key(job_id: int, attempt: int) -> str:
        """The attempt's log key, as the job manager makes one with the attempt row (16 hex digits)."""
        return f"{job_id:08x}{attempt:08x}"

    def log(self, job_id: int, attempt: int = 1) -> bytes:
        return b"".join(iter_log(self.log_dir, job_id, attempt, key=self.log_key(job_id, attempt)))


def _local(tmp_path: Path) -> Iterator[Cluster]:
    from dlts.backends.local import LocalBackend

    backend = LocalBackend(tmp_path / "run", node_name="n1")
    yield Cluster("local", backend, tmp_path / "logs", "n1", time.sleep)
    for run in (tmp_path / "run").iterdir():
        key = LocalBackend._parse(run.name)
        if key is not None:
            backend.forget(*key)
    backend.close()


def _kubernetes(tmp_path: Path) -> Iterator[Cluster]:
    from dlts.backends.k8s_settings import KubernetesSettings
    from dlts.backends.kubernetes import KubernetesBackend
    from tests.fakes.kube_apiserver import FakeClock, FakeKubeApiServer

    with FakeKubeApiServer(FakeClock()) as api:
        api.add_node("n1", gpus=8)
        settings = KubernetesSettings(kubeconfig=str(api.write_kubeconfig(tmp_path / "kubeconfig")), namespace="default")
        backend = KubernetesBackend(settings, log_dir=tmp_path / "logs", log_max_bytes=1024 * 1024, clock=api.clock)
        api.kubelet.tick()
        yield Cluster("kubernetes", backend, tmp_path / "logs", "n1", lambda s: api.run_until_idle(s))
        backend.close()


@pytest.fixture(params=["local", "kubernetes"])
def cluster(request, tmp_path) -> Iterator[Cluster]:
    yield from (_local if request.param == "local" else _kubernetes)(tmp_path)
