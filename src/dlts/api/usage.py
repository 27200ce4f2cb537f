"""/api/v1/usage (GPU time from the accounting rollup, JSON or CSV) and /api/v1/jobs/{id}/utilisation
(an attempt's per-minute history). docs/accounting.md."""

from __future__ import annotations

import json

from flask import Response
from marshmallow import Schema, fields, validate

from dlts.api.auth import authenticate, principal
from dlts.api.blueprint import CSV, Blueprint
from dlts.api.schemas import comma_list
from dlts.extensions import db
from dlts.models import utcnow
from dlts.schemas import Pattern
from dlts.services import accounting

DAY_OR_MONTH = r"^[1-9][0-9]{3}-(0[1-9]|1[0-2])(-(0[1-9]|[12][0-9]|3[01]))?$"
DAY_OR_MONTH_ERROR = "must be a date like 2026-11-30 or a month like 2026-11."

blp = Blueprint("usage", __name__, description="GPU accounting and utilisation history")
blp.before_request(authenticate)
SECURITY: list[dict[str, list[str]]] = [{"bearer": []}]


class UsageArgs(Schema):
    group_by = fields.String(load_default="user", validate=[validate.Length(1, 100), Pattern(
        comma_list(accounting.GROUPS), error=f"group_by takes a comma-separated list of {', '.join(accounting.GROUPS)}.")],
        metadata={"description": "comma-separated: " + ", ".join(accounting.GROUPS)})
    # "from" is a Python keyword: the attribute is from_, the query parameter from
    from_ = fields.String(data_key="from", validate=Pattern(DAY_OR_MONTH, error=DAY_OR_MONTH_ERROR), metadata={
        "description": "first day (YYYY-MM-DD) or month (YYYY-MM); default: this month. A day that does not exist "
                       "(2026-02-30) is a 400 naming from"})
    to = fields.String(validate=Pattern(DAY_OR_MONTH, error=DAY_OR_MONTH_ERROR), metadata={
        "description": "last day, inclusive (YYYY-MM-DD), or month (YYYY-MM); default: today. Before from, or more "
                       "than ten years after it, is a 400 naming to"})
    vc = fields.String(validate=validate.Length(1, 64))
    user = fields.String(validate=validate.Length(1, 64))
    limit = fields.Integer(load_default=1000, validate=validate.Range(1, accounting.MAX_JOB_ROWS),
                           metadata={"description": "group_by=job: at most this many rows, newest jobs first"})
    format = fields.String(load_default="json", validate=validate.OneOf(["json", "csv"]))


class UsageRowSchema(Schema):
    user = fields.String()
    vc = fields.String()
    sku = fields.String(allow_none=True)
    preemptible = fields.Boolean()
    month = fields.String()
    day = fields.String()
    job_id = fields.Integer()
    job_name = fields.String(allow_none=True)
    gpu_seconds = fields.Float(metadata={"description": "allocated (booked) GPU time"})
    busy_gpu_seconds = fields.Float(metadata={"description": "GPU utilisation x allocated time, where sampled"})
    idle_gpu_seconds = fields.Float(metadata={"description": "sampled allocated time minus busy"})
    unmeasured_gpu_seconds = fields.Float(metadata={"description": "allocated time without utilisation samples"})
    preemptible_gpu_seconds = fields.Float()
    gpu_hours = fields.Float()
    busy_gpu_hours = fields.Float()
    idle_gpu_hours = fields.Float()
    unmeasured_gpu_hours = fields.Float()
    preemptible_gpu_hours = fields.Float()
    preemptible_share = fields.Float()


class UsageSchema(Schema):
    group_by = fields.List(fields.String())
    from_ = fields.String(data_key="from")
    to = fields.String()
    vc = fields.String(allow_none=True)
    user = fields.String(allow_none=True)
    truncated = fields.Boolean()
    items = fields.List(fields.Nested(UsageRowSchema))


class UtilisationArgs(Schema):
    attempt = fields.Integer(validate=validate.Range(1, 100_000))


class UtilisationGpuSchema(Schema):
    node = fields.String()
    index = fields.Integer()
    utilization_ratio = fields.Float(allow_none=True)
    memory_used_bytes = fields.Integer(allow_none=True)


class UtilisationPointSchema(Schema):
    at = fields.String()
    gpus = fields.List(fields.Nested(UtilisationGpuSchema))
    cpu_cores = fields.Float(allow_none=True)
    memory_bytes = fields.Integer(allow_none=True)


class UtilisationSchema(Schema):
    job_id = fields.Integer()
    attempt = fields.Integer()
    interval_s = fields.Integer()
    started_at = fields.String(allow_none=True)
    ended_at = fields.String(allow_none=True)
    points = fields.List(fields.Nested(UtilisationPointSchema))


@blp.route("/usage")
@blp.arguments(UsageArgs, location="query")
@blp.response(200, UsageSchema, content_type="application/json")
@blp.alt_response(200, schema=CSV, content_type="text/csv", success=True,
                  description="JSON; with ?format=csv the same rows as CSV (an attachment)")
@blp.doc(security=SECURITY)
def usage(args):
    """GPU hours booked, busy and idle, by user, VC, SKU, preemptible, month, day or job, over the
    VCs whose jobs you can see (cluster admins: all); ?format=csv for a spreadsheet."""
    start, end = accounting.parse_range(args.get("from_"), args.get("to"), utcnow().date())
    query = accounting.UsageQuery(group_by=accounting.parse_group_by(args["group_by"]), start=start, end=end,
                                  vc=args.get("vc"), user=args.get("user"), limit=args["limit"])
    report = accounting.usage(db.session(), principal(), query)
    if args["format"] == "csv":
        return Response(accounting.to_csv(report), mimetype="text/csv",
                        headers={"Content-Disposition": f'attachment; filename="gpu-usage-{start}-{end}.csv"'})
    return Response(json.dumps(report.as_json(), separators=(",", ":")), mimetype="application/json")


@blp.route("/jobs/<int(max=4611686018427387904):job_id>/utilisation")
@blp.arguments(UtilisationArgs, location="query")
@blp.response(200, UtilisationSchema)
@blp.doc(security=SECURITY)
def job_utilisation(args, job_id: int):
    """One attempt's utilisation, a point a minute (the current attempt unless ?attempt=N): each GPU's
    utilisation and memory, the job's CPU cores and host memory. Owner, VC admins, cluster admins."""
    return accounting.utilisation(db.session(), principal(), job_id, args.get("attempt")).as_json()
