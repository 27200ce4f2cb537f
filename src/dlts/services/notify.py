"""Notices by e-mail: queue one (``enqueue``), find whom to tell, and render a queued one.

Any part of DLTS that tells people something calls ``enqueue`` inside its own transaction: the notice
becomes an outbox row exactly when the caller's change commits, and nothing touches the mail server
here. ``managers.notify`` renders and sends the rows later, so a mail server outage delays notices
and loses none.

Templates are ``templates/email/<name>.txt.j2``; an operator overrides any of them by putting a file of
the same name in ``<templates_dir>/email/``. The first line of a rendered template is ``Subject: ...``,
the rest is the plain-text body. Values from the context are user-controlled (job names): the subject
is forced onto one line, addresses with line breaks are refused, and the message is built by the
``email`` package, so no value can add a header or a recipient.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.errors import InvalidInput
from dlts.models import (
    GroupMember,
    OutboxMessage,
    OutboxStatus,
    Role,
    RoleBinding,
    User,
    utcnow,
)
from dlts.notify_settings import NotifySettings, is_address

if TYPE_CHECKING:
    from dlts.models import Job

log = logging.getLogger(__name__)

TEMPLATE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
TEMPLATE_SUFFIX = ".txt.j2"
# the root templates/ ships as the dlts.templates package in an install; a checkout reads it in place
_PACKAGED = Path(__file__).resolve().parents[1] / "templates" / "email"
_CHECKOUT = Path(__file__).resolve().parents[3] / "templates" / "email"
DEFAULT_EMAIL_TEMPLATES = _PACKAGED if _PACKAGED.is_dir() else _CHECKOUT
MAX_SUBJECT_CHARS = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_BODY_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # keeps \t and \n
# statuses that make a later notice with the same dedup_key a duplicate (a failed one does not)
DEDUP_STATUSES = (OutboxStatus.QUEUED, OutboxStatus.SENT)


# -- queueing -------------------------------------------------------------------------------------

def enqueue(session: Session, *, template: str, to: Sequence[str | None], context: Mapping[str, Any],
            dedup_key: str | None = None, settings: NotifySettings | None = None) -> int | None:
    """Queue a notice in the caller's transaction (the caller commits); render nothing yet.

    Returns the outbox row's id, or None when nobody is left to tell (``to`` empty once entries
    without an address are dropped) or when a notice with the same ``dedup_key`` is queued or was
    sent within ``notify.dedup_window_s``. ``settings`` defaults to the ``notify`` section of the
    settings the session was made with (``dlts.db.session_factory``), else to the defaults.
    Raises InvalidInput for an unknown template, an unusable address or a context that is not JSON.
    """
    _check_template_name(template)
    recipients = clean_recipients(to)
    if not recipients:
        return None
    values = _json_context(context)
    if dedup_key is not None and (not dedup_key or len(dedup_key) > 255 or _CONTROL.search(dedup_key)):
        raise InvalidInput("dedup_key must be 1-255 characters without control characters.",
                           details={"field": "dedup_key"})
    now = utcnow()
    if dedup_key is not None:
        window_s = _notify_settings(session, settings).dedup_window_s
        if is_duplicate(session, dedup_key, now - dt.timedelta(seconds=window_s)):
            log.debug("notice %s (%s) not queued: a notice with that key is queued or was sent within %.0f s",
                      template, dedup_key, window_s)
            return None
    row = OutboxMessage(template=template, recipients=recipients, context=values, dedup_key=dedup_key,
                        status=OutboxStatus.QUEUED, attempts=0, next_attempt_at=now, created_at=now)
    session.add(row)
    session.flush()
    return row.id


def is_duplicate(session: Session, dedup_key: str, since: dt.datetime, *, before_id: int | None = None) -> bool:
    """Whether a notice with ``dedup_key`` created since ``since`` is queued or sent (ids below
    ``before_id`` only, when given: the sender asks whether an *earlier* row covers this one)."""
    query = sa.select(OutboxMessage.id).where(
        OutboxMessage.dedup_key == dedup_key, OutboxMessage.created_at >= since,
        OutboxMessage.status.in_([s.value for s in DEDUP_STATUSES]))
    if before_id is not None:
        query = query.where(OutboxMessage.id < before_id)
    return session.scalar(query.limit(1)) is not None


def clean_recipients(to: Iterable[str | None]) -> list[str]:
    """The addresses in ``to`` without empty entries and repeats (compared case-insensitively), in
    order. An address that is not one plain ``local@domain`` (a display name, a space, a line break)
    is refused: it could add a header or a recipient."""
    if isinstance(to, str):
        raise InvalidInput("to must be a list of addresses, not one string.", details={"field": "to"})
    seen: set[str] = set()
    recipients = []
    for entry in to:
        if entry is None or not entry.strip():
            continue
        address = entry.strip()
        if not is_address(address):
            raise InvalidInput(f"{address!r} is not a plain e-mail address (local@domain, no name, no line breaks).",
                               details={"field": "to"})
        if address.lower() not in seen:
            seen.add(address.lower())
            recipients.append(address)
    return recipients


def _check_template_name(template: str) -> None:
    if not TEMPLATE_NAME.match(template):
        raise InvalidInput(f"template {template!r} must be a-z, 0-9 and '_' (a file templates/email/NAME{TEMPLATE_SUFFIX}).",
                           details={"field": "template"})
    # every notice names a template that ships (operators override them, they do not add new ones)
    if DEFAULT_EMAIL_TEMPLATES.is_dir() and not (DEFAULT_EMAIL_TEMPLATES / f"{template}{TEMPLATE_SUFFIX}").is_file():
        known = sorted(p.name[: -len(TEMPLATE_SUFFIX)] for p in DEFAULT_EMAIL_TEMPLATES.glob(f"[a-z]*{TEMPLATE_SUFFIX}"))
        raise InvalidInput(f"no e-mail template {template!r}; known: {', '.join(known)}.", details={"field": "template"})


def _json_context(context: Mapping[str, Any]) -> dict[str, Any]:
    for key in context:
        if not isinstance(key, str) or not key.isidentifier():
            raise InvalidInput(f"context key {key!r} must be a name a template can use.", details={"field": "context"})
    try:
        loaded: dict[str, Any] = json.loads(json.dumps(dict(context), allow_nan=False))
        return loaded
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"context must be JSON (strings, numbers, lists, mappings): {exc}.",
                           details={"field": "context"}) from None


def _notify_settings(session: Session, settings: NotifySettings | None) -> NotifySettings:
    if settings is not None:
        return settings
    configured = session.info.get("dlts_settings")
    return configured.notify if configured is not None else NotifySettings.model_validate({})


# -- whom to tell ---------------------------------------------------------------------------------

def cluster_admin_emails(session: Session) -> list[str]:
    """The addresses of the enabled cluster admins (bound directly or through a group)."""
    return _emails_of(session, _role_holders(Role.CLUSTER_ADMIN, None))


def vc_admin_emails(session: Session, vc_id: int) -> list[str]:
    return _emails_of(session, _role_holders(Role.VC_ADMIN, vc_id))


def vc_member_emails(session: Session, vc_id: int) -> list[str]:
    """Everyone of a VC (members and admins), e.g. for the VC's notice."""
    return _emails_of(session, _role_holders((Role.VC_MEMBER, Role.VC_ADMIN), vc_id))


def vc_member_addresses(session: Session, vc_id: int) -> list[tuple[str, str]]:
    """(user name, address) of everyone of a VC with a usable address, by name: one mail each, so
    that members do not see each other's addresses."""
    ids = _role_holders((Role.VC_MEMBER, Role.VC_ADMIN), vc_id)
    rows = session.execute(sa.select(User.name, User.email)
                           .where(User.id.in_(ids), User.disabled_at.is_(None), User.email.is_not(None))
                           .order_by(User.name)).all()
    return [(name, email.strip()) for name, email in rows if email and email.strip() and is_address(email.strip())]


def job_notice_emails(session: Session, job: Job) -> list[str]:
    """Whom to tell about a job: its owner first, then the admins of its VC."""
    return clean_recipients(_emails_of(session, [job.user_id]) + vc_admin_emails(session, job.vc_id))


def user_emails(session: Session, names: Iterable[str]) -> list[str]:
    """The addresses of the enabled users with these names (unknown names are skipped)."""
    return _emails_of(session, sa.select(User.id).where(User.name.in_(list(names))))


def _role_holders(roles: Role | tuple[Role, ...], vc_id: int | None) -> sa.CompoundSelect[int | None]:
    """The ids of users holding one of ``roles`` on the VC (or the cluster), directly or through a group."""
    wanted = RoleBinding.role.in_([r.value for r in (roles if isinstance(roles, tuple) else (roles,))])
    scope = RoleBinding.vc_id.is_(None) if vc_id is None else RoleBinding.vc_id == vc_id
    direct = sa.select(RoleBinding.user_id).where(wanted, scope, RoleBinding.user_id.is_not(None))
    grouped = (sa.select(GroupMember.user_id).join(RoleBinding, RoleBinding.group_id == GroupMember.group_id)
               .where(wanted, scope))
    return direct.union(grouped)


def _emails_of(session: Session, user_ids: Any) -> list[str]:
    rows = session.execute(sa.select(User.name, User.email)
                           .where(User.id.in_(user_ids), User.disabled_at.is_(None), User.email.is_not(None))
                           .order_by(User.name)).all()
    emails = []
    for name, email in rows:
        email = (email or "").strip()
        if not email:
            continue
        if not is_address(email):
            log.warning("user %s has an e-mail address DLTS cannot send to (%r); they are not told. "
                        "Set a plain address like name@example.org", name, email)
            continue
        emails.append(email)
    return clean_recipients(emails)


# -- rendering ------------------------------------------------------------------------------------

class TemplateError(Exception):
    """A template is missing or does not render; the message names it and says what to fix."""


@dataclass(frozen=True)
class RenderedMail:
    subject: str
    body: str


class MailRenderer:
    """Renders outbox rows: ``<templates_dir>/email/`` first, then the packaged templates."""

    def __init__(self, templates_dir: Path | None = None, *, subject_prefix: str = "", portal_url: str = ""):
        paths = []
        if templates_dir is not None:
            if not Path(templates_dir).is_dir():
                raise TemplateError(f"templates_dir {templates_dir} is not a directory; fix the setting or remove "
                                    "it to use the packaged templates")
            override = Path(templates_dir) / "email"
            if override.is_dir():
                paths.append(str(override))
        if DEFAULT_EMAIL_TEMPLATES.is_dir():
            paths.append(str(DEFAULT_EMAIL_TEMPLATES))
        if not paths:
            raise TemplateError(f"no e-mail templates: neither {DEFAULT_EMAIL_TEMPLATES} nor <templates_dir>/email "
                                "exists; set templates_dir to a directory with an email/ folder of templates")
        self.search_path = tuple(paths)
        self.subject_prefix = subject_prefix
        self.portal_url = portal_url
        self._env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(paths),
            undefined=jinja2.StrictUndefined,
            autoescape=False,  # plain text; nothing here is HTML
            keep_trailing_newline=True,
            trim_blocks=True,
            lstrip_blocks=True,
        )

    def render(self, template: str, context: Mapping[str, Any]) -> RenderedMail:
        name = f"{template}{TEMPLATE_SUFFIX}"
        values = {key: _protect(value) for key, value in context.items()}
        values["portal_url"] = self.portal_url
        try:
            text = self._env.get_template(name).render(**values)
        except jinja2.TemplateNotFound as exc:
            raise TemplateError(f"e-mail template {exc.name} not found in {', '.join(self.search_path)}") from None
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"e-mail template {exc.filename or name} line {exc.lineno}: {exc.message}") from None
        except (jinja2.UndefinedError, TypeError, ValueError) as exc:
            raise TemplateError(f"e-mail template {name}: {exc}") from None
        return split_subject(name, text, self.subject_prefix)


# Line breaks inside context values travel through the template as this character, so that only the
# template's own line breaks end the subject line: a job name "x\nBcc: ..." stays in the subject (as
# spaces) and cannot cut it short or spill into the body. In the body they are line breaks again.
_VALUE_NEWLINE = "\ue000"


def _protect(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace(_VALUE_NEWLINE, "").replace("\r\n", "\n").replace("\r", "\n").replace("\n", _VALUE_NEWLINE)
    if isinstance(value, list):
        return [_protect(item) for item in value]
    if isinstance(value, dict):
        return {key: _protect(item) for key, item in value.items()}
    return value


def split_subject(name: str, text: str, prefix: str = "") -> RenderedMail:
    """``Subject: ...`` on the first line, the body after it (one blank line in between is dropped)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    first, _, rest = text.partition("\n")
    if not first.startswith("Subject:"):
        raise TemplateError(f"e-mail template {name} must start with a line 'Subject: ...'")
    # a value with a line break (a job name) must not start a header of its own: one line, always
    subject = " ".join(_CONTROL.sub(" ", first[len("Subject:"):].replace(_VALUE_NEWLINE, " ")).split())
    if not subject:
        raise TemplateError(f"e-mail template {name} renders an empty subject")
    subject = prefix + subject
    if len(subject) > MAX_SUBJECT_CHARS:
        subject = subject[: MAX_SUBJECT_CHARS - 1].rstrip() + "…"
    body = _BODY_CONTROL.sub("", rest[1:] if rest.startswith("\n") else rest).replace(_VALUE_NEWLINE, "\n")
    if not body.endswith("\n"):
        body += "\n"
    return RenderedMail(subject, body)
