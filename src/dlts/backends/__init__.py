"""Cluster backends behind the ``ClusterBackend`` protocol (``base.py``): ``local.py`` (processes) and
``kubernetes/``. Each is handed its values; ``dlts.backend_factory.make_backend`` builds the one
dlts.yaml names (config.py reads this package's ``k8s_settings``, so nothing here reads config)."""

from __future__ import annotations


def __getattr__(name: str) -> object:
    """``ClusterBackend`` on first use: importing dlts.backends.base (the scheduler's model with it)
    here would make every ``dlts`` command, through dlts.config's import of
    dlts.backends.k8s_settings, pay ~0.05 s for it."""
    if name == "ClusterBackend":
        from dlts.backends.base import ClusterBackend

        return ClusterBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
