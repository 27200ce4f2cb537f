"""The fake API server behaves like a real one where the backend depends on it.

Each case goes through the official ``kubernetes`` client over HTTP, as the backend does.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tests.fakes.kube_apiserver import parse_script


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
