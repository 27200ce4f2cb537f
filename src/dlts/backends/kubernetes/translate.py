"""Pods to ``Observed``: what the cluster says about one attempt, in DLTS's terms. Pure.

Input: an attempt's pods as the API server returns them (raw JSON), the nodes whose pods count as
lost now (with the reason), the clock's now and ``missing_after_s``. Output: one ``Observed`` or
None. Each pod becomes a ``phases.MemberState`` and ``phases.attempt_state`` decides the phase,
the same rule the local backend uses. What only pods have is decided here:

* a pod on a lost node that has not finished is GONE with ``node_lost``;
* a distributed attempt missing pods it should have (``dlts.io/pods`` annotation) reports
  nothing while its newest pod is young (a launch interrupted half-way: the job manager launches
  again, which creates only the missing pods), and GONE once it is ``missing_after_s`` old;
* inference: retiring replicas (scale-down) are left out of the phase; ``replicas`` and
  ``retiring`` list what exists;
* why a pod has not started (``waiting``), as ``Observed.reason`` with ``message`` the cluster's
  words prefixed by the pod's name:

  ========================================================  ====================
  what the pod shows                                        reason
  ========================================================  ====================
  condition PodScheduled False, reason Unschedulable        ``unschedulable``
  a container waiting ErrImagePull / ImagePullBackOff /     ``image_pull``
  InvalidImageName / ErrImageNeverPull (init ones too)
  a container waiting CreateContainerConfigError /          ``container_config``
  CreateContainerError (init ones too)
  an init container terminated non-zero, or waiting         ``init_failed``
  with another error (CrashLoopBackOff, RunContainerError)
  anything else while Pending (ContainerCreating, ...)      ``""`` (starting)
  ========================================================  ====================

  A pod that failed before its job container started (an init container exited non-zero, the
  job container could not start) is FAILED and keeps the reason, so the job says why.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from dlts.backends.base import Observed, RunPhase
from dlts.backends.k8s_render import ANNOTATION_WORLD_SIZE
from dlts.backends.kubernetes.names import (
    JOB_CONTAINER,
    is_inference,
    is_retiring,
    replica_index,
)
from dlts.backends.phases import AttemptState, MemberState, attempt_state

IMAGE_PULL = "image_pull"
CONTAINER_CONFIG = "container_config"
UNSCHEDULABLE = "unschedulable"
INIT_FAILED = "init_failed"

_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                           "RegistryUnavailable"})
_CONFIG_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError"})
_STARTING_REASONS = frozenset({"ContainerCreating", "PodInitializing", ""})


def ts(value: str | None) -> float | None:
    """Seconds since the epoch of an RFC 3339 time (None for none)."""
    if not value:
        return None
    return dt.datetime.fromisoformat(value).timestamp()  # Python 3.11 reads the trailing Z


def _status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("status") or {}


def _name(pod: Mapping[str, Any]) -> str:
    return str(pod["metadata"]["name"])


def _job_status(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for cs in _status(pod).get("containerStatuses") or []:
        if cs.get("name") == JOB_CONTAINER:
            return cs
    return None


def started_at(pod: Mapping[str, Any]) -> float | None:
    """When the job container started (not when the pod was accepted: pulls and init come between)."""
    state = (_job_status(pod) or {}).get("state") or {}
    for key in ("running", "terminated"):
        if (state.get(key) or {}).get("startedAt"):
            return ts(state[key]["startedAt"])
    return None


def image_id(pods: Sequence[Mapping[str, Any]]) -> str:
    """The job container's ``imageID`` (the image as the runtime resolved it) of the first pod that
    has one; "" before any job container was created."""
    for pod in pods:
        found = (_job_status(pod) or {}).get("imageID")
        if isinstance(found, str) and found:
            return found[:512]
    return ""


def job_terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return ((_job_status(pod) or {}).get("state") or {}).get("terminated")


def _words(reason: str, message: str) -> str:
    return f"{reason}: {message}" if reason and message else reason or message


def waiting(pod: Mapping[str, Any]) -> tuple[str, str]:
    """(reason code, "pod NAME: the cluster's words") for a pod that has not started; ("", "") when
    nothing says why (it is simply starting)."""
    name, status = _name(pod), _status(pod)
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            return UNSCHEDULABLE, f"pod {name}: {cond.get('message') or 'Unschedulable'}"
    for cs in status.get("initContainerStatuses") or []:
        state = cs.get("state") or {}
        wait, term = state.get("waiting") or {}, state.get("terminated") or {}
        where = f"pod {name}: init container {cs.get('name')}"
        if term and term.get("exitCode") not in (0, None):
            return INIT_FAILED, f"{where} exited with code {term['exitCode']}: " + _words(
                term.get("reason") or "Error", term.get("message") or "")
        reason = wait.get("reason") or ""
        if reason in _PULL_REASONS:
            return IMAGE_PULL, f"{where}: {_words(reason, wait.get('message') or '')}"
        if reason in _CONFIG_REASONS:
            return CONTAINER_CONFIG, f"{where}: {_words(reason, wait.get('message') or '')}"
        if reason not in _STARTING_REASONS:
            return INIT_FAILED, f"{where}: {_words(reason, wait.get('message') or '')}"
    for cs in status.get("containerStatuses") or []:
        wait = (cs.get("state") or {}).get("waiting") or {}
        reason = wait.get("reason") or ""
        if reason in _PULL_REASONS:
            return IMAGE_PULL, f"pod {name}: {_words(reason, wait.get('message') or '')}"
        if reason in _CONFIG_REASONS:
            return CONTAINER_CONFIG, f"pod {name}: {_words(reason, wait.get('message') or '')}"
        if reason not in _STARTING_REASONS:
            return "", f"pod {name}: {_words(reason, wait.get('message') or '')}"
        if reason:
            return "", f"pod {name}: {reason}"
    return "", ""


def member(pod: Mapping[str, Any], lost_nodes: Mapping[str, str]) -> MemberState:
    """One pod as a member of its attempt."""
    index, status = replica_index(pod), _status(pod)
    phase = status.get("phase") or "Pending"
    term = job_terminated(pod) or {}
    start, finish = started_at(pod), ts(term.get("finishedAt"))
    if phase == "Failed":
        if not term:  # it never ran its command: an init container, or the start itself, failed
            reason, words = waiting(pod)
            if words:
                return MemberState(index, RunPhase.FAILED, None, start, finish, words, reason or INIT_FAILED)
        why = term.get("reason") or status.get("reason") or "Failed"
        text = term.get("message") or status.get("message") or ""
        return MemberState(index, RunPhase.FAILED, term.get("exitCode"), start, finish,
                           f"pod {_name(pod)}: {_words(why, text)}")
    if phase == "Succeeded":
        return MemberState(index, RunPhase.SUCCEEDED, 0, start, finish)
    node = (pod.get("spec") or {}).get("nodeName") or ""
    if node and node in lost_nodes:
        return MemberState(index, RunPhase.GONE, None, start, None, f"pod {_name(pod)}: {lost_nodes[node]}",
                           node_lost=True)
    if phase == "Running":
        return MemberState(index, RunPhase.RUNNING, None, start)
    reason, words = waiting(pod)
    return MemberState(index, RunPhase.PENDING, None, start, None, words, reason)


def observe_attempt(key: tuple[int, int], pods: Sequence[Mapping[str, Any]], *, lost_nodes: Mapping[str, str],
                    now: float, missing_after_s: float) -> Observed | None:
    """The attempt ``key`` from its pods (at least one); None: nothing to report yet."""
    job_id, attempt = key
    pods = sorted(pods, key=replica_index)
    if is_inference(pods[0]):
        return _observe_replicas(key, pods, lost_nodes, now)
    annotations = pods[0]["metadata"].get("annotations") or {}
    try:
        expected = max(len(pods), int(annotations.get(ANNOTATION_WORLD_SIZE, 1)))
    except ValueError:
        expected = len(pods)
    verdict = attempt_state([member(p, lost_nodes) for p in pods], all_must_run=True)
    terminating = any(p["metadata"].get("deletionTimestamp") for p in pods)
    if len(pods) < expected and verdict.phase not in (RunPhase.FAILED, RunPhase.GONE) and not terminating:
        created = [ts(p["metadata"].get("creationTimestamp")) or now for p in pods]
        if now - max(created) >= missing_after_s:
            return Observed(job_id, attempt, RunPhase.GONE, started_at=verdict.started_at,
                            message=f"{expected - len(pods)} of its {expected} pods were deleted outside DLTS")
        # A launch interrupted half-way (crash, API error): report nothing, so that the job
        # manager re-issues the launch, which creates only the missing pods.
        return None
    return _observed(key, verdict, now, message="terminating" if terminating else "", image_id=image_id(pods))


def _observe_replicas(key: tuple[int, int], pods: Sequence[Mapping[str, Any]],
                      lost_nodes: Mapping[str, str], now: float) -> Observed:
    """An inference attempt: its replicas are independent pods. A replica pod that is missing is
    not judged here: the job manager knows which replicas it asked for and creates it again."""
    job_id, attempt = key
    common: dict[str, Any] = {"replicas": frozenset(replica_index(p) for p in pods),
                              "retiring": frozenset(replica_index(p) for p in pods if is_retiring(p)),
                              "image_id": image_id(pods)}
    live = [p for p in pods if not is_retiring(p)]
    if not live:  # only replicas on their way out (never the case while the job runs normally)
        return Observed(job_id, attempt, RunPhase.RUNNING, message="replicas exiting", **common)
    verdict = attempt_state([member(p, lost_nodes) for p in live], all_must_run=False)
    return _observed(key, verdict, now, **common)


def _observed(key: tuple[int, int], verdict: AttemptState, now: float, message: str = "", **common: Any) -> Observed:
    job_id, attempt = key
    cause = verdict.cause or MemberState(0, verdict.phase)
    if verdict.phase is RunPhase.FAILED:
        return Observed(job_id, attempt, RunPhase.FAILED, exit_code=cause.exit_code, started_at=verdict.started_at,
                        finished_at=verdict.finished_at or now, message=cause.message, reason=cause.reason, **common)
    if verdict.phase is RunPhase.SUCCEEDED:
        return Observed(job_id, attempt, RunPhase.SUCCEEDED, exit_code=0, started_at=verdict.started_at,
                        finished_at=verdict.finished_at or now, **common)
    if verdict.phase is RunPhase.GONE:
        return Observed(job_id, attempt, RunPhase.GONE, started_at=verdict.started_at, node_lost=cause.node_lost,
                        message=cause.message, **common)
    if verdict.phase is RunPhase.PENDING:
        return Observed(job_id, attempt, RunPhase.PENDING, started_at=verdict.started_at,
                        message=cause.message, reason=cause.reason, **common)
    return Observed(job_id, attempt, RunPhase.RUNNING, started_at=verdict.started_at, message=message, **common)
