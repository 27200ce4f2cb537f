"""Fixtures for the Kubernetes backend tests: a fake API server on loopback, the real client through
a kubeconfig, a fake clock shared by the server's kubelet and the backend, and spec builders."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from dlts.backends.base import LaunchSpec
from dlts.backends.kubernetes import KubernetesBackend, KubernetesSettings
from dlts.jobmanager import JobManager
from dlts.models import Job, JobAttempt, User
from dlts.scheduler.model import Placement
from dlts.services import admin
from dlts.services import jobs as job_service
from dlts.services.auth import principal_for
from tests.fakes.kube_apiserver import FakeClock, FakeKubeApiServer

ROOT = Path(__file__).resolve().parents[2]

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
def log_dir(tmp_path) -> Path:
    """The log store the Kubernetes backend copies pod output into."""
    return tmp_path / "logs"


LOG_MAX_BYTES = 1024 * 1024


@pytest.fixture
def make_backend(api, kubeconfig, log_dir):
    made: list[KubernetesBackend] = []

    def make(*, node_lost_after_s: float = 60.0, **overrides) -> KubernetesBackend:
        settings = KubernetesSettings(kubeconfig=str(kubeconfig), namespace="default", **overrides)
        backend = KubernetesBackend(settings, log_dir=log_dir, log_max_bytes=LOG_MAX_BYTES,
                                    node_lost_after_s=node_lost_after_s, clock=api.clock)
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
              "image": "pytorch/pytorch:2.3", "command": command, "uid": 1000, "gid": 1000,
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


# -- end to end through the job manager (test_k8s_jobmanager, test_k8s_inference_scaling) -----------

@pytest.fixture
def vision_quota() -> int:
    """a100 GPUs of VC vision in the job-manager tests (a module overrides it)."""
    return 16


@pytest.fixture
def cluster(sessions, vision_quota):
    with sessions() as s:
        admin.add_vc(s, "vision", {"a100": vision_quota})
        admin.add_vc(s, "spare", {"a100": 0})
        # jobs run as their owner's uid/gid: an owner without them is refused at launch
        for uid, name in enumerate(("alice", "bob"), start=1000):
            admin.add_user(s, name, uid=uid, gid=uid)
        admin.add_member(s, "vision", "alice")
        admin.add_member(s, "spare", "bob")
    return sessions


class Harness:
    def __init__(self, api, sessions, settings, make_backend, watch: bool):
        self.api, self.sessions, self.settings = api, sessions, settings
        self.make_backend = lambda: make_backend(watch=watch)
        self.backend = self.make_backend()
        self.manager = JobManager(sessions, self.backend, settings, clock=api.clock)

    def restart(self) -> None:
        """A new managers process: fresh backend (no memory) and job manager over the same DB."""
        self.backend = self.make_backend()
        self.manager = JobManager(self.sessions, self.backend, self.settings, clock=self.api.clock)

    def submit(self, user: str = "alice", vc: str = "vision", **kw) -> int:
        with self.sessions() as s:
            principal = principal_for(s, s.scalar(sa.select(User).where(User.name == user)))
            req = job_service.JobRequest(vc=vc, image="pytorch/pytorch:2.3", **{"command": "sleep 10", **kw})
            return job_service.submit(s, self.settings, principal, req).id

    def kill(self, job_id: int, user: str = "alice") -> None:
        with self.sessions() as s:
            job_service.kill(s, principal_for(s, s.scalar(sa.select(User).where(User.name == user))), job_id)

    def tick(self, seconds: float = 0.0) -> None:
        if seconds:
            self.api.run_until_idle(seconds)
        else:
            self.api.kubelet.tick()
        self.manager_tick()

    def manager_tick(self) -> None:
        caught_up(self.api, self.backend)  # with a watch: let the pod events arrive first
        self.manager.tick()

    def job(self, job_id: int) -> Job:
        with self.sessions() as s:
            job = s.get(Job, job_id)
            s.expunge(job)
            return job

    def attempts(self, job_id: int) -> list[JobAttempt]:
        with self.sessions() as s:
            rows = list(s.scalars(sa.select(JobAttempt).where(JobAttempt.job_id == job_id).order_by(JobAttempt.number)))
            for row in rows:
                s.expunge(row)
            return rows


@pytest.fixture(params=["list", "watch"])
def h(request, api, cluster, settings, make_backend) -> Harness:
    harness = Harness(api, cluster, settings, make_backend, watch=request.param == "watch")
    with cluster() as s:
        harness.manager.sync_nodes(s)
    return harness


def affinity_node(pod: dict) -> str | None:
    """The node DLTS chose for the pod: its required node affinity on ``metadata.name``. Pods are not
    bound with ``nodeName``; kube-scheduler (the fake's scheduler) binds them there on its next pass."""
    required = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    for term in required.get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("operator") == "In" and len(field["values"]) == 1:
                return str(field["values"][0])
    return None


def env_of(pod: dict) -> dict[str, str | None]:
    """The main container's environment by name (None for values taken from a secret or field)."""
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
