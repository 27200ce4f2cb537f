"""Cluster backends behind the ``ClusterBackend`` protocol; ``make_backend`` builds the one the
configuration names, from the configuration alone (the deployed path: ``dlts.yaml`` -> backend)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # dlts.config imports dlts.backends.k8s_settings
    from dlts.backends.base import ClusterBackend
    from dlts.config import Settings


def __getattr__(name: str) -> object:
    """``ClusterBackend`` on first use: importing dlts.backends.base (the scheduler's model with it)
    here would make every ``dlts`` command, through dlts.config's import of
    dlts.backends.k8s_settings, pay ~0.05 s for it."""
    if name == "ClusterBackend":
        from dlts.backends.base import ClusterBackend

        return ClusterBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
