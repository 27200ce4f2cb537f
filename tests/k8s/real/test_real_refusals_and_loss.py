"""What the real cluster refuses, and a node that is lost for real.

* A Role without ``pods/log`` (an operator's RBAC mistake): the real API server answers the log copy
  with 403. The job still ends ``finished``, the refusal is on it in words, its pods are kept until
  their output is safe, and every other job goes on being scheduled and run; once the Role is fixed
  the next tick copies the log and deletes the pods.
* The kubelet stopped mid-job: the real node lifecycle controller marks the node NotReady, DLTS shows
  the node not ready and requeues the job by its node-loss rules (no retry spent), and it runs to its
  end on the other node; with the kubelet back the node is ready again.
"""

from __future__ import annotations

import pytest

from tests.k8s.real.conftest import NAMESPACE

pytestmark = [pytest.mark.kube, pytest.mark.slow]

ROLE = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/roles/dlts-jobs"


def test_a_log_the_managers_may_not_read_costs_that_job_a_step_and_never_the_tick(deployed, real_cluster):
    role = real_cluster.request("GET", ROLE)
    without_logs = [rule for rule in role["rules"] if "pods/log" not in rule["resources"]]
    real_cluster.request("PATCH", ROLE, body={"rules": without_logs}, content_type="application/merge-patch+json")
    try:
        first = deployed.submit("echo kept until it can be read")
        deployed.tick_until("the job ends and the refusal is on it",
                            lambda: deployed.ended(first) and deployed.events(first, "cluster"))
        assert deployed.status(first) == "finished"
        [event] = deployed.events(first, "cluster")
        assert event.reason == "cleanup"
        assert "HTTP 403" in event.message and "pods/log" in event.message, event.message
        assert deployed.pods(first), "the pods go only once their output is copied"
        # the rest of the cluster goes on: the next job is scheduled, runs and ends
        second = deployed.submit("echo the tick goes on", gpus=1)
        deployed.tick_until("the second job ends", lambda: deployed.ended(second))
        assert deployed.status(second) == "finished"
        assert len(deployed.events(first, "cluster")) == 1  # the same refusal is said once
    finally:
        real_cluster.request("PATCH", ROLE, body={"rules": role["rules"]}, content_type="application/merge-patch+json")
    deployed.tick_until("both logs are copied and the pods gone",
                        lambda: not deployed.pods(first) and not deployed.pods(second))
    assert deployed.log(first) == "kept until it can be read\n"
    assert deployed.log(second) == "the tick goes on\n"


def test_a_lost_node_goes_not_ready_and_its_job_is_requeued_then_runs_elsewhere(deployed, real_cluster):
    job_id = deployed.submit("echo attempt $DLTS_ATTEMPT; while [ ! -e /tmp/go ]; do sleep 0.2; done", gpus=8)
    deployed.tick_until("the job runs", lambda: deployed.status(job_id) == "running" and deployed.log(job_id))
    lost = deployed.pods(job_id)[0]["spec"]["nodeName"]
    other = next(n.name for n in real_cluster.nodes if n.name != lost)
    real_cluster.stop_kubelet(lost)
    try:
        deployed.tick_until("the job is requeued as its node was lost, and the node shown not ready", lambda:
                            deployed.attempts(job_id)[0].end_reason == "node_lost" and
                            (lost, "a100", 8, False) in deployed.node_rows(), timeout_s=240)
        assert deployed.job(job_id).retries_used == 0  # a lost node spends no retry
        deployed.tick_until("the second attempt runs on the other node", lambda: deployed.status(job_id) == "running"
                            and len(deployed.attempts(job_id)) == 2 and "attempt 2" in deployed.log(job_id, 2))
        [pod] = deployed.pods(job_id)
        assert (pod["metadata"]["name"], pod["spec"]["nodeName"]) == (f"dlts-{job_id}-2-0", other)
        deployed.cluster.exec_in(NAMESPACE, pod["metadata"]["name"], "job", ["/bin/touch", "/tmp/go"])
        deployed.tick_until("the job ends", lambda: deployed.ended(job_id))
        assert deployed.status(job_id) == "finished"
    finally:
        real_cluster.start_kubelet(lost)
    deployed.tick_until("the node is ready again", lambda: (lost, "a100", 8, True) in deployed.node_rows(),
                        timeout_s=180)
