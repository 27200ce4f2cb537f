"""Caps that hold under parallel requests (tokens per user, endpoints per job), and the per-user abuse
limits on queued jobs and submissions per minute, through the real HTTP API on SQLite and (``-m db``)
MariaDB."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import requests
import sqlalchemy as sa

from dlts.models import ApiToken, JobEndpoint, User
from dlts.services.endpoints import MAX_ENDPOINTS_PER_JOB
from dlts.services.tokens import MAX_TOKENS_PER_USER

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
