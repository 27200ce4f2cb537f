"""A request answered before its body was read, on a kept-alive connection: the next request is
answered, on the same connection or, when the answer said ``Connection: close``, on a new one after
the server really closed the old one (src/dlts/unread_body.py, docs/reliability.md). Real processes
over real sockets: `dlts api` (gunicorn, gthread workers) and `dlts demo` (werkzeug's server). And
`dlts api` leaves no metrics directory behind in its temporary directory.

A request that goes unanswered shows as a socket read timeout (READ_TIMEOUT_S); no test asserts on
how long anything took."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from dlts import gunicorn_conf
from dlts.unread_body import DRAIN_MAX_BYTES, UnreadBodyGuard

DLTS = [sys.executable, "-m", "dlts.cli"]
READ_TIMEOUT_S = 30.0
UP_TIMEOUT_S = 120.0
DEEP = b"[" * 100_000 + b"]" * 100_000  # fully read by the API, refused by the JSON parser
TOO_LARGE = b"[" + b"1," * (1024 * 1024) + b"1]"  # 2 MiB: over the default max_body_bytes (1 MiB)
SMALL_BODY = json.dumps({"vc": "default", "image": "x", "command": "true", "pad": "x" * 1000}).encode()
LARGE_BODY = json.dumps({"vc": "default", "image": "x", "command": "true", "pad": "x" * 300_000}).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(home: Path, port: int, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLTS_") and k != "PROMETHEUS_MULTIPROC_DIR"}
    return env | {"DLTS_HOME": str(home), "DLTS_LISTEN_PORT": str(port), "DLTS_LOCAL_BACKEND_TRUSTED_USERS": "true",
                  "DLTS_SECRET_KEY": "a-test-secret-key-123456"} | extra


def _wait_ready(proc: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + UP_TIMEOUT_S
    while True:
        try:
            if requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        assert proc.poll() is None, f"exited with {proc.returncode}"
        assert time.monotonic() < deadline, "did not come up"
        time.sleep(0.2)


def _stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> int:
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("did not stop within 60 s") from None


def _cli(env: dict, *args: str) -> str:
    return subprocess.run(DLTS + list(args), env=env, check=True, capture_output=True, text=True, timeout=120).stdout


# -- a client on raw sockets ---------------------------------------------------------------------

@dataclass
class Answer:
    status: int
    connection: str  # the response's Connection header, lower case
    body: bytes
    connection_no: int  # which of the client's connections carried it (1, 2, ...)

    @property
    def code(self) -> str:
        return json.loads(self.body)["error"]["code"]


def _request(method: str, path: str, headers: dict | None = None, body: bytes = b"", chunked: bool = False) -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
    if chunked:
        head.append("Transfer-Encoding: chunked")
        pieces = [body[i:i + 16384] for i in range(0, len(body), 16384)]
        payload = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"
    else:
        if body or method in ("POST", "PUT", "PATCH"):
            head.append(f"Content-Length: {len(body)}")
        payload = body
    return ("\r\n".join(head) + "\r\n\r\n").encode() + payload


def _read_response(rfile) -> tuple[int, dict[str, str], bytes]:
    status_line = rfile.readline()
    assert status_line, "the server closed the connection without answering"
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := rfile.readline()) not in (b"\r\n", b"\n", b""):
        name, value = line.decode("latin-1").split(":", 1)
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        body = rfile.read(int(headers["content-length"]))
    elif "chunked" in headers.get("transfer-encoding", ""):
        body = b""
        while (size := int(rfile.readline().split(b";")[0], 16)) > 0:
            body += rfile.read(size)
            rfile.readline()
        rfile.readline()
    else:
        body = b""
    return status, headers, body


class Client:
    """One HTTP/1.1 client on raw sockets that keeps its connection as long as the server lets it:
    after an answer with ``Connection: close`` it checks that the server really closed the
    connection, and opens a new one for the next request. Bodies are sent from a thread while the
    answer is read (a server may answer before it reads the body)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None
        self.connections = 0

    def ask(self, method: str, path: str, headers: dict | None = None, body: bytes = b"",
            chunked: bool = False, stall_after: int | None = None) -> Answer:
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=READ_TIMEOUT_S)
            self.rfile = self.sock.makefile("rb")
            self.connections += 1
        payload = _request(method, path, headers, body, chunked)
        if stall_after is not None:
            payload = payload[:len(payload) - len(body) + stall_after]  # the rest of the body never comes
        send_errors: list[OSError] = []
        sender = threading.Thread(target=self._send, args=(self.sock, payload, send_errors), daemon=True)
        sender.start()
        try:
            status, headers_in, content = _read_response(self.rfile)
        except TimeoutError:
            raise AssertionError(f"{method} {path}: no answer within {READ_TIMEOUT_S} s on connection "
                                 f"{self.connections}") from None
        answer = Answer(status, headers_in.get("connection", "").lower(), content, self.connections)
        sender.join(READ_TIMEOUT_S)
        if answer.connection == "close":
            self._assert_closed_by_server(f"{method} {path} answered {status} with Connection: close")
        else:
            assert not send_errors, (answer, send_errors)  # kept alive: every byte must have gone through
        return answer

    @staticmethod
    def _send(sock: socket.socket, payload: bytes, errors: list) -> None:
        try:
            sock.sendall(payload)
        except OSError as exc:  # the server closed after answering, before taking the whole body
            errors.append(exc)

    def _assert_closed_by_server(self, what: str) -> None:
        assert self.sock is not None
        try:
            rest = self.rfile.read(1)
        except ConnectionResetError:
            rest = b""
        except TimeoutError:
            raise AssertionError(f"{what}, but the server kept the connection open for {READ_TIMEOUT_S} s") from None
        assert rest == b"", f"{what}, then sent more: {rest!r}"
        self.close()

    def close(self) -> None:
        if self.sock is not None:
            self.rfile.close()
            self.sock.close()
            self.sock = None


# -- dlts api (gunicorn) -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gunicorn_api(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("unread-body-api")
    port = free_port()
    (tmp / "home").mkdir()
    env = _env(tmp / "home", port)
    _cli(env, "db", "upgrade")
    _cli(env, "user", "add", "erin")
    token = _cli(env, "user", "token", "erin").splitlines()[-1]
    proc = subprocess.Popen(DLTS + ["api", "--workers", "2"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        _wait_ready(proc, port)
        yield port, token
    finally:
        _stop(proc)


def test_dlts_api_answers_the_request_after_a_deep_nesting_400_and_a_413_on_one_connection(gunicorn_api):
    port, token = gunicorn_api
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    client = Client(port)
    try:
        for _ in range(3):
            deep = client.ask("POST", "/api/v1/jobs", auth, DEEP)
            # read whole, refused: the connection stays
            assert (deep.status, deep.code, deep.connection) == (400, "invalid_json", "keep-alive")
            large = client.ask("POST", "/api/v1/jobs", auth, TOO_LARGE)
            # refused before its 2 MiB were read: said "close", and closed (checked by ask)
            assert (large.status, large.code, large.connection) == (413, "body_too_large", "close")
            assert large.connection_no == deep.connection_no
            after = client.ask("GET", "/readyz")
            assert (after.status, after.connection, after.connection_no) == (200, "keep-alive", large.connection_no + 1)
    finally:
        client.close()


def test_dlts_api_401_on_a_post_whose_body_it_did_not_read(gunicorn_api):
    port, _token = gunicorn_api
    json_type = {"Content-Type": "application/json"}
    client = Client(port)
    try:
        # a small unread body is drained: the connection stays and serves the next request
        small = client.ask("POST", "/api/v1/jobs", json_type, SMALL_BODY)
        assert (small.status, small.code, small.connection) == (401, "unauthenticated", "keep-alive")
        after = client.ask("GET", "/readyz")
        assert (after.status, after.connection_no) == (200, small.connection_no)
        chunked = client.ask("POST", "/api/v1/jobs", json_type, SMALL_BODY, chunked=True)
        assert (chunked.status, chunked.connection, chunked.connection_no) == (401, "keep-alive", small.connection_no)
        not_found = client.ask("POST", "/api/v1/no-such-thing", json_type, SMALL_BODY)
        assert (not_found.status, not_found.connection, not_found.connection_no) == (404, "keep-alive",
                                                                                     small.connection_no)

        # one over the drain bound is not read: closed
        assert len(LARGE_BODY) > DRAIN_MAX_BYTES
        large = client.ask("POST", "/api/v1/jobs", json_type, LARGE_BODY)
        assert (large.status, large.connection, large.connection_no) == (401, "close", small.connection_no)
        after = client.ask("GET", "/readyz")
        assert (after.status, after.connection, after.connection_no) == (200, "keep-alive", large.connection_no + 1)
        large_chunked = client.ask("POST", "/api/v1/jobs", json_type, LARGE_BODY, chunked=True)
        assert (large_chunked.status, large_chunked.connection) == (401, "close")

        # a client that stops sending half-way through its body: answered, and closed
        stalled = client.ask("POST", "/api/v1/jobs", json_type, SMALL_BODY, stall_after=10)
        assert (stalled.status, stalled.connection) == (401, "close")
        assert client.ask("GET", "/readyz").status == 200
    finally:
        client.close()


# -- dlts demo (werkzeug's server) ---------------------------------------------------------------

@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    home = tmp_path_factory.mktemp("unread-body-demo") / "home"
    port = free_port()
    env = _env(home, port)
    proc = subprocess.Popen(DLTS + ["demo", "--port", str(port), "--demo-gpus", "2"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(proc, port)
        yield port, (home / "alice-token").read_text().strip()
    finally:
        assert _stop(proc, signal.SIGINT) == 0


def test_the_demo_closes_every_connection_and_answers_after_refused_bodies(demo):
    port, token = demo
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    client = Client(port)
    try:
        # werkzeug's server answers every request with "Connection: close"; it must also really close,
        # at once, when the body was left unread (it reads the rest until the client closes)
        answers = [client.ask("POST", "/api/v1/jobs", auth, DEEP),
                   client.ask("POST", "/api/v1/jobs", auth, TOO_LARGE),
                   client.ask("GET", "/readyz"),
                   client.ask("POST", "/api/v1/jobs", {"Content-Type": "application/json"}, SMALL_BODY),
                   client.ask("POST", "/api/v1/jobs", {"Content-Type": "application/json"}, LARGE_BODY),
                   client.ask("GET", "/readyz")]
        assert [(a.status, a.connection, a.connection_no) for a in answers] == [
            (400, "close", 1), (413, "close", 2), (200, "close", 3), (401, "close", 4), (401, "close", 5),
            (200, "close", 6)]
        assert [answers[0].code, answers[1].code, answers[3].code] == ["invalid_json", "body_too_large",
                                                                       "unauthenticated"]
    finally:
        client.close()


# -- dlts api's metrics directory ----------------------------------------------------------------

def test_dlts_api_removes_the_metrics_directory_it_made_and_keeps_the_operators(tmp_path):
    port, tmpdir, home = free_port(), tmp_path / "tmp", tmp_path / "home"
    tmpdir.mkdir()
    home.mkdir()
    env = _env(home, port, TMPDIR=str(tmpdir))
    _cli(env, "db", "upgrade")
    assert list(tmpdir.iterdir()) == []

    proc = subprocess.Popen(DLTS + ["api", "--workers", "2"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        _wait_ready(proc, port)
        made = [p.name for p in tmpdir.iterdir()]
        assert len(made) == 1 and made[0].startswith("dlts-api-metrics-"), made
        assert requests.get(f"http://127.0.0.1:{port}/metrics", timeout=30).status_code == 200
    finally:
        assert _stop(proc) == 0
    assert list(tmpdir.iterdir()) == []

    operators = tmp_path / "operator-metrics"
    operators.mkdir()
    proc = subprocess.Popen(DLTS + ["api", "--workers", "2"], env=env | {"PROMETHEUS_MULTIPROC_DIR": str(operators)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(proc, port)
        assert requests.get(f"http://127.0.0.1:{port}/metrics", timeout=30).status_code == 200
    finally:
        assert _stop(proc) == 0
    assert operators.is_dir() and list(tmpdir.iterdir()) == []


# -- the guard alone (no server) -----------------------------------------------------------------

class _GunicornRequest:
    method, path = "POST", "/api/v1/jobs"

    def __init__(self, body) -> None:
        self.body = body
        self.must_close = False


class _Log:
    def debug(self, *args) -> None:
        pass


class _Worker:
    log = _Log()


def _refuse_unread(environ, start_response):
    start_response("401 UNAUTHORIZED", [("Content-Type", "application/json"), ("Content-Length", "2")])
    return [b"{}"]


@pytest.mark.parametrize(("size", "chunked", "closes"), [
    (1000, False, False), (DRAIN_MAX_BYTES, False, False), (DRAIN_MAX_BYTES + 1, False, True),
    (1000, True, False), (DRAIN_MAX_BYTES * 2, True, True)])
def test_the_guard_drains_a_small_unread_body_and_has_gunicorn_close_beyond(size, chunked, closes):
    stream = io.BytesIO(b"x" * size)
    request = _GunicornRequest(stream)
    environ = {"REQUEST_METHOD": "POST", "wsgi.input": stream, "wsgi.input_terminated": True}
    environ |= {"HTTP_TRANSFER_ENCODING": "chunked"} if chunked else {"CONTENT_LENGTH": str(size)}
    gunicorn_conf.pre_request(_Worker(), request)
    try:
        started = []
        body = UnreadBodyGuard(_refuse_unread)(environ, lambda status, headers: started.append(status))
    finally:
        gunicorn_conf.post_request(_Worker(), request, environ, None)
    assert list(body) == [b"{}"] and started == ["401 UNAUTHORIZED"]
    assert request.must_close is closes
    if not closes:
        assert stream.tell() == size  # drained: the next request starts where gunicorn reads


def test_the_guard_leaves_a_read_body_and_another_threads_request_alone():
    stream = io.BytesIO(b'{"a": 1}')
    request = _GunicornRequest(io.BytesIO())  # pre_request saw another request: not this one's
    gunicorn_conf.pre_request(_Worker(), request)
    try:
        def reads_it(environ, start_response):
            assert environ["wsgi.input"].read() == b'{"a": 1}'
            start_response("200 OK", [("Content-Length", "0")])
            return []

        environ = {"REQUEST_METHOD": "POST", "CONTENT_LENGTH": "8", "wsgi.input": stream}
        assert list(UnreadBodyGuard(reads_it)(environ, lambda status, headers: None)) == []
        environ = {"REQUEST_METHOD": "POST", "CONTENT_LENGTH": str(DRAIN_MAX_BYTES * 2),
                   "wsgi.input": io.BytesIO(b"x" * DRAIN_MAX_BYTES * 2)}
        assert list(UnreadBodyGuard(_refuse_unread)(environ, lambda status, headers: None)) == [b"{}"]
    finally:
        gunicorn_conf.post_request(_Worker(), request, {}, None)
    assert request.must_close is False
