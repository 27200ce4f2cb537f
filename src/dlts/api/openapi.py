"""What the OpenAPI document says beyond apispec's defaults, so that it states the server's rules exactly.

- A schema's ``class Meta: openapi = {...}`` is merged into its component (``minProperties: 1`` on
  the PATCH bodies, which change nothing when empty): ``SchemaExtras``, the one way to put a
  schema-level keyword into the document.
- ``validate.Range(..., min_inclusive=False)`` is ``exclusiveMinimum: true`` (apispec writes only
  ``minimum``, which would let 0 through where the server wants more than 0).
- A nullable nested object is ``anyOf: [$ref, null]``; apispec's own null branch is ``{type:
  object, nullable: true}``, which is any object at all, unknown keys included.
- ``Memory`` (bytes or a size like ``"16Gi"``) is ``oneOf`` an integer in its range or a string of
  the size syntax ``dlts.schemas.MEMORY`` parses.
"""

from __future__ import annotations

import typing

from apispec import BasePlugin
from marshmallow import fields, validate

from dlts.schemas import MEMORY_PATTERN, Memory

NULL_ONLY = {"type": "object", "nullable": True, "enum": [None]}


class SchemaExtras(BasePlugin):
    """Merges a schema's ``Meta.openapi`` into its component."""

    def schema_helper(self, name: str, definition: dict, **kwargs: typing.Any) -> dict | None:
        schema = kwargs.get("schema")
        meta = getattr(schema, "Meta", None)
        extras = getattr(meta, "openapi", None)
        return dict(extras) if extras else None


def exclusive_bounds(self: typing.Any, field: fields.Field, ret: dict, **kwargs: typing.Any) -> dict:
    out: dict = {}
    for v in field.validators:
        if isinstance(v, validate.Range):
            if v.min is not None and not v.min_inclusive:
                out["exclusiveMinimum"] = True
            if v.max is not None and not v.max_inclusive:
                out["exclusiveMaximum"] = True
    return out


def nullable_nested(self: typing.Any, field: fields.Field, ret: dict, **kwargs: typing.Any) -> dict:
    if isinstance(field, fields.Nested) and field.allow_none and "anyOf" in ret:
        refs = [branch for branch in ret["anyOf"] if "$ref" in branch]
        return {"anyOf": [*refs, NULL_ONLY]}
    return {}


def memory_size(self: typing.Any, field: fields.Field, ret: dict, **kwargs: typing.Any) -> dict:
    if not isinstance(field, Memory):
        return {}
    return {"oneOf": [
        {"type": "integer", "minimum": field.min_bytes, "maximum": field.max_bytes},
        {"type": "string", "maxLength": 32, "pattern": MEMORY_PATTERN,
         "description": "a number and a unit: B, K, M, G, T (powers of 1000) or Ki, Mi, Gi, Ti (powers of 1024), "
                        f"an optional B after it; it must come to {field.min_bytes} .. {field.max_bytes} bytes"},
    ]}


def install(ma_plugin: typing.Any) -> None:
    """Adds the attribute functions above to flask-smorest's marshmallow plugin (before any schema is read)."""
    for func in (exclusive_bounds, nullable_nested, memory_size):
        ma_plugin.converter.add_attribute_function(func)
