"""Every error leaves as ``{"error": {"code", "message", "details"}}``; no stack trace reaches a client."""

from __future__ import annotations

import logging
from typing import Any

import marshmallow as ma
from flask import Flask, jsonify, request
from sqlalchemy.exc import DBAPIError, OperationalError
from werkzeug.exceptions import HTTPException

from dlts.db_faults import WORDS, write_fault
from dlts.errors import ERROR_CODES, DltsError, RateLimited

log = logging.getLogger(__name__)

HTTP_CODES = {400: "invalid_input", 401: "unauthenticated", 403: "forbidden", 404: "not_found",
              405: "method_not_allowed", 409: "wrong_state", 413: "body_too_large", 415: "unsupported_media_type",
              422: "refused", 429: "too_many_requests"}
FIELD_CODES = {"cursor": "invalid_cursor"}
READS = ("GET", "HEAD", "OPTIONS")
RETRY_AFTER_S = 30  # a full disk or a read-only database is not over in a few seconds


class ErrorSchema(ma.Schema):
    class Meta:
        unknown = ma.RAISE

    code = ma.fields.String(required=True, validate=ma.validate.OneOf(ERROR_CODES),
                            metadata={"description": "What went wrong, for programs: one of a fixed set (docs/api.md)."})
    message = ma.fields.String(required=True, metadata={"description": "What went wrong and what to do, for people."})
    details = ma.fields.Dict(required=True, metadata={
        "description": "The facts behind it: `field` (the field at fault), `fields` ({field: [messages]}), "
                       "limits and sizes, `retry_after_s`."})


class ErrorEnvelopeSchema(ma.Schema):
    """Every error answer of the API: ``{"error": {"code", "message", "details"}}``."""

    class Meta:
        unknown = ma.RAISE

    error = ma.fields.Nested(ErrorSchema, required=True)


def envelope(status: int, code: str, message: str, details: dict | None = None):
    response = jsonify({"error": {"code": code, "message": message, "details": details or {}}})
    response.status_code = status
    return response


def register(app: Flask) -> None:
    @app.errorhandler(DltsError)
    def _dlts(exc: DltsError):
        # the service's transaction() has rolled its writes back already
        response = envelope(exc.http_status, exc.code, exc.message, exc.details)
        if isinstance(exc, RateLimited):
            response.headers["Retry-After"] = str(exc.retry_after_s)
        return response

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException):
        status = exc.code or 500
        data = getattr(exc, "data", None) or {}
        messages = data.get("messages")
        if status in (400, 422) and messages is not None:
            # schema validation (webargs): name every field at fault
            fields: dict[str, Any] = {}
            for location in messages.values():
                fields.update(location if isinstance(location, dict) else {"_": location})
            first = next(iter(fields.items()), ("body", ["is invalid"]))
            text = first[1][0] if isinstance(first[1], list) and first[1] and isinstance(first[1][0], str) else str(first[1])
            # a field with a code of its own keeps it when it is the only one at fault (a cursor the
            # schema's pattern refuses is the invalid_cursor docs/api.md promises, as one the list did not hand out)
            code = FIELD_CODES.get(first[0], "invalid_input") if len(fields) == 1 else "invalid_input"
            return envelope(400, code, f"{first[0]}: {text}", {"fields": fields})
        if status == 413:
            limit = app.config.get("MAX_CONTENT_LENGTH")
            return envelope(413, "body_too_large", f"The request body is larger than this server's limit of {limit} bytes.",
                            {"limit_bytes": limit})
        if status == 400:
            return envelope(400, "invalid_input",
                            "The request body is not valid JSON; send Content-Type: application/json with a JSON object.")
        response = envelope(status, HTTP_CODES.get(status, "error"), exc.description or exc.name)
        allowed = getattr(exc, "valid_methods", None)
        if status == 405 and allowed:  # RFC 9110: a 405 names the methods the resource takes
            response.headers["Allow"] = ", ".join(allowed)
        return response

    @app.errorhandler(OperationalError)
    @app.errorhandler(DBAPIError)
    def _database(exc: Exception):
        fault = write_fault(exc)
        if fault is not None and request.method not in READS:
            # reads still answer (nothing they need writes): only changes are refused, with the cause
            log.warning("database refuses writes: %s", fault.words)
            response = envelope(503, "database_read_only",
                                f"The database cannot store changes right now: {WORDS[fault.kind]}. Reading still works; "
                                "retry this change later. Operators: see docs/reliability.md, \"A full disk\".",
                                {"cause": fault.kind})
            response.headers["Retry-After"] = str(RETRY_AFTER_S)
            return response
        log.warning("database unavailable: %s", exc.__class__.__name__)
        return envelope(503, "database_unavailable", "The database is unreachable right now; retry in a few seconds.")

    @app.errorhandler(RecursionError)
    def _too_deep(exc: RecursionError):
        # json.loads recurses per nesting level: a body of 100k "[" ends here, not in a 500
        return envelope(400, "invalid_input", "The JSON body is nested too deeply; send a flat object as documented.")

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.error("unhandled error", exc_info=exc)
        return envelope(500, "internal_error", "Something went wrong on our side; it has been logged. Try again, and tell "
                                               "your operators if it persists.")
