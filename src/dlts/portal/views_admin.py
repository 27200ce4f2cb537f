"""Administration pages: a VC's members (its admins), and for cluster admins Users, Groups and VCs
(create, delete). The same services as /api/v1/users, /groups and /vcs/{name}/members decide who may do
what; pages only cluster admins may use answer 404 to everybody else (``admin_only_404``), and the
members page 403 to plain members of the VC (404 outside it)."""

from __future__ import annotations

from flask import current_app, flash, redirect, render_template, request, url_for

from dlts.errors import DltsError, InvalidInput
from dlts.extensions import db, settings_of
from dlts.portal.core import admin_only_404, bp, flash_error, login_required, principal
from dlts.services import admin as admin_service
from dlts.services import groups as group_service
from dlts.services import members as member_service
from dlts.services import users as user_service
from dlts.services import vcs as vc_service
from dlts.strict import whole_number_or_none


def _form(name: str, limit: int = 1000) -> str:
    # bounded, never cut to fit: a name longer than the rules allow is refused by the service, not shortened
    return (request.form.get(name) or "").strip()[:limit]


def _id_field(name: str) -> int | None:
    return whole_number_or_none(request.form.get(name), name, max_value=2**31 - 1,
                                message=f"{name} must be a whole number (1000 or more), or empty for none.")


# -- members of a VC (its admins) ------------------------------------------------------------------------

@bp.route("/vcs/<name>/members", methods=["GET", "POST"])
@login_required
def vc_members(name: str):
    who = principal()
    view = vc_service.get_vc(db.session(), settings_of(current_app), who, name)  # 404 outside the VC
    if not who.is_vc_admin(name):
        return render_template("error.html", status=403, title="Not allowed",
                               message=f"Only an admin of VC {name} may manage its members."), 403
    status = 200
    if request.method == "POST":
        action = request.form.get("action", "")
        user = _form("user")
        try:
            if action == "put":
                member, changed = member_service.put_member(db.session(), who, name, user, request.form.get("role", ""))
                flash(f"{member.user} is {'now ' if changed else 'already '}{'an admin' if member.role == 'admin' else 'a member'} "
                      f"of VC {name}.", "ok")
            elif action == "remove":
                result = member_service.remove_member(db.session(), who, name, user, request.form.get("queued", ""))
                said = [f"{result.user} removed from VC {name}" if result.removed else f"{result.user} had no membership of its own"]
                if result.still_member_via:
                    said.append(f"still a member through group {', '.join(result.still_member_via)}")
                if result.killed_jobs:
                    said.append(f"waiting jobs killed: {', '.join(map(str, result.killed_jobs))}")
                elif result.queued_jobs:
                    said.append(f"waiting jobs kept: {', '.join(map(str, result.queued_jobs))}")
                if result.running_jobs:
                    said.append(f"running jobs finish: {', '.join(map(str, result.running_jobs))}")
                flash("; ".join(said) + ".", "ok")
            else:
                raise InvalidInput("Unknown action.", details={"field": "action"})
            return redirect(url_for("portal.vc_members", name=name))
        except DltsError as exc:
            flash_error(exc)
            status = exc.http_status
    return render_template("vc_members.html", vc=view, tab="members", can_edit=True,
                           members=member_service.list_members(db.session(), who, name)), status


# -- users (cluster admins) --------------------------------------------------------------------------------

@bp.route("/admin/users", methods=["GET", "POST"])
@admin_only_404
def admin_users():
    who = principal()
    status, shown, errors = 200, None, {}
    if request.method == "POST":
        try:
            view, shown = user_service.create(db.session(), who, _form("name"), email=_form("email") or None,
                                              uid=_id_field("uid"), gid=_id_field("gid"),
                                              cluster_admin=request.form.get("cluster_admin") == "on",
                                              generate_password=True)
            flash(f"User {view.name} created.", "ok")
            status = 201
        except DltsError as exc:
            errors[str(exc.details.get("field", "name"))] = exc.message
            status = exc.http_status
    query = (request.args.get("q") or "").strip()[:64]
    rows = user_service.list_users(db.session(), who, limit=500, query=query or None)
    return render_template("admin_users.html", users=rows, q=query, shown=shown, errors=errors,
                           form=request.form if errors else None), status


@bp.route("/admin/users/<name>", methods=["GET", "POST"])
@admin_only_404
def admin_user(name: str):
    who = principal()
    status, password = 200, None
    if request.method == "POST":
        action = request.form.get("action", "")
        try:
            if action == "update":
                changes = {"email": _form("email") or None, "uid": _id_field("uid"), "gid": _id_field("gid"),
                           "cluster_admin": request.form.get("cluster_admin") == "on"}
                user_service.update(db.session(), who, name, changes)
                flash(f"User {name} saved.", "ok")
            elif action == "disable":
                disabled = user_service.disable(db.session(), who, name, _form("reason") or None)
                flash(f"User {name} disabled: {disabled.tokens_revoked} tokens revoked, {disabled.sessions_ended} portal "
                      f"sessions ended, {len(disabled.held_jobs)} waiting jobs held; running jobs run on.", "ok")
            elif action == "enable":
                enabled = user_service.enable(db.session(), who, name)
                flash(f"User {name} enabled; {len(enabled.released_jobs)} held jobs back in the queue. Revoked tokens "
                      "stay revoked.", "ok")
            elif action == "password":
                password = user_service.reset_password(db.session(), who, name).password
            else:
                raise InvalidInput("Unknown action.", details={"field": "action"})
            if password is None:
                return redirect(url_for("portal.admin_user", name=name))
        except DltsError as exc:
            flash_error(exc)
            status = exc.http_status
    view = user_service.get(db.session(), who, name)
    return render_template("admin_user.html", user=view, password=password), status


# -- groups (cluster admins) ---------------------------------------------------------------------------------

@bp.route("/admin/groups", methods=["GET", "POST"])
@admin_only_404
def admin_groups():
    who = principal()
    status = 200
    if request.method == "POST":
        try:
            group = group_service.create(db.session(), who, _form("name"))
            return redirect(url_for("portal.admin_group", name=group.name))
        except DltsError as exc:
            flash_error(exc)
            status = exc.http_status
    return render_template("admin_groups.html", groups=group_service.list_groups(db.session(), who, limit=500)), status


@bp.route("/admin/groups/<name>", methods=["GET", "POST"])
@admin_only_404
def admin_group(name: str):
    who = principal()
    status = 200
    if request.method == "POST":
        action = request.form.get("action", "")
        try:
            if action == "add":
                group_service.add_user(db.session(), who, name, _form("user"))
            elif action == "remove":
                group_service.remove_user(db.session(), who, name, _form("user"))
            elif action == "bind":
                group_service.put_vc_role(db.session(), who, name, _form("vc"), request.form.get("role", ""))
            elif action == "unbind":
                group_service.delete_vc_role(db.session(), who, name, _form("vc"))
            elif action == "delete":
                group_service.delete(db.session(), who, name)
                flash(f"Group {name} deleted.", "ok")
                return redirect(url_for("portal.admin_groups"))
            else:
                raise InvalidInput("Unknown action.", details={"field": "action"})
            flash(f"Group {name} saved.", "ok")
            return redirect(url_for("portal.admin_group", name=name))
        except DltsError as exc:
            flash_error(exc)
            status = exc.http_status
    group = group_service.get(db.session(), who, name)
    vcs = [v.name for v in vc_service.list_vcs(db.session(), settings_of(current_app), who)]
    return render_template("admin_group.html", group=group, vcs=vcs), status


# -- VCs: create and delete (cluster admins) --------------------------------------------------------------------

@bp.route("/admin/vcs", methods=["GET", "POST"])
@admin_only_404
def admin_vcs():
    who = principal()
    status, errors = 200, {}
    if request.method == "POST":
        action = request.form.get("action", "")
        try:
            if action == "create":
                quota = admin_service.parse_quota([q for q in _form("quota", 2000).replace(",", " ").split() if q])
                view = vc_service.create_vc(db.session(), settings_of(current_app), who, vc_service.VcSpec(name=_form("name"), quota=quota,
                                                                                policy=request.form.get("policy", "RF")))
                flash(f"VC {view.name} created; add its members on its Members tab.", "ok")
            elif action == "delete":
                vc_name = _form("vc")
                if _form("confirm") != vc_name:
                    raise InvalidInput(f"Type the VC's name ({vc_name}) to confirm the deletion.", details={"field": "confirm"})
                vc_service.delete_vc(db.session(), who, vc_name)
                flash(f"VC {vc_name} deleted.", "ok")
            else:
                raise InvalidInput("Unknown action.", details={"field": "action"})
            return redirect(url_for("portal.admin_vcs"))
        except DltsError as exc:
            field = str(exc.details.get("field", "_form")).split(".")[0]  # quota.a100: the quota box
            errors[field if field in ("name", "quota", "policy", "confirm") else "_form"] = exc.message
            status = exc.http_status
    return render_template("admin_vcs.html", vcs=vc_service.list_vcs(db.session(), settings_of(current_app), who), errors=errors,
                           form=request.form if errors else None), status
