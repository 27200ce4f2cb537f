"""Caps that hold under parallel requests (tokens per user, endpoints per job, allowed IPs per user,
registry credentials per owner), and the per-user abuse
limits on queued jobs and submissions per minute, through the real HTTP API on SQLite and (``-m db``)
MariaDB."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import requests
import sqlalchemy as sa

from dlts.models import AllowedIp, ApiToken, JobEndpoint, RegistryCredential, User
from dlts.services.allowed_ips import MAX_ENTRIES_PER_USER
from dlts.services.endpoints import MAX_ENDPOINTS_PER_JOB
from dlts.services.registry_credentials import MAX_PER_OWNER
from dlts.services.tokens import MAX_TOKENS_PER_USER

from .helpers import assert_envelope

JOB = {"vc": "vision", "image": "debian:12", "command": "sleep 60"}


def parallel(calls: list) -> list[requests.Response]:
    """Run each call in its own thread, all released at once."""
    barrier = threading.Barrier(len(calls))

    def run(call):
        barrier.wait(timeout=30)
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def test_thirty_parallel_token_creations_stop_at_the_cap(live, world, sessions):
    url = f"{live.url}/api/v1/me/tokens"
    responses = parallel([lambda i=i: requests.post(url, json={"name": f"t{i}"}, headers=world.auth("alice"), timeout=60)
                          for i in range(30)])
    statuses = sorted(r.status_code for r in responses)
    made = MAX_TOKENS_PER_USER - 1  # alice has her "test" token already
    assert statuses == [201] * made + [422] * (30 - made), statuses
    for r in responses:
        if r.status_code == 422:
            error = r.json()["error"]
            assert error["code"] == "too_many_tokens" and error["details"]["max"] == MAX_TOKENS_PER_USER
    with sessions() as s:
        alice = s.scalar(sa.select(User.id).where(User.name == "alice"))
        assert s.scalar(sa.select(sa.func.count(ApiToken.id)).where(ApiToken.user_id == alice)) == MAX_TOKENS_PER_USER


def test_fifty_parallel_allowed_ip_adds_stop_at_the_cap(live, world, sessions):
    url = f"{live.url}/api/v1/me/allowed-ips"
    before = MAX_ENTRIES_PER_USER - 20
    for i in range(before):
        assert requests.post(url, json={"ip": f"8.8.{i}.1"}, headers=world.auth("alice"), timeout=60).status_code == 201
    responses = parallel([lambda i=i: requests.post(url, json={"ip": f"9.9.{i}.1"}, headers=world.auth("alice"), timeout=60)
                          for i in range(50)])
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [201] * 20 + [422] * 30, statuses
    assert {r.json()["error"]["code"] for r in responses if r.status_code == 422} == {"too_many_allowed_ips"}
    with sessions() as s:
        alice = s.scalar(sa.select(User.id).where(User.name == "alice"))
        assert s.scalar(sa.select(sa.func.count(AllowedIp.id)).where(AllowedIp.user_id == alice)) == MAX_ENTRIES_PER_USER


def test_fifty_parallel_registry_credential_adds_stop_at_the_cap(live, world, sessions):
    url = f"{live.url}/api/v1/me/registry-credentials"
    responses = parallel([lambda i=i: requests.post(url, json={"server": f"registry{i}.example.com", "username": "alice",
                                                               "password": "token"}, headers=world.auth("alice"), timeout=60)
                          for i in range(50)])
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [201] * MAX_PER_OWNER + [422] * (50 - MAX_PER_OWNER), statuses
    assert {r.json()["error"]["code"] for r in responses if r.status_code == 422} == {"too_many_registry_credentials"}
    with sessions() as s:
        alice = s.scalar(sa.select(User.id).where(User.name == "alice"))
        assert s.scalar(sa.select(sa.func.count(RegistryCredential.id)).where(RegistryCredential.user_id == alice)) == MAX_PER_OWNER


def test_fourteen_parallel_endpoint_opens_stop_at_the_cap(live, world, sessions):
    job = requests.post(f"{live.url}/api/v1/jobs", json=JOB, headers=world.auth("alice"), timeout=10).json()
    url = f"{live.url}/api/v1/jobs/{job['id']}/endpoints"
    responses = parallel([lambda i=i: requests.post(url, json={"kind": "port", "port": 9000 + i},
                                                    headers=world.auth("alice"), timeout=60) for i in range(14)])
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [201] * MAX_ENDPOINTS_PER_JOB + [422] * (14 - MAX_ENDPOINTS_PER_JOB), statuses
    assert {r.json()["error"]["code"] for r in responses if r.status_code == 422} == {"too_many_endpoints"}
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(JobEndpoint.id)).where(JobEndpoint.job_id == job["id"])) == MAX_ENDPOINTS_PER_JOB


# -- abuse limits: queued jobs per user and submissions per minute, per VC ----------------------------

def _submit(client, world, user="alice", vc="vision"):
    return client.post("/api/v1/jobs", json=JOB | {"vc": vc}, headers=world.auth(user))


def _patch_vc(client, world, user="vcadmin", **changes):
    return client.patch("/api/v1/vcs/vision", json=changes, headers=world.auth(user))


def test_a_vc_admin_caps_queued_jobs_per_user_and_the_refusal_gives_the_numbers(client, world):
    assert _patch_vc(client, world, max_queued_jobs_per_user=3).status_code == 200
    ids = [_submit(client, world).get_json()["id"] for _ in range(3)]
    error = assert_envelope(_submit(client, world), 422, "queued_jobs_cap_exceeded")
    assert "You have 3 jobs waiting in VC vision; at most 3 may wait per user" in error["message"]
    assert error["details"] == {"queued": 3, "max": 3, "vc": "vision"}
    assert _submit(client, world, "bob").status_code == 201  # per user
    assert client.post(f"/api/v1/jobs/{ids[0]}/kill", headers=world.auth("alice")).status_code == 202
    assert _submit(client, world).status_code == 201  # a killed job no longer waits
    body = client.get("/api/v1/vcs/vision", headers=world.auth("alice")).get_json()
    assert body["max_queued_jobs_per_user"] == 3 and body["max_submissions_per_minute"] is None


def test_submissions_per_minute_are_limited_with_429_and_retry_after(client, world):
    assert _patch_vc(client, world, max_submissions_per_minute=4).status_code == 200
    for _ in range(4):
        assert _submit(client, world).status_code == 201
    response = _submit(client, world)
    error = assert_envelope(response, 429, "submission_rate_exceeded")
    retry = int(response.headers["Retry-After"])
    assert 1 <= retry <= 60 and error["details"]["retry_after_s"] == retry
    assert "at most 4 jobs a minute to VC vision" in error["message"] and f"wait {retry} s" in error["message"]
    assert error["details"]["max_per_minute"] == 4
    assert _submit(client, world, "bob").status_code == 201  # per user
    assert _patch_vc(client, world, max_submissions_per_minute=0).status_code == 200  # 0: no limit
    assert _submit(client, world).status_code == 201


def test_the_cluster_defaults_apply_until_a_vc_sets_its_own(settings, world):
    from dlts.app import create_app

    app = create_app(settings.model_copy(update={"max_queued_jobs_per_user": 2, "max_submissions_per_minute": 0}))
    client = app.test_client()
    assert [_submit(client, world).status_code for _ in range(3)] == [201, 201, 422]
    assert _patch_vc(client, world, max_queued_jobs_per_user=0).status_code == 200
    assert _submit(client, world).status_code == 201
    assert _patch_vc(client, world, max_queued_jobs_per_user=None).status_code == 200  # back to the default
    assert _submit(client, world).status_code == 422


def test_abuse_limits_are_checked_and_only_vc_admins_set_them(client, world):
    for bad in (-1, "5", 1.5, True, 10**8):
        error = assert_envelope(_patch_vc(client, world, max_queued_jobs_per_user=bad), 400)
        assert "max_queued_jobs_per_user" in error["message"] or "max_queued_jobs_per_user" in str(error["details"])
    assert_envelope(_patch_vc(client, world, "alice", max_submissions_per_minute=1), 403)


def test_parallel_submissions_stop_at_the_queued_cap_and_the_rate(live, world, client):
    assert _patch_vc(client, world, max_queued_jobs_per_user=4, max_submissions_per_minute=0).status_code == 200
    url = f"{live.url}/api/v1/jobs"
    post = lambda user="alice": requests.post(url, json=JOB, headers=world.auth(user), timeout=60)
    statuses = sorted(r.status_code for r in parallel([post] * 12))
    assert statuses == [201] * 4 + [422] * 8, statuses
    assert _patch_vc(client, world, max_queued_jobs_per_user=0, max_submissions_per_minute=3).status_code == 200
    statuses = sorted(r.status_code for r in parallel([lambda: post("bob")] * 10))
    assert statuses == [201] * 3 + [429] * 7, statuses


# -- the same limits across gunicorn workers (separate processes sharing only the database) -----------

def test_limits_hold_across_gunicorn_workers(tmp_path, database_url):
    import os
    import re
    import signal
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLTS_")} | {
        "DLTS_HOME": str(tmp_path), "DLTS_DATABASE_URL": database_url, "DLTS_SECRET_KEY": "a-test-secret-key-123456",
        "DLTS_LISTEN_PORT": str(port), "DLTS_MANAGERS_METRICS_LISTEN": "",
        "DLTS_LOCAL_BACKEND_TRUSTED_USERS": "true"}  # dlts api with the local backend (docs/security-host.md)
    dlts = [sys.executable, "-m", "dlts.cli"]

    def cli(*args):
        result = subprocess.run(dlts + list(args), check=False, env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    cli("db", "upgrade")
    cli("user", "add", "erin")
    cli("user", "password", "erin", "--random")
    token = cli("user", "token", "erin").splitlines()[-1]
    api = subprocess.Popen(dlts + ["api", "--workers", "2"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{url}/readyz", timeout=10).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert api.poll() is None and time.monotonic() < deadline, \
                "gunicorn did not come up: " + (api.stderr.read()[-2000:] if api.poll() is not None else "still starting")
            time.sleep(0.3)

        def login(i):
            browser = requests.Session()
            csrf = re.search(r'name="csrf_token" value="([^"]+)"', browser.get(f"{url}/login", timeout=30).text).group(1)
            return lambda: browser.post(f"{url}/login", data={"username": "erin", "password": f"wrong-guess-{i:04d}",
                                                              "csrf_token": csrf}, allow_redirects=False, timeout=60)

        statuses = sorted(r.status_code for r in parallel([login(i) for i in range(12)]))
        assert statuses == [401] * 5 + [429] * 7, statuses
        auth = {"Authorization": f"Bearer {token}"}
        statuses = sorted(r.status_code for r in parallel(
            [lambda i=i: requests.post(f"{url}/api/v1/me/tokens", json={"name": f"t{i}"}, headers=auth, timeout=60)
             for i in range(30)]))
        assert statuses == [201] * (MAX_TOKENS_PER_USER - 1) + [422] * (30 - MAX_TOKENS_PER_USER + 1), statuses
    finally:
        api.send_signal(signal.SIGTERM)
        try:
            api.wait(timeout=20)
        except subprocess.TimeoutExpired:
            api.kill()
