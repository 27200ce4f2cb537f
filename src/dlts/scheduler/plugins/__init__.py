"""The built-in plugins; importing this package registers each under its name."""

from dlts.scheduler.plugins import admission, backfill, fairshare, ordering, placement, policy, reclaim, walltime

__all__ = ["admission", "backfill", "fairshare", "ordering", "placement", "policy", "reclaim", "walltime"]
