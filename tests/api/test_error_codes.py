"""The error codes the OpenAPI document lists (``dlts.errors.ERROR_CODES``) are exactly the codes
the server can answer with: every code raised in src/dlts is listed, every listed code is raised
somewhere, and the served document's error envelope carries that enum."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import dlts
from dlts.api.errors import HTTP_CODES
from dlts.errors import ERROR_CODES, DltsError

SRC = Path(dlts.__file__).parent


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def codes_in_source() -> dict[str, str]:
    """{code: where} for every literal ``code="..."`` keyword, every ``envelope(status, "code", ...)``
    and every DltsError class's ``code``."""
    found: dict[str, str] = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            where = f"{path.relative_to(SRC)}:{node.lineno}"
            for keyword in node.keywords:
                if keyword.arg == "code" and isinstance(keyword.value, ast.Constant) and isinstance(keyword.value.value, str):
                    found.setdefault(keyword.value.value, where)
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name == "envelope" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                found.setdefault(node.args[1].value, where)
    for info in pkgutil.walk_packages(dlts.__path__, "dlts."):
        if ".migrations" not in info.name and not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    for cls in {DltsError, *_subclasses(DltsError)}:
        found.setdefault(cls.code, f"{cls.__module__}.{cls.__qualname__}")
    for code in HTTP_CODES.values():
        found.setdefault(code, "dlts.api.errors.HTTP_CODES")
    return found


def test_every_code_the_server_raises_is_listed_and_every_listed_code_is_raised():
    raised = codes_in_source()
    unlisted = {code: where for code, where in raised.items() if code not in ERROR_CODES}
    assert not unlisted, f"add these to dlts.errors.ERROR_CODES (or do not call a non-error 'code='): {unlisted}"
    dead = set(ERROR_CODES) - set(raised)
    assert not dead, f"listed in dlts.errors.ERROR_CODES but raised nowhere: {sorted(dead)}"
    assert len(ERROR_CODES) == len(set(ERROR_CODES)), "a code is listed twice"


def test_the_document_describes_every_error_answer_as_the_envelope_with_that_enum(client):
    doc = client.get("/api/v1/openapi.json").get_json()
    schemas = doc["components"]["schemas"]
    envelope = schemas["ErrorEnvelope"]
    assert envelope["required"] == ["error"] and envelope["additionalProperties"] is False
    error = schemas["Error"]
    assert set(error["required"]) == {"code", "message", "details"}
    assert sorted(error["properties"]["code"]["enum"]) == sorted(ERROR_CODES)
    default = doc["components"]["responses"]["DEFAULT_ERROR"]["content"]["application/json"]["schema"]
    assert default == {"$ref": "#/components/schemas/ErrorEnvelope"}
    # each operation's "default" answer is that envelope; a body it validates is a 400, documented as such
    submit = doc["paths"]["/api/v1/jobs"]["post"]["responses"]
    assert submit["default"] == {"$ref": "#/components/responses/DEFAULT_ERROR"}
    assert "400" in submit and "422" not in submit


def test_a_submitted_job_links_to_the_operations_that_follow_it(client):
    """OpenAPI links from POST /jobs's answer: each names an operation of the document by reference,
    with the new job's id as its job_id (what generated clients and schemathesis's stateful runs use)."""
    doc = client.get("/api/v1/openapi.json").get_json()
    links = doc["paths"]["/api/v1/jobs"]["post"]["responses"]["201"]["links"]
    assert set(links) == {"GetJob", "GetJobLog", "GetJobEvents", "KillJob"}
    assert "id" in doc["components"]["schemas"]["Job"]["properties"]
    for link in links.values():
        pointer = link["operationRef"].removeprefix("#/paths/").split("/")
        path, method = pointer[0].replace("~1", "/").replace("~0", "~"), pointer[1]
        operation = doc["paths"][path][method]  # a KeyError: the link names no operation
        assert {p["name"] for p in doc["paths"][path].get("parameters", []) + operation.get("parameters", [])
                if p["in"] == "path"} == {"job_id"}
        assert link["parameters"] == {"job_id": "$response.body#/id"}


def test_answers_that_are_not_json_are_documented_with_their_content_type(client):
    doc = client.get("/api/v1/openapi.json").get_json()
    for path, content_type in (("/api/v1/usage", "text/csv"), ("/api/v1/storage/usage", "text/csv"),
                               ("/api/v1/jobs/{job_id}/log", "text/plain")):
        assert set(doc["paths"][path]["get"]["responses"]["200"]["content"]) == {"application/json", content_type}
