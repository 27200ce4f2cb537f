"""The names and labels the Kubernetes backend finds, reads and deletes DLTS's objects by.

``k8s_render`` writes the objects and owns their names and labels; this module is the backend's
side of that contract: the (job id, attempt) key and replica index read back from labels, the
names of the per-attempt objects the delete paths remove by name, and the annotations DLTS puts on
nodes it cordons. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dlts.backends.k8s_render import (
    ANNOTATION_LOG_KEY,
    ANNOTATION_RETIRING,
    LABEL_ATTEMPT,
    LABEL_INDEX,
    LABEL_JOB_ID,
    LABEL_TYPE,
    MANAGED_SELECTOR,
    attempt_name,
    attempt_selector,
    endpoint_configmap_name,
    endpoint_service_name,
    label_value,
    pod_name,
)

__all__ = [
    "ANNOTATION_CORDONED_AT", "ANNOTATION_CORDONED_BY", "ANNOTATION_CORDON_REASON", "CORDON_OWNER", "INFERENCE",
    "JOB_CONTAINER", "MANAGED_SELECTOR", "attempt_key", "attempt_name", "attempt_selector",
    "endpoint_configmap_name", "endpoint_service_name", "headless_service_name", "is_retiring", "log_key",
    "network_policy_name", "pod_name", "pull_secret_name", "replica_index",
]

ANNOTATION_CORDONED_BY = "dlts.io/cordoned-by"
ANNOTATION_CORDON_REASON = "dlts.io/cordon-reason"
ANNOTATION_CORDONED_AT = "dlts.io/cordoned-at"
CORDON_OWNER = "dlts"
INFERENCE = label_value("inference")  # the dlts.io/type label of an inference attempt's pods
JOB_CONTAINER = "job"  # the container that runs the user's command (its log is the job's log)


def headless_service_name(job_id: int, attempt: int) -> str:
    """The headless Service that gives a distributed attempt's pods their DNS names."""
    return attempt_name(job_id, attempt)


def network_policy_name(job_id: int, attempt: int) -> str:
    """The attempt's NetworkPolicy (networking.k8s.io/v1; another kind, so it may share the name)."""
    return attempt_name(job_id, attempt)


def pull_secret_name(job_id: int, attempt: int) -> str:
    """The attempt's ``kubernetes.io/dockerconfigjson`` Secret (registry credentials)."""
    return f"{attempt_name(job_id, attempt)}-pull"


def attempt_key(obj: Mapping[str, Any]) -> tuple[int, int] | None:
    """(job id, attempt) from an object's labels; None for an object that carries no valid pair."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    try:
        return int(labels[LABEL_JOB_ID]), int(labels[LABEL_ATTEMPT])
    except (KeyError, ValueError, TypeError):
        return None


def replica_index(pod: Mapping[str, Any]) -> int:
    """The pod's placement / replica index (label ``dlts.io/index``; 0 when unreadable)."""
    try:
        return int((pod["metadata"].get("labels") or {}).get(LABEL_INDEX) or 0)
    except ValueError:
        return 0


def is_inference(pod: Mapping[str, Any]) -> bool:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_TYPE) == INFERENCE


def is_retiring(pod: Mapping[str, Any]) -> bool:
    """Marked by scale-down before its deletion: its ending is on purpose."""
    return bool((pod["metadata"].get("annotations") or {}).get(ANNOTATION_RETIRING))


def log_key(pod: Mapping[str, Any]) -> str | None:
    """The log key of the attempt that made the pod (annotation ``dlts.io/log-key``); None: a pod
    made before log keys."""
    return (pod["metadata"].get("annotations") or {}).get(ANNOTATION_LOG_KEY) or None
