"""A real SMTP server in-process (aiosmtpd on loopback) that records what it receives, a self-signed
certificate made here for its TLS, and the notifier's settings pointed at it.

Shared by the notifier's tests (tests/notify) and every test that checks the mails a manager sends
(tests/repair): a conftest imports the fixtures (``from tests.smtp_server import smtp_server, ...``)."""

from __future__ import annotations

import datetime as dt
import email
import email.policy
import ipaddress
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from dlts.config import Settings
from dlts.notify_settings import NotifySettings

SMTP_USER = "dlts-mailer"
SMTP_PASSWORD = "s3cret-from-a-file"


@dataclass
class Received:
    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage
    tls: bool
    login: str | None

    @property
    def body(self) -> str:
        return self.message.get_content().replace("\r\n", "\n")


@dataclass
class RecordingHandler:
    """Keeps every accepted message; ``rcpt_reply``/``data_reply`` make the server refuse on demand."""

    received: list[Received] = field(default_factory=list)
    rcpt_reply: Callable[[str], str | None] = lambda address: None
    data_reply: str | None = None

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        reply = self.rcpt_reply(address)
        if reply:
            return reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        if self.data_reply:
            return self.data_reply
        message = email.message_from_bytes(envelope.original_content, policy=email.policy.default)
        login = session.auth_data if session.authenticated else None
        self.received.append(Received(envelope.mail_from, list(envelope.rcpt_tos), message,
                                      server.transport.get_extra_info("ssl_object") is not None, login))
        return "250 Message accepted for delivery"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class SmtpServer:
    port: int
    handler: RecordingHandler
    controller: Controller | None = None

    @property
    def received(self) -> list[Received]:
        return self.handler.received

    def start(self, **smtp_parameters: Any) -> SmtpServer:
        self.controller = Controller(self.handler, hostname="127.0.0.1", port=self.port, **smtp_parameters)
        self.controller.start()
        return self

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None


@pytest.fixture
def smtp_server():
    """A plain SMTP server on a free loopback port, started (``stop()``/``start()`` to take it down)."""
    server = SmtpServer(free_port(), RecordingHandler()).start()
    yield server
    server.stop()


@pytest.fixture
def down_smtp_server():
    """A port where nothing listens yet: connections are refused until the test starts the server."""
    server = SmtpServer(free_port(), RecordingHandler())
    yield server
    server.stop()


@dataclass(frozen=True)
class Certificate:
    cert_file: Path
    key_file: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert_file, self.key_file)
        return context


@pytest.fixture(scope="session")
def certificate(tmp_path_factory) -> Certificate:
    """A self-signed certificate for 127.0.0.1 and localhost (also the CA the client trusts)."""
    directory = tmp_path_factory.mktemp("tls")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dlts-test-smtp")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return Certificate(cert_file, key_file)


def check_login(server, session, envelope, mechanism, auth_data) -> AuthResult:
    ok = isinstance(auth_data, LoginPassword) and auth_data.login.decode() == SMTP_USER \
        and auth_data.password.decode() == SMTP_PASSWORD
    return AuthResult(success=ok, handled=False, auth_data=SMTP_USER if ok else None)


@pytest.fixture
def password_file(tmp_path) -> Path:
    path = tmp_path / "smtp-password"
    path.write_text(SMTP_PASSWORD + "\n")
    path.chmod(0o600)
    return path


def with_notify(settings: Settings, **notify: Any) -> Settings:
    """The test settings with a ``notify:`` section (validated like the file's)."""
    values = {"smtp_host": "127.0.0.1", "security": "none", "from_address": "dlts@cluster.example.org",
              "retry_initial_s": 60, "retry_max_s": 600} | notify
    return settings.model_copy(update={"notify": NotifySettings(**values)})
