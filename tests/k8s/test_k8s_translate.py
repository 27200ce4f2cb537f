"""Pods to Observed (pure), and the replica-phase rule both backends share: table tests."""

from __future__ import annotations

import pytest

from dlts.backends.base import RunPhase
from dlts.backends.kubernetes.translate import observe_attempt
from dlts.backends.phases import MemberState, attempt_state

T0 = "2027-01-15T08:00:00Z"
NOW = 1_800_000_100.0


def pod(index: int = 0, phase: str = "Pending", *, job: str | None = None, init: list[dict] | None = None,
        scheduled: tuple[str, str, str] | None = None, node: str = "n1", pods: int = 1, type: str = "batch",
        retiring: bool = False, deleting: bool = False) -> dict:
    """A pod as the API server returns it; ``job``: the job container's state (waiting reason,
    "running", or "exit:N")."""
    status: dict = {"phase": phase, "conditions": []}
    if scheduled:
        status["conditions"].append({"type": "PodScheduled", "status": scheduled[0], "reason": scheduled[1],
                                     "message": scheduled[2]})
    if init is not None:
        status["initContainerStatuses"] = [{"name": f"init{i}", "state": s} for i, s in enumerate(init)]
    if job:
        if job == "running":
            state: dict = {"running": {"startedAt": T0}}
        elif job.startswith("exit:"):
            state = {"terminated": {"exitCode": int(job[5:]), "reason": "Error" if job != "exit:0" else "Completed",
                                    "startedAt": T0, "finishedAt": "2027-01-15T08:01:00Z"}}
        else:
            reason, _, message = job.partition("|")
            state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        status["containerStatuses"] = [{"name": "job", "state": state}]
    meta = {"name": f"dlts-1-1-{index}", "creationTimestamp": T0,
            "labels": {"dlts.io/job-id": "1", "dlts.io/attempt": "1", "dlts.io/index": str(index),
                       "dlts.io/type": type},
            "annotations": {"dlts.io/pods": str(pods), **({"dlts.io/retiring": "scale-down"} if retiring else {})}}
    if deleting:
        meta["deletionTimestamp"] = T0
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}, "status": status}


UNSCHEDULABLE = ("0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't match Pod's node "
                 "affinity/selector. preemption: not eligible due to preemptionPolicy=Never.")

CASES = [
    # (sentence, pods, lost nodes, (phase, reason, exit code, message fragment))
    ("a pod just created is pending with no reason", [pod()], {}, (RunPhase.PENDING, "", None, "")),
    ("a pod the scheduler cannot place is unschedulable with the scheduler's message",
     [pod(node="", scheduled=("False", "Unschedulable", UNSCHEDULABLE))], {},
     (RunPhase.PENDING, "unschedulable", None, f"pod dlts-1-1-0: {UNSCHEDULABLE}")),
    ("an image that cannot be pulled is image_pull",
     [pod(job='ErrImagePull|failed to pull and unpack image "nosuch:1"')], {},
     (RunPhase.PENDING, "image_pull", None, 'pod dlts-1-1-0: ErrImagePull: failed to pull and unpack image "nosuch:1"')),
    ("a pull in back-off is image_pull", [pod(job="ImagePullBackOff|Back-off pulling image")], {},
     (RunPhase.PENDING, "image_pull", None, "ImagePullBackOff: Back-off pulling image")),
    ("an init image that cannot be pulled is image_pull",
     [pod(init=[{"waiting": {"reason": "ImagePullBackOff", "message": "Back-off"}}], job="PodInitializing")], {},
     (RunPhase.PENDING, "image_pull", None, "init container init0: ImagePullBackOff")),
    ("runAsNonRoot on a root image is container_config",
     [pod(job="CreateContainerConfigError|container has runAsNonRoot and image will run as root")], {},
     (RunPhase.PENDING, "container_config", None, "container has runAsNonRoot and image will run as root")),
    ("a container the runtime cannot create is container_config", [pod(job="CreateContainerError|bad mount")], {},
     (RunPhase.PENDING, "container_config", None, "CreateContainerError: bad mount")),
    ("an init container in crash back-off is init_failed",
     [pod(init=[{"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}}])], {},
     (RunPhase.PENDING, "init_failed", None, "init container init0: CrashLoopBackOff")),
    ("an init container that exited non-zero fails the attempt, saying so",
     [pod(phase="Failed", init=[{"terminated": {"exitCode": 1, "reason": "Error"}}], job="PodInitializing")], {},
     (RunPhase.FAILED, "init_failed", None, "init container init0 exited with code 1: Error")),
    ("the first init container done, the second running: still starting",
     [pod(init=[{"terminated": {"exitCode": 0}}, {"running": {}}], job="PodInitializing")], {},
     (RunPhase.PENDING, "", None, "pod dlts-1-1-0: PodInitializing")),
    ("a running pod runs", [pod(phase="Running", job="running")], {}, (RunPhase.RUNNING, "", None, "")),
    ("a container that exited 7 fails with 7", [pod(phase="Failed", job="exit:7")], {},
     (RunPhase.FAILED, "", 7, "pod dlts-1-1-0: Error")),
    ("a succeeded pod succeeds", [pod(phase="Succeeded", job="exit:0")], {}, (RunPhase.SUCCEEDED, "", 0, "")),
    ("a running pod on a lost node is gone", [pod(phase="Running", job="running")], {"n1": "node n1 is gone"},
     (RunPhase.GONE, "", None, "pod dlts-1-1-0: node n1 is gone")),
    ("a succeeded pod stays succeeded when its node is lost", [pod(phase="Succeeded", job="exit:0")],
     {"n1": "node n1 is gone"}, (RunPhase.SUCCEEDED, "", 0, "")),
    ("a gang runs only when every pod runs",
     [pod(0, "Running", job="running", pods=2), pod(1, job="ImagePullBackOff|x", pods=2)], {},
     (RunPhase.PENDING, "image_pull", None, "pod dlts-1-1-1: ImagePullBackOff")),
    ("one failed rank fails the gang",
     [pod(0, "Running", job="running", pods=2), pod(1, "Failed", job="exit:134", pods=2)], {},
     (RunPhase.FAILED, "", 134, "dlts-1-1-1")),
    ("a rank that finished while others run: the gang runs",
     [pod(0, "Running", job="running", pods=2), pod(1, "Succeeded", job="exit:0", pods=2)], {},
     (RunPhase.RUNNING, "", None, "")),
    ("a terminating gang says so", [pod(phase="Running", job="running", deleting=True)], {},
     (RunPhase.RUNNING, "", None, "terminating")),
    ("inference runs while any replica runs",
     [pod(0, "Running", job="running", type="inference"), pod(1, job="ImagePullBackOff|x", type="inference")], {},
     (RunPhase.RUNNING, "", None, "")),
    ("inference with no replica running waits with the first reason",
     [pod(0, type="inference"), pod(1, job="ErrImagePull|x", type="inference")], {},
     (RunPhase.PENDING, "image_pull", None, "pod dlts-1-1-1: ErrImagePull")),
    ("a retiring replica's failure does not fail inference",
     [pod(0, "Running", job="running", type="inference"),
      pod(1, "Failed", job="exit:137", type="inference", retiring=True)], {},
     (RunPhase.RUNNING, "", None, "")),
]


@pytest.mark.parametrize("pods,lost,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_pods_translate_to_observed(pods, lost, expected):
    seen = observe_attempt((1, 1), pods, lost_nodes=lost, now=NOW, missing_after_s=30)
    phase, reason, exit_code, fragment = expected
    assert (seen.phase, seen.reason, seen.exit_code) == (phase, reason, exit_code)
    assert fragment in seen.message
    if not fragment:
        assert seen.message == ""


def test_inference_reports_which_replicas_exist_and_retire():
    seen = observe_attempt((1, 1), [pod(0, "Running", job="running", type="inference"),
                                    pod(2, "Running", job="running", type="inference", retiring=True)],
                           lost_nodes={}, now=NOW, missing_after_s=30)
    assert (seen.replicas, seen.retiring) == (frozenset({0, 2}), frozenset({2}))


def test_a_half_launched_gang_is_hidden_then_gone_once_old():
    young = observe_attempt((1, 1), [pod(0, "Running", job="running", pods=2)], lost_nodes={},
                            now=1_800_000_000.0 + 10, missing_after_s=30)
    assert young is None  # the job manager launches again, creating only the missing pod
    old = observe_attempt((1, 1), [pod(0, "Running", job="running", pods=2)], lost_nodes={},
                          now=1_800_000_000.0 + 31, missing_after_s=30)
    assert old.phase is RunPhase.GONE and "1 of its 2 pods" in old.message


def test_started_and_finished_times_come_from_the_job_container():
    seen = observe_attempt((1, 1), [pod(phase="Succeeded", job="exit:0")], lost_nodes={}, now=NOW, missing_after_s=30)
    assert seen.finished_at - seen.started_at == 60


def test_the_image_id_is_the_job_containers_as_the_runtime_resolved_it():
    resolved = "docker.io/pytorch/pytorch@sha256:" + "5e" * 32
    running = pod(0, "Running", job="running")
    running["status"]["initContainerStatuses"] = [{"name": "dlts-init", "imageID": "docker.io/library/busybox@sha256:"
                                                   + "0" * 64, "state": {"terminated": {"exitCode": 0}}}]
    running["status"]["containerStatuses"][0]["imageID"] = resolved
    for type in ("batch", "inference"):
        running["metadata"]["labels"]["dlts.io/type"] = type
        seen = observe_attempt((1, 1), [running], lost_nodes={}, now=NOW, missing_after_s=30)
        assert (seen.phase, seen.image_id) == (RunPhase.RUNNING, resolved)
    # before the job container exists there is nothing to say
    assert observe_attempt((1, 1), [pod(0, job="ContainerCreating")], lost_nodes={}, now=NOW,
                           missing_after_s=30).image_id == ""


def m(index: int, phase: RunPhase, **kw) -> MemberState:
    return MemberState(index, phase, **kw)


R, P, S, F, G = RunPhase.RUNNING, RunPhase.PENDING, RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.GONE
PHASE_CASES = [
    # (sentence, members, all_must_run, phase, cause index)
    ("nothing yet is pending", [], True, P, None),
    ("a failure wins over everything", [m(0, G), m(1, F), m(2, F)], True, F, 1),
    ("all succeeded is success", [m(0, S), m(1, S)], True, S, None),
    ("a lost member makes it gone", [m(0, R), m(1, G)], True, G, 1),
    ("success and a lost member: gone", [m(0, S), m(1, G)], False, G, 1),
    ("a gang with a pending member is pending, the one with a reason is the cause",
     [m(0, R), m(1, P), m(2, P, reason="image_pull")], True, P, 2),
    ("a gang with every member running runs", [m(0, R), m(1, R)], True, R, None),
    ("replicas run while any runs", [m(0, P), m(1, R)], False, R, None),
    ("replicas, none running: pending", [m(0, P, reason="unschedulable"), m(1, S)], False, P, 0),
]


@pytest.mark.parametrize("members,gang,phase,cause", [c[1:] for c in PHASE_CASES], ids=[c[0] for c in PHASE_CASES])
def test_replica_phase_rule(members, gang, phase, cause):
    state = attempt_state(members, all_must_run=gang)
    assert state.phase is phase
    assert (state.cause.index if state.cause else None) == cause


def test_attempt_times_span_the_members():
    state = attempt_state([m(0, S, started_at=5.0, finished_at=20.0), m(1, S, started_at=3.0, finished_at=30.0)],
                          all_must_run=True)
    assert (state.started_at, state.finished_at) == (3.0, 30.0)
