"""The ``notify:`` section of ``dlts.yaml``: how the notifier reaches the mail server, one typed object.

``dlts.config.Settings.notify`` *is* this object. The SMTP password is never a key of its own: it is
read from ``password_file`` when the notifier connects, so it is in no database row, no log line and
no ``dlts config check`` output. Every key is documented in docs/notifications.md; each has exactly
one default, here.
"""

from __future__ import annotations

import enum
import re
from email.utils import parseaddr
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from dlts.hosts import is_loopback_host

_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.\-]*[A-Za-z0-9])?$|^\[?[0-9A-Fa-f:.]+\]?$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class SmtpSecurity(str, enum.Enum):
    STARTTLS = "starttls"  # plain connection upgraded with STARTTLS before anything else (port 587)
    SSL = "ssl"  # TLS from the first byte, "SMTPS" (port 465)
    NONE = "none"  # no TLS: only for a relay on the same machine or a trusted network (port 25)


DEFAULT_PORTS = {SmtpSecurity.STARTTLS: 587, SmtpSecurity.SSL: 465, SmtpSecurity.NONE: 25}


def is_address(value: str) -> bool:
    """One plain ``local@domain`` address with no control characters, spaces or display name."""
    if not value or len(value) > 254 or _CONTROL.search(value) or " " in value:
        return False
    name, address = parseaddr(value)
    local, at, domain = address.rpartition("@")
    return address == value and not name and bool(at and local and domain) and "@" not in local


class NotifySettings(BaseModel):
    """Every key of the ``notify:`` section (the order matters: later checks read earlier keys)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # None: on exactly when smtp_host is set. Off, notices are still kept in the outbox (queued)
    enabled: bool | None = None
    # the mail server (submission service or local relay)
    smtp_host: str = Field("", validate_default=True)
    # None: 587 for starttls, 465 for ssl, 25 for none
    smtp_port: int | None = Field(None, ge=1, le=65535)
    security: SmtpSecurity = SmtpSecurity.STARTTLS
    # CA bundle the server's certificate is verified against; None: the system's CAs
    tls_ca_file: Path | None = None
    # SMTP AUTH: the user name, and the file holding the password (one line, read at each connection)
    username: str | None = Field(None, validate_default=True)
    password_file: Path | None = Field(None, validate_default=True)
    # the From: address, e.g. dlts@example.org (required when enabled)
    from_address: str = Field("", validate_default=True)
    # put before every subject
    subject_prefix: str = Field("[DLTS] ", max_length=64)
    # the portal's address for links in mails, e.g. https://dlts.example.org ("" : no links)
    portal_url: str = Field("", max_length=512)
    # one SMTP conversation step (connect, each command) may take this long
    timeout_s: float = Field(30.0, gt=0, le=600)
    # how often the notifier sends what is due
    interval_s: float = Field(30.0, ge=1, le=3600)
    # at most this many messages per run (one SMTP connection)
    batch_size: int = Field(100, ge=1, le=10_000)
    # a notice with the same dedup_key as one queued or sent this recently is not queued again
    dedup_window_s: float = Field(3600.0, ge=0, le=30 * 86400)
    # messages per recipient per hour; a message over the limit waits (0: no limit)
    rate_limit_per_hour: int = Field(30, ge=0, le=100_000)
    # a failed message is retried after retry_initial_s, doubling up to retry_max_s
    retry_initial_s: float = Field(60.0, gt=0, le=86400)
    retry_max_s: float = Field(3600.0, gt=0, le=7 * 86400, validate_default=True)
    # a message the server keeps refusing (4xx) is marked failed after this many tries (kept)
    max_attempts: int = Field(10, ge=1, le=1000)
    # sent, failed and duplicate rows older than this are deleted from the outbox
    keep_days: int = Field(90, ge=1, le=3650)

    @field_validator("smtp_host")
    @classmethod
    def _host(cls, value: str, info: ValidationInfo) -> str:
        value = value.strip()
        if value and not _HOST.match(value):
            raise ValueError("must be a host name or an IP address")
        if not value and info.data.get("enabled") is True:
            raise ValueError("must be set when enabled is true (or set enabled: false)")
        return value

    @field_validator("tls_ca_file")
    @classmethod
    def _ca_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"{value} is not a readable file")
        return value

    @field_validator("username")
    @classmethod
    def _username(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if not value or _CONTROL.search(value):
            raise ValueError("must be a non-empty name without control characters")
        host = info.data.get("smtp_host", "")
        if info.data.get("security") is SmtpSecurity.NONE and host and not is_loopback_host(host):
            raise ValueError("would send the password unencrypted: use security starttls or ssl, "
                             "or a relay on localhost")
        return value

    @field_validator("password_file")
    @classmethod
    def _password_file(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        username = info.data.get("username")
        if value is None and username:
            raise ValueError("must be set when username is (a file holding the SMTP password)")
        if value is not None and not username and "username" in info.data:
            raise ValueError("is set but username is not")
        return value

    @field_validator("from_address")
    @classmethod
    def _from(cls, value: str, info: ValidationInfo) -> str:
        value = value.strip()
        if value and not is_address(value):
            raise ValueError("must be one plain address like dlts@example.org (no name, no line breaks)")
        enabled = info.data.get("enabled")
        if not value and (enabled is True or (enabled is None and info.data.get("smtp_host"))):
            raise ValueError("must be set when the notifier is on (smtp_host is set)")
        return value

    @field_validator("subject_prefix", "portal_url")
    @classmethod
    def _one_line(cls, value: str) -> str:
        if _CONTROL.search(value):
            raise ValueError("must be one line without control characters")
        return value

    @field_validator("portal_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    @field_validator("retry_max_s")
    @classmethod
    def _retry_bounds(cls, value: float, info: ValidationInfo) -> float:
        initial = info.data.get("retry_initial_s")
        if initial is not None and value < initial:
            raise ValueError(f"must be at least retry_initial_s ({initial})")
        return value

    # -- derived -------------------------------------------------------------------------------
    @property
    def is_enabled(self) -> bool:
        return bool(self.smtp_host) if self.enabled is None else self.enabled

    @property
    def port(self) -> int:
        return self.smtp_port or DEFAULT_PORTS[self.security]

    def read_password(self) -> str | None:
        """The SMTP password from ``password_file`` (first line), or None without authentication."""
        if self.password_file is None:
            return None
        from dlts.config_layers import ConfigError

        try:
            text = self.password_file.read_text()
        except OSError as exc:
            raise ConfigError(f"notify.password_file: cannot read {self.password_file}: {exc.strerror}") from None
        password = text.splitlines()[0] if text else ""
        if not password:
            raise ConfigError(f"notify.password_file: {self.password_file} is empty; put the SMTP password "
                              "on its first line")
        return password

