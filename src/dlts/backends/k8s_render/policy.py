"""What a job may ask of its pods, checked before and after rendering.

Before: the fields of a ``LaunchSpec`` (image, env, ports, keys, the identity it runs as, the
storage it mounts). After:
``check_pod_policy`` reads the *rendered* pod, so a customised template cannot grant what the
cluster admin did not allow either: privileged containers, privilege escalation, added or
undropped capabilities, no seccomp profile, host namespaces and ports, hostPath volumes other
than the admin-configured storage, and running as root are each refused unless the VC's policy
allows the feature.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dlts import image_ref
from dlts.backends.base import LaunchSpec, StorageMount
from dlts.backends.k8s_render.names import LaunchRefused, TemplateError, valid_ssh_key
from dlts.backends.k8s_render.scripts import RUNTIME_DIR
from dlts.backends.k8s_settings import KubernetesSettings, PrivilegedFeature

# Environment the backend owns; a job's own env may not override these names.
RESERVED_ENV = frozenset({
    "DLTS_JOB_ID", "DLTS_ATTEMPT", "DLTS_USER", "DLTS_VC", "DLTS_NUM_GPUS", "DLTS_COMMAND", "DLTS_PREEMPTIBLE",
    "DLTS_LOG_PATH", "DLTS_SSH_AUTHORIZED_KEYS", "DLTS_ENDPOINTS_DIR", "DLTS_RUNTIME_DIR", "MASTER_ADDR",
    "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "NNODES", "NVIDIA_VISIBLE_DEVICES",
    "DLTS_REPLICA", "CUDA_DEVICE_ORDER",
})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SERVER = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.:\-]*[A-Za-z0-9])?$|^\[[0-9A-Fa-f:.]+\]$")
_LOGIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.@-]{0,63}$")
# Storage may not be mounted over these (nor under the first group): the container would lose its
# system files, its devices or DLTS's runtime.
_NOT_UNDER = ("/proc", "/sys", "/dev", "/etc", RUNTIME_DIR, "/dlts-endpoints")
_NOT_AT = ("/", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr", "/usr/bin", "/usr/lib",
           "/usr/sbin", "/usr/local", "/usr/local/bin", "/var", "/run", "/tmp", "/boot", "/root")


@dataclass(frozen=True)
class Identity:
    """Who the job's containers run as."""

    uid: int
    gid: int
    supplemental_groups: tuple[int, ...]
    root: bool
    # the owner's login in the container's /etc/passwd with their own ids ("": none to add)
    login: str = ""
    login_uid: int = 0
    login_gid: int = 0


def allowed_features(settings: KubernetesSettings, spec: LaunchSpec) -> frozenset[PrivilegedFeature]:
    """What the cluster config allows the job's VC plus what the VC's own policy turns on."""
    allowed = set(settings.features_for(spec.vc))
    known = {f.value: f for f in PrivilegedFeature}
    for key, value in spec.vc_pod_policy.items():
        if key not in known:
            raise TemplateError(f"VC {spec.vc}'s pod policy names {key!r}; known features: {', '.join(sorted(known))}")
        if value is True:
            allowed.add(known[key])
    return frozenset(allowed)


def login_name(user: str, uid: int) -> str:
    """The owner's login in the container: their DLTS name when passwd can hold it, else u<uid>."""
    return user if _LOGIN.match(user) else f"u{uid}"


def identity(spec: LaunchSpec, allowed: frozenset[PrivilegedFeature]) -> Identity:
    """The uid/gid the pods run as; refuses a job that would run as root without permission."""
    groups = tuple(sorted({int(g) for g in spec.supplemental_groups}))
    if any(g < 0 or g > 2**31 - 1 for g in groups):
        raise LaunchRefused(f"supplemental groups {list(groups)} must be gids between 0 and 2147483647")
    if spec.run_as_root:
        if PrivilegedFeature.RUN_AS_ROOT not in allowed:
            raise LaunchRefused(f"VC {spec.vc} does not allow its jobs to run as root; remove run_as_root from the "
                                "job, or ask a cluster admin to allow run_as_root for the VC")
        if spec.uid:  # the owner still gets their login (with their own uid, never 0)
            gid = spec.gid or spec.uid
            return Identity(0, 0, groups, True, login_name(spec.user, spec.uid), spec.uid, gid)
        return Identity(0, 0, groups, True)
    if spec.uid is None or spec.gid is None:
        missing = "uid" if spec.uid is None else "gid"
        raise LaunchRefused(f"user {spec.user} has no {missing}, and jobs run as their owner's uid and gid; a "
                            f"cluster admin sets them with: dlts user set {spec.user} --uid N --gid N")
    if spec.uid == 0 or spec.gid == 0:
        raise LaunchRefused(f"user {spec.user} has uid {spec.uid} and gid {spec.gid}; 0 is root's. Give the user "
                            f"their own ids (dlts user set {spec.user} --uid N --gid N), or run the job with "
                            "run_as_root in a VC whose policy allows it")
    if not (0 < spec.uid <= 2**31 - 1 and 0 < spec.gid <= 2**31 - 1):
        raise LaunchRefused(f"user {spec.user}'s uid {spec.uid} / gid {spec.gid} must be between 1 and 2147483647")
    return Identity(spec.uid, spec.gid, groups, False, login_name(spec.user, spec.uid), spec.uid, spec.gid)


def _clean_path(path: str) -> bool:
    return path.startswith("/") and ".." not in path.split("/") and "\x00" not in path and "\n" not in path


def check_storage(spec: LaunchSpec) -> tuple[StorageMount, ...]:
    """The spec's storage, validated (it comes from cluster admins: errors name the VC's storage)."""
    seen_names: set[str] = set()
    seen_mounts: set[str] = set()
    for mount in spec.storage:
        where = f"VC {spec.vc}'s storage entry {mount.name!r}"
        fix = f"fix it with dlts vc storage {spec.vc}"
        if not _DNS_LABEL.match(mount.name) or len(mount.name) > 50:
            raise TemplateError(f"{where}: the name must be a DNS label (a-z, 0-9, '-', at most 50); {fix}")
        if mount.name in seen_names:
            raise TemplateError(f"{where}: two entries have this name; {fix}")
        seen_names.add(mount.name)
        if mount.kind not in ("nfs", "host"):
            raise TemplateError(f"{where}: kind {mount.kind!r} is neither nfs nor host; {fix}")
        if not _clean_path(mount.path) or not _clean_path(mount.mount_path):
            raise TemplateError(f"{where}: path {mount.path!r} and mount_path {mount.mount_path!r} must be absolute "
                                f"paths without '..'; {fix}")
        target = "/" + "/".join(p for p in mount.mount_path.split("/") if p)
        if target in _NOT_AT or any(target == d or target.startswith(d + "/") for d in _NOT_UNDER):
            raise TemplateError(f"{where}: mount_path {mount.mount_path} would cover the container's system files; "
                                f"mount it elsewhere (such as /data or /home); {fix}")
        if target in seen_mounts:
            raise TemplateError(f"{where}: another entry is also mounted at {target}; {fix}")
        seen_mounts.add(target)
        if mount.kind == "nfs" and not _SERVER.match(mount.server or ""):
            raise TemplateError(f"{where}: an nfs entry needs its server's host name or address "
                                f"(got {mount.server!r}); {fix}")
    return spec.storage


def check_spec(spec: LaunchSpec) -> None:
    """Refuse a spec the renderer cannot turn into safe objects; each message says what to change."""
    if not spec.placements:
        raise LaunchRefused(f"job {spec.job_id} attempt {spec.attempt} has no placement; the scheduler must place it first")
    why = image_ref.problem(spec.image)
    if why is not None:
        raise LaunchRefused(f"image {spec.image[:200]!r} is not a valid image reference: {why}")
    if not spec.command.strip():
        raise LaunchRefused("command is empty; give the shell command line the job should run")
    for name in spec.env:
        if not _ENV_NAME.match(str(name)):
            raise LaunchRefused(f"environment variable name {name!r} is invalid; use letters, digits and '_', "
                                "not starting with a digit")
        if name in RESERVED_ENV:
            raise LaunchRefused(f"environment variable {name} is set by DLTS and cannot be overridden; rename it")
    for port in spec.ports:
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            raise LaunchRefused(f"port {port!r} is not a TCP port number (1-65535)")
    for key in spec.ssh_public_keys:
        if not valid_ssh_key(key):
            raise LaunchRefused("an SSH public key is not a single-line OpenSSH public key "
                                "(like 'ssh-ed25519 AAAA... comment'); re-add it")
    for cred in spec.registry_credentials:
        if not cred.server or any(c.isspace() for c in cred.server):
            raise LaunchRefused(f"registry server {cred.server!r} is invalid")
    if spec.ephemeral_storage_bytes is not None and spec.ephemeral_storage_bytes < 1024**2:
        raise LaunchRefused(f"ephemeral storage of {spec.ephemeral_storage_bytes} bytes is too small for a "
                            "container; ask for at least 1 MiB")


def _non_root(uid: Any, non_root: Any) -> bool:
    """True when a container with these effective settings cannot run as uid 0."""
    if uid is not None:
        return uid != 0
    return non_root is True


def check_pod_policy(pod: Mapping[str, Any], allowed: frozenset[PrivilegedFeature],
                     storage_host_paths: Mapping[str, str] | None = None, own_images: frozenset[str] = frozenset()) -> None:
    """Refuse a rendered pod that uses a privileged feature its VC does not allow.

    ``storage_host_paths`` (volume name -> path) are the hostPath volumes of admin-configured
    storage: those, exactly, are allowed without ``host_path``. ``own_images`` are DLTS's own (the
    init image): not the job's, not pulled with its credentials, so exempt from the pull policy
    rule (a container of any other image in a pod with a pull secret is pulled every time unless
    the VC allows ``cached_private_images``).
    """
    storage_host_paths = storage_host_paths or {}
    spec = pod.get("spec") or {}
    pod_sc = spec.get("securityContext") or {}
    used: list[tuple[PrivilegedFeature, str]] = []
    for key, feature in (("hostNetwork", PrivilegedFeature.HOST_NETWORK), ("hostIPC", PrivilegedFeature.HOST_IPC),
                         ("hostPID", PrivilegedFeature.HOST_PID)):
        if spec.get(key):
            used.append((feature, f"spec.{key}"))
    for vol in spec.get("volumes") or []:
        host = vol.get("hostPath")
        if host is not None and storage_host_paths.get(vol.get("name")) != host.get("path"):
            used.append((PrivilegedFeature.HOST_PATH, f"volume {vol.get('name')}"))
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    pulls_with_secret = bool(spec.get("imagePullSecrets"))
    for group in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(group) or []:
            name = f"{group} {c.get('name')}"
            sc = c.get("securityContext") or {}
            if sc.get("privileged"):
                used.append((PrivilegedFeature.PRIVILEGED, f"{name} privileged"))
            if sc.get("allowPrivilegeEscalation") is not False:
                used.append((PrivilegedFeature.PRIVILEGED, f"{name} allowPrivilegeEscalation is not false"))
            caps = sc.get("capabilities") or {}
            if caps.get("add"):
                used.append((PrivilegedFeature.PRIVILEGED, f"{name} capabilities.add"))
            if "ALL" not in (caps.get("drop") or []):
                used.append((PrivilegedFeature.PRIVILEGED, f"{name} capabilities.drop lacks ALL"))
            seccomp = (sc.get("seccompProfile") or {}).get("type") or pod_seccomp
            if seccomp not in ("RuntimeDefault", "Localhost"):
                used.append((PrivilegedFeature.PRIVILEGED, f"{name} seccompProfile is {seccomp or 'not set'}"))
            if pulls_with_secret and c.get("imagePullPolicy", "IfNotPresent") != "Always" \
                    and c.get("image") not in own_images:
                where = f"{name} imagePullPolicy {c.get('imagePullPolicy', 'not set')} with a pull secret"
                used.append((PrivilegedFeature.CACHED_PRIVATE_IMAGES, where))
            for port in c.get("ports") or []:
                if port.get("hostPort"):
                    used.append((PrivilegedFeature.HOST_NETWORK, f"{name} hostPort {port.get('hostPort')}"))
            uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
            non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
            if not _non_root(uid, non_root):
                where = f"{name} may run as root (runAsUser {uid}, runAsNonRoot {non_root})"
                used.append((PrivilegedFeature.RUN_AS_ROOT, where))
    for feature, where in used:
        if feature not in allowed:
            raise LaunchRefused(f"the pod would use {feature.value} ({where}), which its VC's policy does not allow")
