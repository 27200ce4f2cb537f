"""Rendered manifests: golden files per job type, YAML-injection and privilege-escalation resistance,
identity and root, storage, the NetworkPolicy, resources and scheduling, operator template
overrides, and ``dlts render``."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from conftest import GIB, env_of, make_spec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlts.backends.base import RegistryCredential, StorageMount
from dlts.backends.k8s_render import (
    DEFAULT_TEMPLATES_DIR,
    INIT_COMMAND,
    LaunchRefused,
    ManifestRenderer,
    PrivilegedFeature,
    TemplateError,
    check_pod_policy,
    label_value,
    render_yaml,
)
from dlts.backends.k8s_settings import KubernetesSettings

GOLDEN = Path(__file__).parent / "golden"
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq alice@laptop"
ALICE = {"uid": 1000, "gid": 1000, "supplemental_groups": (5001,)}


def spec(job_id: int = 9, **kw):
    """A spec of a user with a uid (the normal case) unless the test says otherwise."""
    return make_spec(job_id, **{**ALICE, **kw})


HOME = StorageMount("home", "nfs", "/export/home/alice", "/home/alice", server="nfs.example.com")
DATASETS = StorageMount("datasets", "nfs", "/export/datasets", "/datasets", server="10.20.0.5", read_only=True)
SCRATCH = StorageMount("scratch", "host", "/mnt/lustre/data", "/scratch")
CASES = {
    "batch": spec(101, command="python train.py --epochs 3", gpus=1),
    "interactive": spec(102, type="interactive", command="jupyter lab --ip=0.0.0.0", gpus=2,
                        ports=(8888,), ssh_public_keys=(KEY,), storage=(HOME,)),
    "distributed": spec(103, type="distributed", command="torchrun train.py", nodes=("n1", "n2"), gpus=8,
                        env={"NCCL_DEBUG": "INFO"}, storage=(HOME, DATASETS, SCRATCH)),
    "inference": spec(104, type="inference", command="python serve.py", nodes=("n3", "n4"), gpus=1,
                      ports=(8080,), ephemeral_storage_bytes=10 * GIB),
    "preemptible": spec(106, command="python sweep.py", gpus=4, preemptible=True),
    "cpu_with_storage_and_registry": spec(
        105, command="python etl.py", gpus=0, user="bob.smith@example.com", vc="data", uid=2001, gid=2001,
        supplemental_groups=(5002,), image="registry.example.com/team/etl:1.2", storage=(DATASETS,),
        registry_credentials=(RegistryCredential("registry.example.com", "bob", "s3cret"),)),
}
SETTINGS = KubernetesSettings(namespace="dlts", storage_cidrs=("10.20.0.0/16",))
SUPERVISOR = DEFAULT_TEMPLATES_DIR / "endpoint-supervisor.sh"


def renderer(**settings) -> ManifestRenderer:
    return ManifestRenderer(KubernetesSettings(**settings))


def golden_objects(rendered) -> list[dict]:
    """The objects with the supervisor script (tested on its own) shown by name, so that a change
    to the script does not rewrite every golden file."""
    objects = []
    for obj in rendered.all():
        if obj["kind"] == "ConfigMap":
            assert obj["data"]["supervisor.sh"] == SUPERVISOR.read_text()
            obj = {**obj, "data": {**obj["data"], "supervisor.sh": f"<{SUPERVISOR.name}>"}}
        objects.append(obj)
    return objects


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_manifests_match_the_golden_files(case):
    text = render_yaml(golden_objects(ManifestRenderer(SETTINGS).render(CASES[case])))
    path = GOLDEN / f"{case}.yaml"
    if os.environ.get("DLTS_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with DLTS_UPDATE_GOLDEN=1 once and review it"
    assert text == path.read_text(), f"{case} changed; review the diff, then DLTS_UPDATE_GOLDEN=1"


def test_every_golden_file_is_a_case():
    assert {p.stem for p in GOLDEN.glob("*.yaml")} == set(CASES)


# -- scheduling, resources, environment -------------------------------------------------------------


def test_the_dlts_schedulers_node_is_a_required_affinity_not_a_binding():
    pods = ManifestRenderer(SETTINGS).render(CASES["distributed"]).pods
    for pod, node in zip(pods, ("n1", "n2")):
        assert "nodeName" not in pod["spec"]
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms == {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}


def test_priority_class_follows_preemptibility():
    r = renderer(priority_class="gold", preemptible_priority_class="scavenger")
    [pod] = r.render(spec()).pods
    [spot] = r.render(spec(preemptible=True)).pods
    assert (pod["spec"]["priorityClassName"], spot["spec"]["priorityClassName"]) == ("gold", "scavenger")


def test_ephemeral_storage_request_equals_limit_from_the_job_or_the_default():
    r = renderer(default_ephemeral_storage_bytes=20 * GIB)
    for asked, expected in ((None, 20 * GIB), (5 * GIB, 5 * GIB)):
        [pod] = r.render(spec(ephemeral_storage_bytes=asked)).pods
        res = pod["spec"]["containers"][0]["resources"]
        assert res["requests"]["ephemeral-storage"] == res["limits"]["ephemeral-storage"] == str(expected)
    with pytest.raises(LaunchRefused, match="at least 1 MiB"):
        r.render(spec(ephemeral_storage_bytes=1000))


def test_cuda_device_order_is_the_pci_bus_order_and_reserved():
    [pod] = ManifestRenderer(SETTINGS).render(CASES["batch"]).pods
    assert env_of(pod)["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    with pytest.raises(LaunchRefused, match="CUDA_DEVICE_ORDER is set by DLTS"):
        ManifestRenderer(SETTINGS).render(spec(env={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}))


def test_registry_credentials_become_a_labelled_pull_secret_the_pods_use():
    rendered = ManifestRenderer(SETTINGS).render(CASES["cpu_with_storage_and_registry"])
    [secret] = rendered.secrets
    assert secret["metadata"]["name"] == "dlts-105-1-pull" and secret["type"] == "kubernetes.io/dockerconfigjson"
    assert secret["metadata"]["labels"]["dlts.io/job-id"] == "105" and secret["metadata"]["labels"]["dlts.io/attempt"] == "1"
    import base64

    config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    assert config["auths"]["registry.example.com"]["auth"] == base64.b64encode(b"bob:s3cret").decode()
    assert rendered.pods[0]["spec"]["imagePullSecrets"] == [{"name": "dlts-105-1-pull"}]
    assert "imagePullSecrets" not in ManifestRenderer(SETTINGS).render(CASES["batch"]).pods[0]["spec"]


def test_an_image_pulled_with_credentials_is_pulled_every_time_unless_the_vc_allows_the_cache():
    private = CASES["cpu_with_storage_and_registry"]
    [pod] = ManifestRenderer(SETTINGS).render(private).pods
    job_image = [c for group in ("initContainers", "containers") for c in pod["spec"][group]
                 if c["image"] == private.image]
    assert len(job_image) == 2  # the identity init container and the job's container
    assert {c["imagePullPolicy"] for c in job_image} == {"Always"}
    [init] = [c for c in pod["spec"]["initContainers"] if c["image"] == SETTINGS.init_image]
    assert "imagePullPolicy" not in init  # DLTS's own image: not pulled with the job's credentials
    # a public image keeps Kubernetes' default (the node's cache)
    [public] = ManifestRenderer(SETTINGS).render(CASES["batch"]).pods
    assert all("imagePullPolicy" not in c for group in ("initContainers", "containers") for c in public["spec"][group])
    # the VC's policy may allow the cache, explicitly
    allowed = dataclasses.replace(private, vc_pod_policy={"cached_private_images": True})
    [cached] = ManifestRenderer(SETTINGS).render(allowed).pods
    assert cached["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"


def test_a_customised_template_cannot_drop_the_pull_policy_of_a_private_image():
    [pod] = ManifestRenderer(SETTINGS).render(CASES["cpu_with_storage_and_registry"]).pods
    del pod["spec"]["containers"][0]["imagePullPolicy"]  # what a template without the line renders
    with pytest.raises(LaunchRefused, match=r"cached_private_images \(containers job imagePullPolicy not set with a pull secret\)"):
        check_pod_policy(pod, frozenset(), own_images=frozenset({SETTINGS.init_image}))
    check_pod_policy(pod, frozenset({PrivilegedFeature.CACHED_PRIVATE_IMAGES}), own_images=frozenset({SETTINGS.init_image}))


def test_cpu_jobs_see_no_gpus():
    [pod] = ManifestRenderer(SETTINGS).render(CASES["cpu_with_storage_and_registry"]).pods
    assert env_of(pod)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "nvidia.com/gpu" not in pod["spec"]["containers"][0]["resources"]["limits"]
    assert pod["metadata"]["annotations"]["dlts.io/user"] == "bob.smith@example.com"
    assert LABEL_VALUE.match(pod["metadata"]["labels"]["dlts.io/user"])


# -- probes and image references ---------------------------------------------------------------------

DIGEST = "sha256:" + "4f3c2b1a" * 8


def _probes(pod: dict) -> dict[str, dict]:
    """Every probe of every container of the pod: "container kind" -> the probe."""
    return {f"{c['name']} {kind}": c[kind] for group in ("initContainers", "containers")
            for c in pod["spec"].get(group) or [] for kind in ("readinessProbe", "livenessProbe", "startupProbe")
            if kind in c}


@pytest.mark.parametrize("case,probed_port", [
    ("batch", None), ("preemptible", None), ("distributed", None),
    # an interactive job's pod takes its ssh/Jupyter traffic through the same Service: a probe on its
    # declared port would cut the user off while their own server is down
    ("interactive", None),
    ("inference", 8080),
])
def test_only_a_serving_inference_replica_has_a_probe_and_it_is_readiness_on_its_port(case, probed_port):
    for pod in ManifestRenderer(SETTINGS).render(CASES[case]).pods:
        expected = {} if probed_port is None else {"job readinessProbe": {
            "tcpSocket": {"port": probed_port}, "periodSeconds": 5, "timeoutSeconds": 2, "successThreshold": 1,
            "failureThreshold": 3}}
        assert _probes(pod) == expected


def test_an_inference_job_probes_its_first_declared_port_and_none_without_one():
    [pod] = ManifestRenderer(SETTINGS).render(spec(type="inference", ports=(9000, 8080))).pods
    assert _probes(pod)["job readinessProbe"]["tcpSocket"] == {"port": 9000}
    [pod] = ManifestRenderer(SETTINGS).render(spec(type="inference")).pods
    assert _probes(pod) == {}


@pytest.mark.parametrize("image", [
    f"registry.example.com/team/serve@{DIGEST}",
    f"registry.example.com:5000/team/serve:2.1@{DIGEST}",
    f"pytorch/pytorch@sha512:{'ab' * 64}",
])
def test_an_image_given_by_digest_reaches_every_container_of_the_job_unchanged(image):
    rendered = ManifestRenderer(SETTINGS).render(spec(image=image, registry_credentials=(
        RegistryCredential("registry.example.com", "bob", "s3cret"),)))
    [pod] = rendered.pods
    images = {c["name"]: c["image"] for group in ("initContainers", "containers") for c in pod["spec"][group]}
    assert images == {"dlts-init": SETTINGS.init_image, "dlts-identity": image, "job": image}


@pytest.mark.parametrize("image,message", [
    ("pytorch/PyTorch:2.3", "repository names are lowercase"),
    ("serve@sha256:abc", "64 lowercase hex digits"),
    (f"serve@{DIGEST.upper()}", "64 lowercase hex digits"),
    ("serve@md5:" + "a" * 32, "must be a digest"),
    ("serve:a:b", "is not an image reference"),
    ("registry//serve", "is not an image reference"),
])
def test_a_malformed_image_reference_is_refused_at_render_saying_what_is_wrong(image, message):
    with pytest.raises(LaunchRefused, match=re.escape(message)):
        ManifestRenderer(SETTINGS).render(spec(image=image))


def test_objects_come_in_creation_order():
    kinds = [d["kind"] for d in ManifestRenderer(SETTINGS).render(CASES["distributed"]).all()]
    assert kinds == ["ConfigMap", "NetworkPolicy", "Service", "Pod", "Pod"]
    # not distributed: the endpoint ConfigMap is made with the first endpoint (``expose``)
    kinds = [d["kind"] for d in ManifestRenderer(SETTINGS).render(CASES["cpu_with_storage_and_registry"]).all()]
    assert kinds == ["Secret", "NetworkPolicy", "Pod"]


# -- the init on stock images ------------------------------------------------------------------------


def test_the_init_copies_busybox_and_the_job_runs_under_it():
    [pod] = ManifestRenderer(SETTINGS).render(CASES["batch"]).pods
    init, ident = pod["spec"]["initContainers"]
    assert init["image"] == SETTINGS.init_image and init["command"] == list(INIT_COMMAND)
    assert INIT_COMMAND == ("/bin/busybox", "cp", "/bin/busybox", "/dlts-runtime/busybox")
    assert ident["image"] == pod["spec"]["containers"][0]["image"] == "pytorch/pytorch:2.3"
    assert ident["command"][:3] == ["/dlts-runtime/busybox", "sh", "-c"]
    assert {e["name"]: e["value"] for e in ident["env"]} == {
        "DLTS_LOGIN": "alice", "DLTS_UID": "1000", "DLTS_GID": "1000", "DLTS_GROUPS": "5001", "HOME": "/tmp/alice"}
    job = pod["spec"]["containers"][0]
    assert job["command"][:3] == ["/dlts-runtime/busybox", "sh", "-c"]
    assert "python train.py" not in job["command"][2]  # the command only travels in the environment
    assert pod["spec"]["shareProcessNamespace"] is True
    mounts = {m["mountPath"]: m for m in job["volumeMounts"]}
    assert mounts["/etc/passwd"] == {"name": "dlts-runtime", "mountPath": "/etc/passwd", "subPath": "passwd",
                                     "readOnly": True}
    assert mounts["/dlts-runtime"]["readOnly"] is True
    assert not any("log" in m["name"] for m in job["volumeMounts"])  # output goes to the container's stdout


def test_home_is_the_mounted_home_directory_when_the_vc_has_one():
    [pod] = ManifestRenderer(SETTINGS).render(CASES["interactive"]).pods
    assert env_of(pod)["HOME"] == "/home/alice"
    [pod] = ManifestRenderer(SETTINGS).render(spec(env={"HOME": "/work"})).pods
    assert env_of(pod)["HOME"] == "/work"


# -- identity and root -------------------------------------------------------------------------------


def test_pods_run_as_the_owner_with_the_vc_group():
    [pod] = ManifestRenderer(SETTINGS).render(CASES["batch"]).pods
    assert pod["spec"]["securityContext"] == {
        "runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True, "supplementalGroups": [5001],
        "seccompProfile": {"type": "RuntimeDefault"},
        "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "22"}]}
    for c in pod["spec"]["initContainers"] + pod["spec"]["containers"]:
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert c["securityContext"]["privileged"] is False


@pytest.mark.parametrize("fields,message", [
    ({"uid": None, "gid": None}, ("user alice has no uid, and jobs run as their owner's uid and gid; a cluster admin "
                                  "sets them with: dlts user set alice --uid N --gid N")),
    ({"gid": None}, "user alice has no gid"),
    ({"uid": 0, "gid": 0}, "0 is root's"),
    ({"run_as_root": True}, "VC vision does not allow its jobs to run as root"),
    ({"uid": None, "run_as_root": True}, "does not allow its jobs to run as root"),
])
def test_a_job_that_would_run_as_root_without_permission_is_refused(fields, message):
    with pytest.raises(LaunchRefused, match=re.escape(message)):
        ManifestRenderer(SETTINGS).render(spec(**fields))


def test_root_only_where_the_vc_allows_it_and_the_job_asks():
    r = renderer(privileged_policy={"vision": ["run_as_root"]})
    [pod] = r.render(spec()).pods
    assert pod["spec"]["securityContext"]["runAsUser"] == 1000  # allowed, not asked: the owner
    [pod] = r.render(spec(run_as_root=True)).pods
    sc = pod["spec"]["securityContext"]
    assert (sc["runAsUser"], sc["runAsGroup"], sc["runAsNonRoot"]) == (0, 0, False)
    # the owner still gets their own login, never a second uid 0
    ident = {e["name"]: e["value"] for e in pod["spec"]["initContainers"][1]["env"]}
    assert (ident["DLTS_LOGIN"], ident["DLTS_UID"]) == ("alice", "1000")
    [pod] = ManifestRenderer(SETTINGS).render(spec(run_as_root=True, vc_pod_policy={"run_as_root": True})).pods
    assert pod["spec"]["securityContext"]["runAsUser"] == 0
    [pod] = r.render(spec(uid=None, gid=None, run_as_root=True)).pods
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["dlts-init"]  # nobody to add to /etc/passwd
    assert "/etc/passwd" not in {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}


def test_a_name_passwd_cannot_hold_logs_in_as_u_uid():
    [pod] = ManifestRenderer(SETTINGS).render(spec(user="Bob Smith:x", uid=3000, gid=3000)).pods
    ident = {e["name"]: e["value"] for e in pod["spec"]["initContainers"][1]["env"]}
    assert ident["DLTS_LOGIN"] == "u3000"


def _pod_with(**spec_changes) -> dict:
    return ManifestRenderer(SETTINGS).render(CASES["batch"]).pods[0] | spec_changes


@pytest.mark.parametrize("change,feature", [
    (lambda p: p["spec"]["securityContext"].update(runAsUser=0), "run_as_root"),
    (lambda p: p["spec"]["securityContext"].pop("runAsUser"), None),  # runAsNonRoot still holds
    (lambda p: [p["spec"]["securityContext"].pop("runAsUser"), p["spec"]["securityContext"].pop("runAsNonRoot")],
     "run_as_root"),
    (lambda p: p["spec"]["securityContext"].update(runAsNonRoot=False, runAsUser=None), "run_as_root"),
    (lambda p: p["spec"]["containers"][0]["securityContext"].update(runAsUser=0), "run_as_root"),
    (lambda p: p["spec"]["initContainers"][0]["securityContext"].pop("allowPrivilegeEscalation"), "privileged"),
    (lambda p: p["spec"]["containers"][0]["securityContext"].update(capabilities={"drop": ["NET_RAW"]}), "privileged"),
    (lambda p: p["spec"]["securityContext"].pop("seccompProfile"), "privileged"),
    (lambda p: p["spec"]["containers"][0]["securityContext"].update(seccompProfile={"type": "Unconfined"}),
     "privileged"),
    (lambda p: p["spec"]["containers"][0].update(ports=[{"containerPort": 80, "hostPort": 80}]), "host_network"),
    (lambda p: p["spec"].update(hostPID=True), "host_pid"),
    (lambda p: p["spec"]["volumes"].append({"name": "x", "hostPath": {"path": "/etc"}}), "host_path"),
])
def test_the_rendered_pod_policy_check_refuses_each_escalation(change, feature):
    pod = json.loads(json.dumps(ManifestRenderer(SETTINGS).render(CASES["batch"]).pods[0]))
    check_pod_policy(pod, frozenset())
    change(pod)
    if feature is None:
        check_pod_policy(pod, frozenset())
        return
    with pytest.raises(LaunchRefused, match=re.escape(feature)):
        check_pod_policy(pod, frozenset())
    check_pod_policy(pod, frozenset(PrivilegedFeature))


# -- storage -----------------------------------------------------------------------------------------


def test_storage_is_mounted_nfs_as_nfs_and_host_as_a_directory():
    [pod, _] = ManifestRenderer(SETTINGS).render(CASES["distributed"]).pods
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["storage-home"] == {"name": "storage-home", "nfs": {
        "server": "nfs.example.com", "path": "/export/home/alice", "readOnly": False}}
    assert volumes["storage-datasets"]["nfs"]["readOnly"] is True
    assert volumes["storage-scratch"] == {"name": "storage-scratch",
                                          "hostPath": {"path": "/mnt/lustre/data", "type": "Directory"}}
    mounts = {m["mountPath"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/home/alice"]["readOnly"] is False and mounts["/datasets"]["readOnly"] is True
    assert mounts["/scratch"]["name"] == "storage-scratch"


def test_admin_storage_on_the_node_is_allowed_but_no_other_host_path(tmp_path):
    """The VC's host storage needs no host_path privilege; a template adding another hostPath,
    or pointing the storage volume elsewhere, is refused."""
    [pod, _] = ManifestRenderer(SETTINGS).render(CASES["distributed"]).pods
    allowed = {"storage-scratch": "/mnt/lustre/data"}
    check_pod_policy(pod, frozenset(), allowed)
    with pytest.raises(LaunchRefused, match="host_path"):
        check_pod_policy(pod, frozenset())
    moved = json.loads(json.dumps(pod))
    next(v for v in moved["spec"]["volumes"] if v["name"] == "storage-scratch")["hostPath"]["path"] = "/"
    with pytest.raises(LaunchRefused, match="volume storage-scratch"):
        check_pod_policy(moved, frozenset(), allowed)
    settings = _override(tmp_path, lambda t: t.replace(
        "  volumes: {{ volumes }}", '  volumes: {{ volumes + [{"name": "etc", "hostPath": {"path": "/etc"}}] }}'))
    with pytest.raises(LaunchRefused, match="host_path .volume etc"):
        ManifestRenderer(SETTINGS, templates_dir=settings).render(CASES["distributed"])


@pytest.mark.parametrize("mount,message", [
    (StorageMount("Home", "nfs", "/e", "/h", server="s"), "DNS label"),
    (StorageMount("a", "s3", "/e", "/h"), "neither nfs nor host"),
    (StorageMount("a", "nfs", "e", "/h", server="s"), "absolute"),
    (StorageMount("a", "host", "/e/../etc", "/h"), "without '..'"),
    (StorageMount("a", "host", "/e", "/data/../etc"), "without '..'"),
    (StorageMount("a", "host", "/e", "/"), "system files"),
    (StorageMount("a", "host", "/e", "/etc/ssl"), "system files"),
    (StorageMount("a", "host", "/e", "/proc"), "system files"),
    (StorageMount("a", "host", "/e", "/dev/shm"), "system files"),
    (StorageMount("a", "host", "/e", "/sys/"), "system files"),
    (StorageMount("a", "host", "/e", "/dlts-runtime"), "system files"),
    (StorageMount("a", "host", "/e", "/usr"), "system files"),
    (StorageMount("a", "nfs", "/e", "/data", server=""), "server's host name"),
    (StorageMount("a", "nfs", "/e", "/data", server="evil host"), "server's host name"),
])
def test_bad_storage_entries_name_the_vc_and_the_fix(mount, message):
    with pytest.raises(TemplateError, match=re.escape(message)) as exc:
        ManifestRenderer(SETTINGS).render(spec(storage=(mount,)))
    assert "VC vision's storage entry" in str(exc.value) and "dlts vc storage vision" in str(exc.value)


def test_two_storage_entries_cannot_share_a_name_or_a_mount_path():
    a = StorageMount("a", "host", "/x", "/data")
    with pytest.raises(TemplateError, match="two entries have this name"):
        ManifestRenderer(SETTINGS).render(spec(storage=(a, a)))
    with pytest.raises(TemplateError, match="also mounted at /data"):
        ManifestRenderer(SETTINGS).render(spec(storage=(a, StorageMount("b", "host", "/y", "/data/"))))


# -- isolation ---------------------------------------------------------------------------------------


def test_the_network_policy_admits_only_the_attempts_pods_and_the_open_ports():
    rendered = ManifestRenderer(SETTINGS).render(CASES["inference"])
    [policy] = rendered.network_policies
    assert policy["metadata"]["name"] == "dlts-104-1"
    own = {"app.kubernetes.io/managed-by": "dlts", "dlts.io/job-id": "104", "dlts.io/attempt": "1"}
    spec_ = policy["spec"]
    assert spec_["podSelector"] == {"matchLabels": own} and spec_["policyTypes"] == ["Ingress", "Egress"]
    for pod in rendered.pods:  # it selects every pod of the attempt
        assert own.items() <= pod["metadata"]["labels"].items()
    assert spec_["ingress"] == [{"from": [{"podSelector": {"matchLabels": own}}]},
                                {"ports": [{"port": 8080, "protocol": "TCP"}]}]
    assert spec_["egress"] == [
        {"to": [{"podSelector": {"matchLabels": own}}]},
        {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}],
         "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
        {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}]}]


def test_no_open_ports_and_no_storage_networks_never_mean_everything():
    """An ingress rule with no ports, or an egress rule with no peers, would allow all traffic."""
    [policy] = renderer().render(spec()).network_policies
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": policy["spec"]["podSelector"][
        "matchLabels"]}}]}]
    assert all(rule.get("to") for rule in policy["spec"]["egress"])
    assert all(rule.get("from") or rule.get("ports") for rule in policy["spec"]["ingress"])


def test_endpoints_ports_open_when_expose_renders_the_policy_again():
    r = ManifestRenderer(SETTINGS)
    rendered = r.render(CASES["interactive"])
    labels = rendered.pods[0]["metadata"]["labels"]
    policy = r.network_policy(102, 1, labels, {}, [8888, 22, 8888])
    assert policy["spec"]["ingress"][1] == {"ports": [{"port": 22, "protocol": "TCP"}, {"port": 8888, "protocol": "TCP"}]}
    assert policy["metadata"]["name"] == rendered.network_policies[0]["metadata"]["name"]


def test_without_network_policy_none_is_rendered():
    assert renderer(network_policy=False).render(spec()).network_policies == ()


# -- injection and escalation resistance -------------------------------------------------------------

HOSTILE = [
    'x"\nprivileged: true',
    "x\n  hostNetwork: true\n",
    '"}], "hostPID": true, "x": [{"a": "',
    "---\napiVersion: v1\nkind: Pod\n",
    "{{ 7 * 7 }} {% if true %}jinja{% endif %}",
    "a: b\n- c\n? d\n& e\n* f\n! g\n| h\n> i\n% j\n@ k\n` l",
    "\x00\x07\x1b[31m\x7f\x85\u2028\u2029\ufeff\ufffe",
    "emoji \U0001F600 and \\u0022 and \\n",
]


@pytest.mark.parametrize("evil", HOSTILE)
def test_hostile_strings_stay_data(evil):
    rendered = renderer().render(spec(7, command=evil, user=evil, vc=evil, env={"HOSTILE": evil},
                                      type="distributed", nodes=("n1", "n2")))
    for pod in rendered.pods:
        assert set(pod["spec"]) == set(rendered.pods[0]["spec"])
        assert not {"hostNetwork", "hostIPC", "hostPID"} & set(pod["spec"])
        assert pod["spec"]["containers"][0]["securityContext"] == {
            "privileged": False, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        env = env_of(pod)
        assert env["DLTS_COMMAND"] == evil and env["HOSTILE"] == evil and env["DLTS_USER"] == evil
        assert pod["metadata"]["annotations"]["dlts.io/vc"] == evil
        assert all(LABEL_VALUE.match(v) and len(v) <= 63 for v in pod["metadata"]["labels"].values())
    assert len(rendered.pods) == 2 and len(rendered.services) == 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=60),
       user=st.text(min_size=1, max_size=80).filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s)))
def test_any_text_round_trips_through_the_yaml(text, user):
    [pod] = renderer().render(spec(8, command="run " + text, user=user, env={"V": text})).pods
    env = env_of(pod)
    assert env["DLTS_COMMAND"] == "run " + text and env["V"] == text and env["DLTS_USER"] == user
    assert LABEL_VALUE.match(pod["metadata"]["labels"]["dlts.io/user"])


def test_label_values_are_valid_and_distinct():
    values = {label_value(s) for s in ("alice", "alice@x", "alice@y", "a" * 80, "a" * 81, "ä", "ö", "")}
    assert len(values) == 8 and all(LABEL_VALUE.match(v) and len(v) <= 63 for v in values)
    assert label_value("alice") == "alice"


@pytest.mark.parametrize("field,value,message", [
    ("image", "busybox\nprivileged: true", "not a valid image"),
    ("image", "", "not a valid image"),
    ("env", {"A\nB": "x"}, "name 'A\\nB' is invalid"),
    ("env", {"DLTS_USER": "root"}, "set by DLTS"),
    ("env", {"RANK": "0"}, "set by DLTS"),
    ("env", {"DLTS_RUNTIME_DIR": "/tmp"}, "set by DLTS"),
    ("ssh_public_keys", ("ssh-ed25519 AAAA x\nssh-rsa BBBB y",), "single-line"),
    ("ports", (0,), "not a TCP port"),
    ("command", "   ", "command is empty"),
    ("supplemental_groups", (-1,), "supplemental groups"),
])
def test_bad_or_escalating_fields_are_refused_with_a_reason(field, value, message):
    with pytest.raises(LaunchRefused, match=re.escape(message)):
        renderer().render(spec(**{field: value}))


# A job cannot ask for privileged features (no field of a LaunchSpec does); a customised template
# can add them, and the rendered pod is checked against the VC's policy (the configuration's
# privileged_policy plus the VC's pod_policy from the database).

_HOST_PATH = ("  volumes: {{ volumes }}", ("  volumes: {{ volumes + [{'name': 'scratch', "
                                          "'hostPath': {'path': '/scratch', 'type': 'Directory'}}] }}"))
_PRIVILEGED = (("        privileged: false\n        allowPrivilegeEscalation: false\n        capabilities:\n"
                "          drop: [ALL]\n      volumeMounts: {{ volume_mounts }}"),
               ("        privileged: true\n        allowPrivilegeEscalation: true\n        capabilities:\n"
                "          drop: [ALL]\n      volumeMounts: {{ volume_mounts }}"))
_HOST_NETWORK = ("  shareProcessNamespace: true\n", "  shareProcessNamespace: true\n  hostNetwork: true\n")


def test_a_template_s_host_path_needs_the_policy_for_every_vc_or_its_own(tmp_path):
    templates = _override(tmp_path, lambda t: t.replace(*_HOST_PATH))
    [pod] = ManifestRenderer(KubernetesSettings(privileged_policy={"*": ["host_path"]}),
                             templates_dir=templates).render(spec()).pods
    assert pod["spec"]["volumes"][-1]["hostPath"]["path"] == "/scratch"
    with pytest.raises(LaunchRefused, match="host_path"):
        ManifestRenderer(KubernetesSettings(privileged_policy={"other": ["host_path"]}),
                         templates_dir=templates).render(spec())


def test_a_template_s_privileged_container_where_the_vc_allows_it(tmp_path):
    templates = _override(tmp_path, lambda t: t.replace(*_PRIVILEGED))
    [pod] = ManifestRenderer(KubernetesSettings(privileged_policy={"vision": ["privileged"]}),
                             templates_dir=templates).render(spec()).pods
    sc = pod["spec"]["containers"][0]["securityContext"]
    assert sc["privileged"] is True and sc["allowPrivilegeEscalation"] is True


def test_the_vc_policy_from_the_database_adds_to_the_config(tmp_path):
    templates = _override(tmp_path, lambda t: t.replace(*_HOST_NETWORK))
    r = ManifestRenderer(KubernetesSettings(), templates_dir=templates)
    [pod] = r.render(spec(11, vc_pod_policy={"host_network": True, "privileged": False})).pods
    assert pod["spec"]["hostNetwork"] is True
    with pytest.raises(LaunchRefused, match="host_network"):
        r.render(spec(11, vc_pod_policy={"host_network": False}))
    with pytest.raises(TemplateError, match="host_netwrk"):
        renderer().render(spec(11, vc_pod_policy={"host_netwrk": True}))


# -- operator templates ------------------------------------------------------------------------------


def _override(tmp_path: Path, transform) -> str:
    text = (DEFAULT_TEMPLATES_DIR / "pod.yaml.j2").read_text()
    (tmp_path / "pod.yaml.j2").write_text(transform(text))
    return str(tmp_path)


def test_an_operator_template_override_is_used_and_others_fall_back(tmp_path):
    templates = _override(tmp_path, lambda t: t.replace("  restartPolicy: Never\n",
                                                        "  restartPolicy: Never\n  schedulerName: dlts-jobs\n"))
    rendered = ManifestRenderer(SETTINGS, templates_dir=templates).render(CASES["distributed"])
    assert rendered.pods[0]["spec"]["schedulerName"] == "dlts-jobs"
    assert rendered.services[0]["spec"]["clusterIP"] == "None"  # from the default templates
    assert rendered.network_policies[0]["kind"] == "NetworkPolicy"


def test_a_template_cannot_grant_what_the_policy_does_not(tmp_path):
    templates = _override(tmp_path, lambda t: t.replace("  shareProcessNamespace: true\n",
                                                        "  shareProcessNamespace: true\n  hostIPC: true\n"))
    with pytest.raises(LaunchRefused, match="host_ipc"):
        ManifestRenderer(SETTINGS, templates_dir=templates).render(CASES["batch"])
    templates = _override(tmp_path, lambda t: t.replace("          drop: [ALL]\n      volumeMounts",
                                                        "          drop: [ALL]\n          add: [SYS_ADMIN]\n"
                                                        "      volumeMounts"))
    with pytest.raises(LaunchRefused, match="capabilities.add"):
        ManifestRenderer(SETTINGS, templates_dir=templates).render(CASES["batch"])
    templates = _override(tmp_path, lambda t: t.replace("    runAsUser: {{ identity.uid }}\n", "").replace(
        "    runAsNonRoot: {{ not identity.root }}\n", ""))
    with pytest.raises(LaunchRefused, match="run_as_root"):
        ManifestRenderer(SETTINGS, templates_dir=templates).render(CASES["batch"])


@pytest.mark.parametrize("transform,message", [
    (lambda t: t.replace("  restartPolicy: Never", "  restartPolicy: Never\n  restartPolicyy: Never"), "invalid Pod"),
    (lambda t: t.replace("{{ pod.node }}", "{{ pod.nodee }}"), "nodee"),
    (lambda t: t.replace("  labels: {{ pod.labels }}", "  labels: {app: x}"), "dropped DLTS's labels"),
    (lambda t: t.replace("{{ namespace }}", '"kube-system"'), "configured namespace"),
    (lambda t: t + "\n---\nkind: Pod\n", "exactly one object"),
    (lambda t: t.replace("{%- for var in pod.env %}", "{%- for var in pod.env "), "line"),
])
def test_a_broken_template_fails_with_a_message_naming_it(tmp_path, transform, message):
    with pytest.raises(TemplateError, match=re.escape(message)):
        ManifestRenderer(SETTINGS, templates_dir=_override(tmp_path, transform)).render(CASES["batch"])


def test_a_missing_templates_dir_is_named(tmp_path):
    with pytest.raises(TemplateError, match="is not a directory"):
        ManifestRenderer(SETTINGS, templates_dir=str(tmp_path / "nope"))


def test_termination_grace_comes_from_the_backend():
    [pod] = ManifestRenderer(SETTINGS, termination_grace_s=90).render(CASES["batch"]).pods
    assert pod["spec"]["terminationGracePeriodSeconds"] == 90


# -- dlts render -------------------------------------------------------------------------------------


def _cli(args: list[str], tmp_path: Path, config: dict | None = None):
    from dlts.cli import main

    env = {"DLTS_HOME": str(tmp_path / "home"), "DLTS_CONFIG": ""}
    prefix: list[str] = []
    if config is not None:
        path = tmp_path / "dlts.yaml"
        path.write_text(yaml.safe_dump(config))
        prefix = ["--config", str(path)]
    return CliRunner().invoke(main, [*prefix, "render", *args], env=env, catch_exceptions=False)


def test_dlts_render_prints_the_network_policy_and_pods_from_the_configs_kubernetes_section(tmp_path):
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"vc": "vision", "image": "pytorch/pytorch:2.3", "command": "torchrun t.py",
                               "type": "distributed", "gpus": 8, "nodes": 2, "ssh": True, "memory": "200Gi",
                               "cpu": 48}))
    keyfile = tmp_path / "id.pub"
    keyfile.write_text(KEY + "\n")
    config = {"kubernetes": {"namespace": "research", "priority_class": "gold", "storage_cidrs": ["10.9.0.0/16"],
                             "default_ephemeral_storage_bytes": 8 * GIB}}
    result = _cli(["--job", str(job), "--user", "alice", "--nodes", "g01,g02", "--job-id", "42",
                   "--ssh-key-file", str(keyfile), "--uid", "1000", "--group", "5001"], tmp_path, config)
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.output))
    # no endpoint Service: the job manager exposes endpoints (ssh here) once the job runs
    assert [d["kind"] for d in docs] == ["ConfigMap", "NetworkPolicy", "Service", "Pod", "Pod"]
    assert {d["metadata"]["namespace"] for d in docs} == {"research"}
    assert docs[1]["spec"]["egress"][-1] == {"to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}]}
    pods = docs[3:]
    assert [p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchFields"][0]["values"] for p in pods] == [["g01"], ["g02"]]
    assert pods[1]["metadata"]["name"] == "dlts-42-1-1"
    assert pods[0]["spec"]["priorityClassName"] == "gold"
    sc = pods[0]["spec"]["securityContext"]
    assert (sc["runAsUser"], sc["runAsGroup"], sc["supplementalGroups"]) == (1000, 1000, [5001])
    res = pods[0]["spec"]["containers"][0]["resources"]["limits"]
    assert res == {"cpu": "48", "memory": str(200 * GIB), "ephemeral-storage": str(8 * GIB), "nvidia.com/gpu": "8"}
    assert docs[0]["metadata"]["name"] == "dlts-42-1-endpoints"
    assert docs[0]["data"]["authorized_keys"] == KEY + "\n" and docs[0]["data"]["endpoints"] == ""


def test_dlts_render_without_a_uid_says_how_to_give_one(tmp_path):
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"vc": "v", "image": "i", "command": "c"}))
    result = _cli(["--job", str(job), "--user", "alice", "--nodes", "n1"], tmp_path)
    assert result.exit_code == 1 and "dlts user set alice --uid N --gid N" in result.output


def test_dlts_render_names_a_bad_kubernetes_key_in_the_config(tmp_path):
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"vc": "v", "image": "i", "command": "c"}))
    result = CliRunner().invoke(__import__("dlts.cli", fromlist=["main"]).main,
                                ["--config", str(_write(tmp_path, {"kubernetes": {"namespac": "x"}})), "render",
                                 "--job", str(job), "--user", "a", "--nodes", "n1", "--uid", "5"],
                                env={"DLTS_HOME": str(tmp_path / "home")})
    assert result.exit_code != 0 and "kubernetes.namespac" in result.output


def _write(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("body,args,message", [
    ({"vc": "v", "image": "i"}, [], "command"),
    ({"vc": "v", "image": "i", "command": "c", "type": "distributed", "nodes": 3}, ["--nodes", "a,b"], "exactly that many"),
    ({"vc": "v", "image": "i", "command": "c"}, ["--nodes", "a,b"], "runs on one node"),
    ({"vc": "v", "image": "bad image", "command": "c"}, [], "image: an image reference has no spaces"),
    ({"vc": "v", "image": "i", "command": "c", "env": {"MASTER_ADDR": "x"}}, [], "set by DLTS"),
])
def test_dlts_render_explains_bad_input_without_a_traceback(tmp_path, body, args, message):
    job = tmp_path / "job.json"
    job.write_text(json.dumps(body))
    nodes = [] if "--nodes" in args else ["--nodes", "n1"]
    result = _cli(["--job", str(job), "--user", "alice", "--uid", "1000", *nodes, *args], tmp_path)
    assert result.exit_code != 0
    assert message in result.output and "Traceback" not in result.output


def test_dlts_render_rejects_a_file_that_is_not_json(tmp_path):
    job = tmp_path / "job.json"
    job.write_text("{nope")
    result = _cli(["--job", str(job), "--user", "a", "--nodes", "n1"], tmp_path)
    assert result.exit_code == 1 and "not valid JSON" in result.output
