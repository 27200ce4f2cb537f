"""Jobs as real pods on a real API server and kubelet, driven by DLTS as deployed (conftest.py).

Each test submits through the jobs service, ticks the job manager on the wall clock until the job
reaches the state it is after (bounded waits, never fixed sleeps), and checks what the real cluster
and the log store hold.
"""

from __future__ import annotations

import base64
import json

import pytest
import sqlalchemy as sa

from dlts.models import User, VirtualCluster
from dlts.services import registry_credentials
from dlts.services.auth import principal_for
from tests.k8s.real.conftest import NAMESPACE, UID

pytestmark = [pytest.mark.kube, pytest.mark.slow]


def test_a_batch_job_runs_as_its_owner_and_its_log_outlives_the_pod_then_the_next_job_runs(deployed):
    """The 1.20 story of the issue: the log came back empty (406) and every tick after it was skipped."""
    first = deployed.submit("echo hello from $DLTS_USER; id -u; id -g", gpus=1)
    deployed.tick_until("the first job ends", lambda: deployed.ended(first))
    job = deployed.job(first)
    assert (job.status.value, job.exit_code) == ("finished", 0), deployed.summary()
    lines = deployed.log(first).splitlines()
    assert lines[0] == "hello from alice"
    assert lines[1:3] == [str(UID), str(UID)]  # runAsUser / runAsGroup: the owner's uid and gid
    assert deployed.pods(first) == []  # forgotten: the pods went once their output was safe
    assert deployed.events(first, "cluster") == []
    second = deployed.submit("echo second")
    deployed.tick_until("the second job ends", lambda: deployed.ended(second))
    assert deployed.status(second) == "finished" and deployed.log(second) == "second\n"


def test_the_exit_code_is_the_commands_and_a_failure_says_so(deployed):
    job_id = deployed.submit("echo about to fail; exit 3", max_retries=0)
    deployed.tick_until("the job ends", lambda: deployed.ended(job_id))
    job = deployed.job(job_id)
    assert (job.status.value, job.exit_code) == ("failed", 3)
    assert deployed.log(job_id) == "about to fail\n"
    assert deployed.attempts(job_id)[0].exit_code == 3


def test_the_log_is_live_while_the_job_runs(deployed):
    job_id = deployed.submit("echo step 1; while [ ! -e /tmp/go ]; do sleep 0.2; done; echo step 2")
    deployed.tick_until("step 1 is in the log while the job runs",
                        lambda: deployed.status(job_id) == "running" and "step 1" in deployed.log(job_id))
    pod = deployed.pods(job_id)[0]["metadata"]["name"]
    deployed.cluster.exec_in(NAMESPACE, pod, "job", ["/bin/touch", "/tmp/go"])
    deployed.tick_until("the job ends", lambda: deployed.ended(job_id))
    assert deployed.log(job_id) == "step 1\nstep 2\n"


def test_a_kill_deletes_the_pods_and_the_job_is_killed(deployed):
    job_id = deployed.submit("echo up; sleep 300")
    deployed.tick_until("the job runs", lambda: deployed.status(job_id) == "running" and deployed.log(job_id))
    deployed.kill(job_id)
    deployed.tick_until("the job is killed and its pods gone",
                        lambda: deployed.status(job_id) == "killed" and not deployed.pods(job_id))
    assert deployed.log(job_id).startswith("up\n")  # then busybox's "Terminated", as the shell reports the TERM


def test_a_new_managers_process_adopts_a_running_job(deployed):
    job_id = deployed.submit("echo before; while [ ! -e /tmp/go ]; do sleep 0.2; done; echo after")
    deployed.tick_until("the job runs", lambda: deployed.status(job_id) == "running" and deployed.log(job_id))
    deployed.restart()
    pod = deployed.pods(job_id)[0]["metadata"]["name"]
    deployed.cluster.exec_in(NAMESPACE, pod, "job", ["/bin/touch", "/tmp/go"])
    deployed.tick_until("the job ends", lambda: deployed.ended(job_id))
    assert deployed.status(job_id) == "finished"
    assert deployed.log(job_id) == "before\nafter\n"  # nothing twice, nothing lost across the restart
    assert len(deployed.attempts(job_id)) == 1


def test_the_pod_carries_the_priority_class_node_affinity_and_security_the_server_accepted(deployed):
    job_id = deployed.submit("sleep 300", gpus=2, preemptible=True)
    deployed.tick_until("the job runs", lambda: deployed.status(job_id) == "running")
    pod = deployed.pods(job_id)[0]
    spec = pod["spec"]
    assert spec["priorityClassName"] == "dlts-preemptible" and spec["priority"] == 100  # resolved by admission
    [term] = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [spec["nodeName"]] == term["matchFields"][0]["values"]  # kube-scheduler bound it where DLTS said
    assert spec["securityContext"]["runAsUser"] == UID and spec["securityContext"]["runAsNonRoot"] is True
    assert "sysctls" not in spec["securityContext"]  # a 1.20 kubelet refuses the port sysctl
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    init = pod["status"]["initContainerStatuses"][0]
    assert init["state"]["terminated"]["exitCode"] == 0  # the init container copied busybox
    policies = deployed.cluster.request("GET", f"/apis/networking.k8s.io/v1/namespaces/{NAMESPACE}/networkpolicies")
    assert [p["metadata"]["name"] for p in policies["items"]] == [f"dlts-{job_id}-1"]


def test_a_distributed_job_gets_its_headless_service_whose_endpoints_name_its_pod(deployed):
    """A gang of one pod: what DNS would serve for MASTER_ADDR (the headless Service's
    endpoints, filled by the real endpoints controller) names the pod, under the hostname it runs as."""
    job_id = deployed.submit("echo rank $RANK of $WORLD_SIZE, master $MASTER_ADDR:$MASTER_PORT; hostname -f; "
                             "while [ ! -e /tmp/go ]; do sleep 0.2; done", type="distributed", nodes=1, gpus=8)
    deployed.tick_until("the job runs", lambda: deployed.status(job_id) == "running" and deployed.log(job_id))
    pod = deployed.pods(job_id)[0]
    endpoints = deployed.cluster.request("GET", f"/api/v1/namespaces/{NAMESPACE}/endpoints/dlts-{job_id}-1")
    addresses = [a for subset in endpoints.get("subsets") or [] for a in subset.get("addresses") or []]
    assert [(a["hostname"], a["ip"]) for a in addresses] == [(f"dlts-{job_id}-1-0", pod["status"]["podIP"])]
    deployed.cluster.exec_in(NAMESPACE, pod["metadata"]["name"], "job", ["/bin/touch", "/tmp/go"])
    deployed.tick_until("the job ends", lambda: deployed.ended(job_id))
    assert deployed.status(job_id) == "finished", deployed.summary()
    assert deployed.log(job_id).splitlines() == [
        f"rank 0 of 8, master dlts-{job_id}-1-0.dlts-{job_id}-1.{NAMESPACE}.svc:29500",
        f"dlts-{job_id}-1-0.dlts-{job_id}-1.{NAMESPACE}.svc.cluster.local"]


def test_a_registry_credential_becomes_a_pull_secret_the_server_accepts_and_it_goes_with_the_job(deployed):
    with deployed.sessions() as s:
        principal = principal_for(s, s.scalar(sa.select(User).where(User.name == "alice")))
        registry_credentials.add_mine(s, deployed.settings.secret_key, principal, "dlts.test", "alice", "token-1")
    # pulled with credentials, the image is pulled every time: the node's copy (imported, as a
    # private image another tenant pulled would be) is not used, and the registry (none here) is asked
    uncached = deployed.submit("echo never")
    deployed.tick_until("the kubelet tries to pull the job's image", lambda: deployed.job(uncached).reason == "image_pull")
    [pod] = deployed.pods(uncached)
    assert {c["imagePullPolicy"] for group in ("initContainers", "containers") for c in pod["spec"][group]
            if c["image"] == deployed.shell_image} == {"Always"}
    deployed.kill(uncached)
    deployed.tick_until("the job that could not pull is killed", lambda: deployed.ended(uncached))
    # a VC whose policy allows the node's cache for images pulled with credentials
    with deployed.sessions() as s:
        s.execute(sa.update(VirtualCluster).where(VirtualCluster.name == "vision")
                  .values(pod_policy={"cached_private_images": True}))
        s.commit()
    job_id = deployed.submit("echo pulled; while [ ! -e /tmp/go ]; do sleep 0.2; done")
    deployed.tick_until("the job runs", lambda: deployed.status(job_id) == "running")
    secrets = deployed.cluster.request("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets?labelSelector=dlts.io%2Fjob-id%3D{job_id}")
    [secret] = secrets["items"]
    assert secret["type"] == "kubernetes.io/dockerconfigjson"  # validated by the real server on create
    auths = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))["auths"]
    assert list(auths) == ["dlts.test"] and auths["dlts.test"]["username"] == "alice"
    [pod] = deployed.pods(job_id)
    assert pod["spec"]["imagePullSecrets"] == [{"name": secret["metadata"]["name"]}]
    deployed.cluster.exec_in(NAMESPACE, pod["metadata"]["name"], "job", ["/bin/touch", "/tmp/go"])
    deployed.tick_until("the job ends and its objects are gone", lambda: deployed.ended(job_id) and not deployed.cluster.request(
        "GET", f"/api/v1/namespaces/{NAMESPACE}/secrets?labelSelector=dlts.io%2Fjob-id%3D{job_id}")["items"])
    assert deployed.log(job_id) == "pulled\n"
