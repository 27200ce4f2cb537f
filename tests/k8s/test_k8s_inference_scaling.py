"""Inference replica scaling on Kubernetes: the backend alone (pods per replica index, retiring
pods, observe) and end to end through the job manager (database -> core -> backend -> fake API
server -> observe)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import sqlalchemy as sa
from conftest import affinity_node, caught_up, env_of, make_spec

from dlts.backends.base import RunPhase
from dlts.models import JobEvent, JobStatus

S = JobStatus


def by_key(observed):
    return {(o.job_id, o.attempt): o for o in observed}


def names(api) -> list[str]:
    return sorted(p["metadata"]["name"] for p in api.pods())


def inference(job_id: int = 7, replicas=(0, 1, 2), nodes=("n1", "n2", "n3"), **kw):
    """An inference attempt with one replica per node; ``replicas`` their indexes."""
    return replace(make_spec(job_id, type="inference", command="sleep infinity", nodes=tuple(nodes), gpus=8, **kw),
                   replicas=tuple(replicas))


# -- the backend ----------------------------------------------------------------------------------


def test_launch_with_more_replicas_creates_only_the_new_pods_named_by_replica_index(api, backend):
    backend.launch(inference(replicas=(0,), nodes=("n1",), ports=(8080,)))
    api.kubelet.tick()
    created = api.store.created["pods"]
    backend.launch(inference(replicas=(0, 3, 4)))  # scale-up: replicas 3 and 4
    assert api.store.created["pods"] == created + 2
    assert names(api) == ["dlts-7-1-0", "dlts-7-1-3", "dlts-7-1-4"]
    pods = {p["metadata"]["name"]: p for p in api.pods()}
    new = pods["dlts-7-1-3"]
    assert affinity_node(new) == "n2" and new["metadata"]["labels"]["dlts.io/index"] == "3"
    assert new["metadata"]["labels"]["dlts.io/role"] == "replica" and env_of(new)["DLTS_REPLICA"] == "3"
    # every replica runs the endpoint supervisor (the endpoint Service selects them all)
    assert {env_of(p).get("DLTS_ENDPOINTS_DIR") for p in pods.values()} == {"/dlts-endpoints"}
    api.kubelet.tick()
    seen = by_key(backend.observe())[(7, 1)]
    assert seen.phase is RunPhase.RUNNING and seen.replicas == {0, 3, 4} and not seen.retiring


def test_removed_replicas_are_deleted_alone_and_never_make_the_attempt_gone_or_failed(api, backend):
    backend.launch(inference())
    api.kubelet.tick()
    api.reset_counts()
    backend.remove_replicas(7, 1, [1, 2], grace_s=15)
    assert api.requests[("patch", "pods")] == 2 and api.requests[("delete", "pods")] == 2
    pods = {p["metadata"]["name"]: p for p in api.pods()}
    for name in ("dlts-7-1-1", "dlts-7-1-2"):
        assert pods[name]["metadata"]["annotations"]["dlts.io/retiring"] == "scale-down"
        assert pods[name]["metadata"]["deletionGracePeriodSeconds"] == 15
    assert "deletionTimestamp" not in pods["dlts-7-1-0"]["metadata"]
    assert "dlts.io/retiring" not in pods["dlts-7-1-0"]["metadata"]["annotations"]
    # a retiring pod that ends badly while it stops is no failure of the attempt
    api.store.update_internal("pods", "default", "dlts-7-1-2", lambda o: o["status"].update(phase="Failed"))
    seen = by_key(backend.observe())[(7, 1)]
    assert (seen.phase, seen.replicas, seen.retiring) == (RunPhase.RUNNING, {0, 1, 2}, {1, 2})
    api.kubelet.tick()  # the kubelet finishes the deletions
    api.clock.advance(backend.settings.missing_after_s + 1)
    seen = by_key(backend.observe())[(7, 1)]
    assert (seen.phase, seen.replicas, seen.retiring) == (RunPhase.RUNNING, {0}, frozenset())
    assert names(api) == ["dlts-7-1-0"]
    backend.remove_replicas(7, 1, [1, 2], grace_s=15)  # again, once gone: harmless
    assert names(api) == ["dlts-7-1-0"]


def test_a_replica_failing_by_itself_fails_the_attempt(api, backend):
    backend.launch(inference(replicas=(0, 1), nodes=("n1", "n2")))
    api.kubelet.tick()
    api.store.update_internal("pods", "default", "dlts-7-1-1", lambda o: o["status"].update(phase="Failed"))
    seen = by_key(backend.observe())[(7, 1)]
    assert seen.phase is RunPhase.FAILED and "dlts-7-1-1" in seen.message


def test_a_missing_distributed_pod_still_makes_its_attempt_gone(api, backend):
    backend.launch(make_spec(50, type="distributed", nodes=("n1", "n2"), command="sleep infinity"))
    api.kubelet.tick()
    api.store.remove_internal("pods", "default", "dlts-50-1-1")
    assert (50, 1) not in by_key(backend.observe())
    api.clock.advance(backend.settings.missing_after_s + 1)
    seen = by_key(backend.observe())[(50, 1)]
    assert seen.phase is RunPhase.GONE and "1 of its 2 pods" in seen.message and seen.replicas == frozenset()


def test_garbage_collection_removes_every_replica_of_an_orphaned_attempt(api, backend):
    backend.launch(inference())
    backend.remove_replicas(7, 1, [2], grace_s=30)
    assert backend.collect_garbage([]) == ((7, 1),)
    api.kubelet.tick()
    assert api.pods() == [] and api.objects("configmaps") == []


def test_launch_spec_replica_indexes_are_checked():
    with pytest.raises(ValueError, match="2 replica indexes for 3 placements"):
        inference(replicas=(0, 1))
    with pytest.raises(ValueError, match="distinct"):
        inference(replicas=(0, 1, 1))


# -- through the job manager ------------------------------------------------------------------------


@pytest.fixture
def vision_quota() -> int:
    return 32


def events(h, job_id) -> list[tuple[str, str]]:
    with h.sessions() as s:
        return [(e.reason, e.message) for e in s.scalars(
            sa.select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "scaled").order_by(JobEvent.id))]


def rows(h, job_id) -> list[tuple[int, bool]]:
    [attempt] = h.attempts(job_id)
    return [(p["replica"], p.get("retiring", False)) for p in attempt.placements]


def test_the_manager_scales_an_inference_job_up_then_gives_its_surplus_to_non_preemptible_jobs(h):
    # three nodes busy with preemptible work of another VC: the service starts with one replica
    guests = [h.submit(user="bob", vc="spare", preemptible=True, gpus=8, command="sleep infinity") for _ in range(3)]
    h.tick()
    h.tick()
    service = h.submit(type="inference", gpus=8, min_replicas=1, max_replicas=3, command="sleep infinity")
    h.tick()
    h.tick()
    assert h.job(service).status is S.RUNNING and names(h.api) == sorted(
        [f"dlts-{g}-1-0" for g in guests] + [f"dlts-{service}-1-0"])

    # two guests end: the next pass adds replicas 1 and 2 on the nodes they left
    for g in guests[:2]:
        h.kill(g, user="bob")
    for _ in range(3):
        h.tick()
    assert rows(h, service) == [(0, False), (1, False), (2, False)]
    pods = {p["metadata"]["name"]: p for p in h.api.pods()}
    assert {f"dlts-{service}-1-1", f"dlts-{service}-1-2"} <= set(pods)
    [(reason, message)] = events(h, service)
    assert reason == "scale_up" and message.startswith("added replicas 1, 2 on ")
    assert h.job(service).status is S.RUNNING

    # two non-preemptible jobs need two whole nodes: the service's extras (started after the
    # remaining guest) make room; its replica 0 is untouched
    urgent = [h.submit(gpus=8, command="sleep 5") for _ in range(2)]
    h.manager_tick()
    assert rows(h, service) == [(0, False), (1, True), (2, True)]
    assert events(h, service)[-1][0] == "scale_down"
    pods = {p["metadata"]["name"]: p for p in h.api.pods()}
    for i in (1, 2):
        meta = pods[f"dlts-{service}-1-{i}"]["metadata"]
        assert meta["annotations"]["dlts.io/retiring"] == "scale-down" and meta.get("deletionTimestamp")
    assert not pods[f"dlts-{service}-1-0"]["metadata"].get("deletionTimestamp")
    assert not pods[f"dlts-{guests[2]}-1-0"]["metadata"].get("deletionTimestamp")
    assert {h.job(u).status for u in urgent} == {S.QUEUED}  # they wait for the replicas to exit
    h.api.reset_counts()
    caught_up(h.api, h.backend)
    h.manager_tick()  # nothing exited yet: no second patch or delete of the retiring pods
    assert h.api.requests[("patch", "pods")] == 0 and h.api.requests[("delete", "pods")] == 0
    assert {h.job(u).status for u in urgent} == {S.QUEUED}

    h.tick()  # the kubelet removes them; the manager drops them; the next pass starts the jobs
    h.tick()
    assert rows(h, service) == [(0, False)]
    assert {h.job(u).status for u in urgent} <= {S.SCHEDULING, S.RUNNING}
    job = h.job(service)
    assert (job.status, job.retries_used, job.attempt) == (S.RUNNING, 0, 1)
    assert h.job(guests[2]).status is S.RUNNING
    assert sorted(n for n in names(h.api) if n.startswith(f"dlts-{service}-")) == [f"dlts-{service}-1-0"]


def test_a_crash_between_the_scale_up_commit_and_the_create_is_finished_by_the_next_manager(h, monkeypatch):
    guest = h.submit(user="bob", vc="spare", preemptible=True, gpus=8, command="sleep infinity")
    others = [h.submit(user="bob", vc="spare", preemptible=True, gpus=8, command="sleep infinity") for _ in range(2)]
    h.tick()
    h.tick()
    service = h.submit(type="inference", gpus=8, min_replicas=1, max_replicas=2, command="sleep infinity")
    h.tick()
    h.tick()
    assert h.job(service).status is S.RUNNING
    real_launch = h.backend.launch

    def die(spec):
        if spec.job_id == service:
            raise KeyboardInterrupt  # after the commit of the new replica, before its pod
        return real_launch(spec)

    monkeypatch.setattr(h.backend, "launch", die)
    h.kill(guest, user="bob")
    h.tick()  # the guest's pod goes
    with pytest.raises(KeyboardInterrupt):
        h.tick()
    assert rows(h, service) == [(0, False), (1, False)]
    assert f"dlts-{service}-1-1" not in names(h.api)
    h.restart()
    h.tick()  # the new manager sees replica 1 in the row but not in the cluster: creates it
    assert f"dlts-{service}-1-1" in names(h.api)
    h.tick()
    assert h.job(service).status is S.RUNNING and all(h.job(o).status is S.RUNNING for o in others)


def test_replicas_the_cluster_refuses_are_dropped_and_the_job_keeps_running(h):
    guest = h.submit(user="bob", vc="spare", preemptible=True, gpus=8, command="sleep infinity")
    for _ in range(2):
        h.submit(user="bob", vc="spare", preemptible=True, gpus=8, command="sleep infinity")
    h.tick()
    h.tick()
    service = h.submit(type="inference", gpus=8, min_replicas=1, max_replicas=2, command="sleep infinity")
    h.tick()
    h.tick()
    h.kill(guest, user="bob")
    h.tick()  # the guest's pod goes; the manager records it killed
    h.api.fail_next(1, 403, verbs={"create"})  # e.g. a ResourceQuota of the namespace says no
    h.tick()  # the scale-up is decided and refused
    reasons = [r for r, _ in events(h, service)]
    assert reasons == ["scale_up", "launch_error"]
    assert rows(h, service) == [(0, False), (1, True)]
    job = h.job(service)
    assert (job.status, job.retries_used) == (S.RUNNING, 0)
    h.tick()  # nothing of replica 1 exists: it leaves the row; a later pass adds it again
    h.tick()
    assert rows(h, service) == [(0, False), (1, False)]
    assert f"dlts-{service}-1-1" in names(h.api)
