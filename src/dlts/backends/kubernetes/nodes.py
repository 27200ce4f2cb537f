"""Nodes on Kubernetes: what node sync reads, when a node's pods count as lost, and DLTS's cordons.

* ``node_info``: a Node object as ``NodeInfo`` (SKU, IB domain and VC from the configured label
  keys, GPUs / CPU / memory from allocatable, ready, unschedulable, cordoned by DLTS).
* ``NodeLoss``: which nodes' pods count as lost now: Ready not True (NotReady, Unknown) for
  ``node_lost_after_s``, or a node absent from the node list for as long. Its memory of when a
  node went missing is the only state; a restart starts that clock again (it errs on waiting).
* ``Cordons``: ``cordon`` / ``uncordon`` with an ownership annotation, so DLTS never uncordons a
  node that someone else cordoned; every write is guarded by the resourceVersion read.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from dlts.backends.base import NodeInfo
from dlts.backends.k8s_render import GPU_RESOURCE
from dlts.backends.k8s_settings import KubernetesSettings
from dlts.backends.kubernetes.api import (
    STRATEGIC_MERGE_PATCH,
    KubernetesApi,
    KubernetesUnavailable,
)
from dlts.backends.kubernetes.names import (
    ANNOTATION_CORDON_REASON,
    ANNOTATION_CORDONED_AT,
    ANNOTATION_CORDONED_BY,
    CORDON_OWNER,
)
from dlts.backends.kubernetes.translate import ts


class NodeNotFound(LookupError):
    pass


class CordonResult(str, enum.Enum):
    CORDONED = "cordoned"  # DLTS cordoned it now
    ALREADY_CORDONED = "already_cordoned"  # DLTS had cordoned it before
    CORDONED_BY_OTHERS = "cordoned_by_others"  # someone else's cordon: DLTS leaves it alone
    UNCORDONED = "uncordoned"
    NOT_CORDONED = "not_cordoned"


def ready_condition(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond
    return None


def node_info(node: Mapping[str, Any], settings: KubernetesSettings) -> NodeInfo:
    meta, status = node["metadata"], node.get("status") or {}
    labels = meta.get("labels") or {}
    alloc = status.get("allocatable") or status.get("capacity") or {}
    gpus = int(parse_quantity(alloc.get(GPU_RESOURCE, "0")))
    cond = ready_condition(node)
    return NodeInfo(
        name=meta["name"],
        sku=labels.get(settings.sku_label) or ("cpu" if gpus == 0 else "unknown"),
        gpus=gpus,
        cpu=float(parse_quantity(alloc.get("cpu", "0"))),
        memory_bytes=int(parse_quantity(alloc.get("memory", "0"))),
        ib_domain=labels.get(settings.ib_domain_label) or "default",
        vc=labels.get(settings.vc_label) or None,
        ready=bool(cond and cond.get("status") == "True"),
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        cordoned_by_dlts=(meta.get("annotations") or {}).get(ANNOTATION_CORDONED_BY) == CORDON_OWNER,
    )


def node_address(node: Mapping[str, Any] | None, name: str) -> str:
    """Where users reach a NodePort on the node: its InternalIP, else its name."""
    for address in ((node or {}).get("status") or {}).get("addresses") or []:
        if address.get("type") == "InternalIP" and address.get("address"):
            return str(address["address"])
    return name


def _changed_by(stamp: str | None) -> float | None:
    """When a condition had changed at the latest: the API server writes whole seconds, so a
    change stamped 12:00:07 happened within that second; counting from its end means a node is
    never taken for lost before ``lost_after_s`` (at most a second late)."""
    since = ts(stamp)
    if since is None or stamp is None:
        return None
    return since if "." in stamp else since + 1.0


class NodeLoss:
    """Which nodes' pods count as lost (see the module docstring). Not thread-safe: ``observe`` only."""

    def __init__(self, lost_after_s: float) -> None:
        self.lost_after_s = lost_after_s
        self._missing_since: dict[str, float] = {}

    def lost(self, nodes: Mapping[str, Mapping[str, Any]], used: Iterable[str], now: float) -> dict[str, str]:
        """Node name -> why, for the nodes of ``nodes`` that are lost now and for the nodes in
        ``used`` (those pods are bound to) that have been missing from ``nodes`` long enough."""
        out: dict[str, str] = {}
        after = self.lost_after_s
        for name, node in nodes.items():
            self._missing_since.pop(name, None)
            cond = ready_condition(node)
            if cond is None or cond.get("status") != "True":
                since = _changed_by((cond or {}).get("lastTransitionTime")) or now
                if now - since >= after:
                    state = "Unknown" if cond is None else cond.get("status")
                    out[name] = f"node {name} has been Ready={state} for {now - since:.0f} s"
        for name in set(used) - set(nodes):
            since = self._missing_since.setdefault(name, now)
            if now - since >= after:
                out[name] = f"node {name} no longer exists"
        return out


class Cordons:
    def __init__(self, api: KubernetesApi) -> None:
        self.api = api

    def _read_node(self, name: str) -> dict:
        resp = self.api.call(self.api.core.read_node, name, ok=(404,), _preload_content=False)
        if resp is None:
            raise NodeNotFound(f"node {name} does not exist in the Kubernetes cluster")
        return self.api.json(resp)

    def _patch_node(self, name: str, node: Mapping[str, Any], patch: dict) -> bool:
        """Patch guarded by the resourceVersion we read: False when the node changed meanwhile."""
        patch.setdefault("metadata", {})["resourceVersion"] = node["metadata"]["resourceVersion"]
        try:
            self.api.call(self.api.core.patch_node, name, patch, passthrough=(404, 409), _content_type=STRATEGIC_MERGE_PATCH,
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
                ANNOTATION_CORDONED_AT: dt.datetime.fromtimestamp(self.api.clock(), dt.UTC).isoformat()}},
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
