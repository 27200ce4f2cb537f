"""Every job type runs as real pods to its end, and its log is what the portal shows.

batch, distributed (a gang of two pods, one per node), inference (two replicas, one log with the
second replica's lines prefixed ``[1] ``, serving a port: the kubelet's readiness probe keeps each
replica out of the endpoint until it listens) and interactive (a port endpoint, exposed as a real
NodePort Service). Each job's history records the image as the kubelet's runtime resolved it.
The portal is the app over the same database and log store, signed in as the job's owner through
its login form. The backend keeps the pods by a watch here.
"""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa
from werkzeug.security import generate_password_hash

from dlts.models import JobEndpoint, User
from tests.k8s.real.conftest import NAMESPACE

pytestmark = [pytest.mark.kube, pytest.mark.slow]

PASSWORD = "alice-portal-password"
WAIT = "while [ ! -e /tmp/go ]; do sleep 0.2; done"
# an inference replica starts serving (busybox httpd) only when told, as a model server does once loaded
SERVE = "while [ ! -e /tmp/serve ]; do sleep 0.2; done; httpd -f -p 8800 -h /tmp & server=$!; "
JOBS = {
    "batch": ({"gpus": 1}, "echo batch says hi; " + WAIT, ["batch says hi"]),
    "distributed": ({"nodes": 2, "gpus": 8}, "echo rank $RANK of $WORLD_SIZE; " + WAIT,
                    ["rank 0 of 16", "[1] rank 8 of 16"]),
    "inference": ({"gpus": 1, "min_replicas": 2, "max_replicas": 2, "ports": (8800,)},
                  "echo replica $DLTS_REPLICA; " + SERVE + WAIT + "; kill $server", ["replica 0", "[1] replica 1"]),
    "interactive": ({"gpus": 1, "ports": (8800,)}, "echo serving on 8800; " + WAIT, ["serving on 8800"]),
}


def job_lines(log: str) -> list[str]:
    """The job's own lines, sorted: without the endpoint supervisor's (``dlts-endpoints: ...``, in a job
    with a port endpoint once the kubelet has filled the endpoint ConfigMap in, which may take a minute)."""
    return sorted(line for line in log.splitlines() if not re.match(r"(\[\d+\] )?dlts-endpoints: ", line))


@pytest.fixture
def kubernetes_section():
    """These run with the pod watch (``kubernetes.watch``); the other modules list pods every tick."""
    return {"watch": True}


def portal_log(client, job_id: int) -> str:
    page = client.get("/login").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    signed_in = client.post("/login", data={"username": "alice", "password": PASSWORD, "csrf_token": token})
    assert signed_in.status_code == 302
    answer = client.get(f"/jobs/{job_id}/log.json?tail=65536")
    assert answer.status_code == 200, answer.get_data(as_text=True)
    return str(answer.get_json()["data"])


@pytest.mark.parametrize("kind", list(JOBS))
def test_every_job_type_runs_as_real_pods_to_its_end_with_its_log_in_the_portal(deployed, client, kind):
    with deployed.sessions() as s:
        s.execute(sa.update(User).where(User.name == "alice")
                  .values(password_hash=generate_password_hash(PASSWORD, method="scrypt:1024:8:1")))
        s.commit()
    fields, command, expected = JOBS[kind]
    job_id = deployed.submit(command, type=kind, **fields)
    pods_wanted = 2 if kind in ("inference", "distributed") else 1
    deployed.tick_until(f"the {kind} job runs with every line of its start in the log", lambda: (
        deployed.status(job_id) == "running"
        and job_lines(deployed.log(job_id)) == sorted(expected)))
    pods = deployed.pods(job_id)
    assert len(pods) == pods_wanted and {p["status"]["phase"] for p in pods} == {"Running"}
    # the job's history says what its image reference meant on the node: the runtime's imageID
    [ran] = {cs["imageID"] for p in pods for cs in p["status"]["containerStatuses"] if cs["name"] == "job"}
    assert ran and [e.message for e in deployed.events(job_id, "image")] == [
        f"attempt 1: {deployed.shell_image} is {ran}"]
    if kind == "interactive":
        service = deployed.tick_until("the endpoint Service is made", lambda: deployed.cluster.request(
            "GET", f"/api/v1/namespaces/{NAMESPACE}/services/dlts-{job_id}-1-ep"))
        [port] = service["spec"]["ports"]
        assert (port["port"], port["targetPort"], service["spec"]["type"]) == (8800, 8800, "NodePort")
        deployed.tick_until("the endpoint is ready at the Service's node port", lambda: _endpoint(deployed, job_id) ==
                            ("ready", port["nodePort"]))
    if kind == "inference":
        _serves_only_once_its_replicas_listen(deployed, job_id, pods)
    for pod in pods:
        deployed.cluster.exec_in(NAMESPACE, pod["metadata"]["name"], "job", ["/bin/touch", "/tmp/go"])
    deployed.tick_until(f"the {kind} job ends", lambda: deployed.ended(job_id))
    assert deployed.status(job_id) == "finished", deployed.summary()
    assert deployed.pods(job_id) == []
    assert job_lines(portal_log(client, job_id)) == sorted(expected)


def _serves_only_once_its_replicas_listen(deployed, job_id: int, pods: list[dict]) -> None:
    """Running replicas that do not listen on the declared port are not Ready (the readiness probe
    DLTS renders), so the port endpoint waits; once they listen the kubelet marks them Ready and the
    endpoint is ready at the Service's node port."""
    assert [_ready(p) for p in pods] == [False, False], [p["status"].get("conditions") for p in pods]
    deployed.tick_until("the endpoint waits for a replica to pass its readiness probe", lambda: (
        _endpoint(deployed, job_id)[0] == "pending" and "readiness probe" in _endpoint_message(deployed, job_id)))
    for pod in pods:
        deployed.cluster.exec_in(NAMESPACE, pod["metadata"]["name"], "job", ["/bin/touch", "/tmp/serve"])
    deployed.tick_until("both replicas pass their readiness probe", lambda: [
        _ready(p) for p in deployed.pods(job_id)] == [True, True])
    service = deployed.cluster.request("GET", f"/api/v1/namespaces/{NAMESPACE}/services/dlts-{job_id}-1-ep")
    [port] = service["spec"]["ports"]
    assert "dlts.io/index" not in service["spec"]["selector"]  # every replica serves
    deployed.tick_until("the endpoint is ready at the Service's node port", lambda: _endpoint(deployed, job_id) ==
                        ("ready", port["nodePort"]))


def _ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


def _endpoint(deployed, job_id: int) -> tuple[str, int | None]:
    with deployed.sessions() as s:
        [endpoint] = s.scalars(sa.select(JobEndpoint).where(JobEndpoint.job_id == job_id)).all()
        return endpoint.status.value, endpoint.host_port


def _endpoint_message(deployed, job_id: int) -> str:
    with deployed.sessions() as s:
        [endpoint] = s.scalars(sa.select(JobEndpoint).where(JobEndpoint.job_id == job_id)).all()
        return endpoint.message or ""
