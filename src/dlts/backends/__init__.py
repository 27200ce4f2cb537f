"""Cluster backends behind the ``ClusterBackend`` protocol; ``make_backend`` builds the one the
configuration names, from the configuration alone (the deployed path: ``dlts.yaml`` -> backend)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlts.backends.base import ClusterBackend

if TYPE_CHECKING:  # dlts.config imports dlts.backends.k8s_settings
    from dlts.config import Settings


def make_backend(settings: Settings) -> ClusterBackend:
    """The configured backend; ``backend: local`` only with ``local_backend_trusted_users: true``
    (``ConfigError`` otherwise: the demo, the one place it is safe by default, makes its own)."""
    if settings.backend == "local":
        from dlts.config import require_trusted_local_backend

        require_trusted_local_backend(settings)
        from dlts.backends.local import LocalBackend

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
