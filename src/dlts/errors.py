"""Typed errors. Services raise them; the API and CLI render them in one place each.

A ``DltsError`` carries a snake_case ``code``, the HTTP status it maps to, an actionable message and
``details`` (the field at fault, the numbers behind a refusal).
"""

from __future__ import annotations

from typing import Any


class DltsError(Exception):
    code = "error"
    http_status = 400

    def __init__(self, message: str, *, code: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        self.details = details or {}

    def envelope(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


class InvalidInput(DltsError):
    code = "invalid_input"
    http_status = 400


class Unauthenticated(DltsError):
    code = "unauthenticated"
    http_status = 401


class Forbidden(DltsError):
    code = "forbidden"
    http_status = 403


class NotFound(DltsError):
    code = "not_found"
    http_status = 404


class WrongState(DltsError):
    code = "wrong_state"
    http_status = 409


class Refused(DltsError):
    """Valid input, refused by policy (quota, limits)."""

    code = "refused"
    http_status = 422


class RateLimited(DltsError):
    """Too many requests of a kind in a window; ``details["retry_after_s"]`` says when to come back
    (the API sends it as ``Retry-After`` too)."""

    code = "too_many_requests"
    http_status = 429

    def __init__(self, message: str, *, retry_after_s: int, code: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message, code=code, details={**(details or {}), "retry_after_s": retry_after_s})
        self.retry_after_s = retry_after_s
