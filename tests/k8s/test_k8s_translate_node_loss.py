"""NodeLoss (backends/kubernetes/nodes.py): a NotReady node is lost once it has been so for
lost_after_s, never earlier, although the API server stamps lastTransitionTime in whole seconds."""

from __future__ import annotations

import datetime as dt

from dlts.backends.kubernetes.nodes import NodeLoss


def node(stamp: str, status: str = "Unknown") -> dict:
    return {"status": {"conditions": [{"type": "Ready", "status": status, "lastTransitionTime": stamp}]}}


def at(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp).timestamp()


def test_a_whole_second_stamp_counts_from_the_end_of_that_second():
    loss = NodeLoss(3.0)
    # the node went NotReady at 12:00:07.9 (stamped 12:00:07): at 12:00:10.5 it has been so 2.6 s only
    nodes = {"n1": node("2026-12-01T12:00:07Z")}
    assert loss.lost(nodes, ["n1"], at("2026-12-01T12:00:10.500000+00:00")) == {}
    assert "n1" in loss.lost(nodes, ["n1"], at("2026-12-01T12:00:11+00:00"))


def test_a_stamp_with_a_fraction_is_taken_as_it_is_and_a_ready_node_is_never_lost():
    loss = NodeLoss(3.0)
    assert "n1" in loss.lost({"n1": node("2026-12-01T12:00:07.250000Z")}, ["n1"], at("2026-12-01T12:00:10.300000+00:00"))
    assert loss.lost({"n1": node("2026-12-01T12:00:00Z", status="True")}, ["n1"], at("2026-12-01T13:00:00+00:00")) == {}
