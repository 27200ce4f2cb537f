"""KubernetesBackend.expose: a job's endpoints as one NodePort Service and one ConfigMap per attempt,
through the official client against the fake API server."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest
from conftest import caught_up, env_of, make_spec

from dlts.backends.base import EndpointSpec
from dlts.backends.kubernetes import KubernetesUnavailable

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq alice@laptop"
TOKEN_HASH = hashlib.sha256(b"the-token").hexdigest()
SSH = EndpointSpec(11, "ssh", 22)
JUPYTER = EndpointSpec(12, "jupyter", 8888, TOKEN_HASH)
TENSORBOARD = EndpointSpec(13, "port", 6006)
VSCODE = EndpointSpec(14, "vscode", 8080, TOKEN_HASH)


def service(api, job_id: int = 1, attempt: int = 1) -> dict | None:
    found = [s for s in api.objects("services") if s["metadata"]["name"] == f"dlts-{job_id}-{attempt}-ep"]
    return found[0] if found else None


def configmap(api, job_id: int = 1, attempt: int = 1) -> dict:
    [cm] = [c for c in api.objects("configmaps") if c["metadata"]["name"] == f"dlts-{job_id}-{attempt}-endpoints"]
    return cm


def node_ports(svc: dict) -> dict[str, int]:
    return {p["name"]: p["nodePort"] for p in svc["spec"]["ports"]}


def by_id(states) -> dict:
    return {s.id: s for s in states}


def writes(api) -> int:
    return sum(n for (verb, _res), n in api.requests.items() if verb in ("create", "update", "patch", "delete",
                                                                           "deletecollection"))


@pytest.fixture
def running(api, backend):
    """Job 1 attempt 1 launched on n2 and running."""
    backend.launch(make_spec(1, command="sleep infinity", nodes=("n2",)))
    api.kubelet.tick()
    return backend


def test_launch_makes_no_endpoint_service_from_ports_and_the_configmap_with_the_first_endpoint(api, backend):
    backend.launch(make_spec(1, ports=(22, 8888), ssh_public_keys=(KEY,)))
    assert service(api) is None and api.objects("services") == []
    assert api.objects("configmaps") == []  # not distributed: nothing reads it before an endpoint opens
    backend.expose(1, 1, [], (KEY,))
    assert api.objects("configmaps") == []  # nothing to expose: still none
    backend.expose(1, 1, [SSH], (KEY,))
    cm = configmap(api)
    assert cm["data"]["endpoints"] == "11 ssh 22\n" and cm["data"]["authorized_keys"] == KEY + "\n"
    assert cm["data"]["supervisor.sh"].startswith("#!/bin/sh\n# DLTS endpoint supervisor")
    assert cm["metadata"]["labels"]["dlts.io/job-id"] == "1" and cm["metadata"]["labels"]["dlts.io/vc"] == "vision"
    [pod] = api.pods()
    assert {"name": "dlts-endpoints", "configMap": {"name": "dlts-1-1-endpoints", "optional": True,
                                                    "defaultMode": 0o444}} in pod["spec"]["volumes"]
    assert env_of(pod)["DLTS_ENDPOINTS_DIR"] == "/dlts-endpoints"
    command = pod["spec"]["containers"][0]["command"]
    assert command[:3] == ["/dlts-runtime/busybox", "sh", "-c"]  # the entrypoint starts the supervisor
    assert 'exec "$bb" sh "$DLTS_ENDPOINTS_DIR/supervisor.sh"' in command[3]


def test_only_the_first_pod_of_a_distributed_job_runs_the_supervisor(api, backend):
    backend.launch(make_spec(2, type="distributed", nodes=("n1", "n2")))
    pods = sorted(api.pods(), key=lambda p: p["metadata"]["name"])
    assert [env_of(p).get("DLTS_ENDPOINTS_DIR") for p in pods] == ["/dlts-endpoints", None]
    # every pod sees the owner's keys (ssh between the pods): the ConfigMap is there from the start
    assert {env_of(p)["DLTS_SSH_AUTHORIZED_KEYS"] for p in pods} == {"/dlts-endpoints/authorized_keys"}
    assert configmap(api, 2)["data"]["endpoints"] == ""


def test_endpoints_are_pending_until_the_pod_runs_then_ready_at_the_nodes_internal_ip(api, backend):
    backend.launch(make_spec(1, command="sleep infinity", nodes=("n2",)))
    states = by_id(backend.expose(1, 1, [SSH, JUPYTER, TENSORBOARD], (KEY,)))
    assert {s.status for s in states.values()} == {"pending"}
    assert states[11].message == "waiting for pod dlts-1-1-0 to run (Pending)"
    svc = service(api)
    assert svc["spec"]["type"] == "NodePort"
    assert svc["spec"]["selector"] == {"dlts.io/job-id": "1", "dlts.io/attempt": "1",
                                       "app.kubernetes.io/managed-by": "dlts", "dlts.io/index": "0"}
    assert [(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
        ("e11", 22, 22), ("e12", 8888, 8888), ("e13", 6006, 6006)]
    assigned = node_ports(svc)
    assert all(30000 <= n <= 32767 for n in assigned.values()) and len(set(assigned.values())) == 3
    assert svc["metadata"]["labels"]["dlts.io/user"] == "alice"  # labelled like the attempt's other objects

    api.kubelet.tick()
    internal_ip = next(a["address"] for a in api.store.get("nodes", "", "n2")["status"]["addresses"]
                       if a["type"] == "InternalIP")
    states = by_id(backend.expose(1, 1, [SSH, JUPYTER, TENSORBOARD], (KEY,)))
    assert {(s.status, s.host, s.host_port) for s in states.values()} == {
        ("ready", internal_ip, assigned["e11"]), ("ready", internal_ip, assigned["e12"]),
        ("ready", internal_ip, assigned["e13"])}


def test_the_configmap_lists_the_endpoints_and_keys_for_the_supervisor(api, running):
    other_key = "ssh-rsa AAAAB3NzaC1yc2E bob@desk"
    running.expose(1, 1, [TENSORBOARD, SSH, JUPYTER], (KEY, other_key))
    cm = configmap(api)
    assert cm["data"]["endpoints"] == f"11 ssh 22\n12 jupyter 8888 {TOKEN_HASH}\n13 port 6006\n"
    assert cm["data"]["authorized_keys"] == f"{KEY}\n{other_key}\n"
    assert cm["data"]["supervisor.sh"].startswith("#!/bin/sh")  # kept as the attempt started with it


def test_adding_and_removing_endpoints_keeps_the_others_addresses_and_the_last_removal_deletes_the_service(api, running):
    running.expose(1, 1, [SSH], (KEY,))
    first = node_ports(service(api))
    states = by_id(running.expose(1, 1, [SSH, JUPYTER, TENSORBOARD], (KEY,)))
    grown = node_ports(service(api))
    assert grown["e11"] == first["e11"] and set(grown) == {"e11", "e12", "e13"}
    assert states[12].host_port == grown["e12"] and states[12].status == "ready"
    states = by_id(running.expose(1, 1, [SSH, TENSORBOARD], (KEY,)))
    shrunk = node_ports(service(api))
    assert shrunk == {"e11": grown["e11"], "e13": grown["e13"]}
    assert (states[11].host_port, states[13].host_port) == (grown["e11"], grown["e13"])
    assert configmap(api)["data"]["endpoints"] == "11 ssh 22\n13 port 6006\n"
    assert running.expose(1, 1, [], (KEY,)) == []
    assert service(api) is None
    assert configmap(api)["data"]["endpoints"] == ""


def open_ports(api, job_id: int = 1, attempt: int = 1) -> set[int]:
    """The ports the attempt's NetworkPolicy lets in from anywhere (ingress rules without ``from``)."""
    [policy] = [p for p in api.objects("networkpolicies") if p["metadata"]["name"] == f"dlts-{job_id}-{attempt}"]
    return {port["port"] for rule in policy["spec"]["ingress"] if not rule.get("from") for port in rule["ports"]}


def test_the_network_policy_opens_the_declared_and_the_ready_endpoints_ports_only(api, backend):
    backend.launch(make_spec(1, command="sleep infinity", nodes=("n2",), ports=(7000,)))
    assert open_ports(api) == {7000}  # at launch: the job's declared ports
    states = by_id(backend.expose(1, 1, [SSH, TENSORBOARD], (KEY,)))
    assert {s.status for s in states.values()} == {"pending"}
    assert open_ports(api) == {7000}  # nothing runs yet: no endpoint port is opened
    api.kubelet.tick()
    states = by_id(backend.expose(1, 1, [SSH, TENSORBOARD], (KEY,)))
    assert {s.status for s in states.values()} == {"ready"}
    assert open_ports(api) == {7000, 22, 6006}
    # the pods of the attempt still reach each other on every port
    [policy] = api.objects("networkpolicies")
    assert {"podSelector": {"matchLabels": {"dlts.io/job-id": "1", "dlts.io/attempt": "1",
                                            "app.kubernetes.io/managed-by": "dlts"}}} in policy["spec"]["ingress"][0]["from"]
    backend.expose(1, 1, [SSH], (KEY,))  # TensorBoard closed
    assert open_ports(api) == {7000, 22}
    backend.expose(1, 1, [], (KEY,))
    assert open_ports(api) == {7000}


def test_a_deleted_network_policy_is_made_again_by_expose(api, running):
    api.store.remove_internal("networkpolicies", "default", "dlts-1-1")
    assert running.expose(1, 1, [TENSORBOARD])[0].status == "ready"
    assert open_ports(api) == {6006}


def test_a_refused_network_policy_fails_the_endpoints_it_would_have_opened(api, running):
    running.expose(1, 1, [SSH], (KEY,))
    api.fail_next(1, 403, verbs={"patch"}, resources={"networkpolicies"})
    states = by_id(running.expose(1, 1, [SSH, TENSORBOARD], (KEY,)))
    assert states[11].status == "ready"  # already open
    assert states[13].status == "failed" and states[13].message.startswith("Kubernetes refused NetworkPolicy dlts-1-1")
    assert open_ports(api) == {22}


def test_without_network_policy_expose_makes_none(api, make_backend):
    backend = make_backend(network_policy=False)
    backend.launch(make_spec(1, command="sleep infinity", nodes=("n2",)))
    api.kubelet.tick()
    assert backend.expose(1, 1, [TENSORBOARD])[0].status == "ready"
    assert api.objects("networkpolicies") == []


def test_a_repeated_expose_writes_nothing_and_reads_a_few_objects(api, running):
    running.nodes()  # the tick's node list, as the job manager's node sync fetches it
    running.expose(1, 1, [SSH, JUPYTER], (KEY,))
    svc = service(api)
    api.reset_counts()
    again = running.expose(1, 1, [SSH, JUPYTER], (KEY,))
    assert writes(api) == 0
    # the ConfigMap, the Service, the NetworkPolicy, the attempt's pods (no node: cached)
    assert api.total_requests() == 4
    assert service(api)["metadata"]["resourceVersion"] == svc["metadata"]["resourceVersion"]
    assert {s.status for s in again} == {"ready"}


def test_with_the_watch_the_pods_come_from_memory(api, make_backend):
    backend = make_backend(watch=True)
    backend.launch(make_spec(1, command="sleep infinity", nodes=("n2",)))
    api.kubelet.tick()
    caught_up(api, backend)
    api.reset_counts()
    states = backend.expose(1, 1, [TENSORBOARD])
    assert states[0].status == "ready"
    assert api.requests[("list", "pods")] == 0


def test_a_node_without_an_internal_ip_is_reached_by_name(api, backend):
    api.add_node("bare", internal_ip=None)
    backend.launch(make_spec(1, command="sleep infinity", nodes=("bare",)))
    api.kubelet.tick()
    [state] = backend.expose(1, 1, [TENSORBOARD])
    assert (state.status, state.host) == ("ready", "bare")


def test_an_inference_endpoint_serves_every_replica_and_is_ready_while_any_runs(api, backend):
    spec = replace(make_spec(7, type="inference", command="sleep infinity", nodes=("n3", "n4")), replicas=(0, 1))
    backend.launch(spec)
    api.kubelet.tick()
    backend.remove_replicas(7, 1, [0], grace_s=0)  # replica 0 goes; replica 1 (on n4) serves
    [state] = backend.expose(7, 1, [EndpointSpec(3, "port", 8080)])
    svc = service(api, 7)
    assert "dlts.io/index" not in svc["spec"]["selector"]
    n4 = next(a["address"] for a in api.store.get("nodes", "", "n4")["status"]["addresses"] if a["type"] == "InternalIP")
    assert (state.status, state.host, state.host_port) == ("ready", n4, node_ports(svc)["e3"])


def test_an_inference_port_is_pending_until_a_replica_passes_its_readiness_probe(api, backend):
    """The Service sends a replica nothing until the kubelet's probe marks it Ready, so the endpoint
    is not ``ready`` while every replica runs but none accepts connections (a model still loading)."""
    spec = replace(make_spec(7, type="inference", command="sleep infinity", nodes=("n3", "n4"), ports=(8080,)), replicas=(0, 1))
    backend.launch(spec)
    api.kubelet.tick()
    assert {p["status"]["phase"] for p in api.objects("pods")} == {"Running"}

    def ready(pod: str, status: str) -> None:  # what a kubelet's probe result does (the fake runs no probes)
        api.store.update_internal("pods", "default", pod, lambda o: [
            c.update(status=status) for c in o["status"]["conditions"] if c["type"] == "Ready"])

    ready("dlts-7-1-0", "False")
    ready("dlts-7-1-1", "False")
    [state] = backend.expose(7, 1, [EndpointSpec(3, "port", 8080)])
    assert state.status == "pending"
    assert "accept connections on port 8080 (its readiness probe)" in state.message
    # the probe succeeds on replica 1 (on n4) only: the address is the one the Service reaches
    ready("dlts-7-1-1", "True")
    [state] = backend.expose(7, 1, [EndpointSpec(3, "port", 8080)])
    n4 = next(a["address"] for a in api.store.get("nodes", "", "n4")["status"]["addresses"] if a["type"] == "InternalIP")
    assert (state.status, state.host, state.host_port) == ("ready", n4, node_ports(service(api, 7))["e3"])


def test_endpoints_that_cannot_be_exposed_fail_with_the_reason_and_are_left_out(api, running):
    states = by_id(running.expose(1, 1, [SSH, EndpointSpec(12, "jupyter", 8888), TENSORBOARD,
                                         EndpointSpec(15, "port", 6006), EndpointSpec(16, "telnet", 23)], ()))
    assert states[11].status == "failed" and "POST /api/v1/me/ssh-keys" in states[11].message
    assert states[12].status == "failed" and "needs a token" in states[12].message
    assert states[15].status == "failed" and "port 6006 is already used" in states[15].message
    assert states[16].status == "failed" and "unknown endpoint kind 'telnet'" in states[16].message
    assert states[13].status == "ready"
    assert node_ports(service(api)).keys() == {"e13"}
    assert configmap(api)["data"]["endpoints"] == "13 port 6006\n"


def test_a_refused_service_fails_its_endpoints_with_the_apis_message_without_backing_off(api, running):
    api.fail_next(1, 422, verbs={"create"}, resources={"services"})
    [state] = running.expose(1, 1, [TENSORBOARD])
    assert state.status == "failed"
    assert state.message == "Kubernetes refused Service dlts-1-1-ep: injected fault: Unprocessable Entity"
    [state] = running.expose(1, 1, [TENSORBOARD])  # no back-off: the API is up
    assert state.status == "ready"


def test_a_full_node_port_range_fails_only_the_new_endpoint(api, running):
    running.expose(1, 1, [SSH], (KEY,))
    taken = set(node_ports(service(api)).values())
    lo, hi = api.store.node_port_range
    api.store.create("services", "default", {"metadata": {"name": "hog"}, "spec": {"type": "NodePort", "ports": [
        {"name": f"p{n}", "port": n, "nodePort": n} for n in range(lo, hi + 1) if n not in taken]}})
    states = by_id(running.expose(1, 1, [SSH, TENSORBOARD], (KEY,)))
    assert states[13].status == "failed" and "failed to allocate a nodePort: range is full" in states[13].message
    assert states[11].status == "ready" and states[11].host_port in taken  # what worked keeps working
    running.nodes()  # not backing off: the allocation failure is the Service's, not the API's


def test_an_unavailable_api_is_unavailability_not_a_state(api, running):
    api.fail_next(1, 503)
    with pytest.raises(KubernetesUnavailable):
        running.expose(1, 1, [TENSORBOARD])


def test_an_attempt_with_nothing_in_the_cluster_is_pending(api, backend):
    [state] = backend.expose(5, 2, [TENSORBOARD])
    assert (state.status, state.message) == ("pending", "waiting for pod dlts-5-2-0 to exist")
    assert api.objects("services") == [] and api.objects("configmaps") == []


def test_terminate_takes_the_endpoints_down_and_forget_leaves_nothing(api, running):
    running.expose(1, 1, [SSH, TENSORBOARD], (KEY,))
    running.terminate(1, 1, grace_s=30)
    assert service(api) is None and api.objects("configmaps") == []
    [pod] = api.pods()  # still stopping within its grace period
    assert pod["metadata"]["deletionTimestamp"]
    [state] = running.expose(1, 1, [TENSORBOARD])
    assert (state.status, state.message) == ("pending", "pod dlts-1-1-0 is being deleted")
    running.forget(1, 1)
    assert api.pods() == [] and api.objects("services") == [] and api.objects("configmaps") == []
    assert running.collect_garbage(live=()) == ()


def test_garbage_collection_removes_the_endpoint_objects_of_an_orphan(api, running):
    running.expose(1, 1, [SSH], (KEY,))
    running.launch(make_spec(2, command="sleep infinity"))
    assert running.collect_garbage(live={(2, 1)}) == ((1, 1),)
    assert api.objects("services") == []
    assert api.objects("configmaps") == []  # job 2 has no endpoint, so no ConfigMap either
