"""Typed errors. Services raise them; the API and CLI render them in one place each.

A ``DltsError`` carries a snake_case ``code``, the HTTP status it maps to, an actionable message and
``details`` (the field at fault, the numbers behind a refusal).
"""

from __future__ import annotations

from typing import Any

# Every ``code`` an error answer of the API or the portal can carry: the OpenAPI document lists them
# as the error envelope's enum (``dlts.api.errors.ErrorEnvelopeSchema``), and
# tests/api/test_error_codes.py keeps this list exact both ways (a code raised anywhere in
# src/dlts is here; every code here is raised somewhere).
ERROR_CODES: tuple[str, ...] = (
    # by status, when no more precise code applies
    "invalid_input", "unauthenticated", "forbidden", "not_found", "method_not_allowed", "wrong_state",
    "body_too_large", "unsupported_media_type", "refused", "too_many_requests", "internal_error",
    "database_read_only", "database_unavailable", "directory_unavailable", "error",
    # request bodies and parameters
    "body_required", "invalid_json", "invalid_cursor", "invalid_idempotency_key", "idempotency_key_reused",
    "invalid_tags", "invalid_storage", "invalid_lustre_settings", "invalid_ssh_key", "weak_ssh_key", "private_key",
    "invalid_template_name", "field_too_large", "priority_out_of_range", "password_too_short", "password_too_long",
    "root_id_refused", "network_too_wide", "address_not_allowed", "sku_required", "unknown_sku", "nodes_required",
    # identity and rights
    "login_failed", "too_many_login_attempts", "wrong_node_token", "requires_owner", "requires_vc_admin",
    "approval_requires_vc_admin", "quota_requires_cluster_admin", "cannot_disable_self", "last_cluster_admin",
    "not_in_group", "group_from_directory",
    # things that do not exist
    "job_not_found", "vc_not_found", "user_not_found", "group_not_found", "node_not_found", "repair_not_found",
    "endpoint_not_found", "ssh_key_not_found", "token_not_found", "allowed_ip_not_found", "binding_not_found",
    "registry_credential_not_found", "template_not_found", "no_log", "no_ssh_key", "secret_key_missing",
    # conflicts with what exists
    "user_exists", "group_exists", "vc_exists", "endpoint_exists", "uid_taken", "duplicate_ssh_key",
    "duplicate_registry_credential", "vc_has_jobs", "concurrent_change", "node_state_changed",
    # the state of a job, a node, a repair
    "job_already_ended", "job_ended", "job_not_ended", "node_not_held", "node_not_in_service",
    "repair_in_progress", "repair_ended", "repair_not_cancellable",
    # refused by policy: quotas, caps, limits
    "quota_exceeds_cluster", "quota_exceeds_vc", "interactive_cap_exceeded", "queued_jobs_cap_exceeded",
    "submission_rate_exceeded", "max_time_exceeds_vc", "ephemeral_storage_exceeds_vc", "run_as_root_not_allowed",
    "gpus_exceed_node", "gpus_not_whole_node", "resources_exceed_node", "no_gpu_nodes", "too_many_allowed_ips",
    "too_many_endpoints", "too_many_registry_credentials", "too_many_ssh_keys", "too_many_tokens",
)


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
