"""The backfill pass memoises node fits and quota-counter checks for speed; a memo may only save
time, never change a decision. Seeded benchmark-shaped snapshots (bench/scheduler_pass.py) are
decided with the memos on and off and must give the same starts, stops, waits and reservations."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from dlts.scheduler import decide, reservations

BENCH = Path(__file__).resolve().parents[2] / "bench" / "scheduler_pass.py"


def _build_snapshot():
    spec = importlib.util.spec_from_file_location("scheduler_pass", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.build_snapshot


def _decisions(snap, monkeypatch, memoise: bool):
    monkeypatch.setattr(reservations, "MEMOISE", memoise)
    d = decide(snap, 200_000.0)
    return (
        sorted((s.job_id, s.placements, s.scale_up) for s in d.starts),
        sorted(map(repr, d.stops)),
        sorted(map(repr, d.waits)),
        sorted(map(repr, d.reservations)),
    )


@pytest.mark.parametrize("seed,jobs,nodes", [(1, 1500, 150), (2, 2500, 120), (3, 3000, 300)])
def test_memoised_backfill_decides_as_the_plain_model(monkeypatch, seed: int, jobs: int, nodes: int) -> None:
    snap = _build_snapshot()(jobs, nodes, seed=seed, policy="backfill")
    plain = _decisions(snap, monkeypatch, False)
    memo = _decisions(snap, monkeypatch, True)
    assert plain[3], "the snapshot must exercise reservations"
    assert memo == plain
