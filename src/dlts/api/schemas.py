"""Request and response schemas (marshmallow). They validate input and generate the OpenAPI document.

Unknown fields are refused (marshmallow's RAISE), every string is bounded, every number ranged.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from marshmallow import INCLUDE, Schema, ValidationError, fields, missing, post_dump, post_load, validate

from dlts.backends.k8s_settings import PrivilegedFeature
from dlts.models import Job, JobAttempt, JobInsight, JobStatus, JobType, iso
from dlts.repair.machine import CycleKind, CycleOutcome
from dlts.repair.rules import Remediation
from dlts.scheduler.model import MAX_LIMIT_WEIGHT, Policy
from dlts.schemas import Memory, Pattern, TagList
from dlts.services.admin import MAX_EPHEMERAL_BYTES, MIN_EPHEMERAL_BYTES
from dlts.services.endpoints import EndpointView
from dlts.services.jobs import (
    BATCH_ACTIONS,
    COMMAND_PREVIEW_CHARS,
    MAX_TAG_CHARS,
    JobFilter,
    current_placements,
    decode_cursor,
    time_left_s,
)
from dlts.services.nodes import REPAIR_ACTIONS, RESULT_STATUS
from dlts.services.policy import Visibility
from dlts.services.portal_auth import MAX_PASSWORD_CHARS, MIN_PASSWORD_CHARS
from dlts.services.registry_credentials import MAX_PASSWORD_CHARS as REGISTRY_PASSWORD_CHARS
from dlts.services.registry_credentials import SERVER_PATTERN as REGISTRY_SERVER_PATTERN
from dlts.strict import MAX_ID, MAX_JSON_INT, is_whole_number

JOB_STATUSES = tuple(s.value for s in JobStatus)
# a cursor as the lists hand them out (api.pagination, repositories.jobs): base64url without padding
CURSOR = fields.String(validate=Pattern(r"^[A-Za-z0-9_-]{1,64}$", error="cursor is not one this API returned; start "
                                                                         "again from the first page, without it."),
                       metadata={"description": "the next_cursor of the page before, as it came (base64url); any "
                                                "other, or one of another list, is a 400 invalid_cursor"})


# a PATCH body's Meta.openapi (dlts.api.openapi.SchemaExtras): the server refuses one that changes nothing
AT_LEAST_ONE_FIELD = MappingProxyType({"minProperties": 1})


def comma_list(words: tuple[str, ...] | list[str]) -> str:
    """A pattern of a comma-separated list of ``words`` (spaces around each allowed)."""
    one = " *(" + "|".join(words) + ") *"
    return f"^{one}(,{one})*$"




class JobListArgs(Schema):
    vc = fields.String(validate=validate.Length(max=64))
    user = fields.String(validate=validate.Length(max=64))
    status = fields.String(validate=[validate.Length(max=200), Pattern(comma_list(JOB_STATUSES), error=(
        f"status takes one status or a comma-separated list of {', '.join(JOB_STATUSES)}."))],
        metadata={"description": "one status or a comma-separated list"})
    type = fields.String(validate=validate.OneOf([t.value for t in JobType]))
    limit = fields.Integer(load_default=50, validate=validate.Range(1, 500))
    cursor = CURSOR
    tag = fields.String(validate=validate.Length(1, MAX_TAG_CHARS), metadata={"description": "jobs with this tag"})
    favourite = fields.Boolean(metadata={"description": "true: only the jobs you starred"})
    archived = fields.String(load_default="false", validate=validate.OneOf(["false", "true", "all"]), metadata={
        "description": "false (default): archived jobs hidden; true: archived jobs only; all: both"})

    @post_load
    def _filter(self, data, **kwargs) -> JobFilter:
        """Every job the caller may see, narrowed by these arguments (an unknown cursor: 400 invalid_cursor)."""
        return JobFilter(
            scope="all", vc=data.get("vc"), user=data.get("user"),
            statuses=tuple(JobStatus(s.strip()) for s in data["status"].split(",")) if data.get("status") else (),
            job_type=data.get("type"), before=decode_cursor(data["cursor"]) if data.get("cursor") else None,
            limit=data["limit"], tag=data["tag"].strip().lower() if data.get("tag") else None,
            favourite=bool(data.get("favourite")), archived=data["archived"], command_preview_chars=COMMAND_PREVIEW_CHARS)


class LogArgs(Schema):
    attempt = fields.Integer(validate=validate.Range(1, 10000))
    offset = fields.Integer(load_default=0, validate=validate.Range(0, 2**50))
    limit = fields.Integer(load_default=65536, validate=validate.Range(1, 1024 * 1024))
    download = fields.Boolean(load_default=False)


class PlacementSchema(Schema):
    node = fields.String()
    gpu_indices = fields.List(fields.Integer())
    cpu = fields.Float()
    memory_bytes = fields.Integer()
    replica = fields.Integer(metadata={"description": "the replica's stable index (inference jobs: one placement per replica)"})
    retiring = fields.Boolean(metadata={"description": "an inference replica being removed (scale-down); it frees its "
                                                       "GPUs once it has exited"})


class IsoDateTime(fields.String):
    """A timestamp as the API writes it (``models.iso``: ISO 8601 with a Z; null stays null)."""

    def _serialize(self, value: Any, attr: str | None, obj: Any, **kwargs: Any) -> str | None:
        return iso(value) if isinstance(value, dt.datetime) else super()._serialize(value, attr, obj, **kwargs)


class EnumValue(fields.String):
    """An enum member as its value (``JobStatus.QUEUED`` -> ``"queued"``)."""

    def _serialize(self, value: Any, attr: str | None, obj: Any, **kwargs: Any) -> str | None:
        return super()._serialize(value.value if isinstance(value, enum.Enum) else value, attr, obj, **kwargs)


def _derived(base: type[fields.Field], get: Callable[[Any], Any], **kwargs: Any) -> fields.Field:
    """A field of type ``base`` (so the OpenAPI document says its type) whose value is ``get(obj)``
    instead of an attribute; ``get`` answers ``missing`` to leave the key out."""

    class Derived(base):  # type: ignore[valid-type, misc]
        def get_value(self, obj: Any, attr: str, accessor: Any = None, default: Any = missing) -> Any:
            return get(obj)

    Derived.__name__ = Derived.__qualname__ = f"Derived{base.__name__}"
    return Derived(**kwargs)


class AttemptSchema(Schema):
    """One ``JobAttempt``."""

    number = fields.Integer()
    placements = fields.List(fields.Nested(PlacementSchema))
    started_at = IsoDateTime(allow_none=True)
    ended_at = IsoDateTime(allow_none=True)
    exit_code = fields.Integer(allow_none=True)
    end_reason = fields.String(allow_none=True)
    spends_retry = fields.Boolean(allow_none=True)


class EndpointSchema(Schema):
    id = fields.Integer()
    job_id = fields.Integer()
    kind = fields.String()
    name = fields.String()
    port = fields.Integer(metadata={"description": "in the job's container"})
    status = fields.String(metadata={"description": "pending, ready, failed, closing, or closed (the job has ended)"})
    host = fields.String(allow_none=True, metadata={"description": "ready: the address to connect to"})
    host_port = fields.Integer(allow_none=True)
    url = fields.String(allow_none=True, metadata={"description": "ready only: ssh://user@host:port or http://host:port/"})
    message = fields.String(allow_none=True, metadata={"description": "why it failed, or what it waits for"})
    created_by = fields.String()
    created_at = fields.String(allow_none=True)
    token = fields.String(metadata={"description": "jupyter and vscode, in the answer to POST only: the server's "
                                                   "password, shown once (only its hash is stored)"})


class EndpointListSchema(Schema):
    items = fields.List(fields.Nested(EndpointSchema))
    next_cursor = fields.String(allow_none=True, metadata={"description": "always null: at most 8 endpoints per job"})


@dataclass(frozen=True)
class JobOut:
    """What ``JobSchema`` renders: a job and what its reader sees of it. A part left None is left out
    of the answer (a submit answers no endpoints, insights or actions; a change no attempts either)."""

    job: Job
    visibility: Visibility
    tags: list[str]
    favourite: bool
    attempts: list[JobAttempt] | None = None
    endpoints: list[EndpointView] | None = None
    insights: list[JobInsight] | None = None
    actions: tuple[str, ...] | None = None

    @property
    def time_left_s(self) -> float | None:
        return time_left_s(self.job, self.job.vc.max_job_time_s)


# what the other members of a job's VC see of it (``Visibility.PUBLIC``), and "visibility"
PUBLIC_JOB_FIELDS = ("id", "name", "user", "vc", "type", "status", "reason", "queue_position", "estimated_start",
                     "estimated_start_source", "sku",
                     "gpus", "nodes", "cpu", "memory_bytes", "preemptible", "submitted_at", "started_at", "finished_at",
                     "tags", "favourite", "archived_at", "visibility")


def _estimated_start(item: Any) -> str | None:
    return iso(item.job.estimate()[0])


def _estimate_source(item: Any) -> str | None:
    return item.job.estimate()[1]


def _estimate_note(item: Any) -> str | None:
    return item.job.estimate_note if item.job.status is JobStatus.QUEUED else None


def _spec(key: str, default: Any = None, convert: Callable[[Any], Any] = lambda v: v) -> Callable[[Any], Any]:
    return lambda item: convert(item.job.spec.get(key, default))


def _part(name: str, convert: Callable[[Any], Any] = lambda v: v) -> Callable[[Any], Any]:
    """The view model's ``name`` as ``convert`` renders it, or the key left out when it is None."""
    def get(item: Any) -> Any:
        value = getattr(item, name)
        return missing if value is None else convert(value)
    return get


def _current_placements(item: JobOut) -> Any:
    return missing if item.attempts is None else current_placements(item.job, item.attempts)


class _JobFields(Schema):
    """What a job's list item and its detail both carry: each dumps a view model with ``job``,
    ``visibility``, ``tags``, ``favourite`` and ``time_left_s`` (``JobOut``, ``services.jobs.JobListItem``)."""

    id = fields.Integer(attribute="job.id")
    name = fields.String(attribute="job.name")
    user = fields.String(attribute="job.user.name")
    vc = fields.String(attribute="job.vc.name")
    type = EnumValue(attribute="job.type")
    status = EnumValue(attribute="job.status")
    reason = fields.String(attribute="job.reason", allow_none=True)
    reason_detail = fields.String(attribute="job.reason_detail", allow_none=True)
    queue_position = fields.Integer(attribute="job.queue_position", allow_none=True)
    estimated_start = _derived(fields.String, _estimated_start, allow_none=True, metadata={
        "description": "queued jobs: when the job is expected to start: its backfill reservation (running jobs "
                       "ending by their limits), else the last forecast (docs/scheduling.md); null when unknown"})
    estimated_start_source = _derived(fields.String, _estimate_source, allow_none=True, metadata={
        "description": "reservation (the scheduler holds resources for the job from estimated_start on) or "
                       "forecast (a projection refreshed every forecast.interval_s; nothing is held); null: no estimate"})
    estimate_note = _derived(fields.String, _estimate_note, allow_none=True, metadata={
        "description": "queued jobs: why the estimated start last moved later (the jobs that came ahead of it and why; "
                       "docs/scheduling.md); null when it has not moved or the job is not waiting"})
    image = fields.String(attribute="job.image")
    sku = fields.String(attribute="job.sku", allow_none=True)
    gpus = fields.Integer(attribute="job.gpus")
    nodes = fields.Integer(attribute="job.nodes")
    cpu = fields.Float(attribute="job.cpu")
    memory_bytes = fields.Integer(attribute="job.memory_bytes")
    priority = fields.Integer(attribute="job.priority")
    preemptible = fields.Boolean(attribute="job.preemptible")
    max_retries = fields.Integer(attribute="job.max_retries")
    retries_used = fields.Integer(attribute="job.retries_used")
    max_time_s = fields.Integer(attribute="job.max_time_s", allow_none=True)
    time_left_s = fields.Float(allow_none=True)
    submitted_at = IsoDateTime(attribute="job.submitted_at")
    queue_time = IsoDateTime(attribute="job.queue_time")
    started_at = IsoDateTime(attribute="job.started_at", allow_none=True)
    finished_at = IsoDateTime(attribute="job.finished_at", allow_none=True)
    exit_code = fields.Integer(attribute="job.exit_code", allow_none=True)
    attempt = fields.Integer(attribute="job.attempt")
    visibility = EnumValue(metadata={"description": "full, or public for other members of the VC"})
    tags = fields.List(fields.String(), metadata={"description": "the job's tags, sorted"})
    favourite = fields.Boolean(metadata={"description": "you starred this job"})
    archived_at = IsoDateTime(attribute="job.archived_at", allow_none=True, metadata={
        "description": "when its owner archived it (null: not archived)"})

    @post_dump(pass_original=True)
    def _as_visible(self, data: dict, original: Any, **kwargs: Any) -> dict:
        """Another member of the VC sees the public fields only."""
        if original.visibility is Visibility.PUBLIC:
            return {k: v for k, v in data.items() if k in PUBLIC_JOB_FIELDS}
        return data


class InsightSchema(Schema):
    """One ``JobInsight``."""

    code = fields.String(metadata={"description": "gpus_idle, gpus_partly_busy, low_utilisation, gpu_memory_full, "
                                                  "cpu_bound or preemption_risk"})
    message = fields.String(metadata={"description": "what was found and what to do"})
    since = IsoDateTime(metadata={"description": "when the condition began, as far as the history shows"})


class JobSchema(_JobFields):
    """A job (``JobOut``)."""

    insights = _derived(fields.List, _part("insights"), cls_or_instance=fields.Nested(InsightSchema), metadata={
        "description": "the current insight findings of a running job (full visibility, GET only)"})
    idle_exempt = _derived(fields.Boolean, _spec("idle_exempt", convert=bool), metadata={
        "description": "exempt from the VC's idle-job policy (set by a VC admin)"})
    command = fields.String(attribute="job.command")
    env = _derived(fields.Dict, _spec("env", {}), keys=fields.String(), values=fields.String())
    ports = _derived(fields.List, _spec("ports", []), cls_or_instance=fields.Integer())
    ssh = _derived(fields.Boolean, _spec("ssh", False))
    placements = _derived(fields.List, _current_placements, cls_or_instance=fields.Nested(PlacementSchema))
    attempts = _derived(fields.List, _part("attempts"), cls_or_instance=fields.Nested(AttemptSchema))
    endpoints = _derived(fields.List, _part("endpoints"), cls_or_instance=fields.Nested(EndpointSchema), metadata={
        "description": "full visibility, GET only"})
    actions = _derived(fields.List, _part("actions", list), cls_or_instance=fields.String(), metadata={
        "description": "what you may do to the job now (kill, pause, resume, approve); full visibility, GET only"})
    ephemeral_storage_bytes = _derived(fields.Integer, _spec("ephemeral_storage_bytes"), allow_none=True,
                                       metadata={"description": "null: the VC's default"})
    run_as_root = _derived(fields.Boolean, _spec("run_as_root", convert=bool))
    ib_domain = _derived(fields.String, _spec("ib_domain"), allow_none=True)
    min_replicas = _derived(fields.Integer, _spec("min_replicas", 0), metadata={"description": "inference jobs"})
    max_replicas = _derived(fields.Integer, _spec("max_replicas", 0), metadata={"description": "inference jobs"})


class JobTagsSchema(Schema):
    tags = TagList(required=True)


class JobTagsResponseSchema(Schema):
    job_id = fields.Integer()
    tags = fields.List(fields.String())


class FavouriteSchema(Schema):
    job_id = fields.Integer()
    favourite = fields.Boolean()


class JobSummarySchema(_JobFields):
    """A job in a list (``services.jobs.JobListItem``): what a table shows. No env, ports or spec, and
    only the start of the command (``command_start``); GET /jobs/{id} has the whole job."""

    command_preview = _derived(fields.String, lambda item: item.command_start[:COMMAND_PREVIEW_CHARS], metadata={
        "description": "the command's first 200 characters (full visibility)"})
    command_truncated = _derived(fields.Boolean, lambda item: len(item.command_start) > COMMAND_PREVIEW_CHARS, metadata={
        "description": "the command is longer: GET /jobs/{id} has it all"})


class JobPageSchema(Schema):
    items = fields.List(fields.Nested(JobSummarySchema))
    next_cursor = fields.String(allow_none=True)


class LogSchema(Schema):
    job_id = fields.Integer()
    attempt = fields.Integer()
    offset = fields.Integer()
    next_offset = fields.Integer()
    size = fields.Integer()
    data = fields.String()
    complete = fields.Boolean(metadata={"description": "the job has ended and next_offset reached the end"})


class MeSchema(Schema):
    name = fields.String()
    uid = fields.Integer(allow_none=True, metadata={"description": "the uid your jobs run as (null: none yet)"})
    gid = fields.Integer(allow_none=True)
    cluster_admin = fields.Boolean()
    vcs = fields.List(fields.Dict())


# -- shared ----------------------------------------------------------------------------------------

def _nonneg(max_value: int) -> validate.Range:
    return validate.Range(0, max_value)


class PageArgs(Schema):
    limit = fields.Integer(load_default=50, validate=validate.Range(1, 500))
    cursor = CURSOR


# -- jobs: patch, batch, events, attempts -------------------------------------------------------------

class JobPatchSchema(Schema):
    priority = fields.Integer(strict=True, validate=validate.Range(1, 1000),
                              metadata={"description": "owners up to 100, VC admins up to 1000"})
    max_time_s = fields.Integer(strict=True, allow_none=True, validate=validate.Range(1, 366 * 86400),
                                metadata={"description": "null: the VC's limit"})
    idle_exempt = fields.Boolean(truthy={True}, falsy={False}, metadata={
        "description": "VC admins and cluster admins: exempt the job from the VC's idle-job policy"})


class JobBatchSchema(Schema):
    action = fields.String(required=True, validate=validate.OneOf(list(BATCH_ACTIONS)))
    ids = fields.List(fields.Integer(strict=True, validate=validate.Range(1, 2**62)), required=True,
                      validate=validate.Length(1, 500))


class BatchResultSchema(Schema):
    id = fields.Integer()
    ok = fields.Boolean()
    http_status = fields.Integer()
    status = fields.String(allow_none=True, metadata={"description": "the job's status after the action"})
    code = fields.String(allow_none=True)
    message = fields.String(allow_none=True)


class BatchResponseSchema(Schema):
    action = fields.String()
    results = fields.List(fields.Nested(BatchResultSchema))
    succeeded = fields.Integer()
    failed = fields.Integer()


class EventSchema(Schema):
    """One ``JobEvent``."""

    id = fields.Integer()
    at = IsoDateTime(allow_none=True)
    kind = fields.String()
    from_status = fields.String(allow_none=True)
    to_status = fields.String(allow_none=True)
    reason = fields.String(allow_none=True)
    message = fields.String(allow_none=True)
    actor = fields.String(allow_none=True)


class EventPageSchema(Schema):
    """A page of a job's events: ``{"items", "next_cursor", "visibility"}`` (the reader's, not written)."""

    items = fields.List(fields.Nested(EventSchema))
    next_cursor = fields.String(allow_none=True)

    @post_dump(pass_original=True)
    def _as_visible(self, data: dict, original: Any, **kwargs: Any) -> dict:
        """Another member of the VC sees no message and no actor."""
        if original.get("visibility") is Visibility.PUBLIC:
            data["items"] = [{k: v for k, v in item.items() if k not in ("message", "actor")} for item in data["items"]]
        return data


class AttemptPageSchema(Schema):
    """A page of a job's attempts: ``{"items", "next_cursor", "visibility"}`` (the reader's, not written)."""

    items = fields.List(fields.Nested(AttemptSchema))
    next_cursor = fields.String(allow_none=True)

    @post_dump(pass_original=True)
    def _as_visible(self, data: dict, original: Any, **kwargs: Any) -> dict:
        """Another member of the VC sees no placements."""
        if original.get("visibility") is Visibility.PUBLIC:
            data["items"] = [item | {"placements": []} for item in data["items"]]
        return data


# -- VCs -----------------------------------------------------------------------------------------------

# the names of users, groups and VCs (services.admin.NAME_RE)
NAME_PATTERN = r"^[a-z][a-z0-9_.-]{0,63}$"
NAME_ERROR = "must start with a lowercase letter and use a-z, 0-9, '.', '_' or '-' (at most 64 characters)"
SKU_NAME = fields.String(validate=validate.Length(1, 64))
POSIX_ID = validate.Range(1000, 2**31 - 1, error="must be between {min} and {max}: ids below 1000 (root is 0) belong to the system.")
QUOTA = fields.Dict(keys=SKU_NAME, values=fields.Integer(strict=True, validate=_nonneg(1_000_000)),
                    validate=validate.Length(max=64), metadata={"description": "GPUs per SKU, e.g. {\"a100\": 64}; "
                                                                              "each SKU name 1-64 characters"})


class JsonBoolean(fields.Boolean):
    """Only JSON's true and false: 1, "yes" and "true" are refused (a set of truthy values cannot tell 1
    from True)."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise self.make_error("invalid", input=value)
        return value


class IdlePolicySchema(Schema):
    idle_warn_min = fields.Float(validate=validate.Range(min=0, max=7 * 24 * 60, min_inclusive=False), metadata={
        "description": "minutes of idle GPUs before the job's owner is told (fractions allowed)"})
    idle_action_min = fields.Float(validate=validate.Range(min=0, max=7 * 24 * 60, min_inclusive=False), metadata={
        "description": "minutes after the warning, still idle, before the job is paused or killed"})
    idle_action = fields.String(validate=validate.OneOf(["pause", "kill", "none"]))
    exempt_types = fields.List(fields.String(validate=validate.OneOf([t.value for t in JobType])),
                               validate=validate.Length(max=4))


# pod_policy: one boolean per privileged feature the Kubernetes backend knows (services.vcs.check_pod_policy)
POD_POLICY = Schema.from_dict({f.value: fields.Boolean(truthy={True}, falsy={False}) for f in PrivilegedFeature},
                              name="PodPolicy")


class VcSettingsFields(Schema):
    policy = fields.String(validate=validate.OneOf([p.value for p in Policy]))
    max_job_time_s = fields.Integer(strict=True, allow_none=True, validate=validate.Range(60, 366 * 86400))
    default_runtime_estimate_s = fields.Integer(strict=True, allow_none=True, validate=validate.Range(60, 366 * 86400),
                                                metadata={"description": "backfill: the runtime assumed for jobs with "
                                                          "no limit; null: the cluster default"})
    max_interactive_gpus = fields.Integer(strict=True, allow_none=True, validate=_nonneg(1_000_000))
    user_gpu_quota = fields.Integer(strict=True, allow_none=True, validate=_nonneg(1_000_000))
    notice = fields.String(allow_none=True, validate=validate.Length(max=2000))
    max_queued_jobs_per_user = fields.Integer(strict=True, allow_none=True, validate=_nonneg(10_000_000), metadata={
        "description": "jobs one user may have waiting (queued or unapproved) in the VC; 0: no limit; null: the "
                       "cluster default (max_queued_jobs_per_user in dlts.yaml)"})
    max_submissions_per_minute = fields.Integer(strict=True, allow_none=True, validate=_nonneg(10_000_000), metadata={
        "description": "submissions one user may make to the VC per minute; 0: no limit; null: the cluster default"})
    quota = QUOTA
    cpu_quota = fields.Float(allow_none=True, validate=validate.Range(0, 10**7),
                             metadata={"description": "cores; null: in proportion to the GPU quota"})
    memory_quota_bytes = Memory(allow_none=True, max_bytes=2**62, metadata={"description": "bytes or '16Gi'; null: in proportion"})
    gid = fields.Integer(strict=True, allow_none=True, validate=POSIX_ID,
                         metadata={"description": "cluster admin: the VC's group, a supplementary group of its jobs"})
    ephemeral_storage_bytes = Memory(allow_none=True, min_bytes=MIN_EPHEMERAL_BYTES, max_bytes=MAX_EPHEMERAL_BYTES, metadata={
        "description": "cluster admin: scratch space per job pod, the most a job may ask; null: the cluster default"})
    pod_policy = fields.Nested(POD_POLICY, metadata={
        "description": "cluster admin: privileged features the VC's jobs may use, e.g. {\"run_as_root\": true}"})
    idle_policy = fields.Nested(IdlePolicySchema, allow_none=True, metadata={
        "description": "VC admin: the idle-job policy (docs/monitoring.md#idle-job-policy); the keys sent merge into "
                       "the current policy; null turns it off"})
    fair_share = JsonBoolean(allow_none=True, metadata={
        "description": "VC admin: order the VC's waiting jobs by their users' decayed GPU use (docs/scheduling.md); "
                       "null: the default (dlts.yaml's vc_scheduling entry, else the cluster's fair_share)"})
    fair_share_max_wait_s = fields.Integer(strict=True, allow_none=True, validate=validate.Range(0, 30 * 86400), metadata={
        "description": "VC admin: seconds after which fair share stops holding a job behind newer work of lighter "
                       "users (a job that has waited this long since its queue time ranks as if its owner had no "
                       "recent use); null: the default (which may itself be no bound)"})
    limit_weight = fields.Float(allow_none=True, allow_nan=False, validate=validate.Range(0, MAX_LIMIT_WEIGHT), metadata={
        "description": "VC admin: shorter limits first; among jobs of equal priority each ranks as if queued this "
                       "many times its limit later (the limit counted up to 7 days; no limit counts 7 days); 0: by "
                       "queue time alone; null: the default"})
    min_runtime_s = fields.Integer(strict=True, allow_none=True, validate=validate.Range(0, 30 * 86400), metadata={
        "description": "VC admin: seconds a preemptible job runs before reclaim may preempt it; null: the default"})
    max_reclaim_delay_s = fields.Integer(strict=True, allow_none=True, validate=validate.Range(0, 30 * 86400), metadata={
        "description": "VC admin: seconds a job may wait for reclaim before min_runtime_s no longer protects the "
                       "jobs it would preempt; null: the default"})
    max_preemptions = fields.Integer(strict=True, allow_none=True, validate=validate.Range(0, 1000), metadata={
        "description": "VC admin: preemptions after which a job is protected for min_runtime_s of every later run "
                       "(0: no limit); null: the default"})


class VcCreateSchema(VcSettingsFields):
    name = fields.String(required=True, validate=Pattern(NAME_PATTERN, error=NAME_ERROR))


class VcPatchSchema(VcSettingsFields):
    class Meta:
        openapi = AT_LEAST_ONE_FIELD  # services.vcs refuses a PATCH that changes nothing


class SkuQuotaSchema(Schema):
    sku = fields.String()
    gpus = fields.Integer()
    cpu = fields.Float()
    memory_bytes = fields.Integer()
    gpus_used = fields.Integer()
    preemptible_gpus_used = fields.Integer()
    gpus_queued = fields.Integer()


class UserUseSchema(Schema):
    user = fields.String()
    jobs = fields.Integer()
    gpus = fields.Integer()
    preemptible_gpus = fields.Integer()
    cpu = fields.Float()
    memory_bytes = fields.Integer()


def _scheduling_source() -> fields.String:
    return fields.String(validate=validate.OneOf(["vc", "config", "default"]), metadata={
        "description": "where the value in effect comes from: vc (set on the VC: PATCH /vcs/{name}), config (dlts.yaml's "
                       "vc_scheduling entry for the VC, or fair_share_half_life_h: 0 for fair_share), default (the "
                       "cluster's value)"})


class VcStorageSchema(Schema):
    """The whole storage document; ``services.vc_storage`` checks each entry and names the field at fault."""

    nfs = fields.List(fields.Dict(), validate=validate.Length(max=32), metadata={
        "description": "[{name?, server, path, mount_path, read_only?}]: NFS exports mounted into the VC's jobs"})
    host = fields.List(fields.Dict(), validate=validate.Length(max=32), metadata={
        "description": "[{name?, path, mount_path, read_only?}]: directories present on every node"})
    home = fields.Dict(allow_none=True, metadata={
        "description": "{kind: nfs|host, server?, path, mount_path}: a job of user U gets <path>/U at <mount_path>/U"})
    lustre = fields.Dict(allow_none=True, metadata={"description": "the VC's Lustre pool, MDT and project (docs/lustre.md)"})


class VcSchema(Schema):
    name = fields.String()
    policy = fields.String()
    quota = fields.Dict(keys=fields.String(), values=fields.Integer())
    skus = fields.List(fields.Nested(SkuQuotaSchema))
    cpu_quota = fields.Float()
    cpu_quota_source = fields.String()
    memory_quota_bytes = fields.Integer()
    memory_quota_source = fields.String()
    max_job_time_s = fields.Integer(allow_none=True)
    max_interactive_gpus = fields.Integer(allow_none=True)
    user_gpu_quota = fields.Integer(allow_none=True)
    notice = fields.String(allow_none=True)
    default_runtime_estimate_s = fields.Integer(allow_none=True)
    max_queued_jobs_per_user = fields.Integer(allow_none=True, metadata={"description": "null: the cluster default"})
    max_submissions_per_minute = fields.Integer(allow_none=True, metadata={"description": "null: the cluster default"})
    gid = fields.Integer(allow_none=True)
    ephemeral_storage_bytes = fields.Integer(allow_none=True, metadata={"description": "null: the cluster default"})
    pod_policy = fields.Dict(keys=fields.String(), values=fields.Boolean())
    fair_share = fields.Boolean(metadata={"description": "in effect; false whenever fair_share_half_life_h is 0"})
    fair_share_source = _scheduling_source()
    fair_share_max_wait_s = fields.Float(allow_none=True, metadata={"description": "in effect; null: no bound"})
    fair_share_max_wait_s_source = _scheduling_source()
    limit_weight = fields.Float(metadata={"description": "in effect; 0: queue time alone"})
    limit_weight_source = _scheduling_source()
    min_runtime_s = fields.Float(metadata={"description": "in effect"})
    min_runtime_s_source = _scheduling_source()
    max_reclaim_delay_s = fields.Float(allow_none=True, metadata={"description": "in effect; null: never"})
    max_reclaim_delay_s_source = _scheduling_source()
    max_preemptions = fields.Integer(metadata={"description": "in effect; 0: no limit"})
    max_preemptions_source = _scheduling_source()
    idle_policy = fields.Dict(allow_none=True, metadata={
        "description": "{idle_warn_min, idle_action_min, idle_action, exempt_types}; null: off"})
    storage = fields.Nested(VcStorageSchema, metadata={"description": "nfs, host, home and lustre (PUT /vcs/{name}/storage)"})
    users = fields.List(fields.Nested(UserUseSchema))
    admins = fields.List(fields.String())
    members = fields.List(fields.String())
    created_at = fields.String(allow_none=True)
    updated_at = fields.String(allow_none=True)


class VcPageSchema(Schema):
    items = fields.List(fields.Nested(VcSchema))
    next_cursor = fields.String(allow_none=True)


class VcEventSchema(Schema):
    id = fields.Integer()
    vc = fields.String()
    at = fields.String(allow_none=True)
    actor = fields.String()
    field = fields.String()
    old = fields.Raw(allow_none=True)
    new = fields.Raw(allow_none=True)


class VcEventPageSchema(Schema):
    items = fields.List(fields.Nested(VcEventSchema))
    next_cursor = fields.String(allow_none=True)


# -- SSH keys, allowed IPs ----------------------------------------------------------------------------

SSH_KEY_TYPES = "ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp256|ecdsa-sha2-nistp384|ecdsa-sha2-nistp521"


def printable(min_chars: int, max_chars: int, also_not: str = "") -> Pattern:
    """Text without control characters (the server also refuses what ``str.isprintable`` refuses:
    format characters, separators other than the space, unassigned code points)."""
    return Pattern(rf"^[^\x00-\x1f\x7f-\x9f{also_not}]{{{min_chars},{max_chars}}}$",
                   error=f"must be printable text of {min_chars}-{max_chars} characters.")


class SshKeyCreateSchema(Schema):
    public_key = fields.String(required=True, validate=validate.Length(1, 16384), metadata={
        "pattern": rf"^[ \t]*({SSH_KEY_TYPES})[ \t]+[A-Za-z0-9+/]+={{0,2}}([ \t][^\x00-\x1f\x7f-\x9f]*)?$",
        "description": "one OpenSSH public key line: 'ssh-ed25519 AAAA... comment'; the base64 part must decode to a "
                       "key of that type (else 400 invalid_ssh_key), RSA of at least 2048 bits (else 422 weak_ssh_key)"})
    name = fields.String(validate=printable(1, 128))


class SshKeySchema(Schema):
    id = fields.Integer()
    name = fields.String()
    key_type = fields.String()
    bits = fields.Integer(allow_none=True)
    fingerprint = fields.String()
    public_key = fields.String()
    created_at = fields.String(allow_none=True)


class SshKeyListSchema(Schema):
    items = fields.List(fields.Nested(SshKeySchema))
    next_cursor = fields.String(allow_none=True, metadata={"description": "always null: at most 50 keys per user"})


class AllowedIpCreateSchema(Schema):
    ip = fields.String(required=True, validate=validate.Length(1, 64), metadata={
        "pattern": r"^[0-9A-Fa-f:.]+(/[0-9]{1,3})?$",
        "description": "IPv4/IPv6 address or CIDR; it must parse as one (else 400 invalid_input naming ip), host bits "
                       "clear (400), no wider than /8 or /32 (422 network_too_wide), a public or private unicast "
                       "address (422 address_not_allowed)"})
    user = fields.String(validate=validate.Length(1, 64), metadata={"description": "cluster admins: another user's list"})


class AllowedIpArgs(Schema):
    user = fields.String(validate=validate.Length(1, 64))


class AllowedIpSchema(Schema):
    id = fields.Integer()
    user = fields.String()
    cidr = fields.String()
    created_at = fields.String(allow_none=True)
    expires_at = fields.String(allow_none=True)
    renewed = fields.Boolean()


class AllowedIpListSchema(Schema):
    items = fields.List(fields.Nested(AllowedIpSchema))
    next_cursor = fields.String(allow_none=True, metadata={"description": "always null: at most 64 entries per user"})


# -- nodes, cluster, storage ----------------------------------------------------------------------------

class NodeSchema(Schema):
    name = fields.String()
    sku = fields.String()
    gpus = fields.Integer()
    gpus_used = fields.Integer()
    gpus_free = fields.Integer()
    cpu = fields.Float()
    cpu_used = fields.Float()
    memory_bytes = fields.Integer()
    memory_used_bytes = fields.Integer()
    ib_domain = fields.String()
    vc = fields.String(allow_none=True)
    state = fields.String()
    ready = fields.Boolean(metadata={"description": "the cluster has it ready and its agent is not lost (silent for "
                                                    "repair.lost_after_s); not_ready_reason says why not"})
    schedulable = fields.Boolean()
    health = fields.String(metadata={"description": "ok | warning | critical from the agent's last report; unknown "
                                                    "while its agent is lost"})
    state_reason = fields.String(allow_none=True, metadata={"description": "why the node is in its state"})
    cordoned_by = fields.String(allow_none=True, metadata={"description": "the cluster admin whose cordon holds it"})
    unhealthy_gpus = fields.List(fields.Integer(), metadata={"description": "GPU indices the scheduler never assigns"})
    repair_paused = fields.Boolean()
    repair = fields.Dict(allow_none=True, metadata={"description": "the open repair cycle: id, state, kind, scope, "
                                                                   "gpus, problem, step, started_at"})
    last_heartbeat_at = fields.String(allow_none=True, metadata={"description": "the agent's last report"})
    not_ready_reason = fields.String(allow_none=True, metadata={
        "description": "null when ready; else why: no report from its agent since <last report> (lost after <n> s), "
                       "or the cluster has it not ready"})
    details = fields.Dict(allow_none=True, metadata={"description": "cluster admins only: findings, orders, events, metrics, labels, jobs"})


class NodePageSchema(Schema):
    items = fields.List(fields.Nested(NodeSchema))
    next_cursor = fields.String(allow_none=True)


class NodeRepairSchema(Schema):
    action = fields.String(required=True, validate=validate.OneOf(REPAIR_ACTIONS))
    target = fields.String(validate=validate.Length(1, 128),
                           metadata={"description": "GPU index/UUID, service name, or LEVEL[:GPU,...] for gpu_diag"})
    dry_run = fields.Boolean(load_default=False)
    reason = fields.String(load_default="", validate=validate.Length(max=500))


class RepairStepSchema(Schema):
    number = fields.Integer()
    remediation = fields.String()
    target = fields.String(allow_none=True)
    order_ids = fields.List(fields.String())
    started_at = fields.String(allow_none=True)
    deadline_at = fields.String(allow_none=True)
    ended_at = fields.String(allow_none=True)
    result = fields.String(allow_none=True, metadata={"description": "succeeded | failed | timed_out | cancelled"})
    message = fields.String(allow_none=True)


class RepairCycleSchema(Schema):
    id = fields.Integer()
    node = fields.String()
    kind = fields.String(metadata={"description": " | ".join(CycleKind)})
    rule = fields.String(allow_none=True)
    scope = fields.String(metadata={"description": "gpu | node"})
    gpus = fields.List(fields.Integer())
    severity = fields.String()
    problem = fields.String()
    triggers = fields.List(fields.Dict())
    chain = fields.List(fields.Dict(), metadata={"description": "the remediations in order, with timeout_s"})
    step_index = fields.Integer()
    state = fields.String(metadata={"description": "the node's state while open, 'ended' after"})
    flap = fields.Boolean()
    started_by = fields.String()
    started_at = fields.String(allow_none=True)
    validation_since = fields.String(allow_none=True)
    ended_at = fields.String(allow_none=True)
    duration_s = fields.Float(allow_none=True)
    outcome = fields.String(allow_none=True, metadata={"description": " | ".join(CycleOutcome)})
    message = fields.String(allow_none=True)
    steps = fields.List(fields.Nested(RepairStepSchema))


class RepairCycleListSchema(Schema):
    items = fields.List(fields.Nested(RepairCycleSchema))


class RepairStartSchema(Schema):
    steps = fields.List(fields.String(validate=validate.OneOf([r.value for r in Remediation])),
                        load_default=lambda: ["reboot", "ticket"], validate=validate.Length(1, 8),
                        metadata={"description": "the chain to follow; ticket or rma only last (default reboot, ticket)"})
    gpus = fields.List(fields.Integer(strict=True, validate=validate.Range(0, 63)), load_default=list,
                       validate=validate.Length(max=64), metadata={"description": "a GPU-scope repair of these GPUs"})
    target = fields.String(validate=validate.Length(1, 128), metadata={"description": "restart_service: the unit"})
    reason = fields.String(load_default="", validate=validate.Length(max=500))


class RepairPauseSchema(Schema):
    node = fields.String(validate=validate.Length(1, 253), metadata={"description": "pause one node only"})
    reason = fields.String(load_default="", validate=validate.Length(max=500))


class RepairReturnSchema(Schema):
    reason = fields.String(load_default="", validate=validate.Length(max=500))


class RepairStatusSchema(Schema):
    paused = fields.Boolean()
    paused_by = fields.String(allow_none=True)
    paused_at = fields.String(allow_none=True)
    reason = fields.String(allow_none=True)
    dry_run = fields.Boolean()
    paused_nodes = fields.List(fields.String())
    states = fields.Dict(metadata={"description": "state -> number of nodes"})
    budget = fields.List(fields.Dict(), metadata={"description": "per SKU: nodes, budget, in_repair"})
    queue = fields.List(fields.Dict(), metadata={"description": "quarantined nodes waiting for the budget, in order"})
    recent = fields.List(fields.Dict(), metadata={"description": "the latest cycles"})


class NodeOrderSchema(Schema):
    id = fields.String()
    node = fields.String()
    action = fields.String()
    target = fields.String()
    dry_run = fields.Boolean()
    reason = fields.String()
    status = fields.String()


# The node agent's report (docs/agent.md). Known fields are typed and ranged; unknown ones in the
# metrics, a GPU or a collector are kept as sent (a newer agent may add some), bounded like every
# body by dlts.strict (depth, numbers, strings) and the body size limit.

COUNT = validate.Range(0, MAX_JSON_INT)
AGENT_TEXT = validate.Length(max=4000)


class ReportJobId(fields.Field):
    """A job id as the agent read it from a process's DLTS_JOB_ID (a string of digits, or an int).

    A job's own process can set that variable for its children: a value that is no id of ours becomes
    null instead of failing the whole report (which would look like a lost node). A wrong JSON type is
    a broken agent and is refused."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(metadata={"anyOf": [{"type": "integer"}, {"type": "string"}],
                                   "description": "a job id as read from DLTS_JOB_ID: digits, or null"}, **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValidationError("must be a job id (digits) or null.")
        if isinstance(value, int):
            return str(value) if 1 <= value <= MAX_ID else None
        return value if is_whole_number(value) and int(value) >= 1 else None

    def _serialize(self, value, attr, obj, **kwargs):
        return value


class ReportGpuSchema(Schema):
    class Meta:
        unknown = INCLUDE

    index = fields.Integer(required=True, strict=True, validate=validate.Range(0, 1023))
    uuid = fields.String(allow_none=True, validate=validate.Length(max=128))
    bus_id = fields.String(allow_none=True, validate=validate.Length(max=64))
    name = fields.String(allow_none=True, validate=validate.Length(max=256))
    lost = fields.Boolean(allow_none=True)
    lost_reason = fields.String(allow_none=True, validate=AGENT_TEXT)
    utilization_ratio = fields.Float(allow_none=True, validate=validate.Range(0, 1))
    memory_used_bytes = fields.Integer(allow_none=True, strict=True, validate=COUNT)
    memory_total_bytes = fields.Integer(allow_none=True, strict=True, validate=COUNT)
    temperature_celsius = fields.Float(allow_none=True, validate=validate.Range(-273, 1000))
    power_watts = fields.Float(allow_none=True, validate=validate.Range(0, 100_000))
    ecc_errors = fields.Dict(keys=fields.String(validate=validate.Length(max=64)),
                             values=fields.Integer(strict=True, validate=COUNT), validate=validate.Length(max=32))
    row_remap_pending = fields.Boolean(allow_none=True)
    row_remap_failure = fields.Boolean(allow_none=True)
    remapped_rows_uncorrectable = fields.Integer(allow_none=True, strict=True, validate=COUNT)
    retired_pages_single_bit = fields.Integer(allow_none=True, strict=True, validate=COUNT)
    retired_pages_double_bit = fields.Integer(allow_none=True, strict=True, validate=COUNT)
    retired_pages_pending = fields.Boolean(allow_none=True)
    recovery_action = fields.Integer(allow_none=True, strict=True, validate=COUNT)
    job_id = ReportJobId(allow_none=True, load_default=None)


class ReportFilesystemSchema(Schema):
    class Meta:
        unknown = INCLUDE

    mount = fields.String(required=True, validate=validate.Length(1, 4096))
    size_bytes = fields.Integer(strict=True, validate=COUNT)
    free_bytes = fields.Integer(strict=True, validate=COUNT)
    free_inodes = fields.Integer(strict=True, validate=COUNT, allow_none=True)


class ReportMetricsSchema(Schema):
    class Meta:
        unknown = INCLUDE

    cpu_count = fields.Integer(allow_none=True, strict=True, validate=validate.Range(0, 65536))
    load1 = fields.Float(allow_none=True, validate=validate.Range(0, 10**7))
    memory_total_bytes = fields.Integer(allow_none=True, strict=True, validate=COUNT)
    memory_available_bytes = fields.Integer(allow_none=True, strict=True, validate=COUNT)
    filesystems = fields.List(fields.Nested(ReportFilesystemSchema), validate=validate.Length(max=256))
    gpu_count = fields.Integer(allow_none=True, strict=True, validate=validate.Range(0, 1024))
    driver_version = fields.String(allow_none=True, validate=validate.Length(max=64))
    gpus = fields.List(fields.Nested(ReportGpuSchema), validate=validate.Length(max=1024))
    job_ids = fields.List(ReportJobId(allow_none=True), validate=validate.Length(max=4096))


class ReportCollectorSchema(Schema):
    class Meta:
        unknown = INCLUDE

    status = fields.String(required=True, validate=validate.Length(1, 32))
    errors = fields.List(fields.String(validate=AGENT_TEXT), load_default=list, validate=validate.Length(max=32))
    duration_s = fields.Float(allow_none=True, validate=validate.Range(0, 86400))
    skip_reason = fields.String(allow_none=True, validate=AGENT_TEXT)


class ReportFindingSchema(Schema):
    code = fields.String(required=True, validate=validate.Length(1, 64))
    severity = fields.String(required=True, validate=validate.OneOf(["info", "warning", "critical"]))
    device = fields.String(allow_none=True, validate=validate.Length(max=64))
    gpu_uuid = fields.String(allow_none=True, validate=validate.Length(max=128))
    bus_id = fields.String(allow_none=True, validate=validate.Length(max=64))
    recommended_action = fields.String(allow_none=True, validate=validate.Length(max=64))
    message = fields.String(allow_none=True, validate=validate.Length(max=2000))
    evidence = fields.Dict(keys=fields.String(validate=validate.Length(max=64)), load_default=dict,
                           validate=validate.Length(max=64))


class ReportOrderResultSchema(Schema):
    id = fields.String(required=True, validate=validate.Length(1, 128))
    action = fields.String(validate=validate.Length(max=64))
    target = fields.String(allow_none=True, validate=validate.Length(max=128))
    status = fields.String(required=True, validate=validate.OneOf(list(RESULT_STATUS)))
    message = fields.String(allow_none=True, validate=validate.Length(max=4000))
    dry_run = fields.Boolean()
    started_at = fields.String(allow_none=True, validate=validate.Length(max=64))
    finished_at = fields.String(allow_none=True, validate=validate.Length(max=64))


class NodeReportSchema(Schema):
    schema_version = fields.Integer(required=True, strict=True, validate=validate.Equal(1))
    node = fields.String(required=True, validate=validate.Length(1, 253))
    agent_version = fields.String(load_default="", validate=validate.Length(max=64))
    heartbeat_at = fields.String(allow_none=True, validate=validate.Length(max=64))
    collected_at = fields.String(allow_none=True, validate=validate.Length(max=64))
    boot_id = fields.String(load_default="", validate=validate.Length(max=128))
    collectors = fields.Dict(keys=fields.String(validate=validate.Length(max=64)), values=fields.Nested(ReportCollectorSchema),
                             load_default=dict, validate=validate.Length(max=64))
    findings = fields.List(fields.Nested(ReportFindingSchema), load_default=list, validate=validate.Length(max=1000))
    metrics = fields.Nested(ReportMetricsSchema, load_default=dict)
    order_results = fields.List(fields.Nested(ReportOrderResultSchema), load_default=list, validate=validate.Length(max=100))
    fake = fields.Boolean(load_default=False, metadata={"description": "read from a fake NVML: findings ignored outside the demo"})


class FirewallRuleSchema(Schema):
    port = fields.Integer(metadata={"description": "the guarded TCP port (a NodePort of a ready endpoint)"})
    cidrs = fields.List(fields.String(), metadata={"description": "sources that may reach it: collapsed, IPv4 then IPv6"})


class FirewallSchema(Schema):
    version = fields.String(metadata={"description": "SHA-256 of port_range and rules; agents apply only a new one"})
    port_range = fields.List(fields.Integer(), metadata={"description": "[lo, hi]: inside it only listed pairs get through"})
    rules = fields.List(fields.Nested(FirewallRuleSchema))


class NodeReportResponseSchema(Schema):
    orders = fields.List(fields.Dict())
    firewall = fields.Nested(FirewallSchema, metadata={"description": "the endpoint firewall every node enforces"})


class ClusterStatusSchema(Schema):
    at = fields.String(allow_none=True)
    skus = fields.List(fields.Dict(), metadata={"description": "capacity, use and fragmentation histogram per SKU"})
    vcs = fields.List(fields.Dict(), metadata={"description": "quota and use per VC you belong to (cluster admins: every VC)"})


class StorageArgs(Schema):
    format = fields.String(load_default="json", validate=validate.OneOf(["json", "csv"]))
    mount = fields.String(validate=validate.Length(1, 255))
    vc = fields.String(validate=validate.Length(1, 64))
    user = fields.String(validate=validate.Length(1, 64))


class StorageRowSchema(Schema):
    mount = fields.String()
    vc = fields.String(allow_none=True)
    user = fields.String(allow_none=True)
    directory = fields.String(allow_none=True, metadata={"description": "a top-level directory's row ('.': files directly in the mount)"})
    bytes_used = fields.Integer(metadata={"description": "allocated bytes (st_blocks * 512)"})
    apparent_bytes = fields.Integer(allow_none=True, metadata={"description": "the files' sizes (st_size)"})
    files = fields.Integer(allow_none=True)
    oldest_at = fields.String(allow_none=True, metadata={"description": "the oldest file's modification time"})
    previous_bytes_used = fields.Integer(allow_none=True, metadata={"description": "the same row in the scan before"})


class StorageSnapshotArgs(Schema):
    root = fields.String(validate=validate.Length(1, 255))
    limit = fields.Integer(load_default=50, validate=validate.Range(1, 500))


class StorageSnapshotSchema(Schema):
    id = fields.Integer()
    root = fields.String()
    kind = fields.String()
    started_at = fields.String()
    scanned_at = fields.String()
    duration_s = fields.Float()
    status = fields.String(metadata={"description": "complete | hung | timeout | failed"})
    message = fields.String(allow_none=True)
    errors = fields.Integer(metadata={"description": "paths it could not read"})
    other_filesystems = fields.Integer(metadata={"description": "mount points below the root, not entered"})
    dirs = fields.Integer()
    files = fields.Integer()
    allocated_bytes = fields.Integer()
    apparent_bytes = fields.Integer()
    fs_total_bytes = fields.Integer(allow_none=True)
    fs_used_bytes = fields.Integer(allow_none=True)
    fs_used_percent = fields.Float(allow_none=True)
    over_alert = fields.Boolean()
    top_dirs = fields.List(fields.Dict())
    oldest_files = fields.List(fields.Dict())


class StorageSnapshotListSchema(Schema):
    items = fields.List(fields.Nested(StorageSnapshotSchema))


class StorageUsageSchema(Schema):
    scanned_at = fields.String(allow_none=True, metadata={"description": "null: no scan has run yet"})
    rows = fields.List(fields.Nested(StorageRowSchema))


class TokenCreateSchema(Schema):
    name = fields.String(required=True, validate=printable(1, 64))
    expires_days = fields.Integer(strict=True, allow_none=True, load_default=None, validate=validate.Range(1, 3650))


class TokenSchema(Schema):
    id = fields.Integer()
    name = fields.String()
    prefix = fields.String(metadata={"description": "the first characters, to tell tokens apart"})
    created_at = fields.String(allow_none=True)
    expires_at = fields.String(allow_none=True)
    last_used_at = fields.String(allow_none=True)
    token = fields.String(allow_none=True, metadata={"description": "only when created: shown once, store it now"})


class TokenListSchema(Schema):
    items = fields.List(fields.Nested(TokenSchema))
    next_cursor = fields.String(allow_none=True, metadata={"description": "always null: at most 20 tokens per user"})


# -- users, registry credentials -------------------------------------------------------------------------

class StrictBoolean(fields.Boolean):
    """true or false, nothing else (marshmallow's Boolean takes 1, "yes", "on")."""

    def _deserialize(self, value, attr, data, **kwargs):
        if not isinstance(value, bool):
            raise ValidationError("must be true or false.")
        return value


NAME = Pattern(NAME_PATTERN, error=NAME_ERROR)
_NOT_IN_EMAIL = r"@\s\x00-\x1f\x7f-\x9f"
EMAIL = fields.String(allow_none=True, validate=[validate.Length(max=254), Pattern(
    rf"^[^{_NOT_IN_EMAIL}]{{1,64}}@[^.{_NOT_IN_EMAIL}]+(\.[^.{_NOT_IN_EMAIL}]+)+$",
    error="email must be an address like name@example.org (at most 254 characters), or null.")],
    metadata={"description": "null: none"})
PASSWORD = fields.String(load_only=True, validate=validate.Length(max=MAX_PASSWORD_CHARS), metadata={
    "minLength": MIN_PASSWORD_CHARS,  # services.portal_auth checks it for the portal too: 400 password_too_short
    "description": f"at least {MIN_PASSWORD_CHARS} characters; stored only as a scrypt hash"})


class UserPatchSchema(Schema):
    class Meta:
        openapi = AT_LEAST_ONE_FIELD  # services.users refuses a PATCH that changes nothing

    uid = fields.Integer(strict=True, allow_none=True, validate=POSIX_ID, metadata={"description": "null with gid: unset"})
    gid = fields.Integer(strict=True, allow_none=True, validate=POSIX_ID)
    email = EMAIL
    cluster_admin = StrictBoolean(metadata={
        "description": "grant or take the user's own cluster admin role (the last enabled cluster admin keeps it)"})


class UserSchema(Schema):
    name = fields.String()
    email = fields.String(allow_none=True)
    uid = fields.Integer(allow_none=True)
    gid = fields.Integer(allow_none=True)
    cluster_admin = fields.Boolean()
    disabled = fields.Boolean()
    disabled_at = fields.String(allow_none=True)
    disabled_reason = fields.String(allow_none=True)
    source = fields.String(allow_none=True, metadata={"description": "null: made by a person; directory: by the directory sync"})
    groups = fields.List(fields.String())
    password_login = fields.Boolean(metadata={"description": "the user has a portal password"})
    created_at = fields.String(allow_none=True)


class UserCreateSchema(Schema):
    name = fields.String(required=True, validate=NAME)
    email = EMAIL
    uid = fields.Integer(strict=True, allow_none=True, validate=POSIX_ID)
    gid = fields.Integer(strict=True, allow_none=True, validate=POSIX_ID)
    cluster_admin = StrictBoolean(load_default=False)
    password = PASSWORD
    generate_password = StrictBoolean(load_default=False, metadata={
        "description": "make a random portal password and answer it once"})


class UserCreatedSchema(UserSchema):
    password = fields.String(allow_none=True, metadata={"description": "the generated password, shown this once"})


class UserListArgs(PageArgs):
    q = fields.String(validate=validate.Length(max=64), metadata={"description": "part of the name"})
    disabled = fields.Boolean(metadata={"description": "true: only disabled users; false: only enabled ones"})


class UserPageSchema(Schema):
    items = fields.List(fields.Nested(UserSchema))
    next_cursor = fields.String(allow_none=True)


class UserDisableSchema(Schema):
    reason = fields.String(allow_none=True, validate=printable(0, 255))


class UserDisabledSchema(Schema):
    user = fields.Nested(UserSchema)
    tokens_revoked = fields.Integer()
    sessions_ended = fields.Integer()
    held_jobs = fields.List(fields.Integer(), metadata={"description": "waiting jobs now paused (reason user_disabled)"})
    running_jobs = fields.List(fields.Integer(), metadata={"description": "running jobs: they run on to their end"})


class UserEnabledSchema(Schema):
    user = fields.Nested(UserSchema)
    released_jobs = fields.List(fields.Integer(), metadata={"description": "jobs held by the disable, back in the queue"})


class PasswordResetSchema(Schema):
    password = PASSWORD


class PasswordResultSchema(Schema):
    user = fields.String()
    password = fields.String(allow_none=True, metadata={"description": "the generated password, shown this once; "
                                                                       "null when you set one"})
    sessions_ended = fields.Boolean()


# -- VC members and groups ------------------------------------------------------------------------------

class RoleSchema(Schema):
    role = fields.String(required=True, validate=validate.OneOf(["member", "admin"]))


class MemberRemoveArgs(Schema):
    queued = fields.String(load_default="keep", validate=validate.OneOf(["keep", "kill"]), metadata={
        "description": "the user's waiting jobs in the VC (unapproved, queued, paused): keep them or kill them"})


class MemberGroupSchema(Schema):
    group = fields.String()
    role = fields.String()


class MemberSchema(Schema):
    user = fields.String()
    role = fields.String(metadata={"description": "member | admin: the effective role, direct or through a group"})
    direct_role = fields.String(allow_none=True, metadata={"description": "the user's own binding (null: only groups)"})
    groups = fields.List(fields.Nested(MemberGroupSchema))
    disabled = fields.Boolean()
    email = fields.String(allow_none=True, metadata={"description": "for VC admins"})


class MemberListSchema(Schema):
    items = fields.List(fields.Nested(MemberSchema))
    next_cursor = fields.String(allow_none=True, metadata={"description": "always null: one page"})


class MemberRemovalSchema(Schema):
    vc = fields.String()
    user = fields.String()
    removed = fields.Boolean(metadata={"description": "false: the user had no direct membership"})
    still_member_via = fields.List(fields.String(), metadata={"description": "groups that still make the user a member"})
    queued = fields.String(metadata={"description": "keep | kill, as asked"})
    queued_jobs = fields.List(fields.Integer(), metadata={"description": "the user's waiting jobs in the VC"})
    killed_jobs = fields.List(fields.Integer())
    running_jobs = fields.List(fields.Integer(), metadata={"description": "they run on to their end"})


class GroupCreateSchema(Schema):
    name = fields.String(required=True, validate=NAME)


class GroupVcSchema(Schema):
    vc = fields.String()
    role = fields.String()
    source = fields.String(allow_none=True)


class GroupSchema(Schema):
    name = fields.String()
    source = fields.String(allow_none=True)
    members = fields.List(fields.String())
    vcs = fields.List(fields.Nested(GroupVcSchema))
    cluster_admin = fields.Boolean()


class GroupPageSchema(Schema):
    items = fields.List(fields.Nested(GroupSchema))
    next_cursor = fields.String(allow_none=True)


class RegistryCredentialCreateSchema(Schema):
    server = fields.String(required=True, validate=validate.Length(1, 255), metadata={
        "pattern": REGISTRY_SERVER_PATTERN,
        "description": "a registry host, e.g. ghcr.io or registry.example.com:5000 (optionally https:// and a path "
                       "without '.' or '..' segments)"})
    username = fields.String(required=True, validate=printable(1, 255, also_not=":"))
    password = fields.String(required=True, load_only=True, validate=printable(1, REGISTRY_PASSWORD_CHARS),
                             metadata={"description": "stored encrypted; never returned"})


class RegistryCredentialSchema(Schema):
    id = fields.Integer()
    scope = fields.String(metadata={"description": "user or vc"})
    owner = fields.String(metadata={"description": "the user's or the VC's name"})
    server = fields.String()
    username = fields.String()
    created_by = fields.String()
    created_at = fields.String(allow_none=True)


class RegistryCredentialListSchema(Schema):
    items = fields.List(fields.Nested(RegistryCredentialSchema))
    next_cursor = fields.String(allow_none=True, metadata={"description": "always null: at most 20 per user or VC"})
