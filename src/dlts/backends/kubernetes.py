"""The Kubernetes cluster backend: job attempts as pods, through the official ``kubernetes`` client.

What this module owns:

* ``launch``: the objects ``k8s_render`` produces (secrets, the endpoint ConfigMap, services, then
  one pod per placement, each bound to its node with ``nodeName``), created idempotently: a name
  that already exists is the object of this very attempt (names are deterministic), so a second
  launch creates nothing.
* ``expose``: the attempt's endpoints (ssh, Jupyter, VS Code, ports) as one NodePort Service whose
  ports match the endpoints exactly (created, patched, deleted) and the endpoint ConfigMap the
  supervisor in the job's container reads; an endpoint is ready once its pod runs and its port has
  a nodePort, at the InternalIP of the pod's node.
* ``observe``: one list of our pods and one list of nodes per call, however many jobs run (with
  ``watch`` on, the pods come from memory kept by ``k8s_watch.PodWatch``); pod phases and
  container exit codes become ``Observed`` values; a pod whose node has been NotReady /
  Unknown (or absent) for ``node_lost_after_s`` makes its attempt ``GONE`` with ``node_lost``.
* ``terminate`` (kill, preemption) deletes the pods with a grace period and the endpoint objects at
  once; deleting what is gone succeeds.
* Inference replicas: pod ``dlts-J-A-<replica index>``; ``launch`` again with more replicas creates
  the new pods only (scale-up); ``remove_replicas`` marks the pods ``dlts.io/retiring`` and deletes
  them with a grace period (scale-down). ``observe`` reports an inference attempt RUNNING while any
  replica runs, leaves retiring pods out of its phase, and lists the replica indexes that exist.
* ``forget`` / ``collect_garbage``: removal of finished attempts and of orphans no DB row owns.
* ``nodes`` (node sync), ``cordon`` / ``uncordon`` with an ownership annotation, so DLTS never
  uncordons a node that someone else cordoned.
* Failures of the API (5xx, 429, timeouts, refused connections) raise ``KubernetesUnavailable``
  and start an exponential back-off during which calls fail fast without touching the API. Nothing
  is ever concluded from a failed call: an attempt is never reported gone because a list failed.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from dlts.backends.base import (
    BackendUnavailable,
    EndpointSpec,
    EndpointState,
    LaunchSpec,
    NodeInfo,
    Observed,
    RunPhase,
)
from dlts.backends.k8s_render import (
    ANNOTATION_RETIRING,
    ANNOTATION_USER,
    ANNOTATION_VC,
    ANNOTATION_WORLD_SIZE,
    GPU_RESOURCE,
    LABEL_ATTEMPT,
    LABEL_INDEX,
    LABEL_JOB_ID,
    LABEL_ROLE,
    LABEL_TYPE,
    MANAGED_SELECTOR,
    LaunchRefused,
    ManifestRenderer,
    PrivilegedFeature,
    RenderedAttempt,
    TemplateError,
    attempt_selector,
    authorized_keys,
    endpoint_configmap_name,
    endpoint_lines,
    endpoint_port_name,
    endpoint_problem,
    endpoint_service_name,
    label_value,
    pod_name,
    valid_ssh_key,
)
from dlts.backends.k8s_settings import KubernetesSettings as RenderKubernetesSettings
from dlts.backends.k8s_watch import PodWatch

__all__ = [
    "CordonResult", "KubernetesBackend", "KubernetesSettings", "KubernetesUnavailable", "LaunchRefused",
    "NodeNotFound", "PrivilegedFeature", "TemplateError",
]

log = logging.getLogger(__name__)

ANNOTATION_CORDONED_BY = "dlts.io/cordoned-by"
ANNOTATION_CORDON_REASON = "dlts.io/cordon-reason"
ANNOTATION_CORDONED_AT = "dlts.io/cordoned-at"
CORDON_OWNER = "dlts"
_MERGE = "application/strategic-merge-patch+json"


@dataclass(frozen=True)
class KubernetesSettings:
    """What the cluster config says about Kubernetes (the lead's config maps onto this)."""

    kubeconfig: str | None = None  # None: in-cluster service account
    context: str | None = None
    namespace: str = "default"
    sku_label: str = "dlts.io/sku"
    ib_domain_label: str = "dlts.io/ib-domain"
    vc_label: str = "dlts.io/vc"
    node_lost_after_s: float = 60.0
    # A distributed attempt missing some of its pods is reported GONE once its newest pod is this
    # old (a launch interrupted half-way is completed by the job manager before that).
    missing_after_s: float = 30.0
    # observe() reuses a node list fetched this recently (by nodes() in the same tick).
    node_list_reuse_s: float = 1.0
    # Keep the pods in memory from one list + a watch instead of listing them every tick.
    watch: bool = False
    watch_timeout_s: float = 300.0
    privileged_policy: Mapping[str, frozenset[PrivilegedFeature]] = field(default_factory=dict)  # VC ("*": all)
    templates_dir: str | None = None
    init_image: str = "docker.io/library/debian:12"
    master_port: int = 29500
    termination_grace_s: int = 30
    request_timeout_s: float = 10.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0

    def render_settings(self) -> "RenderKubernetesSettings":
        # bridge to the typed kubernetes: section until this module takes it (H1's rewrite)
        return RenderKubernetesSettings(namespace=self.namespace, init_image=self.init_image,
                                        master_port=self.master_port, privileged_policy=dict(self.privileged_policy))


def settings_from_config(config: Any, **extra: Any) -> KubernetesSettings:
    """Map the cluster config (``dlts.config.Settings``) onto ``KubernetesSettings``.

    Keys the config does not carry (NFS volumes, privilege policy, init image) keep their defaults
    unless given in ``extra``.
    """
    def get(name: str, default: Any) -> Any:
        value = getattr(config, name, None)
        return default if value is None else value

    base = KubernetesSettings()
    values: dict[str, Any] = {
        "kubeconfig": str(config.kubeconfig) if getattr(config, "kubeconfig", None) else None,
        "namespace": get("namespace", base.namespace),
        "sku_label": get("node_label_sku", base.sku_label),
        "ib_domain_label": get("node_label_ib_domain", base.ib_domain_label),
        "vc_label": get("node_label_vc", base.vc_label),
        "node_lost_after_s": float(get("node_lost_after_s", base.node_lost_after_s)),
        "templates_dir": str(config.templates_dir) if getattr(config, "templates_dir", None) else None,
        "termination_grace_s": int(get("preempt_grace_s", base.termination_grace_s)),
    }
    values.update(extra)
    return KubernetesSettings(**values)


class KubernetesUnavailable(BackendUnavailable):
    """The API server did not answer usefully (error, timeout, back-off); retry on a later tick."""


class NodeNotFound(LookupError):
    pass


class CordonResult(str, enum.Enum):
    CORDONED = "cordoned"  # DLTS cordoned it now
    ALREADY_CORDONED = "already_cordoned"  # DLTS had cordoned it before
    CORDONED_BY_OTHERS = "cordoned_by_others"  # someone else's cordon: DLTS leaves it alone
    UNCORDONED = "uncordoned"
    NOT_CORDONED = "not_cordoned"


def _ts(value: str | None) -> float | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value).timestamp()  # Python 3.11 reads the trailing Z


def _ready_condition(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond
    return None


def _attempt_key(obj: Mapping[str, Any]) -> tuple[int, int] | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    try:
        return int(labels[LABEL_JOB_ID]), int(labels[LABEL_ATTEMPT])
    except (KeyError, ValueError):
        return None


def _started(pod: Mapping[str, Any]) -> float | None:
    """When the job container started (not when the pod was accepted: image pulls come between)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == "job":
            state = cs.get("state") or {}
            for key in ("running", "terminated"):
                if (state.get(key) or {}).get("startedAt"):
                    return _ts(state[key]["startedAt"])
    return None


def _main_terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == "job":
            return (cs.get("state") or {}).get("terminated")
    return None


class KubernetesBackend:
    """``ClusterBackend`` over a Kubernetes cluster. Thread-safe; one instance per managers process."""

    name = "kubernetes"

    def __init__(self, settings: KubernetesSettings, *, api_client: k8s.ApiClient | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self.renderer = ManifestRenderer(settings.render_settings(), templates_dir=settings.templates_dir,
                                         termination_grace_s=settings.termination_grace_s)
        self._api_client = api_client or self._connect(settings)
        self.core = k8s.CoreV1Api(self._api_client)
        self._lock = threading.Lock()
        self._failures = 0
        self._retry_at = 0.0
        self._nodes_cache: tuple[float, list[dict]] | None = None
        self._node_missing_since: dict[str, float] = {}
        self.api_calls = 0  # every request sent (for the calls-per-tick measurement)
        self._watch: PodWatch | None = None
        if settings.watch:
            self._watch = PodWatch(self.core, settings.namespace, MANAGED_SELECTOR,
                                   watch_timeout_s=settings.watch_timeout_s,
                                   request_timeout_s=settings.request_timeout_s, on_request=self._count_request)
            self._watch.start()

    def _count_request(self) -> None:
        with self._lock:
            self.api_calls += 1

    @staticmethod
    def _connect(settings: KubernetesSettings) -> k8s.ApiClient:
        cfg = k8s.Configuration()
        try:
            if settings.kubeconfig:
                k8s_config.load_kube_config(config_file=settings.kubeconfig, context=settings.context,
                                            client_configuration=cfg)
            else:
                k8s_config.load_incluster_config(client_configuration=cfg)
        except k8s_config.ConfigException as exc:
            where = settings.kubeconfig or "the in-cluster service account"
            raise KubernetesUnavailable(f"cannot load Kubernetes credentials from {where}: {exc}; set the "
                                        "cluster config's kubernetes.kubeconfig to a readable kubeconfig") from None
        # One attempt per call: the back-off below decides when to try again, not urllib3.
        cfg.retries = False
        cfg.connection_pool_maxsize = 8
        return k8s.ApiClient(cfg)

    # -- calling the API ------------------------------------------------------------------------

    def _call(self, fn: Callable[..., Any], *args: Any, ok: tuple[int, ...] = (),
              passthrough: tuple[int, ...] = (), **kwargs: Any) -> Any:
        """One API request.

        ``ok`` statuses return None (404 on delete, 409 on create); ``passthrough`` statuses are
        re-raised as ``ApiException`` for the caller to interpret (even a 5xx: the caller decides
        whether to back off); other 5xx, 429, 401 and transport errors start the back-off; any
        other refusal becomes ``KubernetesUnavailable`` with the server's message.
        """
        now = self.clock()
        with self._lock:
            if now < self._retry_at:
                raise KubernetesUnavailable(
                    f"Kubernetes API backing off after {self._failures} failed calls; next try in "
                    f"{self._retry_at - now:.1f} s")
            self.api_calls += 1
        kwargs.setdefault("_request_timeout", self.settings.request_timeout_s)
        try:
            result = fn(*args, **kwargs)
        except ApiException as exc:
            if exc.status in ok:
                self._succeeded()
                return None
            if exc.status in passthrough:
                self._succeeded()
                raise
            if exc.status in (0, 401, 429) or exc.status >= 500:
                self._failed(f"HTTP {exc.status} {_status_message(exc)}")
            self._succeeded()
            raise KubernetesUnavailable(f"Kubernetes refused the request (HTTP {exc.status}): "
                                        f"{_status_message(exc)}") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            self._failed(f"{type(exc).__name__}: {exc}")
        self._succeeded()
        return result

    def _failed(self, what: str) -> None:
        with self._lock:
            self._failures += 1
            delay = min(self.settings.backoff_max_s, self.settings.backoff_initial_s * 2 ** (self._failures - 1))
            self._retry_at = self.clock() + delay
            failures = self._failures
        log.warning("Kubernetes API call failed (%s); backing off %.1f s", what, delay)
        raise KubernetesUnavailable(f"Kubernetes API call failed ({what}); {failures} in a row, retrying "
                                    f"in {delay:.1f} s")

    def _succeeded(self) -> None:
        with self._lock:
            self._failures = 0
            self._retry_at = 0.0

    def _list(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[dict]:
        # Raw JSON: deserialising thousands of pods into models costs more than the request.
        resp = self._call(fn, *args, _preload_content=False, **kwargs)
        try:
            return json.loads(resp.data)["items"] or []
        except (ValueError, KeyError, TypeError) as exc:
            self._failed(f"unreadable list response: {exc}")
            raise  # unreachable: _failed raises

    # -- ClusterBackend -------------------------------------------------------------------------

    def render(self, spec: LaunchSpec) -> RenderedAttempt:
        """The objects ``launch`` would create (raises ``LaunchRefused`` / ``TemplateError``)."""
        return self.renderer.render(spec)

    def launch(self, spec: LaunchSpec) -> None:
        rendered = self.renderer.render(spec)
        ns = self.settings.namespace
        creators: dict[str, Callable[..., Any]] = {
            "Secret": self.core.create_namespaced_secret, "ConfigMap": self.core.create_namespaced_config_map,
            "Service": self.core.create_namespaced_service, "Pod": self.core.create_namespaced_pod}
        for doc in rendered.all():
            # 409 AlreadyExists: the deterministic name belongs to this attempt, created by an
            # earlier launch (e.g. before a restart); creating nothing twice is the point.
            try:
                created = self._call(creators[doc["kind"]], ns, doc, ok=(409,), passthrough=(400, 403, 422),
                                     _preload_content=False)
            except ApiException as exc:  # admission (quota, pod security) or validation said no
                raise LaunchRefused(f"Kubernetes refused {doc['kind']} {doc['metadata']['name']}: "
                                    f"{_status_message(exc)}") from None
            if created is not None and doc["kind"] == "Pod" and self._watch is not None:
                self._watch.remember(json.loads(created.data))

    def remove_replicas(self, job_id: int, attempt: int, replicas: Iterable[int], grace_s: float) -> None:
        """Scale-down: mark each replica's pod retiring (so observe knows its end is on purpose),
        then delete it with the grace period. A pod already gone is fine (404)."""
        ns = self.settings.namespace
        patch = {"metadata": {"annotations": {ANNOTATION_RETIRING: "scale-down"}}}
        for index in sorted({int(i) for i in replicas}):
            name = pod_name(job_id, attempt, index)
            resp = self._call(self.core.patch_namespaced_pod, name, ns, patch, ok=(404,), _content_type=_MERGE,
                              _preload_content=False)
            if resp is None:
                continue
            if self._watch is not None:
                self._watch.remember(json.loads(resp.data))
            self._call(self.core.delete_namespaced_pod, name, ns, grace_period_seconds=max(0, round(grace_s)),
                       ok=(404,), _preload_content=False)

    def terminate(self, job_id: int, attempt: int, grace_s: float) -> None:
        ns = self.settings.namespace
        self._call(self.core.delete_collection_namespaced_pod, ns, label_selector=attempt_selector(job_id, attempt),
                   grace_period_seconds=max(0, round(grace_s)), _preload_content=False)
        # The attempt ends: its endpoints stop being reachable now, not when it is forgotten.
        self._delete_endpoint_objects(job_id, attempt)

    def _delete_endpoint_objects(self, job_id: int, attempt: int) -> None:
        ns = self.settings.namespace
        self._call(self.core.delete_namespaced_service, endpoint_service_name(job_id, attempt), ns, ok=(404,),
                   _preload_content=False)
        self._call(self.core.delete_namespaced_config_map, endpoint_configmap_name(job_id, attempt), ns, ok=(404,),
                   _preload_content=False)

    def forget(self, job_id: int, attempt: int) -> None:
        # Grace 0: a finished pod goes at once; a pod stuck on a lost node is force-removed so
        # that it does not hold the name (and the GPUs, once the node returns).
        self._delete_attempt(job_id, attempt, grace_s=0)
        if self._watch is not None:  # gone now; do not report it again before the DELETED event
            prefix = f"dlts-{job_id}-{attempt}-"
            self._watch.forget({n for n in self._watch.names() if n.startswith(prefix)})

    def _delete_attempt(self, job_id: int, attempt: int, grace_s: int) -> None:
        ns, selector = self.settings.namespace, attempt_selector(job_id, attempt)
        self._call(self.core.delete_collection_namespaced_pod, ns, label_selector=selector,
                   grace_period_seconds=grace_s, _preload_content=False)
        # Services have no deletecollection in core/v1 (before 1.31 clusters); delete by name.
        self._call(self.core.delete_namespaced_service, f"dlts-{job_id}-{attempt}", ns, ok=(404,), _preload_content=False)
        self._delete_endpoint_objects(job_id, attempt)
        self._call(self.core.delete_collection_namespaced_secret, ns, label_selector=selector,
                   _preload_content=False)

    # -- endpoints --------------------------------------------------------------------------------

    def expose(self, job_id: int, attempt: int, endpoints: Sequence[EndpointSpec],
               ssh_public_keys: tuple[str, ...] = ()) -> Sequence[EndpointState]:
        """Make the attempt's endpoint Service and ConfigMap match ``endpoints`` exactly.

        A few requests, however large the cluster: the ConfigMap and the Service by name, the
        attempt's pods (from the watch when there is one, else one list by label), and the pod's
        node when no recent node list has it; then only the writes that change something. An
        endpoint that cannot be exposed as given (bad row, ssh without a key) is ``failed`` and
        left out; the rest are ``ready`` once a selected pod runs and the port has a nodePort.
        """
        job_id, attempt = int(job_id), int(attempt)
        keys = tuple(k for k in ssh_public_keys if valid_ssh_key(k))
        if len(keys) != len(ssh_public_keys):
            log.warning("job %s: %d SSH public keys are not single-line OpenSSH keys; left out",
                        job_id, len(ssh_public_keys) - len(keys))
        states: dict[int, EndpointState] = {}
        wanted: list[EndpointSpec] = []
        for endpoint in endpoints:
            problem = endpoint_problem(endpoint)
            if problem is None and any(e.port == endpoint.port for e in wanted):
                problem = f"port {endpoint.port} is already used by another endpoint of the job"
            if problem is None and endpoint.kind == "ssh" and not keys:
                problem = ("the job's owner has no SSH public key; add one with POST /api/v1/me/ssh-keys or on "
                           "the portal's SSH keys page, then close and reopen the endpoint")
            if problem is not None:
                states[endpoint.id] = EndpointState(endpoint.id, "failed", message=problem)
            else:
                wanted.append(endpoint)

        pods = self._attempt_pods(job_id, attempt)
        configmap = self._read(self.core.read_namespaced_config_map, endpoint_configmap_name(job_id, attempt))
        service = self._read(self.core.read_namespaced_service, endpoint_service_name(job_id, attempt))
        owner = configmap or service or (pods[0] if pods else None)
        if owner is None:  # nothing of the attempt exists (yet): nothing to attach the endpoints to
            why = f"waiting for pod {pod_name(job_id, attempt, 0)} to exist"
            return [states.get(e.id) or EndpointState(e.id, "pending", message=why) for e in endpoints]
        meta = owner["metadata"]
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in (LABEL_ROLE, LABEL_INDEX)}
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                       if k in (ANNOTATION_USER, ANNOTATION_VC, ANNOTATION_WORLD_SIZE)}
        inference = labels.get(LABEL_TYPE) == _INFERENCE

        refused = self._sync_endpoint_configmap(job_id, attempt, configmap, labels, annotations, wanted, keys)
        if refused:
            for endpoint in wanted:
                if endpoint.kind != "port":  # a port endpoint needs no server, so no ConfigMap
                    states[endpoint.id] = EndpointState(endpoint.id, "failed", message=refused)
        service, refused = self._sync_endpoint_service(job_id, attempt, service, labels, annotations, wanted, inference)
        node_ports = {p.get("name"): p.get("nodePort") for p in ((service or {}).get("spec") or {}).get("ports") or []}
        serving = [p for p in pods if (not _retiring(p) if inference else _index(p) == 0)]
        running = [p for p in serving if (p.get("status") or {}).get("phase") == "Running"
                   and not p["metadata"].get("deletionTimestamp")]
        host = self._node_address(running[0]["spec"].get("nodeName") or "") if running else ""
        if serving:
            first = serving[0]
            if first["metadata"].get("deletionTimestamp"):
                why = f"pod {first['metadata']['name']} is being deleted"
            else:
                phase = (first.get("status") or {}).get("phase", "Pending")
                why = f"waiting for pod {first['metadata']['name']} to run ({_waiting_reason([first]).partition(': ')[2] or phase})"
        else:
            why = f"waiting for pod {pod_name(job_id, attempt, 0)} to exist"
        for endpoint in wanted:
            if endpoint.id in states:
                continue
            node_port = node_ports.get(endpoint_port_name(endpoint.id))
            if refused and not node_port:
                states[endpoint.id] = EndpointState(endpoint.id, "failed", message=refused)
            elif not running:
                states[endpoint.id] = EndpointState(endpoint.id, "pending", message=why)
            elif not node_port:
                states[endpoint.id] = EndpointState(endpoint.id, "pending", message="waiting for a node port")
            else:
                states[endpoint.id] = EndpointState(endpoint.id, "ready", host=host, host_port=int(node_port))
        return [states[e.id] for e in endpoints]

    def _read(self, fn: Callable[..., Any], name: str) -> dict | None:
        """One object of our namespace by name, as raw JSON; None when it does not exist."""
        resp = self._call(fn, name, self.settings.namespace, ok=(404,), _preload_content=False)
        return None if resp is None else json.loads(resp.data)

    def _attempt_pods(self, job_id: int, attempt: int) -> list[dict]:
        pods = self._watch.snapshot() if self._watch is not None else None
        if pods is None:
            return self._list(self.core.list_namespaced_pod, self.settings.namespace,
                              label_selector=attempt_selector(job_id, attempt))
        return [p for p in pods if _attempt_key(p) == (job_id, attempt)]

    def _node_address(self, node: str) -> str:
        """Where users reach a NodePort on ``node``: its InternalIP, else its name. From the last
        node list (every tick's observe or node sync fetches one), else one read."""
        with self._lock:
            cached = self._nodes_cache
        found = next((n for n in cached[1] if n["metadata"]["name"] == node), None) if cached else None
        if found is None and node:
            resp = self._call(self.core.read_node, node, ok=(404,), _preload_content=False)
            found = json.loads(resp.data) if resp is not None else None
        for address in ((found or {}).get("status") or {}).get("addresses") or []:
            if address.get("type") == "InternalIP" and address.get("address"):
                return str(address["address"])
        return node

    def _sync_endpoint_configmap(self, job_id: int, attempt: int, current: dict | None, labels: Mapping[str, str],
                                 annotations: Mapping[str, str], endpoints: Sequence[EndpointSpec],
                                 keys: tuple[str, ...]) -> str:
        """Create or update the endpoint ConfigMap; returns the API's refusal ("" when done)."""
        ns, name = self.settings.namespace, endpoint_configmap_name(job_id, attempt)
        try:
            if current is None:
                doc = self.renderer.endpoint_configmap(job_id, attempt, labels, annotations, endpoints, keys)
                self._call(self.core.create_namespaced_config_map, ns, doc, ok=(409,),
                           passthrough=(400, 403, 422), _preload_content=False)
                return ""
            data = {"endpoints": endpoint_lines(endpoints), "authorized_keys": authorized_keys(keys)}
            if any((current.get("data") or {}).get(k) != v for k, v in data.items()):
                # The supervisor script stays as the attempt started with it.
                self._call(self.core.patch_namespaced_config_map, name, ns, {"data": data}, passthrough=(400, 403, 422),
                           _content_type="application/merge-patch+json", _preload_content=False)
        except ApiException as exc:
            return f"Kubernetes refused ConfigMap {name}: {_status_message(exc)}"
        return ""

    def _sync_endpoint_service(self, job_id: int, attempt: int, current: dict | None, labels: Mapping[str, str],
                               annotations: Mapping[str, str], endpoints: Sequence[EndpointSpec],
                               inference: bool) -> tuple[dict | None, str]:
        """Make the endpoint Service's ports exactly ``endpoints`` (delete it when none are left).
        Returns the Service as it now is and the API's refusal ("" when done); after a refusal the
        Service is as it was, so endpoints it already served keep working."""
        ns, name = self.settings.namespace, endpoint_service_name(job_id, attempt)
        if not endpoints:
            if current is not None:
                self._call(self.core.delete_namespaced_service, name, ns, ok=(404,), _preload_content=False)
            return None, ""
        doc = self.renderer.endpoint_service(job_id, attempt, labels, annotations, endpoints, inference)
        try:
            if current is None:
                resp = self._call(self.core.create_namespaced_service, ns, doc, passthrough=(400, 403, 409, 422, 500),
                                  _preload_content=False)
                return json.loads(resp.data), ""
            ports = doc["spec"]["ports"]
            have = {p.get("name"): p for p in (current.get("spec") or {}).get("ports") or []}
            if [_port_key(p) for p in ports] == [_port_key(p) for p in have.values()]:
                return current, ""
            for port in ports:  # keep every remaining endpoint's address
                if (have.get(port["name"]) or {}).get("nodePort"):
                    port["nodePort"] = have[port["name"]]["nodePort"]
            patch = {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]}, "spec": {"ports": ports}}
            resp = self._call(self.core.patch_namespaced_service, name, ns, patch,
                              passthrough=(400, 403, 409, 422, 500),
                              _content_type="application/merge-patch+json", _preload_content=False)
            return json.loads(resp.data), ""
        except ApiException as exc:
            message = _status_message(exc)
            if exc.status == 409:  # created or changed by someone since we read it: next call
                return current, ""
            if exc.status == 500 and "allocate" not in message:
                self._failed(f"HTTP 500 {message}")  # the API is unwell: back off (raises)
            return current, f"Kubernetes refused Service {name}: {message}"

    def observe(self) -> Sequence[Observed]:
        ns = self.settings.namespace
        pods = self._watch.snapshot() if self._watch is not None else None
        if pods is None:  # no watch, or it cannot be trusted right now
            pods = self._list(self.core.list_namespaced_pod, ns, label_selector=MANAGED_SELECTOR)
        nodes = {n["metadata"]["name"]: n for n in self._node_list(reuse=True)}
        now = self.clock()
        lost_nodes = self._lost_nodes(nodes, now)
        groups: dict[tuple[int, int], list[dict]] = {}
        for pod in pods:
            key = _attempt_key(pod)
            if key is not None:
                groups.setdefault(key, []).append(pod)
        # An attempt with no pods at all is absent here; the job manager knows which attempts it
        # launched and decides (relaunch a lost create, or count a running one as gone).
        known_nodes = set(nodes)
        observed = (self._observe_attempt(key, group, lost_nodes, known_nodes, now)
                    for key, group in sorted(groups.items()))
        return [o for o in observed if o is not None]

    def _lost_nodes(self, nodes: Mapping[str, Mapping[str, Any]], now: float) -> dict[str, str]:
        """Nodes whose pods count as lost now, with the reason."""
        lost: dict[str, str] = {}
        after = self.settings.node_lost_after_s
        for name, node in nodes.items():
            self._node_missing_since.pop(name, None)
            cond = _ready_condition(node)
            if cond is None or cond.get("status") != "True":
                since = _ts((cond or {}).get("lastTransitionTime")) or now
                if now - since >= after:
                    state = "Unknown" if cond is None else cond.get("status")
                    lost[name] = f"node {name} has been Ready={state} for {now - since:.0f} s"
        return lost

    def _node_lost_reason(self, node: str, nodes_lost: Mapping[str, str], known: bool, now: float) -> str | None:
        if node in nodes_lost:
            return nodes_lost[node]
        if not known:
            since = self._node_missing_since.setdefault(node, now)
            if now - since >= self.settings.node_lost_after_s:
                return f"node {node} no longer exists"
        return None

    def _lost_pod(self, pods: list[dict], lost_nodes: Mapping[str, str], node_names: set[str], now: float) -> str | None:
        """'pod NAME: why its node is lost' for the first pod on a lost node, else None."""
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName") or ""
            reason = self._node_lost_reason(node, lost_nodes, node in node_names, now) if node else None
            if reason:
                return f"pod {pod['metadata']['name']}: {reason}"
        return None

    def _observe_attempt(self, key: tuple[int, int], pods: list[dict], lost_nodes: Mapping[str, str],
                         node_names: set[str], now: float) -> Observed | None:
        job_id, attempt = key
        pods.sort(key=_index)
        if (pods[0]["metadata"].get("labels") or {}).get(LABEL_TYPE) == _INFERENCE:
            return self._observe_replicas(key, pods, lost_nodes, node_names, now)
        expected = max(len(pods), int((pods[0]["metadata"].get("annotations") or {}).get(ANNOTATION_WORLD_SIZE, 1)))
        phases = [(p.get("status") or {}).get("phase", "Pending") for p in pods]
        started_at, finished_at = _times(pods)
        failed = _failure(pods, phases, started_at, finished_at or now)
        if failed is not None:
            return Observed(job_id, attempt, **failed)
        if len(pods) == expected and all(ph == "Succeeded" for ph in phases):
            return Observed(job_id, attempt, RunPhase.SUCCEEDED, exit_code=0, started_at=started_at,
                            finished_at=finished_at or now)
        lost = self._lost_pod(pods, lost_nodes, node_names, now)
        if lost:
            return Observed(job_id, attempt, RunPhase.GONE, started_at=started_at, node_lost=True, message=lost)
        terminating = any(p["metadata"].get("deletionTimestamp") for p in pods)
        if len(pods) < expected and not terminating:
            created = [_ts(p["metadata"].get("creationTimestamp")) or now for p in pods]
            if now - max(created) >= self.settings.missing_after_s:
                return Observed(job_id, attempt, RunPhase.GONE, started_at=started_at,
                                message=f"{expected - len(pods)} of its {expected} pods were deleted outside DLTS")
            # A launch interrupted half-way (crash, API error): report nothing, so that the job
            # manager re-issues the launch, which creates only the missing pods.
            return None
        if any(ph in ("Pending", "Unknown") for ph in phases):
            waiting = _waiting_reason(pods)
            return Observed(job_id, attempt, RunPhase.PENDING, started_at=started_at, message=waiting)
        return Observed(job_id, attempt, RunPhase.RUNNING, started_at=started_at,
                        message="terminating" if terminating else "")


    def _observe_replicas(self, key: tuple[int, int], pods: list[dict], lost_nodes: Mapping[str, str],
                          node_names: set[str], now: float) -> Observed:
        """An inference attempt: its replicas are independent pods. Retiring pods (scale-down) do
        not count toward the phase; a replica pod that is missing is not judged here: the job
        manager knows which replicas it asked for and creates a missing one again."""
        job_id, attempt = key
        present = frozenset(_index(p) for p in pods)
        retiring = frozenset(_index(p) for p in pods if _retiring(p))
        live = [p for p in pods if not _retiring(p)]
        common: dict[str, Any] = {"replicas": present, "retiring": retiring}
        started_at, finished_at = _times(live)
        if not live:  # only replicas on their way out (never the case while the job runs normally)
            return Observed(job_id, attempt, RunPhase.RUNNING, message="replicas exiting", **common)
        phases = [(p.get("status") or {}).get("phase", "Pending") for p in live]
        failed = _failure(live, phases, started_at, finished_at or now)
        if failed is not None:
            return Observed(job_id, attempt, **failed, **common)
        if all(ph == "Succeeded" for ph in phases):
            return Observed(job_id, attempt, RunPhase.SUCCEEDED, exit_code=0, started_at=started_at,
                            finished_at=finished_at or now, **common)
        lost = self._lost_pod(live, lost_nodes, node_names, now)
        if lost:
            return Observed(job_id, attempt, RunPhase.GONE, started_at=started_at, node_lost=True, message=lost, **common)
        if "Running" in phases:
            return Observed(job_id, attempt, RunPhase.RUNNING, started_at=started_at, **common)
        return Observed(job_id, attempt, RunPhase.PENDING, started_at=started_at, message=_waiting_reason(live),
                        **common)

    # -- nodes ----------------------------------------------------------------------------------

    def nodes(self) -> Sequence[NodeInfo]:
        s = self.settings
        out = []
        for node in self._node_list(reuse=False):
            meta, status = node["metadata"], node.get("status") or {}
            labels = meta.get("labels") or {}
            alloc = status.get("allocatable") or status.get("capacity") or {}
            gpus = int(parse_quantity(alloc.get(GPU_RESOURCE, "0")))
            cond = _ready_condition(node)
            out.append(NodeInfo(
                name=meta["name"],
                sku=labels.get(s.sku_label) or ("cpu" if gpus == 0 else "unknown"),
                gpus=gpus,
                cpu=float(parse_quantity(alloc.get("cpu", "0"))),
                memory_bytes=int(parse_quantity(alloc.get("memory", "0"))),
                ib_domain=labels.get(s.ib_domain_label) or "default",
                vc=labels.get(s.vc_label) or None,
                ready=bool(cond and cond.get("status") == "True"),
                unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
                cordoned_by_dlts=(meta.get("annotations") or {}).get(ANNOTATION_CORDONED_BY) == CORDON_OWNER,
            ))
        return out

    def _node_list(self, reuse: bool) -> list[dict]:
        """List nodes; ``observe`` reuses the list ``nodes()`` fetched moments before in the same tick."""
        now = self.clock()
        with self._lock:
            cached = self._nodes_cache
        if reuse and cached is not None and 0 <= now - cached[0] <= self.settings.node_list_reuse_s:
            return cached[1]
        items = self._list(self.core.list_node)
        with self._lock:
            self._nodes_cache = (now, items)
        return items

    def _read_node(self, name: str) -> dict:
        resp = self._call(self.core.read_node, name, ok=(404,), _preload_content=False)
        if resp is None:
            raise NodeNotFound(f"node {name} does not exist in the Kubernetes cluster")
        return json.loads(resp.data)

    def _patch_node(self, name: str, node: Mapping[str, Any], patch: dict) -> bool:
        """Patch guarded by the resourceVersion we read: False when the node changed meanwhile."""
        patch.setdefault("metadata", {})["resourceVersion"] = node["metadata"]["resourceVersion"]
        try:
            self._call(self.core.patch_node, name, patch, passthrough=(404, 409), _content_type=_MERGE,
                       _preload_content=False)
        except ApiException as exc:
            if exc.status == 409:
                return False
            if exc.status == 404:
                raise NodeNotFound(f"node {name} does not exist in the Kubernetes cluster") from None
            raise
        return True

    def cordon(self, node: str, reason: str = "") -> CordonResult:
        """Mark ``node`` unschedulable and record that DLTS did it (so only DLTS undoes it)."""
        for _ in range(5):
            obj = self._read_node(node)
            annotations = obj["metadata"].get("annotations") or {}
            if (obj.get("spec") or {}).get("unschedulable"):
                if annotations.get(ANNOTATION_CORDONED_BY) == CORDON_OWNER:
                    return CordonResult.ALREADY_CORDONED
                return CordonResult.CORDONED_BY_OTHERS
            patch = {"metadata": {"annotations": {
                ANNOTATION_CORDONED_BY: CORDON_OWNER, ANNOTATION_CORDON_REASON: reason[:1024],
                ANNOTATION_CORDONED_AT: dt.datetime.fromtimestamp(self.clock(), dt.UTC).isoformat()}},
                "spec": {"unschedulable": True}}
            if self._patch_node(node, obj, patch):
                return CordonResult.CORDONED
        raise KubernetesUnavailable(f"node {node} kept changing while cordoning it; try again")

    def uncordon(self, node: str) -> CordonResult:
        """Undo a DLTS cordon; a cordon someone else set stays (``CORDONED_BY_OTHERS``)."""
        for _ in range(5):
            obj = self._read_node(node)
            annotations = obj["metadata"].get("annotations") or {}
            ours = annotations.get(ANNOTATION_CORDONED_BY) == CORDON_OWNER
            stale = {k: None for k in (ANNOTATION_CORDONED_BY, ANNOTATION_CORDON_REASON, ANNOTATION_CORDONED_AT)
                     if k in annotations}
            if not (obj.get("spec") or {}).get("unschedulable"):
                # Someone uncordoned it by hand: drop our stale marks so a later cordon by them
                # is not mistaken for ours.
                if stale and not self._patch_node(node, obj, {"metadata": {"annotations": stale}}):
                    continue
                return CordonResult.NOT_CORDONED
            if not ours:
                return CordonResult.CORDONED_BY_OTHERS
            if self._patch_node(node, obj, {"metadata": {"annotations": stale}, "spec": {"unschedulable": None}}):
                return CordonResult.UNCORDONED
        raise KubernetesUnavailable(f"node {node} kept changing while uncordoning it; try again")

    # -- garbage --------------------------------------------------------------------------------

    def collect_garbage(self, live: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
        """Delete every DLTS object whose (job id, attempt) is not in ``live`` (the DB's live attempts).

        The job manager calls it with the attempts the database says are starting or running;
        anything else carrying our labels is an orphan (a crash between create and the DB write, a
        DB restored from backup, a forgotten attempt). Returns the attempts removed.
        """
        live_set = {(int(j), int(a)) for j, a in live}
        ns = self.settings.namespace
        found: set[tuple[int, int]] = set()
        for fn in (self.core.list_namespaced_pod, self.core.list_namespaced_service,
                   self.core.list_namespaced_secret, self.core.list_namespaced_config_map):
            for obj in self._list(fn, ns, label_selector=MANAGED_SELECTOR):
                key = _attempt_key(obj)
                if key is not None:
                    found.add(key)
        orphans = tuple(sorted(found - live_set))
        for job_id, attempt in orphans:
            log.info("removing orphaned Kubernetes objects of job %s attempt %s", job_id, attempt)
            self._delete_attempt(job_id, attempt, grace_s=self.settings.termination_grace_s)
        return orphans

    def close(self) -> None:
        # Pods keep running: the next managers process adopts them through observe().
        if self._watch is not None:
            self._watch.stop()
        self._api_client.close()


_INFERENCE = label_value("inference")


def _index(pod: Mapping[str, Any]) -> int:
    try:
        return int((pod["metadata"].get("labels") or {}).get(LABEL_INDEX) or 0)
    except ValueError:
        return 0


def _port_key(port: Mapping[str, Any]) -> tuple[Any, ...]:
    return (port.get("name"), port.get("port"), port.get("targetPort"), port.get("protocol") or "TCP")


def _retiring(pod: Mapping[str, Any]) -> bool:
    return bool((pod["metadata"].get("annotations") or {}).get(ANNOTATION_RETIRING))


def _times(pods: Sequence[Mapping[str, Any]]) -> tuple[float | None, float | None]:
    """When the first of the pods started, and when the last one's main container finished."""
    starts = [t for t in (_started(p) for p in pods) if t is not None]
    finishes = [t for t in (_ts((_main_terminated(p) or {}).get("finishedAt")) for p in pods) if t is not None]
    return (min(starts) if starts else None), (max(finishes) if finishes else None)


def _failure(pods: Sequence[Mapping[str, Any]], phases: Sequence[str], started_at: float | None,
             finished_at: float) -> dict[str, Any] | None:
    """Observed's fields for the first Failed pod (exit code, reason and message), else None."""
    for pod, phase in zip(pods, phases):
        if phase == "Failed":
            term = _main_terminated(pod) or {}
            status = pod.get("status") or {}
            reason = term.get("reason") or status.get("reason") or "Failed"
            msg = term.get("message") or status.get("message") or ""
            return {"phase": RunPhase.FAILED, "exit_code": term.get("exitCode"), "started_at": started_at,
                    "finished_at": finished_at, "message": f"pod {pod['metadata']['name']}: {reason}" + (f": {msg}" if msg else "")}
    return None


def _status_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return str(exc.reason or "")


def _waiting_reason(pods: Sequence[Mapping[str, Any]]) -> str:
    for pod in pods:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting")
            if waiting and waiting.get("reason"):
                return f"pod {pod['metadata']['name']}: {waiting['reason']}"
    return ""
