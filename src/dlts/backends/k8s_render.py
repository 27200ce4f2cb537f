"""Turning a ``LaunchSpec`` into the Kubernetes objects of one attempt.

This module owns the manifests: deterministic names and labels, the Jinja templates operators may
override (top-level ``templates/kubernetes/``), the endpoint objects (the NodePort Service and the
ConfigMap the in-container supervisor reads), the escaping that keeps user strings from changing
the YAML structure, validation of the result against the official client's models, and the
privilege policy (no privileged / hostNetwork / hostIPC / hostPID / hostPath / added capabilities
unless the job's VC allows it). The policy is checked on the *rendered* objects, so a customised
template cannot grant what the cluster admin did not allow either.

It does no I/O besides reading templates: ``dlts render`` and the backend share it.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import pydantic
import yaml
from kubernetes import client as k8s

from dlts.backends.base import EndpointSpec, LaunchSpec

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "dlts"
LABEL_JOB_ID = "dlts.io/job-id"
LABEL_ATTEMPT = "dlts.io/attempt"
LABEL_VC = "dlts.io/vc"
LABEL_USER = "dlts.io/user"
LABEL_TYPE = "dlts.io/type"
LABEL_PREEMPTIBLE = "dlts.io/preemptible"
LABEL_ROLE = "dlts.io/role"
LABEL_INDEX = "dlts.io/index"
ANNOTATION_USER = "dlts.io/user"
ANNOTATION_VC = "dlts.io/vc"
ANNOTATION_WORLD_SIZE = "dlts.io/pods"
# Set on an inference replica's pod by scale-down before it is deleted: its ending is on purpose.
ANNOTATION_RETIRING = "dlts.io/retiring"
GPU_RESOURCE = "nvidia.com/gpu"
RUNTIME_DIR = "/dlts-runtime"
# Where the attempt's endpoint ConfigMap is mounted in every pod: ``endpoints`` (one line per
# endpoint: "ID KIND PORT [SECRET_SHA256]"), ``authorized_keys`` and ``supervisor.sh``.
ENDPOINTS_DIR = "/dlts-endpoints"
SUPERVISOR_TEMPLATE = "endpoint-supervisor.sh"
ENDPOINT_KINDS = frozenset({"ssh", "jupyter", "vscode", "port"})
_SECRET_HASH = re.compile(r"^[0-9a-f]{64}$")

# Environment the backend owns; a job's own env may not override these names.
RESERVED_ENV = frozenset({
    "DLTS_JOB_ID", "DLTS_ATTEMPT", "DLTS_USER", "DLTS_VC", "DLTS_NUM_GPUS", "DLTS_COMMAND", "DLTS_PREEMPTIBLE",
    "DLTS_LOG_PATH", "DLTS_SSH_AUTHORIZED_KEYS", "DLTS_ENDPOINTS_DIR", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK",
    "LOCAL_WORLD_SIZE", "NODE_RANK", "NNODES", "NVIDIA_VISIBLE_DEVICES", "DLTS_REPLICA",
})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SSH_KEY = re.compile(r"^(ssh-[a-z0-9-]+|ecdsa-sha2-[a-z0-9-]+|sk-[a-z0-9@.-]+) [A-Za-z0-9+/=]+( [^\r\n]*)?$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/:@]*$")

# The job container's PID 1: an init that forwards signals to the whole process group (-g) and
# reaps zombies. tini from the image when it has one, else the static tini the init container
# copied into the shared emptyDir. The user's command is only ever read from $DLTS_COMMAND, never
# pasted into this script, so no quoting in it can escape. On the pods that serve the job's
# endpoints ($DLTS_ENDPOINTS_DIR set), the endpoint supervisor runs in the background first, its
# output in the job's log.
ENTRYPOINT = (
    'if [ -n "${DLTS_LOG_PATH:-}" ]; then mkdir -p "$(dirname "$DLTS_LOG_PATH")" && '
    'exec >>"$DLTS_LOG_PATH" 2>&1; fi; '
    'if [ -n "${DLTS_ENDPOINTS_DIR:-}" ] && [ -r "$DLTS_ENDPOINTS_DIR/supervisor.sh" ]; then '
    '/bin/sh "$DLTS_ENDPOINTS_DIR/supervisor.sh" </dev/null & fi; '
    "if command -v tini >/dev/null 2>&1; then init=tini; else init=" + RUNTIME_DIR + "/tini; fi; "
    'exec "$init" -g -- /bin/sh -c "$DLTS_COMMAND"'
)
INIT_COPY = f"cp /bin/busybox {RUNTIME_DIR}/busybox && chmod 0755 {RUNTIME_DIR}/busybox"

# libyaml's loader when present: the pure-Python one is 90% of a launch's CPU time.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# The repository's top-level templates/ ships inside the wheel as dlts/templates/; an editable
# install or a checkout reads it in place.
_PACKAGED_TEMPLATES = Path(__file__).resolve().parents[1] / "templates" / "kubernetes"
_CHECKOUT_TEMPLATES = Path(__file__).resolve().parents[3] / "templates" / "kubernetes"
DEFAULT_TEMPLATES_DIR = _PACKAGED_TEMPLATES if _PACKAGED_TEMPLATES.is_dir() else _CHECKOUT_TEMPLATES


class PrivilegedFeature(str, enum.Enum):
    """What a VC's policy may allow its jobs (cluster admin setting); nothing is allowed by default."""

    PRIVILEGED = "privileged"  # privileged containers, privilege escalation, added capabilities
    HOST_NETWORK = "host_network"
    HOST_IPC = "host_ipc"
    HOST_PID = "host_pid"
    HOST_PATH = "host_path"


@dataclass(frozen=True)
class NfsVolume:
    """A VC storage export mounted into that VC's jobs (Kubernetes ``nfs`` volume type)."""

    name: str
    server: str
    path: str
    mount_path: str
    read_only: bool = False


@dataclass(frozen=True)
class RenderSettings:
    namespace: str = "default"
    templates_dir: str | None = None  # operator override; files missing there come from the default
    init_image: str = "docker.io/library/debian:12"  # any image with /usr/bin/tini-static
    master_port: int = 29500
    termination_grace_s: int = 30
    # VC name -> volumes; the key "*" applies to every VC.
    nfs_volumes: Mapping[str, tuple[NfsVolume, ...]] = field(default_factory=dict)
    # VC name -> features its jobs may use; the key "*" applies to every VC.
    privileged_policy: Mapping[str, frozenset[PrivilegedFeature]] = field(default_factory=dict)
    log_volume: NfsVolume | None = None  # where ``LaunchSpec.log_path`` lives, mounted into every pod


class LaunchRefused(ValueError):
    """The job cannot be launched as asked (bad field, policy); retrying will not help."""


class TemplateError(RuntimeError):
    """Operator configuration is wrong: a template that does not render into a valid object, or a
    VC's pod policy / storage entry DLTS cannot read. Fix the configuration, not the job."""


@dataclass(frozen=True)
class RenderedAttempt:
    """The objects of one attempt, in creation order (secrets, the endpoint ConfigMap and services
    before the pods that mount or use them)."""

    secrets: tuple[dict, ...]
    services: tuple[dict, ...]
    pods: tuple[dict, ...]
    configmaps: tuple[dict, ...] = ()

    def all(self) -> tuple[dict, ...]:
        return self.secrets + self.configmaps + self.services + self.pods


# -- names and labels ---------------------------------------------------------------------------


def attempt_name(job_id: int, attempt: int) -> str:
    return f"dlts-{int(job_id)}-{int(attempt)}"


def pod_name(job_id: int, attempt: int, index: int) -> str:
    return f"{attempt_name(job_id, attempt)}-{int(index)}"


def label_value(text: str) -> str:
    """A valid label value for ``text``: itself when valid, else a readable, unique stand-in.

    User and VC names are free text to us (e-mail addresses, dots, unicode); labels are not.
    The exact value always travels in an annotation next to the label.
    """
    if len(text) <= 63 and _LABEL_VALUE.match(text):
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:50].strip("-_.")
    return f"{cleaned}-{digest}" if cleaned else digest


def endpoint_service_name(job_id: int, attempt: int) -> str:
    return f"{attempt_name(job_id, attempt)}-ep"


def endpoint_configmap_name(job_id: int, attempt: int) -> str:
    return f"{attempt_name(job_id, attempt)}-endpoints"


def endpoint_port_name(endpoint_id: int) -> str:
    """The Service port of an endpoint (a DNS label, unique per job, stable across calls)."""
    return f"e{int(endpoint_id)}"


def endpoint_problem(endpoint: EndpointSpec) -> str | None:
    """Why ``endpoint`` cannot be exposed as given (None: it can). Rows are validated by the API;
    this keeps a bad row from breaking the line format the supervisor reads or opening an
    unprotected server."""
    if endpoint.kind not in ENDPOINT_KINDS:
        return f"unknown endpoint kind {endpoint.kind!r}; DLTS exposes {', '.join(sorted(ENDPOINT_KINDS))}"
    if isinstance(endpoint.port, bool) or not isinstance(endpoint.port, int) or not 1 <= endpoint.port <= 65535:
        return f"port {endpoint.port!r} is not a TCP port number (1-65535)"
    if endpoint.secret_hash and not _SECRET_HASH.match(endpoint.secret_hash):
        return "its token hash is not a SHA-256 hex digest; delete the endpoint and open it again"
    if endpoint.kind in ("jupyter", "vscode") and not endpoint.secret_hash:
        return f"a {endpoint.kind} endpoint needs a token (none recorded); delete the endpoint and open it again"
    return None


def endpoint_lines(endpoints: Sequence[EndpointSpec]) -> str:
    """The ConfigMap's ``endpoints`` file: "ID KIND PORT [SECRET_SHA256]" per line, by id."""
    return "".join(" ".join([str(int(e.id)), e.kind, str(int(e.port))] + ([e.secret_hash] if e.secret_hash else []))
                   + "\n" for e in sorted(endpoints, key=lambda e: e.id))


def valid_ssh_key(key: str) -> bool:
    return bool(_SSH_KEY.match(key.strip()))


def authorized_keys(keys: Iterable[str]) -> str:
    return "".join(k.strip() + "\n" for k in keys)


def attempt_selector(job_id: int, attempt: int) -> str:
    return f"{MANAGED_BY_LABEL}={MANAGED_BY},{LABEL_JOB_ID}={int(job_id)},{LABEL_ATTEMPT}={int(attempt)}"


MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"


# -- YAML-safe rendering ------------------------------------------------------------------------

# Everything beyond printable ASCII is written as a YAML escape: PyYAML refuses some characters
# in a stream even inside quotes (C1 controls, U+FFFE), drops a BOM, and JSON's own \\u escapes
# would split astral characters into surrogate halves that YAML does not rejoin.
_NON_ASCII = re.compile("[^\x20-\x7e]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _yaml_escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


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
        text = json.dumps(value, ensure_ascii=False, sort_keys=False)
    except (TypeError, ValueError) as exc:
        raise TemplateError(f"cannot render {type(value).__name__} value into a manifest: {exc}") from None
    if _SURROGATE.search(text):
        raise LaunchRefused("text contains an unpaired UTF-16 surrogate; send valid Unicode")
    return _NON_ASCII.sub(_yaml_escape, text)


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
                            "pod.yaml.j2, headless-service.yaml.j2, endpoint-service.yaml.j2, "
                            "endpoint-configmap.yaml.j2, endpoint-supervisor.sh and secret.yaml.j2")
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(paths),
        undefined=jinja2.StrictUndefined,
        finalize=yaml_literal,
        autoescape=False,
        keep_trailing_newline=True,
    )


# -- validation of inputs -----------------------------------------------------------------------


def _policy(settings: RenderSettings, spec: LaunchSpec) -> frozenset[PrivilegedFeature]:
    allowed = set(settings.privileged_policy.get(spec.vc, frozenset())) | set(
        settings.privileged_policy.get("*", frozenset()))
    known = {f.value: f for f in PrivilegedFeature}
    for key, value in spec.vc_pod_policy.items():
        if key not in known:
            raise TemplateError(f"VC {spec.vc}'s pod policy names {key!r}; known features: {', '.join(sorted(known))}")
        if value is True:
            allowed.add(known[key])
    return frozenset(allowed)


def _spec_volumes(spec: LaunchSpec) -> tuple[NfsVolume, ...]:
    out = []
    for i, entry in enumerate(getattr(spec, "nfs_volumes", ())):
        try:
            server, path, mount = (str(entry[k]) for k in ("server", "path", "mount_path"))
        except KeyError as exc:
            raise TemplateError(f"VC {spec.vc}'s storage nfs entry {i} lacks {exc.args[0]!r}; "
                                "each needs server, path and mount_path") from None
        if not mount.startswith("/") or not path.startswith("/"):
            raise TemplateError(f"VC {spec.vc}'s storage nfs entry {i}: path and mount_path must be absolute")
        out.append(NfsVolume(str(entry.get("name") or f"vc{i}"), server, path, mount,
                             bool(entry.get("read_only", False))))
    return tuple(out)


def _check_spec(spec: LaunchSpec, allowed: frozenset[PrivilegedFeature]) -> None:
    if not spec.placements:
        raise LaunchRefused(f"job {spec.job_id} attempt {spec.attempt} has no placement; the scheduler must place it first")
    if not spec.image or len(spec.image) > 1024 or not _IMAGE.match(spec.image):
        raise LaunchRefused(f"image {spec.image!r} is not a valid image reference (like registry/name:tag)")
    if not spec.command.strip():
        raise LaunchRefused("command is empty; give the shell command line the job should run")
    for name in spec.env:
        if not _ENV_NAME.match(str(name)):
            raise LaunchRefused(f"environment variable name {name!r} is invalid; use letters, digits and '_', "
                                "not starting with a digit")
        if name in RESERVED_ENV:
            raise LaunchRefused(f"environment variable {name} is set by DLTS and cannot be overridden; rename it")
    for port in spec.ports:
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            raise LaunchRefused(f"port {port!r} is not a TCP port number (1-65535)")
    for key in spec.ssh_public_keys:
        if not _SSH_KEY.match(key.strip()):
            raise LaunchRefused("an SSH public key is not a single-line OpenSSH public key "
                                "(like 'ssh-ed25519 AAAA... comment'); re-add it")
    for cred in spec.registry_credentials:
        if not cred.server or any(c.isspace() for c in cred.server):
            raise LaunchRefused(f"registry server {cred.server!r} is invalid")
    wanted = {
        PrivilegedFeature.PRIVILEGED: spec.privileged,
        PrivilegedFeature.HOST_NETWORK: spec.host_network,
        PrivilegedFeature.HOST_IPC: spec.host_ipc,
        PrivilegedFeature.HOST_PATH: bool(spec.host_paths),
    }
    for feature, asked in wanted.items():
        if asked and feature not in allowed:
            raise LaunchRefused(f"VC {spec.vc} does not allow {feature.value} for its jobs; remove it from the "
                                "job or ask a cluster admin to allow it for the VC")
    for path in spec.host_paths:
        if not path.startswith("/") or ".." in path.split("/"):
            raise LaunchRefused(f"host path {path!r} must be an absolute path without '..'")


def check_pod_policy(pod: Mapping[str, Any], allowed: frozenset[PrivilegedFeature]) -> None:
    """Refuse a rendered pod that uses a privileged feature its VC does not allow."""
    spec = pod.get("spec") or {}
    used: list[tuple[PrivilegedFeature, str]] = []
    for key, feature in (("hostNetwork", PrivilegedFeature.HOST_NETWORK), ("hostIPC", PrivilegedFeature.HOST_IPC),
                         ("hostPID", PrivilegedFeature.HOST_PID)):
        if spec.get(key):
            used.append((feature, f"spec.{key}"))
    for vol in spec.get("volumes") or []:
        if "hostPath" in vol:
            used.append((PrivilegedFeature.HOST_PATH, f"volume {vol.get('name')}"))
    for group in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(group) or []:
            sc = c.get("securityContext") or {}
            if sc.get("privileged"):
                used.append((PrivilegedFeature.PRIVILEGED, f"{group} {c.get('name')} privileged"))
            if sc.get("allowPrivilegeEscalation"):
                used.append((PrivilegedFeature.PRIVILEGED, f"{group} {c.get('name')} allowPrivilegeEscalation"))
            if (sc.get("capabilities") or {}).get("add"):
                used.append((PrivilegedFeature.PRIVILEGED, f"{group} {c.get('name')} capabilities.add"))
    for feature, where in used:
        if feature not in allowed:
            raise LaunchRefused(f"the pod would use {feature.value} ({where}), which its VC's policy does not allow")


_MODELS: dict[str, type[pydantic.BaseModel]] = {"Pod": k8s.V1Pod, "Service": k8s.V1Service, "Secret": k8s.V1Secret,
                                                "ConfigMap": k8s.V1ConfigMap}


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


# -- the renderer -------------------------------------------------------------------------------


def _quantity_cpu(cores: float) -> str:
    millis = max(1, round(cores * 1000))
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def _volumes_for(settings: RenderSettings, vc: str) -> tuple[NfsVolume, ...]:
    return tuple(settings.nfs_volumes.get("*", ())) + tuple(settings.nfs_volumes.get(vc, ()))


class ManifestRenderer:
    """Renders the objects of an attempt from the templates; pure apart from reading templates."""

    def __init__(self, settings: Any, *, templates_dir: str | None = None, termination_grace_s: int = 30) -> None:
        if not isinstance(settings, RenderSettings):  # the kubernetes: section (KubernetesSettings)
            settings = RenderSettings(
                namespace=settings.namespace, templates_dir=templates_dir, init_image=settings.init_image,
                master_port=settings.master_port, termination_grace_s=termination_grace_s,
                privileged_policy={vc: frozenset(PrivilegedFeature(f.value) for f in fs
                                                 if f.value in PrivilegedFeature._value2member_map_)
                                   for vc, fs in settings.privileged_policy.items()})
        self.settings = settings
        self._env = _environment(settings.templates_dir)

    def _render(self, template: str, context: Mapping[str, Any]) -> dict:
        try:
            text = self._env.get_template(template).render(**context)
        except jinja2.TemplateNotFound:
            raise TemplateError(f"template {template} not found in {self.settings.templates_dir or DEFAULT_TEMPLATES_DIR}") from None
        except jinja2.UndefinedError as exc:
            raise TemplateError(f"template {template}: {exc}") from None
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"template {template} line {exc.lineno}: {exc.message}") from None
        try:
            docs = [d for d in yaml.load_all(text, Loader=_SafeLoader) if d is not None]
        except yaml.YAMLError as exc:
            raise TemplateError(f"template {template} rendered invalid YAML: {exc}") from None
        if len(docs) != 1 or not isinstance(docs[0], dict):
            raise TemplateError(f"template {template} must render exactly one object, got {len(docs)}")
        to_model(docs[0], template)
        return docs[0]

    def supervisor_script(self) -> str:
        """The endpoint supervisor (``endpoint-supervisor.sh``: the operator's copy when there is
        one). A shell script, not a Jinja template: it is shipped as it is."""
        try:
            text, _path, _uptodate = self._env.loader.get_source(self._env, SUPERVISOR_TEMPLATE)  # type: ignore[union-attr]
        except jinja2.TemplateNotFound:
            raise TemplateError(f"{SUPERVISOR_TEMPLATE} not found in {self.settings.templates_dir or DEFAULT_TEMPLATES_DIR}"
                                ) from None
        return text

    def endpoint_configmap(self, job_id: int, attempt: int, labels: Mapping[str, str], annotations: Mapping[str, str],
                           endpoints: Sequence[EndpointSpec], ssh_public_keys: Iterable[str]) -> dict:
        """The attempt's endpoint ConfigMap: what the supervisor in the job's container serves."""
        doc = self._render("endpoint-configmap.yaml.j2", {
            "name": endpoint_configmap_name(job_id, attempt), "namespace": self.settings.namespace,
            "labels": dict(labels), "annotations": dict(annotations),
            "data": {"endpoints": endpoint_lines(endpoints), "authorized_keys": authorized_keys(ssh_public_keys),
                     "supervisor.sh": self.supervisor_script()},
        })
        self._check_ownership(doc, job_id, attempt)
        return doc

    def endpoint_service(self, job_id: int, attempt: int, labels: Mapping[str, str], annotations: Mapping[str, str],
                         endpoints: Sequence[EndpointSpec], inference: bool) -> dict:
        """The attempt's NodePort Service: one port per endpoint, named ``e<id>``. It selects the
        pod of index 0, or every replica of an inference job (Kubernetes balances over them and
        drops a replica being removed)."""
        selector = {LABEL_JOB_ID: str(int(job_id)), LABEL_ATTEMPT: str(int(attempt)), MANAGED_BY_LABEL: MANAGED_BY}
        if not inference:
            selector[LABEL_INDEX] = "0"
        doc = self._render("endpoint-service.yaml.j2", {
            "name": endpoint_service_name(job_id, attempt), "namespace": self.settings.namespace,
            "labels": dict(labels), "annotations": dict(annotations), "selector": selector,
            "ports": [{"name": endpoint_port_name(e.id), "port": e.port, "targetPort": e.port, "protocol": "TCP"}
                      for e in sorted(endpoints, key=lambda e: e.id)],
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
        wanted = {LABEL_JOB_ID: str(int(job_id)), LABEL_ATTEMPT: str(int(attempt)), MANAGED_BY_LABEL: MANAGED_BY}
        if any(labels.get(k) != v for k, v in wanted.items()):
            raise TemplateError(f"a template dropped DLTS's labels from {meta.get('name')}; keep "
                                "{{ labels }} in metadata.labels so DLTS can find its objects")

    def render(self, spec: LaunchSpec) -> RenderedAttempt:
        s = self.settings
        allowed = _policy(s, spec)
        _check_spec(spec, allowed)
        base = attempt_name(spec.job_id, spec.attempt)
        distributed = spec.type == "distributed"
        inference = spec.type == "inference"
        world = len(spec.placements)
        common_labels = {
            MANAGED_BY_LABEL: MANAGED_BY,
            LABEL_JOB_ID: str(spec.job_id),
            LABEL_ATTEMPT: str(spec.attempt),
            LABEL_VC: label_value(spec.vc),
            LABEL_USER: label_value(spec.user),
            LABEL_TYPE: label_value(spec.type),
            LABEL_PREEMPTIBLE: "true" if spec.preemptible else "false",
        }
        annotations = {ANNOTATION_USER: spec.user, ANNOTATION_VC: spec.vc, ANNOTATION_WORLD_SIZE: str(world)}
        names = {
            "attempt": base,
            "headless_service": base,
            "endpoint_configmap": endpoint_configmap_name(spec.job_id, spec.attempt),
            "registry_secret": f"{base}-registry",
        }

        secrets: list[dict] = []
        pull_secrets: list[str] = []
        if spec.registry_credentials:
            auths = {c.server: {"username": c.username, "password": c.password,
                                "auth": base64.b64encode(f"{c.username}:{c.password}".encode()).decode()}
                     for c in spec.registry_credentials}
            payload = json.dumps({"auths": auths}, sort_keys=True).encode()
            secrets.append(self._render("secret.yaml.j2", {
                "name": names["registry_secret"], "namespace": s.namespace, "labels": common_labels,
                "annotations": annotations, "type": "kubernetes.io/dockerconfigjson",
                "data": {".dockerconfigjson": base64.b64encode(payload).decode()},
            }))
            pull_secrets.append(names["registry_secret"])

        services: list[dict] = []
        attempt_match = {LABEL_JOB_ID: str(spec.job_id), LABEL_ATTEMPT: str(spec.attempt), MANAGED_BY_LABEL: MANAGED_BY}
        if distributed:
            services.append(self._render("headless-service.yaml.j2", {
                "name": names["headless_service"], "namespace": s.namespace, "labels": common_labels,
                "annotations": annotations, "selector": attempt_match, "master_port": s.master_port,
            }))
        # Endpoints (ssh, Jupyter, VS Code, ports) are exposed by ``expose`` once the job runs: its
        # NodePort Service is made then. The ConfigMap the supervisor reads exists from the start
        # (empty list) so that the pods' mount of it works; ``expose`` fills it.
        configmap = self.endpoint_configmap(spec.job_id, spec.attempt, common_labels, annotations, (),
                                            spec.ssh_public_keys)

        volumes: list[dict] = [{"name": "dlts-runtime", "emptyDir": {}},
                               {"name": "dlts-endpoints", "configMap": {"name": names["endpoint_configmap"],
                                                                        "optional": True, "defaultMode": 0o444}}]
        mounts: list[dict] = [{"name": "dlts-runtime", "mountPath": RUNTIME_DIR, "readOnly": True},
                              {"name": "dlts-endpoints", "mountPath": ENDPOINTS_DIR, "readOnly": True}]
        for i, nfs in enumerate(_volumes_for(s, spec.vc) + _spec_volumes(spec)):
            # Volume names are DNS labels; the configured name may not be one.
            vname = f"nfs-{i}-" + re.sub(r"[^a-z0-9-]+", "-", nfs.name.lower()).strip("-")[:40]
            vname = vname.rstrip("-")
            volumes.append({"name": vname, "nfs": {"server": nfs.server, "path": nfs.path, "readOnly": nfs.read_only}})
            mounts.append({"name": vname, "mountPath": nfs.mount_path, "readOnly": nfs.read_only})
        log_path = ""
        if spec.log_path and s.log_volume and spec.log_path.startswith(s.log_volume.mount_path.rstrip("/") + "/"):
            lv = s.log_volume
            volumes.append({"name": "dlts-logs", "nfs": {"server": lv.server, "path": lv.path, "readOnly": False}})
            mounts.append({"name": "dlts-logs", "mountPath": lv.mount_path, "readOnly": False})
            log_path = spec.log_path
        for i, path in enumerate(spec.host_paths):
            volumes.append({"name": f"host-{i}", "hostPath": {"path": path, "type": "Directory"}})
            mounts.append({"name": f"host-{i}", "mountPath": path})

        pods: list[dict] = []
        for rank, (index, placement) in enumerate(spec.indexed()):
            gpus = len(placement.gpu_indices)
            env: dict[str, str] = dict(sorted((str(k), str(v)) for k, v in spec.env.items()))
            env.update({
                "DLTS_JOB_ID": str(spec.job_id), "DLTS_ATTEMPT": str(spec.attempt), "DLTS_USER": spec.user,
                "DLTS_VC": spec.vc, "DLTS_NUM_GPUS": str(gpus), "DLTS_COMMAND": spec.command,
                # the node agent labels GPU metrics with it
                "DLTS_PREEMPTIBLE": "1" if spec.preemptible else "0",
            })
            if inference:
                env["DLTS_REPLICA"] = str(index)
            if gpus == 0:
                # Without a GPU limit the NVIDIA runtime would expose every GPU of the node.
                env["NVIDIA_VISIBLE_DEVICES"] = "void"
            if log_path:
                env["DLTS_LOG_PATH"] = log_path
            # Every pod sees the job owner's keys (ssh between the pods of a distributed job); the
            # pods the endpoint Service selects also run the endpoint supervisor.
            env["DLTS_SSH_AUTHORIZED_KEYS"] = f"{ENDPOINTS_DIR}/authorized_keys"
            if inference or index == 0:
                env["DLTS_ENDPOINTS_DIR"] = ENDPOINTS_DIR
            if distributed:
                local = max(gpus, 1)
                env.update({
                    "MASTER_ADDR": f"{pod_name(spec.job_id, spec.attempt, 0)}.{names['headless_service']}."
                                   f"{s.namespace}.svc",
                    "MASTER_PORT": str(s.master_port),
                    "NNODES": str(world), "NODE_RANK": str(rank),
                    "LOCAL_WORLD_SIZE": str(local), "WORLD_SIZE": str(world * local), "RANK": str(rank * local),
                })
            resources: dict[str, str] = {"cpu": _quantity_cpu(placement.cpu), "memory": str(int(placement.memory_bytes))}
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
                "gpu_indices": list(placement.gpu_indices),
            }
            doc = self._render("pod.yaml.j2", {
                "namespace": s.namespace, "names": names, "pod": pod, "entrypoint": ENTRYPOINT,
                "init_image": s.init_image, "init_command": INIT_COPY, "termination_grace_s": s.termination_grace_s,
                "image_pull_secrets": pull_secrets, "volumes": volumes, "volume_mounts": mounts,
                "ports": list(spec.ports),
                "job": {"id": spec.job_id, "attempt": spec.attempt, "image": spec.image, "type": spec.type,
                        "distributed": distributed, "privileged": spec.privileged,
                        "host_network": spec.host_network, "host_ipc": spec.host_ipc},
            })
            check_pod_policy(doc, allowed)
            pods.append(doc)
        for doc in secrets + services + pods:
            self._check_ownership(doc, spec.job_id, spec.attempt)
        return RenderedAttempt(tuple(secrets), tuple(services), tuple(pods), (configmap,))


def render_yaml(objects: Iterable[Mapping[str, Any]]) -> str:
    """The objects as a YAML stream (for ``dlts render`` and golden files)."""
    return yaml.safe_dump_all([dict(o) for o in objects], sort_keys=False, default_flow_style=False,
                              allow_unicode=True, width=120)
