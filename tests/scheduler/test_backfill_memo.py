"""The backfill pass memoises node fits and quota-counter checks for speed (and the pass state
keeps the last job's request); a memo may only save time, never change a decision. Seeded
benchmark-shaped snapshots (bench/scheduler_pass.py) are decided with the memos on and off and
must give the same starts, stops, waits and reservations. The same snapshots check that a pass
leaves no reference cycles behind (what it built is freed as it ends, not walked later by the
cyclic collector)."""

from __future__ import annotations

import gc
import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest

from dlts.scheduler import decide, reservations, state

BENCH = Path(__file__).resolve().parents[2] / "bench" / "scheduler_pass.py"


def _build_snapshot():
    spec = importlib.util.spec_from_file_location("scheduler_pass", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.build_snapshot


def _decisions(snap, monkeypatch, memoise: bool):
    monkeypatch.setattr(reservations, "MEMOISE", memoise)
    monkeypatch.setattr(state, "MEMOISE", memoise)
    d = decide(snap, 200_000.0)
    return (
        sorted((s.job_id, s.placements, s.scale_up) for s in d.starts),
        sorted(map(repr, d.stops)),
        sorted(map(repr, d.waits)),
        sorted(map(repr, d.reservations)),
    )


@pytest.mark.parametrize("seed,jobs,nodes,fair_share,kept", [(1, 1500, 150, False, False), (2, 2500, 120, False, False),
                                                            (3, 3000, 300, False, False), (9, 3000, 300, True, False),
                                                            (10, 3000, 300, True, True)])
def test_memoised_backfill_decides_as_the_plain_model(monkeypatch, seed: int, jobs: int, nodes: int,
                                                      fair_share: bool, kept: bool) -> None:
    snap = _build_snapshot()(jobs, nodes, seed=seed, policy="backfill", fair_share=fair_share)
    if kept:  # the next pass: the jobs this one reserved for hold their reservations
        held = {w.job_id for w in decide(snap, 200_000.0).waits if w.estimated_start is not None}
        assert held
        snap = replace(snap, jobs=tuple(replace(j, reserved=True) if j.id in held else j for j in snap.jobs))
    plain = _decisions(snap, monkeypatch, False)
    memo = _decisions(snap, monkeypatch, True)
    assert plain[3], "the snapshot must exercise reservations"
    assert memo == plain


@pytest.mark.parametrize("seed,policy", [(4, "RF"), (5, None), (6, "FIFO"), (7, "backfill")])
def test_per_pass_caches_decide_as_without(monkeypatch, seed: int, policy: str | None) -> None:
    """The per-pass caches every policy shares (reclaim's per-node cost bound) and the backfill
    lists of reserved nodes too full for a shape follow the same switch: identical decisions,
    with reclaim exercised (stops) on every policy mix."""
    snap = _build_snapshot()(4000, 400, seed=seed, policy=policy)
    plain = _decisions(snap, monkeypatch, False)
    memo = _decisions(snap, monkeypatch, True)
    assert plain[1], "the snapshot must exercise reclaim"
    assert memo == plain


def _small_snapshot(seed: int, policy: str):
    """A crowded small cluster: preemptible and stopping work, inference jobs whose replicas are
    reclaimed several at a time, preemption budgets, so the caches' invalidations matter."""
    import random

    from dlts.scheduler import Job, JobType, Node, Placement, Policy, SkuShape, Snapshot, Vc

    gib = 1024**3
    rng = random.Random(seed)
    skus = {"a100": SkuShape("a100", 8, 96.0, 1024 * gib)}
    nodes = tuple(Node(f"n{i:02d}", "a100", 8, 96.0, 1024 * gib, f"ib{i % 2}") for i in range(rng.randint(4, 10)))
    vcs = {
        name: Vc(name, {"a100": 8 * len(nodes)}, Policy(policy), max_job_time_s=86400,
                 min_runtime_s=rng.choice([0.0, 0.0, 5000.0]),
                 max_reclaim_delay_s=rng.choice([None, 1000.0]), max_preemptions=rng.choice([0, 1]))
        for name in ("va", "vb")
    }
    jobs: list[Job] = []
    jid = 0
    for ns in nodes:
        free = list(range(8))
        while free and rng.random() < 0.9:
            g = min(len(free), rng.choice([1, 2, 4]))
            gpus, free = tuple(free[:g]), free[g:]
            jid += 1
            jobs.append(Job(id=jid, vc=rng.choice(list(vcs)), user="u", type=JobType.BATCH, sku="a100", gpus=g,
                            cpu=4.0 * g, memory_bytes=8 * gib * g, queue_time=0.0, priority=rng.choice([50, 100]),
                            preemptible=rng.random() < 0.6, running=True, started_at=float(rng.randint(0, 9000)),
                            stopping=rng.random() < 0.1, preemptions=rng.choice([0, 1]),
                            placements=(Placement(ns.name, gpus, 4.0 * g, 8 * gib * g),)))
    for _ in range(rng.randint(10, 40)):
        jid += 1
        kind = rng.random()
        common = dict(id=jid, vc=rng.choice(list(vcs)), user=f"u{rng.randrange(3)}", sku="a100", cpu=0.0,
                      memory_bytes=0, queue_time=float(rng.randint(0, 9000)), priority=rng.choice([100, 200]),
                      preemptible=rng.random() < 0.2)
        if kind < 0.3:
            jobs.append(Job(type=JobType.INFERENCE, gpus=rng.choice([1, 2]), min_replicas=rng.choice([2, 3]),
                            max_replicas=4, **common))
        elif kind < 0.4:
            jobs.append(Job(type=JobType.DISTRIBUTED, gpus=8, nodes=2, **common))
        else:
            jobs.append(Job(type=JobType.BATCH, gpus=rng.choice([1, 2, 4, 8]), **common))
    return Snapshot(skus, nodes, vcs, tuple(jobs))


@pytest.mark.parametrize("policy", ["RF", "backfill"])
def test_caches_decide_as_without_on_small_crowded_clusters(monkeypatch, policy: str) -> None:
    stopped = 0
    for seed in range(150):
        snap = _small_snapshot(seed, policy)
        plain = _decisions(snap, monkeypatch, False)
        assert _decisions(snap, monkeypatch, True) == plain, seed
        stopped += len(plain[1])
    assert stopped > 50  # reclaim ran


@pytest.mark.parametrize("policy", ["RF", None, "FIFO", "backfill"])
def test_a_pass_leaves_no_reference_cycles(policy: str | None) -> None:
    """A node and its pool, or the time model and the backfill pass, referring to each other made
    every pass's state cyclic garbage: ~340,000 objects at 100k jobs x 10k nodes that the collector
    walked after each pass (0.8 s)."""
    snap = _build_snapshot()(4000, 400, seed=8, policy=policy)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds stays in gc.garbage to be looked at
    try:
        decisions = decide(snap, 200_000.0)
        assert decisions.starts and decisions.waits
        gc.collect()
        # only the scheduler's own objects count: a thread another test left running (a live
        # server) may make garbage of its own meanwhile
        ours = [o for o in gc.garbage if type(o).__module__.startswith("dlts.scheduler")]
        assert ours == [], f"{len(ours)} scheduler objects in reference cycles, e.g. {ours[:3]!r}"[:2000]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
