"""The pod watch: observe() served from memory kept current by a watch, and its failure modes."""

from __future__ import annotations

import contextlib
import json
import time
import types

import pytest
from conftest import caught_up, make_spec

from dlts.backends import k8s_watch
from dlts.backends.base import RunPhase
from dlts.backends.k8s_render import MANAGED_SELECTOR
from dlts.backends.k8s_watch import PodWatch, WatchExpired, event_name, event_version
from tests.fakes.kube_apiserver import FakeClock, FakeKubeApiServer


def by_key(observed):
    return {(o.job_id, o.attempt): o for o in observed}


@pytest.fixture
def wbackend(make_backend):
    return make_backend(watch=True, watch_timeout_s=30)


def test_observe_reads_the_watch_not_a_list_each_tick(api, wbackend):
    for job_id in range(1, 21):
        wbackend.launch(make_spec(job_id, command="sleep 5", nodes=(f"n{job_id % 4 + 1}",)))
    caught_up(api, wbackend)
    api.reset_counts()
    wbackend.nodes()
    assert len(wbackend.observe()) == 20
    assert api.requests == {("list", "nodes"): 1}  # no pod list: the watch brought them
    api.kubelet.tick()
    caught_up(api, wbackend)
    assert {o.phase for o in wbackend.observe()} == {RunPhase.RUNNING}
    api.run_until_idle(6)
    caught_up(api, wbackend)
    assert {o.phase for o in wbackend.observe()} == {RunPhase.SUCCEEDED}
    wbackend.forget(1, 1)
    assert (1, 1) not in by_key(wbackend.observe())


def test_a_launch_is_seen_at_once_without_waiting_for_its_event(api, wbackend):
    caught_up(api, wbackend)
    wbackend._watch.stop()  # no more events will be applied; the copy stays trusted
    wbackend.launch(make_spec(7, type="distributed", nodes=("n1", "n2")))
    assert by_key(wbackend.observe())[(7, 1)].phase is RunPhase.PENDING


def test_while_the_watch_is_down_observe_lists(api, wbackend):
    wbackend.launch(make_spec(8, command="sleep infinity"))
    caught_up(api, wbackend)
    wbackend._watch.stop()
    wbackend._watch._healthy = False  # what a failed watch leaves until its next successful list
    api.reset_counts()
    assert by_key(wbackend.observe())[(8, 1)].phase is RunPhase.PENDING
    assert api.requests[("list", "pods")] == 1


def test_a_failed_watch_reconnects_with_a_fresh_list(api, make_backend):
    backend = make_backend(watch=True, watch_timeout_s=10)
    backend.launch(make_spec(9, command="sleep infinity"))
    caught_up(api, backend)
    api.fail_next(1, 500, verbs={"watch"})  # the next reconnect fails
    response = backend._watch._response
    for method in ("shutdown", "close"):  # the stream breaks (a load balancer's idle timeout)
        with contextlib.suppress(Exception):
            getattr(response, method)()
    deadline = time.monotonic() + 10
    while backend._watch.relists < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backend._watch.relists >= 2
    api.kubelet.tick()
    caught_up(api, backend)
    assert by_key(backend.observe())[(9, 1)].phase is RunPhase.RUNNING


def test_an_expired_resource_version_relists(kubeconfig):
    from kubernetes import client, config

    with FakeKubeApiServer(FakeClock()) as api:
        api.store.history = type(api.store.history)(api.store.history, maxlen=5)
        api.add_node("n1")
        v1 = client.CoreV1Api(config.new_client_from_config(config_file=str(api.write_kubeconfig(kubeconfig))))
        watch = PodWatch(v1, "default", MANAGED_SELECTOR, watch_timeout_s=1)
        watch.relist()
        old = watch.resource_version
        for i in range(10):  # more writes than the server keeps
            api.store.create("secrets", "default", {"metadata": {"name": f"s{i}"}})
        with pytest.raises(WatchExpired):
            watch.watch_once()
        assert watch.resource_version == old
        watch.resource_version = None
        watch.step()  # lists again, then watches from the fresh version
        assert int(watch.resource_version) > int(old) and watch.relists == 2


# -- changes queued raw, decoded when read (a burst's events cost the launches nothing) ----------


def event_line(kind: str, name: str, rv: int, phase: str = "Pending", **metadata) -> bytes:
    obj = {"kind": "Pod", "apiVersion": "v1",
           "metadata": {"name": name, "namespace": "default", "resourceVersion": str(rv), **metadata},
           "status": {"phase": phase}}
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode()


def test_event_version_reads_a_pod_change_without_decoding_it_only_when_unambiguous():
    assert event_version(event_line("ADDED", "p", 12)) == "12"
    assert event_version(json.dumps({"type": "DELETED", "object": {"metadata": {"resourceVersion": "7"}}}).encode()) == "7"
    # JSON held in an annotation's value has its quotes escaped: not a member, not counted
    annotated = event_line("MODIFIED", "p", 13, annotations={"last-applied": json.dumps({"resourceVersion": "1"})})
    assert b'\\"resourceVersion\\"' in annotated and event_version(annotated) == "13"
    # a second member of that name (an annotation key), a version that is not digits, or a line
    # that is no pod change: decoded in full instead
    assert event_version(event_line("MODIFIED", "p", 14, annotations={"resourceVersion": "999"})) is None
    assert event_version(event_line("MODIFIED", "p", 15).replace(b'"15"', b'"15a"')) is None
    assert event_version(b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"16"}}}') is None
    assert event_version(b'{"type":"ERROR","object":{"kind":"Status","code":410,"resourceVersion":"1"}}') is None
    assert event_version(b'{"object":{"metadata":{"resourceVersion":"17"}},"type":"ADDED"}') is None


def offline_watch() -> PodWatch:
    """A watch fed by hand (no thread, no server), trusted as after its first list."""
    watch = PodWatch(None, "default", MANAGED_SELECTOR)  # type: ignore[arg-type]
    watch._healthy = True
    return watch


def phases(watch: PodWatch) -> dict[str, str]:
    return {p["metadata"]["name"]: p["status"]["phase"] for p in watch.snapshot() or []}


def test_queued_changes_apply_in_order_when_read_and_never_go_back_in_version():
    watch = offline_watch()
    watch._receive(event_line("ADDED", "a", 10))
    watch._receive(event_line("MODIFIED", "a", 11, "Running"))
    watch._receive(event_line("ADDED", "b", 12))
    assert watch.resource_version == "12"  # read from the lines; nothing decoded yet
    assert [(what, name, version) for what, _payload, name, version in watch._pending] == [
        ("event", "a", 10), ("event", "a", 11), ("event", "b", 12)]
    assert all(isinstance(payload, bytes) for _, payload, *_ in watch._pending)
    assert phases(watch) == {"a": "Running", "b": "Pending"} and watch._pending == []
    # a response remembered after newer events (or an event older than a remembered response)
    # changes nothing; a deletion older than what we know does not remove the pod
    watch.remember_raw("a", json.dumps(json.loads(event_line("ADDED", "a", 10))["object"]).encode())
    watch.remember({"metadata": {"name": "b", "resourceVersion": "20"}, "status": {"phase": "Running"}})
    watch._receive(event_line("MODIFIED", "b", 13, "Pending"))
    watch._receive(event_line("DELETED", "b", 14))
    assert phases(watch) == {"a": "Running", "b": "Running"}
    watch._receive(event_line("DELETED", "b", 21, "Succeeded"))
    watch._receive(event_line("DELETED", "a", 22, "Succeeded"))
    assert phases(watch) == {}
    assert watch.resource_version == "22"


def test_event_name_reads_the_pods_name_only_from_the_head_of_the_event():
    assert event_name(event_line("MODIFIED", "dlts-7-1-0", 3)) == "dlts-7-1-0"
    fake_style = json.dumps({"type": "ADDED", "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "p", "resourceVersion": "4"}}}).encode()
    assert event_name(fake_style) == "p"
    # metadata not right after kind/apiVersion, or name not its first member: decoded instead
    late = json.dumps({"type": "ADDED", "object": {"spec": {"metadata": {"name": "x"}}, "metadata": {
        "name": "p"}}}).encode()
    assert event_name(late) is None
    assert event_name(json.dumps({"type": "ADDED", "object": {"metadata": {"uid": "u", "name": "p"}}}).encode()) is None
    assert event_name(b'{"type":"BOOKMARK","object":{"metadata":{"name":"p"}}}') is None


def test_only_the_newest_change_of_each_pod_is_decoded(monkeypatch):
    watch = offline_watch()
    decoded: list[bytes] = []

    def loads(text, *args, **kwargs):
        decoded.append(text)
        return json.loads(text, *args, **kwargs)

    monkeypatch.setattr(k8s_watch, "json", types.SimpleNamespace(loads=loads))
    created = json.dumps(json.loads(event_line("ADDED", "a", 10))["object"]).encode()
    watch.remember_raw("a", created)
    for kind, rv, phase in (("ADDED", 10, "Pending"), ("MODIFIED", 11, "Pending"), ("MODIFIED", 12, "Running")):
        watch._receive(event_line(kind, "a", rv, phase))
    watch._receive(event_line("ADDED", "b", 13))
    watch._receive(event_line("DELETED", "b", 14, "Succeeded"))
    # a name that cannot be read raw (metadata's first member is not the name): decoded to learn it
    odd = {"type": "ADDED", "object": {"metadata": {"uid": "u", "name": "c", "resourceVersion": "15"},
                                        "status": {"phase": "Pending"}}}
    watch._receive(json.dumps(odd).encode())
    assert phases(watch) == {"a": "Running", "c": "Pending"}
    assert sorted(json.loads(t)["object"]["metadata"]["resourceVersion"] for t in decoded) == ["12", "14", "15"]


def test_the_queue_does_not_grow_without_bound_when_nobody_reads():
    watch = offline_watch()
    watch.flush_after = 10
    for rv in range(1, 101):
        watch._receive(event_line("MODIFIED", f"p{rv % 3}", rv))
    assert len(watch._pending) <= 10
    assert len(watch._pods) == 3


def test_forget_is_not_undone_by_changes_queued_before_it():
    watch = offline_watch()
    watch._receive(event_line("ADDED", "a", 10))
    watch._receive(event_line("MODIFIED", "a", 11, "Succeeded"))
    watch.forget({"a"})
    assert phases(watch) == {} and watch.names() == set()


def test_changes_that_need_decoding_keep_their_place_in_the_queue():
    watch = offline_watch()
    watch._receive(event_line("ADDED", "a", 10))
    # two resourceVersion members: decoded at once, then queued behind the raw line before it
    watch._receive(event_line("MODIFIED", "a", 11, "Running", annotations={"resourceVersion": "x"}))
    watch._receive(b'{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"30"}}}')
    assert watch.resource_version == "30"
    assert [isinstance(payload, bytes) for _, payload, *_ in watch._pending] == [True, False]
    assert phases(watch) == {"a": "Running"}
    with pytest.raises(WatchExpired):  # an ERROR is handled when it arrives, not when read
        watch._receive(b'{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old"}}')


def test_a_queued_event_that_does_not_decode_distrusts_the_copy_and_lists_again(api, make_backend):
    backend = make_backend(watch=True, watch_timeout_s=30)
    backend.launch(make_spec(1, command="sleep infinity"))
    caught_up(api, backend)
    # a line that looks like a pod change (head, one version) but is cut short
    backend._watch._receive(event_line("MODIFIED", "dlts-1-1-0", 10**9)[:-3])
    api.reset_counts()
    assert by_key(backend.observe())[(1, 1)].phase is RunPhase.PENDING  # listed: the copy is not trusted
    assert api.requests[("list", "pods")] == 1
    backend.launch(make_spec(2, command="sleep infinity"))  # the next event: the watch thread relists
    deadline = time.monotonic() + 10
    while backend._watch.relists < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backend._watch.relists >= 2
    caught_up(api, backend)
    api.reset_counts()
    assert set(by_key(backend.observe())) == {(1, 1), (2, 1)}
    assert ("list", "pods") not in api.requests


def test_status_changes_and_deletions_arrive_through_the_queue(api, wbackend):
    for job_id in (1, 2):
        wbackend.launch(make_spec(job_id, command="sleep infinity", nodes=(f"n{job_id}",)))
    caught_up(api, wbackend)
    api.kubelet.tick()
    caught_up(api, wbackend)
    assert {k: o.phase for k, o in by_key(wbackend.observe()).items()} == {
        (1, 1): RunPhase.RUNNING, (2, 1): RunPhase.RUNNING}
    wbackend.terminate(2, 1, grace_s=0)  # the fake removes it at once: a DELETED event
    caught_up(api, wbackend)
    api.reset_counts()
    assert set(by_key(wbackend.observe())) == {(1, 1)}
    assert ("list", "pods") not in api.requests


def test_a_bookmark_moves_the_version_on_without_touching_the_pods(api, wbackend):
    wbackend.launch(make_spec(3, command="sleep infinity"))
    caught_up(api, wbackend)
    before = phases(wbackend._watch)
    secret = api.store.create("secrets", "default", {"metadata": {"name": "unrelated"}})
    target = int(secret["metadata"]["resourceVersion"])
    deadline = time.monotonic() + 10  # the fake sends one after a second without pod events
    while int(wbackend._watch.resource_version or 0) < target and time.monotonic() < deadline:
        time.sleep(0.05)
    assert int(wbackend._watch.resource_version) >= target
    assert phases(wbackend._watch) == before


def test_a_burst_of_launches_decodes_no_pod_until_the_copy_is_read(api, wbackend, monkeypatch):
    caught_up(api, wbackend)
    decoded: list[int] = []

    def loads(text, *args, **kwargs):
        if len(text) > 500:  # a pod, not a bookmark
            decoded.append(len(text))
        return json.loads(text, *args, **kwargs)

    monkeypatch.setattr(k8s_watch, "json", types.SimpleNamespace(loads=loads))
    for job_id in range(1, 11):
        wbackend.launch(make_spec(job_id, command="sleep infinity", nodes=(f"n{job_id % 4 + 1}",)))
    with api.store.lock:
        target = max(rv for rv, _e, res, *_ in api.store.history if res == "pods")
    deadline = time.monotonic() + 5
    while int(wbackend._watch.resource_version or 0) < target and time.monotonic() < deadline:
        time.sleep(0.01)  # (not caught_up: it reads the copy)
    assert int(wbackend._watch.resource_version) >= target
    assert decoded == []  # 10 ADDED events and 10 create responses, all still raw
    assert len(wbackend.observe()) == 10
    # decoded by the read, once each: of a create's response and the ADDED event of the same
    # version only the newer in the queue
    assert len(decoded) == 10
