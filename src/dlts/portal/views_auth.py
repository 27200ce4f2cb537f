"""Login, logout and the "My API tokens" page."""

from __future__ import annotations

from flask import (
    current_app,
    flash,
    jsonify,
    redirect,
    render_template,
    request,
    session,
    url_for,
)

from dlts.errors import DltsError, RateLimited, Unauthenticated
from dlts.extensions import db
from dlts.portal.core import (
    SESSION_ID,
    SESSION_LIFETIME,
    bp,
    flash_error,
    login_limits,
    login_required,
    principal,
    safe_local_path,
)
from dlts.services import portal_auth
from dlts.services import tokens as tokens_service
from dlts.services.portal_auth import TooManyAttempts
from dlts.strict import whole_number_or_none


def _safe_next(target: str | None) -> str:
    return safe_local_path(target) or url_for("portal.jobs")


@bp.route("/")
def home():
    if principal() is None:
        return redirect(url_for("portal.login"))
    return redirect(url_for("portal.jobs"))


def _wants_json() -> bool:
    return request.accept_mimetypes.best_match(["text/html", "application/json"]) == "application/json"


def _refused(exc: DltsError, next_url: str | None, user_name: str):
    """The login page again with the reason; a client that asks for JSON gets the API's error envelope."""
    if _wants_json():
        response = jsonify(exc.envelope())
        response.status_code = exc.http_status
    else:
        response = current_app.make_response((render_template("login.html", next=next_url, user_name=user_name,
                                                              error=exc.message), exc.http_status))
    if isinstance(exc, RateLimited):
        response.headers["Retry-After"] = str(exc.retry_after_s)
    return response


@bp.route("/login", methods=["GET", "POST"])
def login():
    if not current_app.secret_key:
        return render_template("error.html", status=503, title="Portal not configured",
                               message="The portal needs secret_key in dlts.yaml (or DLTS_SECRET_KEY) to sign session cookies."), 503
    next_url = request.values.get("next")
    if request.method == "GET":
        if principal() is not None:
            return redirect(_safe_next(next_url))
        return render_template("login.html", next=next_url, user_name="")
    user_name = request.form.get("username", "").strip()[:64]
    password = request.form.get("password", "")
    try:
        who = portal_auth.login(db.session(), login_limits(), user_name, password, request.remote_addr)
    except (TooManyAttempts, Unauthenticated) as exc:
        return _refused(exc, next_url, user_name)
    session_id = portal_auth.start_session(db.session(), who, SESSION_LIFETIME)
    session.clear()  # a fresh session on login: no fixation of a cookie set before it
    session[SESSION_ID] = session_id
    session.permanent = True
    return redirect(_safe_next(next_url))


@bp.route("/logout", methods=["POST"])
def logout():
    portal_auth.end_session(db.session(), session.get(SESSION_ID))
    session.clear()
    flash("You are logged out.", "info")
    return redirect(url_for("portal.login"))


@bp.route("/tokens", methods=["GET", "POST"])
@login_required
def tokens():
    new_token = None
    status = 200
    if request.method == "POST":
        days = request.form.get("expires_days", "").strip()
        try:
            expires_days = whole_number_or_none(days, "expires_days", min_value=1, max_value=3650,
                                                message="Expiry must be a whole number of days (1 to 3650), or empty.")
            new_token = tokens_service.create_token(db.session(), principal(), request.form.get("name", "").strip(),
                                                    expires_days).token
        except DltsError as exc:
            flash_error(exc)
            status = exc.http_status
    rows = portal_auth.list_tokens(db.session(), principal())
    # shown once, on this response only; the page must not be cached by the browser
    response = current_app.make_response((render_template("tokens.html", tokens=rows, new_token=new_token), status))
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.route("/tokens/<int(max=4611686018427387904):token_id>/revoke", methods=["POST"])
@login_required
def revoke_token(token_id: int):
    token = tokens_service.revoke_token(db.session(), principal(), token_id)
    flash(f"Token {token.name} ({token.prefix}...) revoked; programs using it now get 401.", "info")
    return redirect(url_for("portal.tokens"))
