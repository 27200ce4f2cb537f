"""Accounting: the GPU-time rollup and the per-attempt utilisation history (docs/accounting.md).

``usage_totals`` holds one row per period (a UTC day, and the UTC month it lies in) x user x VC x
SKU x preemptible; ``usage_job_days`` one row per job and UTC day. Both are only ever incremented,
by the accounting manager's booking (services/accounting.py), in the same transaction that moves
the attempts' ``booked_until`` marks. Times are integer GPU-milliseconds so that sums are exact.

User and VC ids carry no foreign keys on purpose: accounting outlives the janitor's purge of old
jobs and the removal of a VC or user.

``utilisation_points`` is the downsampled history of one attempt on one node: one row a minute
(running means of the agent's samples in that minute), kept ``utilisation_retention_days``.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from dlts.models.base import Base, BigId, Timestamp


class UsageTotal(Base):
    __tablename__ = "usage_totals"
    __table_args__ = (
        sa.UniqueConstraint("period", "start", "user_id", "vc_id", "sku", "preemptible"),
        sa.Index("ix_usage_totals_period_start_vc_id", "period", "start", "vc_id"),
        sa.Index("ix_usage_totals_period_user_id_start", "period", "user_id", "start"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    period: Mapped[str] = mapped_column(sa.String(8))  # day | month
    start: Mapped[dt.date] = mapped_column(sa.Date)  # the day, or the month's first day
    user_id: Mapped[int] = mapped_column(sa.BigInteger)
    vc_id: Mapped[int] = mapped_column(sa.BigInteger)
    sku: Mapped[str] = mapped_column(sa.String(64))  # "" for CPU-only jobs
    preemptible: Mapped[bool] = mapped_column(sa.Boolean)
    gpu_ms: Mapped[int] = mapped_column(sa.BigInteger, default=0)  # allocated
    busy_gpu_ms: Mapped[int] = mapped_column(sa.BigInteger, default=0)  # utilisation x allocated, where sampled
    sampled_gpu_ms: Mapped[int] = mapped_column(sa.BigInteger, default=0)  # allocated time covered by samples


class UsageJobDay(Base):
    __tablename__ = "usage_job_days"
    __table_args__ = (
        sa.UniqueConstraint("job_id", "day"),
        sa.Index("ix_usage_job_days_day_job_id", "day", "job_id"),
        # one user's or one VC's jobs newest first: walked backwards by job id, stopping at the limit
        sa.Index("ix_usage_job_days_user_id_job_id_day", "user_id", "job_id", "day"),
        sa.Index("ix_usage_job_days_vc_id_job_id_day", "vc_id", "job_id", "day"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(sa.BigInteger)
    day: Mapped[dt.date] = mapped_column(sa.Date)
    user_id: Mapped[int] = mapped_column(sa.BigInteger)
    vc_id: Mapped[int] = mapped_column(sa.BigInteger)
    sku: Mapped[str] = mapped_column(sa.String(64))
    preemptible: Mapped[bool] = mapped_column(sa.Boolean)
    gpu_ms: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    busy_gpu_ms: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    sampled_gpu_ms: Mapped[int] = mapped_column(sa.BigInteger, default=0)


class UtilisationPoint(Base):
    __tablename__ = "utilisation_points"
    __table_args__ = (
        sa.UniqueConstraint("attempt_id", "node", "minute"),
        sa.Index("ix_utilisation_points_minute", "minute"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    attempt_id: Mapped[int] = mapped_column(sa.BigInteger)  # job_attempts.id (no FK: the janitor purges attempts)
    node: Mapped[str] = mapped_column(sa.String(253))
    minute: Mapped[dt.datetime] = mapped_column(Timestamp)  # start of the minute (UTC)
    samples: Mapped[int] = mapped_column(sa.Integer, default=0)  # reports folded into this point
    # {"<gpu index>": [samples, mean utilisation ratio or null, mean memory used bytes or null]}
    gpus: Mapped[dict] = mapped_column(sa.JSON, default=dict)
    cpu_samples: Mapped[int] = mapped_column(sa.Integer, default=0)
    cpu_cores: Mapped[float | None] = mapped_column(sa.Float)  # mean cores busy
    memory_bytes: Mapped[int | None] = mapped_column(sa.BigInteger)  # mean resident host memory
