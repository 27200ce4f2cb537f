"""The current insight findings of running jobs (managers/insight.py, docs/monitoring.md#insight).

One row per job and finding ``code`` while the finding holds; the job's ``insight`` events are the
history (one when a finding appears or changes, one when it clears). The row of ``gpus_idle`` also
carries the VC's idle-job policy state: when the owner was warned and when the job was acted on.
No foreign key: the rows go when the job stops running (the insight manager) or with the job (the
janitor).
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from dlts.models.base import Base, BigId, Timestamp, utcnow


class JobInsight(Base):
    __tablename__ = "job_insights"
    __table_args__ = (sa.UniqueConstraint("job_id", "code"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(sa.BigInteger)
    attempt: Mapped[int] = mapped_column(sa.Integer)
    code: Mapped[str] = mapped_column(sa.String(32))  # gpus_idle | low_utilisation | ...
    key: Mapped[str] = mapped_column(sa.String(128))  # what makes the finding "the same" (a new event when it changes)
    message: Mapped[str] = mapped_column(sa.String(1024))  # the latest wording (its numbers move; no event for that)
    since: Mapped[dt.datetime] = mapped_column(Timestamp)  # when the condition began, as far as the history shows
    raised_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    # the idle-job policy (gpus_idle only): the owner was told at warned_at; the job was paused/killed at acted_at
    warned_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    acted_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
