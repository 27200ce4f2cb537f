"""The pod watch: observe() served from memory kept current by a watch, and its failure modes."""

from __future__ import annotations

import contextlib
import time

import pytest
from conftest import caught_up, make_spec

from dlts.backends.base import RunPhase
from dlts.backends.k8s_render import MANAGED_SELECTOR
from dlts.backends.k8s_watch import PodWatch, WatchExpired
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
