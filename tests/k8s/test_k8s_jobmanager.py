"""End to end through the job manager: database -> scheduler core -> KubernetesBackend ->
official client -> fake API server (whose kubelet runs the pods) -> observe -> job transitions.

Jobs are submitted with the same service the REST API calls; ticks are driven by the test and the
fake clock is shared by the manager, the backend and the fake kubelet.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from conftest import affinity_node, env_of

from dlts.models import Job, JobStatus

S = JobStatus


def test_a_job_runs_and_finishes(h):
    job_id = h.submit(command="sleep 10; exit 0", gpus=2)
    h.tick()
    assert h.job(job_id).status is S.SCHEDULING
    [pod] = h.api.pods()
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    h.tick()
    assert h.job(job_id).status is S.RUNNING
    h.tick(11)
    job = h.job(job_id)
    assert (job.status, job.exit_code) == (S.FINISHED, 0)
    assert h.api.pods() == []  # forgotten once recorded


def test_a_distributed_job_gets_one_pod_per_node_with_rank_env(h):
    job_id = h.submit(type="distributed", nodes=2, gpus=8, command="sleep 5")
    h.tick()
    pods = sorted(h.api.pods(), key=lambda p: p["metadata"]["labels"]["dlts.io/index"])
    assert len(pods) == 2 and len({affinity_node(p) for p in pods}) == 2
    envs = [env_of(p) for p in pods]
    assert [e["RANK"] for e in envs] == ["0", "8"] and {e["WORLD_SIZE"] for e in envs} == {"16"}
    assert {e["MASTER_ADDR"] for e in envs} == {f"dlts-{job_id}-1-0.dlts-{job_id}-1.default.svc"}
    h.tick()
    h.tick(6)
    assert h.job(job_id).status is S.FINISHED
    assert h.api.pods() == [] and h.api.objects("services") == []


def test_a_failing_job_is_retried_then_fails(h):
    job_id = h.submit(command="sleep 1; exit 3", max_retries=1)
    h.tick()
    h.tick(2)
    job = h.job(job_id)  # requeued and started again in the same tick, as attempt 2
    assert (job.status, job.retries_used, job.attempt) == (S.SCHEDULING, 1, 2)
    h.tick(2)
    job = h.job(job_id)
    assert (job.status, job.exit_code) == (S.FAILED, 3)
    assert [a.exit_code for a in h.attempts(job_id)] == [3, 3]


def test_kill_terminates_with_grace(h):
    job_id = h.submit(command="sleep infinity")
    h.tick()
    h.tick()
    h.kill(job_id)
    h.api.reset_counts()
    h.manager_tick()  # carries out the kill: delete with the grace period
    [pod] = h.api.pods()
    assert pod["metadata"]["deletionGracePeriodSeconds"] == int(h.settings.preempt_grace_s)
    assert h.job(job_id).status is S.KILLING
    h.tick()  # the kubelet stops it; the manager sees it gone
    h.manager_tick()
    assert h.job(job_id).status is S.KILLED


def test_preemption_requeues_the_preemptible_job(h):
    spare = [h.submit(user="bob", vc="spare", preemptible=True, gpus=8, command="sleep infinity") for _ in range(4)]
    h.tick()
    h.tick()
    assert {h.job(j).status for j in spare} == {S.RUNNING}
    urgent = h.submit(gpus=8, command="sleep 5")
    for _ in range(4):
        h.tick()
    statuses = {j: h.job(j).status for j in spare}
    preempted = [j for j, st in statuses.items() if st is S.QUEUED]
    assert len(preempted) == 1, statuses
    # (the job's reason has since become the scheduler's wait reason; the attempt keeps why it ended)
    assert h.attempts(preempted[0])[0].end_reason == "preempted"
    assert h.job(urgent).status in (S.SCHEDULING, S.RUNNING)


def test_node_lost_requeues_at_the_head_without_spending_a_retry(h):
    job_id = h.submit(command="sleep infinity", gpus=8)
    h.tick()
    h.tick()
    before = h.job(job_id)
    node = h.attempts(job_id)[0].placements[0]["node"]
    h.api.set_node_ready(node, False, status="Unknown")
    h.api.clock.advance(30)
    h.manager_tick()
    assert h.job(job_id).status is S.RUNNING  # a short blip is not a loss
    h.api.clock.advance(31)
    h.manager_tick()  # attempt 1 ends node_lost; the job goes back to the head and restarts elsewhere
    job = h.job(job_id)
    first, second = h.attempts(job_id)
    assert first.end_reason == "node_lost" and first.spends_retry is False
    assert job.retries_used == before.retries_used
    assert job.queue_time == before.queue_time  # keeps its place: head of the queue
    assert second.placements[0]["node"] != node  # the lost node is not ready
    assert job.status is S.SCHEDULING
    assert [affinity_node(p) for p in h.api.pods()] == [second.placements[0]["node"]]  # old pod forced out


def objects_created(api) -> dict[str, int]:
    return {k: api.store.created[k] for k in ("pods", "services", "secrets")}


def test_a_restart_between_create_and_observe_creates_nothing_twice(h):
    job_id = h.submit(type="distributed", nodes=2, gpus=8, command="sleep 5", ssh=True)
    h.manager_tick()  # decides and creates the objects, then "crashes" before observing
    created = objects_created(h.api)
    assert created["pods"] == 2 and created["services"] == 1
    h.restart()
    h.tick()
    h.tick()
    assert objects_created(h.api) == created
    assert h.job(job_id).status is S.RUNNING
    h.tick(6)
    assert h.job(job_id).status is S.FINISHED


def test_a_crash_in_the_middle_of_a_launch_is_completed_without_duplicates(h, monkeypatch):
    job_id = h.submit(type="distributed", nodes=2, gpus=8, command="sleep 5")
    real_create = h.backend.api.create

    def create_then_die(kind, namespace, doc, **kw):
        if kind == "Pod" and doc["metadata"]["name"].endswith("-1"):
            raise KeyboardInterrupt  # the process dies after rank 0's pod, before rank 1's
        return real_create(kind, namespace, doc, **kw)

    monkeypatch.setattr(h.backend.api, "create", create_then_die)
    with pytest.raises(KeyboardInterrupt):
        h.manager_tick()
    assert [p["metadata"]["name"] for p in h.api.pods()] == [f"dlts-{job_id}-1-0"]
    h.restart()
    h.tick()  # the half-made attempt is not reported, so the manager launches it again
    assert sorted(p["metadata"]["name"] for p in h.api.pods()) == [f"dlts-{job_id}-1-0", f"dlts-{job_id}-1-1"]
    assert objects_created(h.api)["pods"] == 2
    h.tick()
    h.tick(6)
    assert h.job(job_id).status is S.FINISHED


def test_a_crash_before_the_create_is_finished_by_the_next_manager(h, monkeypatch):
    job_id = h.submit(command="sleep 1")

    def crash(spec):
        raise KeyboardInterrupt  # the process dies after writing SCHEDULING, before any create

    monkeypatch.setattr(h.backend, "launch", crash)
    with pytest.raises(KeyboardInterrupt):
        h.manager_tick()
    assert h.job(job_id).status is S.SCHEDULING and h.api.pods() == []
    h.restart()
    h.tick()
    assert len(h.api.pods()) == 1
    h.tick(2)
    assert h.job(job_id).status is S.FINISHED


def test_orphan_objects_are_removed(h):
    from dlts.backends.base import EndpointSpec, RegistryCredential
    from tests.k8s.conftest import make_spec

    key = "ssh-rsa AAAAB3Nz x"
    h.backend.launch(make_spec(999, command="sleep infinity", ssh_public_keys=(key,),
                               registry_credentials=(RegistryCredential("registry.example.com", "x", "y"),)))
    h.backend.expose(999, 1, [EndpointSpec(5, "ssh", 22)], (key,))
    assert h.api.objects("secrets") and h.api.objects("services") and h.api.objects("configmaps")
    h.tick()  # the manager sees a pod no live attempt explains, stops it, and collects its objects
    h.tick()
    assert h.api.pods() == []
    assert h.api.objects("secrets") == [] and h.api.objects("services") == [] and h.api.objects("configmaps") == []
    with h.sessions() as s:
        live = {(j.id, j.attempt) for j in s.scalars(sa.select(Job).where(Job.status.in_([S.SCHEDULING, S.RUNNING])))}
    assert h.backend.collect_garbage(live) == ()  # nothing left for a second pass


def test_an_api_outage_loses_no_state(h):
    job_id = h.submit(command="sleep 3")
    h.tick()
    h.tick()
    h.api.fail_next(1, 503)
    h.manager_tick()  # the tick is skipped with a warning, not crashed, and writes nothing
    assert h.job(job_id).status is S.RUNNING
    h.tick(4)
    assert h.job(job_id).status is S.FINISHED


def test_a_transient_error_during_launch_is_retried_not_fatal(h):
    job_id = h.submit(command="sleep 1")
    h.api.fail_next(1, 503, verbs={"create"})
    h.manager_tick()
    h.api.clock.advance(5)
    h.tick()
    assert h.job(job_id).status in (S.SCHEDULING, S.RUNNING)


def test_hostile_job_fields_stay_data_and_grant_nothing(h):
    evil = 'x"\n  hostNetwork: true\nprivileged: true\n---\nkind: Pod\n{{ 7*7 }}'
    job_id = h.submit(command="echo " + evil, env={"NOTE": evil}, name=evil[:60])
    h.tick()
    [pod] = h.api.pods()
    env = env_of(pod)
    assert env["DLTS_COMMAND"] == "echo " + evil and env["NOTE"] == evil
    assert not {"hostNetwork", "hostIPC", "hostPID"} & set(pod["spec"])
    assert pod["spec"]["containers"][0]["securityContext"] == {"privileged": False, "allowPrivilegeEscalation": False,
                                                               "capabilities": {"drop": ["ALL"]}}
    assert not any("hostPath" in v for v in pod["spec"]["volumes"])
    assert h.job(job_id).status is S.SCHEDULING


def test_a_job_overriding_rank_env_is_refused_with_the_reason(h):
    job_id = h.submit(type="distributed", nodes=2, gpus=8, env={"MASTER_ADDR": "attacker.example.com"})
    h.tick()
    job = h.job(job_id)
    assert job.status is S.ERROR
    assert "MASTER_ADDR is set by DLTS" in job.reason_detail
    assert h.api.pods() == []


def test_endpoints_are_exposed_changed_and_taken_down_end_to_end(h):
    """Submit with ssh and a port, open Jupyter, close the port, kill: rows -> job manager -> expose ->
    Service and ConfigMap in the cluster -> states back in the rows."""
    import hashlib

    from dlts.models import User
    from dlts.services import endpoints as endpoint_service
    from dlts.services import ssh_keys
    from dlts.services.auth import principal_for

    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq2J1zC0uFhv1d0lR6FfSxSJp8kQyWbWk0zGmQyQ7v7 alice@laptop"

    def alice(s):
        return principal_for(s, s.scalar(sa.select(User).where(User.name == "alice")))

    with h.sessions() as s:
        ssh_keys.add_key(s, alice(s), key)
    job_id = h.submit(command="sleep infinity", ssh=True, ports=[6006])
    h.tick()
    h.tick()  # running; the same tick exposes its endpoints
    assert h.job(job_id).status is S.RUNNING

    def views():
        with h.sessions() as s:
            return {v.name: v for v in endpoint_service.list_endpoints(s, alice(s), job_id)}

    def service_ports():
        [svc] = [x for x in h.api.objects("services") if x["metadata"]["name"] == f"dlts-{job_id}-1-ep"]
        return {p["name"]: p["nodePort"] for p in svc["spec"]["ports"]}

    def configmap():
        [cm] = h.api.objects("configmaps")
        return cm["data"]

    seen = views()
    node = h.attempts(job_id)[0].placements[0]["node"]
    ip = next(a["address"] for a in h.api.store.get("nodes", "", node)["status"]["addresses"] if a["type"] == "InternalIP")
    ports = service_ports()
    ssh_port = ports[f"e{seen['ssh'].id}"]
    assert (seen["ssh"].status, seen["ssh"].host, seen["ssh"].host_port) == ("ready", ip, ssh_port)
    assert seen["ssh"].url == f"ssh://alice@{ip}:{ssh_port}"
    assert seen["port-6006"].status == "ready"
    assert configmap()["endpoints"] == f"{seen['ssh'].id} ssh 22\n{seen['port-6006'].id} port 6006\n"
    assert configmap()["authorized_keys"] == key + "\n"

    with h.sessions() as s:
        jupyter, token = endpoint_service.open_endpoint(s, alice(s), job_id, "jupyter")
        endpoint_service.close_endpoint(s, alice(s), job_id, seen["port-6006"].id)
    h.tick()
    now = views()
    assert set(now) == {"ssh", "jupyter"} and now["jupyter"].status == "ready"
    assert service_ports() == {f"e{seen['ssh'].id}": ssh_port,
                               f"e{jupyter.id}": now["jupyter"].host_port}
    assert f"{jupyter.id} jupyter 8888 {hashlib.sha256(token.encode()).hexdigest()}\n" in configmap()["endpoints"]

    h.kill(job_id)
    h.tick()
    h.tick()
    assert h.job(job_id).status is S.KILLED
    assert h.api.objects("services") == [] and h.api.objects("configmaps") == []
    assert {v.status for v in views().values()} == {"closed"}


def _submit_image(h, image: str, **kw) -> int:
    from dlts.models import User
    from dlts.services import jobs as job_service
    from dlts.services.auth import principal_for

    with h.sessions() as s:
        principal = principal_for(s, s.scalar(sa.select(User).where(User.name == "alice")))
        req = job_service.JobRequest(vc="vision", image=image, command="sleep 10", gpus=1, **kw)
        return job_service.submit(s, h.settings, principal, req).id


def test_an_image_that_cannot_be_pulled_shows_as_the_reason_and_ends_after_the_start_timeout(h):
    h.settings = h.settings.model_copy(update={"start_timeout_s": 60.0})
    h.manager.settings = h.settings
    job_id = _submit_image(h, "registry.example.com/nobody/missing:1", max_retries=1)
    h.tick()  # started: the pod is created
    h.tick()  # the kubelet cannot pull it; this tick shows why
    job = h.job(job_id)
    assert job.status is S.SCHEDULING and job.reason == "image_pull"
    assert "ErrImagePull" in job.reason_detail or "ImagePullBackOff" in job.reason_detail
    h.tick(10)
    h.tick(10)
    assert h.job(job_id).reason == "image_pull"
    h.tick(45)  # past start_timeout_s: the attempt ends with its reason and spends the retry
    job = h.job(job_id)
    assert (job.status, job.attempt, job.retries_used) == (S.SCHEDULING, 2, 1)  # requeued, started again
    first = h.attempts(job_id)[0]
    assert (first.end_reason, first.spends_retry) == ("start_timeout", True)
    h.tick()
    h.tick(61)
    job = h.job(job_id)
    assert (job.status, job.reason) == (S.FAILED, "start_timeout")
    assert job.reason_detail.startswith("image_pull: pod dlts-")
    assert h.api.pods() == []  # its resources are free
    with h.sessions() as s:
        from dlts.models import JobEvent

        reasons = s.scalars(sa.select(JobEvent.reason).where(JobEvent.job_id == job_id, JobEvent.kind == "reason")
                            .order_by(JobEvent.id)).all()
    assert reasons == ["image_pull", "image_pull"]  # once per attempt, not once per tick


def test_a_lost_nodes_log_is_not_waited_for_and_the_log_says_what_went_with_the_node(h, log_dir):
    """The kubelet of a lost node cannot serve the last moments of output (the API server answers 500,
    measured on a real cluster: "dial tcp ...: connection refused"). The job is requeued and the old
    pod deleted anyway; the log keeps what was copied while it ran and one line for the rest."""
    from dlts.logstore import iter_log

    job_id = h.submit(command="sleep infinity", gpus=8)
    h.tick()
    h.tick()
    h.api.print_output(f"dlts-{job_id}-1-0", "step 1", namespace="default")
    h.backend.sync_logs([(job_id, 1)])  # copied while it runs, as every log_sync_s
    node = h.attempts(job_id)[0].placements[0]["node"]
    h.api.set_node_ready(node, False, status="Unknown")
    h.api.fail_next(10_000, 500, verbs={"log"}, resources={"pods"})  # its kubelet cannot be reached
    h.api.clock.advance(61)
    h.manager_tick()
    first, _second = h.attempts(job_id)
    assert first.end_reason == "node_lost"
    assert [p["metadata"]["name"] for p in h.api.pods()] == [f"dlts-{job_id}-2-0"]  # the old pod did not wait
    text = b"".join(iter_log(log_dir, job_id, 1, key=first.log_key)).decode()
    assert text.startswith("step 1\n[dlts] the rest of this output could not be read from the node: node ")
    assert "Ready=Unknown" in text
