"""Helpers for tests that drive the live server (real HTTP) and tick its job manager."""

from __future__ import annotations

import time

import requests


def submit(live, world, user="alice", **body):
    payload = {"vc": "vision", "image": "debian:12", "command": "true"} | body
    r = requests.post(f"{live.url}/api/v1/jobs", json=payload, headers=world.auth(user), timeout=10)
    assert r.status_code == 201, r.text
    return r.json()


def get(live, world, job_id, user="alice"):
    r = requests.get(f"{live.url}/api/v1/jobs/{job_id}", headers=world.auth(user), timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def wait_for(live, world, job_id, statuses, timeout_s=20.0, user="alice"):
    deadline = time.monotonic() + timeout_s
    while True:
        live.tick()
        job = get(live, world, job_id, user)
        if job["status"] in statuses:
            return job
        assert time.monotonic() < deadline, f"job {job_id} stuck in {job['status']} ({job.get('reason')})"
        time.sleep(0.1)


def wait_for_log(live, world, job_id, text, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while text not in requests.get(f"{live.url}/api/v1/jobs/{job_id}/log", headers=world.auth("alice"), timeout=10).json()["data"]:
        assert time.monotonic() < deadline, f"{text!r} never appeared in job {job_id}'s log"
        live.tick()
        time.sleep(0.05)
