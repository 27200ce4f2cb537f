"""The OpenAPI document is the contract: schemathesis sends generated requests to every operation and
runs every one of its checks on every answer.

Every check in schemathesis' registry runs (``CHECKS``: not_a_server_error, status_code_conformance,
content_type_conformance, response_headers_conformance, response_schema_conformance,
negative_data_rejection, positive_data_acceptance, missing_required_header, unsupported_method,
allow_header_conformance, use_after_free, ensure_resource_availability, ignored_auth,
object_level_authorization), on requests valid by the document (positive) and invalid by it
(negative), as a cluster admin and as a plain member (bob): hypothesis' examples (derandomised,
MAX_EXAMPLES per operation and mode) and schemathesis' coverage phase (each operation's boundaries
and the methods its path does not declare). Both pass with 0 failures.

The checks that follow a resource across requests (use_after_free, ensure_resource_availability,
object_level_authorization) need schemathesis' stateful runner, which records what one request
created for the next; driven one case at a time, as here, they run and find nothing to compare.
tests/api/test_authz_matrix.py holds object-level authorisation for every route.

Two things are set on positive_data_acceptance, each written down in docs/api.md ("Errors": the
table of documented refusals; "Tests"):

- A 422 is accepted: in this API a 422 is a valid request refused by policy or state (quota, caps,
  a weak SSH key, a network too wide), a documented answer of every operation. So is a 413, here
  and on negative_data_rejection: a body above ``max_body_bytes`` (64 KiB in the tests), which
  long strings of escaped characters reach well inside the documented maxLength.
- ``DOCUMENTED_REFUSALS``: per operation, the 400s the document announces for what no OpenAPI 3.0
  schema can say (a key blob that must decode to a real key, an address that must parse, a cursor
  that must be one the server issued, fields that depend on each other, map keys, characters
  ``str.isprintable`` refuses beyond the control characters the patterns exclude). Only that code
  naming that field is accepted, on that operation.

Left out, and only these: the requests that would take the run's own identity away (they would
turn every later request into a 401 or 403): ``PATCH /users/{name}`` with ``cluster_admin: false``
for the run's admin, ``POST /users/{name}/disable`` of a run's user (revokes its tokens), and
``DELETE /me/tokens/{id}`` of a token the run uses. Not sent either: a negative case with a query
parameter whose value is an empty array or object, which serialises to no parameter at all (the
request would not be the one generated).

(schemathesis' pytest plugin does not run under pytest 9 yet, so the operations are driven through
its Python API: one hypothesis run per operation and mode, then the coverage cases of each operation.)
"""

from __future__ import annotations

import itertools
import os
import typing
from dataclasses import dataclass, field

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.config import PositiveDataAcceptanceConfig
from schemathesis.config._checks import NegativeDataRejectionConfig
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import positive_data_acceptance

# per operation and mode; DLTS_SCHEMATHESIS_EXAMPLES=50 explores further (still derandomised)
MAX_EXAMPLES = int(os.environ.get("DLTS_SCHEMATHESIS_EXAMPLES", "8"))
RUN_USERS = ("admin", "bob")


@dataclass(frozen=True)
class Refusal:
    """A 400 with ``code`` naming ``field`` (or a field under it), documented for a request that is
    valid by the schema; ``why`` is what the document says about it."""

    code: str
    field: str
    why: str


PRINTABLE = ("beyond the control characters the pattern excludes, str.isprintable refuses format characters, separators "
             "and unassigned code points")
CURSOR = Refusal("invalid_cursor", "cursor", "a cursor must be one this list handed out")
SIZE = "a size string (\"16Gi\") that comes to less or more than the integer range the document gives"
UNTYPED_NUMBER = Refusal("invalid_json", "", "an untyped value (an object the service reads) holding an integer beyond 64 bits")

# a user's and a VC's registry credentials take the same fields, checked alike
REGISTRY_CREDENTIAL = (
    Refusal("invalid_input", "server", "a path with '.' or '..' segments"),
    Refusal("invalid_input", "username", PRINTABLE),
    Refusal("invalid_input", "password", PRINTABLE),
)

DOCUMENTED_REFUSALS: dict[str, tuple[Refusal, ...]] = {
    "GET /api/v1/jobs": (CURSOR,),
    "GET /api/v1/users": (CURSOR,),
    "GET /api/v1/groups": (CURSOR,),
    "GET /api/v1/nodes": (CURSOR,),
    "GET /api/v1/vcs": (CURSOR,),
    "GET /api/v1/vcs/{name}/events": (CURSOR,),
    "GET /api/v1/jobs/{job_id}/events": (CURSOR,),
    "GET /api/v1/jobs/{job_id}/attempts": (CURSOR,),
    "GET /api/v1/usage": (
        Refusal("invalid_input", "from", "a day that does not exist (2026-02-30)"),
        Refusal("invalid_input", "to", "a day that does not exist, a range that ends before it starts or spans more than ten years"),
    ),
    "POST /api/v1/jobs": (
        Refusal("invalid_input", "env",
                "environment variable names: [A-Za-z_][A-Za-z0-9_]*, not DLTS_* (map keys have no schema in OpenAPI 3.0)"),
        Refusal("invalid_input", "image", "an image name longer than 255 characters"),
        Refusal("invalid_input", "memory", SIZE),
        Refusal("invalid_input", "ephemeral_storage_bytes", SIZE),
    ),
    "POST /api/v1/jobs/{job_id}/endpoints": (
        Refusal("invalid_input", "port", "port only with kind port, and required there"),
    ),
    "POST /api/v1/me/ssh-keys": (
        Refusal("invalid_ssh_key", "public_key", "the base64 part must decode to a key of the named type"),
        Refusal("invalid_input", "name", PRINTABLE),
    ),
    "POST /api/v1/me/allowed-ips": (
        Refusal("invalid_input", "ip", "the text must parse as an IPv4/IPv6 address or network, host bits clear"),
    ),
    "POST /api/v1/me/tokens": (Refusal("invalid_input", "name", PRINTABLE),),
    "POST /api/v1/me/registry-credentials": REGISTRY_CREDENTIAL,
    "POST /api/v1/vcs/{name}/registry-credentials": REGISTRY_CREDENTIAL,
    "POST /api/v1/nodes/{name}/repair": (
        Refusal("invalid_input", "target", "the actions that act on a GPU or a service need target"),
    ),
    "POST /api/v1/users": (
        Refusal("invalid_input", "password", "password or generate_password, not both"),
        Refusal("invalid_input", "uid", "uid and gid together, or neither"),
        Refusal("invalid_input", "gid", "uid and gid together, or neither"),
        Refusal("invalid_input", "email", PRINTABLE),
    ),
    "POST /api/v1/users/{user_name}/disable": (Refusal("invalid_input", "reason", PRINTABLE),),
    "PATCH /api/v1/users/{user_name}": (
        Refusal("invalid_input", "uid", "uid and gid together, or neither"),
        Refusal("invalid_input", "gid", "uid and gid together, or neither"),
        Refusal("invalid_input", "email", PRINTABLE),
    ),
    "POST /api/v1/vcs": (
        Refusal("invalid_input", "quota", "SKU names (map keys) are 1-64 characters"),
        Refusal("invalid_input", "memory_quota_bytes", SIZE),
        Refusal("invalid_input", "ephemeral_storage_bytes", SIZE),
        Refusal("unknown_sku", "quota", "a SKU the cluster has"),
    ),
    "PATCH /api/v1/vcs/{name}": (
        Refusal("invalid_input", "quota", "SKU names (map keys) are 1-64 characters"),
        Refusal("invalid_input", "memory_quota_bytes", SIZE),
        Refusal("invalid_input", "ephemeral_storage_bytes", SIZE),
        Refusal("unknown_sku", "quota", "a SKU the cluster has"),
    ),
    "POST /api/v1/nodes/{name}/report": (UNTYPED_NUMBER,),
    "PUT /api/v1/vcs/{name}/storage": (
        Refusal("invalid_storage", "", "each entry of the storage document is checked by the service (docs/api.md, VC storage)"),
        UNTYPED_NUMBER,
    ),
}


def _named_fields(details: dict) -> list[str]:
    named = [str(details["field"])] if "field" in details else []
    return named + [str(k) for k in (details.get("fields") or {})]


def is_documented_refusal(response, case) -> bool:
    if response.status_code != 400:
        return False
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    named = _named_fields(error.get("details") or {})
    return any(error["code"] == r.code and (not r.field or any(f == r.field or f.startswith(r.field + ".") for f in named))
               for r in DOCUMENTED_REFUSALS.get(case.operation.label, ()))


def positive_data_acceptance_with_documented_refusals(ctx, response, case):
    """positive_data_acceptance, except for the operation's documented refusals."""
    if is_documented_refusal(response, case):
        return None
    return positive_data_acceptance(ctx, response, case)


def takes_away_the_runs_identity(case, run_token_ids: set[int]) -> bool:
    path, params, body = case.operation.path, case.path_parameters or {}, case.body
    if case.method == "PATCH" and path == "/api/v1/users/{user_name}":
        return params.get("user_name") == "admin" and isinstance(body, dict) and body.get("cluster_admin") is False
    if case.method == "POST" and path == "/api/v1/users/{user_name}/disable":
        return params.get("user_name") in RUN_USERS
    if case.method == "DELETE" and path == "/api/v1/me/tokens/{token_id}":
        return params.get("token_id") in run_token_ids
    return False


@dataclass
class Contract:
    """The served document, every check (positive_data_acceptance with the documented refusals), the
    run's tokens, and the failures found so far."""

    schema: typing.Any
    checks: list
    tokens: dict[str, str]
    node_token: str
    run_token_ids: set[int]
    failures: list[str] = field(default_factory=list)

    def operations(self) -> list:
        return [result.ok() for result in self.schema.get_all_operations()]

    def send(self, case) -> None:
        """``case`` as each run user (the node report as its agent), every check on every answer."""
        if takes_away_the_runs_identity(case, self.run_token_ids):
            return
        mode = case.meta.generation.mode
        if mode is GenerationMode.NEGATIVE and any(value in ([], {}) for value in (case.query or {}).values()):
            return  # an empty array or object in a query string is no parameter at all: not sent as generated
        if case.operation.path.endswith("/report"):  # the agent's endpoint: its node token, its node
            case.path_parameters = {"name": "testnode"}
            if mode is GenerationMode.POSITIVE and isinstance(case.body, dict):  # it reports for its own node
                case.body["node"] = "testnode"
            tokens = {"agent": self.node_token}
        else:
            tokens = {user: self.tokens[user] for user in RUN_USERS}
        for user, token in tokens.items():
            headers = {"Authorization": f"Bearer {token}"}
            response = case.call(headers=headers)
            try:
                case.validate_response(response, checks=self.checks, headers=headers)
            except FailureGroup as group:
                self.failures.extend(
                    f"{case.operation.label} [{mode.value}, as {user}] {failure.title}: {case.method} {case.formatted_path} "
                    f"query={case.query} body={str(case.body)[:200]} -> {response.status_code} {response.text[:300]}"
                    for failure in group.exceptions)


@pytest.fixture
def contract(app, world, sessions) -> Contract:
    import sqlalchemy as sa

    from dlts.models import ApiToken, User
    from dlts.services.nodes import issue_node_token

    with sessions() as s:
        node_token = issue_node_token(s, "testnode")
        run_token_ids = set(s.scalars(sa.select(ApiToken.id).join(User).where(User.name.in_(RUN_USERS))))
    schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", app)
    config = schema.config.checks
    config.positive_data_acceptance = PositiveDataAcceptanceConfig(
        expected_statuses=[*config.positive_data_acceptance.expected_statuses, "413", "422"])
    config.negative_data_rejection = NegativeDataRejectionConfig(
        expected_statuses=[*config.negative_data_rejection.expected_statuses, "413"])
    load_all_checks()
    checks = [positive_data_acceptance_with_documented_refusals if check is positive_data_acceptance else check
              for check in CHECKS.get_all()]
    assert len(checks) >= 14, checks
    contract = Contract(schema, checks, world.tokens, node_token, run_token_ids)
    assert len(contract.operations()) >= 30, [op.label for op in contract.operations()]
    return contract


def test_generated_requests_pass_every_check(contract):
    """Hypothesis' examples, positive and negative, MAX_EXAMPLES of each per operation."""
    def fuzz(operation, mode: GenerationMode) -> None:
        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=MAX_EXAMPLES, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case):
            contract.send(case)

        run()

    for operation, mode in itertools.product(contract.operations(), (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)):
        fuzz(operation, mode)
    assert not contract.failures, f"{len(contract.failures)} failures:\n" + "\n".join(contract.failures[:40])


def test_coverage_requests_pass_every_check(contract):
    """schemathesis' coverage phase: every operation's boundaries (each field at its minimum and
    maximum and just past them, each type it refuses, missing and unexpected properties, patterns
    broken, content types it does not take) and the methods each path does not declare (where
    unsupported_method and allow_header_conformance see a 405 and its Allow header)."""
    schema, sent = contract.schema, 0
    for operation in contract.operations():
        for case in schema.iter_coverage_cases(operation, generation_modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                                               generation_config=schema.config.generation_for(operation=operation)):
            contract.send(case)
            sent += 1
    assert sent > 1000, sent
    assert not contract.failures, f"{len(contract.failures)} failures:\n" + "\n".join(contract.failures[:40])
