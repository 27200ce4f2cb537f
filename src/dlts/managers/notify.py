"""The notifier: sends the outbox's due notices over SMTP, one connection per run (``dlts managers``).

A run takes up to ``notify.batch_size`` queued rows whose ``next_attempt_at`` has come, oldest first,
and for each one, in its own short transaction:

- *duplicate*: an earlier notice with the same ``dedup_key``, created within ``dedup_window_s`` before
  it, is queued or sent: the row ends ``duplicate`` (kept, not sent). ``enqueue`` already refuses
  most of these; this catches two writers that raced.
- *rate limited*: a recipient already got ``rate_limit_per_hour`` messages in the last hour: the row
  waits until the oldest of those leaves the hour (``next_attempt_at``); it is never dropped.
- rendered from its template and sent. Accepted: ``sent``. The server refuses it for good (5xx):
  ``failed``. Refused for now (4xx) or its template does not render: tried again after a back-off
  doubling from ``retry_initial_s`` to ``retry_max_s``, ``failed`` after ``max_attempts`` tries.
- the server cannot be reached (refused connection, timeout, TLS or login failure, connection lost):
  the rows stay ``queued`` with the error in ``last_error``, no attempt is spent, and the notifier
  itself waits the same back-off before it connects again. A mail server outage loses nothing.

Delivery is at least once: a crash between the server's "250 OK" and the commit sends that message
again on the next run, with the same Message-ID (``<dlts.notify.ID.CREATED@domain>``), which lets mail
clients fold the copies.
"""

from __future__ import annotations

import datetime as dt
import email.policy
import email.utils
import logging
import smtplib
import ssl
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from email.message import EmailMessage

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.config import ConfigError, Settings
from dlts.models import OutboxMessage, OutboxStatus, utcnow
from dlts.notify_settings import NotifySettings, SmtpSecurity, is_address
from dlts.services import transaction
from dlts.services.notify import MailRenderer, RenderedMail, TemplateError, is_duplicate

log = logging.getLogger(__name__)

HOUR = dt.timedelta(hours=1)
PURGE_EVERY = dt.timedelta(hours=1)
PURGE_BATCH_ROWS = 1000
MAX_ERROR_CHARS = 512

SmtpFactory = Callable[[NotifySettings], smtplib.SMTP]
# CRLF line ends; headers folded only past RFC 5322's hard limit (Python folds a long subject right
# after "Subject:" at 78, which some readers show with a leading space)
MAIL_POLICY = email.policy.SMTP.clone(max_line_length=998)


class SmtpUnavailable(Exception):
    """The mail server cannot be used right now; the notices wait."""


def connect_smtp(settings: NotifySettings) -> smtplib.SMTP:
    """An SMTP connection ready to send: TLS as configured (certificate verified), logged in."""
    context = ssl.create_default_context(cafile=str(settings.tls_ca_file) if settings.tls_ca_file else None)
    smtp: smtplib.SMTP
    if settings.security is SmtpSecurity.SSL:
        smtp = smtplib.SMTP_SSL(settings.smtp_host, settings.port, timeout=settings.timeout_s, context=context)
    else:
        smtp = smtplib.SMTP(settings.smtp_host, settings.port, timeout=settings.timeout_s)
    try:
        smtp.ehlo()
        if settings.security is SmtpSecurity.STARTTLS:
            if not smtp.has_extn("starttls"):
                raise SmtpUnavailable(f"{settings.smtp_host}:{settings.port} does not offer STARTTLS; set "
                                      "notify.security to ssl (port 465) or none (a local relay only)")
            smtp.starttls(context=context)
            smtp.ehlo()
        if settings.username:
            smtp.login(settings.username, settings.read_password() or "")
    except BaseException:
        smtp.close()
        raise
    return smtp


@dataclass(frozen=True)
class NotifyRun:
    """What one run did (for the log and the metrics)."""

    sent: int = 0
    rate_limited: int = 0  # waiting for a recipient's hour to free up
    retried: int = 0  # refused for now or not renderable: tried again later
    failed: int = 0
    duplicates: int = 0
    purged: int = 0
    unreachable: str | None = None  # why the mail server could not be used (the rows wait)


class RateWindow:
    """Messages per recipient in the last hour (addresses compared case-insensitively)."""

    def __init__(self, limit_per_hour: int, sends: Iterable[tuple[Sequence[str], dt.datetime]] = ()):
        self.limit = limit_per_hour
        self._times: dict[str, list[dt.datetime]] = defaultdict(list)
        for recipients, at in sends:
            self.record(recipients, at)

    def record(self, recipients: Sequence[str], at: dt.datetime) -> None:
        for address in recipients:
            self._times[address.lower()].append(at)

    def blocked_until(self, recipients: Sequence[str], now: dt.datetime) -> tuple[str, dt.datetime] | None:
        """The recipient over the limit and when a message to them may go, or None to send now."""
        if self.limit <= 0:
            return None
        worst: tuple[str, dt.datetime] | None = None
        for address in recipients:
            times = sorted(t for t in self._times.get(address.lower(), ()) if t > now - HOUR)
            if len(times) >= self.limit:
                free_at = times[len(times) - self.limit] + HOUR
                if worst is None or free_at > worst[1]:
                    worst = (address, free_at)
        return worst


def backoff_s(settings: NotifySettings, attempts: int) -> float:
    """The wait after the ``attempts``-th failure: retry_initial_s doubling up to retry_max_s."""
    return min(settings.retry_max_s, settings.retry_initial_s * 2 ** max(0, min(attempts, 40) - 1))


def build_message(row: OutboxMessage, mail: RenderedMail, settings: NotifySettings, now: dt.datetime) -> EmailMessage:
    """The message for one row. Every header value is checked: EmailMessage refuses line breaks."""
    domain = settings.from_address.rpartition("@")[2] or "localhost"
    message = EmailMessage(policy=MAIL_POLICY)
    message["From"] = settings.from_address
    message["To"] = ", ".join(row.recipients)
    message["Subject"] = mail.subject
    message["Date"] = email.utils.format_datetime(now.replace(tzinfo=dt.UTC))
    message["Message-ID"] = f"<dlts.notify.{row.id}.{row.created_at:%Y%m%d%H%M%S}@{domain}>"
    message["Auto-Submitted"] = "auto-generated"  # RFC 3834: no vacation replies to a robot
    message["X-DLTS-Notice"] = row.template
    message.set_content(mail.body)
    return message


class NotifyManager:
    def __init__(self, session_factory: Callable[[], Session], settings: Settings, *,
                 smtp_factory: SmtpFactory = connect_smtp, clock: Callable[[], dt.datetime] = utcnow):
        self.session_factory = session_factory
        self.settings = settings.notify
        self.renderer = MailRenderer(settings.templates_dir, subject_prefix=settings.notify.subject_prefix,
                                     portal_url=settings.notify.portal_url)
        self.smtp_factory = smtp_factory
        self.clock = clock
        self._unreachable_runs = 0  # consecutive runs that could not reach the server
        self._wait_until: dt.datetime | None = None
        self._next_purge: dt.datetime | None = None

    def check(self) -> None:
        """Start-up check: a notifier that is on can read its password (a bad setting names its key)."""
        if self.settings.is_enabled:
            self.settings.read_password()

    # -- one run ---------------------------------------------------------------------------------
    def run_once(self) -> NotifyRun:
        now = self.clock()
        purged = self._purge(now)
        if not self.settings.is_enabled:
            return NotifyRun(purged=purged)
        if self._wait_until is not None and now < self._wait_until:
            return NotifyRun(purged=purged, unreachable="waiting before the next connection attempt")
        counts: dict[str, int] = defaultdict(int)
        unreachable: str | None = None
        smtp: smtplib.SMTP | None = None
        with self.session_factory() as session:
            rows = list(session.scalars(
                sa.select(OutboxMessage)
                .where(OutboxMessage.status == OutboxStatus.QUEUED.value, OutboxMessage.next_attempt_at <= now)
                .order_by(OutboxMessage.next_attempt_at, OutboxMessage.id).limit(self.settings.batch_size)))
            if not rows:
                return NotifyRun(purged=purged)
            window = self._rate_window(session, now)
            try:
                for index, row in enumerate(rows):
                    outcome = self._prepare(session, row, window, now)
                    if isinstance(outcome, str):
                        counts[outcome] += 1
                        continue
                    if smtp is None:
                        try:
                            smtp = self.smtp_factory(self.settings)
                        except (OSError, smtplib.SMTPException, SmtpUnavailable, ConfigError) as exc:
                            unreachable = self._describe_unreachable(exc)
                            self._keep_waiting(session, rows[index:], unreachable)
                            break
                    try:
                        counts[self._send(session, smtp, row, outcome, window, now)] += 1
                    except (smtplib.SMTPServerDisconnected, smtplib.SMTPSenderRefused, OSError) as exc:
                        unreachable = self._describe_unreachable(exc)
                        smtp.close()
                        smtp = None
                        self._keep_waiting(session, rows[index:], unreachable)
                        break
            finally:
                if smtp is not None:
                    try:
                        smtp.quit()
                    except (OSError, smtplib.SMTPException):
                        smtp.close()
        self._note_reachability(unreachable, now)
        result = NotifyRun(sent=counts["sent"], rate_limited=counts["rate_limited"], retried=counts["retried"],
                           failed=counts["failed"], duplicates=counts["duplicate"], purged=purged,
                           unreachable=unreachable)
        if result.sent or result.failed or result.retried:
            log.info("notifier: %d sent, %d to retry, %d failed, %d rate limited, %d duplicates", result.sent,
                     result.retried, result.failed, result.rate_limited, result.duplicates)
        return result

    # -- steps -----------------------------------------------------------------------------------
    def _rate_window(self, session: Session, now: dt.datetime) -> RateWindow:
        if self.settings.rate_limit_per_hour <= 0:
            return RateWindow(0)
        recent = session.execute(sa.select(OutboxMessage.recipients, OutboxMessage.sent_at).where(
            OutboxMessage.status == OutboxStatus.SENT.value, OutboxMessage.sent_at > now - HOUR)).all()
        return RateWindow(self.settings.rate_limit_per_hour, [(r or [], at) for r, at in recent])

    def _prepare(self, session: Session, row: OutboxMessage, window: RateWindow,
                 now: dt.datetime) -> EmailMessage | str:
        """The message to send, or what happened to the row instead (committed)."""
        if row.dedup_key and is_duplicate(session, row.dedup_key,
                                          row.created_at - dt.timedelta(seconds=self.settings.dedup_window_s),
                                          before_id=row.id):
            self._finish(session, row, OutboxStatus.DUPLICATE, now, "an earlier notice with the same dedup_key "
                         "was queued or sent within notify.dedup_window_s", attempt=False)
            return "duplicate"
        bad = [a for a in row.recipients if not isinstance(a, str) or not is_address(a)]
        if bad or not row.recipients:
            self._finish(session, row, OutboxStatus.FAILED, now, f"refused: not plain addresses: {bad!r}")
            return "failed"
        blocked = window.blocked_until(row.recipients, now)
        if blocked is not None:
            address, free_at = blocked
            with transaction.step(session):
                session.execute(sa.update(OutboxMessage).where(
                    OutboxMessage.id == row.id, OutboxMessage.status == OutboxStatus.QUEUED.value).values(
                    next_attempt_at=free_at, last_error=_clip(
                        f"rate limited: {address} had {self.settings.rate_limit_per_hour} messages in the last hour; "
                        f"waits until {free_at:%Y-%m-%d %H:%M:%S} UTC")))
            return "rate_limited"
        try:
            return build_message(row, self.renderer.render(row.template, row.context or {}), self.settings, now)
        except (TemplateError, ValueError) as exc:
            return self._retry(session, row, now, f"cannot render: {exc}")

    def _send(self, session: Session, smtp: smtplib.SMTP, row: OutboxMessage, message: EmailMessage,
              window: RateWindow, now: dt.datetime) -> str:
        try:
            refused = smtp.send_message(message, from_addr=self.settings.from_address, to_addrs=list(row.recipients))
        except smtplib.SMTPRecipientsRefused as exc:
            codes = [code for code, _ in exc.recipients.values()]
            error = "every recipient refused: " + "; ".join(
                f"{addr} {code} {_text(msg)}" for addr, (code, msg) in exc.recipients.items())
            if all(code >= 500 for code in codes):
                self._finish(session, row, OutboxStatus.FAILED, now, error)
                return "failed"
            return self._retry(session, row, now, error)
        except smtplib.SMTPSenderRefused:
            raise  # about notify.from_address, not this message: every notice waits
        except smtplib.SMTPResponseException as exc:  # the message's data refused, other replies
            error = f"{exc.smtp_code} {_text(exc.smtp_error)}"
            if exc.smtp_code >= 500:
                self._finish(session, row, OutboxStatus.FAILED, now, f"refused by the server: {error}")
                return "failed"
            return self._retry(session, row, now, f"refused for now: {error}")
        except smtplib.SMTPServerDisconnected:
            raise
        except smtplib.SMTPException as exc:
            return self._retry(session, row, now, f"not sent: {exc}")
        window.record(row.recipients, now)
        note = None
        if refused:
            note = "sent; refused for " + "; ".join(f"{addr} {code} {_text(msg)}" for addr, (code, msg) in refused.items())
        self._finish(session, row, OutboxStatus.SENT, now, note)
        return "sent"

    def _retry(self, session: Session, row: OutboxMessage, now: dt.datetime, error: str) -> str:
        attempts = row.attempts + 1
        if attempts >= self.settings.max_attempts:
            self._finish(session, row, OutboxStatus.FAILED, now, f"gave up after {attempts} tries: {error}")
            return "failed"
        wait = dt.timedelta(seconds=backoff_s(self.settings, attempts))
        with transaction.step(session):
            session.execute(sa.update(OutboxMessage).where(
                OutboxMessage.id == row.id, OutboxMessage.status == OutboxStatus.QUEUED.value).values(
                attempts=attempts, next_attempt_at=now + wait, last_error=_clip(error)))
        log.warning("notifier: notice #%d (%s) not sent, try %d of %d again in %.0f s: %s", row.id, row.template,
                    attempts, self.settings.max_attempts, wait.total_seconds(), error)
        return "retried"

    def _finish(self, session: Session, row: OutboxMessage, status: OutboxStatus, now: dt.datetime,
                error: str | None, *, attempt: bool = True) -> None:
        values: dict = {"status": status.value, "last_error": _clip(error) if error else None}
        if attempt:
            values["attempts"] = row.attempts + 1
        if status is OutboxStatus.SENT:
            values["sent_at"] = now
        with transaction.step(session):
            session.execute(sa.update(OutboxMessage).where(
                OutboxMessage.id == row.id, OutboxMessage.status == OutboxStatus.QUEUED.value).values(**values))
        if status is OutboxStatus.FAILED:
            log.error("notifier: notice #%d (%s) failed and will not be sent: %s", row.id, row.template, error)

    def _keep_waiting(self, session: Session, rows: Sequence[OutboxMessage], error: str) -> None:
        """The server is unreachable: the rows stay queued, saying why (no attempt is spent). Every
        earlier row's outcome was committed in its own step, and a send writes nothing before the
        server answers: nothing of this run is pending here."""
        ids = [r.id for r in rows]
        with transaction.step(session):
            session.execute(sa.update(OutboxMessage).where(
                OutboxMessage.id.in_(ids), OutboxMessage.status == OutboxStatus.QUEUED.value)
                .values(last_error=_clip(error)))

    def _describe_unreachable(self, exc: BaseException) -> str:
        where = f"{self.settings.smtp_host}:{self.settings.port}"
        if isinstance(exc, smtplib.SMTPSenderRefused):
            return (f"{where} refuses the sender {self.settings.from_address}: {exc.smtp_code} "
                    f"{_text(exc.smtp_error)}; check notify.from_address")
        if isinstance(exc, smtplib.SMTPAuthenticationError):
            return f"login to {where} as {self.settings.username} refused: {exc.smtp_code} {_text(exc.smtp_error)}"
        if isinstance(exc, ssl.SSLError):
            return f"TLS with {where} failed: {exc}; check notify.tls_ca_file and notify.security"
        if isinstance(exc, smtplib.SMTPResponseException):
            return f"{where} answered {exc.smtp_code} {_text(exc.smtp_error)}"
        return f"cannot use the mail server {where}: {exc or type(exc).__name__}"

    def _note_reachability(self, unreachable: str | None, now: dt.datetime) -> None:
        if unreachable is None:
            if self._unreachable_runs:
                log.info("notifier: the mail server answers again")
            self._unreachable_runs, self._wait_until = 0, None
            return
        self._unreachable_runs += 1
        wait = backoff_s(self.settings, self._unreachable_runs)
        self._wait_until = now + dt.timedelta(seconds=wait)
        log.warning("notifier: %s; notices stay queued, next try in %.0f s", unreachable, wait)

    def _purge(self, now: dt.datetime) -> int:
        """Delete finished rows older than keep_days, a batch at most per hour (queued ones stay)."""
        if self._next_purge is not None and now < self._next_purge:
            return 0
        self._next_purge = now + PURGE_EVERY
        cutoff = now - dt.timedelta(days=self.settings.keep_days)
        with self.session_factory() as session:
            ids = list(session.scalars(sa.select(OutboxMessage.id).where(
                OutboxMessage.created_at < cutoff, OutboxMessage.status != OutboxStatus.QUEUED.value)
                .order_by(OutboxMessage.created_at).limit(PURGE_BATCH_ROWS)))
            if not ids:
                return 0
            with transaction.step(session):
                session.execute(sa.delete(OutboxMessage).where(OutboxMessage.id.in_(ids))
                                .execution_options(synchronize_session=False))
        if len(ids) == PURGE_BATCH_ROWS:
            self._next_purge = now  # more to do: the next run continues
        return len(ids)


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"
