"""Fixtures for the tests against a real Kubernetes (``cluster.py``).

One cluster per test session (``real_cluster``), set up for DLTS the way an operator's playbook does
it: the namespace, the managers' service account, its RBAC and the two PriorityClasses come from the
Ansible role's own ``dlts-rbac.yaml.j2``, and the managers' kubeconfig (the service account's token,
not the cluster admin's certificate) from its ``dlts-kubeconfig.j2``. So a permission DLTS needs and
the role does not grant fails here as it would in production.

``deployed`` is DLTS as ``dlts managers`` runs it: a ``dlts.yaml`` written here, ``load_settings``,
``make_backend`` and the job manager on the real clock. Between tests every DLTS object in the
namespace is deleted and the pods waited for, since every test's database numbers its jobs from 1.

Without a built cache (``python tests/k8s/real/kube_cache.py build``; ``.ci/dev setup`` runs it) or
without root the tests skip, saying which; in CI that is a failure, as is a cluster that does not
come up. A session whose cluster left anything on the host (veths, iptables chains, network
namespaces, processes, mounts) ends with an error naming it.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jinja2
import pytest
import sqlalchemy as sa
import yaml

from dlts.backend_factory import make_backend
from dlts.config import Settings, load_settings
from dlts.jobmanager import JobManager
from dlts.logstore import iter_log
from dlts.models import Job, JobAttempt, JobEvent, Node, User
from dlts.services import admin
from dlts.services import jobs as job_service
from dlts.services.auth import principal_for
from tests.k8s.real import kube_cache
from tests.k8s.real.cluster import ClusterDidNotStart, RealCluster

ROOT = Path(__file__).resolve().parents[3]
ROLE_TEMPLATES = ROOT / "ansible/roles/kubernetes_control_plane/templates"
NAMESPACE = "dlts"
SERVICE_ACCOUNT = "dlts-managers"  # the role's default (kubernetes_control_plane_dlts_service_account)
SKU = "a100"
GPUS = 8  # per node
NODES = 2
UID = 20001


def _unavailable(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"the real-cluster tests cannot run in CI: {why}")
    pytest.skip(why)


def render_role_template(name: str, **variables: Any) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROLE_TEMPLATES), undefined=jinja2.StrictUndefined)
    env.filters["b64decode"] = lambda text: base64.b64decode(text).decode()
    return env.get_template(name).render(ansible_managed="managed by the DLTS tests", **variables)


def set_up_for_dlts(cluster: RealCluster) -> Path:
    """Apply the role's RBAC manifest, wait for the token, write the role's managers kubeconfig."""
    manifest = render_role_template(
        "dlts-rbac.yaml.j2", dlts_namespace=NAMESPACE, kubernetes_control_plane_dlts_service_account=SERVICE_ACCOUNT,
        dlts_priority_class="dlts-default", dlts_preemptible_priority_class="dlts-preemptible",
        kubernetes_control_plane_priority_value=1000, kubernetes_control_plane_preemptible_priority_value=100)
    for doc in yaml.safe_load_all(manifest):
        if doc:
            cluster.apply(doc)
    secret_path = f"/api/v1/namespaces/{NAMESPACE}/secrets/{SERVICE_ACCOUNT}-token"
    token = _wait(lambda: ((cluster.request("GET", secret_path) or {}).get("data") or {}).get("token"), 60,
                  "the token controller to fill the managers' token Secret")
    path = cluster.base / "dlts-managers.kubeconfig"
    path.write_text(render_role_template(
        "dlts-kubeconfig.j2", dlts_cluster_name="dlts-test", kube_apiserver_endpoint=cluster.server.removeprefix("https://"),
        kubernetes_control_plane_ca={"content": base64.b64encode(cluster.pki.ca.read_bytes()).decode()},
        kubernetes_control_plane_dlts_service_account=SERVICE_ACCOUNT,
        kubernetes_control_plane_sa_token={"stdout": token}, dlts_namespace=NAMESPACE))
    path.chmod(0o600)
    _wait(lambda: cluster.request("GET", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default"), 60,
          "the default ServiceAccount of the dlts namespace")
    return path


def _wait(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"waited {timeout_s:g} s for {what}")


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[RealCluster]:
    if os.geteuid() != 0:
        _unavailable("a real kubelet and containerd need root (the README's test command runs as root in CI)")
    cache = kube_cache.find()
    if cache is None:
        _unavailable("the Kubernetes build cache is missing: run `python tests/k8s/real/kube_cache.py build` "
                     "(`sh .ci/dev setup` does)")
    assert cache is not None
    cluster = RealCluster(cache, gpus=GPUS, sku=SKU, nodes=NODES)
    try:
        cluster.start()
    except ClusterDidNotStart as exc:
        cluster.stop()
        pytest.fail(f"the real Kubernetes did not come up: {exc}")
    try:
        cluster.managers_kubeconfig = set_up_for_dlts(cluster)  # type: ignore[attr-defined]
        yield cluster
    finally:
        cluster.stop()
    left = cluster.leftovers()
    assert not left, f"the real cluster left these behind: {left}"


def delete_dlts_objects(cluster: RealCluster) -> None:
    """Every DLTS object in the namespace, pods force-deleted; returns once no pod is left."""
    selector = "?labelSelector=app.kubernetes.io%2Fmanaged-by%3Ddlts"
    for path in (f"/api/v1/namespaces/{NAMESPACE}/pods", f"/api/v1/namespaces/{NAMESPACE}/secrets",
                 f"/api/v1/namespaces/{NAMESPACE}/configmaps",
                 f"/apis/networking.k8s.io/v1/namespaces/{NAMESPACE}/networkpolicies"):
        cluster.request("DELETE", path + selector, body={"gracePeriodSeconds": 0})
    for svc in cluster.request("GET", f"/api/v1/namespaces/{NAMESPACE}/services")["items"]:
        cluster.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/services/{svc['metadata']['name']}")
    _wait(lambda: not cluster.pods(NAMESPACE), 60, "the previous test's pods to go")


def write_config(tmp_path: Path, database_url: str, kubeconfig: Path, init_image: str,
                 kubernetes: dict[str, Any] | None = None, **top: Any) -> Path:
    """The operator's dlts.yaml for this cluster (``kubernetes``: keys of its section to set)."""
    path = tmp_path / "dlts.yaml"
    doc = {
        "home": str(tmp_path / "home"), "database_url": database_url, "secret_key": "test-secret-key-0123456789",
        "backend": "kubernetes", "log_dir": str(tmp_path / "logs"), "tick_s": 0.2,
        "start_timeout_s": 120, "preempt_grace_s": 2, "node_lost_after_s": 30,
        "sku_reserve": {"*": {"cpu_per_gpu": 0, "memory_per_gpu_bytes": 0}},
        "kubernetes": {"kubeconfig": str(kubeconfig), "namespace": NAMESPACE, "init_image": init_image,
                       "log_sync_s": 0.5, "request_timeout_s": 10, "backoff_initial_s": 0.2, "backoff_max_s": 1.0,
                       **(kubernetes or {})},
        **top,
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class Deployed:
    """DLTS's managers against the real cluster: the backend ``make_backend`` builds from dlts.yaml,
    the job manager on the wall clock, ticked by the test until a condition holds."""

    def __init__(self, cluster: RealCluster, sessions: Callable[[], Any], settings: Settings) -> None:
        self.cluster, self.sessions, self.settings = cluster, sessions, settings
        self.backend = make_backend(settings)
        self.manager = JobManager(sessions, self.backend, settings)
        self.shell_image = cluster.images["shell"]

    def restart(self) -> None:
        """A new managers process: a fresh backend and job manager over the same database."""
        self.backend.close()
        self.backend = make_backend(self.settings)
        self.manager = JobManager(self.sessions, self.backend, self.settings)

    def submit(self, command: str, user: str = "alice", vc: str = "vision", **kw: Any) -> int:
        with self.sessions() as s:
            principal = principal_for(s, s.scalar(sa.select(User).where(User.name == user)))
            req = job_service.JobRequest(vc=vc, **{"image": self.shell_image, "command": command, **kw})
            return job_service.submit(s, self.settings, principal, req).id

    def kill(self, job_id: int, user: str = "alice") -> None:
        with self.sessions() as s:
            job_service.kill(s, principal_for(s, s.scalar(sa.select(User).where(User.name == user))), job_id)

    def tick_until(self, what: str, check: Callable[[], Any], timeout_s: float = 180) -> Any:
        """Tick the job manager until ``check()`` is truthy (a bound, not a duration: a kubelet on two
        loaded cores has been seen to report a pod's end a minute and more after it)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.manager.tick()
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"after {timeout_s:g} s of ticks: {what}; jobs: {self.summary()}")
            time.sleep(0.2)

    def job(self, job_id: int) -> Job:
        with self.sessions() as s:
            job = s.get(Job, job_id)
            s.expunge(job)
            return job

    def status(self, job_id: int) -> str:
        return self.job(job_id).status.value

    def ended(self, *job_ids: int) -> bool:
        return all(self.status(j) in ("finished", "failed", "killed", "error") for j in job_ids)

    def attempts(self, job_id: int) -> list[JobAttempt]:
        with self.sessions() as s:
            rows = list(s.scalars(sa.select(JobAttempt).where(JobAttempt.job_id == job_id).order_by(JobAttempt.number)))
            for row in rows:
                s.expunge(row)
            return rows

    def events(self, job_id: int, kind: str | None = None) -> list[JobEvent]:
        with self.sessions() as s:
            query = sa.select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
            rows = [e for e in s.scalars(query) if kind is None or e.kind == kind]
            for row in rows:
                s.expunge(row)
            return rows

    def log(self, job_id: int, attempt: int = 1) -> str:
        """The job's log as the log store holds it (what the API and the portal serve)."""
        key = self.attempts(job_id)[attempt - 1].log_key
        return b"".join(iter_log(self.settings.log_dir, job_id, attempt, key=key)).decode(errors="replace")

    def pods(self, job_id: int) -> list[dict]:
        pods = [p for p in self.cluster.pods(NAMESPACE) if p["metadata"]["labels"].get("dlts.io/job-id") == str(job_id)]
        return sorted(pods, key=lambda p: int(p["metadata"]["labels"].get("dlts.io/index", "0")))

    def node_rows(self) -> list[tuple[str, str, int, bool]]:
        with self.sessions() as s:
            return [(n.name, n.sku, n.gpus, n.ready) for n in s.scalars(sa.select(Node).order_by(Node.name))]

    def summary(self) -> list[tuple[int, str, str | None, str | None]]:
        with self.sessions() as s:
            return [(j.id, j.status.value, j.reason, j.reason_detail) for j in s.scalars(sa.select(Job).order_by(Job.id))]


@pytest.fixture
def world(sessions):
    with sessions() as s:
        admin.add_vc(s, "vision", {SKU: GPUS * NODES})
        admin.add_user(s, "alice", uid=UID, gid=UID)
        admin.add_member(s, "vision", "alice")
    return sessions


@pytest.fixture
def kubernetes_section() -> dict[str, Any]:
    """Keys of the ``kubernetes:`` section a test module sets (pods listed every tick by default)."""
    return {}


@pytest.fixture
def top_settings() -> dict[str, Any]:
    """Top-level dlts.yaml keys a test module sets (``start_timeout_s``, ...)."""
    return {}


@pytest.fixture
def real_settings(real_cluster, tmp_path, database_url, kubernetes_section, top_settings) -> Settings:
    path = write_config(tmp_path, database_url, real_cluster.managers_kubeconfig, real_cluster.images["init"],
                        kubernetes=kubernetes_section, **top_settings)
    return load_settings(path, environ={})


@pytest.fixture
def settings(real_settings) -> Settings:
    """The app's settings are the deployed ones (the shared fixtures build the app from them)."""
    return real_settings


@pytest.fixture
def deployed(real_cluster, world, settings) -> Iterator[Deployed]:
    delete_dlts_objects(real_cluster)
    for node in real_cluster.nodes:
        if not real_cluster.node_ready(node.name):
            real_cluster.start_kubelet(node.name)
            real_cluster.wait_node_ready(node.name)
    d = Deployed(real_cluster, world, settings)
    d.tick_until("the nodes are synced", lambda: len(d.node_rows()) == NODES)  # node sync: the SKU is known
    yield d
    d.backend.close()
    delete_dlts_objects(real_cluster)
