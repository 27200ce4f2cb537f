"""Rendered manifests: golden files per job type, YAML-injection and privilege-escalation resistance,
operator template overrides, and ``dlts render``."""

from __future__ import annotations

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

from dlts.backends.base import RegistryCredential
from dlts.backends.k8s_render import (
    DEFAULT_TEMPLATES_DIR,
    LaunchRefused,
    ManifestRenderer,
    NfsVolume,
    PrivilegedFeature,
    RenderSettings,
    TemplateError,
    label_value,
    render_yaml,
)

GOLDEN = Path(__file__).parent / "golden"
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq alice@laptop"

CASES = {
    "batch": make_spec(101, command="python train.py --epochs 3", gpus=1),
    "interactive": make_spec(102, type="interactive", command="jupyter lab --ip=0.0.0.0", gpus=2,
                             ports=(22, 8888), ssh_public_keys=(KEY,)),
    "distributed": make_spec(103, type="distributed", command="torchrun train.py", nodes=("n1", "n2"), gpus=8,
                             env={"NCCL_DEBUG": "INFO"}),
    "inference": make_spec(104, type="inference", command="python serve.py", nodes=("n3", "n4"), gpus=1,
                           preemptible=True, ports=(8080,)),
    "cpu_with_storage_and_registry": make_spec(
        105, command="python etl.py", gpus=0, user="bob.smith@example.com", vc="data",
        image="registry.example.com/team/etl:1.2", log_path="/dlts/logs/105/attempt-1.log",
        registry_credentials=(RegistryCredential("registry.example.com", "bob", "s3cret"),)),
}
SETTINGS = RenderSettings(
    namespace="dlts",
    nfs_volumes={"*": (NfsVolume("home", "nfs.example.com", "/export/home", "/home"),),
                 "data": (NfsVolume("datasets", "nfs.example.com", "/export/datasets", "/datasets", read_only=True),)},
    log_volume=NfsVolume("logs", "nfs.example.com", "/export/dlts-logs", "/dlts/logs"),
)


SUPERVISOR = DEFAULT_TEMPLATES_DIR / "endpoint-supervisor.sh"


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


def test_cpu_jobs_see_no_gpus_and_storage_is_mounted():
    [secret, _configmap, pod] = ManifestRenderer(SETTINGS).render(CASES["cpu_with_storage_and_registry"]).all()
    env = env_of(pod)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "nvidia.com/gpu" not in pod["spec"]["containers"][0]["resources"]["limits"]
    mounts = {m["mountPath"]: m["readOnly"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/home"] is False and mounts["/datasets"] is True and mounts["/dlts/logs"] is False
    assert env["DLTS_LOG_PATH"] == "/dlts/logs/105/attempt-1.log"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "dlts-105-1-registry"}]
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    assert pod["metadata"]["annotations"]["dlts.io/user"] == "bob.smith@example.com"
    assert LABEL_VALUE.match(pod["metadata"]["labels"]["dlts.io/user"])


def test_the_job_runs_under_an_init_that_forwards_signals_to_the_group():
    [pod] = ManifestRenderer(SETTINGS).render(CASES["batch"]).pods
    script = pod["spec"]["containers"][0]["command"]
    assert script[:2] == ["/bin/sh", "-c"]
    assert 'exec "$init" -g -- /bin/sh -c "$DLTS_COMMAND"' in script[2]
    assert "python train.py" not in script[2]  # the command only travels in the environment
    assert pod["spec"]["initContainers"][0]["volumeMounts"][0]["mountPath"] == "/dlts-runtime"


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
    spec = make_spec(7, command=evil, user=evil, vc=evil, env={"HOSTILE": evil}, type="distributed",
                     nodes=("n1", "n2"))
    rendered = ManifestRenderer(RenderSettings()).render(spec)
    for pod in rendered.pods:
        assert set(pod["spec"]) == set(rendered.pods[0]["spec"])
        assert pod["spec"]["hostNetwork"] is False and "hostPID" not in pod["spec"]
        assert pod["spec"]["containers"][0]["securityContext"] == {"privileged": False,
                                                                   "allowPrivilegeEscalation": False}
        env = env_of(pod)
        assert env["DLTS_COMMAND"] == evil and env["HOSTILE"] == evil and env["DLTS_USER"] == evil
        assert pod["metadata"]["annotations"]["dlts.io/vc"] == evil
        assert all(LABEL_VALUE.match(v) and len(v) <= 63 for v in pod["metadata"]["labels"].values())
    assert len(rendered.pods) == 2 and len(rendered.services) == 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=60),
       user=st.text(min_size=1, max_size=80).filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s)))
def test_any_text_round_trips_through_the_yaml(text, user):
    spec = make_spec(8, command="run " + text, user=user, env={"V": text})
    [pod] = ManifestRenderer(RenderSettings()).render(spec).pods
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
    ("ssh_public_keys", ("ssh-ed25519 AAAA x\nssh-rsa BBBB y",), "single-line"),
    ("ports", (0,), "not a TCP port"),
    ("command", "   ", "command is empty"),
    ("privileged", True, "does not allow privileged"),
    ("host_ipc", True, "does not allow host_ipc"),
    ("host_paths", ("/",), "does not allow host_path"),
])
def test_bad_or_escalating_fields_are_refused_with_a_reason(field, value, message):
    with pytest.raises(LaunchRefused, match=re.escape(message)):
        ManifestRenderer(RenderSettings()).render(make_spec(9, **{field: value}))


def test_policy_for_every_vc_and_path_checks():
    renderer = ManifestRenderer(RenderSettings(privileged_policy={"*": frozenset({PrivilegedFeature.HOST_PATH})}))
    [pod] = renderer.render(make_spec(9, host_paths=("/scratch",))).pods
    assert pod["spec"]["volumes"][-1]["hostPath"]["path"] == "/scratch"
    with pytest.raises(LaunchRefused, match="absolute path"):
        renderer.render(make_spec(9, host_paths=("/scratch/../etc",)))


def _override(tmp_path: Path, transform) -> RenderSettings:
    text = (DEFAULT_TEMPLATES_DIR / "pod.yaml.j2").read_text()
    (tmp_path / "pod.yaml.j2").write_text(transform(text))
    return RenderSettings(templates_dir=str(tmp_path))


def test_an_operator_template_override_is_used_and_others_fall_back(tmp_path):
    settings = _override(tmp_path, lambda t: t.replace("  restartPolicy: Never\n",
                                                       "  restartPolicy: Never\n  priorityClassName: dlts-jobs\n"))
    rendered = ManifestRenderer(settings).render(CASES["distributed"])
    assert rendered.pods[0]["spec"]["priorityClassName"] == "dlts-jobs"
    assert rendered.services[0]["spec"]["clusterIP"] == "None"  # from the default templates


def test_a_template_cannot_grant_what_the_policy_does_not(tmp_path):
    settings = _override(tmp_path, lambda t: t.replace("  hostIPC: {{ job.host_ipc }}", "  hostIPC: true"))
    with pytest.raises(LaunchRefused, match="host_ipc"):
        ManifestRenderer(settings).render(CASES["batch"])
    settings = _override(tmp_path, lambda t: t.replace("        privileged: {{ job.privileged }}",
                                                       "        privileged: false\n        capabilities: {add: [SYS_ADMIN]}"))
    with pytest.raises(LaunchRefused, match="capabilities.add"):
        ManifestRenderer(settings).render(CASES["batch"])


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
        ManifestRenderer(_override(tmp_path, transform)).render(CASES["batch"])


# -- dlts render ------------------------------------------------------------------------------------


def _cli(args: list[str], tmp_path: Path):
    from dlts.cli import main

    env = {"DLTS_HOME": str(tmp_path / "home")}
    return CliRunner().invoke(main, ["render", *args], env=env, catch_exceptions=False)


def test_dlts_render_prints_the_objects_of_a_job_body(tmp_path):
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"vc": "vision", "image": "pytorch/pytorch:2.3", "command": "torchrun t.py",
                               "type": "distributed", "gpus": 8, "nodes": 2, "ssh": True, "memory": "200Gi",
                               "cpu": 48}))
    keyfile = tmp_path / "id.pub"
    keyfile.write_text(KEY + "\n")
    result = _cli(["--job", str(job), "--user", "alice", "--nodes", "g01,g02", "--job-id", "42",
                   "--ssh-key-file", str(keyfile)], tmp_path)
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.output))
    # no endpoint Service: the job manager exposes endpoints (ssh here) once the job runs
    assert [d["kind"] for d in docs] == ["ConfigMap", "Service", "Pod", "Pod"]
    pods = docs[2:]
    assert [p["spec"]["nodeName"] for p in pods] == ["g01", "g02"]
    assert pods[1]["metadata"]["name"] == "dlts-42-1-1"
    res = pods[0]["spec"]["containers"][0]["resources"]["limits"]
    assert res == {"cpu": "48", "memory": str(200 * GIB), "nvidia.com/gpu": "8"}
    assert docs[0]["metadata"]["name"] == "dlts-42-1-endpoints"
    assert docs[0]["data"]["authorized_keys"] == KEY + "\n" and docs[0]["data"]["endpoints"] == ""


@pytest.mark.parametrize("body,args,message", [
    ({"vc": "v", "image": "i"}, [], "command"),
    ({"vc": "v", "image": "i", "command": "c", "type": "distributed", "nodes": 3}, ["--nodes", "a,b"], "exactly that many"),
    ({"vc": "v", "image": "i", "command": "c"}, ["--nodes", "a,b"], "runs on one node"),
    ({"vc": "v", "image": "bad image", "command": "c"}, [], "not a valid image"),
    ({"vc": "v", "image": "i", "command": "c", "env": {"MASTER_ADDR": "x"}}, [], "set by DLTS"),
])
def test_dlts_render_explains_bad_input_without_a_traceback(tmp_path, body, args, message):
    job = tmp_path / "job.json"
    job.write_text(json.dumps(body))
    nodes = [] if "--nodes" in args else ["--nodes", "n1"]
    result = _cli(["--job", str(job), "--user", "alice", *nodes, *args], tmp_path)
    assert result.exit_code != 0
    assert message in result.output and "Traceback" not in result.output


def test_dlts_render_rejects_a_file_that_is_not_json(tmp_path):
    job = tmp_path / "job.json"
    job.write_text("{nope")
    result = _cli(["--job", str(job), "--user", "a", "--nodes", "n1"], tmp_path)
    assert result.exit_code == 1 and "not valid JSON" in result.output


def test_the_vc_policy_and_storage_from_the_database_apply():
    spec = make_spec(11, host_network=True, vc_pod_policy={"host_network": True, "privileged": False},
                     nfs_volumes=({"server": "10.0.0.5", "path": "/vision", "mount_path": "/data", "read_only": True},))
    [pod] = ManifestRenderer(RenderSettings()).render(spec).pods
    assert pod["spec"]["hostNetwork"] is True
    assert {"name": "nfs-0-vc0", "nfs": {"server": "10.0.0.5", "path": "/vision", "readOnly": True}} in pod["spec"]["volumes"]
    assert {"name": "nfs-0-vc0", "mountPath": "/data", "readOnly": True} in pod["spec"]["containers"][0]["volumeMounts"]
    with pytest.raises(LaunchRefused, match="privileged"):
        ManifestRenderer(RenderSettings()).render(make_spec(11, privileged=True, vc_pod_policy={"privileged": False}))
    with pytest.raises(TemplateError, match="host_netwrk"):
        ManifestRenderer(RenderSettings()).render(make_spec(11, vc_pod_policy={"host_netwrk": True}))
    with pytest.raises(TemplateError, match="mount_path"):
        ManifestRenderer(RenderSettings()).render(make_spec(11, nfs_volumes=({"server": "s", "path": "/p"},)))


def test_a_missing_templates_dir_is_named(tmp_path):
    with pytest.raises(TemplateError, match="is not a directory"):
        ManifestRenderer(RenderSettings(templates_dir=str(tmp_path / "nope")))
