"""``dlts managers`` killed -9 thirty times at seeded random moments while jobs are submitted and
run, a warm standby taking over each time; some of the kills are the process's own, inside
``LocalBackend.launch`` between a unit's mkdir and its pid record, or just after its init started
(tests/chaos/managers_child.py). Every job ends, each command runs once per recorded attempt, and
nothing is left in ``scheduling`` (docs/reliability.md)."""

from __future__ import annotations

import os
import random
import time

import pytest
import sqlalchemy as sa
from chaos_kit import (
    Cluster,
    assert_once_per_attempt,
    figures,
    lease_row,
    ledger_command,
    statuses,
    wait_all_ended,
    wait_for_holder,
    write_config,
)

from dlts.models import JobStatus, User
from dlts.services import jobs as job_service
from dlts.services.auth import principal_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]
SEED = int(os.environ.get("DLTS_CHAOS_SEED", "1616"))
KILLS = 30
LEASE_S = 2.0
KILL_IN_LAUNCH = 0.06  # between mkdir and the pid record of a unit; half that just after its init started


def submit(sessions, settings, command: str, count: int) -> list[int]:
    with sessions() as s:
        alice = principal_for(s, s.scalar(sa.select(User).where(User.name == "alice")))
        return [job_service.submit(s, settings, alice, job_service.JobRequest(
            vc="vision", image="debian:12", command=command, gpus=1, name="storm")).id for _ in range(count)]


def test_thirty_kill_9s_of_the_managers_lose_no_job_and_run_no_command_twice(settings, sessions, world, tmp_path):
    rng = random.Random(SEED)
    ledger = tmp_path / "ledger"
    command = ledger_command(ledger, 0.3)
    cluster = Cluster(write_config(tmp_path / "dlts.yaml", settings, lease_s=LEASE_S), tmp_path)
    began = time.monotonic()
    try:
        jobs = submit(sessions, settings, command, 8)
        serial = iter(range(1000))
        pool: dict[str, object] = {}

        def top_up() -> None:  # two warm standbys besides the leader (a start takes seconds on a busy machine)
            for name in [n for n, m in pool.items() if m.proc.poll() is not None]:
                del pool[name]
            while len(pool) < 3:
                n = next(serial)
                # the first leader, and a few later ones, die at their first launch for sure
                m = cluster.fork(f"storm-{n}", kill_in_launch=KILL_IN_LAUNCH, seed=rng.randrange(10**6),
                                 kill_first_launch=n % 8 == 0)
                pool[m.holder] = m
                if len(pool) == 1:
                    wait_for_holder(sessions, m.holder, 60)

        def own_kills() -> int:  # the processes that killed themselves inside launch
            return sum(m.log_text().count("chaos: SIGKILL") for m in cluster.started)

        top_up()
        kills = 0
        token = 0
        while kills + own_kills() < KILLS:
            # the live holder (after a kill, a standby takes over once the lease runs out)
            deadline = time.monotonic() + 60
            while True:
                holder, now_token, _ = lease_row(sessions)
                leader = pool.get(holder)
                if now_token > token and leader is not None and leader.proc.poll() is None:
                    break
                top_up()
                assert time.monotonic() < deadline, f"no live holder after {kills} kills: {holder}, token {now_token}"
                time.sleep(0.05)
            token = now_token
            end = time.monotonic() + rng.uniform(0.3, 1.5)
            while time.monotonic() < end and leader.proc.poll() is None:
                time.sleep(0.02)
            if leader.proc.poll() is None:
                leader.kill()
                kills += 1
            jobs += submit(sessions, settings, command, rng.randrange(3))
            top_up()
        own = own_kills()
        storm_s = time.monotonic() - began
        for m in pool.values():
            m.kill()
        final = cluster.fork("storm-final")  # no faults: it finishes what the storm left
        wait_for_holder(sessions, "storm-final", 30)
        ended_s = wait_all_ended(sessions, jobs, 90, also=lambda: final.proc.poll() is None or pytest.fail("final died"))
        st = statuses(sessions, jobs)
        assert not [j for j, v in st.items() if v is JobStatus.SCHEDULING]
        counts = assert_once_per_attempt(sessions, jobs, ledger)
        logs = "".join(m.log_text() for m in cluster.started)
        relaunched = logs.count("left half-made")
        assert "chaos: SIGKILL between" in logs and relaunched >= 1  # half-made units, started afresh
        figures("managers_kill_9", {"seed": SEED, "kills": kills + own, "kills_inside_launch": own,
                                    "kills_between_mkdir_and_pid": logs.count("chaos: SIGKILL between"), "lease_s": LEASE_S,
                                    "half_made_units_relaunched": relaunched, "storm_s": round(storm_s, 1),
                                    "drain_after_storm_s": round(ended_s, 1), **counts})
    finally:
        cluster.close()
