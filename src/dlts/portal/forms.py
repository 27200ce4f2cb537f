"""Portal forms -> the API's own schemas: the submit form (-> ``JobRequest``) and the job page's
"open an endpoint" form.

Each form is validated by the same marshmallow schema as its API route (``POST /api/v1/jobs``,
``POST /api/v1/jobs/{id}/endpoints``: one set of rules); this module only turns form strings into
the types those schemas expect and maps every error back to the form field it belongs to.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from marshmallow import ValidationError
from werkzeug.datastructures import MultiDict

from dlts.schemas import EndpointCreateSchema, JobSubmitSchema
from dlts.services.jobs import JobRequest
from dlts.strict import decimal, is_whole_number

INT_FIELDS = ("gpus", "nodes", "max_retries", "priority")
MAX_FORM_INT = 10**12  # typed numbers beyond this are refused here; the schemas range the rest
FLOAT_FIELDS = ("cpu",)
BOOL_FIELDS = ("preemptible", "ssh")
TEXT_FIELDS = ("name", "vc", "type", "image", "command", "sku", "memory", "tags")
# the API's field names -> the form's input names where they differ
FORM_NAME = {"max_time_s": "max_time_h", "memory_bytes": "memory"}


@dataclass
class SubmitForm:
    """What the user typed (re-rendered on error) and the errors by field name."""

    values: dict[str, Any]
    errors: dict[str, str] = field(default_factory=dict)

    def add_error(self, name: str, message: str) -> None:
        name = FORM_NAME.get(name, name).split(".")[0]  # "env.TOKEN" (a limit of one variable) -> env
        self.errors.setdefault(name if name in self.values or name in ("env", "ports") else "_form", message)


def hours_to_s(text: str) -> int:
    """Hours as typed ("2", "0.5") -> whole seconds; ValueError for anything else (inf, nan, "١" too)."""
    hours = decimal(text)
    if not math.isfinite(hours) or not 0 < hours <= 366 * 24:
        raise ValueError(text)
    return round(hours * 3600)


def form_values(form: Mapping[str, Any] | MultiDict) -> dict[str, Any]:
    values = {k: (form.get(k) or "").strip() for k in TEXT_FIELDS + INT_FIELDS + FLOAT_FIELDS + ("max_time_h", "env", "ports")}
    # one per rendered form: a second POST of the same form (a double click, a reload, a retry after a
    # timeout) answers the job the first one made (services.job_keeping)
    values["idempotency_key"] = (form.get("idempotency_key") or "").strip()[:200]
    for name in BOOL_FIELDS:
        values[name] = form.get(name) in ("on", "true", "1", True)
    values["command"] = (form.get("command") or "").strip()
    values["env"] = (form.get("env") or "").replace("\r\n", "\n").strip()
    return values


def spec_values(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A saved template's spec -> form values."""
    values = form_values({})
    for key, value in spec.items():
        if key in values and key != "idempotency_key":
            values[key] = value
    return values


def job_values(body: Mapping[str, Any]) -> dict[str, Any]:
    """A job's submit body (``job_keeping.submit_spec``) -> form values: clone or resubmit."""
    values = form_values({})
    for key in ("name", "vc", "type", "image", "command", "sku"):
        values[key] = str(body.get(key) or "")
    for key in ("gpus", "nodes", "max_retries", "priority"):
        values[key] = str(body[key]) if body.get(key) is not None else ""
    values["cpu"] = f"{body['cpu']:g}" if body.get("cpu") is not None else ""
    values["memory"] = str(body["memory"]) if body.get("memory") is not None else ""
    max_time = body.get("max_time_s")
    values["max_time_h"] = f"{max_time / 3600:g}" if max_time else ""
    values["env"] = "\n".join(f"{k}={v}" for k, v in (body.get("env") or {}).items())
    values["ports"] = " ".join(str(p) for p in body.get("ports") or [])
    values["tags"] = ", ".join(body.get("tags") or [])
    values["preemptible"], values["ssh"] = bool(body.get("preemptible")), bool(body.get("ssh"))
    return values


def _parse_env(text: str, form: SubmitForm) -> dict[str, str]:
    env: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            form.add_error("env", f"Line {number}: write NAME=value, one per line.")
            continue
        env[key.strip()] = value
    return env


def parse(form_data: Mapping[str, Any] | MultiDict) -> tuple[SubmitForm, JobRequest | None]:
    """Validate the submitted form; a JobRequest when it is well-formed (policy checks come later)."""
    form = SubmitForm(form_values(form_data))
    v = form.values
    body: dict[str, Any] = {"name": v["name"], "vc": v["vc"], "image": v["image"], "command": v["command"],
                            "type": v["type"] or "batch", "preemptible": v["preemptible"], "ssh": v["ssh"]}
    for name in INT_FIELDS:
        if v[name] != "":
            if is_whole_number(v[name], max_value=MAX_FORM_INT):
                body[name] = int(v[name])  # out of the field's range: the schema says which range
            else:
                form.add_error(name, "Enter a whole number.")
    if v["cpu"] != "":
        try:
            body["cpu"] = decimal(v["cpu"])
        except ValueError:
            form.add_error("cpu", "Enter a number of cores, e.g. 4 or 0.5.")
    if v["max_time_h"] != "":
        try:
            body["max_time_s"] = hours_to_s(v["max_time_h"])
        except ValueError:
            form.add_error("max_time_h", "Enter hours as a number between 0 and 8784 (a year), e.g. 2 or 0.5.")
    for name in ("sku", "memory"):
        if v[name]:
            body[name] = v[name]
    if v["tags"]:
        body["tags"] = v["tags"].replace(",", " ").split()
    body["env"] = _parse_env(v["env"], form)
    if v["ports"]:
        ports = v["ports"].replace(",", " ").split()
        if all(is_whole_number(p, max_value=MAX_FORM_INT) for p in ports):
            body["ports"] = [int(p) for p in ports]
        else:
            form.add_error("ports", "List port numbers separated by spaces or commas.")
    if form.errors:
        return form, None
    try:
        req = JobSubmitSchema().load(body)
    except ValidationError as exc:
        for name, messages in exc.normalized_messages().items():
            text = messages[0] if isinstance(messages, list) and messages and isinstance(messages[0], str) else str(messages)
            if isinstance(messages, dict):  # env: {"KEY": {"key": [...]}} -> the first message inside
                text = _first_text(messages)
            form.add_error(str(name), text[:300])
        return form, None
    return form, req


def _first_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        return _first_text(value[0])
    if isinstance(value, dict) and value:
        return _first_text(next(iter(value.values())))
    return "is invalid"


def template_spec(values: Mapping[str, Any]) -> dict[str, Any]:
    """Form values worth saving in a template (as typed, so the form re-renders them exactly)."""
    keep = TEXT_FIELDS + INT_FIELDS + FLOAT_FIELDS + BOOL_FIELDS + ("max_time_h", "env", "ports")  # never the key
    return {k: values[k] for k in keep if k in values and values[k] not in ("", None)}


def parse_endpoint(form_data: Mapping[str, Any] | MultiDict) -> tuple[dict[str, Any] | None, str | None]:
    """The job page's endpoint form -> ``{kind, port?, name?}`` as the API takes it, or an error to show."""
    body: dict[str, Any] = {"kind": (form_data.get("kind") or "").strip()}
    port = (form_data.get("port") or "").strip()
    name = (form_data.get("name") or "").strip()
    if port and body["kind"] == "port":  # the port box is ignored for the kinds whose port is fixed
        if not is_whole_number(port, max_value=99999):
            return None, "port: enter the port your job listens on, a whole number between 1024 and 65535."
        body["port"] = int(port)
    if name:
        body["name"] = name
    try:
        return EndpointCreateSchema().load(body), None
    except ValidationError as exc:
        field_name, messages = next(iter(exc.normalized_messages().items()))
        return None, f"{field_name}: {_first_text(messages)}"[:300]
