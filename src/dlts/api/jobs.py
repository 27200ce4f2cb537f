"""/api/v1/jobs: submit, list, read, kill/pause/resume/approve, log. Views parse, call one service, render."""

from __future__ import annotations

from dataclasses import asdict

from flask import Response, current_app, request, stream_with_context
from flask.views import MethodView

from dlts.api import pagination
from dlts.api.auth import authenticate, principal
from dlts.api.blueprint import Blueprint
from dlts.api.schemas import (
    AttemptPageSchema,
    BatchResponseSchema,
    EndpointListSchema,
    EndpointSchema,
    EventPageSchema,
    FavouriteSchema,
    JobBatchSchema,
    JobListArgs,
    JobPageSchema,
    JobPatchSchema,
    JobSchema,
    JobTagsResponseSchema,
    JobTagsSchema,
    LogArgs,
    LogSchema,
    PageArgs,
)
from dlts.extensions import db, settings_of
from dlts.models import Job, JobAttempt, iso
from dlts.schemas import EndpointCreateSchema, JobSubmitSchema
from dlts.services import endpoints as endpoint_service
from dlts.services import job_keeping
from dlts.services import jobs as job_service
from dlts.services.policy import Visibility

blp = Blueprint("jobs", __name__, description="Training jobs")
blp.before_request(authenticate)

PUBLIC_FIELDS = ("id", "name", "user", "vc", "type", "status", "reason", "queue_position", "estimated_start", "sku",
                 "gpus", "nodes", "cpu", "memory_bytes", "preemptible", "submitted_at", "started_at", "finished_at",
                 "tags", "favourite", "archived_at")


def job_dict(job: Job, visibility: Visibility, attempts: list[JobAttempt] | None = None,
             endpoints: list[endpoint_service.EndpointView] | None = None, insights: list | None = None,
             tags: list[str] | None = None, favourite: bool = False, actions: tuple[str, ...] | None = None) -> dict:
    data = {
        "id": job.id, "name": job.name, "user": job.user.name, "vc": job.vc.name, "type": job.type,
        "status": job.status.value, "reason": job.reason, "reason_detail": job.reason_detail,
        "queue_position": job.queue_position, "estimated_start": _estimate(job), "image": job.image,
        "command": job.command, "sku": job.sku,
        "gpus": job.gpus, "nodes": job.nodes, "cpu": job.cpu, "memory_bytes": job.memory_bytes,
        "priority": job.priority, "preemptible": job.preemptible, "max_retries": job.max_retries,
        "retries_used": job.retries_used, "max_time_s": job.max_time_s,
        "time_left_s": job_service.time_left_s(job, job.vc.max_job_time_s),
        "submitted_at": iso(job.submitted_at), "queue_time": iso(job.queue_time),
        "started_at": iso(job.started_at), "finished_at": iso(job.finished_at), "exit_code": job.exit_code,
        "attempt": job.attempt, "env": job.spec.get("env", {}), "ports": job.spec.get("ports", []),
        "ssh": job.spec.get("ssh", False), "ephemeral_storage_bytes": job.spec.get("ephemeral_storage_bytes"),
        "run_as_root": bool(job.spec.get("run_as_root")), "idle_exempt": bool(job.spec.get("idle_exempt")),
        "visibility": visibility.value,
        "ib_domain": job.spec.get("ib_domain"), "min_replicas": job.spec.get("min_replicas", 0),
        "max_replicas": job.spec.get("max_replicas", 0), "archived_at": iso(job.archived_at),
        "tags": tags or [], "favourite": favourite,
    }
    if insights is not None:
        data["insights"] = [{"code": i.code, "message": i.message, "since": iso(i.since)} for i in insights]
    if attempts is not None:
        data["attempts"] = [{
            "number": a.number, "placements": a.placements, "started_at": iso(a.started_at),
            "ended_at": iso(a.ended_at), "exit_code": a.exit_code, "end_reason": a.end_reason,
            "spends_retry": a.spends_retry} for a in attempts]
        current = next((a for a in attempts if a.number == job.attempt), None)
        data["placements"] = current.placements if current and job.status.value in ("scheduling", "running", "pausing", "killing") else []
    if endpoints is not None:
        data["endpoints"] = endpoints
    if actions is not None:
        data["actions"] = list(actions)
    if visibility is Visibility.PUBLIC:
        data = {k: v for k, v in data.items() if k in PUBLIC_FIELDS} | {"visibility": visibility.value}
    return data


def changed_job(job: Job) -> dict:
    """A job the caller just changed (and so may manage): the whole job, with its tags and star."""
    kept = job_service.keeping_of(db.session(), principal(), job)
    return job_dict(job, Visibility.FULL, tags=kept[0], favourite=kept[1])


def _estimate(job: Job) -> str | None:
    """Backfill's estimated start of a queued job (its reservation); null when unknown."""
    return iso(job.estimated_start) if job.status.value == "queued" else None


def job_summary(item: job_service.JobListItem) -> dict:
    """A list item (JobSummarySchema): no env, ports or spec, and only the start of the command
    (``item.command_start``); GET /jobs/{id} has the whole job."""
    job, visibility, command_start = item.job, item.visibility, item.command_start
    data = {
        "id": job.id, "name": job.name, "user": job.user.name, "vc": job.vc.name, "type": job.type,
        "status": job.status.value, "reason": job.reason, "reason_detail": job.reason_detail,
        "queue_position": job.queue_position, "estimated_start": _estimate(job), "image": job.image,
        "sku": job.sku, "gpus": job.gpus,
        "nodes": job.nodes, "cpu": job.cpu, "memory_bytes": job.memory_bytes, "priority": job.priority,
        "preemptible": job.preemptible, "max_retries": job.max_retries, "retries_used": job.retries_used,
        "max_time_s": job.max_time_s, "time_left_s": item.time_left_s,
        "submitted_at": iso(job.submitted_at), "queue_time": iso(job.queue_time), "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at), "exit_code": job.exit_code, "attempt": job.attempt,
        "command_preview": command_start[:job_service.COMMAND_PREVIEW_CHARS],
        "command_truncated": len(command_start) > job_service.COMMAND_PREVIEW_CHARS, "visibility": visibility.value,
        "tags": item.tags, "favourite": item.favourite, "archived_at": iso(job.archived_at),
    }
    if visibility is Visibility.PUBLIC:
        data = {k: v for k, v in data.items() if k in PUBLIC_FIELDS} | {"visibility": visibility.value}
    return data


@blp.route("/jobs")
class Jobs(MethodView):
    @blp.arguments(JobListArgs, location="query")
    @blp.response(200, JobPageSchema)
    @blp.doc(security=[{"bearer": []}])
    def get(self, wanted: job_service.JobFilter):
        """List jobs you can see, newest first (keyset pagination). Items are summaries: no env or
        ports, the command's first 200 characters; GET /jobs/{id} has the whole job."""
        page = job_service.list_jobs(db.session(), principal(), wanted)
        return {"items": [job_summary(item) for item in page.items], "next_cursor": page.next_cursor}

    @blp.arguments(JobSubmitSchema)
    @blp.response(201, JobSchema)
    @blp.doc(security=[{"bearer": []}])
    def post(self, body):
        """Submit a job into a VC you belong to. With an ``Idempotency-Key`` header a retry (same key,
        same body) answers the job the first request made, with ``Idempotent-Replayed: true``."""
        key = request.headers.get(job_keeping.HEADER)
        job, replayed = job_keeping.submit(db.session(), settings_of(current_app), principal(), body, key)
        tags, favourite = job_service.keeping_of(db.session(), principal(), job)
        if replayed:
            return (job_dict(job, Visibility.FULL, job_service.attempts_of(db.session(), job), tags=tags, favourite=favourite),
                    201, {"Idempotent-Replayed": "true"})
        return job_dict(job, Visibility.FULL, [], tags=tags, favourite=favourite)


def _whole_by_id(job_id: int) -> dict:
    view = job_service.detail(db.session(), principal(), job_id)
    if not view.full:
        return job_dict(view.job, view.visibility, tags=view.tags, favourite=view.favourite)
    return job_dict(view.job, view.visibility, view.attempts, view.endpoints, view.insights, view.tags, view.favourite,
                    view.actions)


@blp.route("/jobs/<int(max=4611686018427387904):job_id>")
class OneJob(MethodView):
    @blp.response(200, JobSchema)
    @blp.doc(security=[{"bearer": []}])
    def get(self, job_id: int):
        """One job: status and reason, queue position, resources, placement, attempts."""
        return _whole_by_id(job_id)

    @blp.arguments(JobPatchSchema)
    @blp.response(200, JobSchema)
    @blp.doc(security=[{"bearer": []}])
    def patch(self, body, job_id: int):
        """Change priority (owner: up to 100, VC admin: up to 1000) or max_time_s (applies at the next tick);
        idle_exempt (VC admins): the VC's idle-job policy leaves the job alone."""
        return changed_job(job_service.patch(db.session(), principal(), job_id, body))

    @blp.response(204)
    @blp.doc(security=[{"bearer": []}])
    def delete(self, job_id: int):
        """Delete an ended job of yours with its history and logs (owner only). Its GPU time stays in usage."""
        job_keeping.delete(db.session(), settings_of(current_app), principal(), job_id)
        return ""


@blp.route("/jobs/<int(max=4611686018427387904):job_id>/tags", methods=["PUT"])
@blp.arguments(JobTagsSchema)
@blp.response(200, JobTagsResponseSchema)
@blp.doc(security=[{"bearer": []}])
def put_job_tags(body, job_id: int):
    """Replace the job's tags (owner, VC admin); any status. An event of kind change records it."""
    return {"job_id": job_id, "tags": job_keeping.set_tags(db.session(), principal(), job_id, body["tags"])}


@blp.route("/jobs/<int(max=4611686018427387904):job_id>/favourite", methods=["PUT", "DELETE"])
@blp.response(200, FavouriteSchema)
@blp.doc(security=[{"bearer": []}])
def job_favourite(job_id: int):
    """Star (PUT) or unstar (DELETE) a job you can see; your favourites are yours alone."""
    on = job_keeping.set_favourite(db.session(), principal(), job_id, request.method == "PUT")
    return {"job_id": job_id, "favourite": on}


@blp.route("/jobs/<int(max=4611686018427387904):job_id>/spec")
@blp.response(200, JobSubmitSchema)
@blp.doc(security=[{"bearer": []}])
def job_spec(job_id: int):
    """The POST /jobs body that submits this job again (owner, VC admin): clone or resubmit."""
    return job_keeping.spec(db.session(), principal(), job_id)


@blp.route("/jobs:batch", methods=["POST"])
@blp.arguments(JobBatchSchema)
@blp.response(200, BatchResponseSchema)
@blp.doc(security=[{"bearer": []}])
def batch(body):
    """Kill, pause, resume or approve many jobs: one result per id, never all-or-nothing."""
    results = job_service.batch(db.session(), principal(), body["action"], body["ids"])
    ok = sum(1 for r in results if r.ok)
    return {"action": body["action"], "results": results, "succeeded": ok, "failed": len(results) - ok}


@blp.route("/jobs/<int(max=4611686018427387904):job_id>/events")
@blp.arguments(PageArgs, location="query")
@blp.response(200, EventPageSchema)
@blp.doc(security=[{"bearer": []}])
def job_events(args, job_id: int):
    """Transitions, scheduler reasons, repair and insight messages, newest first."""
    before = pagination.decode_int("e", args.get("cursor"))
    visibility, rows = job_service.events(db.session(), principal(), job_id, before_id=before, limit=args["limit"] + 1)
    page = rows[: args["limit"]]
    items = [{"id": e.id, "at": iso(e.at), "kind": e.kind, "from_status": e.from_status, "to_status": e.to_status,
              "reason": e.reason, "message": e.message, "actor": e.actor} for e in page]
    if visibility is Visibility.PUBLIC:
        items = [{k: v for k, v in item.items() if k not in ("message", "actor")} for item in items]
    return {"items": items, "next_cursor": pagination.encode("e", page[-1].id) if len(rows) > args["limit"] else None}


@blp.route("/jobs/<int(max=4611686018427387904):job_id>/attempts")
@blp.arguments(PageArgs, location="query")
@blp.response(200, AttemptPageSchema)
@blp.doc(security=[{"bearer": []}])
def job_attempts(args, job_id: int):
    """Retry history, oldest first: where each attempt ran and how it ended."""
    after = pagination.decode_int("a", args.get("cursor")) or 0
    visibility, rows = job_service.attempts(db.session(), principal(), job_id, after_number=after, limit=args["limit"] + 1)
    page = rows[: args["limit"]]
    items = [{"number": a.number, "placements": a.placements if visibility is Visibility.FULL else [],
              "started_at": iso(a.started_at), "ended_at": iso(a.ended_at), "exit_code": a.exit_code,
              "end_reason": a.end_reason, "spends_retry": a.spends_retry} for a in page]
    return {"items": items, "next_cursor": pagination.encode("a", page[-1].number) if len(rows) > args["limit"] else None}


def _action(name: str, service):
    @blp.route(f"/jobs/<int(max=4611686018427387904):job_id>/{name}", methods=["POST"], endpoint=f"job_{name}")
    @blp.response(202, JobSchema)
    @blp.doc(security=[{"bearer": []}], summary=f"{name.capitalize()} a job")
    def view(job_id: int):
        return changed_job(service(db.session(), principal(), job_id))

    return view


def _archive(name: str, archived: bool):
    @blp.route(f"/jobs/<int(max=4611686018427387904):job_id>/{name}", methods=["POST"], endpoint=f"job_{name}")
    @blp.response(200, JobSchema)
    @blp.doc(security=[{"bearer": []}], summary=f"{name.capitalize()} an ended job of yours")
    def view(job_id: int):
        return changed_job(job_keeping.set_archived(db.session(), principal(), job_id, archived))

    return view


archive_job = _archive("archive", True)
unarchive_job = _archive("unarchive", False)
kill_job = _action("kill", job_service.kill)
pause_job = _action("pause", job_service.pause)
resume_job = _action("resume", job_service.resume)
approve_job = _action("approve", job_service.approve)


@blp.route("/jobs/<int(max=4611686018427387904):job_id>/endpoints")
class JobEndpoints(MethodView):
    @blp.response(200, EndpointListSchema)
    @blp.doc(security=[{"bearer": []}])
    def get(self, job_id: int):
        """The job's endpoints (at most 8: one page), with their address once ready."""
        return {"items": endpoint_service.list_endpoints(db.session(), principal(), job_id), "next_cursor": None}

    @blp.arguments(EndpointCreateSchema)
    @blp.response(201, EndpointSchema)
    @blp.doc(security=[{"bearer": []}])
    def post(self, body, job_id: int):
        """Open ssh, jupyter, vscode or a port of a job that has not ended; the job manager exposes it while the
        job runs. jupyter and vscode answer their password (token) this once."""
        view, token = endpoint_service.open_endpoint(db.session(), principal(), job_id, body["kind"], body.get("port"),
                                                     body.get("name"))
        return asdict(view) | ({"token": token} if token else {})


@blp.route("/jobs/<int(max=4611686018427387904):job_id>/endpoints/<int(max=4611686018427387904):endpoint_id>",
           methods=["DELETE"])
@blp.response(202, EndpointSchema)
@blp.doc(security=[{"bearer": []}])
def close_job_endpoint(job_id: int, endpoint_id: int):
    """Close an endpoint: it reads closing until the job manager has removed it from the cluster, then it is gone."""
    return endpoint_service.close_endpoint(db.session(), principal(), job_id, endpoint_id)


@blp.route("/jobs/<int(max=4611686018427387904):job_id>/log")
@blp.arguments(LogArgs, location="query")
@blp.response(200, LogSchema)
@blp.doc(security=[{"bearer": []}])
def job_log(args, job_id: int):
    """A slice of an attempt's log (follow with next_offset), or the whole log with download=1
    (rotated parts in order, a line where the middle was dropped)."""
    settings = settings_of(current_app)
    if args["download"]:
        _job, number, chunks = job_service.download_log(db.session(), settings, principal(), job_id, args.get("attempt"))
        return Response(stream_with_context(chunks), mimetype="text/plain",
                        headers={"Content-Disposition": f'attachment; filename="job-{job_id}-attempt-{number}.log"'})
    read = job_service.read_log(db.session(), settings, principal(), job_id, args.get("attempt"),
                                args["offset"], args["limit"])
    return {"job_id": read.job.id, "attempt": read.attempt, "offset": read.offset, "next_offset": read.next_offset,
            "size": read.size, "data": read.data.decode("utf-8", errors="replace"), "complete": read.complete}
