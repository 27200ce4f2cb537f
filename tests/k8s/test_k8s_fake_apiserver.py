"""The fake API server behaves like a real one where the backend depends on it.

Each case goes through the official ``kubernetes`` client over HTTP, as the backend does.
"""

from __future__ import annotations

import base64
import http.client
import json

import pytest
from conftest import make_spec  # tests/k8s/conftest.py, imported at collection like the other k8s tests do
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tests.fakes.kube_apiserver import FakeKubeApiServer, parse_script


@pytest.fixture
def v1(kubeconfig):
    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    yield client.CoreV1Api(api_client)
    api_client.close()


def pod(name: str, labels: dict | None = None, node: str = "n1", command: str = "sleep 5") -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"nodeName": node, "restartPolicy": "Never",
                     "containers": [{"name": "job", "image": "busybox",
                                     "env": [{"name": "DLTS_COMMAND", "value": command}]}]}}


def status_of(exc: ApiException) -> dict:
    return json.loads(exc.body)


SELECTOR_CASES = [
    # (selector, names expected) over pods a{env=prod,tier=web}, b{env=dev}, c{} and d{env=prod,tier=db}
    ("env=prod", {"a", "d"}),
    ("env==prod", {"a", "d"}),
    ("env!=prod", {"b", "c"}),  # != also matches objects without the key
    ("env in (prod, dev)", {"a", "b", "d"}),
    ("env notin (prod)", {"b", "c"}),  # notin also matches objects without the key
    ("tier", {"a", "d"}),
    ("!tier", {"b", "c"}),
    ("env=prod,tier=web", {"a"}),
    ("env=prod,!tier", set()),
    ("env in (prod),tier notin (web)", {"d"}),
    ("", {"a", "b", "c", "d"}),
    ("env=", set()),  # empty value: only a label with the empty value would match
]


@pytest.mark.parametrize("selector,expected", SELECTOR_CASES, ids=[c[0] or "<empty>" for c in SELECTOR_CASES])
def test_label_selectors_match_like_the_real_server(v1, selector, expected):
    for name, labels in (("a", {"env": "prod", "tier": "web"}), ("b", {"env": "dev"}), ("c", {}),
                         ("d", {"env": "prod", "tier": "db"})):
        v1.create_namespaced_pod("default", pod(name, labels))
    found = {p.metadata.name for p in v1.list_namespaced_pod("default", label_selector=selector).items}
    assert found == expected


@pytest.mark.parametrize("bad", ["env in (prod", "env=prod,", "=x", "a b", "env=has space", "bad key!=1"])
def test_malformed_selectors_are_400_bad_request(v1, bad):
    with pytest.raises(ApiException) as exc:
        v1.list_namespaced_pod("default", label_selector=bad)
    assert exc.value.status == 400
    assert status_of(exc.value)["kind"] == "Status"


def test_field_selector_by_node(v1):
    v1.create_namespaced_pod("default", pod("a", node="n1"))
    v1.create_namespaced_pod("default", pod("b", node="n2"))
    assert [p.metadata.name for p in v1.list_namespaced_pod("default", field_selector="spec.nodeName=n2").items] == ["b"]


def test_create_twice_is_409_already_exists_with_a_status_object(v1):
    v1.create_namespaced_pod("default", pod("a"))
    with pytest.raises(ApiException) as exc:
        v1.create_namespaced_pod("default", pod("a"))
    body = status_of(exc.value)
    assert (exc.value.status, body["reason"], body["details"]["name"]) == (409, "AlreadyExists", "a")


def test_missing_objects_and_namespaces_are_404(v1):
    with pytest.raises(ApiException) as exc:
        v1.read_namespaced_secret("nope", "default")
    assert (exc.value.status, status_of(exc.value)["reason"]) == (404, "NotFound")
    with pytest.raises(ApiException) as exc:
        v1.create_namespaced_pod("no-such-ns", pod("a"))
    assert exc.value.status == 404


def test_stale_resource_version_is_409_conflict(v1):
    first = v1.read_node("n1")
    v1.patch_node("n1", {"metadata": {"labels": {"x": "1"}}}, _content_type="application/merge-patch+json")
    with pytest.raises(ApiException) as exc:
        v1.patch_node("n1", {"metadata": {"resourceVersion": first.metadata.resource_version},
                             "spec": {"unschedulable": True}},
                      _content_type="application/strategic-merge-patch+json")
    assert (exc.value.status, status_of(exc.value)["reason"]) == (409, "Conflict")
    assert not v1.read_node("n1").spec.unschedulable
    fresh = v1.read_node("n1")
    fresh.spec.unschedulable = True
    assert v1.replace_node("n1", fresh).spec.unschedulable is True
    with pytest.raises(ApiException) as exc:
        v1.replace_node("n1", fresh)  # same (now stale) resourceVersion again
    assert exc.value.status == 409


def test_invalid_names_and_labels_are_422(v1):
    with pytest.raises(ApiException) as exc:
        v1.create_namespaced_pod("default", pod("Bad_Name"))
    assert (exc.value.status, status_of(exc.value)["reason"]) == (422, "Invalid")
    with pytest.raises(ApiException) as exc:
        v1.create_namespaced_pod("default", pod("ok", labels={"user": "alice@example.com"}))
    assert exc.value.status == 422


def test_requests_without_the_token_are_401(api):
    cfg = client.Configuration()
    cfg.host = api.url
    with client.ApiClient(cfg) as c, pytest.raises(ApiException) as exc:
        client.CoreV1Api(c).list_node()
    assert exc.value.status == 401


def test_kubelet_runs_the_script_and_records_the_exit_code(api, v1):
    v1.create_namespaced_pod("default", pod("a", command="echo hi; sleep 5; exit 3"))
    api.kubelet.tick()
    assert v1.read_namespaced_pod("a", "default").status.phase == "Running"
    api.run_until_idle(4)
    assert v1.read_namespaced_pod("a", "default").status.phase == "Running"
    api.run_until_idle(2)
    status = v1.read_namespaced_pod("a", "default").status
    assert status.phase == "Failed"
    assert status.container_statuses[0].state.terminated.exit_code == 3
    reasons = {e.reason for e in v1.list_namespaced_event("default").items}
    assert "Started" in reasons


def test_graceful_delete_marks_then_kubelet_removes(api, v1):
    v1.create_namespaced_pod("default", pod("a", command="sleep infinity"))
    api.kubelet.tick()
    marked = v1.delete_namespaced_pod("a", "default", grace_period_seconds=30)
    assert marked.metadata.deletion_timestamp is not None
    assert v1.read_namespaced_pod("a", "default").metadata.deletion_timestamp is not None
    api.kubelet.tick()
    with pytest.raises(ApiException) as exc:
        v1.read_namespaced_pod("a", "default")
    assert exc.value.status == 404


def test_pods_on_a_not_ready_node_freeze_and_cannot_finish_deleting(api, v1):
    v1.create_namespaced_pod("default", pod("a", command="sleep 1"))
    api.kubelet.tick()
    api.set_node_ready("n1", False)
    api.run_until_idle(5)
    current = v1.read_namespaced_pod("a", "default")
    assert current.status.phase == "Running"
    assert {c.type: c.status for c in current.status.conditions}["Ready"] == "False"
    v1.delete_namespaced_pod("a", "default", grace_period_seconds=30)
    api.run_until_idle(5)
    assert v1.read_namespaced_pod("a", "default").metadata.deletion_timestamp is not None
    v1.delete_namespaced_pod("a", "default", grace_period_seconds=0)  # force
    assert api.pods() == []


@pytest.mark.parametrize("script,duration,code", [
    ("sleep 5; exit 3", 5.0, 3), ("python train.py", 0.0, 0), ("sleep 1 && false", 1.0, 1),
    ("sleep 2\nsleep 0.5", 2.5, 0), ("exit 300", 0.0, 44), ("sleep infinity", float("inf"), 0),
])
def test_script_convention(script, duration, code):
    parsed = parse_script(script)
    assert (parsed.duration_s, parsed.exit_code) == (duration, code)


def test_injected_faults_are_real_status_errors(api, v1):
    api.fail_next(1, 503)
    with pytest.raises(ApiException) as exc:
        v1.list_node()
    assert exc.value.status == 503 and status_of(exc.value)["kind"] == "Status"
    assert len(v1.list_node().items) == 4


# -- services and their nodePorts, configmaps, node addresses ---------------------------------------


def node_port_service(name: str, *ports: tuple[str, int], **extra) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"type": "NodePort", "selector": {"app": name},
                     "ports": [{"name": n, "port": p, "targetPort": p, **extra} for n, p in ports]}}


def ports_of(svc) -> dict[str, int]:
    return {p.name: p.node_port for p in svc.spec.ports}


def test_node_ports_are_allocated_unique_in_the_range(v1):
    seen: list[int] = []
    for i in range(20):
        svc = v1.create_namespaced_service("default", node_port_service(f"s{i}", ("a", 80), ("b", 443)))
        seen += ports_of(svc).values()
    assert len(set(seen)) == 40 and all(30000 <= n <= 32767 for n in seen)
    assert v1.create_namespaced_service("default", {"metadata": {"name": "plain"}, "spec": {
        "ports": [{"port": 80}]}}).spec.ports[0].node_port is None  # ClusterIP services get none


def test_an_update_keeps_the_node_port_of_each_port_name_and_frees_removed_ones(v1):
    svc = v1.create_namespaced_service("default", node_port_service("s", ("ssh", 22), ("web", 80)))
    first = ports_of(svc)
    # merge patch replaces the list; ports without nodePort keep their namesake's
    patched = v1.patch_namespaced_service("s", "default", {"spec": {"ports": [
        {"name": "web", "port": 80, "targetPort": 80}, {"name": "new", "port": 9000, "targetPort": 9000}]}},
        _content_type="application/merge-patch+json")
    now = ports_of(patched)
    assert now["web"] == first["web"] and set(now) == {"web", "new"}
    assert patched.spec.cluster_ip == svc.spec.cluster_ip
    # the freed nodePort can be taken explicitly by another service
    other = v1.create_namespaced_service("default", node_port_service("t", ("x", 22), node_port=first["ssh"]))
    assert ports_of(other) == {"x": first["ssh"]}
    # replace (PUT) without nodePorts: kept by name too
    body = v1.read_namespaced_service("s", "default")
    for port in body.spec.ports:
        port.node_port = None
    assert ports_of(v1.replace_namespaced_service("s", "default", body)) == now


def test_a_strategic_merge_patch_merges_service_ports_by_port_number(v1):
    v1.create_namespaced_service("default", node_port_service("s", ("ssh", 22)))
    patched = v1.patch_namespaced_service("s", "default", {"spec": {"ports": [{"name": "web", "port": 80}]}})
    assert sorted(p.port for p in patched.spec.ports) == [22, 80]


@pytest.mark.parametrize("ports,extra,message", [
    ([("a", 80), ("b", 80)], {}, "spec.ports[1]: Duplicate value"),
    ([("a", 80), ("a", 81)], {}, "spec.ports[1].name: Duplicate value"),
    ([("", 80), ("b", 81)], {}, "spec.ports[0].name: Required value"),
    ([("Bad", 80)], {}, "spec.ports[0].name: Invalid value"),
    ([("a", 70000)], {}, "spec.ports[0].port: Invalid value"),
    ([("a", 80)], {"node_port": 80}, "provided port is not in the valid range. The range of valid ports is 30000-32767"),
    ([], {}, "spec.ports: Required value"),
])
def test_invalid_service_ports_are_422_with_the_field(v1, ports, extra, message):
    body = node_port_service("s", *ports, **({"nodePort": extra["node_port"]} if extra else {}))
    with pytest.raises(ApiException) as exc:
        v1.create_namespaced_service("default", body)
    assert exc.value.status == 422 and message in status_of(exc.value)["message"]


def test_a_node_port_in_use_is_422_and_a_full_range_is_500(tmp_path):
    from tests.fakes.kube_apiserver import FakeKubeApiServer

    with FakeKubeApiServer(node_port_range=(30000, 30002)) as small:
        api_client = config.new_client_from_config(config_file=str(small.write_kubeconfig(tmp_path / "kc")))
        v1 = client.CoreV1Api(api_client)
        v1.create_namespaced_service("default", node_port_service("a", ("x", 1), ("y", 2)))
        taken = ports_of(v1.read_namespaced_service("a", "default"))
        with pytest.raises(ApiException) as exc:
            v1.create_namespaced_service("default", node_port_service("b", ("x", 1), nodePort=taken["x"]))
        assert exc.value.status == 422 and "provided port is already allocated" in status_of(exc.value)["message"]
        v1.create_namespaced_service("default", node_port_service("c", ("x", 1)))  # the last free one
        with pytest.raises(ApiException) as exc:
            v1.create_namespaced_service("default", node_port_service("d", ("x", 1)))
        assert exc.value.status == 500
        assert "failed to allocate a nodePort: range is full" in status_of(exc.value)["message"]
        v1.delete_namespaced_service("a", "default")  # deleting frees its ports
        assert len(ports_of(v1.create_namespaced_service("default", node_port_service("d", ("x", 1), ("y", 2))))) == 2
        api_client.close()


def test_configmaps_crud_by_label_and_validation(v1):
    def cm(name, labels, data):
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}, "data": data}

    v1.create_namespaced_config_map("default", cm("a", {"job": "1"}, {"endpoints": "", "supervisor.sh": "#!/bin/sh\n"}))
    v1.create_namespaced_config_map("default", cm("b", {"job": "2"}, {}))
    assert [c.metadata.name for c in v1.list_namespaced_config_map("default", label_selector="job=1").items] == ["a"]
    patched = v1.patch_namespaced_config_map("a", "default", {"data": {"endpoints": "1 ssh 22\n"}},
                                             _content_type="application/merge-patch+json")
    assert patched.data == {"endpoints": "1 ssh 22\n", "supervisor.sh": "#!/bin/sh\n"}
    with pytest.raises(ApiException) as exc:
        v1.create_namespaced_config_map("default", cm("c", {}, {"bad key": "x"}))
    assert exc.value.status == 422 and "a valid config key" in status_of(exc.value)["message"]
    with pytest.raises(ApiException) as exc:
        v1.create_namespaced_config_map("default", cm("c", {}, {"big": "x" * (1024 * 1024)}))
    assert exc.value.status == 422 and "must have at most 1048576 bytes" in status_of(exc.value)["message"]
    v1.delete_collection_namespaced_config_map("default", label_selector="job=1")
    assert [c.metadata.name for c in v1.list_namespaced_config_map("default").items] == ["b"]
    with pytest.raises(ApiException) as exc:
        v1.read_namespaced_config_map("a", "default")
    assert exc.value.status == 404


def test_nodes_report_their_addresses_and_pods_their_host_ip(api, v1):
    api.add_node("x1", internal_ip="10.1.2.3")
    assert [(a.type, a.address) for a in v1.read_node("x1").status.addresses] == [
        ("InternalIP", "10.1.2.3"), ("Hostname", "x1")]
    v1.create_namespaced_pod("default", pod("p", node="x1"))
    api.kubelet.tick()
    assert v1.read_namespaced_pod("p", "default").status.host_ip == "10.1.2.3"
    ips = {a.address for n in v1.list_node().items for a in n.status.addresses if a.type == "InternalIP"}
    assert len(ips) == len(v1.list_node().items)  # every node its own address


# -- paging ---------------------------------------------------------------------------------------


def test_lists_page_with_limit_and_continue(v1):
    for i in range(7):
        v1.create_namespaced_config_map("default", {"metadata": {"name": f"c{i}", "labels": {"page": "yes"}}})
    first = v1.list_namespaced_config_map("default", label_selector="page=yes", limit=3)
    assert [c.metadata.name for c in first.items] == ["c0", "c1", "c2"]
    assert first.metadata.remaining_item_count == 4 and first.metadata._continue
    v1.create_namespaced_config_map("default", {"metadata": {"name": "c00", "labels": {"page": "yes"}}})
    second = v1.list_namespaced_config_map("default", label_selector="page=yes", limit=3,
                                           _continue=first.metadata._continue)
    third = v1.list_namespaced_config_map("default", label_selector="page=yes", limit=3,
                                          _continue=second.metadata._continue)
    # later pages come from the first page's snapshot: an object created meanwhile is not in them
    assert [c.metadata.name for c in second.items + third.items] == ["c3", "c4", "c5", "c6"]
    assert not third.metadata._continue and third.metadata.resource_version == first.metadata.resource_version


def test_a_continue_token_of_a_compacted_revision_is_410_expired(api, v1):
    for i in range(3):
        v1.create_namespaced_secret("default", {"metadata": {"name": f"s{i}"}})
    first = v1.list_namespaced_secret("default", limit=1)
    api.store.compact()
    with pytest.raises(ApiException) as exc:
        v1.list_namespaced_secret("default", limit=1, _continue=first.metadata._continue)
    status = status_of(exc.value)
    assert (exc.value.status, status["kind"], status["reason"], status["code"]) == (410, "Status", "Expired", 410)
    assert "too old to display a consistent list result" in status["message"]
    with pytest.raises(ApiException) as bad:
        v1.list_namespaced_secret("default", limit=1, _continue="not-a-token")
    assert bad.value.status == 400


# -- NetworkPolicies and pull secrets -------------------------------------------------------------


def network_policy(name: str, labels: dict) -> dict:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "labels": labels},
            "spec": {"podSelector": {"matchLabels": {"job": name}}, "policyTypes": ["Ingress", "Egress"],
                     "ingress": [{"from": [{"podSelector": {"matchLabels": {"job": name}}}]}],
                     "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
                                 "ports": [{"protocol": "UDP", "port": 53}]}]}}


def test_network_policies_crud_by_label(kubeconfig):
    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    net = client.NetworkingV1Api(api_client)
    net.create_namespaced_network_policy("default", network_policy("a", {"job": "1"}))
    net.create_namespaced_network_policy("default", network_policy("b", {"job": "2"}))
    with pytest.raises(ApiException) as dup:
        net.create_namespaced_network_policy("default", network_policy("a", {"job": "1"}))
    assert dup.value.status == 409 and status_of(dup.value)["reason"] == "AlreadyExists"
    got = net.read_namespaced_network_policy("a", "default")
    assert got.api_version == "networking.k8s.io/v1" and got.spec.egress[0].to[0].ip_block.cidr == "10.0.0.0/8"
    assert [p.metadata.name for p in net.list_namespaced_network_policy("default", label_selector="job=2").items] == ["b"]
    bad = network_policy("c", {})
    bad["spec"]["egress"][0]["to"][0]["ipBlock"]["cidr"] = "10.0.0.0/33"
    with pytest.raises(ApiException) as invalid:
        net.create_namespaced_network_policy("default", bad)
    assert invalid.value.status == 422 and "ipBlock.cidr" in status_of(invalid.value)["message"]
    net.delete_collection_namespaced_network_policy("default", label_selector="job=1")
    assert [p.metadata.name for p in net.list_namespaced_network_policy("default").items] == ["b"]
    api_client.close()


def test_dockerconfigjson_secrets_must_carry_their_config(v1):
    good = base64.b64encode(json.dumps({"auths": {"r.example.com": {"auth": "eDp5"}}}).encode()).decode()
    v1.create_namespaced_secret("default", {"metadata": {"name": "pull"}, "type": "kubernetes.io/dockerconfigjson",
                                            "data": {".dockerconfigjson": good}})
    with pytest.raises(ApiException) as exc:
        v1.create_namespaced_secret("default", {"metadata": {"name": "bad"}, "type": "kubernetes.io/dockerconfigjson",
                                                "data": {"other": good}})
    assert exc.value.status == 422 and "data[.dockerconfigjson]: Required value" in status_of(exc.value)["message"]


# -- the scheduler --------------------------------------------------------------------------------


def affinity_pod(name: str, node: str, *, gpus: int = 1, image: str = "busybox:1.36.1", **spec) -> dict:
    body = pod(name, command="sleep 100")
    del body["spec"]["nodeName"]
    body["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
    body["spec"]["containers"][0].update(image=image, resources={
        "requests": {"nvidia.com/gpu": str(gpus), "cpu": "8", "memory": "64Gi", "ephemeral-storage": "10Gi"},
        "limits": {"nvidia.com/gpu": str(gpus), "cpu": "8", "memory": "64Gi", "ephemeral-storage": "10Gi"}})
    body["spec"].update(spec)
    return body


def scheduled(v1, name: str) -> dict:
    p = v1.read_namespaced_pod(name, "default")
    cond = next(c for c in p.status.conditions if c.type == "PodScheduled")
    return {"node": p.spec.node_name, "status": cond.status, "reason": cond.reason, "message": cond.message}


def test_the_scheduler_binds_the_pod_to_its_affinity_node(api, v1):
    v1.create_namespaced_pod("default", affinity_pod("a", "n2", gpus=8))
    api.kubelet.tick()
    assert scheduled(v1, "a")["node"] == "n2" and scheduled(v1, "a")["status"] == "True"
    assert v1.read_namespaced_pod("a", "default").status.phase == "Running"
    assert "Scheduled" in {e.reason for e in v1.list_namespaced_event("default").items}


def test_more_gpus_than_the_node_has_stays_pending_with_the_schedulers_message(api, v1):
    v1.create_namespaced_pod("default", affinity_pod("a", "n1", gpus=6))
    v1.create_namespaced_pod("default", affinity_pod("b", "n1", gpus=4, preemptionPolicy="Never"))
    api.kubelet.tick()
    assert scheduled(v1, "a")["node"] == "n1"
    seen = scheduled(v1, "b")
    assert (seen["node"], seen["status"], seen["reason"]) == (None, "False", "Unschedulable")
    assert seen["message"] == ("0/4 nodes are available: 1 Insufficient nvidia.com/gpu, 3 node(s) didn't match "
                               "Pod's node affinity/selector. preemption: not eligible due to preemptionPolicy=Never.")
    assert v1.read_namespaced_pod("b", "default").status.phase == "Pending"
    v1.delete_namespaced_pod("a", "default", grace_period_seconds=0)
    api.kubelet.tick()  # the scheduler retries: room now
    assert scheduled(v1, "b")["node"] == "n1"


def test_finished_pods_free_their_resources(api, v1):
    first = affinity_pod("a", "n1", gpus=8)
    first["spec"]["containers"][0]["env"] = [{"name": "DLTS_COMMAND", "value": "exit 0"}]
    v1.create_namespaced_pod("default", first)
    api.kubelet.tick()
    assert v1.read_namespaced_pod("a", "default").status.phase == "Succeeded"
    v1.create_namespaced_pod("default", affinity_pod("b", "n1", gpus=8))
    api.kubelet.tick()
    assert scheduled(v1, "b")["node"] == "n1"


@pytest.mark.parametrize("setup,reason", [
    (lambda api: api.store.patch("nodes", "", "n1", {"spec": {"unschedulable": True}}, "application/merge-patch+json"),
     "1 node(s) were unschedulable"),
    (lambda api: api.set_node_ready("n1", False), "1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }"),
    (lambda api: None, "1 Insufficient ephemeral-storage"),
], ids=["cordoned", "not ready", "ephemeral storage"])
def test_a_node_that_cannot_take_the_pod_is_named_in_the_message(api, v1, setup, reason):
    setup(api)
    body = affinity_pod("a", "n1")
    if "ephemeral" in reason:
        for kind in ("requests", "limits"):
            body["spec"]["containers"][0]["resources"][kind]["ephemeral-storage"] = "5000Gi"
    v1.create_namespaced_pod("default", body)
    api.kubelet.tick()
    seen = scheduled(v1, "a")
    assert seen["node"] is None and reason in seen["message"]
    assert seen["message"].startswith("0/4 nodes are available: ")


# -- init containers, images, security context, logs ----------------------------------------------


def runtime_pod(name: str, image: str, init_command: str, *, command: list[str] | None = None,
                init_image: str = "docker.io/library/busybox:1.36.1", script: str = "echo hello; sleep 2; echo bye",
                security: dict | None = None) -> dict:
    return {"metadata": {"name": name}, "spec": {
        "nodeName": "n1", "restartPolicy": "Never", "securityContext": security or {},
        "volumes": [{"name": "dlts-runtime", "emptyDir": {}}],
        "initContainers": [{"name": "dlts-init", "image": init_image, "command": ["/bin/sh", "-c", init_command],
                            "volumeMounts": [{"name": "dlts-runtime", "mountPath": "/dlts-runtime"}]}],
        "containers": [{"name": "job", "image": image, "command": command or ["/bin/sh", "-c", "entrypoint"],
                        "env": [{"name": "DLTS_COMMAND", "value": script}],
                        "volumeMounts": [{"name": "dlts-runtime", "mountPath": "/dlts-runtime"}]}]}}


COPY_BUSYBOX = "cp /bin/busybox /dlts-runtime/busybox && chmod 0755 /dlts-runtime/busybox"


def test_init_runs_first_and_the_job_starts_from_what_it_copied(api, v1):
    v1.create_namespaced_pod("default", runtime_pod("a", "gcr.io/distroless/base-debian12", COPY_BUSYBOX,
                                                    command=["/dlts-runtime/busybox", "sh", "-c", "entrypoint"]))
    api.kubelet.tick()
    status = v1.read_namespaced_pod("a", "default").status
    assert status.init_container_statuses[0].state.terminated.exit_code == 0
    assert status.phase == "Running"


def test_an_init_command_using_a_file_the_image_lacks_fails_the_pod_init_error(api, v1):
    v1.create_namespaced_pod("default", runtime_pod("a", "python:3.11", "cp /usr/bin/tini-static /dlts-runtime/tini"))
    api.kubelet.tick()
    status = v1.read_namespaced_pod("a", "default").status
    assert status.phase == "Failed"
    init = status.init_container_statuses[0].state.terminated
    assert (init.exit_code, init.reason) == (1, "Error")
    assert status.container_statuses[0].state.waiting.reason == "PodInitializing"  # the job never started
    log = v1.read_namespaced_pod_log("a", "default", container="dlts-init")
    assert "can't stat '/usr/bin/tini-static'" in log


@pytest.mark.parametrize("init_image", ["debian:12", "python:3.11", "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime"])
def test_images_with_a_shell_have_no_busybox_to_copy(api, v1, init_image):
    v1.create_namespaced_pod("default", runtime_pod("a", "python:3.11", COPY_BUSYBOX, init_image=init_image))
    api.kubelet.tick()
    assert v1.read_namespaced_pod("a", "default").status.phase == "Failed"


def test_a_job_image_without_the_shell_it_is_started_with_fails_to_start(api, v1):
    v1.create_namespaced_pod("default", runtime_pod("a", "gcr.io/distroless/static-debian12", COPY_BUSYBOX))
    api.kubelet.tick()
    status = v1.read_namespaced_pod("a", "default").status
    term = status.container_statuses[0].state.terminated
    assert status.phase == "Failed" and (term.exit_code, term.reason) == (128, "StartError")
    assert 'exec: "/bin/sh": stat /bin/sh: no such file or directory' in term.message


def test_an_unknown_image_is_err_image_pull_then_back_off(api, v1):
    v1.create_namespaced_pod("default", runtime_pod("a", "registry.example.com/nosuch:1", COPY_BUSYBOX))
    api.kubelet.tick()
    waiting = v1.read_namespaced_pod("a", "default").status.container_statuses[0].state.waiting
    assert waiting.reason == "ErrImagePull" and "registry.example.com/nosuch:1" in waiting.message
    api.run_until_idle(30)
    status = v1.read_namespaced_pod("a", "default").status
    assert status.phase == "Pending"
    assert status.container_statuses[0].state.waiting.reason == "ImagePullBackOff"
    with pytest.raises(ApiException) as exc:
        v1.read_namespaced_pod_log("a", "default", container="job")
    assert exc.value.status == 400 and "is waiting to start" in status_of(exc.value)["message"]


def test_a_private_image_needs_its_pull_secret(api, v1):
    api.images.add("registry.example.com/team/train:*", {"/bin/sh"}, registry_auth="registry.example.com")
    v1.create_namespaced_pod("default", runtime_pod("a", "registry.example.com/team/train:1", COPY_BUSYBOX))
    auth = base64.b64encode(json.dumps({"auths": {"registry.example.com": {"auth": "YTpi"}}}).encode()).decode()
    v1.create_namespaced_secret("default", {"metadata": {"name": "pull"}, "type": "kubernetes.io/dockerconfigjson",
                                            "data": {".dockerconfigjson": auth}})
    body = runtime_pod("b", "registry.example.com/team/train:1", COPY_BUSYBOX)
    body["spec"]["imagePullSecrets"] = [{"name": "pull"}]
    v1.create_namespaced_pod("default", body)
    api.kubelet.tick()
    assert "authorization failed" in v1.read_namespaced_pod("a", "default").status.container_statuses[0].state.waiting.message
    assert v1.read_namespaced_pod("b", "default").status.phase == "Running"


@pytest.mark.parametrize("security,expected", [
    ({"runAsNonRoot": True}, "container has runAsNonRoot and image will run as root"),
    ({"runAsNonRoot": True, "runAsUser": 0}, "container's runAsUser breaks non-root policy"),
    ({"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000}, None),
], ids=["no uid", "uid 0", "uid 1000"])
def test_run_as_non_root_is_enforced_at_container_creation(api, v1, security, expected):
    v1.create_namespaced_pod("default", runtime_pod("a", "python:3.11", COPY_BUSYBOX, security=security))
    api.kubelet.tick()
    status = v1.read_namespaced_pod("a", "default").status
    if expected is None:
        assert status.phase == "Running"
        return
    # the init container runs as the pod says too: it is the first to be refused
    waiting = status.init_container_statuses[0].state.waiting
    assert status.phase == "Pending" and waiting.reason == "CreateContainerConfigError"
    assert waiting.message.startswith(expected) and 'container: dlts-init' in waiting.message


def test_the_log_endpoint_serves_what_the_container_printed(api, v1):
    v1.create_namespaced_pod("default", runtime_pod("a", "python:3.11", COPY_BUSYBOX))
    api.kubelet.tick()
    api.clock.advance(0.25)
    api.print_output("a", "from the test\n")
    assert v1.read_namespaced_pod_log("a", "default", container="job") == "hello\nfrom the test\n"
    api.run_until_idle(3)
    stamped = v1.read_namespaced_pod_log("a", "default", container="job", timestamps=True)
    lines = stamped.splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == ["hello", "from the test", "bye"]
    assert lines[0].split(" ")[0] == "2027-01-15T08:00:00Z" and lines[1].split(" ")[0] == "2027-01-15T08:00:00.25Z"
    assert v1.read_namespaced_pod_log("a", "default", container="job", limit_bytes=8) == "hello\nfr"
    with pytest.raises(ApiException) as exc:
        v1.read_namespaced_pod_log("a", "default", container="nope")
    assert exc.value.status == 400 and status_of(exc.value)["message"] == "container nope is not valid for pod a"


def test_since_time_reaches_the_kubelet_in_whole_seconds(api, v1, kubeconfig):
    from dlts.backends.k8s_settings import KubernetesSettings
    from dlts.backends.kubernetes.api import KubernetesApi

    v1.create_namespaced_pod("default", runtime_pod("a", "python:3.11", COPY_BUSYBOX, script="sleep infinity"))
    api.kubelet.tick()
    api.clock.advance(1.5)
    api.print_output("a", "one")
    api.clock.advance(1.0)
    api.print_output("a", "two")
    raw = KubernetesApi(KubernetesSettings(), v1.api_client, api.clock)
    since = raw.pod_log("a", "default", container="job", since_time="2027-01-15T08:00:02.9Z", limit_bytes=1000)
    assert [line.split(b" ", 1)[1] for line in since.splitlines()] == [b"two"]
    since = raw.pod_log("a", "default", container="job", since_time="2027-01-15T08:00:01.9Z", limit_bytes=1000)
    assert [line.split(b" ", 1)[1] for line in since.splitlines()] == [b"one", b"two"]  # 01.9 -> 01


# -- the pods DLTS renders, run by the fake kubelet's shell ------------------------------------------


def rendered_pod(image: str = "python:3.11", **settings) -> dict:
    """The pod the renderer makes for a job (owner alice, uid 1000) on n1, as the API receives it."""
    from dlts.backends.k8s_render import ManifestRenderer
    from dlts.backends.k8s_settings import KubernetesSettings

    renderer = ManifestRenderer(KubernetesSettings(namespace="default", **settings))
    return json.loads(json.dumps(renderer.render(make_spec(1, image=image, command="echo hi; sleep 5")).pods[0]))


def init_states(v1, name: str) -> list:
    return [s.state for s in v1.read_namespaced_pod(name, "default").status.init_container_statuses]


@pytest.mark.parametrize("image", ["python:3.11", "debian:12", "busybox:1.36.1", "gcr.io/distroless/base-debian12"])
def test_a_rendered_pod_starts_on_any_known_image(api, v1, image):
    v1.create_namespaced_pod("default", rendered_pod(image))
    api.kubelet.tick()
    current = v1.read_namespaced_pod("dlts-1-1-0", "default")
    assert [s.state.terminated.exit_code for s in current.status.init_container_statuses] == [0, 0]
    assert current.status.phase == "Running" and current.spec.node_name == "n1"
    uid = current.metadata.uid
    # dlts-init copied busybox; dlts-identity wrote passwd and group (the job container mounts them)
    assert {"busybox", "passwd", "group"} <= api.kubelet._runs[uid].volumes["dlts-runtime"]
    assert "passwd.new" not in api.kubelet._runs[uid].volumes["dlts-runtime"]  # moved into place
    api.run_until_idle(6)
    assert v1.read_namespaced_pod("dlts-1-1-0", "default").status.phase == "Succeeded"
    assert v1.read_namespaced_pod_log("dlts-1-1-0", "default", container="job") == "hi\n"


def test_an_init_image_without_busybox_fails_the_pod(api, v1):
    v1.create_namespaced_pod("default", rendered_pod(init_image="python:3.11"))
    api.kubelet.tick()
    status = v1.read_namespaced_pod("dlts-1-1-0", "default").status
    term = status.init_container_statuses[0].state.terminated
    assert status.phase == "Failed" and (term.exit_code, term.reason) == (128, "StartError")
    assert 'exec: "/bin/busybox": stat /bin/busybox: no such file or directory' in term.message


def test_without_the_copied_busybox_the_identity_init_cannot_start(api, v1):
    body = rendered_pod()
    body["spec"]["initContainers"][0]["command"] = ["/bin/busybox", "true"]  # copies nothing
    v1.create_namespaced_pod("default", body)
    api.kubelet.tick()
    status = v1.read_namespaced_pod("dlts-1-1-0", "default").status
    term = status.init_container_statuses[1].state.terminated
    assert status.phase == "Failed" and term.reason == "StartError"
    assert "stat /dlts-runtime/busybox: no such file or directory" in term.message


def test_the_identity_script_needs_its_environment(api, v1):
    body = rendered_pod()
    identity = body["spec"]["initContainers"][1]
    identity["env"] = [e for e in identity["env"] if e["name"] != "DLTS_UID"]
    v1.create_namespaced_pod("default", body)
    api.kubelet.tick()
    term = init_states(v1, "dlts-1-1-0")[1].terminated
    assert (term.exit_code, term.reason) == (2, "Error")  # set -u
    assert "DLTS_UID: parameter not set" in v1.read_namespaced_pod_log("dlts-1-1-0", "default", container="dlts-identity")


def test_a_read_only_runtime_volume_cannot_take_the_identity_files(api, v1):
    body = rendered_pod()
    body["spec"]["initContainers"][1]["volumeMounts"][0]["readOnly"] = True
    v1.create_namespaced_pod("default", body)
    api.kubelet.tick()
    assert init_states(v1, "dlts-1-1-0")[1].terminated.exit_code != 0
    log = v1.read_namespaced_pod_log("dlts-1-1-0", "default", container="dlts-identity")
    assert "can't create '/dlts-runtime/passwd.new': Read-only file system" in log


def test_a_passwd_subpath_nobody_wrote_cannot_be_mounted_on_the_images_file(api, v1):
    body = rendered_pod()
    del body["spec"]["initContainers"][1]  # no dlts-identity: the subPath does not exist
    v1.create_namespaced_pod("default", body)
    api.kubelet.tick()
    status = v1.read_namespaced_pod("dlts-1-1-0", "default").status
    term = status.container_statuses[0].state.terminated
    assert status.phase == "Failed" and term.reason == "StartError"
    assert 'to rootfs at "/etc/passwd"' in term.message and "not a directory" in term.message


def files(*paths: str, dirs: tuple[str, ...] = (), read_only: tuple[str, ...] = ()):
    from tests.fakes.kube_apiserver import FileView

    class View(FileView):
        def exists(self, path: str) -> bool:
            return path in paths or path in dirs

        def is_dir(self, path: str) -> bool:
            return path in dirs

        def writable(self, path: str) -> bool:
            return not any(path.startswith(d + "/") for d in read_only)

    return View()


@pytest.mark.parametrize("script,code,output", [
    ("/bin/busybox nosuch x", 127, ["nosuch: applet not found"]),
    ("/bin/busybox echo hi", 0, ["hi"]),
    ("awk '{print}' /etc/passwd", 127, ["sh: awk: not found"]),  # not on PATH: only busybox has it
    ("/bin/busybox awk -F: '$1 != n; {x = 1}' /etc/shadow", 2, ["awk: cannot open /etc/shadow (No such file or directory)"]),
    ('if [ -x /bin/bash ]; then echo bash; elif [ -x /bin/sh ]; then echo sh; else echo none; fi', 0, ["sh"]),
    ("x=${UNSET:-dflt}; y=${X}; echo \"$x\" $y '$x'", 0, ["dflt from-env $x"]),
    ("for d in a b; do echo $d; done", 0, ["a", "b"]),
    ("set -e; false; echo not reached", 1, []),
    ("set -e; false || echo handled; ! false; echo on", 0, ["handled", "on"]),
    ("set -u; echo $NOPE", 2, ["sh: NOPE: parameter not set"]),
    ("umask 022; export A=1; : ; true && echo ok", 0, ["ok"]),
    ("echo x >/rt/f; /bin/busybox mv /rt/f /rt/g; [ -e /rt/f ] || echo moved", 0, ["moved"]),
    ("echo x >/ro/f", 1, ["sh: can't create '/ro/f': Read-only file system"]),
    ("cat </nope", 1, ["sh: can't open '/nope': No such file or directory"]),
    ("if true; then echo unterminated", 2, ["sh: syntax error: unexpected end of file (expecting 'fi')"]),
])
def test_the_shell_of_init_containers(script, code, output):
    view = files("/bin/busybox", "/bin/sh", "/bin/cat", "/etc/passwd", dirs=("/rt", "/ro"), read_only=("/ro",))
    parsed = parse_script(script, view, {"X": "from-env"})
    assert (parsed.exit_code, [line for _, line in parsed.output]) == (code, output)


def test_what_a_script_leaves_behind_is_created_minus_removed():
    parsed = parse_script('rt=/rt; "$rt/../bin/busybox" true; printf "%s\\n" a >"$rt/p.new"; '
                          "/bin/busybox mv $rt/p.new $rt/p; /bin/busybox cp /bin/busybox $rt/",
                          files("/bin/busybox", "/rt/../bin/busybox", dirs=("/rt",)))
    assert parsed.exit_code == 0
    assert set(parsed.created) == {"/rt/p", "/rt/busybox"} and "/rt/p.new" in parsed.removed


# -- content negotiation, versions and the kubelet's sysctl admission --------------------------------


def raw_get(api, path: str, accept: str | None) -> tuple[int, str, bytes]:
    """GET ``path`` with this ``Accept`` header (None: none at all), as a bare HTTP client sends it."""
    host, port = api.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        headers = {"Authorization": f"Bearer {api.token}"} | ({"Accept": accept} if accept is not None else {})
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read()
    finally:
        conn.close()


@pytest.mark.parametrize("accept", [None, "application/json", "*/*", "text/plain, */*", "application/*",
                                    "application/yaml;q=0.9", "text/plain;q=0.5, application/vnd.kubernetes.protobuf"])
def test_the_log_endpoint_sends_plain_text_to_an_acceptable_accept_header(api, v1, accept):
    v1.create_namespaced_pod("default", pod("a", command="echo hi; sleep 5"))
    api.kubelet.tick()
    assert raw_get(api, "/api/v1/namespaces/default/pods/a/log", accept) == (200, "text/plain", b"hi\n")


@pytest.mark.parametrize("accept", ["text/plain", "text/plain;charset=utf-8", "text/*", "application/octet-stream"])
def test_the_log_endpoint_is_406_not_acceptable_for_text_plain_alone(api, v1, accept):
    v1.create_namespaced_pod("default", pod("a", command="echo hi; sleep 5"))
    api.kubelet.tick()
    # the output media type is negotiated before the pod is looked up: a missing pod is 406 too
    for name in ("a", "missing"):
        code, content_type, body = raw_get(api, f"/api/v1/namespaces/default/pods/{name}/log", accept)
        assert (code, content_type) == (406, "application/json")
        assert json.loads(body) == {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "only the following media types are accepted: application/json, application/yaml, "
                       "application/vnd.kubernetes.protobuf",
            "reason": "NotAcceptable", "code": 406}


@pytest.mark.parametrize("version,expected", [
    ("v1.20.2", {"major": "1", "minor": "20", "gitVersion": "v1.20.2"}),
    ("v1.27.3-gke.100", {"major": "1", "minor": "27+", "gitVersion": "v1.27.3-gke.100"}),
    (None, {"major": "1", "minor": "30+", "gitVersion": "v1.30.0-dlts-fake"}),
])
def test_version_reports_the_configured_version(version, expected):
    with FakeKubeApiServer(**({"version": version} if version else {})) as server:
        code, _, body = raw_get(server, "/version", "application/json")
        assert (code, json.loads(body)) == (200, expected)


def sysctl_pod(name: str, sysctl: str, **spec) -> dict:
    body = pod(name, command="echo up; sleep 5")
    body["spec"].update(securityContext={"sysctls": [{"name": sysctl, "value": "22"}]}, **spec)
    return body


FORBIDDEN = "forbidden sysctl: \"net.ipv4.ip_unprivileged_port_start\""


@pytest.mark.parametrize("version,sysctl,spec,message", [
    # measured on a real v1.20.2 cluster
    ("v1.20.2", "net.ipv4.ip_unprivileged_port_start", {}, f"Pod {FORBIDDEN} not whitelisted"),
    ("v1.20.2", "net.ipv4.ip_local_port_range", {}, None),
    ("v1.20.2", "net.ipv4.ping_group_range", {}, None),  # safe from 1.18
    ("v1.17.0", "net.ipv4.ping_group_range", {}, 'Pod forbidden sysctl: "net.ipv4.ping_group_range" not whitelisted'),
    ("v1.22.0", "net.ipv4.ip_unprivileged_port_start", {}, None),
    ("v1.24.1", "net.core.somaxconn", {}, 'Pod forbidden sysctl: "net.core.somaxconn" not allowlisted'),
    (None, "net.ipv4.ip_unprivileged_port_start", {}, None),  # the default 1.30: what every other test runs
    (None, "kernel.msgmax", {}, 'Pod was rejected: forbidden sysctl: "kernel.msgmax" not allowlisted'),
    (None, "net.ipv4.ip_unprivileged_port_start", {"hostNetwork": True},
     f"Pod was rejected: {FORBIDDEN} not allowed with host net enabled"),
], ids=["1.20-unprivileged-port", "1.20-safe", "1.20-ping-group", "1.17-ping-group", "1.22-unprivileged-port",
        "1.24-unsafe", "default-unprivileged-port", "default-unsafe", "default-host-network"])
def test_the_kubelet_admits_only_the_safe_sysctls_of_its_version(tmp_path, version, sysctl, spec, message):
    with FakeKubeApiServer(**({"version": version} if version else {})) as server:
        server.add_node("n1")
        api_client = config.new_client_from_config(config_file=str(server.write_kubeconfig(tmp_path / "kc")))
        v1 = client.CoreV1Api(api_client)
        v1.create_namespaced_pod("default", sysctl_pod("a", sysctl, **spec))
        server.run_until_idle(2)
        status = v1.read_namespaced_pod("a", "default").status
        if message is None:
            assert status.phase == "Running" and status.container_statuses[0].state.running is not None
            assert v1.read_namespaced_pod_log("a", "default") == "up\n"
        else:
            # rejected at admission: Failed at once, and no container ever started
            assert (status.phase, status.reason, status.message) == ("Failed", "SysctlForbidden", message)
            assert not status.container_statuses and not status.init_container_statuses
            events = [e for e in v1.list_namespaced_event("default").items if e.reason == "SysctlForbidden"]
            detail = message.removeprefix("Pod was rejected: ").removeprefix("Pod ")  # the event has no prefix
            assert [(e.type, e.message) for e in events] == [("Warning", detail)]
            assert server.pods()[0]["status"]["phase"] == "Failed"
        api_client.close()
