"""Nodes, their health findings from the agent, and repair orders for the agent."""

from __future__ import annotations

import datetime as dt
import enum

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from dlts.models.base import Base, BigId, Timestamp, str_enum, utcnow


class NodeState(str, enum.Enum):
    IN_SERVICE = "in_service"
    CORDONED = "cordoned"
    UNHEALTHY = "unhealthy"
    IN_REPAIR = "in_repair"
    LOST = "lost"


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
    repair_state: Mapped[str | None] = mapped_column(sa.String(32))
    backend: Mapped[str] = mapped_column(sa.String(32), default="local")
    agent_token_hash: Mapped[str | None] = mapped_column(sa.String(64), unique=True)
    last_heartbeat_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    metrics: Mapped[dict] = mapped_column(sa.JSON, default=dict)  # last summary from the agent
    labels: Mapped[dict] = mapped_column(sa.JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow, onupdate=utcnow)

    @property
    def schedulable(self) -> bool:
        return self.ready and self.state is NodeState.IN_SERVICE


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
    action: Mapped[str] = mapped_column(sa.String(32))  # gpu_reset | restart_service | reboot | drop_caches
    target: Mapped[str | None] = mapped_column(sa.String(128))
    dry_run: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    status: Mapped[str] = mapped_column(sa.String(16), default="pending")  # pending|sent|done|failed
    result: Mapped[dict] = mapped_column(sa.JSON, default=dict)
    created_by: Mapped[str | None] = mapped_column(sa.String(64))
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    completed_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
