"""The quota_exceeds_vc 422 suggests "mark it preemptible" only when a preemptible job of that
shape could ever run on this cluster, and following the advice gives a job the scheduler starts."""

from __future__ import annotations

import sqlalchemy as sa

from dlts.jobmanager.snapshot import load_snapshot
from dlts.models import Job, Node
from dlts.scheduler import decide

from .helpers import assert_envelope

JOB = {"vc": "vision", "image": "debian:12", "command": "true", "type": "distributed", "nodes": 2}


def _second_node(sessions, domain: str) -> None:
    with sessions() as s:
        s.add(Node(name="testnode2", sku="demo-gpu", gpus=4, cpu=8, memory_bytes=32 * 2**30, ib_domain=domain,
                   labels={}, metrics={}))
        s.commit()


def _starts(sessions, settings, job_id: int) -> bool:
    with sessions() as s:
        d = decide(load_snapshot(s, settings), 1e10)
    return job_id in {x.job_id for x in d.starts}


def test_no_preemptible_advice_when_no_ib_domain_could_hold_the_gang(client, world, sessions, settings):
    _second_node(sessions, "elsewhere")  # two demo-gpu nodes, one per IB domain
    error = assert_envelope(client.post("/api/v1/jobs", json=JOB, headers=world.auth("alice")), 422, "quota_exceeds_vc")
    assert "VC vision has 4 demo-gpu GPUs; this job asks 8" in error["message"]
    assert "marking it preemptible would not help: only 1 demo-gpu node(s) open to VC vision in one IB domain" in error["message"]
    assert "or mark it preemptible" not in error["message"] and error["details"]["preemptible_could_run"] is False


def test_preemptible_advice_is_given_when_it_leads_to_a_job_that_runs(client, world, sessions, settings):
    _second_node(sessions, "elsewhere")
    spanning = JOB | {"ib_domain": "any"}
    error = assert_envelope(client.post("/api/v1/jobs", json=spanning, headers=world.auth("alice")), 422, "quota_exceeds_vc")
    assert "or mark it preemptible" in error["message"] and error["details"]["preemptible_could_run"] is True
    created = client.post("/api/v1/jobs", json=spanning | {"preemptible": True}, headers=world.auth("alice"))
    assert created.status_code == 201, created.get_json()
    assert _starts(sessions, settings, created.get_json()["id"])


def test_no_advice_when_the_sku_nodes_belong_to_another_vc(client, world, sessions, settings):
    _second_node(sessions, "local")
    with sessions() as s:
        s.execute(sa.update(Node).where(Node.name == "testnode2").values(vc="nlp"))
        s.commit()
    error = assert_envelope(client.post("/api/v1/jobs", json=JOB, headers=world.auth("alice")), 422, "quota_exceeds_vc")
    assert "marking it preemptible would not help" in error["message"]
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(Job.id))) == 0
