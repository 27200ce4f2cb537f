"""Which backend cordons the repair loop wants (pure): the job manager's node sync carries them out,
since only the job manager touches the cluster.

F3 ownership: DLTS cordons a node that leaves service as a whole (a node-scope repair, lost, held
for a human), records that it did (the Kubernetes backend's annotation), and uncordons only a node
it cordoned itself, once the node is back in service. A GPU-scope repair does not cordon: the node
keeps serving with its healthy GPUs, and DLTS places nothing on the faulty ones.
"""

from __future__ import annotations

from typing import Protocol

from dlts.repair.machine import NodeState, schedulable


class _NodeRow(Protocol):
    state: NodeState
    repair_scope: str | None


class _Info(Protocol):
    @property
    def unschedulable(self) -> bool: ...
    @property
    def cordoned_by_dlts(self) -> bool: ...


def repair_cordon(node: _NodeRow, info: _Info) -> bool | None:
    """True: cordon it now; False: lift DLTS's cordon now; None: leave it as it is."""
    wanted = not schedulable(node.state, node.repair_scope)
    if wanted and not info.unschedulable:
        return True
    if not wanted and node.state is NodeState.IN_SERVICE and info.unschedulable and info.cordoned_by_dlts:
        return False
    return None
