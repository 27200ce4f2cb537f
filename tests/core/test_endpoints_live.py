"""Job endpoints carried out on real processes: the job manager exposes the endpoint rows of running
jobs through the local backend, whose DLTS init starts the servers (sshd, jupyter server,
code-server) and stops them when the endpoint closes or the job ends.

Endpoint rows are written here as the API writes them (a pending row; ``closing`` for DELETE): the
API's own tests cover the HTTP side, these cover what the job manager and the backend make of them.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time

import psutil
import pytest
import requests
import sqlalchemy as sa
from live_helpers import submit, wait_for

from dlts.backends.base import BackendUnavailable
from dlts.db import engine_of
from dlts.models import EndpointKind, EndpointStatus, Job, JobEndpoint, JobEvent

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.access("/usr/sbin/sshd", os.X_OK) else None)
needs_sshd = pytest.mark.skipif(SSHD is None or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None,
                                reason="sshd, ssh or ssh-keygen is not installed (apt-get install openssh-server "
                                       "openssh-client; .ci/dev installs them)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def add_endpoint(sessions, job_id: int, kind: str, port: int, *, name: str | None = None, token: str | None = None) -> int:
    with sessions() as s:
        row = JobEndpoint(job_id=job_id, kind=EndpointKind(kind), name=name or (f"port-{port}" if kind == "port" else kind),
                          port=port, created_by="alice",
                          secret_hash=hashlib.sha256(token.encode()).hexdigest() if token else None)
        s.add(row)
        s.commit()
        return row.id


def close_endpoint(sessions, endpoint_id: int) -> None:
    """What DELETE /jobs/{id}/endpoints/{endpoint_id} does."""
    with sessions() as s:
        s.execute(sa.update(JobEndpoint).where(JobEndpoint.id == endpoint_id).values(status=EndpointStatus.CLOSING))
        s.commit()


def endpoint(sessions, endpoint_id: int) -> JobEndpoint | None:
    with sessions() as s:
        return s.get(JobEndpoint, endpoint_id)


def wait_endpoint(live, sessions, endpoint_id: int, statuses: set[str], timeout_s: float = 20.0, attempt: int | None = None):
    deadline = time.monotonic() + timeout_s
    while True:
        live.tick()
        row = endpoint(sessions, endpoint_id)
        if row is not None and row.status.value in statuses and (attempt is None or row.attempt == attempt):
            return row
        assert time.monotonic() < deadline, f"endpoint {endpoint_id} stuck: {row and (row.status, row.attempt, row.message)}"
        time.sleep(0.1)


def endpoint_events(sessions, job_id: int) -> list[tuple[str, str]]:
    with sessions() as s:
        return [(e.reason, e.message) for e in s.scalars(
            sa.select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "endpoint").order_by(JobEvent.id))]


def http_get(url: str, timeout_s: float = 10.0) -> str:
    """GET once the server listens (a job's server may still be starting)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            r = requests.get(url, timeout=2)
            r.raise_for_status()
            return r.text
        except requests.RequestException:
            assert time.monotonic() < deadline, f"nothing answers at {url}"
            time.sleep(0.1)


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def servers_of(job_id: int, name: str) -> list[psutil.Process]:
    """The processes called ``name`` below the job's DLTS init."""
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmd = proc.info["cmdline"] or []
            if not (any("dlts_init.py" in part for part in cmd)
                    and (proc.info["environ"] or {}).get("DLTS_JOB_ID") == str(job_id)):
                continue
            children = proc.children(recursive=True)
        except psutil.Error:
            continue
        for child in children:
            # one child at a time: the job's own short-lived processes (its `sleep 0.1`s) exit
            # between the listing and the question, which must not hide the server (CI, once)
            try:
                if name in " ".join(child.cmdline()):
                    found.append(child)
            except psutil.Error:
                continue
    return found


def _alive(p: psutil.Process) -> bool:
    """Running and not a zombie; a process that exits between the two questions is gone (it did,
    once, on a loaded CI host: NoSuchProcess from ``status()`` right after ``is_running()``)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone(procs: list[psutil.Process], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(_alive(p) for p in procs):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def http_job(tmp_path, port: int, text: str) -> str:
    """A job command serving ``text`` over HTTP on ``port`` (python -m http.server)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "index.html").write_text(text)
    return f"exec {sys.executable} -m http.server {port} --bind 127.0.0.1 --directory {site}"


def test_a_port_endpoint_is_ready_once_the_job_listens_reaches_the_job_and_then_costs_one_query_a_tick(
        live, world, sessions, tmp_path, app):
    port = free_port()
    job = submit(live, world, command=http_job(tmp_path, port, "hello from the job"))
    wait_for(live, world, job["id"], {"running"})
    endpoint_id = add_endpoint(sessions, job["id"], "port", port)

    row = wait_endpoint(live, sessions, endpoint_id, {"ready"})  # once the job's server listens
    assert (row.status, row.host, row.host_port, row.attempt, row.message) == (EndpointStatus.READY, "127.0.0.1", port, 1, None)
    assert endpoint_events(sessions, job["id"]) == [("ready", f"port-{port} ready at 127.0.0.1:{port}")]
    assert http_get(f"http://{row.host}:{row.host_port}/") == "hello from the job"

    # Nothing needs work now: the step is one SELECT, and the backend is not asked again.
    calls = []
    real_expose = live.backend.expose
    live.backend.expose = lambda *a, **k: calls.append(a) or real_expose(*a, **k)
    statements = []
    def count(conn, cursor, statement, *_):
        statements.append(statement)

    sa.event.listen(engine_of(app), "before_cursor_execute", count)
    try:
        with sessions() as s:
            live.manager._reconcile_endpoints(s)
    finally:
        sa.event.remove(engine_of(app), "before_cursor_execute", count)
    assert calls == [] and len(statements) == 1 and statements[0].lstrip().upper().startswith("SELECT")
    live.tick(3)
    assert calls == [] and endpoint(sessions, endpoint_id).updated_at == row.updated_at

    # The job ends: the row stays as it was (the API reads it as closed), nothing is exposed.
    r = requests.post(f"{live.url}/api/v1/jobs/{job['id']}/kill", headers=world.auth("alice"), timeout=10)
    assert r.status_code == 202, r.text
    wait_for(live, world, job["id"], {"killed"})
    live.tick(2)
    assert calls == [] and endpoint(sessions, endpoint_id).status is EndpointStatus.READY


LISTEN = """
import socket, sys, time
family = socket.AF_INET6 if sys.argv[1] == "v6" else socket.AF_INET
s = socket.socket(family, socket.SOCK_STREAM)
if family == socket.AF_INET6:
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
s.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", int(sys.argv[2])))
s.listen(8)
print("listening", flush=True)
time.sleep(600)
"""


def listen_job(tmp_path, family: str, port: int) -> str:
    script = tmp_path / "listen.py"
    script.write_text(LISTEN)
    return f"exec {sys.executable} {script} {family} {port}"


def test_a_job_claiming_the_port_another_job_listens_on_never_gets_it(live, world, sessions, tmp_path):
    """Job B (bob's) opens a port endpoint on the port job A (alice's) serves: it stays pending
    with the reason, so the endpoint firewall never lets bob's addresses in to alice's server, also
    when B listens on the same port number in the other address family."""
    port = free_port()
    a = submit(live, world, command=http_job(tmp_path, port, "alice's server"), cpu=0.5)
    b = submit(live, world, user="bob", command="sleep 600", cpu=0.5)
    wait_for(live, world, a["id"], {"running"})
    wait_for(live, world, b["id"], {"running"}, user="bob")
    assert http_get(f"http://127.0.0.1:{port}/") == "alice's server"
    claim = add_endpoint(sessions, b["id"], "port", port)
    own = add_endpoint(sessions, a["id"], "port", port)
    assert wait_endpoint(live, sessions, own, {"ready"}).host_port == port  # A's own endpoint opens
    live.tick(5)
    row = endpoint(sessions, claim)
    assert row.status is EndpointStatus.PENDING and row.host_port is None
    assert f"port {port} is held by a process that is not part of job {b['id']}" in row.message
    assert [reason for reason, _ in endpoint_events(sessions, b["id"])] == []
    r = requests.get(f"{live.url}/api/v1/jobs/{b['id']}/endpoints", headers=world.auth("bob"), timeout=10).json()
    assert r["items"][0]["status"] == "pending" and "not part of job" in r["items"][0]["message"]

    # the same port number in the other family: A's IPv4 server is still reachable there
    c = submit(live, world, user="bob", command=listen_job(tmp_path, "v6", port), cpu=0.5)
    wait_for(live, world, c["id"], {"running"}, user="bob")
    deadline = time.monotonic() + 10
    while port not in {conn.laddr.port for conn in psutil.net_connections("tcp6") if conn.status == "LISTEN"}:
        assert time.monotonic() < deadline, "job C never listened"
        time.sleep(0.1)
    dual = add_endpoint(sessions, c["id"], "port", port)
    live.tick(5)
    row = endpoint(sessions, dual)
    assert row.status is EndpointStatus.PENDING and "not part of job" in row.message


def test_a_port_endpoint_waits_for_the_jobs_server_and_counts_a_daemonised_one(live, world, sessions, tmp_path):
    port = free_port()
    marker = tmp_path / "go"
    # the server starts late, and leaves its shell behind (setsid + background: a daemon)
    job = submit(live, world, command=f"while [ ! -e {marker} ]; do sleep 0.1; done; "
                                      f"setsid {listen_job(tmp_path, 'v4', port)[5:]} & sleep 600")
    wait_for(live, world, job["id"], {"running"})
    endpoint_id = add_endpoint(sessions, job["id"], "port", port)
    live.tick(3)
    row = endpoint(sessions, endpoint_id)
    assert row.status is EndpointStatus.PENDING
    assert row.message == f"no process of job {job['id']} listens on port {port} yet"
    marker.touch()
    row = wait_endpoint(live, sessions, endpoint_id, {"ready"})
    assert (row.host, row.host_port, row.message) == ("127.0.0.1", port, None)


def ssh_key(live, world, tmp_path):
    """A key pair of alice's, registered through the API."""
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    r = requests.post(f"{live.url}/api/v1/me/ssh-keys", json={"public_key": (tmp_path / "id_ed25519.pub").read_text()},
                      headers=world.auth("alice"), timeout=10)
    assert r.status_code == 201, r.text
    return key


def ssh(key, port: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-i", str(key), "-p", str(port), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
         "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=5",
         f"{getpass.getuser()}@127.0.0.1", "echo hello"], capture_output=True, text=True, timeout=30)


@needs_sshd
def test_an_ssh_endpoint_lets_the_owner_in_and_stops_when_closed_or_when_the_job_ends(live, world, sessions, tmp_path):
    key = ssh_key(live, world, tmp_path)
    finish = tmp_path / "finish"
    job = submit(live, world, command=f"while [ ! -e {finish} ]; do sleep 0.1; done")
    wait_for(live, world, job["id"], {"running"})

    first = add_endpoint(sessions, job["id"], "ssh", 22)
    row = wait_endpoint(live, sessions, first, {"ready", "failed"})
    assert row.status is EndpointStatus.READY, row.message
    assert row.host == "127.0.0.1" and row.host_port not in (None, 22) and row.attempt == 1
    done = ssh(key, row.host_port)
    assert done.returncode == 0 and done.stdout == "hello\n", done.stderr
    assert ("ready", f"ssh ready at 127.0.0.1:{row.host_port}") in endpoint_events(sessions, job["id"])

    # DELETE: the server stops, then the row goes.
    sshd = servers_of(job["id"], "sshd")
    assert sshd
    close_endpoint(sessions, first)
    live.tick()
    assert endpoint(sessions, first) is None
    assert gone(sshd) and not accepts(row.host_port)

    # Another one; the job's command ends: its server goes with it, the row stays.
    second = add_endpoint(sessions, job["id"], "ssh", 22, name="ssh-again")
    again = wait_endpoint(live, sessions, second, {"ready", "failed"})
    assert again.status is EndpointStatus.READY, again.message
    assert ssh(key, again.host_port).stdout == "hello\n"
    sshd = servers_of(job["id"], "sshd")
    finish.write_text("")
    wait_for(live, world, job["id"], {"finished"})
    assert gone(sshd) and not accepts(again.host_port)
    assert endpoint(sessions, second).status is EndpointStatus.READY


@needs_sshd
def test_killing_a_job_stops_its_servers_at_once_even_while_the_job_takes_its_grace_period(
        live, world, sessions, tmp_path):
    ssh_key(live, world, tmp_path)
    job = submit(live, world, command="trap '' TERM; while :; do sleep 0.1; done")  # deaf to SIGTERM
    wait_for(live, world, job["id"], {"running"})
    row = wait_endpoint(live, sessions, add_endpoint(sessions, job["id"], "ssh", 22), {"ready", "failed"})
    assert row.status is EndpointStatus.READY, row.message
    sshd = servers_of(job["id"], "sshd")
    r = requests.post(f"{live.url}/api/v1/jobs/{job['id']}/kill", headers=world.auth("alice"), timeout=10)
    assert r.status_code == 202, r.text
    live.tick()  # SIGTERM to the job's init; the job ignores it, and only a later tick sends SIGKILL
    assert gone(sshd) and not accepts(row.host_port)  # no tick meanwhile: the init stopped it
    with sessions() as s:
        assert s.get(Job, job["id"]).status.value == "killing"
    wait_for(live, world, job["id"], {"killed"})


def test_jupyter_and_vscode_endpoints_fail_with_what_to_install_when_the_job_lacks_them(live, world, sessions, tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    job = submit(live, world, command="exec /bin/sleep 600", env={"PATH": str(empty)})
    wait_for(live, world, job["id"], {"running"})
    jupyter = add_endpoint(sessions, job["id"], "jupyter", 8888, token="t0ken")
    vscode = add_endpoint(sessions, job["id"], "vscode", 8080, token="t0ken")

    assert wait_endpoint(live, sessions, jupyter, {"failed", "ready"}).message == (
        "jupyter is not installed where the job runs (no jupyter on the job's PATH): pip install jupyter-server in "
        "the job's environment, then delete this endpoint and ask for it again")
    row = wait_endpoint(live, sessions, vscode, {"failed", "ready"})
    assert row.status is EndpointStatus.FAILED and row.host is None and row.host_port is None and row.attempt == 1
    assert row.message.startswith("code-server is not installed where the job runs")
    events = endpoint_events(sessions, job["id"])
    assert [reason for reason, _ in events] == ["failed", "failed"]
    assert any(m.startswith("jupyter: jupyter is not installed") for _, m in events)

    # Failed for this attempt: the job manager leaves them alone (they are retried on the next attempt).
    calls = []
    live.backend.expose = lambda *a, **k: calls.append(a)
    live.tick(3)
    assert calls == []


def jupyter_dir() -> str | None:
    """Where a real ``jupyter`` is: DLTS_TEST_JUPYTER_BIN (CI installs jupyter-server into a venv of
    its own) or the PATH."""
    found = os.environ.get("DLTS_TEST_JUPYTER_BIN") or (os.path.dirname(shutil.which("jupyter") or "") or None)
    return found if found and os.path.exists(os.path.join(found, "jupyter")) else None


@pytest.mark.skipif(jupyter_dir() is None, reason="jupyter is not installed (pip install jupyter-server, or set "
                    "DLTS_TEST_JUPYTER_BIN to the directory of its jupyter); the missing-jupyter case is tested above")
def test_a_jupyter_endpoint_takes_the_token_as_its_password(live, world, sessions):
    job = submit(live, world, command="exec sleep 600", env={"PATH": f"{jupyter_dir()}:{os.environ['PATH']}"})
    wait_for(live, world, job["id"], {"running"})
    jupyter = add_endpoint(sessions, job["id"], "jupyter", 8888, token="the-token-shown-once")
    row = wait_endpoint(live, sessions, jupyter, {"ready", "failed"}, timeout_s=60)
    assert row.status is EndpointStatus.READY, row.message
    base = f"http://{row.host}:{row.host_port}"
    assert requests.get(f"{base}/api/status", timeout=10).status_code == 403
    for password, status in (("not-the-token", 403), ("the-token-shown-once", 200)):
        browser = requests.Session()
        browser.get(f"{base}/login", timeout=10)
        browser.post(f"{base}/login", data={"password": password, "_xsrf": browser.cookies.get("_xsrf")}, timeout=10)
        assert browser.get(f"{base}/api/status", timeout=10).status_code == status, password
    server = servers_of(job["id"], "jupyter")
    close_endpoint(sessions, jupyter)
    live.tick()
    assert endpoint(sessions, jupyter) is None and gone(server)


def test_a_retried_attempt_exposes_its_endpoints_anew(live, world, sessions, tmp_path):
    port = free_port()
    stop = tmp_path / "stop-attempt-1"
    site = tmp_path / "site"
    # Each attempt serves its number; attempt 1 fails when the test says so.
    command = (f'mkdir -p {site}/$DLTS_ATTEMPT && echo "attempt $DLTS_ATTEMPT" > {site}/$DLTS_ATTEMPT/index.html && '
               f'{sys.executable} -m http.server {port} --bind 127.0.0.1 --directory {site}/$DLTS_ATTEMPT & '
               f'if [ "$DLTS_ATTEMPT" = 1 ]; then while [ ! -e {stop} ]; do sleep 0.1; done; kill $!; exit 3; fi; wait')
    job = submit(live, world, command=command, max_retries=1)
    wait_for(live, world, job["id"], {"running"})
    endpoint_id = add_endpoint(sessions, job["id"], "port", port)
    row = wait_endpoint(live, sessions, endpoint_id, {"ready"})
    assert row.attempt == 1 and http_get(f"http://127.0.0.1:{row.host_port}/") == "attempt 1\n"

    stop.write_text("")
    deadline = time.monotonic() + 20
    while True:  # until the job starts its second attempt
        live.tick()
        with sessions() as s:
            if s.get(Job, job["id"]).attempt == 2:
                break
        assert time.monotonic() < deadline, "the job never started its second attempt"
        time.sleep(0.1)
    # the row still holds attempt 1's address (the API reads it as pending) until it is exposed anew:
    # in the tick that sees the new attempt running
    row = endpoint(sessions, endpoint_id)
    assert (row.status, row.attempt) == (EndpointStatus.READY, 1)
    deadline = time.monotonic() + 10
    while True:  # until a tick sees attempt 2 running (its init has recorded itself)
        live.tick()
        with sessions() as s:
            if s.get(Job, job["id"]).status.value == "running":
                break
        row = endpoint(sessions, endpoint_id)
        assert (row.status, row.attempt) == (EndpointStatus.READY, 1)  # not exposed anew before that
        assert time.monotonic() < deadline, "attempt 2 never ran"
        time.sleep(0.05)
    # exposed anew for attempt 2 (pending until attempt 2's server listens on the port)
    row = wait_endpoint(live, sessions, endpoint_id, {"ready"}, attempt=2)
    assert http_get(f"http://127.0.0.1:{row.host_port}/") == "attempt 2\n"
    assert [reason for reason, _ in endpoint_events(sessions, job["id"])] == ["ready", "ready"]


def test_closing_endpoints_of_a_job_that_is_not_running_are_deleted_without_the_backend(live, world, sessions):
    big = submit(live, world, user="bob", command="exec sleep 600", gpus=4)
    wait_for(live, world, big["id"], {"running"}, user="bob")
    queued = submit(live, world, command="exec sleep 600", gpus=1)
    live.tick()
    waiting = add_endpoint(sessions, queued["id"], "port", 9000)
    leaving = add_endpoint(sessions, queued["id"], "port", 9001)
    close_endpoint(sessions, leaving)
    calls = []
    live.backend.expose = lambda *a, **k: calls.append(a)
    live.tick()
    assert calls == [] and endpoint(sessions, leaving) is None
    assert endpoint(sessions, waiting).status is EndpointStatus.PENDING


def test_a_backend_that_refuses_fails_that_jobs_endpoints_and_an_unavailable_one_is_retried(live, world, sessions, tmp_path):
    port = free_port()
    refused = submit(live, world, command="exec sleep 600")
    fine = submit(live, world, command=http_job(tmp_path, port, "fine"))
    wait_for(live, world, refused["id"], {"running"})
    wait_for(live, world, fine["id"], {"running"})
    real_expose = live.backend.expose

    def unavailable(*a, **k):
        raise BackendUnavailable("connection refused")

    live.backend.expose = unavailable
    bad = add_endpoint(sessions, refused["id"], "port", 9000)
    good = add_endpoint(sessions, fine["id"], "port", port)
    live.tick()
    assert endpoint(sessions, bad).status is EndpointStatus.PENDING and endpoint(sessions, bad).attempt is None
    assert endpoint(sessions, good).status is EndpointStatus.PENDING

    def refusing(job_id, *a, **k):
        if job_id == refused["id"]:
            raise RuntimeError("port 9000 is reserved")
        return real_expose(job_id, *a, **k)

    live.backend.expose = refusing
    live.tick()
    row = endpoint(sessions, bad)
    assert (row.status, row.message, row.attempt) == (
        EndpointStatus.FAILED, "the cluster could not expose it: port 9000 is reserved", 1)
    assert endpoint_events(sessions, refused["id"]) == [("failed", "port-9000: the cluster could not expose it: port 9000 is reserved")]
    deadline = time.monotonic() + 30  # ready once the job's own server listens on the port (it may still be starting)
    while endpoint(sessions, good).status is not EndpointStatus.READY:
        assert endpoint(sessions, good).status is EndpointStatus.PENDING and time.monotonic() < deadline
        live.tick()
        time.sleep(0.2)
    assert http_get(f"http://127.0.0.1:{port}/") == "fine"
