"""Request schemas that the API and the portal share: the job submission and the endpoint request.

The API declares them in its OpenAPI document (``dlts.api.schemas`` builds on them); the portal's forms
load the same schemas, so a form and a POST body are held to one set of rules. ``JobSubmitSchema``
loads into the ``JobRequest`` the submit use-case takes.
"""

from __future__ import annotations

import re

from marshmallow import Schema, ValidationError, fields, post_load, validate, validates

from dlts import image_ref
from dlts.errors import InvalidInput
from dlts.models import EndpointKind, JobType
from dlts.services.endpoints import NAME_PATTERN as ENDPOINT_NAME_PATTERN
from dlts.services.jobs import MAX_TAG_CHARS, MAX_TAGS, TAG_RULE, JobRequest, clean_tags

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# bytes and a unit, ASCII only ("١Gi" is no size); the OpenAPI document carries the same pattern
MEMORY_PATTERN = r"^[ \t\n\r\f\v]*([0-9]+(?:\.[0-9]+)?)[ \t\n\r\f\v]*([KMGTkmgt][Ii]?[Bb]?|[Bb])?[ \t\n\r\f\v]*$"
MEMORY = re.compile(MEMORY_PATTERN)
UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
         "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}

class Pattern(validate.Regexp):
    """A regular expression the whole value matches, as the OpenAPI document's ``pattern`` (ECMA 262)
    means it: ``re.fullmatch``, since Python's ``$`` would also take a trailing newline."""

    def __call__(self, value):  # str in, str out (Regexp's overloads take bytes too)
        if self.regex.fullmatch(value) is None:
            raise ValidationError(self._format_error(value))
        return value


class Memory(fields.Field):
    """Bytes as an integer, or a string with a unit: "16Gi", "512MB", "2G"."""

    def __init__(self, *args, min_bytes: int = 1, max_bytes: int = 64 * 2**40, **kwargs):
        super().__init__(*args, **kwargs)
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes

    def _deserialize(self, value, attr, data, **kwargs):
        if isinstance(value, bool):
            raise ValidationError("must be bytes (an integer) or a size like '16Gi'.")
        if isinstance(value, int):
            number = value
        elif isinstance(value, str) and len(value) <= 32 and (m := MEMORY.fullmatch(value)):
            unit = (m.group(2) or "").lower().rstrip("b")
            number = int(float(m.group(1)) * UNITS[unit])
        else:
            raise ValidationError("must be bytes (an integer) or a size like '16Gi'.")
        if not self.min_bytes <= number <= self.max_bytes:
            low = "1 byte" if self.min_bytes == 1 else f"{self.min_bytes} bytes"
            raise ValidationError(f"must be between {low} and {self.max_bytes} bytes ({self.max_bytes / 2**40:g} TiB).")
        return number

    def _serialize(self, value, attr, obj, **kwargs):
        return value


# a tag as sent: TAG_PATTERN's tag in any case, spaces around it allowed (stored stripped and lowercased)
TAG_INPUT_PATTERN = rf"^ *[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_TAG_CHARS - 1}}} *$"


class TagList(fields.List):
    """Job tags: lowercased, each once (``services.jobs.clean_tags``)."""

    def __init__(self, **kwargs):
        super().__init__(fields.String(validate=Pattern(TAG_INPUT_PATTERN, error=f"tag {{input!r}} is not allowed: {TAG_RULE}.")),
                         validate=validate.Length(max=MAX_TAGS, error=f"at most {MAX_TAGS} tags."),
                         metadata={"description": TAG_RULE + "; stored lowercased, each once"}, **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        if isinstance(value, (list, tuple)) and len(value) > MAX_TAGS:  # before thousands of items are read
            raise ValidationError(f"at most {MAX_TAGS} tags.")
        items = super()._deserialize(value, attr, data, **kwargs)
        try:
            return list(clean_tags(items))
        except InvalidInput as exc:
            raise ValidationError(exc.message) from None


class JobSubmitSchema(Schema):
    name = fields.String(validate=validate.Length(max=128), load_default="")
    vc = fields.String(required=True, validate=validate.Length(min=1, max=64))
    # no Length validator: the pattern bounds it (at most MAX_REFERENCE_CHARS), and schemathesis cannot
    # generate from this pattern combined with minLength/maxLength
    image = fields.String(required=True, metadata={
        "pattern": image_ref.PATTERN,
        "description": "image reference: [registry/]name[:tag][@sha256:<64 hex digits>]; a digest pins the exact "
                       "image and is passed to the cluster unchanged; the name before the tag is at most "
                       f"{image_ref.MAX_NAME_CHARS} characters (else 400 naming image)"})
    command = fields.String(required=True, validate=validate.Length(min=1), metadata={
        "description": "shell command line run by /bin/sh -c; at most 16384 bytes (422 field_too_large)"})
    type = fields.String(load_default="batch", validate=validate.OneOf([t.value for t in JobType]))
    gpus = fields.Integer(load_default=0, strict=True, validate=validate.Range(0, 1024))
    sku = fields.String(load_default=None, allow_none=True, validate=validate.Length(min=1, max=64))
    cpu = fields.Float(load_default=None, allow_none=True, validate=validate.Range(min=0.001, max=4096))
    memory = Memory(load_default=None, allow_none=True, metadata={"description": "bytes, or a size like '16Gi'"})
    nodes = fields.Integer(load_default=0, strict=True, validate=validate.Range(0, 1024))
    preemptible = fields.Boolean(load_default=False)
    max_retries = fields.Integer(load_default=None, allow_none=True, strict=True, validate=validate.Range(0, 100))
    max_time_s = fields.Integer(load_default=None, allow_none=True, strict=True, validate=validate.Range(1, 366 * 86400))
    priority = fields.Integer(load_default=100, strict=True, validate=validate.Range(1, 1000))
    env = fields.Dict(keys=fields.String(validate=validate.Length(max=128)), values=fields.String(), load_default=dict,
                      metadata={"description": "at most 100 variables, each value at most 4096 bytes, 32768 bytes "
                                               "together (422 field_too_large naming the field and the limit)"})
    ports = fields.List(fields.Integer(strict=True, validate=validate.Range(
        1024, 65535, error="must be a port between {min} and {max}: ports below 1024 belong to the system (ssh: set ssh: true).")),
        load_default=list, validate=validate.Length(max=8, error="at most {max} ports per job (each is an endpoint)."),
        metadata={"description": "ports the job listens on; each becomes a port endpoint named port-N"})
    ssh = fields.Boolean(load_default=False, metadata={"description": "open an ssh endpoint (the owner's SSH keys)"})
    ib_domain = fields.String(load_default=None, allow_none=True, validate=validate.Length(min=1, max=64))
    min_replicas = fields.Integer(load_default=0, strict=True, validate=validate.Range(0, 256))
    max_replicas = fields.Integer(load_default=0, strict=True, validate=validate.Range(0, 256))
    ephemeral_storage_bytes = Memory(load_default=None, allow_none=True, max_bytes=2**50, metadata={
        "description": "scratch space on the node (bytes or '20Gi'); at most the VC's ephemeral_storage_bytes "
                       "(null: the VC's or the cluster's default)"})
    run_as_root = fields.Boolean(load_default=False, metadata={
        "description": "run as uid 0 instead of your uid; only in VCs whose pod_policy allows run_as_root"})
    tags = TagList(load_default=list)

    @validates("image")
    def _image_reference(self, value, **kwargs):
        why = image_ref.problem(value)
        if why is not None:
            raise ValidationError(why)

    @validates("env")
    def _env_names(self, value, **kwargs):
        for key in value:
            if not ENV_NAME.match(key):
                raise ValidationError(f"environment variable name {key[:40]!r} must match [A-Za-z_][A-Za-z0-9_]*.")
            if key.startswith("DLTS_"):
                raise ValidationError(f"{key}: names starting with DLTS_ are set by DLTS.")

    @post_load
    def _request(self, data, **kwargs) -> JobRequest:
        """The body as the submit use-case takes it; every field of this schema is one of JobRequest's."""
        data = dict(data)
        data["memory_bytes"] = data.pop("memory", None)
        data["ports"] = tuple(data.get("ports", ()))
        data["tags"] = tuple(data.get("tags", ()))
        if "type" in data:
            data["type"] = JobType(data["type"])  # validated against JobType's values above
        return JobRequest(**data)


class EndpointCreateSchema(Schema):
    kind = fields.String(required=True, validate=validate.OneOf([k.value for k in EndpointKind]),
                         metadata={"description": "ssh (port 22), jupyter (8888), vscode (8080), or port: one the job listens on"})
    port = fields.Integer(strict=True, validate=validate.Range(1024, 65535, error="must be a port between {min} and {max}."),
                          metadata={"description": "kind port only: the port the job listens on"})
    name = fields.String(validate=[validate.Length(1, 32), Pattern(
        ENDPOINT_NAME_PATTERN, error="must be a lowercase letter, then lowercase letters, digits or '-' (at most 32).")],
        metadata={"description": "default: the kind, or port-N"})
