"""The typed ``repair:`` section of dlts.yaml (docs/configuration.md#repair, docs/repair.md)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class RepairSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # the repair manager runs in `dlts managers` every interval_s
    enabled: bool = True
    interval_s: float = Field(10.0, gt=0, le=3600)
    # decide and record what would be done (node events of kind dry_run), change nothing
    dry_run: bool = False
    # YAML with rules replacing or adding to the defaults, for all SKUs or per SKU (docs/repair.md)
    rules_file: Path | None = None
    # at most this many nodes of a SKU in repair at once: a number ("2") or a percentage ("10%")
    # of the SKU's nodes (rounded down, at least 1); beyond it nodes wait quarantined
    max_nodes_in_repair: str = "10%"
    # a node that fails again this soon after returning starts one step further down the chain
    flap_window_s: float = Field(86400.0, ge=0)
    # validation: the agent must report this long after the remediation with everything healthy
    quiet_period_s: float = Field(60.0, ge=0)
    # ... and within this time, or validation has failed
    validation_timeout_s: float = Field(1800.0, gt=0)
    # ... and then the GPU diagnostic: the agent runs `dcgmi diag -r validation_diag_level` on the
    # repaired GPUs (the whole node for a node-scope repair). auto: where dcgmi is installed (a node
    # without it validates on its report alone); required: a node without dcgmi fails validation;
    # off: never
    validation_diag: Literal["auto", "required", "off"] = "auto"
    validation_diag_level: int = Field(1, ge=1, le=4)
    validation_diag_timeout_s: float = Field(1200.0, gt=0)  # from the order to its result
    # a heartbeat older than this is the finding heartbeat_lost (None: the top-level node_lost_after_s)
    lost_after_s: float | None = Field(None, gt=0)
    # send notices through the notifier (dlts.services.notify)
    notify: bool = True

    @field_validator("max_nodes_in_repair", mode="before")
    @classmethod
    def _budget(cls, value: object) -> str:
        text = str(value).strip()
        number = text[:-1] if text.endswith("%") else text
        try:
            amount = float(number)
        except ValueError:
            raise ValueError("a number of nodes (2) or a percentage of a SKU's nodes (10%)") from None
        if not math.isfinite(amount) or amount < 0 or (text.endswith("%") and amount > 100) or \
                (not text.endswith("%") and amount != int(amount)):
            raise ValueError("a whole number of nodes >= 0, or a percentage between 0% and 100%")
        return text

    def lost_after(self, node_lost_after_s: float) -> float:
        """Seconds of silence after which an agent's node is lost: ``lost_after_s``, else the
        top-level ``node_lost_after_s`` (the repair manager and the API read it here)."""
        return self.lost_after_s or node_lost_after_s

    def budget_for(self, sku_nodes: int) -> int:
        """How many nodes of a SKU with ``sku_nodes`` nodes may be in repair at once."""
        text = self.max_nodes_in_repair
        if text.endswith("%"):
            share = float(text[:-1])
            return 0 if share == 0 else max(1, math.floor(sku_nodes * share / 100))
        return int(text)
