"""Virtual clusters: per-SKU quota, scheduling policy and limits, storage and pod policy."""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from dlts.models.base import Base, BigId, Timestamp, utcnow


class VirtualCluster(Base):
    __tablename__ = "vcs"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(64), unique=True)
    # {"a100": 64, ...}: GPUs per SKU (cluster admin)
    quota: Mapped[dict] = mapped_column(sa.JSON, default=dict)
    # cores and bytes for CPU-only work; NULL: in proportion to the GPU quota's node shapes
    cpu_quota: Mapped[float | None] = mapped_column(sa.Float)
    memory_quota_bytes: Mapped[int | None] = mapped_column(sa.BigInteger)
    policy: Mapped[str] = mapped_column(sa.String(16), default="RF")
    max_job_time_s: Mapped[int | None] = mapped_column(sa.Integer)
    max_interactive_gpus: Mapped[int | None] = mapped_column(sa.Integer)
    user_gpu_quota: Mapped[int | None] = mapped_column(sa.Integer)
    # backfill: runtime assumed for jobs with no limit; NULL: the cluster default (revision 0015)
    default_runtime_estimate_s: Mapped[int | None] = mapped_column(sa.Integer)
    allow_cpu_jobs_on_gpu_nodes: Mapped[bool] = mapped_column(sa.Boolean, default=True)
    # privileged pod features this VC may use (cluster admin): {"privileged": false, "host_network": ...}
    pod_policy: Mapped[dict] = mapped_column(sa.JSON, default=dict)
    # mounted into the VC's jobs, validated by services.vc_storage: {"nfs": [...], "host": [...], "home": {...},
    # "lustre": {"pool", "osts", "mdt", "directory", "project_id", ...} (docs/lustre.md)}
    storage: Mapped[dict] = mapped_column(sa.JSON, default=dict)
    # the VC's POSIX group, a supplementary group of its jobs' processes (revision 0005)
    gid: Mapped[int | None] = mapped_column(sa.Integer)
    # scratch space a job's pod may use on its node, and the most a job may ask; NULL: the cluster default
    ephemeral_storage_bytes: Mapped[int | None] = mapped_column(sa.BigInteger)
    notice: Mapped[str | None] = mapped_column(sa.Text)  # banner VC admins set for members
    # abuse limits per user in this VC (revision 0008); NULL: the cluster's default from dlts.yaml
    # (max_queued_jobs_per_user, max_submissions_per_minute); 0: no limit
    max_queued_jobs_per_user: Mapped[int | None] = mapped_column(sa.Integer)
    max_submissions_per_minute: Mapped[int | None] = mapped_column(sa.Integer)
    # the idle-job policy (revision 0012): {"idle_warn_min", "idle_action_min", "idle_action", "exempt_types"};
    # NULL: off (services/vcs.py check_idle_policy, managers/insight.py)
    idle_policy: Mapped[dict | None] = mapped_column(sa.JSON)
    # scheduling settings a VC admin may change at runtime (revision 0017); NULL: not set on the VC, so
    # dlts.yaml's vc_scheduling entry for it, else the cluster's (services/vcs.py scheduling_of)
    fair_share: Mapped[bool | None] = mapped_column(sa.Boolean)
    # seconds after which fair share stops holding a job back (revision 0018); NULL: not set on the VC
    fair_share_max_wait_s: Mapped[int | None] = mapped_column(sa.Integer)
    # shorter limits first: each job ranks as if queued this many times its limit later (revision
    # 0020); NULL: not set on the VC
    limit_weight: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    min_runtime_s: Mapped[int | None] = mapped_column(sa.Integer)
    max_reclaim_delay_s: Mapped[int | None] = mapped_column(sa.Integer)
    max_preemptions: Mapped[int | None] = mapped_column(sa.Integer)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow, onupdate=utcnow)


class VcEvent(Base):
    """One changed setting of one VC (quota, policy, limits) with who changed it, old and new value.

    Rows name the VC rather than reference it, so the history outlives a deleted VC (revision 0002).
    """

    __tablename__ = "vc_events"
    __table_args__ = (sa.Index("ix_vc_events_vc_id", "vc", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    vc: Mapped[str] = mapped_column(sa.String(64))
    at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    actor: Mapped[str] = mapped_column(sa.String(64))
    field: Mapped[str] = mapped_column(sa.String(64))  # quota, policy, max_job_time_s, ..., created, deleted
    old_value: Mapped[Any] = mapped_column(sa.JSON, nullable=True)
    new_value: Mapped[Any] = mapped_column(sa.JSON, nullable=True)
