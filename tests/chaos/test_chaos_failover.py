"""Leader failover: two real ``dlts managers`` processes on one database under a submission load
through the API. The leader is killed -9, later (on MariaDB) the new leader is frozen with SIGSTOP; each time
the standby takes over within lease_s (plus the poll), the frozen one, resumed, stops acting
before its next write, and every accepted job runs once and finishes (docs/reliability.md)."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
from chaos_kit import (
    ApiServer,
    Cluster,
    Submitter,
    assert_once_per_attempt,
    figures,
    lease_row,
    ledger_command,
    statuses,
    wait_all_ended,
    wait_for_holder,
    write_config,
)

from dlts.models import JobStatus

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]
SEED = int(os.environ.get("DLTS_CHAOS_SEED", "1616"))
LEASE_S = 3.0
SLACK_S = 1.5  # a busy 2-core machine: the poll's own lateness, process scheduling


def running_or_done(sessions, ids) -> int:
    return sum(1 for v in statuses(sessions, ids).values() if v in (JobStatus.RUNNING, JobStatus.FINISHED))


def test_the_standby_takes_over_after_kill_9_and_sigstop_and_no_job_runs_twice_or_is_lost(
        app, settings, sessions, world, tmp_path):
    rng = random.Random(SEED)
    sqlite = settings.database_url.startswith("sqlite")
    ledger = tmp_path / "ledger"
    cluster = Cluster(write_config(tmp_path / "dlts.yaml", settings, lease_s=LEASE_S), tmp_path)
    try:
        with ApiServer(app) as api:
            a = cluster.start("ctl-a")
            wait_for_holder(sessions, "ctl-a", 60)
            b = cluster.start("ctl-b")
            b.wait_ready()
            submitter = Submitter(api.url, world.tokens["alice"], ledger_command(ledger, 0.4), count=40,
                                  every_s=0.15).start()
            # under load: kill -9 the leader at a seeded moment once jobs run
            deadline = time.monotonic() + 60
            while running_or_done(sessions, list(submitter.accepted)) < 3 + rng.randrange(4):
                assert time.monotonic() < deadline, "no job ran under the first leader"
                time.sleep(0.05)
            time.sleep(rng.uniform(0, 1))
            a.kill()
            took_after_kill = wait_for_holder(sessions, "ctl-b", LEASE_S + SLACK_S + 5, logs=(a, b))
            assert took_after_kill <= LEASE_S + SLACK_S, took_after_kill
            a2 = cluster.start("ctl-a2")  # the killed node's managers come back, as standby
            a2.wait_ready()
            if sqlite:  # a holder frozen mid-write locks SQLite's whole file: no take-over until it resumes
                submitter.join(60)
                wait_all_ended(sessions, submitter.accepted, 90)
                assert lease_row(sessions)[:2] == ("ctl-b", 2)
                assert submitter.answers == {201: 40}
                counts = assert_once_per_attempt(sessions, submitter.accepted, ledger)
                assert counts["attempts"] == counts["jobs"]
                pytest.skip("kill -9 failover passed; the SIGSTOP half needs a server database (docs/reliability.md)")
            time.sleep(rng.uniform(0, 1))
            # freeze the leader (a hang), mid-work; the standby takes over, the leader resumes later
            b.proc.send_signal(signal.SIGSTOP)
            try:
                took_after_stop = wait_for_holder(sessions, "ctl-a2", LEASE_S + SLACK_S + 10, logs=(b, a2))
                time.sleep(1.0)
            finally:
                b.proc.send_signal(signal.SIGCONT)
            assert took_after_stop <= LEASE_S + SLACK_S, took_after_stop
            submitter.join(60)
            ended_s = wait_all_ended(sessions, submitter.accepted, 90)
        holder, token, _ = lease_row(sessions)
        assert (holder, token) == ("ctl-a2", 3)  # three holders, one token each
        assert "ctl-b lost it (token 2)" in b.log_text()  # the resumed one noticed and stopped acting
        assert b.proc.poll() is None  # and stands by
        assert submitter.answers == {201: 40}
        counts = assert_once_per_attempt(sessions, submitter.accepted, ledger)
        assert counts["attempts"] == counts["jobs"]  # no job got a second attempt from the failovers
        figures("failover", {"seed": SEED, "lease_s": LEASE_S, "takeover_after_kill_9_s": round(took_after_kill, 2),
                             "takeover_after_sigstop_s": round(took_after_stop, 2),
                             "drain_after_last_submission_s": round(ended_s, 1), **counts})
    finally:
        cluster.close()
