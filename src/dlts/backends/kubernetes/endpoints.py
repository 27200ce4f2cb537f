"""The endpoints of an attempt (ssh, Jupyter, VS Code, ports) on Kubernetes: ``expose``.

What this module owns: one NodePort Service per attempt whose ports match the endpoints exactly
(created, patched, deleted), the endpoint ConfigMap the supervisor in the job's container reads
(made with the first endpoint; a distributed job's is made at launch), and (with
``network_policy: true``) the ingress of the attempt's NetworkPolicy: open from anywhere on exactly
the job's declared ports and its ready endpoints' container ports. An endpoint is ready once a pod
it selects runs (and, where the pod has a readiness probe, as an inference replica serving a port
has, is Ready: the Service sends nothing to it before) and its port has a nodePort, at the
InternalIP of the pod's node. A few requests per call, however large the cluster: the ConfigMap,
the Service and the NetworkPolicy by name, the attempt's pods (from the watch when there is one,
else one list by label), the pod's node when no recent node list has it; then only the writes that
change something.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes.client.exceptions import ApiException

from dlts.backends.base import EndpointSpec, EndpointState
from dlts.backends.k8s_render import (
    ANNOTATION_USER,
    ANNOTATION_VC,
    ANNOTATION_WORLD_SIZE,
    LABEL_INDEX,
    LABEL_ROLE,
    LABEL_TYPE,
    ManifestRenderer,
    authorized_keys,
    endpoint_lines,
    endpoint_port_name,
    endpoint_problem,
    valid_ssh_key,
)
from dlts.backends.kubernetes.api import MERGE_PATCH, KubernetesApi, status_message
from dlts.backends.kubernetes.names import (
    INFERENCE,
    endpoint_configmap_name,
    endpoint_service_name,
    is_retiring,
    network_policy_name,
    pod_name,
    replica_index,
)
from dlts.backends.kubernetes.translate import waiting

log = logging.getLogger(__name__)


def _port_key(port: Mapping[str, Any]) -> tuple[Any, ...]:
    return (port.get("name"), port.get("port"), port.get("targetPort"), port.get("protocol") or "TCP")


def _open_ports(policy: Mapping[str, Any] | None) -> set[int]:
    """The ports a NetworkPolicy lets in from anywhere (its ingress rules without ``from``)."""
    ports: set[int] = set()
    for rule in ((policy or {}).get("spec") or {}).get("ingress") or []:
        if not rule.get("from"):
            ports |= {int(p["port"]) for p in rule.get("ports") or [] if isinstance(p.get("port"), int)}
    return ports


def _declared_ports(pods: Sequence[Mapping[str, Any]]) -> set[int]:
    """The job's declared ports: the container ports its pods were launched with."""
    return {int(port["containerPort"]) for pod in pods for c in (pod.get("spec") or {}).get("containers") or []
            for port in c.get("ports") or [] if port.get("containerPort")}


def _readiness_probe(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("readinessProbe"):
            return c["readinessProbe"]
    return None


def _takes_traffic(pod: Mapping[str, Any]) -> bool:
    """Whether a running pod is among its Service's endpoints: a pod with a readiness probe (an
    inference replica serving a declared port) only while its Ready condition is True; a pod
    without one as soon as it runs (the kubelet marks it Ready when its containers start)."""
    if _readiness_probe(pod) is None:
        return True
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


class Endpoints:
    """``expose`` for the backend; ``pods_of(job, attempt)`` and ``node_address(node)`` come from it
    (the watch's copy or a list; the last node list or a read)."""

    def __init__(self, api: KubernetesApi, renderer: ManifestRenderer, namespace: str,
                 pods_of: Callable[[int, int], list[dict]], node_address: Callable[[str], str]) -> None:
        self.api = api
        self.renderer = renderer
        self.namespace = namespace
        self._pods_of = pods_of
        self._node_address = node_address

    def delete(self, job_id: int, attempt: int) -> None:
        """Remove the attempt's endpoint Service and ConfigMap (gone already is fine)."""
        core = self.api.core
        self.api.call(core.delete_namespaced_service, endpoint_service_name(job_id, attempt), self.namespace,
                      ok=(404,), _preload_content=False)
        self.api.call(core.delete_namespaced_config_map, endpoint_configmap_name(job_id, attempt), self.namespace,
                      ok=(404,), _preload_content=False)

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

        pods = self._pods_of(job_id, attempt)
        configmap = self.api.read(self.api.core.read_namespaced_config_map, endpoint_configmap_name(job_id, attempt), self.namespace)
        service = self.api.read(self.api.core.read_namespaced_service, endpoint_service_name(job_id, attempt), self.namespace)
        owner = configmap or service or (pods[0] if pods else None)
        if owner is None:  # nothing of the attempt exists (yet): nothing to attach the endpoints to
            why = f"waiting for pod {pod_name(job_id, attempt, 0)} to exist"
            return [states.get(e.id) or EndpointState(e.id, "pending", message=why) for e in endpoints]
        meta = owner["metadata"]
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in (LABEL_ROLE, LABEL_INDEX)}
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                       if k in (ANNOTATION_USER, ANNOTATION_VC, ANNOTATION_WORLD_SIZE)}
        inference = labels.get(LABEL_TYPE) == INFERENCE

        refused = self._sync_configmap(job_id, attempt, configmap, labels, annotations, wanted, keys)
        if refused:
            for endpoint in wanted:
                if endpoint.kind != "port":  # a port endpoint needs no server, so no ConfigMap
                    states[endpoint.id] = EndpointState(endpoint.id, "failed", message=refused)
        service, refused = self._sync_service(job_id, attempt, service, labels, annotations, wanted, inference)
        node_ports = {p.get("name"): p.get("nodePort") for p in ((service or {}).get("spec") or {}).get("ports") or []}
        serving = [p for p in pods if (not is_retiring(p) if inference else replica_index(p) == 0)]
        running = [p for p in serving if (p.get("status") or {}).get("phase") == "Running"
                   and not p["metadata"].get("deletionTimestamp")]
        unready = [p for p in running if not _takes_traffic(p)]
        running = [p for p in running if _takes_traffic(p)]
        host = self._node_address(running[0]["spec"].get("nodeName") or "") if running else ""
        if serving:
            first = serving[0]
            if first["metadata"].get("deletionTimestamp"):
                why = f"pod {first['metadata']['name']} is being deleted"
            elif unready:
                probe = _readiness_probe(unready[0]) or {}
                port = (probe.get("tcpSocket") or probe.get("httpGet") or {}).get("port", "?")
                why = (f"waiting for a replica to accept connections on port {port} (its readiness probe); "
                       f"pod {unready[0]['metadata']['name']} runs but does not yet")
            else:
                phase = (first.get("status") or {}).get("phase", "Pending")
                why = f"waiting for pod {first['metadata']['name']} to run ({waiting(first)[1].partition(': ')[2] or phase})"
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
        if self.renderer.settings.network_policy and pods:
            ready = [e for e in wanted if states[e.id].status == "ready"]
            refused, still_closed = self._sync_network_policy(job_id, attempt, labels, annotations, pods, ready)
            for endpoint in ready:
                if self.renderer.container_port(endpoint) in still_closed:  # the cluster would drop its traffic: not ready
                    states[endpoint.id] = EndpointState(endpoint.id, "failed", message=refused)
        return [states[e.id] for e in endpoints]

    def _sync_network_policy(self, job_id: int, attempt: int, labels: Mapping[str, str],
                             annotations: Mapping[str, str], pods: Sequence[Mapping[str, Any]],
                             ready: Sequence[EndpointSpec]) -> tuple[str, set[int]]:
        """Open the attempt's NetworkPolicy on exactly the declared ports and the ready endpoints'
        ports (created when missing, patched when its ports differ). Returns the API's refusal ("")
        and the ready endpoints' ports the policy still does not open."""
        ns, name = self.namespace, network_policy_name(job_id, attempt)
        net = self.api.networking
        wanted = _declared_ports(pods) | {self.renderer.container_port(e) for e in ready}
        current = self.api.read(net.read_namespaced_network_policy, name, ns)
        if current is not None and _open_ports(current) == wanted:
            return "", set()
        doc = self.renderer.network_policy(job_id, attempt, labels, annotations, wanted)
        try:
            if current is None:
                self.api.call(net.create_namespaced_network_policy, ns, doc, ok=(409,),
                              passthrough=(400, 403, 422), _preload_content=False)
            else:
                patch = {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                         "spec": {"ingress": doc["spec"]["ingress"]}}
                self.api.call(net.patch_namespaced_network_policy, name, ns, patch, passthrough=(400, 403, 409, 422),
                              _content_type=MERGE_PATCH, _preload_content=False)
        except ApiException as exc:
            if exc.status == 409:  # changed by someone since we read it: the next call
                return "", set()
            closed = {self.renderer.container_port(e) for e in ready} - _open_ports(current)
            return f"Kubernetes refused NetworkPolicy {name}: {status_message(exc)}", closed
        return "", set()

    def _sync_configmap(self, job_id: int, attempt: int, current: dict | None, labels: Mapping[str, str],
                                 annotations: Mapping[str, str], endpoints: Sequence[EndpointSpec],
                                 keys: tuple[str, ...]) -> str:
        """Create or update the endpoint ConfigMap; returns the API's refusal ("" when done)."""
        ns, name = self.namespace, endpoint_configmap_name(job_id, attempt)
        if current is None and not endpoints:  # made with the first endpoint (see the renderer)
            return ""
        try:
            if current is None:
                doc = self.renderer.endpoint_configmap(job_id, attempt, labels, annotations, endpoints, keys)
                self.api.call(self.api.core.create_namespaced_config_map, ns, doc, ok=(409,),
                           passthrough=(400, 403, 422), _preload_content=False)
                return ""
            data = {"endpoints": endpoint_lines(endpoints, self.renderer.container_port), "authorized_keys": authorized_keys(keys)}
            if any((current.get("data") or {}).get(k) != v for k, v in data.items()):
                # The supervisor script stays as the attempt started with it.
                self.api.call(self.api.core.patch_namespaced_config_map, name, ns, {"data": data}, passthrough=(400, 403, 422),
                           _content_type=MERGE_PATCH, _preload_content=False)
        except ApiException as exc:
            return f"Kubernetes refused ConfigMap {name}: {status_message(exc)}"
        return ""

    def _sync_service(self, job_id: int, attempt: int, current: dict | None, labels: Mapping[str, str],
                               annotations: Mapping[str, str], endpoints: Sequence[EndpointSpec],
                               inference: bool) -> tuple[dict | None, str]:
        """Make the endpoint Service's ports exactly ``endpoints`` (delete it when none are left).
        Returns the Service as it now is and the API's refusal ("" when done); after a refusal the
        Service is as it was, so endpoints it already served keep working."""
        ns, name = self.namespace, endpoint_service_name(job_id, attempt)
        if not endpoints:
            if current is not None:
                self.api.call(self.api.core.delete_namespaced_service, name, ns, ok=(404,), _preload_content=False)
            return None, ""
        doc = self.renderer.endpoint_service(job_id, attempt, labels, annotations, endpoints, inference)
        try:
            if current is None:
                resp = self.api.call(self.api.core.create_namespaced_service, ns, doc, passthrough=(400, 403, 409, 422, 500),
                                  _preload_content=False)
                return self.api.json(resp), ""
            ports = doc["spec"]["ports"]
            have = {p.get("name"): p for p in (current.get("spec") or {}).get("ports") or []}
            if [_port_key(p) for p in ports] == [_port_key(p) for p in have.values()]:
                return current, ""
            for port in ports:  # keep every remaining endpoint's address
                if (have.get(port["name"]) or {}).get("nodePort"):
                    port["nodePort"] = have[port["name"]]["nodePort"]
            patch = {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]}, "spec": {"ports": ports}}
            resp = self.api.call(self.api.core.patch_namespaced_service, name, ns, patch,
                              passthrough=(400, 403, 409, 422, 500),
                              _content_type=MERGE_PATCH, _preload_content=False)
            return self.api.json(resp), ""
        except ApiException as exc:
            message = status_message(exc)
            if exc.status == 409:  # created or changed by someone since we read it: next call
                return current, ""
            if exc.status == 500 and "allocate" not in message:
                self.api.failed(f"HTTP 500 {message}")  # the API is unwell: back off (raises)
            return current, f"Kubernetes refused Service {name}: {message}"
