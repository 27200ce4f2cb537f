"""KubernetesBackend: pod output copied into the log store, paged lists, waiting reasons, NetworkPolicies."""

from __future__ import annotations

import pytest
from conftest import LOG_MAX_BYTES, caught_up, make_spec

from dlts.backends.base import RunPhase
from dlts.backends.kubernetes import KubernetesRefused
from dlts.backends.kubernetes.logcopy import cursor_path
from dlts.logstore import iter_log


def stored(log_dir, job_id: int, attempt: int = 1) -> bytes:
    return b"".join(iter_log(log_dir, job_id, attempt, key=None))  # specs without a log key: the old names


def by_key(observed):
    return {(o.job_id, o.attempt): o for o in observed}


def test_sync_copies_new_output_once_across_calls(api, backend, log_dir):
    backend.launch(make_spec(1, command="echo starting; sleep 10; echo done"))
    api.kubelet.tick()
    backend.sync_logs([(1, 1)])
    assert stored(log_dir, 1) == b"starting\n"
    for i in range(3):  # several lines within the same second: kept apart by count, not time
        api.print_output("dlts-1-1-0", f"step {i}")
    backend.sync_logs([(1, 1)])
    backend.sync_logs([(1, 1)])
    assert stored(log_dir, 1) == b"starting\nstep 0\nstep 1\nstep 2\n"
    api.clock.advance(0.5)
    api.print_output("dlts-1-1-0", "step 3")
    backend.sync_logs([(1, 1)])
    assert stored(log_dir, 1).endswith(b"step 2\nstep 3\n")


def test_a_restarted_manager_resumes_from_the_cursor(api, make_backend, log_dir):
    first = make_backend()
    first.launch(make_spec(2, command="sleep infinity"))
    api.kubelet.tick()
    api.print_output("dlts-2-1-0", "before the restart")
    first.sync_logs([(2, 1)])
    first.close()
    api.print_output("dlts-2-1-0", "after the restart")
    again = make_backend()  # a new managers process: no memory but the cursor next to the log
    again.sync_logs([(2, 1)])
    assert stored(log_dir, 2) == b"before the restart\nafter the restart\n"
    assert cursor_path(log_dir, 2, 1, key=None).exists()


def test_a_batch_journalled_but_not_committed_is_not_lost_or_doubled(api, backend, log_dir, monkeypatch):
    backend.launch(make_spec(3, command="sleep infinity"))
    api.kubelet.tick()
    api.print_output("dlts-3-1-0", "one")
    backend.sync_logs([(3, 1)])
    api.clock.advance(1)
    api.print_output("dlts-3-1-0", "two")
    from dlts.backends.kubernetes import logcopy

    real_write = logcopy.AttemptLogWriter.write

    def crash_after_write(self, data):
        real_write(self, data)
        raise SystemExit("the managers process dies between the log write and the cursor commit")

    monkeypatch.setattr(logcopy.AttemptLogWriter, "write", crash_after_write)
    with pytest.raises(SystemExit):
        backend.sync_logs([(3, 1)])
    monkeypatch.undo()
    backend.sync_logs([(3, 1)])
    assert stored(log_dir, 3) == b"one\ntwo\n"


def test_forget_copies_the_rest_and_the_log_outlives_the_pod(api, backend, log_dir):
    backend.launch(make_spec(4, command="echo hello; sleep 5; echo goodbye; exit 3"))
    api.run_until_idle(6)
    assert by_key(backend.observe())[(4, 1)].phase is RunPhase.FAILED
    backend.forget(4, 1)
    assert api.pods() == []
    assert stored(log_dir, 4) == b"hello\ngoodbye\n"


def test_forget_keeps_the_pods_while_their_log_cannot_be_read(api, backend, log_dir, monkeypatch):
    backend.launch(make_spec(5, command="echo hi"))
    api.kubelet.tick()

    def refuse(*args, **kwargs):
        from kubernetes.client.exceptions import ApiException

        raise ApiException(status=500, reason="Internal Server Error")

    monkeypatch.setattr(backend.api, "pod_log", refuse)
    with pytest.raises(KubernetesRefused, match="cannot read the log of pod dlts-5-1-0"):
        backend.forget(5, 1)
    assert len(api.pods()) == 1
    monkeypatch.undo()
    backend.forget(5, 1)
    assert api.pods() == [] and stored(log_dir, 5) == b"hi\n"


def test_the_pods_of_a_distributed_job_share_one_log_prefixed_by_index(api, backend, log_dir):
    backend.launch(make_spec(6, type="distributed", nodes=("n1", "n2"), command="sleep infinity"))
    api.kubelet.tick()
    api.print_output("dlts-6-1-0", "rank 0 up")
    api.print_output("dlts-6-1-1", "rank 1 up")
    backend.sync_logs([(6, 1)])
    assert stored(log_dir, 6) == b"rank 0 up\n[1] rank 1 up\n"


def test_each_pods_output_goes_to_the_log_of_the_key_it_carries(api, backend, log_dir, caplog):
    """A pod carries its attempt's log key (``dlts.io/log-key``): a pod of the same job id and
    attempt number made for another attempt row (a job a database restore discarded) writes to that
    row's log, never to this one; an annotation that is not a key names no file."""
    key, other = "0123456789abcdef", "fedcba9876543210"
    backend.launch(make_spec(9, type="distributed", nodes=("n1", "n2", "n3"), command="sleep infinity", log_key=key))
    api.kubelet.tick()
    assert {p["metadata"]["annotations"]["dlts.io/log-key"] for p in api.pods()} == {key}
    ns = backend.settings.namespace
    for name, value in (("dlts-9-1-1", other), ("dlts-9-1-2", "../../etc")):
        backend.core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": {"dlts.io/log-key": value}}})
    caught_up(api, backend)
    for i in range(3):
        api.print_output(f"dlts-9-1-{i}", f"rank {i}")
    backend.sync_logs([(9, 1)])
    assert b"".join(iter_log(log_dir, 9, 1, key=key)) == b"rank 0\n"
    assert b"".join(iter_log(log_dir, 9, 1, key=other)) == b"[1] rank 1\n"
    assert stored(log_dir, 9) == b""
    assert "pods dlts-9-1-2 not copied" in caplog.text
    assert sorted(p.name for p in (log_dir / "9").iterdir() if p.name.endswith(".log")) == \
        [f"attempt-1-{key}.log", f"attempt-1-{other}.log"]


def test_sync_copies_many_attempts_in_parallel_and_only_those_asked(api, backend, log_dir):
    for job_id in range(10, 20):
        backend.launch(make_spec(job_id, command=f"echo job {job_id}; sleep infinity", nodes=(f"n{job_id % 4 + 1}",)))
    api.kubelet.tick()
    backend.sync_logs([(j, 1) for j in range(10, 19)])
    assert all(stored(log_dir, j) == f"job {j}\n".encode() for j in range(10, 19))
    assert stored(log_dir, 19) == b""


def test_the_log_cap_applies_to_copied_output(api, backend, log_dir):
    backend.launch(make_spec(7, command="sleep infinity"))
    api.kubelet.tick()
    line = "x" * 1023
    for i in range(3 * LOG_MAX_BYTES // 1024):
        if i % 500 == 0:
            api.clock.advance(1)
        api.print_output("dlts-7-1-0", line)
    backend.sync_logs([(7, 1)])
    data = stored(log_dir, 7)
    assert len(data) < 1.5 * LOG_MAX_BYTES and b"bytes of this log were dropped" in data


def test_every_list_pages(api, make_backend):
    backend = make_backend(list_page_size=10)
    for job_id in range(30, 55):
        backend.launch(make_spec(job_id, nodes=(f"n{job_id % 4 + 1}",)))
    api.reset_counts()
    assert len(backend.observe()) == 25
    assert api.requests[("list", "pods")] == 3  # 10 + 10 + 5


def test_a_list_whose_continue_token_expires_starts_again(api, make_backend, monkeypatch):
    backend = make_backend(list_page_size=10)
    for job_id in range(60, 85):
        backend.launch(make_spec(job_id, nodes=(f"n{job_id % 4 + 1}",)))
    real = api.store._continued
    calls = {"n": 0}

    def compact_once(token):
        calls["n"] += 1
        if calls["n"] == 1:
            api.store.compact()  # etcd compacted while we paged
        return real(token)

    monkeypatch.setattr(api.store, "_continued", compact_once)
    api.reset_counts()
    assert len(backend.observe()) == 25
    assert api.requests[("list", "pods")] == 2 + 3  # first page, expired second, then a whole list again


def test_an_image_that_cannot_be_pulled_is_the_attempts_reason(api, backend):
    backend.launch(make_spec(90, image="registry.example.com/nosuch:1"))
    api.run_until_idle(5)
    seen = by_key(backend.observe())[(90, 1)]
    assert (seen.phase, seen.reason) == (RunPhase.PENDING, "image_pull")
    # the first container to need the job's image is the identity init (init containers start first)
    assert seen.message.startswith("pod dlts-90-1-0: init container dlts-identity: ImagePullBackOff: "
                                   'Back-off pulling image "registry.example.com/nosuch:1"')


def test_garbage_collection_and_forget_remove_network_policies(api, backend):
    for job_id in (91, 92):
        backend.launch(make_spec(job_id))  # each attempt gets its own NetworkPolicy (network_policy: true)
    assert sorted(p["metadata"]["name"] for p in api.objects("networkpolicies")) == ["dlts-91-1", "dlts-92-1"]
    backend.forget(91, 1)
    assert [p["metadata"]["name"] for p in api.objects("networkpolicies")] == ["dlts-92-1"]
    api.store.remove_internal("pods", "default", "dlts-92-1-0")
    api.store.remove_internal("configmaps", "default", "dlts-92-1-endpoints")
    assert backend.collect_garbage(live=set()) == ((92, 1),)  # found by its NetworkPolicy alone
    assert api.objects("networkpolicies") == []


def test_a_log_the_node_can_no_longer_return_is_said_once_in_the_log_and_the_pods_still_go(api, backend, log_dir):
    """A real kubelet answers a log it cannot read (its container or log file gone) with HTTP 200 and
    its error as the body (measured on a real 1.20: "failed to try resolving symlinks in path
    /var/log/pods/..."). That body is no output of the job: one note, then the pod is not read again."""
    backend.launch(make_spec(8, command="sleep infinity"))
    api.kubelet.tick()
    api.print_output("dlts-8-1-0", "epoch 1")
    backend.sync_logs([(8, 1)])
    message = 'unable to retrieve container logs for containerd://0123abcd'
    api.lose_log("dlts-8-1-0", message)
    backend.sync_logs([(8, 1)])
    backend.sync_logs([(8, 1)])
    backend.forget(8, 1)
    assert stored(log_dir, 8) == (b"epoch 1\n[dlts] the rest of this output could not be read from the node: "
                                  + message.encode() + b"\n")
    assert api.pods() == []


def test_a_full_log_volume_keeps_the_output_with_the_kubelet_until_there_is_room(api, backend, log_dir, caplog):
    from tests.core.full_volume import fill, tmpfs

    with tmpfs(log_dir, "1m"):
        backend.launch(make_spec(5, command="echo before; sleep 10; echo after; exit 0"))
        api.kubelet.tick()
        backend.sync_logs([(5, 1)])
        assert stored(log_dir, 5) == b"before\n"
        filler = fill(log_dir)
        api.print_output("dlts-5-1-0", "x" * 8000)
        for _ in range(3):
            backend.sync_logs([(5, 1)])  # nothing copied, nothing raised: it waits with the kubelet
        api.run_until_idle(11)
        assert by_key(backend.observe())[(5, 1)].phase is RunPhase.SUCCEEDED
        with pytest.raises(KubernetesRefused, match="the log volume has no room for the pods' output"):
            backend.forget(5, 1)
        assert api.pods() != []  # kept, and their output with them
        filler.unlink()
        backend.forget(5, 1)
        assert api.pods() == []
        assert stored(log_dir, 5) == b"before\n" + b"x" * 8000 + b"\nafter\n"
    said = [r.getMessage() for r in caplog.records if "log volume" in r.getMessage()]
    assert len(said) == 2 and "refuses the pods' output (No space left on device)" in said[0]
    assert said[1].endswith("takes the pods' output again")
