"""The backend renders only what the API server's version accepts.

``net.ipv4.ip_unprivileged_port_start`` is a "safe" pod sysctl from Kubernetes 1.22; a 1.20 kubelet
refuses every pod that sets it (``SysctlForbidden``, measured on a real 1.20.2 and reproduced by the
fake API server's kubelet). So before 1.22 pods carry no sysctl and the ssh endpoint's sshd listens on
2222 in the container, the NodePort Service and the NetworkPolicy pointing there; from 1.22 it is 22.
"""

from __future__ import annotations

import pytest
from conftest import make_spec

from dlts.backends.base import EndpointSpec
from dlts.backends.k8s_render import ManifestRenderer, attempt_match
from dlts.backends.kubernetes import KubernetesBackend, KubernetesRefused, KubernetesSettings
from dlts.backends.kubernetes.backend import parse_server_version
from tests.fakes.kube_apiserver import FakeClock, FakeKubeApiServer

SSH = EndpointSpec(7, "ssh", 22)
PORT = EndpointSpec(8, "port", 8800)


@pytest.mark.parametrize(("answer", "version"), [
    ({"major": "1", "minor": "20", "gitVersion": "v1.20.2"}, (1, 20)),
    ({"major": "1", "minor": "27+", "gitVersion": "v1.27.3-gke.100"}, (1, 27)),
    ({"major": "1", "minor": "30+"}, (1, 30)),
])
def test_the_server_version_is_read_from_git_version_else_major_minor(answer, version):
    assert parse_server_version(answer) == version


def test_a_version_answer_without_either_is_a_refusal_naming_it():
    with pytest.raises(KubernetesRefused, match="neither gitVersion nor major.minor"):
        parse_server_version({"platform": "linux/amd64"})


@pytest.mark.parametrize(("version", "sysctl", "ssh_port"), [((1, 20), False, 2222), ((1, 21), False, 2222),
                                                             ((1, 22), True, 22), (None, True, 22)])
def test_the_port_sysctl_and_the_ssh_container_port_follow_the_version(version, sysctl, ssh_port):
    renderer = ManifestRenderer(KubernetesSettings(namespace="dlts"))
    renderer.server_version = version
    [pod] = renderer.render(make_spec(3, uid=1000, gid=1000)).pods
    assert ("sysctls" in pod["spec"]["securityContext"]) is sysctl
    labels = attempt_match(3, 1)
    service = renderer.endpoint_service(3, 1, labels, {}, [SSH, PORT], inference=False)
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(22, ssh_port), (8800, 8800)]
    configmap = renderer.endpoint_configmap(3, 1, labels, {}, [SSH, PORT], ())
    assert configmap["data"]["endpoints"] == f"7 ssh {ssh_port}\n8 port 8800\n"


@pytest.mark.parametrize(("server_version", "phase"), [("v1.20.2", "Running"), ("v1.30.0", "Running")])
def test_pods_of_the_backend_start_on_either_version(tmp_path, server_version, phase):
    with FakeKubeApiServer(FakeClock(), version=server_version) as api:
        api.add_node("n1", gpus=8, labels={"dlts.io/sku": "a100"})
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        backend = KubernetesBackend(KubernetesSettings(kubeconfig=str(kubeconfig), namespace="default"),
                                    log_dir=tmp_path / "logs", log_max_bytes=1 << 20, clock=api.clock)
        try:
            backend.launch(make_spec(1, command="sleep 10", uid=1000, gid=1000))
            api.kubelet.tick()
            api.kubelet.tick()
            [pod] = api.pods()
            assert pod["status"]["phase"] == phase, pod["status"]
            assert backend.server_version() == tuple(int(x) for x in server_version[1:].split(".")[:2])
        finally:
            backend.close()


def test_a_backend_that_rendered_for_the_newest_version_would_have_every_pod_refused_by_a_1_20_kubelet(tmp_path):
    """The failure the version read prevents, as the 1.20 kubelet reports it."""
    with FakeKubeApiServer(FakeClock(), version="v1.20.2") as api:
        api.add_node("n1", gpus=8, labels={"dlts.io/sku": "a100"})
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        backend = KubernetesBackend(KubernetesSettings(kubeconfig=str(kubeconfig), namespace="default"),
                                    log_dir=tmp_path / "logs", log_max_bytes=1 << 20, clock=api.clock)
        try:
            backend.renderer.server_version = (1, 30)  # as if the version had not been read
            backend.launch(make_spec(1, command="sleep 10", uid=1000, gid=1000))
            api.kubelet.tick()
            [pod] = api.pods()
            assert (pod["status"]["phase"], pod["status"]["reason"]) == ("Failed", "SysctlForbidden")
        finally:
            backend.close()
