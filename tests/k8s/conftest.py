"""Fixtures for the Kubernetes backend tests: a fake API server on loopback, the real client through
a kubeconfig, a fake clock shared by the server's kubelet and the backend, and spec builders."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests.fakes is imported as a package from the repository root
    sys.path.insert(0, str(ROOT))

from dlts.backends.base import LaunchSpec
from dlts.backends.kubernetes import KubernetesBackend, KubernetesSettings
from dlts.scheduler.model import Placement
from tests.fakes.kube_apiserver import FakeClock, FakeKubeApiServer

GIB = 1024**3
NODES = ("n1", "n2", "n3", "n4")


@pytest.fixture
def api():
    with FakeKubeApiServer(FakeClock()) as server:
        for i, name in enumerate(NODES):
            server.add_node(name, gpus=8, cpu="96", memory="900Gi",
                            labels={"dlts.io/sku": "a100", "dlts.io/ib-domain": f"pod{i // 2}"})
        yield server


@pytest.fixture
def kubeconfig(api, tmp_path) -> Path:
    return api.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def make_backend(api, kubeconfig):
    made: list[KubernetesBackend] = []

    def make(**overrides) -> KubernetesBackend:
        settings = KubernetesSettings(kubeconfig=str(kubeconfig), namespace="default", node_lost_after_s=60,
                                      **overrides)
        backend = KubernetesBackend(settings, clock=api.clock)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


@pytest.fixture
def backend(make_backend) -> KubernetesBackend:
    return make_backend()


def placement(node: str, gpus: int = 1, cpu: float = 8.0, memory_bytes: int = 64 * GIB) -> Placement:
    return Placement(node=node, gpu_indices=tuple(range(gpus)), cpu=cpu, memory_bytes=memory_bytes)


def make_spec(job_id: int = 1, attempt: int = 1, *, command: str = "sleep 10", nodes: tuple[str, ...] = ("n1",),
              gpus: int = 1, type: str = "batch", **kw) -> LaunchSpec:
    values = {"job_id": job_id, "attempt": attempt, "user": "alice", "vc": "vision", "type": type,
              "image": "pytorch/pytorch:2.3", "command": command,
              "placements": tuple(placement(n, gpus) for n in nodes)}
    values.update(kw)
    return LaunchSpec(**values)


def caught_up(api, backend, timeout_s: float = 5.0) -> None:
    """Wait until the backend's pod watch (if it has one) has applied every pod event so far."""
    if backend._watch is None:
        return
    with api.store.lock:
        target = max((rv for rv, _e, res, _ns, _l, _o in api.store.history if res == "pods"), default=0)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rv = backend._watch.resource_version
        if backend._watch.snapshot() is not None and rv is not None and int(rv) >= target:
            return
        time.sleep(0.01)
    raise AssertionError(f"watch stuck at {backend._watch.resource_version}, server at {target}")
