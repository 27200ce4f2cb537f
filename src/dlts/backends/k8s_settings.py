"""The ``kubernetes:`` section of ``dlts.yaml``: the Kubernetes backend's settings, one typed object.

``dlts.config.Settings.kubernetes`` *is* this object; ``make_backend`` hands it to
``KubernetesBackend`` unchanged. It imports nothing from the ``kubernetes`` client, so the
configuration loads (and ``dlts config check`` validates it) where the client is not installed.
Every key is documented in docs/configuration.md; each has exactly one default, here.
"""

from __future__ import annotations

import enum
import re
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator, model_validator

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/:@]*$")


def cidr_list(value: Any) -> Any:
    """A list of networks (or a comma/space-separated string of them) as canonical CIDR strings;
    a value that is no list is left for pydantic to refuse. Shared by every setting that lists
    networks (``kubernetes.storage_cidrs``, ``endpoint_allow_cidrs``)."""
    import ipaddress

    if isinstance(value, str):
        value = value.replace(",", " ").split()
    if not isinstance(value, (list, tuple)):
        return value
    out = []
    for item in value:
        try:
            out.append(str(ipaddress.ip_network(str(item).strip(), strict=True)))
        except ValueError as exc:
            raise ValueError(f"{item!r} is not an IPv4/IPv6 address or CIDR network ({exc})") from None
    return tuple(out)


class PrivilegedFeature(str, enum.Enum):
    """What a VC's policy may allow its jobs (cluster admin setting); nothing is allowed by default."""

    PRIVILEGED = "privileged"  # privileged containers, privilege escalation, added capabilities
    HOST_NETWORK = "host_network"
    HOST_IPC = "host_ipc"
    HOST_PID = "host_pid"
    HOST_PATH = "host_path"
    RUN_AS_ROOT = "run_as_root"  # the job's containers may run as uid 0
    # an image pulled with the job's registry credentials may start from the node's image cache
    # (imagePullPolicy IfNotPresent) instead of being pulled, credentials checked, every time: a
    # cached private image could otherwise be run by any tenant on that node without them
    CACHED_PRIVATE_IMAGES = "cached_private_images"


class KubernetesSettings(BaseModel):
    """Every key of the ``kubernetes:`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # kubeconfig file and context; no kubeconfig: the in-cluster service account
    kubeconfig: str | None = None
    context: str | None = None
    # the namespace every job object lives in (the kubernetes_control_plane role creates it with its RBAC)
    namespace: str = "dlts"
    # node labels DLTS reads (SKU, InfiniBand domain, VC-dedicated nodes)
    sku_label: str = "dlts.io/sku"
    ib_domain_label: str = "dlts.io/ib-domain"
    vc_label: str = "dlts.io/vc"
    # a distributed attempt missing some of its pods is gone once its newest pod is this old
    missing_after_s: float = Field(30.0, ge=1, le=3600)
    # observe() reuses a node list fetched this recently in the same tick
    node_list_reuse_s: float = Field(1.0, ge=0, le=60)
    # keep the pods in memory from one list and a watch instead of listing them every tick
    watch: bool = False
    watch_timeout_s: float = Field(300.0, ge=10, le=3600)
    # page size of every list against the API server (limit/continue)
    list_page_size: int = Field(500, ge=10, le=10_000)
    # at most this many launches talk to the API server at once
    launch_parallelism: int = Field(16, ge=1, le=256)
    # the image of the pods' init container; it must contain the files the init command copies
    init_image: str = "docker.io/library/busybox:1.36.1"
    # rendezvous port of distributed jobs (MASTER_PORT)
    master_port: int = Field(29500, ge=1024, le=65535)
    # VC name ("*": every VC) -> privileged features its jobs may use
    privileged_policy: dict[str, frozenset[PrivilegedFeature]] = Field(default_factory=dict)
    # priority classes of the job pods: preemptible jobs get the second (the kubernetes_control_plane
    # role creates both, with preemptionPolicy Never: only DLTS preempts)
    priority_class: str = "dlts-default"
    preemptible_priority_class: str = "dlts-preemptible"
    # ephemeral-storage request and limit of each job container unless the VC sets its own
    default_ephemeral_storage_bytes: int = Field(50 * 1024**3, ge=1024**2)
    # a NetworkPolicy per job: its pods reach each other, DNS and these networks (storage servers)
    network_policy: bool = True
    storage_cidrs: tuple[str, ...] = ()
    # seconds between copies of running pods' output into the log store
    log_sync_s: float = Field(5.0, ge=0.5, le=600)
    # one request to the API server may take this long
    request_timeout_s: float = Field(10.0, gt=0, le=300)
    # failed calls back off exponentially between these bounds
    backoff_initial_s: float = Field(1.0, gt=0, le=600)
    backoff_max_s: float = Field(60.0, gt=0, le=3600)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if len(value) > 63 or not _DNS_LABEL.match(value):
            raise ValueError("must be a Kubernetes namespace name (lowercase letters, digits, '-', at most 63)")
        return value

    @field_validator("priority_class", "preemptible_priority_class")
    @classmethod
    def _priority_class(cls, value: str) -> str:
        if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
            raise ValueError("must be a PriorityClass name (lowercase letters, digits, '-', '.')")
        return value

    @field_validator("sku_label", "ib_domain_label", "vc_label")
    @classmethod
    def _label_key(cls, value: str) -> str:
        if len(value) > 316 or not _LABEL_KEY.match(value):
            raise ValueError("must be a Kubernetes label key such as dlts.io/sku")
        return value

    @field_validator("init_image")
    @classmethod
    def _image(cls, value: str) -> str:
        if not _IMAGE.match(value):
            raise ValueError("must be an image reference such as docker.io/library/busybox:1.36.1")
        return value

    @field_validator("privileged_policy", mode="before")
    @classmethod
    def _policy(cls, value: Any) -> Any:
        if isinstance(value, str):  # DLTS_KUBERNETES__PRIVILEGED_POLICY='{"ml-ops": [host_ipc]}'
            try:
                value = yaml.safe_load(value) or {}
            except yaml.YAMLError:
                raise ValueError("must be a mapping of VC name to a list of features") from None
        if not isinstance(value, dict):
            return value
        known = ", ".join(f.value for f in PrivilegedFeature)
        out: dict[str, frozenset[PrivilegedFeature]] = {}
        for vc, features in value.items():
            if isinstance(features, str):
                features = [features]
            try:
                out[str(vc)] = frozenset(PrivilegedFeature(f) for f in features or ())
            except (ValueError, TypeError):
                raise ValueError(f"VC {vc!r}: features must be a list of {known}") from None
        return out

    @field_validator("storage_cidrs", mode="before")
    @classmethod
    def _cidrs(cls, value: Any) -> Any:
        return cidr_list(value)

    @field_serializer("privileged_policy")
    def _policy_out(self, value: dict[str, frozenset[PrivilegedFeature]]) -> dict[str, list[str]]:
        return {vc: sorted(f.value for f in features) for vc, features in sorted(value.items())}

    @model_validator(mode="after")
    def _consistent(self) -> KubernetesSettings:
        if self.context and not self.kubeconfig:
            raise ValueError("context needs kubeconfig (the in-cluster service account has no contexts)")
        if self.backoff_initial_s > self.backoff_max_s:
            raise ValueError(f"backoff_initial_s ({self.backoff_initial_s}) must not exceed backoff_max_s "
                             f"({self.backoff_max_s})")
        if self.priority_class == self.preemptible_priority_class:
            raise ValueError("priority_class and preemptible_priority_class must differ (the kubelet tells "
                             "preemptible pods by their class)")
        return self

    def features_for(self, vc: str) -> frozenset[PrivilegedFeature]:
        """What the cluster config allows jobs of ``vc`` (its own entry plus "*")."""
        return self.privileged_policy.get("*", frozenset()) | self.privileged_policy.get(vc, frozenset())
