"""The cluster backend dlts.yaml names, built from ``Settings`` alone (the deployed path:
``dlts.yaml`` -> backend; ``dlts managers`` and the tests that run it). It reads the configuration
and builds a backend, so it sits above both ``dlts.config`` and ``dlts.backends``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlts.config import Settings, require_trusted_local_backend

if TYPE_CHECKING:
    from dlts.backends.base import ClusterBackend


def make_backend(settings: Settings) -> ClusterBackend:
    """The configured backend; ``backend: local`` only with ``local_backend_trusted_users: true``
    (``ConfigError`` otherwise: the demo, the one place it is safe by default, makes its own)."""
    if settings.backend == "local":
        require_trusted_local_backend(settings)
        from dlts.backends.local import LocalBackend  # on use: each backend imports its own libraries

        return LocalBackend(settings.effective_run_dir, demo_gpus=settings.demo_gpus, demo_sku=settings.demo_sku,
                            endpoint_host=settings.endpoint_host, log_max_bytes=settings.log_max_bytes)
    from dlts.backends.kubernetes import KubernetesBackend

    # The kubernetes: section is the backend's settings as it is; the rest are the top-level
    # settings both backends share.
    return KubernetesBackend(
        settings.kubernetes,
        log_dir=settings.effective_log_dir,
        log_max_bytes=settings.log_max_bytes,
        node_lost_after_s=settings.node_lost_after_s,
        termination_grace_s=int(settings.preempt_grace_s),
        templates_dir=str(settings.templates_dir) if settings.templates_dir else None,
    )
