"""VC use-cases: read (quota, usage per SKU, per-user use), create, delete, change settings and quota.

No Flask: the API and the portal call these. Rules (who may change what) are in ``services.policy``.

Quota: a cluster admin sets GPUs per SKU. CPU and memory follow in proportion to the SKU's node shape (GPUs
/ GPUs per node x cores and bytes per node), as the 2020 system did; ``cpu_quota`` and
``memory_quota_bytes`` override the derived totals (``None`` goes back to derived). VC admins change policy,
wall time, interactive cap, per-user quota, the notice and the scheduling settings (fair share, its bound on
a job's wait, the weight of limits in the order and the preemption budget: ``SCHEDULING_FIELDS``, each unset
on the VC by default so that dlts.yaml's ``vc_scheduling`` entry or the cluster's value applies,
``scheduling_of``); cluster admins also the VC's group (``gid``), its jobs' scratch space
(``ephemeral_storage_bytes``), its pod policy and its storage document (``set_storage``, checked by
``services.vc_storage``). Every change writes a ``vc_events`` row; the job manager reads the VC table on
each tick, so changes apply on the next one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.config import Settings
from dlts.errors import InvalidInput, NotFound, Refused, WrongState
from dlts.models import TERMINAL, Job, JobStatus, Node, Role, VirtualCluster, iso
from dlts.repositories import identity as identity_repo
from dlts.repositories import usage as usage_repo
from dlts.repositories import vc_events
from dlts.repositories.cluster import sku_shapes
from dlts.scheduler.model import CPU_SKU, MAX_LIMIT_WEIGHT, SkuShape
from dlts.scheduler.model import Vc as CoreVc
from dlts.scheduler.quota import derived_cpu_memory, effective_cpu_memory_quota
from dlts.services import admin, policy
from dlts.services.admin import NAME_RE
from dlts.services.auth import Principal
from dlts.services.transaction import transaction, transactional

POLICIES = ("RF", "FIFO", "backfill")
# the per-VC scheduling settings (docs/scheduling.md) and the type the scheduler takes each as; null on
# the VC row means "not set here" (scheduling_of)
SCHEDULING_KINDS: dict[str, Any] = {"fair_share": bool, "fair_share_max_wait_s": float, "limit_weight": float,
                                    "min_runtime_s": float, "max_reclaim_delay_s": float, "max_preemptions": int}
SCHEDULING_FIELDS = tuple(SCHEDULING_KINDS)
MAX_SCHEDULING_DELAY_S = 30 * 86400  # fair_share_max_wait_s, min_runtime_s and max_reclaim_delay_s, as config.py bounds them
MAX_PREEMPTIONS = 1000
# the whole-number scheduling settings and their upper bound (0 is the lower one): the API, the portal's
# form and this service check the same ranges
SCHEDULING_LIMITS = {"fair_share_max_wait_s": MAX_SCHEDULING_DELAY_S, "min_runtime_s": MAX_SCHEDULING_DELAY_S,
                     "max_reclaim_delay_s": MAX_SCHEDULING_DELAY_S, "max_preemptions": MAX_PREEMPTIONS}
VC_ADMIN_FIELDS = ("policy", "max_job_time_s", "max_interactive_gpus", "user_gpu_quota", "notice",
                   "max_queued_jobs_per_user", "max_submissions_per_minute", "default_runtime_estimate_s",
                   "idle_policy", *SCHEDULING_FIELDS)
CLUSTER_ADMIN_FIELDS = ("quota", "cpu_quota", "memory_quota_bytes", "gid", "ephemeral_storage_bytes", "pod_policy")
MAX_QUOTA_GPUS = 1_000_000


@dataclass(frozen=True)
class Effective:
    """A per-VC scheduling setting as the scheduler uses it, and where it comes from: ``vc`` (set on the
    VC), ``config`` (dlts.yaml's ``vc_scheduling`` entry for the VC; for ``fair_share`` also
    ``fair_share_half_life_h: 0``, which turns it off everywhere) or ``default`` (the cluster's value)."""

    value: Any
    source: str


def scheduling_of(settings: Settings, vc_name: str, own: Mapping[str, Any]) -> dict[str, Effective]:
    """The VC's fair-share switch and preemption budget: ``own`` (the VC row's values, None where unset),
    else its ``vc_scheduling`` entry, else the cluster's. The job manager builds each tick's snapshot
    from this, so a change applies at the next tick."""
    entry = settings.vc_scheduling.get(vc_name)
    out: dict[str, Effective] = {}
    for name, kind in SCHEDULING_KINDS.items():
        configured = getattr(entry, name) if entry is not None else None
        if own.get(name) is not None:
            value, source = own[name], "vc"
        elif configured is not None:
            value, source = configured, "config"
        else:
            value, source = getattr(settings, name), "default"
        out[name] = Effective(None if value is None else kind(value), source)
    if settings.fair_share_half_life_h <= 0:  # no decayed use is kept: nothing to order by
        out["fair_share"] = Effective(False, "config")
    return out


def scheduling_row(vc: VirtualCluster) -> dict[str, Any]:
    """The scheduling settings set on the VC row (None: not set there)."""
    return {name: getattr(vc, name) for name in SCHEDULING_FIELDS}


@dataclass(frozen=True)
class SkuQuota:
    sku: str
    gpus: int
    cpu: float  # in proportion to the node shape
    memory_bytes: int
    gpus_used: int  # non-preemptible GPUs of active jobs (what the quota guarantees)
    preemptible_gpus_used: int
    gpus_queued: int


@dataclass(frozen=True)
class UserUse:
    user: str
    jobs: int
    gpus: int
    preemptible_gpus: int
    cpu: float
    memory_bytes: int


@dataclass(frozen=True)
class VcView:
    name: str
    policy: str
    quota: dict[str, int]
    skus: list[SkuQuota]
    cpu_quota: float
    cpu_quota_source: str  # derived | override
    memory_quota_bytes: int
    memory_quota_source: str
    max_job_time_s: int | None
    max_interactive_gpus: int | None
    user_gpu_quota: int | None
    notice: str | None
    default_runtime_estimate_s: int | None  # backfill: runtime assumed for jobs with no limit
    max_queued_jobs_per_user: int | None  # None: the cluster default; 0: no limit
    max_submissions_per_minute: int | None
    gid: int | None
    ephemeral_storage_bytes: int | None  # None: the cluster default
    idle_policy: dict[str, Any] | None  # None: off
    # the scheduling settings in effect (``scheduling_of``), each with its source: vc | config | default
    fair_share: bool
    fair_share_source: str
    fair_share_max_wait_s: float | None  # None: no bound (fair share may hold a job back as long as it must)
    fair_share_max_wait_s_source: str
    limit_weight: float  # 0: queue time alone orders equal priority (with fair share)
    limit_weight_source: str
    min_runtime_s: float
    min_runtime_s_source: str
    max_reclaim_delay_s: float | None  # None: never (a reclaim waits as long as it must)
    max_reclaim_delay_s_source: str
    max_preemptions: int  # 0: no limit
    max_preemptions_source: str
    scheduling_set: dict[str, Any]  # the scheduling settings set on the VC itself (None: not set): the portal's form
    pod_policy: dict[str, bool]
    storage: dict[str, Any]
    users: list[UserUse]
    admins: list[str]
    members: list[str]
    created_at: str | None
    updated_at: str | None


@dataclass(frozen=True)
class VcEventView:
    id: int
    vc: str
    at: str | None
    actor: str
    field: str
    old: Any
    new: Any


@dataclass(frozen=True)
class VcSpec:
    """A new VC (cluster admin)."""

    name: str
    quota: Mapping[str, int] = field(default_factory=dict)
    policy: str = "RF"
    cpu_quota: float | None = None
    memory_quota_bytes: int | None = None
    max_job_time_s: int | None = None
    max_interactive_gpus: int | None = None
    user_gpu_quota: int | None = None
    notice: str | None = None
    default_runtime_estimate_s: int | None = None
    max_queued_jobs_per_user: int | None = None
    max_submissions_per_minute: int | None = None
    gid: int | None = None
    ephemeral_storage_bytes: int | None = None
    pod_policy: Mapping[str, bool] = field(default_factory=dict)
    idle_policy: Mapping[str, Any] | None = None
    fair_share: bool | None = None  # the scheduling settings: None takes dlts.yaml's (scheduling_of)
    fair_share_max_wait_s: int | None = None
    limit_weight: float | None = None
    min_runtime_s: int | None = None
    max_reclaim_delay_s: int | None = None
    max_preemptions: int | None = None


def _members(session: Session, vc_id: int) -> tuple[list[str], list[str]]:
    """Admins and members by their effective roles: their own bindings and their groups'."""
    rows = identity_repo.vc_bindings(session, vc_id)
    admins = sorted({b.user for b in rows if b.role is Role.VC_ADMIN})
    members = sorted({b.user for b in rows if b.role in (Role.VC_MEMBER, Role.VC_ADMIN)})
    return admins, members


def _view(session: Session, settings: Settings, vc: VirtualCluster, shapes: Mapping[str, SkuShape],
          use: list[usage_repo.UseRow], queued: Mapping[tuple[str, str | None], int]) -> VcView:
    quota = {k: int(v) for k, v in (vc.quota or {}).items()}
    skus = []
    for sku in sorted(set(quota) | {r.sku or CPU_SKU for r in use if r.vc == vc.name and r.gpus}):
        cpu, memory = derived_cpu_memory({sku: quota.get(sku, 0)}, shapes)
        rows = [r for r in use if r.vc == vc.name and (r.sku or CPU_SKU) == sku]
        skus.append(SkuQuota(sku, quota.get(sku, 0), cpu, memory,
                             sum(r.gpus for r in rows if not r.preemptible), sum(r.gpus for r in rows if r.preemptible),
                             queued.get((vc.name, sku), 0)))
    users: dict[str, list[usage_repo.UseRow]] = {}
    for r in use:
        if r.vc == vc.name:
            users.setdefault(r.user, []).append(r)
    # the numbers the scheduler enforces (scheduler/quota.py): override, else quota.cpu, else derived
    cores, memory_quota, cores_src, memory_src = effective_cpu_memory_quota(
        CoreVc(vc.name, quota, cpu_quota=vc.cpu_quota, memory_quota_bytes=vc.memory_quota_bytes), shapes)
    admins, members = _members(session, vc.id)
    scheduling = scheduling_of(settings, vc.name, scheduling_row(vc))
    return VcView(
        name=vc.name, policy=vc.policy, quota=quota, skus=skus,
        cpu_quota=cores, cpu_quota_source="override" if cores_src == "override" else "derived",
        memory_quota_bytes=memory_quota, memory_quota_source="override" if memory_src == "override" else "derived",
        max_job_time_s=vc.max_job_time_s, max_interactive_gpus=vc.max_interactive_gpus,
        user_gpu_quota=vc.user_gpu_quota, notice=vc.notice, default_runtime_estimate_s=vc.default_runtime_estimate_s,
        max_queued_jobs_per_user=vc.max_queued_jobs_per_user,
        max_submissions_per_minute=vc.max_submissions_per_minute, gid=vc.gid,
        ephemeral_storage_bytes=vc.ephemeral_storage_bytes, pod_policy=dict(vc.pod_policy or {}),
        idle_policy=dict(vc.idle_policy) if vc.idle_policy else None,
        fair_share=scheduling["fair_share"].value, fair_share_source=scheduling["fair_share"].source,
        fair_share_max_wait_s=scheduling["fair_share_max_wait_s"].value,
        fair_share_max_wait_s_source=scheduling["fair_share_max_wait_s"].source,
        limit_weight=scheduling["limit_weight"].value, limit_weight_source=scheduling["limit_weight"].source,
        min_runtime_s=scheduling["min_runtime_s"].value, min_runtime_s_source=scheduling["min_runtime_s"].source,
        max_reclaim_delay_s=scheduling["max_reclaim_delay_s"].value,
        max_reclaim_delay_s_source=scheduling["max_reclaim_delay_s"].source,
        max_preemptions=scheduling["max_preemptions"].value, max_preemptions_source=scheduling["max_preemptions"].source,
        scheduling_set=scheduling_row(vc),
        storage=dict(vc.storage or {}),
        users=[UserUse(u, sum(r.jobs for r in rows), sum(r.gpus for r in rows if not r.preemptible),
                       sum(r.gpus for r in rows if r.preemptible), round(sum(r.cpu for r in rows), 3),
                       sum(r.memory_bytes for r in rows)) for u, rows in sorted(users.items())],
        admins=admins, members=members, created_at=iso(vc.created_at), updated_at=iso(vc.updated_at),
    )


def _load(session: Session, principal: Principal, name: str) -> VirtualCluster:
    policy.require_vc_visible(principal, name)
    vc = session.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == name))
    if vc is None:
        raise NotFound(f"VC {name!r} does not exist" + ("." if principal.is_cluster_admin else " or you are not a member of it."),
                       code="vc_not_found")
    return vc


def list_vcs(session: Session, settings: Settings, principal: Principal, *, after_name: str | None = None,
             limit: int | None = None) -> list[VcView]:
    """The VCs the principal belongs to (every VC for a cluster admin), by name; keyset by name."""
    query = sa.select(VirtualCluster).order_by(VirtualCluster.name)
    if after_name is not None:
        query = query.where(VirtualCluster.name > after_name)
    if limit is not None:
        query = query.limit(limit)
    names = None
    if not principal.is_cluster_admin:
        names = principal.vcs
        query = query.where(VirtualCluster.name.in_(names) if names else sa.false())
    vcs = list(session.scalars(query))
    shapes = sku_shapes(session)
    names = [vc.name for vc in vcs]
    use = usage_repo.active_use(session, names)
    queued = usage_repo.queued_gpus(session, names)
    return [_view(session, settings, vc, shapes, use, queued) for vc in vcs]


def get_vc(session: Session, settings: Settings, principal: Principal, name: str) -> VcView:
    vc = _load(session, principal, name)
    return _view(session, settings, vc, sku_shapes(session), usage_repo.active_use(session, [vc.name]),
                 usage_repo.queued_gpus(session, [vc.name]))


def _sku_capacity(session: Session) -> dict[str, int]:
    rows = session.execute(sa.select(Node.sku, sa.func.sum(Node.gpus)).group_by(Node.sku))
    return {sku: int(total or 0) for sku, total in rows}


def _check_quota(session: Session, vc_name: str, quota: Mapping[str, Any]) -> dict[str, int]:
    capacity = _sku_capacity(session)
    checked: dict[str, int] = {}
    for sku, gpus in quota.items():
        if not isinstance(gpus, int) or isinstance(gpus, bool) or not 0 <= gpus <= MAX_QUOTA_GPUS:
            raise InvalidInput(f"quota.{sku} must be a whole number of GPUs between 0 and {MAX_QUOTA_GPUS}.",
                               details={"field": f"quota.{sku}"})
        if sku == CPU_SKU:
            raise InvalidInput("CPU-only work is limited by cpu_quota and memory_quota_bytes, not by a GPU quota on 'cpu'.",
                               details={"field": "quota.cpu"})
        if sku not in capacity:
            known = ", ".join(sorted(s for s in capacity if s != CPU_SKU)) or "none yet"
            raise InvalidInput(f"SKU {sku!r} does not exist in this cluster; known GPU SKUs: {known}.",
                               code="unknown_sku", details={"field": f"quota.{sku}"})
        if gpus > capacity[sku]:
            raise Refused(f"The cluster has {capacity[sku]} {sku} GPUs; quota {gpus} for VC {vc_name} asks more. "
                          f"Set at most {capacity[sku]}, or add {sku} nodes first.",
                          code="quota_exceeds_cluster", details={"field": f"quota.{sku}", "capacity": capacity[sku], "asked": gpus})
        if gpus:
            checked[sku] = gpus
    return checked


def _check_settings(changes: Mapping[str, Any]) -> None:
    if "policy" in changes and changes["policy"] not in POLICIES:
        raise InvalidInput(f"policy must be one of {', '.join(POLICIES)}.", details={"field": "policy"})
    for key, low, high in (("max_job_time_s", 60, 366 * 86400), ("default_runtime_estimate_s", 60, 366 * 86400),
                           ("max_interactive_gpus", 0, MAX_QUOTA_GPUS),
                           ("user_gpu_quota", 0, MAX_QUOTA_GPUS), ("cpu_quota", 0, 10**7),
                           ("memory_quota_bytes", 0, 2**62)):
        value = changes.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high):
            raise InvalidInput(f"{key} must be a number between {low} and {high}, or null for no limit.", details={"field": key})
    if changes.get("fair_share") is not None and not isinstance(changes["fair_share"], bool):
        raise InvalidInput("fair_share must be true or false, or null for the default (dlts.yaml).",
                           details={"field": "fair_share"})
    weight = changes.get("limit_weight")
    if weight is not None and (isinstance(weight, bool) or not isinstance(weight, (int, float))
                               or not 0 <= weight <= MAX_LIMIT_WEIGHT):
        raise InvalidInput(f"limit_weight must be a number between 0 and {MAX_LIMIT_WEIGHT:g}, or null for the default "
                           "(dlts.yaml).", details={"field": "limit_weight"})
    for key, high in SCHEDULING_LIMITS.items():
        value = changes.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high):
            raise InvalidInput(f"{key} must be a whole number between 0 and {high}, or null for the default (dlts.yaml).",
                               details={"field": key})
    for key in ("max_queued_jobs_per_user", "max_submissions_per_minute"):
        admin.check_abuse_limit(key, changes.get(key))
    if changes.get("notice") is not None and (not isinstance(changes["notice"], str) or len(changes["notice"]) > 2000):
        raise InvalidInput("notice must be text of at most 2000 characters.", details={"field": "notice"})
    if "gid" in changes:
        admin.check_id("gid", changes["gid"])
    if "ephemeral_storage_bytes" in changes:
        admin.check_ephemeral("ephemeral_storage_bytes", changes["ephemeral_storage_bytes"])
    if "pod_policy" in changes:
        check_pod_policy(changes["pod_policy"])


IDLE_POLICY_KEYS = ("idle_warn_min", "idle_action_min", "idle_action", "exempt_types")
IDLE_POLICY_DEFAULTS = {"idle_warn_min": 60, "idle_action_min": 60, "idle_action": "none", "exempt_types": []}
MAX_IDLE_MIN = 7 * 24 * 60


def check_idle_policy(value: Any, current: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The VC's idle-job policy after a change: ``value`` merges into the current policy (or the
    defaults); null turns it off. ``idle_warn_min``/``idle_action_min``: minutes (fractions allowed)
    of idle GPUs before the owner is told, and after that before the job is paused or killed;
    ``idle_action``: pause, kill or none (warn only); ``exempt_types``: job types it never touches."""
    from dlts.insight.rules import IDLE_ACTIONS, JOB_TYPES

    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidInput("idle_policy must be an object: {idle_warn_min, idle_action_min, idle_action, exempt_types}, "
                           "or null to turn it off.", details={"field": "idle_policy"})
    unknown = sorted(str(k) for k in value if k not in IDLE_POLICY_KEYS)
    if unknown:
        raise InvalidInput(f"idle_policy: unknown key {unknown[0][:40]!r}; keys: {', '.join(IDLE_POLICY_KEYS)}.",
                           details={"field": f"idle_policy.{unknown[0][:40]}"})
    merged = {**IDLE_POLICY_DEFAULTS, **(current or {}), **value}
    for key in ("idle_warn_min", "idle_action_min"):
        number = merged[key]
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not 0 < number <= MAX_IDLE_MIN:
            raise InvalidInput(f"idle_policy.{key} must be minutes above 0 and at most {MAX_IDLE_MIN} (a week).",
                               details={"field": f"idle_policy.{key}"})
    if merged["idle_action"] not in IDLE_ACTIONS:
        raise InvalidInput(f"idle_policy.idle_action must be one of {', '.join(IDLE_ACTIONS)}.",
                           details={"field": "idle_policy.idle_action"})
    types = merged["exempt_types"]
    if not isinstance(types, (list, tuple)) or any(t not in JOB_TYPES for t in types):
        raise InvalidInput(f"idle_policy.exempt_types must be a list of job types: {', '.join(JOB_TYPES)}.",
                           details={"field": "idle_policy.exempt_types"})
    return {"idle_warn_min": merged["idle_warn_min"], "idle_action_min": merged["idle_action_min"],
            "idle_action": merged["idle_action"], "exempt_types": sorted(set(types))}


def check_pod_policy(value: Any) -> dict[str, bool]:
    """``{"run_as_root": true, "host_network": false, ...}``: the privileged features the VC's jobs may use."""
    from dlts.backends.k8s_settings import PrivilegedFeature

    known = [f.value for f in PrivilegedFeature]
    if not isinstance(value, Mapping):
        raise InvalidInput(f"pod_policy must be an object of feature: true/false; features: {', '.join(known)}.",
                           details={"field": "pod_policy"})
    for key, allowed in value.items():
        if key not in known:
            raise InvalidInput(f"pod_policy: unknown feature {str(key)[:40]!r}; features: {', '.join(known)}.",
                               details={"field": f"pod_policy.{str(key)[:40]}"})
        if not isinstance(allowed, bool):
            raise InvalidInput(f"pod_policy.{key} must be true or false.", details={"field": f"pod_policy.{key}"})
    return dict(value)


def create_vc(session: Session, settings: Settings, principal: Principal, spec: VcSpec) -> VcView:
    with transaction(session):
        policy.require_cluster_admin(principal, "create a VC")
        if not NAME_RE.match(spec.name):
            raise InvalidInput(f"VC name {spec.name[:70]!r} must start with a lowercase letter and use a-z, 0-9, '.', '_' "
                               "or '-' (at most 64).", details={"field": "name"})
        values = {k: getattr(spec, k) for k in VC_ADMIN_FIELDS + CLUSTER_ADMIN_FIELDS if k != "quota"}
        _check_settings(values)
        values["pod_policy"] = dict(values["pod_policy"])
        values["idle_policy"] = check_idle_policy(values["idle_policy"], None)
        quota = _check_quota(session, spec.name, spec.quota)
        if session.scalar(sa.select(VirtualCluster.id).where(VirtualCluster.name == spec.name)) is not None:
            raise WrongState(f"VC {spec.name!r} already exists; change it with PATCH /vcs/{spec.name}.", code="vc_exists")
        vc = VirtualCluster(name=spec.name, quota=quota, storage={}, **values)
        session.add(vc)
        vc_events.record(session, spec.name, principal.name, "created", None, {"quota": quota, **values})
    return get_vc(session, settings, principal, spec.name)


@transactional
def delete_vc(session: Session, principal: Principal, name: str) -> None:
    """Refused while the VC has jobs that have not ended; ended jobs (and their history) go with it."""
    vc = _load(session, principal, name)  # 404 first: non-members do not learn that it exists
    policy.require_cluster_admin(principal, "delete a VC")
    open_jobs = session.scalar(sa.select(sa.func.count(Job.id)).where(Job.vc_id == vc.id, Job.status.not_in(list(TERMINAL))))
    if open_jobs:
        raise WrongState(f"VC {name} still has {open_jobs} jobs that have not ended; kill them or wait, then delete the VC.",
                         code="vc_has_jobs", details={"jobs": int(open_jobs)})
    # attempts and events go by ON DELETE CASCADE
    session.execute(sa.delete(Job).where(Job.vc_id == vc.id).execution_options(synchronize_session=False))
    vc_events.record(session, name, principal.name, "deleted", {"quota": vc.quota}, None)
    session.delete(vc)


def update_vc(session: Session, settings: Settings, principal: Principal, name: str,
              changes: Mapping[str, Any]) -> VcView:
    """Apply ``changes`` (only the keys present); each changed value is recorded as a VC event."""
    with transaction(session):
        vc = _load(session, principal, name)
        unknown = set(changes) - set(VC_ADMIN_FIELDS) - set(CLUSTER_ADMIN_FIELDS)
        if unknown:
            raise InvalidInput(f"unknown VC setting {sorted(unknown)[0]!r}; settable: {', '.join(VC_ADMIN_FIELDS + CLUSTER_ADMIN_FIELDS)}.",
                               details={"field": sorted(unknown)[0]})
        policy.require_vc_settings_change(principal, name, set(changes) & set(CLUSTER_ADMIN_FIELDS),
                                          bool(set(changes) & set(VC_ADMIN_FIELDS)))
        if not changes:
            policy.require_vc_settings_change(principal, name, set(), True)  # an empty PATCH still needs the right to make one
            raise InvalidInput(f"Send at least one setting to change: {', '.join(VC_ADMIN_FIELDS + CLUSTER_ADMIN_FIELDS)}.",
                               details={"field": "body"})
        _check_settings(changes)
        values = dict(changes)
        if "quota" in values:
            if not isinstance(values["quota"], Mapping):
                raise InvalidInput("quota must be an object of SKU: GPUs, e.g. {\"a100\": 64}.", details={"field": "quota"})
            values["quota"] = _check_quota(session, name, values["quota"])
        if "idle_policy" in values:
            values["idle_policy"] = check_idle_policy(values["idle_policy"], vc.idle_policy)
        for key, new in values.items():
            old = getattr(vc, key)
            if old != new:
                vc_events.record(session, name, principal.name, key, old, new)
                setattr(vc, key, new)
                if key == "notice" and new and new.strip():
                    mail_notice(session, vc, new, principal.name)
    return get_vc(session, settings, principal, name)


def mail_notice(session: Session, vc: VirtualCluster, notice: str, author: str) -> int:
    """Queue the VC's new notice for each member (one mail each, in the caller's transaction), once
    per notice: the same text set again within ``notify.dedup_window_s`` is not sent again."""
    import hashlib

    from dlts.services import notify

    digest = hashlib.sha256(notice.strip().encode("utf-8", "surrogatepass")).hexdigest()[:16]
    queued = 0
    for user, address in notify.vc_member_addresses(session, vc.id):
        if notify.enqueue(session, template="vc_notice", to=[address],
                          context={"vc": vc.name, "message": notice, "author": author, "user": user},
                          dedup_key=f"vc-notice:{vc.id}:{digest}:{user}") is not None:
            queued += 1
    return queued


def set_storage(session: Session, settings: Settings, principal: Principal, name: str, document: Any) -> VcView:
    """Replace the VC's whole storage document (cluster admins); applies to attempts launched from now on."""
    vc = _load(session, principal, name)
    policy.require_cluster_admin(principal, f"change the storage of VC {name}")
    admin.replace_vc_storage(session, vc, document, principal.name)
    return get_vc(session, settings, principal, name)


def events(session: Session, principal: Principal, name: str, *, before_id: int | None = None, limit: int = 50) -> list[VcEventView]:
    _load(session, principal, name)
    return [VcEventView(e.id, e.vc, iso(e.at), e.actor, e.field, e.old_value, e.new_value)
            for e in vc_events.list_events(session, name, before_id=before_id, limit=limit)]


VC_PAGE_JOBS = 100  # of each kind on a VC's overview page


def jobs_of_vc(session: Session, principal: Principal, name: str) -> tuple[list[Job], list[Job]]:
    """A VC's running jobs (newest first) and waiting jobs (oldest first), at most 100 of each; the
    caller has read the VC with ``get_vc`` (which refuses a stranger)."""
    from dlts.repositories import cluster as cluster_repo
    from dlts.repositories import jobs as job_repo

    vc_id = cluster_repo.vc_id_named(session, name)
    running = job_repo.list_jobs(session, visible_vc_ids=None, user_id=None, vc_id=vc_id,
                                 statuses=[JobStatus.SCHEDULING, JobStatus.RUNNING, JobStatus.PAUSING, JobStatus.KILLING],
                                 job_type=None, boundary=None, oldest_first=False, limit=VC_PAGE_JOBS)
    waiting = job_repo.list_jobs(session, visible_vc_ids=None, user_id=None, vc_id=vc_id,
                                 statuses=[JobStatus.UNAPPROVED, JobStatus.QUEUED], job_type=None, boundary=None,
                                 oldest_first=True, limit=VC_PAGE_JOBS)
    return running, waiting


def notices(session: Session, vc_names: list[str]) -> list[tuple[str, str]]:
    """(VC, notice) for each of these VCs with a notice set: the banner above every portal page."""
    from dlts.repositories import cluster as cluster_repo

    return cluster_repo.vc_notices(session, vc_names) if vc_names else []
