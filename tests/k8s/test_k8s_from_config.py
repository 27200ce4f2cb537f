"""The deployed path: a ``dlts.yaml`` whose ``kubernetes:`` section sets every key, loaded with
``load_settings`` and turned into a backend by ``make_backend`` exactly as ``dlts managers`` does,
drives jobs through the job manager against the fake API server; each key's effect is asserted on
the objects the cluster receives or on the backend's behaviour, and the job's log is read through
the REST API after its pod is gone.

Nothing here builds ``KubernetesSettings`` by hand or injects a clock or an API client into the
backend: what the file says is all the backend gets.
"""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa
import yaml
from conftest import caught_up, env_of
from kubernetes.utils import parse_quantity

from dlts.backend_factory import make_backend
from dlts.backends.base import BackendUnavailable
from dlts.backends.k8s_settings import KubernetesSettings
from dlts.config import load_settings
from dlts.errors import Refused
from dlts.jobmanager import JobManager
from dlts.models import Job, JobAttempt, JobStatus, Node, User
from dlts.services import admin
from dlts.services import jobs as job_service
from dlts.services.auth import principal_for
from tests.fakes.kube_apiserver import FakeClock, FakeKubeApiServer

S = JobStatus
NAMESPACE = "dlts-jobs"
NODES = [f"n{i:02d}" for i in range(1, 13)]  # more than one page at list_page_size 10

# Every key of the section, each away from its default (test_every_key_is_set_away_from_its_default).
SECTION = {
    "kubeconfig": None,  # the fixture's file (two contexts; the current one is a dead server)
    "context": "fake-cluster",
    "namespace": NAMESPACE,
    "sku_label": "example.com/gpu-sku",
    "ib_domain_label": "example.com/ib-domain",
    "vc_label": "example.com/dedicated-vc",
    "missing_after_s": 45.0,
    "node_list_reuse_s": 60.0,
    "watch": True,
    "watch_timeout_s": 20.0,
    "list_page_size": 10,
    "launch_parallelism": 4,
    "init_image": "docker.io/library/busybox:1.36.0",
    "master_port": 29600,
    "privileged_policy": {"vision": ["run_as_root"]},
    "priority_class": "lab-normal",
    "preemptible_priority_class": "lab-spare",
    "default_ephemeral_storage_bytes": 20 * 1024**3,
    "network_policy": True,  # its default; the case with it off is parametrized below
    "storage_cidrs": ["10.20.0.0/24"],
    "log_sync_s": 2.0,
    "request_timeout_s": 1.0,
    "backoff_initial_s": 0.5,
    "backoff_max_s": 1.0,
}
LOG_MAX_BYTES = 64 * 1024
START_TIMEOUT_S = 60
PREEMPT_GRACE_S = 7


@pytest.fixture
def api():
    with FakeKubeApiServer(FakeClock()) as server:
        # the namespace exists before DLTS starts (the kubernetes_control_plane role creates it)
        server.store.create("namespaces", "", {"metadata": {"name": NAMESPACE}})
        for i, name in enumerate(NODES):
            labels = {SECTION["sku_label"]: "a100", SECTION["ib_domain_label"]: f"pod{i // 4}"}
            if name == "n12":
                labels[SECTION["vc_label"]] = "vision"
            server.add_node(name, gpus=8, cpu="96", memory="900Gi", labels=labels)
        yield server


@pytest.fixture
def kubeconfig(api, tmp_path):
    """Two contexts: the current one points at a port nothing listens on, so only a backend that
    uses the configured context reaches the cluster."""
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "stale",
        "clusters": [{"name": "fake", "cluster": {"server": api.url}},
                     {"name": "dead", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "dlts", "user": {"token": api.token}}],
        "contexts": [{"name": "stale", "context": {"cluster": "dead", "user": "dlts"}},
                     {"name": "fake-cluster", "context": {"cluster": "fake", "user": "dlts"}}],
    }))
    return path


def write_config(tmp_path, database_url, kubeconfig, **section_overrides):
    section = {**SECTION, "kubeconfig": str(kubeconfig), **section_overrides}
    path = tmp_path / "dlts.yaml"
    path.write_text(yaml.safe_dump({
        "home": str(tmp_path / "home"), "database_url": database_url, "secret_key": "test-secret-key-0123456789",
        "backend": "kubernetes", "log_dir": str(tmp_path / "logs"), "log_max_bytes": LOG_MAX_BYTES,
        "start_timeout_s": START_TIMEOUT_S, "preempt_grace_s": PREEMPT_GRACE_S, "node_lost_after_s": 120,
        "tick_s": 0.2, "kubernetes": section,
        # the tests' CPU-only jobs run on the a100 nodes (there are no CPU-only nodes): keep no
        # cores for free GPUs (the default keeps the proportional share, docs/scheduling.md)
        "sku_reserve": {"*": {"cpu_per_gpu": 0, "memory_per_gpu_bytes": 0}},
    }, sort_keys=False))
    return path


@pytest.fixture
def settings(request, tmp_path, database_url, kubeconfig):
    """The settings of the whole test (the app's too), from the file alone; a test may change keys
    of the section with ``@pytest.mark.parametrize("settings", [{...}], indirect=True)``."""
    path = write_config(tmp_path, database_url, kubeconfig, **getattr(request, "param", {}))
    return load_settings(path, environ={})


@pytest.fixture
def world(sessions):
    with sessions() as s:
        admin.add_vc(s, "vision", {"a100": 32})
        admin.add_vc(s, "nlp", {"a100": 8})
        for name, uid in (("alice", 20001), ("bob", 20002)):
            admin.add_user(s, name)
            user = s.scalar(sa.select(User).where(User.name == name))
            user.uid, user.gid = uid, uid  # dlts user set NAME --uid N --gid N
        admin.add_member(s, "vision", "alice")
        admin.add_member(s, "nlp", "bob")
        s.commit()
    return sessions


class Deployed:
    """make_backend(settings) and the job manager over it, ticked by the test."""

    def __init__(self, api, sessions, settings):
        self.api, self.sessions, self.settings = api, sessions, settings
        self.backend = make_backend(settings)
        self.manager = JobManager(sessions, self.backend, settings, clock=api.clock)

    def submit(self, user: str = "alice", vc: str = "vision", **kw) -> int:
        with self.sessions() as s:
            principal = principal_for(s, s.scalar(sa.select(User).where(User.name == user)))
            req = job_service.JobRequest(vc=vc, **{"image": "pytorch/pytorch:2.3", "command": "sleep 10", **kw})
            return job_service.submit(s, self.settings, principal, req).id

    def tick(self, seconds: float = 0.0) -> None:
        if seconds:
            self.api.run_until_idle(seconds)
        else:
            self.api.kubelet.tick()
        caught_up(self.api, self.backend)
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

    def pods(self, job_id: int) -> list[dict]:
        return sorted(self.api.pods(NAMESPACE, f"dlts.io/job-id={job_id}"),
                      key=lambda p: int(p["metadata"]["labels"]["dlts.io/index"]))


@pytest.fixture
def deployed(api, world, settings):
    d = Deployed(api, world, settings)
    with world() as s:
        d.manager.sync_nodes(s)
    yield d
    d.backend.close()


def test_every_key_of_the_section_is_set_away_from_its_default(settings):
    assert set(SECTION) == set(KubernetesSettings.model_fields)
    default = KubernetesSettings().model_dump(mode="json")
    loaded = settings.kubernetes.model_dump(mode="json")
    assert [key for key in SECTION if key != "network_policy" and loaded[key] == default[key]] == []
    assert settings.kubernetes.features_for("vision") == {"run_as_root"}
    # the top-level settings the backend shares with the local one
    assert (settings.log_max_bytes, settings.start_timeout_s, settings.node_lost_after_s) == (LOG_MAX_BYTES, 60, 120)


def test_the_backend_is_the_section_unchanged(deployed, settings):
    assert deployed.backend.settings is settings.kubernetes


def test_node_sync_reads_the_configured_label_keys_in_pages(deployed, api):
    with deployed.sessions() as s:
        nodes = {n.name: n for n in s.scalars(sa.select(Node))}
    assert set(nodes) == set(NODES)  # both pages of the node list (10 + 2)
    assert {n.sku for n in nodes.values()} == {"a100"}
    assert (nodes["n01"].ib_domain, nodes["n05"].ib_domain, nodes["n12"].vc) == ("pod0", "pod1", "vision")
    assert nodes["n01"].vc is None
    caught_up(api, deployed.backend)  # the watch's own first list is done
    api.reset_counts()
    deployed.backend.nodes()
    assert api.requests[("list", "nodes")] == 2  # list_page_size 10: limit=10, then the continue token
    deployed.backend.observe()
    assert api.requests[("list", "nodes")] == 2  # node_list_reuse_s: observe reuses that list
    assert api.requests[("list", "pods")] == 0  # watch: the pods come from memory


@pytest.mark.parametrize("settings", [{}, {"network_policy": False}], ids=["network-policy", "no-network-policy"],
                         indirect=True)
def test_a_job_from_the_config_file_gets_every_pod_setting(deployed, api, settings):
    distributed = deployed.submit(type="distributed", nodes=2, gpus=8, command="sleep 30")
    spare = deployed.submit(preemptible=True, gpus=1, command="sleep 30")
    deployed.tick()
    assert api.pods("default") == []  # the configured namespace, not the kubeconfig's
    pods = deployed.pods(distributed)
    assert len(pods) == 2
    [spare_pod] = deployed.pods(spare)
    assert api.requests[("watch", "pods")] >= 1  # watch: true
    for pod in pods:
        spec = pod["spec"]
        assert spec["priorityClassName"] == "lab-normal"
        assert spec["terminationGracePeriodSeconds"] == PREEMPT_GRACE_S
        # dlts-init runs init_image; dlts-identity runs the job's image (it adds the owner to /etc/passwd)
        assert [(c["name"], c["image"]) for c in spec["initContainers"]] == [
            ("dlts-init", "docker.io/library/busybox:1.36.0"), ("dlts-identity", "pytorch/pytorch:2.3")]
        job = spec["containers"][0]
        assert parse_quantity(job["resources"]["limits"]["ephemeral-storage"]) == 20 * 1024**3
        assert parse_quantity(job["resources"]["requests"]["ephemeral-storage"]) == 20 * 1024**3
        assert env_of(pod)["MASTER_PORT"] == "29600"
        assert spec["securityContext"]["runAsUser"] == 20001 and spec["securityContext"]["runAsNonRoot"] is True
    assert spare_pod["spec"]["priorityClassName"] == "lab-spare"
    deployed.tick()
    assert deployed.job(distributed).status is S.RUNNING
    policies = api.objects("networkpolicies", NAMESPACE)
    if not settings.kubernetes.network_policy:
        assert policies == []
        return
    by_name = {p["metadata"]["name"]: p for p in policies}
    assert set(by_name) == {f"dlts-{distributed}-1", f"dlts-{spare}-1"}
    egress = by_name[f"dlts-{distributed}-1"]["spec"]["egress"]
    assert {"cidr": "10.20.0.0/24"} in [peer.get("ipBlock") for rule in egress for peer in rule.get("to", [])]


def test_root_only_where_the_configured_vc_policy_allows_it(deployed, api):
    root_job = deployed.submit(command="sleep 30", run_as_root=True)
    # nlp has no run_as_root in privileged_policy: the submission itself is refused, with the way out
    with pytest.raises(Refused, match="VC nlp does not let jobs run as root"):
        deployed.submit(user="bob", vc="nlp", command="sleep 30", run_as_root=True)
    deployed.tick()
    [pod] = deployed.pods(root_job)
    assert pod["spec"]["securityContext"]["runAsUser"] == 0
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is False
    assert deployed.api.pods(NAMESPACE, "dlts.io/user=bob") == []
    deployed.tick()
    assert deployed.job(root_job).status is S.RUNNING


def test_the_log_survives_the_pod_and_is_capped_at_log_max_bytes(deployed, api, client):
    with deployed.sessions() as s:
        token = admin.new_token(s, "alice", "test")
    auth = {"Authorization": f"Bearer {token}"}
    job_id = deployed.submit(command="echo first line from the job; sleep 20; exit 0")
    deployed.tick()
    deployed.tick()
    assert deployed.job(job_id).status is S.RUNNING
    [pod] = deployed.pods(job_id)
    deployed.tick(SECTION["log_sync_s"])  # log_sync_s: the manager copies the pod's output this often
    live = client.get(f"/api/v1/jobs/{job_id}/log", headers=auth).get_json()
    assert "first line from the job" in live["data"]
    line = "x" * 1023 + "\n"
    api.print_output(pod["metadata"]["name"], line * 200, namespace=NAMESPACE)  # 200 KiB > log_max_bytes
    api.print_output(pod["metadata"]["name"], "the last line\n", namespace=NAMESPACE)
    deployed.tick(SECTION["log_sync_s"])
    deployed.tick(20)
    deployed.tick()
    assert deployed.job(job_id).status is S.FINISHED
    assert deployed.pods(job_id) == []  # forgotten: the log now lives only in the log store
    full = client.get(f"/api/v1/jobs/{job_id}/log?download=1", headers=auth)
    assert full.status_code == 200
    text = full.get_data(as_text=True)
    assert text.startswith("first line from the job")  # the head is kept
    assert text.rstrip().endswith("the last line")  # and the newest tail
    assert "were dropped here to keep it within log_max_bytes" in text  # saying what was left out
    assert len(full.get_data()) < 2 * LOG_MAX_BYTES + 1024  # the cap (plus at most one tail part), not 200 KiB


def test_an_unpullable_image_fails_after_start_timeout_s(deployed):
    job_id = deployed.submit(image="registry.example.com/missing/image:1", command="sleep 5", max_retries=0)
    deployed.tick()
    deployed.tick(5)
    assert deployed.job(job_id).status is S.SCHEDULING
    assert deployed.job(job_id).reason == "image_pull"  # within a tick of the pull error
    deployed.tick(START_TIMEOUT_S)
    job = deployed.job(job_id)
    assert job.status is S.FAILED
    # the attempt ends because it did not start in time; why it did not is the pull error, kept on the job
    assert deployed.attempts(job_id)[0].end_reason == "start_timeout"
    assert job.reason == "start_timeout"
    assert job.reason_detail.startswith("image_pull: pod dlts-")
    assert 'pulling image "registry.example.com/missing/image:1"' in job.reason_detail


def test_request_timeout_and_back_off_come_from_the_section(deployed, api):
    api.delay_s = 1.5  # longer than request_timeout_s
    with pytest.raises(BackendUnavailable):
        deployed.backend.nodes()
    api.delay_s = 0.0
    api.reset_counts()
    with pytest.raises(BackendUnavailable):  # inside backoff_initial_s: fails fast, no request
        deployed.backend.nodes()
    assert api.requests[("list", "nodes")] == 0
    time.sleep(0.6)  # past backoff_initial_s (0.5 s; the backend's clock is the wall clock)
    assert {n.name for n in deployed.backend.nodes()} == set(NODES)
