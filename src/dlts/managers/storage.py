"""The storage manager's Lustre pass: each VC's ``storage["lustre"]`` settings become its OST pool,
its directory on its MDT, its default layout and its project quota, through ``dlts_lustre``.

It reads the current state, applies only what changes (a second pass does nothing) and never runs
an unsafe plan (shrinking a quota below usage, destroying a non-empty pool): those are logged for an
operator to run ``dlts-lustre apply --force`` by hand.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

import sqlalchemy as sa
import yaml
from sqlalchemy.orm import Session

from dlts.models import VirtualCluster

log = logging.getLogger(__name__)


class StorageConfigError(ValueError):
    """The cluster defaults or a VC's Lustre settings are invalid (the message names the key)."""


class LustreStorageManager:
    def __init__(self, session_factory: Callable[[], Session], defaults_file: Path, client_factory=None):
        self.session_factory = session_factory
        self.defaults_file = Path(defaults_file)
        self.client_factory = client_factory

    def _defaults(self) -> dict[str, Any]:
        try:
            data = yaml.safe_load(self.defaults_file.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise StorageConfigError(f"lustre_defaults_file {self.defaults_file}: {exc}") from None
        if not isinstance(data, dict):
            raise StorageConfigError(f"lustre_defaults_file {self.defaults_file} must be a mapping")
        return data

    def policy(self):
        from dlts_lustre.policy import PolicyError, policy_from_vcs

        with self.session_factory() as session:
            vcs = [{"name": vc.name, **(vc.storage or {})["lustre"]}
                   for vc in session.scalars(sa.select(VirtualCluster).order_by(VirtualCluster.name))
                   if (vc.storage or {}).get("lustre")]
        try:
            return policy_from_vcs(vcs, self._defaults())
        except PolicyError as exc:
            raise StorageConfigError(str(exc)) from None

    def check(self) -> None:
        self.policy()

    def run(self):
        """One pass: plan, refuse unsafe plans, apply the rest. Returns the ApplyResult (or None)."""
        from dlts_lustre.client import LustreClient
        from dlts_lustre.plan import apply_plan, build_plan

        client = (self.client_factory or LustreClient)()
        plan = build_plan(self.policy(), client)
        for warning in plan.warnings:
            log.warning("lustre: %s", warning)
        if plan.unsafe:
            log.error("lustre: %d unsafe change(s) not applied; review and run `dlts-lustre apply --force`: %s",
                      len(plan.unsafe), "; ".join(a.unsafe_reason or "" for a in plan.unsafe))
            return None
        if not plan.actions:
            return None
        result = apply_plan(plan, client)
        log.info("lustre: applied %d change(s)", len(plan.actions))
        return result
