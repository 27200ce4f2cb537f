"""One refusal costs one job or one step, never the tick (the job manager against the fake API
server, whose faults are real ``Status`` answers; the same story against a real server's 403 is in
tests/k8s/real/test_real_refusals_and_loss.py).

For each way the API server says no to a request about one attempt (403 from a missing RBAC rule,
406 from content negotiation, 409, 422, and 500/503 from a kubelet that cannot be reached behind
``pods/log``; 404 too when a stop is refused): the job it is about ends as it should, the refusal is on it as a ``cluster``
event in words, its pods stay until the step goes through, and a job submitted meanwhile is
scheduled, launched and run to its end. A 5xx on any other request means the server is unwell: that
tick is skipped and the back-off decides when to try again, after which scheduling goes on.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from dlts.logstore import iter_log
from dlts.models import EventKind, JobEvent, JobStatus

S = JobStatus
# 404 on pods/log is no refusal: the pod is gone and nothing more of it can be read (logcopy)
REFUSALS = (403, 406, 409, 422, 500, 503)


def cluster_events(h, job_id: int) -> list[JobEvent]:
    with h.sessions() as s:
        rows = list(s.scalars(sa.select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == EventKind.CLUSTER)))
        for row in rows:
            s.expunge(row)
        return rows


@pytest.mark.parametrize("code", REFUSALS)
def test_a_refused_log_copy_keeps_that_jobs_pods_and_the_rest_of_the_cluster_runs(h, log_dir, code):
    first = h.submit(command="echo hello; sleep 1", gpus=1)
    h.tick()
    h.tick()
    assert h.job(first).status is S.RUNNING
    h.api.fail_next(10_000, code, verbs={"log"}, resources={"pods"})  # every log read from now on
    h.tick(2)
    assert h.job(first).status is S.FINISHED  # the job's outcome does not wait for its log
    [event] = cluster_events(h, first)
    assert event.reason == "cleanup" and f"HTTP {code}" in event.message
    assert "kept until their output is copied" in event.message
    assert [p["metadata"]["name"] for p in h.api.pods()] == [f"dlts-{first}-1-0"]
    second = h.submit(command="sleep 1", gpus=1)
    h.tick()
    h.tick()
    assert h.job(second).status is S.RUNNING
    h.tick(2)
    assert h.job(second).status is S.FINISHED  # launched, run and ended while the first's log is refused
    assert len(cluster_events(h, first)) == 1  # said once, tried every tick
    h.api.clear_faults()
    h.tick()
    assert h.api.pods() == []  # both copied, both deleted
    assert b"".join(iter_log(log_dir, first, 1, key=h.attempts(first)[0].log_key)) == b"hello\n"


@pytest.mark.parametrize("code", (403, 404, 422))
def test_a_refused_stop_is_said_on_the_job_and_the_others_still_start(h, code):
    victim = h.submit(command="sleep infinity", gpus=1)
    h.tick()
    h.tick()
    h.kill(victim)
    h.api.fail_next(1, code, verbs={"deletecollection"}, resources={"pods"})
    other = h.submit(command="sleep 1", gpus=1)
    h.tick()
    [event] = cluster_events(h, victim)
    assert event.reason == "stop" and f"HTTP {code}" in event.message
    assert h.job(other).status is S.SCHEDULING  # this very tick went on to schedule and launch
    h.tick()  # the stop is asked again
    h.tick(h.settings.preempt_grace_s + 1)
    assert h.job(victim).status is S.KILLED
    assert h.job(other).status is S.FINISHED


def test_a_5xx_elsewhere_skips_one_tick_then_scheduling_goes_on(h):
    h.api.fail_next(1, 500, verbs={"list"}, resources={"nodes"})
    job_id = h.submit(command="sleep 1", gpus=1)
    h.tick()
    assert h.job(job_id).status is S.QUEUED  # the server is unwell: nothing decided on what it said
    h.tick(h.backend.settings.backoff_max_s)
    assert h.job(job_id).status is S.SCHEDULING


def test_a_refused_cordon_costs_that_nodes_cordon_and_the_tick_goes_on(h):
    from dlts.models import Node, NodeState

    with h.sessions() as s:  # the repair manager took n1 out of service: node sync cordons it
        s.execute(sa.update(Node).where(Node.name == "n1").values(state=NodeState.DRAINING))
        s.commit()
    h.api.fail_next(1, 403, verbs={"patch"}, resources={"nodes"})
    job_id = h.submit(command="sleep 1", gpus=1)
    h.tick()
    assert not h.api.store.get("nodes", "", "n1")["spec"].get("unschedulable")  # refused this tick
    assert h.job(job_id).status is S.SCHEDULING  # and the same tick scheduled and launched
    h.tick()
    assert h.api.store.get("nodes", "", "n1")["spec"]["unschedulable"] is True  # asked again, done
