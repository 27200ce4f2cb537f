"""GPU collector: one NVML read of every GPU (see dlts_agent.nvml for the rules on missing fields)."""

from __future__ import annotations

from dlts_agent.model import GpuReadout
from dlts_agent.nvml import Nvml


class GpuCollector:
    name = "gpu"

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml

    def collect(self) -> tuple[GpuReadout, list[str]]:
        # NvmlUnavailable -> this collector FAILED. A lost GPU is not an error of the collector:
        # it is a fact about the node, exported as dlts_gpu_lost and turned into a finding.
        return self.nvml.read(), []

    def close(self) -> None:
        self.nvml.close()
