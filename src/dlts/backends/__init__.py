"""Cluster backends behind the ``ClusterBackend`` protocol; ``make_backend`` picks one from settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlts.backends.base import ClusterBackend

if TYPE_CHECKING:  # dlts.config imports dlts.backends.k8s_settings
    from dlts.config import Settings


def make_backend(settings: Settings) -> ClusterBackend:
    if settings.backend == "local":
        from dlts.backends.local import LocalBackend

        return LocalBackend(settings.effective_run_dir, demo_gpus=settings.demo_gpus, demo_sku=settings.demo_sku,
                            endpoint_host=settings.endpoint_host)
    from dlts.backends.kubernetes import KubernetesBackend, settings_from_config

    return KubernetesBackend(settings_from_config(settings))
