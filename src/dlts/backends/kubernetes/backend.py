"""``KubernetesBackend``: the ``ClusterBackend`` that runs job attempts as pods.

It puts the package's parts together; each concern lives in its own module (see the package's
docstring). What this module owns is the lifecycle of an attempt's objects:

* ``launch``: the server's version read once (``/version``), so that the renderer writes only
  what that version accepts; then the objects ``k8s_render`` produces (secrets, a distributed job's endpoint ConfigMap, services, the
  NetworkPolicy, then one pod per placement), created idempotently: a name that already exists
  is the object of this very attempt (names are deterministic), so a second launch creates
  nothing. Thread-safe: the job manager launches several attempts at once
  (``kubernetes.launch_parallelism``).
* Inference replicas: pod ``dlts-J-A-<replica index>``; ``launch`` again with more replicas creates
  the new pods only (scale-up); ``remove_replicas`` marks the pods ``dlts.io/retiring`` and deletes
  them with a grace period (scale-down).
* ``observe``: one (paged) list of our pods and one of nodes per call, however many jobs run (with
  ``watch`` on, the pods come from memory kept by ``k8s_watch.PodWatch``), translated by
  ``translate``. Nothing is ever concluded from a failed call: an attempt is never reported gone
  because a list failed.
* ``terminate`` (kill, preemption) deletes the pods with a grace period and the endpoint objects at
  once; deleting what is gone succeeds.
* ``sync_logs`` / ``forget``: the pods' output copied into the log store (``logcopy``); ``forget``
  copies the rest, then deletes every object of the attempt: pods, services, the endpoint
  ConfigMap, secrets (the registry pull Secret among them) and the NetworkPolicy.
  ``collect_garbage`` removes the same for attempts no DB row owns.
* ``nodes`` (node sync), ``cordon`` / ``uncordon`` (``nodes``).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dlts.backends.base import (
    EndpointSpec,
    EndpointState,
    LaunchSpec,
    NodeInfo,
    Observed,
)
from dlts.backends.k8s_render import (
    ANNOTATION_RETIRING,
    LaunchRefused,
    ManifestRenderer,
)
from dlts.backends.k8s_settings import KubernetesSettings
from dlts.backends.k8s_watch import PodWatch
from dlts.backends.kubernetes.api import (
    MERGE_PATCH,
    KubernetesApi,
    KubernetesRefused,
    connect,
    status_message,
)
from dlts.backends.kubernetes.endpoints import Endpoints
from dlts.backends.kubernetes.logcopy import LogCopier
from dlts.backends.kubernetes.names import (
    MANAGED_SELECTOR,
    attempt_key,
    attempt_selector,
    headless_service_name,
    pod_name,
)
from dlts.backends.kubernetes.nodes import (
    CordonResult,
    Cordons,
    NodeLoss,
    node_address,
    node_info,
)
from dlts.backends.kubernetes.translate import observe_attempt

log = logging.getLogger(__name__)

_VERSION = re.compile(r"v?(\d+)\.(\d+)")


def parse_server_version(info: dict) -> tuple[int, int]:
    """(major, minor) from a ``/version`` answer: its ``gitVersion`` ("v1.20.2", "v1.27.3-gke.100"),
    else ``major`` and ``minor`` ("1", "20+" on some providers)."""
    match = _VERSION.match(str(info.get("gitVersion") or ""))
    if match:
        return int(match.group(1)), int(match.group(2))
    try:
        return int(str(info["major"]).rstrip("+")), int(str(info["minor"]).rstrip("+"))
    except (KeyError, ValueError):
        raise KubernetesRefused(f"the API server's /version says neither gitVersion nor major.minor: {info}") from None


LOG_COPY_PARALLELISM = 4  # attempts whose logs are copied at once


class KubernetesBackend:
    """``ClusterBackend`` over a Kubernetes cluster. Thread-safe; one instance per managers process."""

    name = "kubernetes"

    def __init__(self, settings: KubernetesSettings, *, log_dir: Path, log_max_bytes: int,
                 node_lost_after_s: float = 300.0, termination_grace_s: float = 30.0,
                 templates_dir: str | None = None, api_client: k8s.ApiClient | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self.termination_grace_s = termination_grace_s
        self.launch_parallelism = settings.launch_parallelism  # the job manager's launch pool size
        self.renderer = ManifestRenderer(settings, templates_dir=templates_dir,
                                         termination_grace_s=int(termination_grace_s))
        self.api = KubernetesApi(settings, api_client or connect(settings), clock)
        self.core = self.api.core
        self._lock = threading.Lock()
        self._nodes_cache: tuple[float, list[dict]] | None = None
        self._node_loss = NodeLoss(node_lost_after_s)
        self._lost_nodes: dict[str, str] = {}  # what the last observe found lost (name -> why)
        self._cordons = Cordons(self.api)
        self._endpoints = Endpoints(self.api, self.renderer, settings.namespace, self._attempt_pods,
                                    self._node_address)
        self._logs = LogCopier(self.api, settings.namespace, Path(log_dir), log_max_bytes,
                               parallelism=LOG_COPY_PARALLELISM)
        self._watch: PodWatch | None = None
        if settings.watch:
            self._watch = PodWatch(self.core, settings.namespace, MANAGED_SELECTOR,
                                   watch_timeout_s=settings.watch_timeout_s,
                                   request_timeout_s=settings.request_timeout_s, page_size=settings.list_page_size,
                                   on_request=self.api.count_request)
            self._watch.start()

    @property
    def api_calls(self) -> int:
        """Every request sent so far (for the calls-per-tick measurement)."""
        return self.api.calls

    # -- launching ------------------------------------------------------------------------------

    def server_version(self) -> tuple[int, int]:
        """The API server's (major, minor), read once; the renderer renders for it from then on."""
        with self._lock:
            known = self.renderer.server_version
        if known is not None:
            return known
        info = self.api.read(k8s.VersionApi(self.api.client).get_code) or {}
        version = parse_server_version(info)
        with self._lock:
            self.renderer.server_version = version
        log.info("Kubernetes API server %s: rendering for %d.%d%s", info.get("gitVersion", "?"), *version,
                 "" if self.renderer.unprivileged_port_sysctl else
                 " (no ip_unprivileged_port_start sysctl before 1.22: sshd listens on 2222 in the container)")
        return version

    def launch(self, spec: LaunchSpec) -> None:
        self.server_version()
        rendered = self.renderer.render(spec)
        ns = self.settings.namespace
        for doc in rendered.all():
            # 409 AlreadyExists: the deterministic name belongs to this attempt, created by an
            # earlier launch (e.g. before a restart); creating nothing twice is the point.
            try:
                created = self.api.create(doc["kind"], ns, doc, ok=(409,), passthrough=(400, 403, 422))
            except ApiException as exc:  # admission (quota, pod security) or validation said no
                raise LaunchRefused(f"Kubernetes refused {doc['kind']} {doc['metadata']['name']}: "
                                    f"{status_message(exc)}") from None
            if created is not None and doc["kind"] == "Pod" and self._watch is not None:
                self._watch.remember_raw(doc["metadata"]["name"], created.data)  # decoded when read

    def remove_replicas(self, job_id: int, attempt: int, replicas: Iterable[int], grace_s: float) -> None:
        """Scale-down: mark each replica's pod retiring (so observe knows its end is on purpose),
        then delete it with the grace period. A pod already gone is fine (404)."""
        ns = self.settings.namespace
        patch = {"metadata": {"annotations": {ANNOTATION_RETIRING: "scale-down"}}}
        for index in sorted({int(i) for i in replicas}):
            name = pod_name(job_id, attempt, index)
            resp = self.api.call(self.core.patch_namespaced_pod, name, ns, patch, ok=(404,), _content_type=MERGE_PATCH,
                                 _preload_content=False)
            if resp is None:
                continue
            if self._watch is not None:
                self._watch.remember_raw(name, resp.data)
            self.api.call(self.core.delete_namespaced_pod, name, ns, grace_period_seconds=max(0, round(grace_s)),
                          ok=(404,), _preload_content=False)

    # -- ending ---------------------------------------------------------------------------------

    def terminate(self, job_id: int, attempt: int, grace_s: float) -> None:
        ns = self.settings.namespace
        self.api.call(self.core.delete_collection_namespaced_pod, ns, label_selector=attempt_selector(job_id, attempt),
                      grace_period_seconds=max(0, round(grace_s)), _preload_content=False)
        # The attempt ends: its endpoints stop being reachable now, not when it is forgotten.
        self._endpoints.delete(job_id, attempt)

    def forget(self, job_id: int, attempt: int) -> None:
        """Copy the rest of the attempt's output into the log store, then delete its objects.
        When the output cannot be read now, nothing is deleted (``KubernetesRefused``): the job
        manager forgets it on a later tick. Output on a node the last ``observe`` found lost is not
        waited for: the log says it went with the node."""
        key = (int(job_id), int(attempt))
        with self._lock:
            lost = dict(self._lost_nodes)
        self._logs.copy_rest(key, self._attempt_pods(*key), lost)
        # Grace 0: a finished pod goes at once; a pod stuck on a lost node is force-removed so
        # that it does not hold the name (and the GPUs, once the node returns).
        self._delete_attempt(*key, grace_s=0)
        self._logs.forget(key)
        if self._watch is not None:  # gone now; do not report it again before the DELETED event
            prefix = f"dlts-{job_id}-{attempt}-"
            self._watch.forget({n for n in self._watch.names() if n.startswith(prefix)})

    def _delete_attempt(self, job_id: int, attempt: int, grace_s: float) -> None:
        ns, selector = self.settings.namespace, attempt_selector(job_id, attempt)
        self.api.call(self.core.delete_collection_namespaced_pod, ns, label_selector=selector,
                      grace_period_seconds=max(0, round(grace_s)), _preload_content=False)
        # Services have no deletecollection in core/v1 (before 1.31 clusters); delete by name.
        self.api.call(self.core.delete_namespaced_service, headless_service_name(job_id, attempt), ns, ok=(404,),
                      _preload_content=False)
        self._endpoints.delete(job_id, attempt)
        # The registry pull Secret and any other Secret of the attempt, by label.
        self.api.call(self.core.delete_collection_namespaced_secret, ns, label_selector=selector,
                      _preload_content=False)
        self.api.call(self.api.networking.delete_collection_namespaced_network_policy, ns, label_selector=selector,
                      _preload_content=False)

    def collect_garbage(self, live: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
        """Delete every DLTS object whose (job id, attempt) is not in ``live`` (the DB's live attempts).

        The job manager calls it with the attempts the database says are starting or running;
        anything else carrying our labels is an orphan (a crash between create and the DB write, a
        DB restored from backup, a forgotten attempt). Returns the attempts removed. Their output
        is not copied: no job row wants it.
        """
        live_set = {(int(j), int(a)) for j, a in live}
        ns = self.settings.namespace
        found: set[tuple[int, int]] = set()
        for fn in (self.core.list_namespaced_pod, self.core.list_namespaced_service,
                   self.core.list_namespaced_secret, self.core.list_namespaced_config_map,
                   self.api.networking.list_namespaced_network_policy):
            for obj in self.api.list_all(fn, ns, label_selector=MANAGED_SELECTOR):
                key = attempt_key(obj)
                if key is not None:
                    found.add(key)
        orphans = tuple(sorted(found - live_set))
        for job_id, attempt in orphans:
            log.info("removing orphaned Kubernetes objects of job %s attempt %s", job_id, attempt)
            self._delete_attempt(job_id, attempt, grace_s=self.termination_grace_s)
            self._logs.forget((job_id, attempt))
        return orphans

    # -- looking --------------------------------------------------------------------------------

    def _pods(self) -> list[dict]:
        """Every DLTS pod: the watch's copy when it can be trusted, else one paged list."""
        pods = self._watch.snapshot() if self._watch is not None else None
        if pods is None:  # no watch, or it cannot be trusted right now
            pods = self.api.list_all(self.core.list_namespaced_pod, self.settings.namespace,
                                 label_selector=MANAGED_SELECTOR)
        return pods

    def _attempt_pods(self, job_id: int, attempt: int) -> list[dict]:
        pods = self._watch.snapshot() if self._watch is not None else None
        if pods is None:
            return self.api.list_all(self.core.list_namespaced_pod, self.settings.namespace,
                                 label_selector=attempt_selector(job_id, attempt))
        return [p for p in pods if attempt_key(p) == (job_id, attempt)]

    @staticmethod
    def _by_attempt(pods: Iterable[dict]) -> dict[tuple[int, int], list[dict]]:
        groups: dict[tuple[int, int], list[dict]] = {}
        for pod in pods:
            key = attempt_key(pod)
            if key is not None:
                groups.setdefault(key, []).append(pod)
        return groups

    def observe(self) -> Sequence[Observed]:
        groups = self._by_attempt(self._pods())
        nodes = {n["metadata"]["name"]: n for n in self._node_list(reuse=True)}
        now = self.clock()
        used = {(p.get("spec") or {}).get("nodeName") for pods in groups.values() for p in pods} - {None, ""}
        lost = self._node_loss.lost(nodes, used, now)  # type: ignore[arg-type]
        with self._lock:
            self._lost_nodes = dict(lost)
        # An attempt with no pods at all is absent here; the job manager knows which attempts it
        # launched and decides (relaunch a lost create, or count a running one as gone).
        observed = (observe_attempt(key, group, lost_nodes=lost, now=now, missing_after_s=self.settings.missing_after_s)
                    for key, group in sorted(groups.items()))
        return [o for o in observed if o is not None]

    def sync_logs(self, attempts: Iterable[tuple[int, int]]) -> None:
        """Copy the new output of these attempts' pods into the log store (see ``logcopy``)."""
        wanted = {(int(j), int(a)) for j, a in attempts}
        if not wanted:
            return
        groups = self._by_attempt(self._pods())
        self._logs.sync({key: pods for key, pods in groups.items() if key in wanted})

    def expose(self, job_id: int, attempt: int, endpoints: Sequence[EndpointSpec],
               ssh_public_keys: tuple[str, ...] = ()) -> Sequence[EndpointState]:
        return self._endpoints.expose(int(job_id), int(attempt), endpoints, ssh_public_keys)

    # -- nodes ----------------------------------------------------------------------------------

    def nodes(self) -> Sequence[NodeInfo]:
        return [node_info(node, self.settings) for node in self._node_list(reuse=False)]

    def _node_list(self, reuse: bool) -> list[dict]:
        """List nodes; ``observe`` reuses the list ``nodes()`` fetched moments before in the same tick."""
        now = self.clock()
        with self._lock:
            cached = self._nodes_cache
        if reuse and cached is not None and 0 <= now - cached[0] <= self.settings.node_list_reuse_s:
            return cached[1]
        items = self.api.list_all(self.core.list_node)
        with self._lock:
            self._nodes_cache = (now, items)
        return items

    def _node_address(self, node: str) -> str:
        """From the last node list (every tick's observe or node sync fetches one), else one read."""
        with self._lock:
            cached = self._nodes_cache
        found = next((n for n in cached[1] if n["metadata"]["name"] == node), None) if cached else None
        if found is None and node:
            found = self.api.read(self.core.read_node, node)
        return node_address(found, node)

    def cordon(self, node: str, reason: str = "") -> CordonResult:
        """Mark ``node`` unschedulable and record that DLTS did it (so only DLTS undoes it)."""
        return self._cordons.cordon(node, reason)

    def uncordon(self, node: str) -> CordonResult:
        """Undo a DLTS cordon; a cordon someone else set stays (``CORDONED_BY_OTHERS``)."""
        return self._cordons.uncordon(node)

    def close(self) -> None:
        # Pods keep running: the next managers process adopts them through observe().
        if self._watch is not None:
            self._watch.stop()
        self.api.close()

