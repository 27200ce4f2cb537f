"""Cluster backends behind the ``ClusterBackend`` protocol; ``make_backend`` builds the one the
configuration names, from the configuration alone (the deployed path: ``dlts.yaml`` -> backend)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlts.config_layers import ConfigError

if TYPE_CHECKING:  # dlts.config imports dlts.backends (k8s_settings and the rule below)
    from dlts.backends.base import ClusterBackend
    from dlts.config import Settings

LOCAL_BACKEND_REFUSED = (
    "backend: local runs every user's job command on this machine as the DLTS service user, which can read "
    "the database, secret_key and the admin's API tokens, so it is refused outside `dlts demo`. Use "
    "backend: kubernetes for a shared cluster, or, only if every user of this service may act as that "
    "account, set local_backend_trusted_users: true in dlts.yaml (docs/security-host.md)")


def __getattr__(name: str) -> object:
    """``ClusterBackend`` on first use: importing dlts.backends.base (the scheduler's model with it)
    here would make every ``dlts`` command, through dlts.config's import of
    dlts.backends.k8s_settings, pay ~0.05 s for it."""
    if name == "ClusterBackend":
        from dlts.backends.base import ClusterBackend

        return ClusterBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def require_trusted_local_backend(settings: Settings) -> None:
    """Refuse ``backend: local`` outside the demo unless ``local_backend_trusted_users`` is set: the
    local backend isolates no job from the service (``dlts managers``, ``dlts api``)."""
    if settings.backend == "local" and not settings.local_backend_trusted_users:
        raise ConfigError(LOCAL_BACKEND_REFUSED)


def make_backend(settings: Settings) -> ClusterBackend:
    """The configured backend; ``backend: local`` only with ``local_backend_trusted_users: true``
    (``ConfigError`` otherwise: the demo, the one place it is safe by default, makes its own)."""
    if settings.backend == "local":
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
