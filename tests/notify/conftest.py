"""The notifier's tests use the shared in-process SMTP server (tests/smtp_server.py)."""

from tests.smtp_server import (  # noqa: F401  (fixtures and helpers the tests here use)
    SMTP_PASSWORD,
    SMTP_USER,
    certificate,
    check_login,
    down_smtp_server,
    password_file,
    smtp_server,
    with_notify,
)
