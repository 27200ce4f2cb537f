"""Repair cycles (one per trip of a node through the repair loop), their steps, and the global pause.

A cycle records what triggered it, the chain it follows (a copy of the rule's steps, so a changed
rules file does not rewrite history), where it stands and how it ended. ``open_node_id`` is the
node's id while the cycle is open and NULL afterwards: a unique column, so a node never has two
open cycles, whatever crashes or a second managers process do.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from dlts.models.base import Base, BigId, Timestamp, utcnow


class RepairCycle(Base):
    __tablename__ = "repair_cycles"
    __table_args__ = (sa.Index("ix_repair_cycles_node_id_id", "node_id", "id"),
                      sa.Index("ix_repair_cycles_ended_at", "ended_at"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    node_id: Mapped[int] = mapped_column(sa.ForeignKey("nodes.id", ondelete="CASCADE"))
    open_node_id: Mapped[int | None] = mapped_column(sa.BigInteger().with_variant(sa.Integer(), "sqlite"), unique=True)
    kind: Mapped[str] = mapped_column(sa.String(16), default="rule")  # a repair.machine.CycleKind value
    rule: Mapped[str | None] = mapped_column(sa.String(128))  # the rule's key, e.g. gpu_ecc_uncorrected/critical
    scope: Mapped[str] = mapped_column(sa.String(8))  # gpu | node
    gpus: Mapped[list] = mapped_column(sa.JSON, default=list)
    severity: Mapped[str] = mapped_column(sa.String(16))
    problem: Mapped[str] = mapped_column(sa.String(512))  # "GPU 3 has uncorrectable ECC errors"
    # [{"code", "severity", "device", "message"}] of the findings that opened it
    triggers: Mapped[list] = mapped_column(sa.JSON, default=list)
    # [{"remediation", "timeout_s", "target"}]: the chain as it was when the cycle opened
    steps: Mapped[list] = mapped_column(sa.JSON, default=list)
    step_index: Mapped[int] = mapped_column(sa.Integer, default=0)
    state: Mapped[str] = mapped_column(sa.String(32))  # the node's state while open; "ended" after
    flap: Mapped[bool] = mapped_column(sa.Boolean, default=False)  # opened within flap_window_s of a return
    started_by: Mapped[str] = mapped_column(sa.String(64), default="repair")
    started_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    queued_until: Mapped[dt.datetime | None] = mapped_column(Timestamp)  # when the budget let it leave
    validation_since: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    ended_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    # a repair.machine.CycleOutcome value
    outcome: Mapped[str | None] = mapped_column(sa.String(32))
    message: Mapped[str | None] = mapped_column(sa.String(1024))


class RepairStep(Base):
    """One remediation tried in a cycle: its agent orders, deadline and result."""

    __tablename__ = "repair_steps"
    __table_args__ = (sa.UniqueConstraint("cycle_id", "number"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    cycle_id: Mapped[int] = mapped_column(sa.ForeignKey("repair_cycles.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(sa.Integer)  # the step's index in the cycle's chain
    remediation: Mapped[str] = mapped_column(sa.String(32))
    target: Mapped[str | None] = mapped_column(sa.String(128))
    order_ids: Mapped[list] = mapped_column(sa.JSON, default=list)  # node_orders ids (one per GPU for reset_gpu)
    started_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    deadline_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    ended_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    result: Mapped[str | None] = mapped_column(sa.String(16))  # a repair.machine.StepResult value
    message: Mapped[str | None] = mapped_column(sa.String(1024))


class RepairControl(Base):
    """The global pause (one row, id 1): no new repair actions anywhere; those in flight finish."""

    __tablename__ = "repair_control"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    paused: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    paused_by: Mapped[str | None] = mapped_column(sa.String(64))
    paused_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    reason: Mapped[str | None] = mapped_column(sa.String(512))
