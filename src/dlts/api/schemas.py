"""Request and response schemas (marshmallow). They validate input and generate the OpenAPI document.

Unknown fields are refused (marshmallow's RAISE), every string is bounded, every number ranged.
"""

from __future__ import annotations

import re

from marshmallow import Schema, ValidationError, fields, validate, validates

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
         "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
JOB_STATUSES = ("unapproved", "queued", "scheduling", "running", "pausing", "paused", "killing",
                "killed", "finished", "failed", "error")


class Memory(fields.Field):
    """Bytes as an integer, or a string with a unit: "16Gi", "512MB", "2G"."""

    def _deserialize(self, value, attr, data, **kwargs):
        if isinstance(value, bool):
            raise ValidationError("must be bytes (an integer) or a size like '16Gi'.")
        if isinstance(value, int):
            number = value
        elif isinstance(value, str) and len(value) <= 32 and (m := MEMORY.match(value)):
            unit = (m.group(2) or "").lower().rstrip("b")
            number = int(float(m.group(1)) * UNITS[unit])
        else:
            raise ValidationError("must be bytes (an integer) or a size like '16Gi'.")
        if not 1 <= number <= 64 * 2**40:
            raise ValidationError("must be between 1 byte and 64 TiB.")
        return number

    def _serialize(self, value, attr, obj, **kwargs):
        return value


class JobSubmitSchema(Schema):
    name = fields.String(validate=validate.Length(max=128), load_default="")
    vc = fields.String(required=True, validate=validate.Length(min=1, max=64))
    image = fields.String(required=True, validate=validate.Length(min=1, max=512))
    command = fields.String(required=True, validate=validate.Length(min=1, max=16384),
                            metadata={"description": "shell command line run by /bin/sh -c"})
    type = fields.String(load_default="batch", validate=validate.OneOf(["batch", "interactive", "distributed", "inference"]))
    gpus = fields.Integer(load_default=0, strict=True, validate=validate.Range(0, 1024))
    sku = fields.String(load_default=None, allow_none=True, validate=validate.Length(min=1, max=64))
    cpu = fields.Float(load_default=None, allow_none=True, validate=validate.Range(min=0.001, max=4096))
    memory = Memory(load_default=None, allow_none=True, metadata={"description": "bytes, or a size like '16Gi'"})
    nodes = fields.Integer(load_default=0, strict=True, validate=validate.Range(0, 1024))
    preemptible = fields.Boolean(load_default=False)
    max_retries = fields.Integer(load_default=None, allow_none=True, strict=True, validate=validate.Range(0, 100))
    max_time_s = fields.Integer(load_default=None, allow_none=True, strict=True, validate=validate.Range(1, 366 * 86400))
    priority = fields.Integer(load_default=100, strict=True, validate=validate.Range(1, 1000))
    env = fields.Dict(keys=fields.String(validate=validate.Length(max=128)), values=fields.String(validate=validate.Length(max=4096)),
                      load_default=dict, validate=validate.Length(max=100))
    ports = fields.List(fields.Integer(strict=True, validate=validate.Range(1, 65535)), load_default=list, validate=validate.Length(max=16))
    ssh = fields.Boolean(load_default=False)
    ib_domain = fields.String(load_default=None, allow_none=True, validate=validate.Length(min=1, max=64))
    min_replicas = fields.Integer(load_default=0, strict=True, validate=validate.Range(0, 256))
    max_replicas = fields.Integer(load_default=0, strict=True, validate=validate.Range(0, 256))

    @validates("env")
    def _env_names(self, value, **kwargs):
        for key in value:
            if not ENV_NAME.match(key):
                raise ValidationError(f"environment variable name {key[:40]!r} must match [A-Za-z_][A-Za-z0-9_]*.")
            if key.startswith("DLTS_"):
                raise ValidationError(f"{key}: names starting with DLTS_ are set by DLTS.")


class JobListArgs(Schema):
    vc = fields.String(validate=validate.Length(max=64))
    user = fields.String(validate=validate.Length(max=64))
    status = fields.String(validate=validate.Length(max=200), metadata={"description": "one status or a comma-separated list"})
    type = fields.String(validate=validate.OneOf(["batch", "interactive", "distributed", "inference"]))
    limit = fields.Integer(load_default=50, validate=validate.Range(1, 500))
    cursor = fields.String(validate=validate.Length(max=64))

    @validates("status")
    def _statuses(self, value, **kwargs):
        bad = [s for s in value.split(",") if s.strip() not in JOB_STATUSES]
        if bad:
            raise ValidationError(f"unknown status {bad[0][:20]!r}; use {', '.join(JOB_STATUSES)}.")


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


class AttemptSchema(Schema):
    number = fields.Integer()
    placements = fields.List(fields.Nested(PlacementSchema))
    started_at = fields.String(allow_none=True)
    ended_at = fields.String(allow_none=True)
    exit_code = fields.Integer(allow_none=True)
    end_reason = fields.String(allow_none=True)
    spends_retry = fields.Boolean(allow_none=True)


class JobSchema(Schema):
    id = fields.Integer()
    name = fields.String()
    user = fields.String()
    vc = fields.String()
    type = fields.String()
    status = fields.String()
    reason = fields.String(allow_none=True)
    reason_detail = fields.String(allow_none=True)
    queue_position = fields.Integer(allow_none=True)
    image = fields.String()
    command = fields.String()
    sku = fields.String(allow_none=True)
    gpus = fields.Integer()
    nodes = fields.Integer()
    cpu = fields.Float()
    memory_bytes = fields.Integer()
    priority = fields.Integer()
    preemptible = fields.Boolean()
    max_retries = fields.Integer()
    retries_used = fields.Integer()
    max_time_s = fields.Integer(allow_none=True)
    time_left_s = fields.Float(allow_none=True)
    submitted_at = fields.String()
    queue_time = fields.String()
    started_at = fields.String(allow_none=True)
    finished_at = fields.String(allow_none=True)
    exit_code = fields.Integer(allow_none=True)
    attempt = fields.Integer()
    env = fields.Dict(keys=fields.String(), values=fields.String())
    ports = fields.List(fields.Integer())
    ssh = fields.Boolean()
    placements = fields.List(fields.Nested(PlacementSchema))
    attempts = fields.List(fields.Nested(AttemptSchema))
    visibility = fields.String(metadata={"description": "full, or public for other members of the VC"})


class JobPageSchema(Schema):
    items = fields.List(fields.Nested(JobSchema))
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
    cluster_admin = fields.Boolean()
    vcs = fields.List(fields.Dict())
