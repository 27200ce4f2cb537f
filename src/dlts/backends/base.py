"""The ``ClusterBackend`` protocol: the only way the job manager touches the cluster.

A backend runs *attempts*. Every object it creates is named from ``(job_id, attempt)`` (and, per
placement, its replica index) so that a second ``launch`` of the same attempt creates only what is
missing and a second ``terminate`` is harmless: a crash of the job manager between any two steps is
finished by the next tick.

Inference attempts change size while they run: ``launch`` with more replicas adds the new ones
(scale-up) and ``remove_replicas`` stops some (scale-down). ``observe`` still reports the attempt as
a whole, plus which replicas exist, so the job manager knows when a removed one has really exited.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from dlts.scheduler.model import Placement


@dataclass(frozen=True)
class RegistryCredential:
    """Credentials for a private image registry (sent to the cluster as an image pull secret)."""

    server: str
    username: str
    password: str


@dataclass(frozen=True)
class StorageMount:
    """A directory mounted into every pod of a job (VC storage, the owner's home directory).

    ``kind`` ``nfs``: an NFS export (``server``:``path``) mounted by the kubelet; ``host``: a
    directory that exists on every node (a Lustre or NFS client mount the operator set up),
    mounted from the node. Both are written by cluster admins (``dlts vc storage``, the API, the
    inventory's ``dlts_vcs``), never by a job's owner.
    """

    name: str  # DNS label, unique within the job (volume name)
    kind: str  # "nfs" | "host"
    path: str  # absolute: the export's path on the server, or the directory on the node
    mount_path: str  # absolute path inside the container
    server: str = ""  # nfs only
    read_only: bool = False


class BackendUnavailable(RuntimeError):
    """The cluster did not answer (timeout, 5xx, back-off): transient, the next tick tries again."""


class VolumeFull(BackendUnavailable):
    """A volume the backend writes for a launch (the local backend's run directories) has no room
    (``ENOSPC``, ``EDQUOT``, ``EIO``). Transient like ``BackendUnavailable``: the job stays
    ``scheduling`` with ``reason`` and the message, the next tick launches again, and the start
    timeout ends the attempt by the usual rules if the room does not come back."""

    reason = "disk_full"


class BackendRefused(RuntimeError):
    """The cluster answered one request about one attempt or object with a refusal (a missing
    permission, a media type it does not serve, a conflict, a pod whose node cannot be reached).

    It costs that attempt's step, never the tick: the job manager records the refusal on the job in
    words and carries on with the other jobs; the step is tried again on a later tick."""


class RunPhase(str, enum.Enum):
    PENDING = "pending"  # created, not yet running (image pull, init)
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    GONE = "gone"  # the backend lost it: node died, object deleted by someone else


@dataclass(frozen=True)
class LaunchSpec:
    job_id: int
    attempt: int
    user: str
    vc: str
    type: str
    image: str
    command: str
    placements: tuple[Placement, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    preemptible: bool = False
    ports: tuple[int, ...] = ()
    ssh_public_keys: tuple[str, ...] = ()
    log_path: str = ""  # where the attempt's stdout+stderr must end up
    # the attempt's log key (``dlts.logstore``; None: an attempt from before keys): the local init
    # writes under it, the Kubernetes pods carry it for the log copy
    log_key: str | None = None
    registry_credentials: tuple[RegistryCredential, ...] = ()
    # The VC's admin-set policy (``VirtualCluster.pod_policy``), added to what the backend's own
    # configuration allows for the VC.
    vc_pod_policy: Mapping[str, bool] = field(default_factory=dict)  # {"host_network": True, ...}
    # Identity: the owner's uid/gid (None: the user has none; backends refuse to run such a job as
    # root unless ``run_as_root``), the VC's group as a supplementary group, and root only where
    # the VC's policy allows it and the job asked for it.
    uid: int | None = None
    gid: int | None = None
    supplemental_groups: tuple[int, ...] = ()
    run_as_root: bool = False
    # VC storage and the owner's home directory, mounted into every pod of the attempt.
    storage: tuple[StorageMount, ...] = ()
    # Scratch space a pod may write on its node (container writable layer, logs, emptyDirs); None:
    # the backend's default.
    ephemeral_storage_bytes: int | None = None
    # The stable replica index of each placement (pod ``dlts-J-A-<index>``); empty: 0, 1, 2, ...
    replicas: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.replicas:
            if len(self.replicas) != len(self.placements):
                raise ValueError(f"LaunchSpec of job {self.job_id}: {len(self.replicas)} replica indexes for "
                                 f"{len(self.placements)} placements; give one index per placement")
            if len(set(self.replicas)) != len(self.replicas) or min(self.replicas) < 0:
                raise ValueError(f"LaunchSpec of job {self.job_id}: replica indexes {list(self.replicas)} must be "
                                 "distinct and not negative")

    def indexed(self) -> tuple[tuple[int, Placement], ...]:
        """(replica index, placement) for every placement, in order."""
        return tuple(zip(self.replicas or range(len(self.placements)), self.placements))


@dataclass(frozen=True)
class Observed:
    """What the backend knows about one attempt right now."""

    job_id: int
    attempt: int
    phase: RunPhase
    exit_code: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    message: str = ""
    # PENDING: why it has not started yet, a short code the job shows as its reason (image_pull,
    # container_config, unschedulable, init_failed, ...; "" while it is simply starting) with
    # ``message`` the cluster's own words (the scheduler's message, the pull error)
    reason: str = ""
    node_lost: bool = False
    # Inference attempts (empty for other types): the replica indexes whose objects still exist,
    # and those of them already told to stop by ``remove_replicas``.
    replicas: frozenset[int] = frozenset()
    retiring: frozenset[int] = frozenset()
    # ended: what a full log volume cost its log, in words ("N bytes of output were not stored: No
    # space left on device"); running: that it is losing output now ("its output is being dropped:
    # ..."); "" when everything is stored
    log_cut: str = ""
    # the image the job container runs as the node's container runtime resolved it (Kubernetes: the
    # job container's ``status.imageID``, ``repo@sha256:...`` for a pulled image): what a tag meant
    # when the attempt started; "" where the backend does not know
    image_id: str = ""


@dataclass(frozen=True)
class EndpointSpec:
    """One endpoint the job manager wants reachable for an attempt (``expose``)."""

    id: int  # JobEndpoint.id: stable across calls, names the backend's objects
    kind: str  # ssh | jupyter | vscode | port
    port: int  # in the container: where the job listens (port) or where DLTS starts the server
    # jupyter / vscode: SHA-256 (hex) of the endpoint's token; the server takes that token as its password
    secret_hash: str = ""


@dataclass(frozen=True)
class EndpointState:
    """Where one endpoint stands after ``expose``."""

    id: int
    status: str  # "pending" (not yet: retry next tick) | "ready" | "failed" (message says why)
    host: str = ""  # ready: the address users connect to ...
    host_port: int | None = None  # ... and the port there
    message: str = ""


@dataclass(frozen=True)
class NodeInfo:
    """A node as the backend sees it (node sync)."""

    name: str
    sku: str
    gpus: int
    cpu: float
    memory_bytes: int
    ib_domain: str = "default"
    vc: str | None = None
    ready: bool = True
    unschedulable: bool = False
    cordoned_by_dlts: bool = False  # DLTS cordoned it (so DLTS may uncordon it)


class ClusterBackend(Protocol):
    name: str

    def launch(self, spec: LaunchSpec) -> str | None:
        """Create the attempt's objects that do not exist yet (for each of ``spec.replicas``);
        existing ones are left alone. Launching an inference attempt again with more replicas is
        how replicas are added. A returned text is a note the job manager records on the job's
        first launch (the local backend says which identity the job runs as)."""

    def remove_replicas(self, job_id: int, attempt: int, replicas: Iterable[int], grace_s: float) -> None:
        """Stop those replicas of an inference attempt only: SIGTERM now, kill after ``grace_s``.
        Their ending never makes the attempt fail or end; once they have exited they leave
        ``Observed.replicas``. Succeeds for replicas already gone; harmless to repeat."""

    def expose(self, job_id: int, attempt: int, endpoints: Sequence[EndpointSpec],
               ssh_public_keys: tuple[str, ...] = ()) -> Sequence[EndpointState]:
        """Make the attempt's endpoints exactly ``endpoints`` (on its first pod / replica 0): start
        the servers of ssh / jupyter / vscode endpoints and make every endpoint reachable from
        outside the cluster; stop and remove those no longer listed. ``ssh_public_keys`` are the
        keys an ssh endpoint accepts. Returns one state per endpoint in ``endpoints``. Harmless to
        repeat; raises ``BackendUnavailable`` when the cluster does not answer."""

    def terminate(self, job_id: int, attempt: int, grace_s: float) -> None:
        """SIGTERM now, kill after ``grace_s``; succeed if already gone."""

    def observe(self) -> Sequence[Observed]:
        """Every attempt the backend currently holds, in one call (one list, not one per job).

        An inference attempt is RUNNING while any of its replicas runs; replicas removed by
        ``remove_replicas`` do not count toward its phase."""

    def forget(self, job_id: int, attempt: int) -> None:
        """Release bookkeeping of a finished attempt (delete finished pods, reap records). A backend
        whose log lives with its pods copies the rest of it to the log store first."""

    def sync_logs(self, attempts: Iterable[tuple[int, int]]) -> None:
        """Bring the log store's copy of these live attempts' output up to date (``dlts.logstore``
        layout and size cap). A no-op where the job writes its log to the store itself (local)."""

    def collect_garbage(self, live: Iterable[tuple[int, int]]) -> Sequence[tuple[int, int]]:
        """Remove every object of an attempt not in ``live``; return the attempts removed."""

    def nodes(self) -> Sequence[NodeInfo]:
        """The nodes this backend can run work on."""

    def close(self) -> None:
        """Stop background work; running attempts keep running where the backend allows."""
