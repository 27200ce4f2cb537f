"""Every rendered object is valid for the Kubernetes the Ansible roles install (``kubernetes-validate
--strict``: the API server's own OpenAPI schemas, unknown fields refused), and a normal user's pod
passes a pod-security scan (the "restricted" Pod Security Standard) and comes with its NetworkPolicy.

The version is the inventories' ``kube_version`` (the minor release the kubernetes_node role pins),
matched to the closest schema set kubernetes-validate ships.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions
from test_k8s_render import CASES, GOLDEN, SETTINGS

from dlts.backends.k8s_render import ManifestRenderer

ROOT = Path(__file__).resolve().parents[2]
INVENTORIES = sorted((ROOT / "inventory").glob("*/group_vars/all/kubernetes.yml"))


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def cluster_version() -> str:
    """The kube_version every inventory installs, as the closest version kubernetes-validate ships."""
    pinned = {str(yaml.safe_load(p.read_text())["kube_version"]) for p in INVENTORIES}
    assert len(pinned) == 1, f"the inventories pin different Kubernetes versions: {sorted(pinned)}"
    wanted = _minor(pinned.pop())
    shipped = sorted(set(all_versions()), key=_minor)
    return min(shipped, key=lambda v: (abs(_minor(v)[1] - wanted[1]) if _minor(v)[0] == wanted[0] else 99, _minor(v)))


VERSION = cluster_version()


def test_the_schema_version_is_the_installed_minor_release():
    assert _minor(VERSION) == _minor(str(yaml.safe_load(INVENTORIES[0].read_text())["kube_version"]))


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rendered_object_is_valid_for_the_clusters_kubernetes(case):
    rendered = ManifestRenderer(SETTINGS).render(CASES[case])
    for obj in rendered.all():
        kubernetes_validate.validate(obj, VERSION, strict=True)  # raises ValidationError with the path


def test_the_golden_files_pass_the_kubernetes_validate_command():
    files = sorted(str(p) for p in GOLDEN.glob("*.yaml"))
    cli = Path(sys.executable).with_name("kubernetes-validate")
    argv = [str(cli)] if cli.exists() else [sys.executable, "-m", "kubernetes_validate"]
    out = subprocess.run([*argv, "--strict", "--kubernetes-version", VERSION, *files], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("INFO") >= sum(len(list(yaml.safe_load_all(Path(f).read_text()))) for f in files)


def test_strict_validation_would_catch_a_misspelt_field():
    [pod] = ManifestRenderer(SETTINGS).render(CASES["batch"]).pods
    pod = {**pod, "spec": {**pod["spec"], "shareProcessNamespaces": True}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, VERSION, strict=True)


# -- pod security ------------------------------------------------------------------------------------

# Volume types the restricted Pod Security Standard allows, plus nfs: VC storage an admin configured
# (baseline allows it, restricted does not list it; it is neither a host path nor a host namespace,
# which is what this scan is about). The namespace therefore enforces baseline and warns on restricted.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"} | {"nfs"}


def pod_security_findings(pod: dict) -> list[str]:
    """What a restricted-profile scanner (Pod Security Admission "restricted", kube-score's security
    checks) would flag in ``pod``. Written from the standard, not from the renderer."""
    spec = pod["spec"]
    psc = spec.get("securityContext") or {}
    found = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            found.append(f"{key} is true")
    for vol in spec.get("volumes") or []:
        kinds = set(vol) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {vol['name']} uses {sorted(kinds - RESTRICTED_VOLUMES)}")
    for sysctl in psc.get("sysctls") or []:
        if sysctl["name"] not in {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                                  "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                                  "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                                  "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                                  "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}:
            found.append(f"unsafe sysctl {sysctl['name']}")
    for c in (spec.get("initContainers") or []) + spec["containers"]:
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("privileged"):
            found.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            found.append(f"{name}: does not drop ALL capabilities")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: adds capabilities {caps['add']}")
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        uid = sc.get("runAsUser", psc.get("runAsUser"))
        if non_root is not True:
            found.append(f"{name}: runAsNonRoot is not true")
        if uid == 0:
            found.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccomp profile {seccomp}")
        if sc.get("procMount") not in (None, "Default"):
            found.append(f"{name}: procMount {sc['procMount']}")
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                found.append(f"{name}: hostPort {port['hostPort']}")
    return found


@pytest.mark.parametrize("case", ["batch", "interactive", "inference", "preemptible", "cpu_with_storage_and_registry"])
def test_a_normal_users_pod_passes_the_pod_security_scan_and_has_its_network_policy(case):
    rendered = ManifestRenderer(SETTINGS).render(CASES[case])
    for pod in rendered.pods:
        assert pod_security_findings(pod) == []
        assert pod["spec"]["securityContext"]["runAsUser"] > 0
        assert pod["spec"].get("automountServiceAccountToken") is False
        [policy] = rendered.network_policies
        selector = policy["spec"]["podSelector"]["matchLabels"]
        assert selector.items() <= pod["metadata"]["labels"].items()
        assert policy["metadata"]["namespace"] == pod["metadata"]["namespace"]
        assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}


def test_the_scan_flags_admin_host_storage_and_root_so_it_can_fail():
    """Host storage is an admin's choice (allowed by DLTS's policy) but not "restricted"; the scan
    sees it, as it sees a root pod: the scan is not a rubber stamp."""
    [pod, _] = ManifestRenderer(SETTINGS).render(CASES["distributed"]).pods
    assert pod_security_findings(pod) == ["volume storage-scratch uses ['hostPath']"]
    root = ManifestRenderer(SETTINGS).render(CASES["batch"].__class__(**{
        **CASES["batch"].__dict__, "run_as_root": True, "vc_pod_policy": {"run_as_root": True}})).pods[0]
    assert "job: runAsUser 0" in pod_security_findings(root)
    assert "job: runAsNonRoot is not true" in pod_security_findings(root)
