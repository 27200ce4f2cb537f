"""A kill that races the job manager: the job left `queued` for `scheduling` between the API's read
and its compare-and-set. The kill applies to the new state (202, killing), not a 409 to retry."""

from __future__ import annotations

from dlts.models import JobStatus
from dlts.repositories import jobs as job_repo
from dlts.services import jobs as job_service


def test_a_kill_of_a_job_that_starts_meanwhile_takes_effect(client, world, sessions, monkeypatch):
    submitted = client.post("/api/v1/jobs", json={"vc": "vision", "image": "debian:12", "command": "sleep 600"},
                            headers=world.auth("alice"))
    job_id = submitted.get_json()["id"]
    load = job_service._load_for_change

    def load_then_the_manager_starts_it(session, principal, jid, action):
        job = load(session, principal, jid, action)  # read as queued
        with sessions() as other:  # the job manager's tick, committed meanwhile
            assert job_repo.set_status(other, jid, JobStatus.QUEUED, JobStatus.SCHEDULING, actor="scheduler",
                                       values={"attempt": 1})
            other.commit()
        return job

    monkeypatch.setattr(job_service, "_load_for_change", load_then_the_manager_starts_it)
    killed = client.post(f"/api/v1/jobs/{job_id}/kill", headers=world.auth("alice"))
    assert killed.status_code == 202, killed.get_json()
    assert client.get(f"/api/v1/jobs/{job_id}", headers=world.auth("alice")).get_json()["status"] == "killing"
