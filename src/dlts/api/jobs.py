"""/api/v1/jobs: submit, list, read, kill/pause/resume/approve, log. Views parse, call one service, render."""

from __future__ import annotations

from dataclasses import asdict

from flask import Response, current_app, request, stream_with_context
from flask.views import MethodView

from dlts.api import pagination
from dlts.api.auth import authenticate, principal
from dlts.api.blueprint import TEXT, Blueprint
from dlts.api.schemas import (
    AttemptPageSchema,
    BatchResponseSchema,
    EndpointListSchema,
    EndpointSchema,
    EventPageSchema,
    FavouriteSchema,
    JobBatchSchema,
    JobListArgs,
    JobOut,
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
from dlts.models import Job
from dlts.schemas import EndpointCreateSchema, JobSubmitSchema
from dlts.services import endpoints as endpoint_service
from dlts.services import job_keeping
from dlts.services import jobs as job_service
from dlts.services.policy import Visibility

blp = Blueprint("jobs", __name__, description="Training jobs")
blp.before_request(authenticate)

def changed_job(job: Job) -> JobOut:
    """A job the caller just changed (and so may manage): the whole job, with its tags and star."""
    tags, favourite = job_service.keeping_of(db.session(), principal(), job)
    return JobOut(job, Visibility.FULL, tags, favourite)


def _operation(path: str, method: str) -> str:
    """An OpenAPI operationRef: the operation at ``path`` (as the document spells it) and ``method``."""
    return "#/paths/" + ("/api/v1" + path).replace("~", "~0").replace("/", "~1") + "/" + method


# what a client does next with a job it submitted: the new job's id is each operation's job_id
JOB_LINKS = {
    name: {"operationRef": _operation(path, method), "parameters": {"job_id": "$response.body#/id"},
           "description": description}
    for name, path, method, description in (
        ("GetJob", "/jobs/{job_id}", "get", "The job, to follow its status."),
        ("GetJobLog", "/jobs/{job_id}/log", "get", "Its log, live while it runs."),
        ("GetJobEvents", "/jobs/{job_id}/events", "get", "What happened to it, and why it waits."),
        ("KillJob", "/jobs/{job_id}/kill", "post", "End it."),
    )
}


@blp.route("/jobs")
class Jobs(MethodView):
    @blp.arguments(JobListArgs, location="query")
    @blp.response(200, JobPageSchema)
    @blp.doc(security=[{"bearer": []}])
    def get(self, wanted: job_service.JobFilter):
        """List jobs you can see, newest first (keyset pagination). Items are summaries: no env or
        ports, the command's first 200 characters; GET /jobs/{id} has the whole job."""
        page = job_service.list_jobs(db.session(), principal(), wanted)
        return {"items": page.items, "next_cursor": page.next_cursor}

    @blp.arguments(JobSubmitSchema)
    @blp.response(201, JobSchema)
    @blp.doc(security=[{"bearer": []}], responses={201: {"links": JOB_LINKS}})
    def post(self, body):
        """Submit a job into a VC you belong to. With an ``Idempotency-Key`` header a retry (same key,
        same body) answers the job the first request made, with ``Idempotent-Replayed: true``."""
        key = request.headers.get(job_keeping.HEADER)
        job, replayed = job_keeping.submit(db.session(), settings_of(current_app), principal(), body, key)
        tags, favourite = job_service.keeping_of(db.session(), principal(), job)
        if replayed:
            return (JobOut(job, Visibility.FULL, tags, favourite, job_service.attempts_of(db.session(), job)),
                    201, {"Idempotent-Replayed": "true"})
        return JobOut(job, Visibility.FULL, tags, favourite, [])


def _whole_by_id(job_id: int) -> JobOut:
    view = job_service.detail(db.session(), principal(), job_id)
    if not view.full:
        return JobOut(view.job, view.visibility, view.tags, view.favourite)
    return JobOut(view.job, view.visibility, view.tags, view.favourite, view.attempts, view.endpoints, view.insights,
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
    return {"items": page, "visibility": visibility,
            "next_cursor": pagination.encode("e", page[-1].id) if len(rows) > args["limit"] else None}


@blp.route("/jobs/<int(max=4611686018427387904):job_id>/attempts")
@blp.arguments(PageArgs, location="query")
@blp.response(200, AttemptPageSchema)
@blp.doc(security=[{"bearer": []}])
def job_attempts(args, job_id: int):
    """Retry history, oldest first: where each attempt ran and how it ended."""
    after = pagination.decode_int("a", args.get("cursor")) or 0
    visibility, rows = job_service.attempts(db.session(), principal(), job_id, after_number=after, limit=args["limit"] + 1)
    page = rows[: args["limit"]]
    return {"items": page, "visibility": visibility,
            "next_cursor": pagination.encode("a", page[-1].number) if len(rows) > args["limit"] else None}


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
@blp.response(200, LogSchema, content_type="application/json")
@blp.alt_response(200, schema=TEXT, content_type="text/plain", success=True,
                  description="a slice of the log as JSON; with ?download=true the whole log as text (an attachment)")
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
