"""Nodes, their health findings from the agent, repair orders for the agent, and node events.

``Node.state`` is the repair state machine's (dlts.repair.machine: one transition table; every
change is a compare-and-set with a ``node_events`` row, see repositories/repair.py). A cordon by a
cluster admin is separate (``cordoned_by``): repair never lifts it.
"""

from __future__ import annotations

import datetime as dt
import enum

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from dlts.models.base import Base, BigId, Timestamp, str_enum, utcnow
from dlts.repair.machine import NodeState, schedulable

__all__ = ["Node", "NodeEvent", "NodeEventKind", "NodeFinding", "NodeOrder", "NodeState"]


class NodeEventKind(enum.StrEnum):
    """What a ``node_events`` row records (stored as the value in a string column)."""

    TRANSITION = "transition"  # a state change of the repair machine (from_state -> to_state)
    STEP = "step"  # a repair step: ordered, advanced, jobs stopped
    PAUSE = "pause"  # repair paused or resumed (the node's or the cluster's switch)
    DRY_RUN = "dry_run"  # what the repair loop would have done (repair.dry_run)
    CORDON = "cordon"  # a cluster admin's cordon or uncordon


class Node(Base):
    __tablename__ = "nodes"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(253), unique=True)
    sku: Mapped[str] = mapped_column(sa.String(64), index=True)
    gpus: Mapped[int] = mapped_column(sa.Integer, default=0)
    cpu: Mapped[float] = mapped_column(sa.Float)
    memory_bytes: Mapped[int] = mapped_column(sa.BigInteger)
    ib_domain: Mapped[str] = mapped_column(sa.String(64), default="default")
    vc: Mapped[str | None] = mapped_column(sa.String(64))  # hard assignment
    state: Mapped[NodeState] = mapped_column(str_enum(NodeState, 32), default=NodeState.IN_SERVICE)
    ready: Mapped[bool] = mapped_column(sa.Boolean, default=True)
    health: Mapped[str] = mapped_column(sa.String(16), default="unknown")  # ok | warning | critical | unknown
    # why the node is in its state (the last transition's message) and since when
    state_reason: Mapped[str | None] = mapped_column(sa.String(512))
    state_changed_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    # "gpu" while a repair keeps the node serving with its healthy GPUs, "node" when it is all out
    repair_scope: Mapped[str | None] = mapped_column(sa.String(8))
    # GPU indices the scheduler never assigns (a GPU-scope repair, or one held for a human)
    unhealthy_gpus: Mapped[list] = mapped_column(sa.JSON, default=list)
    # a cluster admin's pause of repairs on this node: no new action, those in flight finish
    repair_paused: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    # a cluster admin's cordon (their name): no new work; repair never lifts it
    cordoned_by: Mapped[str | None] = mapped_column(sa.String(64))
    backend: Mapped[str] = mapped_column(sa.String(32), default="local")
    agent_token_hash: Mapped[str | None] = mapped_column(sa.String(64), unique=True)
    last_heartbeat_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    metrics: Mapped[dict] = mapped_column(sa.JSON, default=dict)  # last summary from the agent
    labels: Mapped[dict] = mapped_column(sa.JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow, onupdate=utcnow)

    @property
    def schedulable(self) -> bool:
        """New work may go here: ready, not cordoned by a human, in service (or serving with its
        healthy GPUs during a GPU-scope repair; ``unhealthy_gpus`` are excluded)."""
        return self.ready and self.cordoned_by is None and schedulable(self.state, self.repair_scope)


class NodeEvent(Base):
    """Append-only history of a node: state transitions, repair steps, pauses, dry-run decisions."""

    __tablename__ = "node_events"
    __table_args__ = (sa.Index("ix_node_events_node_id_id", "node_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    node_id: Mapped[int] = mapped_column(sa.ForeignKey("nodes.id", ondelete="CASCADE"))
    at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    kind: Mapped[str] = mapped_column(sa.String(16))  # a NodeEventKind
    from_state: Mapped[str | None] = mapped_column(sa.String(32))
    to_state: Mapped[str | None] = mapped_column(sa.String(32))
    reason: Mapped[str | None] = mapped_column(sa.String(64))
    message: Mapped[str | None] = mapped_column(sa.String(1024))
    actor: Mapped[str | None] = mapped_column(sa.String(64))  # "repair" or the cluster admin's name
    cycle_id: Mapped[int | None] = mapped_column(sa.BigInteger().with_variant(sa.Integer(), "sqlite"))


class NodeFinding(Base):
    """One health finding the agent reported; kept as history (cleared_at set when it goes away)."""

    __tablename__ = "node_findings"
    __table_args__ = (sa.Index("ix_node_findings_node_open", "node_id", "cleared_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    node_id: Mapped[int] = mapped_column(sa.ForeignKey("nodes.id", ondelete="CASCADE"))
    code: Mapped[str] = mapped_column(sa.String(64))
    severity: Mapped[str] = mapped_column(sa.String(16))
    device: Mapped[str | None] = mapped_column(sa.String(64))
    evidence: Mapped[dict] = mapped_column(sa.JSON, default=dict)
    action: Mapped[str | None] = mapped_column(sa.String(64))
    first_seen_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    last_seen_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    cleared_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)


class NodeOrder(Base):
    """A repair action the control plane orders; the agent picks it up in its report response."""

    __tablename__ = "node_orders"
    __table_args__ = (sa.Index("ix_node_orders_node_status", "node_id", "status"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    node_id: Mapped[int] = mapped_column(sa.ForeignKey("nodes.id", ondelete="CASCADE"))
    action: Mapped[str] = mapped_column(sa.String(32))  # reset_gpu | restart_service | reboot | drop_caches | gpu_diag
    target: Mapped[str | None] = mapped_column(sa.String(128))
    dry_run: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    status: Mapped[str] = mapped_column(sa.String(16), default="pending")  # a repair.machine.OrderStatus value
    result: Mapped[dict] = mapped_column(sa.JSON, default=dict)
    created_by: Mapped[str | None] = mapped_column(sa.String(64))  # a cluster admin, or "repair"
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    completed_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
