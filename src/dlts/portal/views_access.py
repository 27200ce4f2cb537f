"""My SSH keys and My allowed IPs (the user's own entries; the services enforce who may do what)."""

from __future__ import annotations

import datetime as dt

from flask import current_app, flash, redirect, render_template, request, url_for

from dlts.errors import DltsError
from dlts.extensions import db, settings_of
from dlts.models import utcnow
from dlts.portal.core import bp, flash_error, login_required, principal
from dlts.services import allowed_ips as ip_service
from dlts.services import ssh_keys as key_service

EXPIRES_SOON = dt.timedelta(days=3)


@bp.route("/ssh-keys", methods=["GET", "POST"])
@login_required
def ssh_keys():
    errors: dict[str, str] = {}
    status = 200
    if request.method == "POST":
        try:
            key = key_service.add_key(db.session(), principal(), request.form.get("public_key", ""),
                                      request.form.get("name", "").strip() or None)
            flash(f"Key {key.name} added ({key.fingerprint}); jobs started from now on accept it.", "ok")
            return redirect(url_for("portal.ssh_keys"))
        except DltsError as exc:
            errors[str(exc.details.get("field", "public_key"))] = exc.message
            status = exc.http_status
    return render_template("ssh_keys.html", keys=key_service.list_keys(db.session(), principal()), errors=errors,
                           form=request.form), status


@bp.route("/ssh-keys/<int(max=4611686018427387904):key_id>/delete", methods=["POST"])
@login_required
def delete_ssh_key(key_id: int):
    try:
        key_service.delete_key(db.session(), principal(), key_id)
        flash("Key deleted; jobs started from now on no longer accept it.", "ok")
    except DltsError as exc:
        flash_error(exc)
    return redirect(url_for("portal.ssh_keys"))


@bp.route("/allowed-ips", methods=["GET", "POST"])
@login_required
def allowed_ips():
    settings = settings_of(current_app)
    errors: dict[str, str] = {}
    status = 200
    if request.method == "POST":
        ip = (request.remote_addr or "") if request.form.get("mine") else request.form.get("ip", "")
        try:
            entry = ip_service.add_entry(db.session(), settings, principal(), ip)
            flash(f"{entry.cidr} {'renewed' if entry.renewed else 'added'}; it expires {(entry.expires_at or '')[:10]}.", "ok")
            return redirect(url_for("portal.allowed_ips"))
        except DltsError as exc:
            errors["ip"] = exc.message
            status = exc.http_status
    now = utcnow()
    entries = []
    for entry in ip_service.list_entries(db.session(), principal()):
        expires = dt.datetime.fromisoformat(entry.expires_at.rstrip("Z")) if entry.expires_at else None
        entries.append((entry, expires, expires is not None and expires - now <= EXPIRES_SOON))
    return render_template("allowed_ips.html", entries=entries, errors=errors, your_ip=request.remote_addr,
                           days=settings.allow_ip_days, form=request.form), status


@bp.route("/allowed-ips/<int(max=4611686018427387904):entry_id>/delete", methods=["POST"])
@login_required
def delete_allowed_ip(entry_id: int):
    try:
        ip_service.delete_entry(db.session(), principal(), entry_id)
        flash("Address removed from your allowed IPs.", "ok")
    except DltsError as exc:
        flash_error(exc)
    return redirect(url_for("portal.allowed_ips"))
