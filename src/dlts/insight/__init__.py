"""Insight on running jobs: the pure rules (``rules``) and their settings (``settings``); the manager
that applies them is ``dlts.managers.insight`` (docs/monitoring.md#insight)."""
