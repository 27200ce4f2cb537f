"""/api/v1/jobs: submit, list, read, kill/pause/resume/approve, log. Views parse, call one service, render."""

from __future__ import annotations

from dataclasses import asdict

import sqlalchemy as sa
from flask import Response, current_app, request, stream_with_context
from flask.views import MethodView

from dlts.api import pagination
from dlts.api.auth import authenticate, principal
from dlts.api.blueprint import Blueprint
from dlts.api.schemas import (
    AttemptPageSchema,
    BatchResponseSchema,
    EndpointCreateSchema,
    EndpointListSchema,
    EndpointSchema,
    EventPageSchema,
    FavouriteSchema,
    JobBatchSchema,
    JobListArgs,
    JobPageSchema,
    JobPatchSchema,
    JobSchema,
    JobSubmitSchema,
    JobTagsResponseSchema,
    JobTagsSchema,
    LogArgs,
    LogSchema,
    PageArgs,
)
from dlts.app import settings_of
from dlts.extensions import db
from dlts.models import Job, JobAttempt, JobStatus, User, VirtualCluster, iso
from dlts.repositories import insight as insight_repo
from dlts.repositories import jobs as job_repo
from dlts.services import endpoints as endpoint_service
from dlts.services import job_keeping
from dlts.services import jobs as job_service
from dlts.services.policy import Visibility, job_visibility

blp = Blueprint("jobs", __name__, description="Training jobs")
blp.before_request(authenticate)

PUBLIC_FIELDS = ("id", "name", "user", "vc", "type", "status", "reason", "queue_position", "estimated_start", "sku",
                 "gpus", "nodes", "cpu", "memory_bytes", "preemptible", "submitted_at", "started_at", "finished_at",
                 "tags", "favourite", "archived_at")


def _kept(job_ids: list[int]) -> tuple[dict[int, list[str]], set[int]]:
    """Tags of these jobs and which of them the caller starred (two queries for a whole page)."""
    return job_keeping.tags_of(db.session, job_ids), job_keeping.favourites_of(db.session, principal().user_id, job_ids)


def job_dict(job: Job, visibility: Visibility, attempts: list[JobAttempt] | None = None,
             endpoints: list[endpoint_service.EndpointView] | None = None, insights: list | None = None) -> dict:
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
    }
    if insights is not None:
        data["insights"] = [{"code": i.code, "message": i.message, "since": iso(i.since)} for i in insights]
    tags, starred = _kept([job.id])
    data["tags"], data["favourite"] = tags.get(job.id, []), job.id in starred
    if attempts is not None:
        data["attempts"] = [{
            "number": a.number, "placements": a.placements, "started_at": iso(a.started_at),
            "ended_at": iso(a.ended_at), "exit_code": a.exit_code, "end_reason": a.end_reason,
            "spends_retry": a.spends_retry} for a in attempts]
        current = next((a for a in attempts if a.number == job.attempt), None)
        data["placements"] = current.placements if current and job.status.value in ("scheduling", "running", "pausing", "killing") else []
    if endpoints is not None:
        data["endpoints"] = endpoints
    if visibility is Visibility.PUBLIC:
        data = {k: v for k, v in data.items() if k in PUBLIC_FIELDS} | {"visibility": visibility.value}
    return data


COMMAND_PREVIEW_CHARS = 200


def _estimate(job: Job) -> str | None:
    """Backfill's estimated start of a queued job (its reservation); null when unknown."""
    return iso(job.estimated_start) if job.status.value == "queued" else None


def job_summary(job: Job, visibility: Visibility, command_start: str, tags: list[str] | None = None,
                favourite: bool = False) -> dict:
    """A list item (JobSummarySchema): no env, ports or spec, and only the start of the command
    (``command_start``, from ``job_repo.command_previews``); GET /jobs/{id} has the whole job."""
    data = {
        "id": job.id, "name": job.name, "user": job.user.name, "vc": job.vc.name, "type": job.type,
        "status": job.status.value, "reason": job.reason, "reason_detail": job.reason_detail,
        "queue_position": job.queue_position, "estimated_start": _estimate(job), "image": job.image,
        "sku": job.sku, "gpus": job.gpus,
        "nodes": job.nodes, "cpu": job.cpu, "memory_bytes": job.memory_bytes, "priority": job.priority,
        "preemptible": job.preemptible, "max_retries": job.max_retries, "retries_used": job.retries_used,
        "max_time_s": job.max_time_s, "time_left_s": job_service.time_left_s(job, job.vc.max_job_time_s),
        "submitted_at": iso(job.submitted_at), "queue_time": iso(job.queue_time), "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at), "exit_code": job.exit_code, "attempt": job.attempt,
        "command_preview": command_start[:COMMAND_PREVIEW_CHARS],
        "command_truncated": len(command_start) > COMMAND_PREVIEW_CHARS, "visibility": visibility.value,
        "tags": tags or [], "favourite": favourite, "archived_at": iso(job.archived_at),
    }
    if visibility is Visibility.PUBLIC:
        data = {k: v for k, v in data.items() if k in PUBLIC_FIELDS} | {"visibility": visibility.value}
    return data


def _attempts(job_id: int) -> list[JobAttempt]:
    return list(db.session.scalars(sa.select(JobAttempt).where(JobAttempt.job_id == job_id).order_by(JobAttempt.number)))


@blp.route("/jobs")
class Jobs(MethodView):
    @blp.arguments(JobListArgs, location="query")
    @blp.response(200, JobPageSchema)
    @blp.doc(security=[{"bearer": []}])
    def get(self, args):
        """List jobs you can see, newest first (keyset pagination). Items are summaries: no env or
        ports, the command's first 200 characters; GET /jobs/{id} has the whole job."""
        who = principal()
        visible = job_service.visible_vc_ids(who)
        vc_id = user_id = None
        if args.get("vc"):
            vc_id = db.session.scalar(sa.select(VirtualCluster.id).where(VirtualCluster.name == args["vc"]))
            if vc_id is None or (visible is not None and vc_id not in visible):
                return {"items": [], "next_cursor": None}
        if args.get("user"):
            user_id = db.session.scalar(sa.select(User.id).where(User.name == args["user"]))
            if user_id is None:
                return {"items": [], "next_cursor": None}
        statuses = [JobStatus(s.strip()) for s in args["status"].split(",")] if args.get("status") else []
        before = job_repo.decode_cursor(args["cursor"]) if args.get("cursor") else None
        limit = args["limit"]
        tag = args["tag"].strip().lower() if args.get("tag") else None
        rows = job_repo.list_jobs(db.session, visible_vc_ids=visible, user_id=user_id, vc_id=vc_id, statuses=statuses,
                                  job_type=args.get("type"), boundary=before, limit=limit + 1, tag=tag,
                                  favourite_of=who.user_id if args.get("favourite") else None,
                                  archived=args["archived"])
        page = rows[:limit]
        ids = [j.id for j in page]
        previews = job_repo.command_previews(db.session, ids, COMMAND_PREVIEW_CHARS)
        tags, starred = _kept(ids)
        items = [job_summary(j, job_visibility(who, j) or Visibility.PUBLIC, previews.get(j.id, ""), tags.get(j.id),
                             j.id in starred) for j in page]
        return {"items": items, "next_cursor": job_repo.encode_cursor(page[-1].id) if len(rows) > limit else None}

    @blp.arguments(JobSubmitSchema)
    @blp.response(201, JobSchema)
    @blp.doc(security=[{"bearer": []}])
    def post(self, body):
        """Submit a job into a VC you belong to. With an ``Idempotency-Key`` header a retry (same key,
        same body) answers the job the first request made, with ``Idempotent-Replayed: true``."""
        memory = body.pop("memory")
        body["ports"] = tuple(body["ports"])
        body["tags"] = tuple(body["tags"])
        key = request.headers.get(job_keeping.HEADER)
        job, replayed = job_keeping.submit(db.session, settings_of(current_app), principal(),
                                           job_service.JobRequest(memory_bytes=memory, **body), key)
        if replayed:
            return job_dict(job, Visibility.FULL, _attempts(job.id)), 201, {"Idempotent-Replayed": "true"}
        return job_dict(job, Visibility.FULL, [])


@blp.route("/jobs/<int(max=4611686018427387904):job_id>")
class OneJob(MethodView):
    @blp.response(200, JobSchema)
    @blp.doc(security=[{"bearer": []}])
    def get(self, job_id: int):
        """One job: status and reason, queue position, resources, placement, attempts."""
        job, visibility = job_service.get(db.session, principal(), job_id)
        if visibility is not Visibility.FULL:
            return job_dict(job, visibility)
        return job_dict(job, visibility, _attempts(job.id), endpoint_service.views_of(db.session, job),
                        insight_repo.insights_of(db.session, job.id))

    @blp.arguments(JobPatchSchema)
    @blp.response(200, JobSchema)
    @blp.doc(security=[{"bearer": []}])
    def patch(self, body, job_id: int):
        """Change priority (owner: up to 100, VC admin: up to 1000) or max_time_s (applies at the next tick);
        idle_exempt (VC admins): the VC's idle-job policy leaves the job alone."""
        job = job_service.patch(db.session, principal(), job_id, body)
        return job_dict(job, Visibility.FULL)

    @blp.response(204)
    @blp.doc(security=[{"bearer": []}])
    def delete(self, job_id: int):
        """Delete an ended job of yours with its history and logs (owner only). Its GPU time stays in usage."""
        job_keeping.delete(db.session, settings_of(current_app), principal(), job_id)
        return ""


@blp.route("/jobs/<int(max=4611686018427387904):job_id>/tags", methods=["PUT"])
@blp.arguments(JobTagsSchema)
@blp.response(200, JobTagsResponseSchema)
@blp.doc(security=[{"bearer": []}])
def put_job_tags(body, job_id: int):
    """Replace the job's tags (owner, VC admin); any status. An event of kind change records it."""
    return {"job_id": job_id, "tags": job_keeping.set_tags(db.session, principal(), job_id, body["tags"])}


@blp.route("/jobs/<int(max=4611686018427387904):job_id>/favourite", methods=["PUT", "DELETE"])
@blp.response(200, FavouriteSchema)
@blp.doc(security=[{"bearer": []}])
def job_favourite(job_id: int):
    """Star (PUT) or unstar (DELETE) a job you can see; your favourites are yours alone."""
    on = job_keeping.set_favourite(db.session, principal(), job_id, request.method == "PUT")
    return {"job_id": job_id, "favourite": on}


@blp.route("/jobs/<int(max=4611686018427387904):job_id>/spec")
@blp.response(200, JobSubmitSchema)
@blp.doc(security=[{"bearer": []}])
def job_spec(job_id: int):
    """The POST /jobs body that submits this job again (owner, VC admin): clone or resubmit."""
    return job_keeping.spec(db.session, principal(), job_id)


@blp.route("/jobs:batch", methods=["POST"])
@blp.arguments(JobBatchSchema)
@blp.response(200, BatchResponseSchema)
@blp.doc(security=[{"bearer": []}])
def batch(body):
    """Kill, pause, resume or approve many jobs: one result per id, never all-or-nothing."""
    results = job_service.batch(db.session, principal(), body["action"], body["ids"])
    ok = sum(1 for r in results if r.ok)
    return {"action": body["action"], "results": results, "succeeded": ok, "failed": len(results) - ok}


@blp.route("/jobs/<int(max=4611686018427387904):job_id>/events")
@blp.arguments(PageArgs, location="query")
@blp.response(200, EventPageSchema)
@blp.doc(security=[{"bearer": []}])
def job_events(args, job_id: int):
    """Transitions, scheduler reasons, repair and insight messages, newest first."""
    before = pagination.decode_int("e", args.get("cursor"))
    visibility, rows = job_service.events(db.session, principal(), job_id, before_id=before, limit=args["limit"] + 1)
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
    visibility, rows = job_service.attempts(db.session, principal(), job_id, after_number=after, limit=args["limit"] + 1)
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
        job = service(db.session, principal(), job_id)
        return job_dict(job, Visibility.FULL)

    return view


def _archive(name: str, archived: bool):
    @blp.route(f"/jobs/<int(max=4611686018427387904):job_id>/{name}", methods=["POST"], endpoint=f"job_{name}")
    @blp.response(200, JobSchema)
    @blp.doc(security=[{"bearer": []}], summary=f"{name.capitalize()} an ended job of yours")
    def view(job_id: int):
        return job_dict(job_keeping.set_archived(db.session, principal(), job_id, archived), Visibility.FULL)

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
        return {"items": endpoint_service.list_endpoints(db.session, principal(), job_id), "next_cursor": None}

    @blp.arguments(EndpointCreateSchema)
    @blp.response(201, EndpointSchema)
    @blp.doc(security=[{"bearer": []}])
    def post(self, body, job_id: int):
        """Open ssh, jupyter, vscode or a port of a job that has not ended; the job manager exposes it while the
        job runs. jupyter and vscode answer their password (token) this once."""
        view, token = endpoint_service.open_endpoint(db.session, principal(), job_id, body["kind"], body.get("port"),
                                                     body.get("name"))
        return asdict(view) | ({"token": token} if token else {})


@blp.route("/jobs/<int(max=4611686018427387904):job_id>/endpoints/<int(max=4611686018427387904):endpoint_id>",
           methods=["DELETE"])
@blp.response(202, EndpointSchema)
@blp.doc(security=[{"bearer": []}])
def close_job_endpoint(job_id: int, endpoint_id: int):
    """Close an endpoint: it reads closing until the job manager has removed it from the cluster, then it is gone."""
    return endpoint_service.close_endpoint(db.session, principal(), job_id, endpoint_id)


@blp.route("/jobs/<int(max=4611686018427387904):job_id>/log")
@blp.arguments(LogArgs, location="query")
@blp.response(200, LogSchema)
@blp.doc(security=[{"bearer": []}])
def job_log(args, job_id: int):
    """A slice of an attempt's log (follow with next_offset), or the whole log with download=1
    (rotated parts in order, a line where the middle was dropped)."""
    settings = settings_of(current_app)
    if args["download"]:
        _job, number, chunks = job_service.download_log(db.session, settings, principal(), job_id, args.get("attempt"))
        return Response(stream_with_context(chunks), mimetype="text/plain",
                        headers={"Content-Disposition": f'attachment; filename="job-{job_id}-attempt-{number}.log"'})
    read = job_service.read_log(db.session, settings, principal(), job_id, args.get("attempt"),
                                args["offset"], args["limit"])
    return {"job_id": read.job.id, "attempt": read.attempt, "offset": read.offset, "next_offset": read.next_offset,
            "size": read.size, "data": read.data.decode("utf-8", errors="replace"), "complete": read.complete}
