"""The ``insight:`` section of dlts.yaml: how often the insight manager runs and the thresholds of
its rules (docs/configuration.md#insight, docs/monitoring.md#insight)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class InsightSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # the insight manager runs in `dlts managers` (and the demo) when on
    enabled: bool = True
    # seconds between passes
    interval_s: float = Field(300.0, ge=1, le=3600)
    # the node agents' report.interval_s: data older than two of these is never acted on (no
    # warning, no pause or kill, no finding raised or cleared)
    report_interval_s: float = Field(15.0, gt=0, le=3600)
    # a GPU is idle at or under this utilisation (0-1)
    idle_ratio: float = Field(0.05, ge=0.0, le=1.0)
    # gpus_idle: every GPU of the job idle this many minutes
    idle_min: float = Field(30.0, gt=0.0, le=7 * 24 * 60)
    # low_utilisation: the job's GPUs average under low_ratio over the last low_min minutes
    low_ratio: float = Field(0.30, ge=0.0, le=1.0)
    low_min: float = Field(60.0, gt=0.0, le=7 * 24 * 60)
    # gpus_partly_busy: some GPUs average at least busy_ratio, others idle, over the last partial_min minutes
    busy_ratio: float = Field(0.20, ge=0.0, le=1.0)
    partial_min: float = Field(30.0, gt=0.0, le=7 * 24 * 60)
    # gpu_memory_full: a GPU's memory at least memory_ratio full throughout the last memory_min minutes
    memory_ratio: float = Field(0.95, ge=0.0, le=1.0)
    memory_min: float = Field(10.0, gt=0.0, le=7 * 24 * 60)
    # cpu_bound: the job's processes use at least cpu_ratio of its cores while its GPUs average under
    # starved_ratio, over the last cpu_min minutes
    cpu_ratio: float = Field(0.90, ge=0.0, le=1.0)
    starved_ratio: float = Field(0.50, ge=0.0, le=1.0)
    cpu_min: float = Field(15.0, gt=0.0, le=7 * 24 * 60)
    # preemption_risk: tell preemptible jobs when non-preemptible work within its VCs' quota waits for their GPUs
    preemption_risk: bool = True

    @property
    def longest_window_min(self) -> float:
        return max(self.idle_min, self.low_min, self.partial_min, self.memory_min, self.cpu_min)
