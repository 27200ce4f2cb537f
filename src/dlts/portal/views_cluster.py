"""Cluster status, the VC page with its settings tab, the quota grid (cluster admins), storage, GPU hours."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

from flask import Response, abort, current_app, flash, redirect, render_template, request, url_for

from dlts.errors import DltsError, InvalidInput
from dlts.extensions import db, settings_of
from dlts.models import JobStatus, utcnow
from dlts.portal import charts, forms
from dlts.portal.core import admin_only_404, bp, flash_error, login_required, principal
from dlts.services import accounting, idle_gpus
from dlts.services import cluster as cluster_service
from dlts.services import nodes as node_service
from dlts.services import storage as storage_service
from dlts.services import vcs as vc_service
from dlts.strict import decimal, is_whole_number, whole_number_or_none

S = JobStatus
SETTING_HELP = {
    "policy": "RF lets a smaller job that fits start before a bigger one that waits; FIFO starts jobs strictly in "
              "submission order; backfill is RF that reserves room for the jobs at the head of the queue (from running "
              "jobs' time limits) and lets later jobs start only if they end in time or use other resources.",
    "max_job_time_s": "Jobs running longer than this are stopped; members may not ask for more.",
    "max_interactive_gpus": "Interactive jobs of the VC together may hold at most this many GPUs.",
    "user_gpu_quota": "A member holding more non-preemptible GPUs than this needs a VC admin to approve each further job.",
    "notice": "A banner every member of the VC sees on every page (empty: none).",
    "max_queued_jobs_per_user": "Jobs one member may have waiting (queued or unapproved) in the VC; 0: no limit; "
                                "empty: the cluster's default ({default}).",
    "max_submissions_per_minute": "Jobs one member may submit to the VC per minute; 0: no limit; empty: the cluster's "
                                  "default ({default}).",
    "fair_share": "On: the VC's waiting jobs are ordered by their users' GPU use of the last days (it decays with a "
                  "half-life), so the lightest user goes first; off: by priority and submission time. Default: "
                  "{default}.",
    "fair_share_max_wait_s": "Seconds after which fair share stops holding a job behind newer work of lighter users: "
                             "a job that has waited this long is ranked as if its owner had no recent use. Empty: the "
                             "default, {default}.",
    "limit_weight": "Shorter limits first: among jobs of equal priority each ranks as if submitted this many times its "
                    "time limit later (0.25: a 7-day job 42 hours later, a 1-hour job 15 minutes), so short jobs "
                    "pass long ones that have not waited much longer; 0: by submission time. Empty: the default, "
                    "{default}.",
    "min_runtime_s": "Seconds a preemptible job of the VC runs before reclaim may preempt it. Empty: the default, "
                     "{default}.",
    "max_reclaim_delay_s": "Seconds a job may wait for reclaim before the minimum runtime stops protecting the jobs it "
                           "would preempt. Empty: the default, {default}.",
    "max_preemptions": "Preemptions after which a job is protected for the minimum runtime of every later run, even "
                       "from a reclaim that waited too long; 0: no limit. Empty: the default, {default}.",
    "idle_policy": "When every GPU of a running job has been idle (at most 5% busy) for the warning time, its owner "
                   "gets a message and an e-mail; still idle the action time later, the job is paused or killed. "
                   "Off: no warnings; warn only: never paused or killed.",
}


def _idle_policy_from_form(current: dict | None) -> dict | None:
    """The form's idle-job policy: off (None), or the four keys (checked by the VC service)."""
    action = request.form.get("idle_action", "off")
    if action == "off":
        return None
    policy: dict = {"idle_action": action, "exempt_types": request.form.getlist("idle_exempt_types")}
    for key in ("idle_warn_min", "idle_action_min"):
        raw = request.form.get(key, "").strip()
        if not raw:
            policy[key] = (current or {}).get(key, vc_service.IDLE_POLICY_DEFAULTS[key])
            continue
        try:
            policy[key] = float(raw)
        except ValueError:
            raise InvalidInput(f"{key} is a number of minutes.", details={"field": f"idle_policy.{key}"}) from None
    return policy


@bp.route("/cluster")
@login_required
def cluster():
    who = principal()
    status = cluster_service.status(db.session(), who)
    nodes = node_service.list_nodes(db.session(), settings_of(current_app), who)
    return render_template("cluster.html", status=status, nodes=nodes, utilisation={n.name: assigned_utilisation(n) for n in nodes},
                           details=who.is_cluster_admin)


def assigned_utilisation(node: node_service.NodeView) -> float | None:
    """Mean utilisation of the node's GPUs that run a job, from the agent's last report (admins see metrics)."""
    gpus = node_service.reported_gpus((node.details or {}).get("metrics"))
    ratios = [g["utilization_ratio"] for g in gpus if g["job_id"] and g["utilization_ratio"] is not None]
    return sum(ratios) / len(ratios) if ratios else None


@bp.route("/nodes/<name>/<action>", methods=["POST"])
@admin_only_404
def node_action(name: str, action: str):
    actions = {"cordon": node_service.cordon, "uncordon": node_service.uncordon}
    if action not in actions:
        abort(404)
    try:
        node = actions[action](db.session(), settings_of(current_app), principal(), name)
        flash(f"Node {node.name} is now {'cordoned' if node.cordoned_by else 'uncordoned'}.", "ok")
    except DltsError as exc:
        flash_error(exc)
    return redirect(url_for("portal.cluster"))


# -- virtual clusters ---------------------------------------------------------------------------------

def _int_or_none(name: str, empty: str = "no limit", max_value: int = 1_000_000) -> int | None:
    return whole_number_or_none(request.form.get(name), name, max_value=max_value,
                                message=f"{name} must be a whole number (at most {max_value}), or empty for {empty}.")


def _scheduling_from_form() -> dict[str, Any]:
    """The form's scheduling settings (those it sent): empty is None, the default (dlts.yaml)."""
    changes: dict[str, Any] = {}
    if "fair_share" in request.form:
        choice = request.form["fair_share"]
        if choice not in ("", "on", "off"):
            raise InvalidInput("fair_share is on, off, or empty for the default.", details={"field": "fair_share"})
        changes["fair_share"] = None if choice == "" else choice == "on"
    for key, high in vc_service.SCHEDULING_LIMITS.items():
        if key in request.form:
            changes[key] = _int_or_none(key, "the default", high)
    if "limit_weight" in request.form:
        text = request.form["limit_weight"].strip()
        try:
            changes["limit_weight"] = None if text == "" else decimal(text)  # the service checks the range
        except ValueError:
            raise InvalidInput("limit_weight is a number (e.g. 0.25), or empty for the default.",
                               details={"field": "limit_weight"}) from None
    return changes


def _default_text(value: Any, source: str, key: str) -> str:
    if key == "fair_share":
        shown = "on" if value else "off"
    elif key == "max_preemptions":
        shown = str(value) if value else "no limit"
    elif key == "fair_share_max_wait_s":
        shown = "no bound" if value is None else f"{value:g} s"
    elif key == "limit_weight":
        shown = f"{value:g}"
    else:
        shown = "never" if value is None else f"{value:g} s"
    return f"{shown} ({'set in dlts.yaml' if source == 'config' else 'the cluster default'})"


@bp.route("/vcs/<name>", methods=["GET"])
@login_required
def vc(name: str):
    who = principal()
    view = vc_service.get_vc(db.session(), settings_of(current_app), who, name)
    running, waiting = vc_service.jobs_of_vc(db.session(), who, name)
    return render_template("vc.html", vc=view, running=running, waiting=waiting, tab="overview",
                           can_edit=who.is_vc_admin(name))


@bp.route("/vcs/<name>/settings", methods=["GET", "POST"])
@login_required
def vc_settings(name: str):
    who = principal()
    view = vc_service.get_vc(db.session(), settings_of(current_app), who, name)
    if not who.is_vc_admin(name):
        return render_template("error.html", status=403, title="Not allowed",
                               message=f"Only an admin of VC {name} may change its settings."), 403
    errors: dict[str, str] = {}
    status = 200
    if request.method == "POST":
        try:
            hours = request.form.get("max_job_time_h", "").strip()
            try:
                max_time_s = forms.hours_to_s(hours) if hours else None
            except ValueError:
                raise InvalidInput("Max job time is a number of hours (at most 8784), or empty for no limit.",
                                   details={"field": "max_job_time_s"}) from None
            changes: dict[str, Any] = {"policy": request.form.get("policy", ""), "max_job_time_s": max_time_s,
                       "max_interactive_gpus": _int_or_none("max_interactive_gpus"),
                       "user_gpu_quota": _int_or_none("user_gpu_quota"),
                       "notice": request.form.get("notice", "").strip() or None,
                       "max_queued_jobs_per_user": _int_or_none("max_queued_jobs_per_user", "the cluster's default"),
                       "max_submissions_per_minute": _int_or_none("max_submissions_per_minute", "the cluster's default")}
            if "idle_action" in request.form:
                changes["idle_policy"] = _idle_policy_from_form(view.idle_policy)
            changes.update(_scheduling_from_form())
            view = vc_service.update_vc(db.session(), settings_of(current_app), who, name, changes)
            flash(f"Settings of VC {name} saved; the scheduler uses them from its next pass.", "ok")
            return redirect(url_for("portal.vc_settings", name=name))
        except DltsError as exc:
            errors[str(exc.details.get("field", "_form"))] = exc.message
            status = exc.http_status
    settings = settings_of(current_app)
    defaults: dict[str, Any] = {"max_queued_jobs_per_user": settings.max_queued_jobs_per_user,
                                "max_submissions_per_minute": settings.max_submissions_per_minute}
    # what an empty box means: the value the VC gets with the setting cleared
    for key, fallback in vc_service.scheduling_of(settings, name, {}).items():
        defaults[key] = _default_text(fallback.value, fallback.source, key)
    help_text = {k: v.format(default=defaults.get(k, "")) for k, v in SETTING_HELP.items()}
    return render_template("vc_settings.html", vc=view, tab="settings", can_edit=True, errors=errors,
                           help=help_text, form=request.form if request.method == "POST" else None), status


# -- quota admin (cluster admins only; 404 for everybody else) ----------------------------------------

@bp.route("/admin/quotas", methods=["GET", "POST"])
@admin_only_404
def quotas():
    who = principal()
    errors: list[str] = []
    if request.method == "POST":
        changed = 0
        on_form = set(request.form.getlist("vcs"))  # a VC created after the page was loaded is left alone
        for view in vc_service.list_vcs(db.session(), settings_of(current_app), who):
            if view.name not in on_form:
                continue
            quota: dict[str, int] = {}
            bad = False
            for key, raw in request.form.items():
                prefix = f"q:{view.name}:"
                if not key.startswith(prefix) or not raw.strip():
                    continue
                if not is_whole_number(raw.strip(), max_value=1_000_000):
                    errors.append(f"VC {view.name}, {key[len(prefix):]}: {raw[:20]!r} is not a whole number of GPUs.")
                    bad = True
                    continue
                if int(raw):
                    quota[key[len(prefix):]] = int(raw)
            if bad or quota == view.quota:
                continue
            try:
                vc_service.update_vc(db.session(), settings_of(current_app), who, view.name, {"quota": quota})
                changed += 1
            except DltsError as exc:
                errors.append(f"VC {view.name}: {exc.message}")
        if changed:
            flash(f"Quota of {changed} VC{'s' if changed != 1 else ''} saved.", "ok")
        if not errors:
            return redirect(url_for("portal.quotas"))
    status = cluster_service.status(db.session(), who)
    views = vc_service.list_vcs(db.session(), settings_of(current_app), who)
    # (SKU, GPUs in the cluster); a SKU some VC still has quota for but no node has is shown with 0
    skus = [(s.sku, s.gpus) for s in status.skus if s.gpus > 0]
    known = {sku for sku, _ in skus}
    skus += [(sku, 0) for sku in sorted({k for v in views for k in v.quota} - known)]
    totals = {sku: sum(v.quota.get(sku, 0) for v in views) for sku, _ in skus}
    return render_template("quotas.html", vcs=views, skus=skus, totals=totals, errors=errors), 400 if errors else 200


# -- storage and GPU hours ------------------------------------------------------------------------------

@bp.route("/storage")
@login_required
def storage():
    report = storage_service.last_scan(db.session(), principal())
    if request.args.get("format") == "csv":
        stamp = (report.scanned_at or "none").replace(":", "").replace("-", "")[:15]
        return Response(storage_service.to_csv(report), mimetype="text/csv",
                        headers={"Content-Disposition": f'attachment; filename="storage-usage-{stamp}.csv"'})
    # rows without a user are the totals of a VC (or of the mount); rows with a directory are the
    # top-level directories'
    totals = [r for r in report.rows if not r.user and r.directory is None]
    users = [r for r in report.rows if r.user and r.directory is None]
    directories = [r for r in report.rows if r.directory is not None]
    return render_template("storage.html", report=report, totals=totals, users=users, directories=directories,
                           scans=storage_service.latest_snapshots(db.session(), principal()))


@bp.route("/gpu-hours")
@login_required
def gpu_hours():
    """GPU hours booked, used and idle from the accounting rollup: the month by user and VC, and the
    twelve months up to it as a chart."""
    who = principal()
    today = utcnow().date()
    try:
        month = dt.datetime.strptime(request.args.get("month", today.strftime("%Y-%m")), "%Y-%m").date()
    except ValueError:
        flash("Month must look like 2026-11; showing this month.", "error")
        month = today.replace(day=1)
    scope = request.args.get("scope", "mine")
    if scope not in ("mine", "vc", "all") or (scope == "all" and not who.is_cluster_admin):
        scope = "mine"
    # "My VCs" of a cluster admin: the VCs they belong to, not all of them
    seer = replace(who, is_cluster_admin=False) if scope == "vc" and who.is_cluster_admin else who
    user = who.name if scope == "mine" else None
    last_day = (month.replace(day=28) + dt.timedelta(days=4)).replace(day=1) - dt.timedelta(days=1)
    query = accounting.UsageQuery(group_by=("user", "vc"), start=month, end=last_day, user=user)
    report = accounting.usage(db.session(), seer, query)
    if request.args.get("format") == "csv":
        return Response(accounting.to_csv(report), mimetype="text/csv",
                        headers={"Content-Disposition": f'attachment; filename="gpu-hours-{month:%Y-%m}.csv"'})
    year_start = (month.replace(day=1) - dt.timedelta(days=335)).replace(day=1)
    months = accounting.usage(db.session(), seer, accounting.UsageQuery(group_by=("month",), start=year_start,
                                                                      end=last_day, user=user))
    by_month = {r.keys["month"]: r.as_json() for r in months.rows}
    labels, cursor = [], year_start
    while cursor <= month:
        labels.append(cursor.strftime("%Y-%m"))
        cursor = (cursor + dt.timedelta(days=32)).replace(day=1)
    bars = [(m, [("busy", by_month.get(m, {}).get("busy_gpu_hours", 0.0), "used"),
                 ("idle", by_month.get(m, {}).get("idle_gpu_hours", 0.0), "idle"),
                 ("unmeasured", by_month.get(m, {}).get("unmeasured_gpu_hours", 0.0), "not measured")])
            for m in labels]
    chart = charts.stacked_bars(bars, "GPU h") if by_month else None
    rows = [r.as_json() for r in report.rows]
    total = {k: sum(r[k] for r in rows) for k in ("gpu_hours", "busy_gpu_hours", "idle_gpu_hours",
                                                    "unmeasured_gpu_hours", "preemptible_gpu_hours")}
    vcs = None if scope == "all" else who.vcs
    idle = idle_gpus.idle_gpus_now(db.session(), vc_names=vcs)
    if idle is not None and scope == "mine":
        idle = [r for r in idle if r.user == who.name]
    return render_template("gpu_hours.html", rows=rows, total=total, month=month.strftime("%Y-%m"), idle=idle,
                           scope=scope, idle_threshold=idle_gpus.IDLE_UTILISATION, chart=chart,
                           months=[(m, by_month.get(m)) for m in labels])
