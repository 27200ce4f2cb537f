"""The ``ClusterBackend`` contract: the same cases against the local backend (real processes) and the
Kubernetes backend (the official client against the fake API server). A backend that passes them
can run DLTS's job manager."""

from __future__ import annotations

from collections.abc import Callable

from dlts.backends.base import RunPhase

DONE = (RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.GONE)


def phase_is(key: tuple[int, int], *phases: RunPhase) -> Callable[[dict], bool]:
    return lambda seen: key in seen and seen[key].phase in phases


def absent(key: tuple[int, int]) -> Callable[[dict], bool]:
    return lambda seen: key not in seen


def test_an_attempt_runs_to_success_and_says_when(cluster):
    cluster.backend.launch(cluster.spec(1, "echo hello"))
    seen = cluster.settle(phase_is((1, 1), RunPhase.SUCCEEDED))[(1, 1)]
    assert seen.exit_code == 0
    assert seen.finished_at is not None and seen.started_at is not None and seen.finished_at >= seen.started_at


def test_a_failing_command_reports_its_exit_code(cluster):
    cluster.backend.launch(cluster.spec(2, "echo oops; exit 3"))
    seen = cluster.settle(phase_is((2, 1), *DONE))[(2, 1)]
    assert (seen.phase, seen.exit_code) == (RunPhase.FAILED, 3)


def test_a_running_attempt_is_reported_running_then_terminated(cluster):
    cluster.backend.launch(cluster.spec(3, "sleep 300"))
    cluster.settle(phase_is((3, 1), RunPhase.RUNNING))
    cluster.backend.terminate(3, 1, grace_s=1)
    cluster.settle(lambda seen: (3, 1) not in seen or seen[(3, 1)].phase in DONE)
    cluster.backend.terminate(3, 1, grace_s=1)  # twice is harmless


def test_forget_removes_the_attempt(cluster):
    cluster.backend.launch(cluster.spec(4, "echo bye"))
    cluster.settle(phase_is((4, 1), RunPhase.SUCCEEDED))
    cluster.backend.forget(4, 1)
    assert (4, 1) not in cluster.observe()
    cluster.backend.forget(4, 1)  # twice is harmless


def test_garbage_collection_removes_what_no_row_owns(cluster):
    cluster.backend.launch(cluster.spec(5, "sleep 300"))
    cluster.backend.launch(cluster.spec(6, "sleep 300"))
    cluster.settle(lambda seen: all(k in seen and seen[k].phase is RunPhase.RUNNING for k in ((5, 1), (6, 1))))
    assert tuple(cluster.backend.collect_garbage(live={(6, 1)})) == ((5, 1),)
    seen = cluster.settle(absent((5, 1)))
    assert seen[(6, 1)].phase is RunPhase.RUNNING
    assert tuple(cluster.backend.collect_garbage(live={(6, 1)})) == ()


def test_launching_twice_runs_the_attempt_once(cluster):
    spec = cluster.spec(7, "echo once")
    cluster.backend.launch(spec)
    cluster.backend.launch(spec)
    cluster.settle(phase_is((7, 1), RunPhase.SUCCEEDED))
    cluster.backend.launch(spec)  # even after it ended: the same attempt is not started again
    cluster.settle(phase_is((7, 1), RunPhase.SUCCEEDED))
    cluster.backend.sync_logs([(7, 1)])
    cluster.backend.forget(7, 1)
    assert cluster.log(7) == b"once\n"


def test_the_log_is_readable_after_forget(cluster):
    cluster.backend.launch(cluster.spec(8, "echo first; sleep 1; echo second"))
    cluster.settle(phase_is((8, 1), RunPhase.RUNNING, RunPhase.SUCCEEDED))
    cluster.backend.sync_logs([(8, 1)])
    cluster.settle(phase_is((8, 1), RunPhase.SUCCEEDED))
    cluster.backend.forget(8, 1)
    assert cluster.log(8) == b"first\nsecond\n"
