"""A node lost mid-job, at seeded random moments, on the fake Kubernetes API server (the real
client, the real Kubernetes backend and job manager; tests/k8s's harness): the kubelet stops
posting (Ready Unknown) under a running job. The job leaves the node within node_lost_after_s plus
one tick, its attempt is recorded (node_lost, no retry spent), it is requeued at the head of its
queue (ahead of jobs submitted after it) and is the one that runs when room comes back. Three
rounds, a different node and moment each (docs/reliability.md).

The agent-stopped variant (the repair manager's heartbeat_lost, the real agent reporting to the
live API) is tests/repair/test_end_to_end.py and tests/k8s/test_k8s_repair.py."""

from __future__ import annotations

import os
import random

import pytest
from chaos_kit import figures

from dlts.models import JobStatus
from tests.k8s.conftest import Harness, api, cluster, kubeconfig, log_dir, make_backend  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]
SEED = int(os.environ.get("DLTS_CHAOS_SEED", "1616"))
LOST_AFTER_S = 5.0
TICK_S = 1.0  # each pass of the job manager moves the cluster's clock this far
S = JobStatus


@pytest.fixture
def vision_quota() -> int:
    return 48  # the whole fake cluster (4 nodes x 8 GPUs) and the jobs that wait


@pytest.fixture
def h(api, cluster, settings, make_backend) -> Harness:  # noqa: F811
    settings = settings.model_copy(update={"node_lost_after_s": LOST_AFTER_S})
    harness = Harness(api, cluster, settings, lambda **kw: make_backend(node_lost_after_s=LOST_AFTER_S, **kw), watch=False)
    with cluster() as s:
        harness.manager.sync_nodes(s)
    return harness


def test_a_node_lost_mid_job_requeues_it_at_the_head_within_node_lost_after_s_and_a_tick(h):
    rng = random.Random(SEED)
    running = [h.submit(command="sleep infinity", gpus=8, name=f"whole-node-{i}") for i in range(4)]
    for _ in range(10):
        h.tick(TICK_S)
        if all(h.job(j).status is S.RUNNING for j in running):
            break
    assert all(h.job(j).status is S.RUNNING for j in running)
    waiting = [h.submit(command="sleep infinity", gpus=8, name=f"later-{i}") for i in range(2)]
    requeue_s = []
    for _round in range(3):
        for _ in range(rng.randrange(6)):  # a random moment of the jobs' run
            h.tick(TICK_S)
        victim = rng.choice(running)
        before = h.job(victim)
        attempts_before = len(h.attempts(victim))
        node = h.attempts(victim)[-1].placements[0]["node"]
        others = [j for j in running if j != victim]
        h.api.set_node_ready(node, False, status="Unknown")  # the kubelet stopped posting
        lost_at = h.api.clock()
        while h.job(victim).status is S.RUNNING:
            h.tick(TICK_S)
            assert h.api.clock() - lost_at <= LOST_AFTER_S + 3 * TICK_S, "the job stayed on the lost node"
        took = h.api.clock() - lost_at
        assert took <= LOST_AFTER_S + TICK_S, took
        requeue_s.append(took)
        attempts = h.attempts(victim)
        assert len(attempts) == attempts_before
        assert (attempts[-1].end_reason, attempts[-1].spends_retry) == ("node_lost", False)
        job = h.job(victim)
        assert job.status is S.QUEUED
        assert (job.retries_used, job.queue_time) == (before.retries_used, before.queue_time)
        h.tick(TICK_S)  # a scheduling pass: the waits are recorded
        assert h.job(victim).queue_position == 1  # at the head, ahead of the jobs submitted after it
        assert all(h.job(j).status is S.RUNNING for j in others)
        # the machine comes back: the room goes to the requeued job, not to the later ones
        h.api.set_node_ready(node, True)
        for _ in range(6):
            h.tick(TICK_S)
            if h.job(victim).status is S.RUNNING:
                break
        assert h.job(victim).status is S.RUNNING, (h.job(victim).status, h.job(victim).reason)
        assert len(h.attempts(victim)) == attempts_before + 1
        assert all(h.job(j).status is S.QUEUED for j in waiting)
    figures("node_lost", {"seed": SEED, "node_lost_after_s": LOST_AFTER_S, "tick_s": TICK_S, "rounds": 3,
                          "requeued_after_s": requeue_s})
