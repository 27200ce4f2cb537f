"""The one place that converts ``JobAttempt.placements`` (JSON) to and from values:
``[{"node", "gpu_indices", "cpu", "memory_bytes", "replica", "retiring"?}, ...]``.

The job manager reads and writes the column through these, the metrics read it; the values are the
scheduler's ``Placement`` (a pure type: ``dlts.scheduler.model`` imports nothing of the database).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dlts.scheduler import model as core


@dataclass(frozen=True)
class Replica:
    """One entry of ``JobAttempt.placements``: a placement with its stable replica index.

    The index names the backend's per-replica objects (pod ``dlts-J-A-<index>``, the local run
    directory ``replicas/<index>``). ``retiring``: DLTS asked the replica to stop (inference
    scale-down); it holds its resources until the backend shows it gone, then leaves the list.
    """

    index: int
    placement: core.Placement
    retiring: bool = False


def replicas_from_json(rows: list | None) -> tuple[Replica, ...]:
    """The attempt's entries in order; an entry without ``replica`` (older rows) is its position."""
    out = []
    for position, p in enumerate(rows or []):
        placement = core.Placement(p["node"], tuple(p["gpu_indices"]), float(p["cpu"]), int(p["memory_bytes"]))
        out.append(Replica(int(p.get("replica", position)), placement, bool(p.get("retiring", False))))
    return tuple(out)


def replicas_to_json(replicas: Iterable[Replica]) -> list[dict]:
    rows = []
    for r in replicas:
        p = r.placement
        row = {"node": p.node, "gpu_indices": list(p.gpu_indices), "cpu": p.cpu, "memory_bytes": p.memory_bytes,
               "replica": r.index}
        if r.retiring:
            row["retiring"] = True
        rows.append(row)
    return rows


def placements_to_json(placements: Iterable[core.Placement]) -> list[dict]:
    """The entries of a new attempt: replica indexes 0, 1, 2, ... in placement order."""
    return replicas_to_json(Replica(i, p) for i, p in enumerate(placements))
