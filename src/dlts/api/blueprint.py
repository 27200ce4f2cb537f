"""The API's Blueprint: flask-smorest's, with request bodies parsed by ``dlts.strict.loads_json``
and a required body required.

webargs reads JSON with plain ``json.loads``, which takes ``NaN``, ``Infinity``, ``1e400`` (as
infinity), lone surrogates and any depth; MariaDB's ``json_valid`` CHECK refuses those later (a
503), SQLite stores them. Here they are a 400 ``invalid_json`` naming the field, before any schema
or service sees the body.

webargs also reads a missing body as ``{}``: on an operation whose schema has no required field
(``PUT /vcs/{name}/storage``) a request without a body would have replaced the VC's storage with
nothing. A JSON body is required unless the operation says ``required=False`` (every field has a
default: an empty body means "the defaults"); without one the answer is a 400 ``body_required``
and nothing changes. The OpenAPI document says the same (``requestBody.required``).

And JSON types are what the document says: marshmallow turns ``"true"``, ``"yes"`` and ``1`` into a
boolean and ``"5"`` or ``5.0`` into an integer. In a JSON body a boolean field takes ``true`` or
``false``, an integer field an integer, a number field a number (never a string, never a
boolean), in nested objects and lists too; anything else is a 400 naming the field. Query
strings, which are all text, are converted as before; a query parameter the operation does not
declare is a 400 naming it.
"""

from __future__ import annotations

import functools
import typing

import flask
import flask_smorest
import marshmallow as ma
from webargs import core
from webargs.flaskparser import FlaskParser, is_json_request

from dlts.errors import InvalidInput
from dlts.strict import loads_json

# the schemas of answers that are not JSON, for alt_response(..., content_type=...)
CSV = {"type": "string", "description": "comma-separated values with a header row"}
TEXT = {"type": "string"}


class StrictJsonParser(FlaskParser):
    # a query parameter the operation does not declare is a 400 naming it, as an unknown body field is
    DEFAULT_UNKNOWN_BY_LOCATION: dict[str, str | None] = {  # noqa: RUF012 - webargs' own attribute
        **FlaskParser.DEFAULT_UNKNOWN_BY_LOCATION, "query": ma.RAISE, "querystring": ma.RAISE}

    def _raw_load_json(self, req: flask.Request) -> typing.Any:
        if not is_json_request(req):
            return core.missing
        return loads_json(req.get_data(cache=True))

    def _load_location_data(self, *, schema: ma.Schema, req: flask.Request, location: str) -> typing.Any:
        data = super()._load_location_data(schema=schema, req=req, location=location)
        if location == "json" and isinstance(data, dict):
            errors = json_type_errors(schema, data)
            if errors:
                raise ma.ValidationError(errors)
        return data


def json_type_errors(schema: ma.Schema, data: dict[str, typing.Any]) -> dict[str, typing.Any]:
    """{field: [message] or nested errors} for the values of ``data`` whose JSON type is not the
    one ``schema``'s field takes (marshmallow would coerce them)."""
    errors: dict[str, typing.Any] = {}
    for name, field in schema.fields.items():
        if field.dump_only:
            continue
        key = field.data_key or name
        if key in data:
            error = _type_error(field, data[key])
            if error:
                errors[key] = error
    return errors


def _type_error(field: ma.fields.Field, value: typing.Any) -> typing.Any:
    if value is None:
        return None  # allow_none is marshmallow's to check
    if isinstance(field, ma.fields.Boolean):
        return None if isinstance(value, bool) else ["Not a valid boolean: send true or false."]
    if isinstance(field, ma.fields.Integer):
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else ["Not a valid integer: send a JSON integer, not a string, a fraction or a boolean."]
    if isinstance(field, ma.fields.Number):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return None if ok else ["Not a valid number: send a JSON number, not a string or a boolean."]
    if isinstance(field, ma.fields.Nested):
        nested = field.schema
        if field.many:
            if not isinstance(value, list):
                return None
            found = {i: e for i, item in enumerate(value) if isinstance(item, dict) and (e := json_type_errors(nested, item))}
            return found or None
        return (json_type_errors(nested, value) or None) if isinstance(value, dict) else None
    if isinstance(field, ma.fields.List) and isinstance(value, list):
        found = {i: e for i, item in enumerate(value) if (e := _type_error(field.inner, item))}
        return found or None
    if isinstance(field, ma.fields.Dict) and isinstance(value, dict) and field.value_field is not None:
        found = {k: e for k, item in value.items() if (e := _type_error(field.value_field, item))}
        return found or None
    return None


class Blueprint(flask_smorest.Blueprint):
    ARGUMENTS_PARSER = StrictJsonParser()

    def arguments(self, schema: typing.Any, *, location: str = "json", required: bool = True,
                  **kwargs: typing.Any) -> typing.Callable[[typing.Callable[..., typing.Any]], typing.Callable[..., typing.Any]]:
        # a body or query the schema refuses is a 400 (dlts.api.errors), and documented as one
        kwargs.setdefault("error_status_code", 400)
        parse = super().arguments(schema, location=location, required=required, **kwargs)
        if location != "json" or not required:
            return parse

        def decorator(func: typing.Callable[..., typing.Any]) -> typing.Callable[..., typing.Any]:
            parsed = parse(func)

            @functools.wraps(parsed)
            def with_body(*args: typing.Any, **kw: typing.Any) -> typing.Any:
                if not flask.request.get_data(cache=True).strip():
                    raise InvalidInput(
                        f"{flask.request.method} {flask.request.path} needs a JSON body "
                        "(Content-Type: application/json); nothing was changed.",
                        code="body_required", details={"fields": {"body": ["Missing data for required body."]}})
                return parsed(*args, **kw)

            return with_body

        return decorator
