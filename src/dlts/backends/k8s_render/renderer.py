"""``ManifestRenderer``: a ``LaunchSpec`` in, the Kubernetes objects of one attempt out.

It owns the Jinja templates operators may override (top-level ``templates/kubernetes/``), the
escaping that keeps user strings from changing the YAML structure, validation of every rendered
object against the official client's models, and assembling the attempt: the image pull secret,
the endpoint ConfigMap, the NetworkPolicy, the headless Service of a distributed job, and one pod
per placement (its identity, storage, resources and scheduling). It does no I/O besides reading
templates: ``dlts render`` and the backend share it.
"""

from __future__ import annotations

import base64
import enum
import json
import re
import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import pydantic
import yaml
from kubernetes import client as k8s

from dlts.backends.base import EndpointSpec, LaunchSpec
from dlts.backends.k8s_render.names import (
    ANNOTATION_LOG_KEY,
    ANNOTATION_USER,
    ANNOTATION_VC,
    ANNOTATION_WORLD_SIZE,
    GPU_RESOURCE,
    LABEL_INDEX,
    LABEL_PREEMPTIBLE,
    LABEL_ROLE,
    LABEL_TYPE,
    LABEL_USER,
    LABEL_VC,
    LaunchRefused,
    TemplateError,
    attempt_match,
    attempt_name,
    authorized_keys,
    endpoint_configmap_name,
    endpoint_lines,
    endpoint_port_name,
    endpoint_service_name,
    label_value,
    network_policy_name,
    pod_name,
    pull_secret_name,
)
from dlts.backends.k8s_render.policy import (
    Identity,
    allowed_features,
    check_pod_policy,
    check_spec,
    check_storage,
    identity,
)
from dlts.backends.k8s_render.scripts import (
    BUSYBOX,
    ENTRYPOINT,
    IDENTITY_SCRIPT,
    INIT_COMMAND,
    RUNTIME_DIR,
)
from dlts.backends.k8s_settings import KubernetesSettings, PrivilegedFeature

# Where the attempt's endpoint ConfigMap is mounted in every pod: ``endpoints`` (one line per
# endpoint: "ID KIND PORT [SECRET_SHA256]"), ``authorized_keys`` and ``supervisor.sh``.
ENDPOINTS_DIR = "/dlts-endpoints"
SUPERVISOR_TEMPLATE = "endpoint-supervisor.sh"
# The init containers copy one binary and write two small files.
INIT_RESOURCES = {"requests": {"cpu": "10m", "memory": "16Mi", "ephemeral-storage": "16Mi"},
                  "limits": {"cpu": "100m", "memory": "64Mi", "ephemeral-storage": "64Mi"}}
RUNTIME_VOLUME_LIMIT = "64Mi"
# net.ipv4.ip_unprivileged_port_start is a namespaced "safe" sysctl (allowed by every kubelet) from 1.22
SAFE_PORT_SYSCTL_SINCE = (1, 22)
SSH_CONTAINER_PORT_WITHOUT_SYSCTL = 2222  # where sshd listens in the container on older clusters
DNS_NAMESPACE = "kube-system"
# An inference replica's readiness probe (docs/kubernetes.md, "Readiness of inference replicas"): a TCP
# connect to the job's first declared port every 5 s; 3 misses in a row take the replica out of its
# Service until it answers again. No liveness probe: a replica loading a large model may not listen for
# many minutes, and a liveness probe would kill it over and over before it ever served.
READINESS_PERIOD_S = 5
READINESS_TIMEOUT_S = 2
READINESS_FAILURES = 3
TEMPLATES = ("pod.yaml.j2", "headless-service.yaml.j2", "endpoint-service.yaml.j2", "endpoint-configmap.yaml.j2",
             "network-policy.yaml.j2", "secret.yaml.j2", SUPERVISOR_TEMPLATE)

# libyaml's loader when present: the pure-Python one is 90% of a launch's CPU time.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# The repository's top-level templates/ ships inside the wheel as dlts/templates/; an editable
# install or a checkout reads it in place.
_PACKAGED_TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "kubernetes"
_CHECKOUT_TEMPLATES = Path(__file__).resolve().parents[4] / "templates" / "kubernetes"
DEFAULT_TEMPLATES_DIR = _PACKAGED_TEMPLATES if _PACKAGED_TEMPLATES.is_dir() else _CHECKOUT_TEMPLATES


@dataclass(frozen=True)
class RenderedAttempt:
    """The objects of one attempt, in creation order: what the pods use (pull secret, endpoint
    ConfigMap, NetworkPolicy, Services) before the pods."""

    secrets: tuple[dict, ...]
    services: tuple[dict, ...]
    pods: tuple[dict, ...]
    configmaps: tuple[dict, ...] = ()
    network_policies: tuple[dict, ...] = ()

    def all(self) -> tuple[dict, ...]:
        return self.secrets + self.configmaps + self.network_policies + self.services + self.pods


# -- YAML-safe rendering ------------------------------------------------------------------------

# Everything beyond printable ASCII is written as a YAML escape: PyYAML refuses some characters
# in a stream even inside quotes (C1 controls, U+FFFE), drops a BOM, and JSON's own \\u escapes
# would split astral characters into surrogate halves that YAML does not rejoin.
_NON_ASCII = re.compile("[^\x20-\x7e]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _yaml_escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


# One encoder for every value (``json.dumps`` with options builds a new one per call; a pod has ~50
# values); strings, most of them, straight through the C string encoder the encoder itself uses.
_encode = json.JSONEncoder(ensure_ascii=False).encode
_encode_str = json.encoder.encode_basestring


def yaml_literal(value: Any) -> str:
    """Render ``value`` as a JSON literal, which YAML reads back as exactly ``value``.

    Every ``{{ ... }}`` in a template goes through this (Jinja ``finalize``): strings come out
    double-quoted with every quote, newline and control character escaped, so no user string can
    open a new key, list item or document.
    """
    if isinstance(value, jinja2.Undefined):
        str(value)  # StrictUndefined raises with the missing name
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, (tuple, frozenset, set)):
        value = list(value)
    try:
        text = _encode_str(value) if isinstance(value, str) else _encode(value)
    except (TypeError, ValueError) as exc:
        raise TemplateError(f"cannot render {type(value).__name__} value into a manifest: {exc}") from None
    if _SURROGATE.search(text):
        raise LaunchRefused("text contains an unpaired UTF-16 surrogate; send valid Unicode")
    recorded = getattr(_recording, "values", None)
    if recorded is not None:  # ManifestRenderer._render: the value goes in after parsing (see there)
        recorded.append(text)
        return f'"{_TOKEN}{len(recorded) - 1}@"'
    return _NON_ASCII.sub(_yaml_escape, text)


# -- parse once per shape ---------------------------------------------------------------------
#
# Parsing the rendered YAML was ~70 % of a launch's CPU. ``_render`` renders the template with
# every {{ value }} replaced by a token (``_TOKEN`` + its index), so the text depends only on the
# template's structure and control flow (how many containers, which optional blocks), not on the
# values; that text is parsed once and kept, and each render fills the kept structure with its own
# values (each one the JSON literal ``yaml_literal`` made of it, read back with ``json.loads``).
# A template that puts {{ ... }} inside a longer string cannot be filled and is refused.
_recording = threading.local()
_TOKEN = f"@dlts-{secrets.token_hex(6)}-"
_SHAPES_MAX = 512


def _environment(templates_dir: str | None) -> jinja2.Environment:
    paths = []
    if templates_dir:
        if not Path(templates_dir).is_dir():
            raise TemplateError(f"templates_dir {templates_dir} is not a directory; fix the setting or remove it "
                                "to use the default templates")
        paths.append(str(Path(templates_dir) / "kubernetes") if (Path(templates_dir) / "kubernetes").is_dir()
                     else templates_dir)
    if DEFAULT_TEMPLATES_DIR.is_dir():
        paths.append(str(DEFAULT_TEMPLATES_DIR))
    elif not templates_dir:
        raise TemplateError(f"the default Kubernetes templates are not at {DEFAULT_TEMPLATES_DIR} (an installed "
                            "copy without the repository's templates/); set templates_dir to a directory holding "
                            + ", ".join(TEMPLATES))
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(paths),
        undefined=jinja2.StrictUndefined,
        finalize=yaml_literal,
        autoescape=False,
        keep_trailing_newline=True,
        # Templates are read once per process: without this every render stats each template
        # file to see whether it changed (a restart picks up an operator's edited template).
        auto_reload=False,
    )


_TOKEN_IN_JSON = re.compile(f'"{re.escape(_TOKEN)}(\\d+)@"')


def _skeleton(shape: Any, values: Sequence[str], doc: Any) -> tuple[tuple[str, ...], tuple[int, ...]] | None:
    """The shape as JSON text cut at its tokens (the literal pieces, and which value goes between
    each two), so that a render is one join and one ``json.loads`` instead of a walk in Python.
    None (fill by walking) when the text would not give back exactly what ``_fill`` made of
    this render's values: a key that is not a string, a value JSON cannot carry."""
    try:
        pieces = _TOKEN_IN_JSON.split(json.dumps(shape, ensure_ascii=False))
    except (TypeError, ValueError):
        return None
    skeleton = (tuple(pieces[0::2]), tuple(int(i) for i in pieces[1::2]))
    try:
        same = _fill_text(skeleton, values) == doc
    except ValueError:
        same = False
    return skeleton if same else None


def _fill_text(skeleton: tuple[tuple[str, ...], tuple[int, ...]], values: Sequence[str]) -> Any:
    """``_fill`` for a shape cut by ``_skeleton``: each token's place gets its value's JSON literal."""
    literals, indexes = skeleton
    parts = [literals[0]]
    for index, literal in zip(indexes, literals[1:]):
        parts.append(values[index])
        parts.append(literal)
    return json.loads("".join(parts))


def _fill(node: Any, values: Sequence[str], template: str) -> Any:
    """A copy of the parsed ``node`` with every token replaced by its value."""
    if isinstance(node, str):
        if _TOKEN in node:
            if not (node.startswith(_TOKEN) and node.endswith("@") and node[len(_TOKEN):-1].isdecimal()):
                raise TemplateError(f"template {template} puts {{{{ ... }}}} inside a longer string; write each "
                                    "value on its own (a key's whole value or a list item), DLTS quotes it")
            return json.loads(values[int(node[len(_TOKEN):-1])])
        return node
    if isinstance(node, dict):
        return {_fill(k, values, template): _fill(v, values, template) for k, v in node.items()}
    if isinstance(node, list):
        return [_fill(item, values, template) for item in node]
    return node


_MODELS: dict[str, type[pydantic.BaseModel]] = {
    "Pod": k8s.V1Pod, "Service": k8s.V1Service, "Secret": k8s.V1Secret, "ConfigMap": k8s.V1ConfigMap,
    "NetworkPolicy": k8s.V1NetworkPolicy}


def to_model(doc: Mapping[str, Any], template: str) -> Any:
    """Parse one rendered document into the client's model (unknown fields and wrong types fail)."""
    kind = doc.get("kind") if isinstance(doc, Mapping) else None
    model = _MODELS.get(kind or "")
    if model is None:
        raise TemplateError(f"template {template} produced kind {kind!r}; expected one of {sorted(_MODELS)}")
    try:
        # model_validate, not from_dict: from_dict silently drops unknown keys (a typo in a template).
        return model.model_validate(dict(doc))
    except (pydantic.ValidationError, TypeError, ValueError) as exc:
        raise TemplateError(f"template {template} produced an invalid {kind}: {exc}") from None


def _quantity_cpu(cores: float) -> str:
    millis = max(1, round(cores * 1000))
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def _storage_volume_name(name: str) -> str:
    return f"storage-{name}"


# -- the renderer -------------------------------------------------------------------------------


class ManifestRenderer:
    """Renders the objects of an attempt from the templates; pure apart from reading templates."""

    def __init__(self, settings: KubernetesSettings, *, templates_dir: str | None = None,
                 termination_grace_s: float = 30) -> None:
        self.settings = settings
        self.templates_dir = templates_dir
        self.termination_grace_s = max(0, round(termination_grace_s))
        self._env = _environment(templates_dir)
        # rendered text with tokens -> (parsed, the same as JSON cut at its tokens; see _skeleton)
        self._shapes: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
        self._shapes_lock = threading.Lock()
        self._supervisor: str | None = None
        # (major, minor) of the API server the objects are for; None: the newest DLTS supports. The
        # backend sets it from the server's /version before its first launch.
        self.server_version: tuple[int, int] | None = None

    @property
    def unprivileged_port_sysctl(self) -> bool:
        """Whether pods may set ``net.ipv4.ip_unprivileged_port_start`` (a "safe" sysctl from
        Kubernetes 1.22; older kubelets refuse every pod that sets it, ``SysctlForbidden``)."""
        return self.server_version is None or self.server_version >= SAFE_PORT_SYSCTL_SINCE

    def container_port(self, endpoint: EndpointSpec) -> int:
        """The port the endpoint's server listens on in the container. ssh's endpoint port is 22;
        where the sysctl that lets the owner bind it is not allowed, sshd listens on
        ``SSH_CONTAINER_PORT_WITHOUT_SYSCTL`` and the Service and NetworkPolicy point there."""
        if endpoint.kind == "ssh" and not self.unprivileged_port_sysctl:
            return SSH_CONTAINER_PORT_WITHOUT_SYSCTL
        return int(endpoint.port)

    def _render(self, template: str, context: Mapping[str, Any]) -> dict:
        values: list[str] = []
        _recording.values = values
        try:
            text = self._env.get_template(template).render(**context)
        except jinja2.TemplateNotFound:
            raise TemplateError(f"template {template} not found in {self.templates_dir or DEFAULT_TEMPLATES_DIR}") from None
        except jinja2.UndefinedError as exc:
            raise TemplateError(f"template {template}: {exc}") from None
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"template {template} line {exc.lineno}: {exc.message}") from None
        finally:
            _recording.values = None
        with self._shapes_lock:
            entry = self._shapes.get(text)
            if entry is not None:
                self._shapes.move_to_end(text)
        if entry is not None:
            shape, skeleton = entry
            if skeleton is not None:
                try:
                    return _fill_text(skeleton, values)
                except ValueError:  # a value that cannot stand where its token is (a key): say why below
                    pass
            return _fill(shape, values, template)
        try:
            docs = [d for d in yaml.load_all(text, Loader=_SafeLoader) if d is not None]
        except yaml.YAMLError as exc:
            raise TemplateError(f"template {template} rendered invalid YAML: {exc}") from None
        if len(docs) != 1 or not isinstance(docs[0], dict):
            raise TemplateError(f"template {template} must render exactly one object, got {len(docs)}")
        shape = docs[0]
        doc = _fill(shape, values, template)
        # The client's models check the structure (a typo'd key, a list where a map belongs),
        # which is the shape's: once per shape is enough.
        to_model(doc, template)
        with self._shapes_lock:
            self._shapes[text] = (shape, _skeleton(shape, values, doc))
            while len(self._shapes) > _SHAPES_MAX:
                self._shapes.popitem(last=False)
        return doc

    def supervisor_script(self) -> str:
        """The endpoint supervisor (``endpoint-supervisor.sh``: the operator's copy when there is
        one). A shell script, not a Jinja template: it is shipped as it is."""
        if self._supervisor is None:
            try:
                text, _path, _uptodate = self._env.loader.get_source(self._env, SUPERVISOR_TEMPLATE)  # type: ignore[union-attr]
            except jinja2.TemplateNotFound:
                raise TemplateError(f"{SUPERVISOR_TEMPLATE} not found in {self.templates_dir or DEFAULT_TEMPLATES_DIR}"
                                    ) from None
            self._supervisor = text  # read once, as the templates are
        return self._supervisor

    def endpoint_configmap(self, job_id: int, attempt: int, labels: Mapping[str, str], annotations: Mapping[str, str],
                           endpoints: Sequence[EndpointSpec], ssh_public_keys: Iterable[str]) -> dict:
        """The attempt's endpoint ConfigMap: what the supervisor in the job's container serves."""
        doc = self._render("endpoint-configmap.yaml.j2", {
            "name": endpoint_configmap_name(job_id, attempt), "namespace": self.settings.namespace,
            "labels": dict(labels), "annotations": dict(annotations),
            "data": {"endpoints": endpoint_lines(endpoints, self.container_port),
                     "authorized_keys": authorized_keys(ssh_public_keys),
                     "supervisor.sh": self.supervisor_script()},
        })
        self._check_ownership(doc, job_id, attempt)
        return doc

    def endpoint_service(self, job_id: int, attempt: int, labels: Mapping[str, str], annotations: Mapping[str, str],
                         endpoints: Sequence[EndpointSpec], inference: bool) -> dict:
        """The attempt's NodePort Service: one port per endpoint, named ``e<id>``. It selects the
        pod of index 0, or every replica of an inference job (Kubernetes balances over them and
        drops a replica being removed)."""
        selector = attempt_match(job_id, attempt)
        if not inference:
            selector[LABEL_INDEX] = "0"
        doc = self._render("endpoint-service.yaml.j2", {
            "name": endpoint_service_name(job_id, attempt), "namespace": self.settings.namespace,
            "labels": dict(labels), "annotations": dict(annotations), "selector": selector,
            "ports": [{"name": endpoint_port_name(e.id), "port": e.port, "targetPort": self.container_port(e),
                       "protocol": "TCP"}
                      for e in sorted(endpoints, key=lambda e: e.id)],
        })
        self._check_ownership(doc, job_id, attempt)
        return doc

    def network_policy(self, job_id: int, attempt: int, labels: Mapping[str, str], annotations: Mapping[str, str],
                       open_ports: Iterable[int]) -> dict:
        """The attempt's NetworkPolicy: its pods reach each other, DNS and ``storage_cidrs``;
        other pods cannot reach them, except on ``open_ports`` (the job's declared ports and its
        endpoints' ports), which take traffic from anywhere: NodePort traffic, which the node
        agent's firewall guards. ``expose`` renders it again with the endpoints' ports."""
        doc = self._render("network-policy.yaml.j2", {
            "name": network_policy_name(job_id, attempt), "namespace": self.settings.namespace,
            "labels": dict(labels), "annotations": dict(annotations), "selector": attempt_match(job_id, attempt),
            "open_ports": sorted(set(open_ports)), "dns_namespace": DNS_NAMESPACE,
            "storage_cidrs": list(self.settings.storage_cidrs),
        })
        self._check_ownership(doc, job_id, attempt)
        return doc

    def _check_ownership(self, doc: Mapping[str, Any], job_id: int, attempt: int) -> None:
        """A rendered object stays in the configured namespace and keeps the labels DLTS finds it by."""
        meta = doc.get("metadata") or {}
        if meta.get("namespace") not in (None, self.settings.namespace):
            raise TemplateError(f"a template put {meta.get('name')} in namespace {meta.get('namespace')!r}; "
                                f"objects must go to the configured namespace {self.settings.namespace!r}")
        labels = meta.get("labels") or {}
        if any(labels.get(k) != v for k, v in attempt_match(job_id, attempt).items()):
            raise TemplateError(f"a template dropped DLTS's labels from {meta.get('name')}; keep "
                                "{{ labels }} in metadata.labels so DLTS can find its objects")

    @staticmethod
    def readiness_probe(spec: LaunchSpec) -> dict | None:
        """The job container's readinessProbe: a TCP connect to an inference job's first declared
        port (the port it serves on), None for the other types and for an inference job that
        declares no port. Readiness gates the replica's place in the endpoint Service; it never
        restarts or fails anything."""
        if spec.type != "inference" or not spec.ports:
            return None
        return {"tcpSocket": {"port": int(spec.ports[0])}, "periodSeconds": READINESS_PERIOD_S,
                "timeoutSeconds": READINESS_TIMEOUT_S, "successThreshold": 1, "failureThreshold": READINESS_FAILURES}

    def render(self, spec: LaunchSpec) -> RenderedAttempt:
        s = self.settings
        allowed = allowed_features(s, spec)
        check_spec(spec)
        who = identity(spec, allowed)
        storage = check_storage(spec)
        base = attempt_name(spec.job_id, spec.attempt)
        distributed = spec.type == "distributed"
        inference = spec.type == "inference"
        world = len(spec.placements)
        common_labels = {
            **attempt_match(spec.job_id, spec.attempt),
            LABEL_VC: label_value(spec.vc),
            LABEL_USER: label_value(spec.user),
            LABEL_TYPE: label_value(spec.type),
            LABEL_PREEMPTIBLE: "true" if spec.preemptible else "false",
        }
        annotations = {ANNOTATION_USER: spec.user, ANNOTATION_VC: spec.vc, ANNOTATION_WORLD_SIZE: str(world),
                       **({ANNOTATION_LOG_KEY: spec.log_key} if spec.log_key else {})}

        secrets: list[dict] = []
        pull_secrets: list[str] = []
        if spec.registry_credentials:
            auths = {c.server: {"username": c.username, "password": c.password,
                                "auth": base64.b64encode(f"{c.username}:{c.password}".encode()).decode()}
                     for c in spec.registry_credentials}
            payload = json.dumps({"auths": auths}, sort_keys=True).encode()
            secrets.append(self._render("secret.yaml.j2", {
                "name": pull_secret_name(spec.job_id, spec.attempt), "namespace": s.namespace,
                "labels": common_labels, "annotations": annotations, "type": "kubernetes.io/dockerconfigjson",
                "data": {".dockerconfigjson": base64.b64encode(payload).decode()},
            }))
            pull_secrets.append(pull_secret_name(spec.job_id, spec.attempt))

        # pulled with credentials: pulled every time, so the registry checks them every time (a
        # cached private image is otherwise any tenant's on that node); IfNotPresent only where the
        # VC's policy allows cached_private_images
        pull_policy = ("" if not pull_secrets else
                       "IfNotPresent" if PrivilegedFeature.CACHED_PRIVATE_IMAGES in allowed else "Always")

        policies = [self.network_policy(spec.job_id, spec.attempt, common_labels, annotations, spec.ports)] \
            if s.network_policy else []

        services: list[dict] = []
        if distributed:
            services.append(self._render("headless-service.yaml.j2", {
                "name": base, "namespace": s.namespace, "labels": common_labels, "annotations": annotations,
                "selector": attempt_match(spec.job_id, spec.attempt), "master_port": s.master_port,
            }))
        # Endpoints (ssh, Jupyter, VS Code, ports) are exposed by ``expose`` once the job runs: its
        # NodePort Service and the ConfigMap the supervisor reads are made then (the pods mount the
        # ConfigMap as optional; the entrypoint starts the supervisor when the kubelet has filled
        # it in). A distributed job's pods get it from the start (empty list): its authorized_keys
        # are what lets them ssh to each other. Most jobs never open an endpoint, and this
        # ConfigMap (with the supervisor script, ~12 KB) was a third of a launch's requests.
        configmaps = (self.endpoint_configmap(spec.job_id, spec.attempt, common_labels, annotations, (),
                                              spec.ssh_public_keys),) if distributed else ()

        volumes: list[dict] = [
            {"name": "dlts-runtime", "emptyDir": {"sizeLimit": RUNTIME_VOLUME_LIMIT}},
            {"name": "dlts-endpoints", "configMap": {"name": endpoint_configmap_name(spec.job_id, spec.attempt),
                                                     "optional": True, "defaultMode": 0o444}}]
        mounts: list[dict] = [{"name": "dlts-runtime", "mountPath": RUNTIME_DIR, "readOnly": True},
                              {"name": "dlts-endpoints", "mountPath": ENDPOINTS_DIR, "readOnly": True}]
        if who.login:
            mounts += [{"name": "dlts-runtime", "mountPath": "/etc/passwd", "subPath": "passwd", "readOnly": True},
                       {"name": "dlts-runtime", "mountPath": "/etc/group", "subPath": "group", "readOnly": True}]
        storage_host_paths: dict[str, str] = {}
        home = ""
        for mount in storage:
            vname = _storage_volume_name(mount.name)
            if mount.kind == "nfs":
                volumes.append({"name": vname, "nfs": {"server": mount.server, "path": mount.path,
                                                       "readOnly": mount.read_only}})
            else:
                volumes.append({"name": vname, "hostPath": {"path": mount.path, "type": "Directory"}})
                storage_host_paths[vname] = mount.path
            mounts.append({"name": vname, "mountPath": mount.mount_path, "readOnly": mount.read_only})
            if mount.name == "home" and not mount.read_only:
                home = mount.mount_path
        # A uid the image does not know gets HOME=/ (not writable): the owner's home directory when
        # the VC mounts one, else a directory the entrypoint makes in the container.
        home = str(spec.env.get("HOME") or home or (f"/tmp/{who.login}" if who.login else "/root"))

        ephemeral = int(spec.ephemeral_storage_bytes or s.default_ephemeral_storage_bytes)
        priority_class = s.preemptible_priority_class if spec.preemptible else s.priority_class
        identity_init = self._identity_init(who, home)
        readiness = self.readiness_probe(spec)
        pods: list[dict] = []
        for rank, (index, placement) in enumerate(spec.indexed()):
            gpus = len(placement.gpu_indices)
            env: dict[str, str] = dict(sorted((str(k), str(v)) for k, v in spec.env.items()))
            env.update({
                "DLTS_JOB_ID": str(spec.job_id), "DLTS_ATTEMPT": str(spec.attempt), "DLTS_USER": spec.user,
                "DLTS_VC": spec.vc, "DLTS_NUM_GPUS": str(gpus), "DLTS_COMMAND": spec.command,
                # the node agent labels GPU metrics with it
                "DLTS_PREEMPTIBLE": "1" if spec.preemptible else "0",
                # CUDA's device indexes in NVML's (PCI bus) order, the order the node agent reports
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "HOME": home,
            })
            if inference:
                env["DLTS_REPLICA"] = str(index)
            if gpus == 0:
                # Without a GPU limit the NVIDIA runtime would expose every GPU of the node.
                env["NVIDIA_VISIBLE_DEVICES"] = "void"
            # Every pod sees the job owner's keys (ssh between the pods of a distributed job); the
            # pods the endpoint Service selects also run the endpoint supervisor.
            env["DLTS_SSH_AUTHORIZED_KEYS"] = f"{ENDPOINTS_DIR}/authorized_keys"
            if inference or index == 0:
                env["DLTS_ENDPOINTS_DIR"] = ENDPOINTS_DIR
            if distributed:
                local = max(gpus, 1)
                env.update({
                    "MASTER_ADDR": f"{pod_name(spec.job_id, spec.attempt, 0)}.{base}.{s.namespace}.svc",
                    "MASTER_PORT": str(s.master_port),
                    "NNODES": str(world), "NODE_RANK": str(rank),
                    "LOCAL_WORLD_SIZE": str(local), "WORLD_SIZE": str(world * local), "RANK": str(rank * local),
                })
            resources: dict[str, str] = {"cpu": _quantity_cpu(placement.cpu), "memory": str(int(placement.memory_bytes)),
                                         "ephemeral-storage": str(ephemeral)}
            if gpus:
                resources[GPU_RESOURCE] = str(gpus)
            role = ("master" if rank == 0 else "worker") if distributed else (
                "replica" if inference else "master")
            pod = {
                "name": pod_name(spec.job_id, spec.attempt, index),
                "node": placement.node,
                "labels": {**common_labels, LABEL_ROLE: role, LABEL_INDEX: str(index)},
                "annotations": annotations,
                "env": [{"name": k, "value": v} for k, v in env.items()],
                "resources": resources,
            }
            doc = self._render("pod.yaml.j2", {
                "namespace": s.namespace, "pod": pod, "headless_service": base,
                "priority_class": priority_class, "termination_grace_s": self.termination_grace_s,
                "identity": {"uid": who.uid, "gid": who.gid, "root": who.root,
                             "groups": list(who.supplemental_groups)},
                "init_image": s.init_image, "init_command": list(INIT_COMMAND), "init_resources": INIT_RESOURCES,
                "identity_init": identity_init, "command": [BUSYBOX, "sh", "-c", ENTRYPOINT],
                "image_pull_secrets": pull_secrets, "volumes": volumes, "volume_mounts": mounts,
                "ports": list(spec.ports), "unprivileged_port_sysctl": self.unprivileged_port_sysctl,
                "readiness_probe": readiness,
                "job": {"id": spec.job_id, "attempt": spec.attempt, "image": spec.image, "type": spec.type,
                        "distributed": distributed, "pull_policy": pull_policy},
            })
            check_pod_policy(doc, allowed, storage_host_paths, frozenset({s.init_image}))
            pods.append(doc)
        for doc in secrets + services + pods:
            self._check_ownership(doc, spec.job_id, spec.attempt)
        return RenderedAttempt(tuple(secrets), tuple(services), tuple(pods), configmaps, tuple(policies))

    @staticmethod
    def _identity_init(who: Identity, home: str) -> dict | None:
        """The second init container's command and env (None: nobody to add to /etc/passwd)."""
        if not who.login:
            return None
        return {"command": [BUSYBOX, "sh", "-c", IDENTITY_SCRIPT],
                "env": [{"name": "DLTS_LOGIN", "value": who.login}, {"name": "DLTS_UID", "value": str(who.login_uid)},
                        {"name": "DLTS_GID", "value": str(who.login_gid)},
                        {"name": "DLTS_GROUPS", "value": " ".join(str(g) for g in who.supplemental_groups)},
                        {"name": "HOME", "value": home}]}


class _ReadableDumper(yaml.SafeDumper):
    """Multi-line strings (the scripts, the supervisor) as literal blocks, readable in a review."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_ReadableDumper.add_representer(str, _represent_str)


def render_yaml(objects: Iterable[Mapping[str, Any]]) -> str:
    """The objects as a YAML stream (for ``dlts render`` and golden files)."""
    return yaml.dump_all([dict(o) for o in objects], Dumper=_ReadableDumper, sort_keys=False,
                         default_flow_style=False, allow_unicode=True, width=120)
