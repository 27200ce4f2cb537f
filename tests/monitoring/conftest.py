"""The monitoring tests' fixtures: a real SMTP server on loopback for Alertmanager's mails."""

from tests.smtp_server import smtp_server  # noqa: F401  (the fixture, by its name)
