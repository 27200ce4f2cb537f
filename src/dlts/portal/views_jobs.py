"""Jobs pages: the list (filters, keyset pages, chosen columns, batch actions), details with the log
viewer and endpoints, the submit form with templates, and the single-job actions."""

from __future__ import annotations

import secrets

from flask import (
    Response,
    abort,
    current_app,
    flash,
    jsonify,
    redirect,
    render_template,
    request,
    stream_with_context,
    url_for,
)

from dlts.errors import DltsError, InvalidInput
from dlts.extensions import db, settings_of
from dlts.models import (
    TERMINAL,
    JobStatus,
)
from dlts.portal import charts, forms
from dlts.portal.core import back, bp, flash_error, login_required, principal
from dlts.services import accounting, job_keeping, job_templates, portal_auth
from dlts.services import cluster as cluster_service
from dlts.services import endpoints as endpoint_service
from dlts.services import jobs as job_service
from dlts.services.jobs import JOB_TYPES
from dlts.strict import is_whole_number, whole_number, whole_number_or_none

S = JobStatus
PAGE_SIZE = 50
# column id -> header; "status" and "id" are always shown
COLUMNS = {
    "name": "Name", "user": "User", "vc": "VC", "type": "Type", "queue": "Queue #", "estimate": "Est. start", "gpus": "GPUs",
    "sku": "SKU", "preemptible": "Preemptible", "priority": "Priority", "submitted": "Submitted",
    "started": "Started", "finished": "Finished", "timeout": "Time left",
}
DEFAULT_COLUMNS = ("name", "user", "vc", "queue", "estimate", "gpus", "preemptible", "submitted", "started", "finished", "timeout")
STATUS_GROUPS = {"active": [S.UNAPPROVED, S.QUEUED, S.SCHEDULING, S.RUNNING, S.PAUSING, S.PAUSED, S.KILLING],
                 "waiting": [S.UNAPPROVED, S.QUEUED], "ended": sorted(TERMINAL, key=lambda s: s.value)}
ACTIONS = job_service.BATCH_ACTIONS
MAX_BATCH = 200
LOG_CHUNK_BYTES = 256 * 1024  # per read of the log viewer; the viewer starts this far before the end


def _columns() -> list[str]:
    chosen = portal_auth.preferences(db.session(), principal()).get("job_columns")
    if not isinstance(chosen, list):
        return list(DEFAULT_COLUMNS)
    return [c for c in COLUMNS if c in chosen]


@bp.route("/jobs")
@login_required
def jobs():
    who = principal()
    args = request.args
    scope = args.get("scope", "mine")
    if scope not in ("mine", "vc", "all") or (scope == "all" and not who.is_cluster_admin):
        scope = "mine"
    status = args.get("status", "")
    statuses: list[JobStatus] = []
    if status in STATUS_GROUPS:
        statuses = STATUS_GROUPS[status]
    elif status:
        try:
            statuses = [JobStatus(status)]
        except ValueError:
            flash(f"Unknown status {status[:20]!r}; showing all.", "error")
            status = ""
    job_type = args.get("type") if args.get("type") in JOB_TYPES else None
    oldest_first = args.get("order") == "oldest"
    archived = {"true": "true", "all": "all"}.get(args.get("archived") or "", "false")
    favourite = args.get("favourite") == "true"
    tag = (args.get("tag") or "").strip().lower()
    if tag and not job_service.TAG_PATTERN.match(tag):
        flash(f"{tag[:40]!r} is not a tag ({job_service.TAG_RULE}); showing every tag.", "error")
        tag = ""
    cursor = args.get("cursor")
    try:
        boundary = job_service.decode_cursor(cursor) if cursor else None  # ASCII digits up to 2**62, or InvalidInput
    except InvalidInput as exc:
        flash_error(exc)
        boundary = None
    page = job_service.list_jobs(db.session(), who, job_service.JobFilter(
        scope=scope, vc=args.get("vc") or None, user=args.get("user") or None, statuses=tuple(statuses),
        job_type=job_type, before=boundary, oldest_first=oldest_first, limit=PAGE_SIZE, tag=tag or None,
        favourite=favourite, archived=archived))
    items = [(i.job, i.visibility, i.time_left_s) for i in page.items]
    tags = {i.job.id: i.tags for i in page.items if i.tags}
    starred = {i.job.id for i in page.items if i.favourite}
    next_cursor = page.next_cursor
    filters = {k: v for k, v in {"scope": scope, "status": status, "vc": args.get("vc", ""), "user": args.get("user", ""),
                                 "type": job_type or "", "order": "oldest" if oldest_first else "", "tag": tag,
                                 "favourite": "true" if favourite else "",
                                 "archived": archived if archived != "false" else ""}.items() if v}
    vc_names = job_service.vc_names_for(db.session(), who)
    return render_template("jobs.html", items=items, columns=_columns(), all_columns=COLUMNS, filters=filters,
                           scope=scope, next_cursor=next_cursor, first_page=cursor is None, statuses=list(JobStatus),
                           status_groups=STATUS_GROUPS, job_types=JOB_TYPES, vc_names=vc_names, oldest_first=oldest_first,
                           tags=tags, starred=starred)


@bp.route("/jobs/columns", methods=["POST"])
@login_required
def job_columns():
    chosen = [c for c in request.form.getlist("columns") if c in COLUMNS]
    portal_auth.save_preference(db.session(), principal(), "job_columns", chosen)
    return back("portal.jobs")


@bp.route("/jobs/batch", methods=["POST"])
@login_required
def jobs_batch():
    """Step 1 (no ``confirm``): list the chosen jobs and ask. Step 2: act on each, report each result."""
    action = request.form.get("action", "")
    if action not in ACTIONS:
        flash("Choose an action: kill, pause, resume or approve.", "error")
        return back("portal.jobs")
    ids = sorted({int(i) for i in request.form.getlist("ids") if is_whole_number(i)})[:MAX_BATCH]
    if not ids:
        flash("Tick the jobs to act on first.", "error")
        return back("portal.jobs")
    who = principal()
    if not request.form.get("confirm"):
        listed = job_service.visible_jobs(db.session(), who, ids)
        return render_template("batch_confirm.html", action=action, listed=listed, next=request.form.get("next", ""))
    results = [(r.id, r.ok, f"now {r.status}" if r.ok else r.message)
               for r in job_service.batch(db.session(), who, action, ids)]
    return render_template("batch_result.html", action=action, results=results, next=request.form.get("next", ""))


# -- one job --------------------------------------------------------------------------------------

@bp.route("/jobs/<int(max=4611686018427387904):job_id>")
@login_required
def job(job_id: int):
    return _job_page(job_id)


def _job_page(job_id: int, new_token: dict | None = None, status: int = 200):
    """The job page; ``new_token``: a Jupyter / VS Code password just made, shown on this response only
    (it is never stored in the clear, nor put in the session cookie)."""
    who = principal()
    view = job_service.detail(db.session(), who, job_id, events=200)
    job, full, attempts, events, endpoints = view.job, view.full, view.attempts, view.events, view.endpoints
    current = view.current_attempt
    vc_admin = who.is_vc_admin(job.vc.name)
    actions = list(view.actions)
    # the owner is told before asking for ssh that nobody could log in without a key
    no_ssh_key = job_service.owner_lacks_ssh_key(db.session(), who, job, endpoints)
    utilisation = _utilisation_charts(job.id, who) if full and current is not None and current.started_at else None
    insights = view.insights
    rights = view.rights
    keeping = {"tags": view.tags, "favourite": view.favourite,
               "can_archive": rights.archive, "can_delete": rights.delete, "can_tag": rights.tag, "can_clone": rights.clone}
    response = current_app.make_response((render_template(
        "job.html", job=job, full=full, attempts=attempts, events=events, placements=view.placements, actions=actions,
        utilisation=utilisation, insights=insights, idle_exempt=bool((job.spec or {}).get("idle_exempt")),
        messages=[e for e in events if e.kind in job_service.MESSAGE_KINDS], vc_admin=vc_admin,
        can_patch=rights.patch,
        time_left_s=job_service.time_left_s(job, job.vc.max_job_time_s), ended=job.status in TERMINAL,
        endpoints=endpoints, can_open_endpoint=rights.open_endpoint, endpoint_kinds=endpoint_service.KINDS,
        no_ssh_key=no_ssh_key, new_token=new_token, keeping=keeping), status))
    if new_token:
        response.headers["Cache-Control"] = "no-store"  # the password must not linger in a cache
    return response


def _utilisation_charts(job_id: int, who) -> dict | None:
    """The current attempt's minutes as four line charts; None when no agent sampled it."""
    history = accounting.utilisation(db.session(), who, job_id)
    if not history.points:
        return None
    t0 = history.points[0]["at"]
    series: dict[tuple[str, int], list] = {}
    for p in history.points:
        for g in p["gpus"]:
            series.setdefault((g["node"], g["index"]), [])
    util, memory = [], []
    for i, key in enumerate(sorted(series)):
        label = f"{key[0]} GPU {key[1]}"
        by_minute = [((p["at"] - t0).total_seconds(), next((g for g in p["gpus"] if (g["node"], g["index"]) == key), None))
                     for p in history.points]
        util.append((f"s{i % 8}", label, [(x, g["utilization_ratio"] * 100 if g and g["utilization_ratio"] is not None else None)
                                          for x, g in by_minute]))
        memory.append((f"s{i % 8}", label, [(x, g["memory_used_bytes"] / 2**30 if g and g["memory_used_bytes"] is not None else None)
                                            for x, g in by_minute]))
    xs = [(p["at"] - t0).total_seconds() for p in history.points]
    first, last = history.points[0]["at"].strftime("%H:%M"), history.points[-1]["at"].strftime("%H:%M")
    cpu = [("s0", "CPU cores", [(x, p["cpu_cores"]) for x, p in zip(xs, history.points)])]
    host = [("s1", "host memory", [(x, p["memory_bytes"] / 2**30 if p["memory_bytes"] is not None else None)
                                   for x, p in zip(xs, history.points)])]
    return {"attempt": history.attempt, "points": len(history.points),
            "charts": [("GPU utilisation", charts.line_chart(util, unit="%", y_max=100.0, first=first, last=last)),
                       ("GPU memory", charts.line_chart(memory, unit="GiB", first=first, last=last)),
                       ("CPU", charts.line_chart(cpu, unit="cores", first=first, last=last)),
                       ("Host memory", charts.line_chart(host, unit="GiB", first=first, last=last))]}


@bp.route("/jobs/<int(max=4611686018427387904):job_id>/endpoints", methods=["POST"])
@login_required
def open_endpoint(job_id: int):
    """Open an endpoint via services.endpoints. A Jupyter / VS Code password is shown on the job page
    rendered as this POST's answer (no redirect): it exists only in this response."""
    body, error = forms.parse_endpoint(request.form)
    if body is None:
        flash(error or "Choose a kind of endpoint.", "error")
        return redirect(url_for("portal.job", job_id=job_id))
    try:
        view, token = endpoint_service.open_endpoint(db.session(), principal(), job_id, body["kind"], body.get("port"),
                                                     body.get("name"))
    except DltsError as exc:
        if exc.http_status == 404:
            raise
        flash_error(exc)
        return redirect(url_for("portal.job", job_id=job_id))
    flash(f"Endpoint {view.name} ({view.kind}, port {view.port}) asked for; it is {view.status} until the job manager "
          "has opened it for the running job.", "ok")
    if token:
        return _job_page(job_id, {"endpoint_id": view.id, "name": view.name, "kind": view.kind, "token": token})
    return redirect(url_for("portal.job", job_id=job_id))


@bp.route("/jobs/<int(max=4611686018427387904):job_id>/endpoints/<int(max=4611686018427387904):endpoint_id>/close",
          methods=["POST"])
@login_required
def close_endpoint(job_id: int, endpoint_id: int):
    try:
        view = endpoint_service.close_endpoint(db.session(), principal(), job_id, endpoint_id)
        flash(f"Endpoint {view.name} is closing; it disappears once the job manager has removed it.", "ok")
    except DltsError as exc:
        if exc.code == "job_not_found":
            raise
        flash_error(exc)  # an endpoint already gone (closed twice) is said on the job page
    return redirect(url_for("portal.job", job_id=job_id))


@bp.route("/jobs/<int(max=4611686018427387904):job_id>/favourite", methods=["POST"])
@login_required
def job_favourite(job_id: int):
    on = request.form.get("on") == "1"
    job_keeping.set_favourite(db.session(), principal(), job_id, on)  # 404 outside the job's VC
    flash(f"Job {job_id} {'starred' if on else 'unstarred'}.", "ok")
    return back("portal.job", job_id=job_id)


@bp.route("/jobs/<int(max=4611686018427387904):job_id>/tags", methods=["POST"])
@login_required
def job_tags(job_id: int):
    text = request.form.get("tags", "")
    try:
        tags = job_keeping.set_tags(db.session(), principal(), job_id, text.replace(",", " ").split()[:100])
        flash(f"Job {job_id}: tags {', '.join(tags) or 'removed'}.", "ok")
    except DltsError as exc:
        if exc.http_status == 404:
            raise
        flash_error(exc)
    return redirect(url_for("portal.job", job_id=job_id))


@bp.route("/jobs/<int(max=4611686018427387904):job_id>/archive", methods=["POST"], endpoint="job_archive")
@bp.route("/jobs/<int(max=4611686018427387904):job_id>/unarchive", methods=["POST"], endpoint="job_unarchive")
@login_required
def job_archive(job_id: int):
    archived = request.endpoint == "portal.job_archive"
    try:
        job_keeping.set_archived(db.session(), principal(), job_id, archived)
        flash(f"Job {job_id} archived: the job lists show it under Archived." if archived else f"Job {job_id} unarchived.", "ok")
    except DltsError as exc:
        if exc.http_status == 404:
            raise
        flash_error(exc)
    return redirect(url_for("portal.job", job_id=job_id))


@bp.route("/jobs/<int(max=4611686018427387904):job_id>/delete", methods=["POST"])
@login_required
def job_delete(job_id: int):
    try:
        job_keeping.delete(db.session(), settings_of(current_app), principal(), job_id)
    except DltsError as exc:
        if exc.http_status == 404:
            raise
        flash_error(exc)
        return redirect(url_for("portal.job", job_id=job_id))
    flash(f"Job {job_id} deleted with its history and logs; its GPU time stays in the usage reports.", "ok")
    return redirect(url_for("portal.jobs"))


@bp.route("/jobs/<int(max=4611686018427387904):job_id>/<action>", methods=["POST"])
@login_required
def job_action(job_id: int, action: str):
    if action not in ACTIONS:
        abort(404)
    try:
        job = ACTIONS[action](db.session(), principal(), job_id)
        flash(f"Job {job_id}: {action} requested; it is now {job.status.value}.", "ok")
    except DltsError as exc:
        if exc.http_status == 404:
            raise
        flash_error(exc)
    return back("portal.job", job_id=job_id)


@bp.route("/jobs/<int(max=4611686018427387904):job_id>/settings", methods=["POST"])
@login_required
def job_settings(job_id: int):
    """Change priority / max time (owner within member limits, VC admin beyond), via the jobs service."""
    try:
        priority = request.form.get("priority", "").strip()
        hours = request.form.get("max_time_h", "").strip()
        changes: dict[str, int] = {}
        if priority:
            changes["priority"] = whole_number(priority, "priority", min_value=1, max_value=1000,
                                               message="Priority is a whole number between 1 and 1000.")
        if hours:
            changes["max_time_s"] = forms.hours_to_s(hours)
        job_service.patch(db.session(), principal(), job_id, changes)
        flash(f"Job {job_id} updated; the scheduler uses the new values from its next pass.", "ok")
    except ValueError:
        flash("Priority is a whole number and max time a number of hours.", "error")
    except DltsError as exc:
        if exc.http_status == 404:
            raise
        flash_error(exc)
    return redirect(url_for("portal.job", job_id=job_id))


@bp.route("/jobs/<int(max=4611686018427387904):job_id>/idle-exempt", methods=["POST"])
@login_required
def job_idle_exempt(job_id: int):
    """Exempt the job from its VC's idle-job policy, or lift the exemption (VC admins), via the jobs service."""
    exempt = request.form.get("exempt") == "1"
    try:
        job_service.patch(db.session(), principal(), job_id, {"idle_exempt": exempt})
        flash(f"Job {job_id} is {'now exempt from' if exempt else 'again under'} the VC's idle-job policy.", "ok")
    except DltsError as exc:
        if exc.http_status == 404:
            raise
        flash_error(exc)
    return redirect(url_for("portal.job", job_id=job_id))


@bp.route("/jobs/<int(max=4611686018427387904):job_id>/log.json")
@login_required
def job_log(job_id: int):
    """A slice of an attempt's log for the viewer (JSON; the same rules as the API).

    ``tail=N`` starts N bytes before the end (the viewer's first read: a huge log is downloaded, not
    put into the page); ``offset`` continues from there. ``latest_attempt`` lets the viewer move on
    to the next attempt when the job is retried.
    """
    try:
        offset = whole_number_or_none(request.args.get("offset"), "offset", max_value=2**50) or 0
        tail = whole_number_or_none(request.args.get("tail"), "tail", max_value=2**50)
        tail = min(tail, LOG_CHUNK_BYTES) if tail is not None else None
        attempt = whole_number_or_none(request.args.get("attempt"), "attempt", min_value=1, max_value=10000)
    except InvalidInput:
        return jsonify({"error": "offset, tail and attempt are whole numbers"}), 400
    settings = settings_of(current_app)
    try:
        if tail is not None:
            offset = max(0, job_service.read_log(db.session(), settings, principal(), job_id, attempt, 0, 0).size - tail)
        read = job_service.read_log(db.session(), settings, principal(), job_id, attempt, offset, LOG_CHUNK_BYTES)
    except DltsError as exc:
        return jsonify({"error": exc.message}), exc.http_status
    return jsonify({"attempt": read.attempt, "latest_attempt": read.job.attempt, "offset": offset,
                    "data": read.data.decode("utf-8", errors="replace"), "next_offset": read.next_offset,
                    "size": read.size, "status": read.job.status.value, "complete": read.complete})


@bp.route("/jobs/<int(max=4611686018427387904):job_id>/log")
@login_required
def job_log_download(job_id: int):
    """The attempt's whole log as a file, streamed."""
    attempt = request.args.get("attempt", "")
    try:
        job, number, chunks = job_service.download_log(db.session(), settings_of(current_app), principal(), job_id,
                                                       int(attempt) if is_whole_number(attempt, max_value=10000) else None)
    except InvalidInput as exc:
        if exc.code != "no_log":
            raise
        flash(exc.message, "error")
        return redirect(url_for("portal.job", job_id=job_id))
    return Response(stream_with_context(chunks), mimetype="text/plain",
                    headers={"Content-Disposition": f'attachment; filename="job-{job.id}-attempt-{number}.log"'})


# -- submit ---------------------------------------------------------------------------------------

def _submit_context(form: forms.SubmitForm) -> dict:
    who = principal()
    vc_names = job_service.vc_names_for(db.session(), who)
    vc_name = form.values.get("vc") or (vc_names[0] if vc_names else "")
    shapes = cluster_service.sku_shapes(db.session())
    status = cluster_service.status(db.session(), who)
    # what each of the user's VCs has left per SKU, so they can pick a size that starts now
    remaining: dict[str, dict[str, tuple[int, int]]] = {}
    for vc_status in status.vcs:
        if vc_status.vc in vc_names:
            remaining[vc_status.vc] = {sku: (quota, quota - vc_status.gpus_used.get(sku, 0))
                                       for sku, quota in sorted(vc_status.quota.items())}
    return {"form": form, "vc_names": vc_names, "vc_name": vc_name, "shapes": shapes, "sku_status": status.skus,
            "remaining": remaining, "job_types": JOB_TYPES,
            "templates": job_templates.visible_templates(db.session(), who),
            "defaults": settings_of(current_app)}


@bp.route("/submit", methods=["GET", "POST"])
@login_required
def submit():
    who = principal()
    if request.method == "GET":
        values = forms.form_values({})
        if request.args.get("from"):  # clone / resubmit: the job's own spec
            source = whole_number(request.args["from"], "from", min_value=1, message="from is not the id of a job.")
            values = forms.job_values(job_keeping.spec(db.session(), who, source))
            flash(f"The form holds job {source}'s spec; change what you like and submit.", "info")
        elif request.args.get("template"):
            template = job_templates.get_template(db.session(), who, whole_number(
                request.args["template"], "template", min_value=1, message="template is not the id of a template."))
            values = forms.spec_values(template.spec)
            flash(f"Loaded template {template.name}.", "info")
        elif request.args.get("vc"):
            values["vc"] = request.args["vc"]
        values["type"] = values.get("type") or "batch"
        values["idempotency_key"] = secrets.token_urlsafe(18)
        return render_template("submit.html", **_submit_context(forms.SubmitForm(values)))
    form, req = forms.parse(request.form)
    if request.form.get("save_template"):
        try:
            template = job_templates.save_template(db.session(), who, request.form.get("template_name", ""),
                                                   forms.template_spec(form.values),
                                                   form.values["vc"] if request.form.get("share") else None)
            flash(f"Saved template {template.name}" + (f", shared with VC {form.values['vc']}." if template.vc_id else "."), "ok")
        except DltsError as exc:
            form.errors["template_name"] = exc.message
        return render_template("submit.html", **_submit_context(form)), 400 if form.errors.get("template_name") else 200
    if req is None:
        return render_template("submit.html", **_submit_context(form)), 400
    key = form.values["idempotency_key"] or None
    try:
        job, replayed = job_keeping.submit(db.session(), settings_of(current_app), who, req, key)
    except DltsError as exc:
        if exc.code in ("idempotency_key_reused", "invalid_idempotency_key"):
            # this form was sent before with other values: a fresh key makes the next press a new job
            form.values["idempotency_key"] = secrets.token_urlsafe(18)
            job_id = exc.details.get("job_id")
            form.add_error("_form", f"This form was already submitted as job {job_id}; press Submit again to make "
                           "another job with these values." if job_id else "This form expired; press Submit again.")
        else:
            form.add_error(str(exc.details.get("field", "_form")), exc.message)
        return render_template("submit.html", **_submit_context(form)), exc.http_status
    if replayed:
        flash(f"This form was already submitted: job {job.id} (it is {job.status.value}); no second job was made.", "info")
        return redirect(url_for("portal.job", job_id=job.id))
    flash(f"Job {job.id} submitted; it is {job.status.value}.", "ok")
    return redirect(url_for("portal.job", job_id=job.id))


@bp.route("/templates/<int(max=4611686018427387904):template_id>/delete", methods=["POST"])
@login_required
def delete_template(template_id: int):
    try:
        job_templates.delete_template(db.session(), principal(), template_id)
        flash("Template deleted.", "ok")
    except DltsError as exc:
        flash_error(exc)
    return redirect(url_for("portal.submit"))
