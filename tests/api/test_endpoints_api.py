"""Job endpoints through the API: open (ssh, jupyter, vscode, port), list, close; the refusals; how a
row reads as the job runs, runs again and ends; the rows a submission makes; the one-time token.

The job manager's part (pending -> ready, with host and port) is simulated by writing the row the
way it does, so each reading rule is proven on its own.
"""

from __future__ import annotations

import hashlib

import pytest
import sqlalchemy as sa

from dlts.models import EndpointStatus, Job, JobEndpoint, JobEvent, JobStatus

from .helpers import assert_envelope, make_job, ssh_public_key

JOB = {"vc": "vision", "image": "debian:12", "command": "true"}


def url(job_id: int, endpoint_id: int | None = None) -> str:
    return f"/api/v1/jobs/{job_id}/endpoints" + (f"/{endpoint_id}" if endpoint_id is not None else "")


def add_key(client, world, user: str = "alice") -> None:
    response = client.post("/api/v1/me/ssh-keys", json={"public_key": ssh_public_key()}, headers=world.auth(user))
    assert response.status_code == 201, response.get_json()


def rows(sessions, job_id: int) -> list[JobEndpoint]:
    with sessions() as s:
        found = list(s.scalars(sa.select(JobEndpoint).where(JobEndpoint.job_id == job_id).order_by(JobEndpoint.id)))
        s.expunge_all()
        return found


def expose(sessions, endpoint_id: int, *, attempt: int, status=EndpointStatus.READY, host="10.0.0.7", host_port=31022,
           message=None) -> None:
    """What the job manager writes once the backend has exposed an endpoint."""
    with sessions() as s:
        s.execute(sa.update(JobEndpoint).where(JobEndpoint.id == endpoint_id).values(
            status=status, attempt=attempt, host=host, host_port=host_port, message=message))
        s.commit()


def set_job(sessions, job_id: int, **values) -> None:
    with sessions() as s:
        s.execute(sa.update(Job).where(Job.id == job_id).values(**values))
        s.commit()


def test_ssh_needs_an_ssh_key_of_the_owner_then_opens_pending_on_port_22(client, world, sessions, settings):
    job_id = make_job(sessions, settings, "alice", status=JobStatus.RUNNING)
    error = assert_envelope(client.post(url(job_id), json={"kind": "ssh"}, headers=world.auth("alice")), 422, "no_ssh_key")
    assert "POST /api/v1/me/ssh-keys" in error["message"] and "SSH keys page" in error["message"]
    # a VC admin opening it for alice is told that it is the owner's key that is missing
    error = assert_envelope(client.post(url(job_id), json={"kind": "ssh"}, headers=world.auth("vcadmin")), 422, "no_ssh_key")
    assert "owner alice has no SSH key" in error["message"]
    assert rows(sessions, job_id) == []
    add_key(client, world)
    response = client.post(url(job_id), json={"kind": "ssh"}, headers=world.auth("alice"))
    assert response.status_code == 201, response.get_json()
    body = response.get_json()
    assert {k: body[k] for k in ("job_id", "kind", "name", "port", "status", "host", "host_port", "url", "created_by")} == {
        "job_id": job_id, "kind": "ssh", "name": "ssh", "port": 22, "status": "pending", "host": None, "host_port": None,
        "url": None, "created_by": "alice"}
    assert "token" not in body and body["created_at"].endswith("Z")
    listed = client.get(url(job_id), headers=world.auth("alice")).get_json()
    assert listed["next_cursor"] is None and [e["id"] for e in listed["items"]] == [body["id"]]
    with sessions() as s:
        event = s.scalars(sa.select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "endpoint")).one()
        assert event.actor == "alice" and "ssh endpoint 'ssh'" in event.message


@pytest.mark.parametrize("kind,port", [("jupyter", 8888), ("vscode", 8080)])
def test_jupyter_and_vscode_answer_their_token_once_and_store_only_its_hash(client, world, sessions, settings, kind, port):
    job_id = make_job(sessions, settings, "alice", status=JobStatus.QUEUED)
    body = client.post(url(job_id), json={"kind": kind}, headers=world.auth("alice")).get_json()
    assert body["port"] == port and body["name"] == kind and body["status"] == "pending"
    token = body["token"]
    assert len(token) >= 32
    [row] = rows(sessions, job_id)
    assert row.secret_hash == hashlib.sha256(token.encode()).hexdigest() and token not in repr(row.__dict__)
    for path in (url(job_id), f"/api/v1/jobs/{job_id}"):
        assert token not in client.get(path, headers=world.auth("alice")).get_data(as_text=True)
    assert "token" not in client.get(url(job_id), headers=world.auth("alice")).get_json()["items"][0]


def test_port_endpoints_take_a_port_named_by_default_and_refuse_duplicates(client, world, sessions, settings):
    job_id = make_job(sessions, settings, "alice", status=JobStatus.RUNNING)
    auth = world.auth("alice")
    assert_envelope(client.post(url(job_id), json={"kind": "port"}, headers=auth), 400)
    body = client.post(url(job_id), json={"kind": "port", "port": 6006}, headers=auth).get_json()
    assert (body["name"], body["port"], "token" in body) == ("port-6006", 6006, False)
    named = client.post(url(job_id), json={"kind": "port", "port": 5000, "name": "tensorboard"}, headers=auth).get_json()
    assert named["name"] == "tensorboard"
    error = assert_envelope(client.post(url(job_id), json={"kind": "port", "port": 6006, "name": "again"}, headers=auth),
                            409, "endpoint_exists")
    assert "port 6006" in error["message"] and error["details"]["field"] == "port"
    error = assert_envelope(client.post(url(job_id), json={"kind": "port", "port": 7000, "name": "tensorboard"}, headers=auth),
                            409, "endpoint_exists")
    assert "named 'tensorboard'" in error["message"]
    # jupyter's fixed port is taken by a port endpoint on 8888: the same port twice is refused too
    client.post(url(job_id), json={"kind": "port", "port": 8888}, headers=auth)
    assert_envelope(client.post(url(job_id), json={"kind": "jupyter"}, headers=auth), 409, "endpoint_exists")
    assert len(rows(sessions, job_id)) == 3


def test_at_most_eight_endpoints_per_job_closing_ones_included(client, world, sessions, settings):
    job_id = make_job(sessions, settings, "alice", status=JobStatus.RUNNING)
    auth = world.auth("alice")
    ids = [client.post(url(job_id), json={"kind": "port", "port": 9000 + i}, headers=auth).get_json()["id"] for i in range(8)]
    error = assert_envelope(client.post(url(job_id), json={"kind": "jupyter"}, headers=auth), 422, "too_many_endpoints")
    assert "at most 8" in error["message"] and "Close one first" in error["message"]
    assert client.delete(url(job_id, ids[0]), headers=auth).status_code == 202
    error = assert_envelope(client.post(url(job_id), json={"kind": "jupyter"}, headers=auth), 422, "too_many_endpoints")
    assert "1 of them closing" in error["message"]
    with sessions() as s:  # the job manager removed the closing one
        s.execute(sa.delete(JobEndpoint).where(JobEndpoint.id == ids[0]))
        s.commit()
    assert client.post(url(job_id), json={"kind": "jupyter"}, headers=auth).status_code == 201
    assert len(client.get(url(job_id), headers=auth).get_json()["items"]) == 8


def test_endpoints_of_ended_jobs_cannot_be_opened_or_closed_and_read_closed(client, world, sessions, settings):
    job_id = make_job(sessions, settings, "alice", status=JobStatus.RUNNING)
    auth = world.auth("alice")
    endpoint = client.post(url(job_id), json={"kind": "port", "port": 8000}, headers=auth).get_json()
    expose(sessions, endpoint["id"], attempt=1, host_port=30800)
    assert client.get(url(job_id), headers=auth).get_json()["items"][0]["status"] == "ready"
    set_job(sessions, job_id, status=JobStatus.FINISHED)
    error = assert_envelope(client.post(url(job_id), json={"kind": "port", "port": 8001}, headers=auth), 409, "job_ended")
    assert "finished" in error["message"]
    assert_envelope(client.delete(url(job_id, endpoint["id"]), headers=auth), 409, "job_ended")
    [item] = client.get(url(job_id), headers=auth).get_json()["items"]
    assert (item["status"], item["host"], item["host_port"], item["url"]) == ("closed", None, None, None)
    set_job(sessions, job_id, status=JobStatus.KILLING)  # on its way out: nothing new, and nothing reachable
    assert_envelope(client.post(url(job_id), json={"kind": "port", "port": 8001}, headers=auth), 409, "job_ended")
    assert client.get(url(job_id), headers=auth).get_json()["items"][0]["status"] == "closed"


def test_an_address_belongs_to_the_attempt_that_runs_now(client, world, sessions, settings):
    job_id = make_job(sessions, settings, "alice", status=JobStatus.RUNNING)
    add_key(client, world)
    auth = world.auth("alice")
    ssh = client.post(url(job_id), json={"kind": "ssh"}, headers=auth).get_json()
    web = client.post(url(job_id), json={"kind": "port", "port": 8080}, headers=auth).get_json()
    expose(sessions, ssh["id"], attempt=1, host="10.0.0.7", host_port=31022)
    expose(sessions, web["id"], attempt=1, host="fd00::7", host_port=30080)
    items = {e["kind"]: e for e in client.get(url(job_id), headers=auth).get_json()["items"]}
    assert items["ssh"]["status"] == "ready" and items["ssh"]["url"] == "ssh://alice@10.0.0.7:31022"
    assert (items["ssh"]["host"], items["ssh"]["host_port"]) == ("10.0.0.7", 31022)
    assert items["port"]["url"] == "http://[fd00::7]:30080/"
    # GET job (full visibility) carries the same list
    assert client.get(f"/api/v1/jobs/{job_id}", headers=auth).get_json()["endpoints"] == list(items.values())
    # the job is requeued (node lost) and runs again as attempt 2: the old address is not shown
    set_job(sessions, job_id, status=JobStatus.QUEUED)
    queued = client.get(url(job_id), headers=auth).get_json()["items"]
    assert {(e["status"], e["host"], e["url"]) for e in queued} == {("pending", None, None)}
    set_job(sessions, job_id, status=JobStatus.RUNNING, attempt=2)
    again = client.get(url(job_id), headers=auth).get_json()["items"]
    assert {(e["status"], e["host"], e["host_port"], e["url"]) for e in again} == {("pending", None, None, None)}
    expose(sessions, ssh["id"], attempt=2, status=EndpointStatus.FAILED, host=None, host_port=None,
           message="sshd is not installed in the image")
    failed = client.get(url(job_id), headers=auth).get_json()["items"][0]
    assert (failed["status"], failed["message"], failed["url"]) == ("failed", "sshd is not installed in the image", None)


def test_close_marks_closing_idempotently_and_unknown_ids_are_404(client, world, sessions, settings):
    job_id = make_job(sessions, settings, "alice", status=JobStatus.RUNNING)
    other = make_job(sessions, settings, "alice", status=JobStatus.RUNNING)
    auth = world.auth("alice")
    endpoint = client.post(url(job_id), json={"kind": "port", "port": 8000}, headers=auth).get_json()
    expose(sessions, endpoint["id"], attempt=1)
    for _ in range(2):
        response = client.delete(url(job_id, endpoint["id"]), headers=auth)
        assert response.status_code == 202
        body = response.get_json()
        assert (body["status"], body["url"]) == ("closing", None)
    [row] = rows(sessions, job_id)
    assert row.status is EndpointStatus.CLOSING and row.host == "10.0.0.7"  # the job manager still needs the address
    assert_envelope(client.delete(url(job_id, 99999999), headers=auth), 404, "endpoint_not_found")
    assert_envelope(client.delete(url(other, endpoint["id"]), headers=auth), 404, "endpoint_not_found")
    assert_envelope(client.delete(url(99999999, endpoint["id"]), headers=auth), 404, "job_not_found")
    with sessions() as s:
        closed = s.scalars(sa.select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.reason == "closed")).all()
        assert len(closed) == 1 and closed[0].actor == "alice"


def test_only_owner_and_admins_reach_endpoints_and_members_see_no_list_in_the_job(client, world, sessions, settings):
    job_id = make_job(sessions, settings, "alice", status=JobStatus.RUNNING)
    client.post(url(job_id), json={"kind": "port", "port": 8000}, headers=world.auth("alice"))
    error = assert_envelope(client.get(url(job_id), headers=world.auth("bob")), 403)
    assert "Only the job's owner (alice)" in error["message"]
    assert_envelope(client.post(url(job_id), json={"kind": "port", "port": 8001}, headers=world.auth("bob")), 403)
    assert_envelope(client.get(url(job_id), headers=world.auth("carol")), 404, "job_not_found")
    public = client.get(f"/api/v1/jobs/{job_id}", headers=world.auth("bob")).get_json()
    assert public["visibility"] == "public" and "endpoints" not in public
    for admin in ("vcadmin", "admin"):
        assert len(client.get(url(job_id), headers=world.auth(admin)).get_json()["items"]) == 1
    assert len(rows(sessions, job_id)) == 1


def test_submit_with_ssh_and_ports_makes_pending_endpoint_rows(client, world, sessions):
    response = client.post("/api/v1/jobs", json=JOB | {"ssh": True, "ports": [6006, 8888]}, headers=world.auth("alice"))
    assert response.status_code == 201, response.get_json()
    job_id = response.get_json()["id"]
    made = rows(sessions, job_id)
    assert [(r.kind.value, r.name, r.port, r.status.value, r.created_by) for r in made] == [
        ("ssh", "ssh", 22, "pending", "alice"), ("port", "port-6006", 6006, "pending", "alice"),
        ("port", "port-8888", 8888, "pending", "alice")]
    job = client.get(f"/api/v1/jobs/{job_id}", headers=world.auth("alice")).get_json()
    assert [e["name"] for e in job["endpoints"]] == ["ssh", "port-6006", "port-8888"]
    assert job["ssh"] is True and job["ports"] == [6006, 8888]
    # and jupyter cannot take 8888 any more
    assert_envelope(client.post(url(job_id), json={"kind": "jupyter"}, headers=world.auth("alice")), 409, "endpoint_exists")
    plain = client.post("/api/v1/jobs", json=JOB, headers=world.auth("alice")).get_json()
    assert rows(sessions, plain["id"]) == []
    assert client.get(f"/api/v1/jobs/{plain['id']}", headers=world.auth("alice")).get_json()["endpoints"] == []


@pytest.mark.parametrize("ports,status,words", [
    ([22], 400, "between 1024 and 65535"),
    ([70000], 400, "between 1024 and 65535"),
    ([6006, 6006], 400, "6006 more than once"),
    (list(range(9000, 9009)), 400, "at most 8 ports"),
])
def test_submitted_ports_are_checked_and_nothing_is_written(client, world, sessions, ports, status, words):
    error = assert_envelope(client.post("/api/v1/jobs", json=JOB | {"ports": ports}, headers=world.auth("alice")), status)
    assert words in error["message"] or words in str(error["details"]), error
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(Job.id))) == 0
        assert s.scalar(sa.select(sa.func.count(JobEndpoint.id))) == 0


def test_ssh_and_eight_ports_are_too_many_endpoints(client, world, sessions):
    error = assert_envelope(client.post("/api/v1/jobs", json=JOB | {"ssh": True, "ports": list(range(9000, 9008))},
                                        headers=world.auth("alice")), 422, "too_many_endpoints")
    assert "asks for 9 endpoints" in error["message"] and error["details"]["field"] == "ports"
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(Job.id))) == 0


def test_submission_reads_nothing_more_for_its_endpoints(app, world, sessions, settings):
    """The submit hot path: ssh and ports add one INSERT to the job's transaction, never a SELECT."""
    from dlts.db import engine_of
    from dlts.services import jobs as job_service

    from .helpers import principal

    engine = engine_of(app)
    statements: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        statements.append(statement.split()[0].upper() + " " + (statement.split("INTO ")[1].split()[0] if "INTO " in statement else ""))

    def submit(**extra) -> list[str]:
        with sessions() as s:
            who = principal(s, "alice")
            statements.clear()
            sa.event.listen(engine, "before_cursor_execute", record)
            try:
                job_service.submit(s, settings, who, job_service.JobRequest(vc="vision", image="x", command="true", **extra))
            finally:
                sa.event.remove(engine, "before_cursor_execute", record)
            return list(statements)

    plain = submit()
    with_endpoints = submit(ssh=True, ports=(6006, 7000))
    assert not any("job_endpoints" in s for s in plain)
    extra = list(with_endpoints)
    for statement in plain:
        extra.remove(statement)
    assert extra == ["INSERT job_endpoints"], (plain, with_endpoints)  # three rows, one statement


def test_concurrent_opens_never_pass_the_cap(sessions, settings, world):
    """Opening locks the job row (SQLite: a serialising write), so racing requests count each other's
    endpoints, on both databases."""
    import threading

    from dlts.errors import DltsError
    from dlts.services import endpoints

    from .helpers import principal

    job_id = make_job(sessions, settings, "alice", status=JobStatus.RUNNING)
    outcomes: list[str] = []
    start = threading.Barrier(12)

    def open_one(i: int) -> None:
        with sessions() as s:
            who = principal(s, "alice")
            start.wait()
            try:
                endpoints.open_endpoint(s, who, job_id, "port", 9000 + i)
                outcomes.append("ok")
            except DltsError as exc:
                outcomes.append(exc.code)

    threads = [threading.Thread(target=open_one, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(outcomes) == ["ok"] * 8 + ["too_many_endpoints"] * 4
    assert len(rows(sessions, job_id)) == 8
