"""The portal blueprint and what every page shares: the logged-in principal, CSRF, errors, filters.

Sessions are server-side rows (``portal_sessions``, see ``services.portal_auth``); Flask's signed
cookie (HttpOnly, SameSite=Lax, Secure over TLS) carries only the row's random id, the CSRF token and
flashed messages, never a password or a one-time secret. The session row, the principal and its roles
are read from the database on every request, so a logout, a password change, a revoked role or a
disabled user takes effect at once. Every POST is checked against the Flask-WTF CSRF token before any
view runs.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import math
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

from flask import (
    Blueprint,
    Flask,
    abort,
    current_app,
    flash,
    g,
    has_request_context,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from flask.sessions import SecureCookieSessionInterface
from flask_wtf.csrf import CSRFError, generate_csrf, validate_csrf
from sqlalchemy.exc import DBAPIError
from werkzeug.exceptions import HTTPException
from wtforms.validators import ValidationError

from dlts.errors import DltsError, RateLimited
from dlts.extensions import db, settings_of
from dlts.models import JobStatus
from dlts.services import vcs as vc_service
from dlts.services.auth import Principal
from dlts.services.portal_auth import LoginLimits, principal_for_session

log = logging.getLogger(__name__)
bp = Blueprint("portal", __name__, template_folder="templates", static_folder="static",
               static_url_path="/portal-static")

SESSION_ID = "sid"  # the portal_sessions row's id, the cookie's only credential
SESSION_LIFETIME = dt.timedelta(hours=12)
# how the status badge looks: (CSS class, plain words for screen readers and tooltips)
STATUS_STYLE = {
    JobStatus.UNAPPROVED: "st-wait", JobStatus.QUEUED: "st-wait", JobStatus.SCHEDULING: "st-run",
    JobStatus.RUNNING: "st-run", JobStatus.PAUSING: "st-pause", JobStatus.PAUSED: "st-pause",
    JobStatus.KILLING: "st-stop", JobStatus.KILLED: "st-stop", JobStatus.FINISHED: "st-ok",
    JobStatus.FAILED: "st-bad", JobStatus.ERROR: "st-bad",
}


class PortalSessionInterface(SecureCookieSessionInterface):
    """Flask's signed cookie, Secure per ``session_cookie_secure``: "auto" follows the request's scheme
    (HTTPS directly, or X-Forwarded-Proto from a trusted proxy via ProxyFix)."""

    def __init__(self, secure: bool | str):
        self.secure = secure

    def get_cookie_secure(self, app: Flask) -> bool:
        if self.secure == "auto":
            return has_request_context() and request.is_secure
        return bool(self.secure)


def install(app: Flask) -> None:
    # Flask's defaults are SameSite unset and a 31-day session: the portal wants a working day
    app.config.update(SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Lax", SESSION_COOKIE_NAME="dlts_session",
                      PERMANENT_SESSION_LIFETIME=SESSION_LIFETIME, WTF_CSRF_TIME_LIMIT=12 * 3600)
    settings = settings_of(app)
    app.session_interface = PortalSessionInterface(settings.session_cookie_secure)
    app.extensions["dlts_login_limits"] = LoginLimits(settings.login_limit_per_user, settings.login_limit_per_ip,
                                                      settings.login_limit_window_s)
    app.jinja_env.globals.update(csrf_token=generate_csrf, status_class=status_class)
    app.jinja_env.filters.update(when=fmt_when, when_short=fmt_when_short, duration=fmt_duration, size=fmt_bytes)


def login_limits() -> LoginLimits:
    from flask import current_app

    return current_app.extensions["dlts_login_limits"]


# -- authentication -------------------------------------------------------------------------------

@bp.before_request
def _load_principal() -> Any:
    g.principal = None
    session_id = session.get(SESSION_ID)
    if session_id is not None:
        g.principal = principal_for_session(db.session(), session_id)
        if g.principal is None:  # logged out, password changed, expired, or the user disabled
            session.clear()
    elif session.get("uid") is not None:  # a cookie from before server-side sessions: not a login
        session.clear()
    if request.method == "POST":
        try:
            validate_csrf(request.form.get("csrf_token"))
        except ValidationError as exc:
            raise CSRFError(str(exc)) from None
    return None


def principal() -> Principal:
    return g.principal


# No inline script anywhere (portal.js is the only script); inline style attributes draw the bars.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'")


@bp.after_request
def _security_headers(response):
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    return response


def login_required(view: Callable) -> Callable:
    @functools.wraps(view)
    def wrapper(*args, **kwargs):
        if g.get("principal") is None:
            return redirect(url_for("portal.login", next=request.full_path if request.method == "GET" else None))
        return view(*args, **kwargs)

    return wrapper


def admin_only_404(view: Callable) -> Callable:
    """Pages only cluster admins may know of: everybody else gets the same 404 as a wrong URL."""

    @functools.wraps(view)
    def wrapper(*args, **kwargs):
        if not principal().is_cluster_admin:
            abort(404)
        return view(*args, **kwargs)

    return login_required(wrapper)


MAX_NEXT_CHARS = 2048


def safe_local_path(target: object) -> str | None:
    """``target`` when it is a path on this site (``/jobs?vc=x``), else None.

    Browsers are lenient where a server check is strict: they drop tabs and newlines from a URL,
    read ``\\`` as ``/`` and ``//host`` as another site. So the value must be printable ASCII with
    no whitespace and no backslash, start with exactly one ``/`` and have no scheme or host; and its
    path (before ``?`` or ``#``) must keep all that after percent-decoding too (``/%09/evil.example``
    decodes to a tab, ``/%2F/evil`` to ``//``). The query may hold encoded spaces (``?q=a%20b``)."""
    if not isinstance(target, str) or not target or len(target) > MAX_NEXT_CHARS:
        return None
    path = target.split("?", 1)[0].split("#", 1)[0]
    forms, value = [target], path
    for _ in range(3):  # double-encoded tricks: %252F -> %2F -> /
        value = unquote(value)
        forms.append(value)
    for form in forms:
        if not form.isascii() or any(c.isspace() or not c.isprintable() or c == "\\" for c in form):
            return None
        if not form.startswith("/") or form.startswith("//"):
            return None
        parts = urlsplit(form)
        if parts.scheme or parts.netloc:
            return None
    return target


def back(default_endpoint: str, **values: Any):
    """Redirect to the page the form came from when it is ours, else to ``default_endpoint``."""
    target = safe_local_path(request.form.get("next"))
    if target is not None:
        return redirect(target)
    return redirect(url_for(default_endpoint, **values))


def flash_error(exc: DltsError) -> None:
    """A refusal shown on the next page: its message flashed (the service's transaction undid the write)."""
    flash(exc.message, "error")


@bp.context_processor
def _layout() -> dict[str, Any]:
    who = g.get("principal")
    notices: list[tuple[str, str]] = []
    if g.get("database_down"):
        return {"me": None, "vc_notices": notices}
    if who is not None and who.vcs:
        notices = vc_service.notices(db.session(), list(who.vcs))
    return {"me": who, "vc_notices": notices}


# -- errors as pages ------------------------------------------------------------------------------

@bp.app_errorhandler(CSRFError)
def _csrf(exc: CSRFError):
    return render_template("error.html", status=400, title="The form expired",
                           message="This form was open too long or came from another site. Go back, reload the page "
                                   "and send it again."), 400


@bp.errorhandler(DltsError)
def _dlts_error(exc: DltsError):
    titles = {401: "Please log in", 403: "Not allowed", 404: "Not found", 409: "Not possible now", 422: "Refused",
              429: "Slow down"}
    response = current_app.make_response((render_template(
        "error.html", status=exc.http_status, title=titles.get(exc.http_status, "Cannot do that"), message=exc.message),
        exc.http_status))
    if isinstance(exc, RateLimited):
        response.headers["Retry-After"] = str(exc.retry_after_s)
    return response


@bp.errorhandler(404)
def _not_found(exc):
    return render_template("error.html", status=404, title="Not found",
                           message="There is no such page, or it is not one you may see."), 404


@bp.errorhandler(DBAPIError)
def _database(exc: DBAPIError):
    log.warning("portal: database unavailable: %s", exc.__class__.__name__)
    g.database_down = True  # the layout must not query it again
    return render_template("error.html", status=503, title="Database unavailable",
                           message="The database is unreachable right now; reload in a few seconds."), 503


@bp.errorhandler(Exception)
def _unexpected(exc: Exception):
    if isinstance(exc, HTTPException):
        return exc
    log.error("portal: unhandled error", exc_info=exc)
    return render_template("error.html", status=500, title="Something went wrong",
                           message="Something went wrong on our side; it has been logged. Try again, and tell your "
                                   "operators if it persists."), 500


# -- template filters -------------------------------------------------------------------------------

def status_class(status: JobStatus | str) -> str:
    return STATUS_STYLE.get(JobStatus(status), "st-wait")


def fmt_when(value: dt.datetime | None) -> str:
    """UTC, to the second; blank when the moment has not happened (never 1970)."""
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def fmt_when_short(value: dt.datetime | None) -> str:
    """To the minute, for dense tables (the title attribute carries the seconds)."""
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M")


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = math.ceil(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def fmt_bytes(value: float | None) -> str:
    if value is None:
        return ""
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(size) < 1024 or unit == "PiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} PiB"
