"""KubernetesBackend against the fake API server, through the official client."""

from __future__ import annotations

import pytest
from conftest import GIB, affinity_node, env_of, make_spec

from dlts.backends.base import EndpointSpec, RegistryCredential, RunPhase
from dlts.backends.k8s_render import LaunchRefused
from dlts.backends.kubernetes import CordonResult, KubernetesRefused, KubernetesUnavailable, NodeNotFound
from dlts.jobmanager.manager import launch_all


def by_key(observed):
    return {(o.job_id, o.attempt): o for o in observed}


def test_a_batch_job_runs_and_succeeds(api, backend):
    backend.launch(make_spec(1, command="sleep 10", gpus=2))
    [pod] = api.pods()
    # the node DLTS chose is a required affinity; kube-scheduler binds the pod there on its next pass
    assert affinity_node(pod) == "n1" and "nodeName" not in pod["spec"]
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "2" and limits["cpu"] == "8" and limits["memory"] == str(64 * GIB)
    labels = pod["metadata"]["labels"]
    assert {k: labels[k] for k in ("dlts.io/job-id", "dlts.io/attempt", "dlts.io/vc", "dlts.io/user",
                                   "dlts.io/type", "dlts.io/preemptible", "dlts.io/role", "dlts.io/index")} == {
        "dlts.io/job-id": "1", "dlts.io/attempt": "1", "dlts.io/vc": "vision", "dlts.io/user": "alice",
        "dlts.io/type": "batch", "dlts.io/preemptible": "false", "dlts.io/role": "master", "dlts.io/index": "0"}
    env = env_of(pod)
    assert (env["DLTS_JOB_ID"], env["DLTS_USER"], env["DLTS_VC"], env["DLTS_NUM_GPUS"]) == ("1", "alice", "vision", "2")
    assert env["DLTS_COMMAND"] == "sleep 10"
    assert by_key(backend.observe())[(1, 1)].phase is RunPhase.PENDING
    api.kubelet.tick()
    assert api.pods()[0]["spec"]["nodeName"] == "n1"
    running = by_key(backend.observe())[(1, 1)]
    assert running.phase is RunPhase.RUNNING and running.started_at == pytest.approx(api.clock(), abs=1)
    api.run_until_idle(10)
    done = by_key(backend.observe())[(1, 1)]
    assert (done.phase, done.exit_code) == (RunPhase.SUCCEEDED, 0)
    assert done.finished_at - done.started_at == pytest.approx(10, abs=1)
    backend.forget(1, 1)
    assert api.pods() == [] and backend.observe() == []


def test_a_burst_of_launches_reuses_connections_and_sends_two_creates_per_job(api, backend):
    """Every response is read, so its connection goes back to the client's pool: a burst opens at
    most one connection per launch thread, not one per request (each a TCP handshake, and a new
    thread in the API server). A job that is not distributed creates its NetworkPolicy, then its
    pod; its endpoint ConfigMap waits for a first endpoint."""
    api.reset_counts()
    before = api.connections
    results = launch_all(backend, [make_spec(100 + i) for i in range(40)])
    assert [exc for _, exc in results] == [None] * 40
    assert 1 <= api.connections - before <= backend.launch_parallelism
    assert dict(api.requests) == {("create", "networkpolicies"): 40, ("create", "pods"): 40}
    assert api.objects("configmaps") == []


def test_a_failing_job_reports_its_exit_code(api, backend):
    backend.launch(make_spec(2, command="sleep 1; exit 7"))
    api.run_until_idle(2)
    seen = by_key(backend.observe())[(2, 1)]
    assert (seen.phase, seen.exit_code) == (RunPhase.FAILED, 7)
    assert "dlts-2-1-0" in seen.message


def test_a_distributed_job_gets_one_pod_per_node_with_rank_env(api, backend):
    backend.launch(make_spec(5, type="distributed", nodes=("n1", "n2", "n3"), gpus=8))
    pods = sorted(api.pods(), key=lambda p: p["metadata"]["name"])
    assert [affinity_node(p) for p in pods] == ["n1", "n2", "n3"]
    assert [p["metadata"]["labels"]["dlts.io/role"] for p in pods] == ["master", "worker", "worker"]
    envs = [env_of(p) for p in pods]
    assert {e["MASTER_ADDR"] for e in envs} == {"dlts-5-1-0.dlts-5-1.default.svc"}
    assert {e["MASTER_PORT"] for e in envs} == {"29500"}
    assert [e["WORLD_SIZE"] for e in envs] == ["24"] * 3
    assert [e["LOCAL_WORLD_SIZE"] for e in envs] == ["8"] * 3
    assert [e["RANK"] for e in envs] == ["0", "8", "16"]
    assert [e["NODE_RANK"] for e in envs] == ["0", "1", "2"]
    assert [p["spec"]["subdomain"] for p in pods] == ["dlts-5-1"] * 3
    [svc] = api.objects("services")
    assert svc["metadata"]["name"] == "dlts-5-1" and svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {"dlts.io/job-id": "5", "dlts.io/attempt": "1",
                                       "app.kubernetes.io/managed-by": "dlts"}
    api.kubelet.tick()
    assert by_key(backend.observe())[(5, 1)].phase is RunPhase.RUNNING


def test_one_failed_rank_fails_the_distributed_attempt(api, backend):
    backend.launch(make_spec(6, type="distributed", nodes=("n1", "n2"), command="sleep 100"))
    api.kubelet.tick()
    # rank 1's container dies on its own (e.g. NCCL error): the kubelet reports it Failed
    api.store.update_internal("pods", "default", "dlts-6-1-1", lambda o: o["status"].update(
        phase="Failed", containerStatuses=[{"name": "job", "state": {"terminated": {
            "exitCode": 134, "reason": "Error", "finishedAt": "2027-01-15T08:00:00Z"}}}]))
    seen = by_key(backend.observe())[(6, 1)]
    assert (seen.phase, seen.exit_code) == (RunPhase.FAILED, 134)
    assert "dlts-6-1-1" in seen.message


def test_launch_is_idempotent_across_a_restart(api, make_backend):
    spec = make_spec(9, type="distributed", nodes=("n1", "n2"), ports=(8888,),
                     ssh_public_keys=("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA alice@laptop",),
                     registry_credentials=(RegistryCredential("registry.example.com", "alice", "pw"),))
    make_backend().launch(spec)
    created = dict(api.store.created)
    # the managers process dies after creating, before any observe; the new one launches again
    restarted = make_backend()
    restarted.launch(spec)
    assert dict(api.store.created) == created
    assert (len(api.pods()), len(api.objects("services")), len(api.objects("secrets")),
            len(api.objects("configmaps"))) == (2, 1, 1, 1)
    assert by_key(restarted.observe())[(9, 1)].phase is RunPhase.PENDING


def test_an_interrupted_launch_is_completed_by_the_next(api, backend):
    spec = make_spec(10, type="distributed", nodes=("n1", "n2"))
    api.fail_next(1, 503, verbs={"create"})
    with pytest.raises(KubernetesUnavailable):
        backend.launch(spec)
    api.clock.advance(5)  # past the back-off
    backend.launch(spec)
    assert sorted(p["metadata"]["name"] for p in api.pods()) == ["dlts-10-1-0", "dlts-10-1-1"]


def test_kill_deletes_with_grace_and_twice_is_harmless(api, backend):
    backend.launch(make_spec(3, command="sleep infinity"))
    api.kubelet.tick()
    backend.terminate(3, 1, grace_s=30)
    [pod] = api.pods()
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 30
    seen = by_key(backend.observe())[(3, 1)]
    assert seen.phase is RunPhase.RUNNING and seen.message == "terminating"
    api.kubelet.tick()
    assert api.pods() == [] and backend.observe() == []
    backend.terminate(3, 1, grace_s=30)
    backend.forget(3, 1)
    backend.forget(3, 1)


def test_a_node_not_ready_past_the_threshold_loses_the_attempt(api, backend):
    backend.launch(make_spec(4, command="sleep infinity", nodes=("n2",)))
    api.kubelet.tick()
    api.set_node_ready("n2", False, status="Unknown")
    api.clock.advance(30)
    assert by_key(backend.observe())[(4, 1)].phase is RunPhase.RUNNING  # not yet: a blip is not a loss
    api.clock.advance(31)
    seen = by_key(backend.observe())[(4, 1)]
    assert seen.phase is RunPhase.GONE and seen.node_lost
    assert "n2" in seen.message
    backend.forget(4, 1)  # the stuck pod is force-removed
    assert api.pods() == []


def test_a_vanished_node_loses_the_attempt(api, backend):
    backend.launch(make_spec(11, command="sleep infinity", nodes=("n3",)))
    api.kubelet.tick()
    api.remove_node("n3")
    assert by_key(backend.observe())[(11, 1)].phase is RunPhase.RUNNING
    api.clock.advance(61)
    seen = by_key(backend.observe())[(11, 1)]
    assert seen.phase is RunPhase.GONE and seen.node_lost


def test_a_finished_attempt_stays_finished_when_its_node_goes(api, backend):
    backend.launch(make_spec(12, command="exit 0", nodes=("n1",)))
    api.kubelet.tick()
    api.set_node_ready("n1", False)
    api.clock.advance(120)
    assert by_key(backend.observe())[(12, 1)].phase is RunPhase.SUCCEEDED


def test_orphans_are_garbage_collected(api, backend):
    backend.launch(make_spec(20, type="distributed", nodes=("n1", "n2"),
                             ssh_public_keys=("ssh-rsa AAAAB3NzaC1yc2E alice",),
                             registry_credentials=(RegistryCredential("registry.example.com", "alice", "pw"),)))
    api.kubelet.tick()
    backend.expose(20, 1, [EndpointSpec(1, "ssh", 22)], ("ssh-rsa AAAAB3NzaC1yc2E alice",))
    backend.launch(make_spec(21))
    removed = backend.collect_garbage(live={(21, 1)})
    assert removed == ((20, 1),)
    api.kubelet.tick()  # graceful deletes complete
    assert [p["metadata"]["name"] for p in api.pods()] == ["dlts-21-1-0"]
    assert api.objects("services") == [] and api.objects("secrets") == []
    assert api.objects("configmaps") == []  # a batch job's is made with its first endpoint; it has none
    assert backend.collect_garbage(live={(21, 1)}) == ()


def test_objects_without_our_label_are_never_touched(api, backend):
    api.store.create("pods", "default", {"metadata": {"name": "someone-elses", "labels": {"dlts.io/job-id": "20"}},
                                         "spec": {"containers": [{"name": "c", "image": "x"}]}})
    assert backend.collect_garbage(live=set()) == ()
    assert backend.observe() == []
    assert [p["metadata"]["name"] for p in api.pods()] == ["someone-elses"]


def test_node_sync_reads_labels_and_allocatable(api, backend):
    api.add_node("cpu1", gpus=0, cpu="63500m", memory="256Gi", labels={"dlts.io/vc": "infra"})
    api.add_node("g9", gpus=4, labels={"dlts.io/sku": "v100"}, ready=False, unschedulable=True)
    nodes = {n.name: n for n in backend.nodes()}
    assert (nodes["n3"].sku, nodes["n3"].gpus, nodes["n3"].cpu, nodes["n3"].memory_bytes, nodes["n3"].ib_domain) == (
        "a100", 8, 96.0, 900 * GIB, "pod1")
    assert (nodes["cpu1"].sku, nodes["cpu1"].gpus, nodes["cpu1"].cpu, nodes["cpu1"].vc) == ("cpu", 0, 63.5, "infra")
    assert (nodes["g9"].ready, nodes["g9"].unschedulable, nodes["g9"].ib_domain) == (False, True, "default")


def test_node_label_keys_are_configurable(api, make_backend):
    api.add_node("x1", gpus=2, labels={"example.com/gpu-model": "h100", "example.com/fabric": "ibA"})
    backend = make_backend(sku_label="example.com/gpu-model", ib_domain_label="example.com/fabric")
    node = {n.name: n for n in backend.nodes()}["x1"]
    assert (node.sku, node.ib_domain) == ("h100", "ibA")


def test_cordon_is_recorded_and_undone_only_by_dlts(api, backend):
    assert backend.cordon("n1", reason="ECC errors") is CordonResult.CORDONED
    node = api.store.get("nodes", "", "n1")
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["annotations"]["dlts.io/cordoned-by"] == "dlts"
    assert {n.name: n for n in backend.nodes()}["n1"].cordoned_by_dlts
    assert backend.cordon("n1") is CordonResult.ALREADY_CORDONED
    assert backend.uncordon("n1") is CordonResult.UNCORDONED
    node = api.store.get("nodes", "", "n1")
    assert not node["spec"].get("unschedulable")
    assert "dlts.io/cordoned-by" not in node["metadata"].get("annotations", {})


def test_a_cordon_by_someone_else_is_left_alone(api, backend):
    api.store.patch("nodes", "", "n2", {"spec": {"unschedulable": True}}, "application/merge-patch+json")
    assert backend.cordon("n2") is CordonResult.CORDONED_BY_OTHERS
    assert backend.uncordon("n2") is CordonResult.CORDONED_BY_OTHERS
    assert api.store.get("nodes", "", "n2")["spec"]["unschedulable"] is True


def test_a_hand_uncordon_clears_our_mark(api, backend):
    backend.cordon("n3")
    api.store.patch("nodes", "", "n3", {"spec": {"unschedulable": False}}, "application/merge-patch+json")
    assert backend.uncordon("n3") is CordonResult.NOT_CORDONED
    # an admin now cordons it by hand: it is theirs, not ours
    api.store.patch("nodes", "", "n3", {"spec": {"unschedulable": True}}, "application/merge-patch+json")
    assert backend.uncordon("n3") is CordonResult.CORDONED_BY_OTHERS


def test_cordon_retries_when_the_node_changes_underneath(api, backend, monkeypatch):
    real_read = backend._cordons._read_node
    calls = {"n": 0}

    def read_then_race(name):
        obj = real_read(name)
        calls["n"] += 1
        if calls["n"] == 1:  # another writer updates the node between our read and our patch
            api.store.patch("nodes", "", name, {"metadata": {"labels": {"touched": "yes"}}},
                            "application/merge-patch+json")
        return obj

    monkeypatch.setattr(backend._cordons, "_read_node", read_then_race)
    assert backend.cordon("n4") is CordonResult.CORDONED
    assert calls["n"] == 2
    assert api.store.get("nodes", "", "n4")["metadata"]["labels"]["touched"] == "yes"


def test_cordon_of_an_unknown_node_says_so(backend):
    with pytest.raises(NodeNotFound, match="nope"):
        backend.cordon("nope")


def test_api_failures_back_off_and_lose_nothing(api, backend):
    backend.launch(make_spec(30, command="sleep 100"))
    api.kubelet.tick()
    api.fail_next(1, 500)
    with pytest.raises(KubernetesUnavailable):
        backend.observe()
    before = api.total_requests()
    with pytest.raises(KubernetesUnavailable, match="backing off"):
        backend.observe()  # inside the back-off window: fails fast, no request
    assert api.total_requests() == before
    api.clock.advance(1.5)
    assert by_key(backend.observe())[(30, 1)].phase is RunPhase.RUNNING


def test_back_off_grows_then_resets(api, backend):
    for expected in (1, 2, 4, 8):
        api.fail_next(1, 503)
        with pytest.raises(KubernetesUnavailable, match=f"retrying in {expected}.0 s"):
            backend.nodes()
        api.clock.advance(expected)
    assert len(backend.nodes()) == 4
    api.fail_next(1, 503)
    with pytest.raises(KubernetesUnavailable, match="retrying in 1.0 s"):
        backend.nodes()


def test_timeouts_are_unavailability_not_state(api, make_backend):
    backend = make_backend(request_timeout_s=0.2)
    api.delay_s = 0.5
    with pytest.raises(KubernetesUnavailable):
        backend.observe()
    api.delay_s = 0


def test_observe_costs_the_same_few_calls_for_1_or_60_jobs(api, backend):
    def calls_per_tick() -> int:
        api.reset_counts()
        backend.nodes()
        backend.observe()
        return api.total_requests()

    backend.launch(make_spec(100))
    one = calls_per_tick()
    for job_id in range(101, 160):
        backend.launch(make_spec(job_id, nodes=(f"n{job_id % 4 + 1}",)))
    api.kubelet.tick()
    api.clock.advance(5)
    assert calls_per_tick() == one == 2  # one list of nodes, one list of pods
    assert len(backend.observe()) == 60


def test_hostile_job_is_refused_before_any_call(api, backend):
    api.reset_counts()
    with pytest.raises(LaunchRefused, match="does not allow its jobs to run as root"):
        backend.launch(make_spec(40, run_as_root=True))
    with pytest.raises(LaunchRefused, match="MASTER_ADDR"):
        backend.launch(make_spec(40, env={"MASTER_ADDR": "evil.example.com"}))
    assert api.total_requests() == 0


def test_a_half_created_attempt_is_hidden_until_relaunched_then_gone_if_never(api, backend):
    backend.launch(make_spec(50, type="distributed", nodes=("n1", "n2"), command="sleep infinity"))
    api.store.remove_internal("pods", "default", "dlts-50-1-1")
    api.kubelet.tick()
    assert (50, 1) not in by_key(backend.observe())  # the job manager relaunches what it does not see
    api.clock.advance(31)
    seen = by_key(backend.observe())[(50, 1)]
    assert seen.phase is RunPhase.GONE and not seen.node_lost and "1 of its 2 pods" in seen.message


def test_a_refusal_by_the_api_server_is_a_launch_refusal_with_its_message(api, backend):
    api.fail_next(1, 403, verbs={"create"})  # the first object created: the NetworkPolicy
    with pytest.raises(LaunchRefused, match="Kubernetes refused NetworkPolicy dlts-60-1: injected fault: Forbidden"):
        backend.launch(make_spec(60))
    backend.launch(make_spec(60))  # no back-off for a refusal: the API is up
    assert len(api.pods()) == 1


def test_an_unexpected_refusal_elsewhere_is_a_refusal_with_the_message_and_no_back_off(api, backend):
    api.fail_next(1, 403, verbs={"list"})
    with pytest.raises(KubernetesRefused, match="HTTP 403 Forbidden.*injected fault") as refused:
        backend.observe()
    assert refused.value.status == 403
    backend.observe()  # the server answered: no back-off, the next call goes out


def test_the_kubeconfig_token_hook_runs_at_most_once_a_second(api, kubeconfig, monkeypatch):
    """The loader's hook sets the whole configuration again before every request (~0.3 ms: the
    host setter reads the environment's proxy variables); a token refresh needs it every few
    minutes at most."""
    from kubernetes.config import kube_config

    from dlts.backends.k8s_settings import KubernetesSettings
    from dlts.backends.kubernetes.api import connect

    calls = []
    original = kube_config.KubeConfigLoader._set_config

    def counting(self, configuration):
        calls.append(1)
        return original(self, configuration)

    monkeypatch.setattr(kube_config.KubeConfigLoader, "_set_config", counting)
    client = connect(KubernetesSettings(kubeconfig=str(kubeconfig), namespace="default"))
    calls.clear()
    tokens = {client.configuration.get_api_key_with_prefix("BearerToken") for _ in range(50)}
    assert len(calls) == 1 and tokens == {f"Bearer {api.token}"}
    client.close()
