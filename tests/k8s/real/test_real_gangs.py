"""Gangs on two real nodes: all of a distributed job's pods or none.

* A node cordoned by someone else (``spec.unschedulable``, as ``kubectl cordon`` does) is not ready
  for DLTS, so a two-node gang waits with no pod created at all, saying why; once the cordon is lifted
  both pods are created and run together.
* GPUs held by a pod DLTS does not know about: DLTS places the gang on both nodes, kube-scheduler
  binds one pod and leaves the other Pending (Insufficient nvidia.com/gpu); the job says so, and at
  ``start_timeout_s`` the attempt ends and both pods go (the one that ran too), a retry spent; when
  the GPUs are free again the next attempt runs both.
"""

from __future__ import annotations

import pytest

from tests.k8s.real.conftest import NAMESPACE

pytestmark = [pytest.mark.kube, pytest.mark.slow]

GANG = "echo rank $RANK; while [ ! -e /tmp/go ]; do sleep 0.2; done"


@pytest.fixture
def top_settings():
    return {"start_timeout_s": 25}


def release(deployed, job_id: int) -> None:
    for pod in deployed.pods(job_id):
        deployed.cluster.exec_in(NAMESPACE, pod["metadata"]["name"], "job", ["/bin/touch", "/tmp/go"])


def test_a_gang_waits_whole_while_a_node_is_cordoned_by_someone_else_then_starts_whole(deployed, real_cluster):
    path = "/api/v1/nodes/dlts-kube-1"
    real_cluster.request("PATCH", path, body={"spec": {"unschedulable": True}},
                         content_type="application/merge-patch+json")
    try:
        job_id = deployed.submit(GANG, type="distributed", nodes=2, gpus=8)
        deployed.tick_until("the gang waits with a reason", lambda: deployed.job(job_id).reason is not None)
        for _ in range(5):
            deployed.manager.tick()
        job = deployed.job(job_id)
        assert job.status.value == "queued" and deployed.pods(job_id) == [], (job.reason, job.reason_detail)
    finally:
        real_cluster.request("PATCH", path, body={"spec": {"unschedulable": False}},
                             content_type="application/merge-patch+json")
    deployed.tick_until("both pods run", lambda: deployed.status(job_id) == "running" and len(deployed.pods(job_id)) == 2
                        and sorted(deployed.log(job_id).splitlines()) == ["[1] rank 8", "rank 0"])
    assert {p["spec"]["nodeName"] for p in deployed.pods(job_id)} == {"dlts-kube-0", "dlts-kube-1"}
    release(deployed, job_id)
    deployed.tick_until("the gang ends", lambda: deployed.ended(job_id))
    assert deployed.status(job_id) == "finished"


def test_a_gang_half_bound_ends_whole_at_the_start_timeout_and_runs_when_the_gpus_are_free(deployed, real_cluster):
    squatter = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "not-dlts", "namespace": "default"},
                "spec": {"nodeName": "dlts-kube-1", "restartPolicy": "Never",
                         "securityContext": {"runAsUser": 65534},
                         "containers": [{"name": "hold", "image": real_cluster.images["shell"],
                                         "command": ["/bin/sh", "-c", "sleep 3600"],
                                         "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}
    real_cluster.request("POST", "/api/v1/namespaces/default/pods", body=squatter)
    try:
        job_id = deployed.submit(GANG, type="distributed", nodes=2, gpus=8, max_retries=2)
        deployed.tick_until("one pod waits as unschedulable", lambda: deployed.job(job_id).reason == "unschedulable",
                            timeout_s=180)
        assert "Insufficient nvidia.com/gpu" in deployed.job(job_id).reason_detail
        deployed.tick_until("the attempt ends at the start timeout, both pods gone", lambda:
                            deployed.attempts(job_id)[0].end_reason == "start_timeout" and
                            all(p["metadata"]["name"].startswith(f"dlts-{job_id}-2-") for p in deployed.pods(job_id)),
                            timeout_s=180)
        assert deployed.job(job_id).retries_used >= 1
    finally:
        real_cluster.request("DELETE", "/api/v1/namespaces/default/pods/not-dlts", body={"gracePeriodSeconds": 0})
    deployed.tick_until("a later attempt runs both pods", lambda: deployed.status(job_id) == "running" and
                        len(deployed.pods(job_id)) == 2 and
                        {p["status"]["phase"] for p in deployed.pods(job_id)} == {"Running"}, timeout_s=240)
    release(deployed, job_id)
    deployed.tick_until("the gang ends", lambda: deployed.ended(job_id))
    assert deployed.status(job_id) == "finished"
