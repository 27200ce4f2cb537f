"""A request answered before its body was read leaves no body behind on a kept-alive connection.

Many answers come before the body is read: 413 (``Content-Length`` over ``max_body_bytes``), 401/403
from the blueprints' ``before_request``, 404/405, 415, 429, or a 413 half-way through a chunked body.
The unread bytes are still on the connection, in front of the client's next request. A server that
then keeps the connection open without reading them (gunicorn 27 drains at most 64 KiB, then hangs
up although its answer said ``Connection: keep-alive``) leaves the client's next request unanswered.

``UnreadBodyGuard`` (the outermost WSGI layer of ``create_app``) counts what the application read of
``wsgi.input`` and, when the application starts its response with part of the body unread:

- a rest of at most ``DRAIN_MAX_BYTES`` is read and dropped (within ``DRAIN_TIMEOUT_S`` where the
  socket is known), and the connection stays open;
- anything larger, a chunked body that does not end within that bound, a client that stalls or
  hangs up: the connection is closed, and the response says so. Under gunicorn (``dlts api``, the
  dlts-api unit) ``pre_request`` in ``dlts.gunicorn_conf`` hands the request over and its
  ``must_close`` makes gunicorn answer ``Connection: close`` and close (an application's own
  ``Connection`` header is hop-by-hop: PEP 3333 forbids it and gunicorn drops it). werkzeug's server
  (the demo) answers ``Connection: close`` to every request and then reads the rest of the body
  until the client closes: after the last byte of such a response the socket's sending side is shut
  (``werkzeug.socket``), so the client sees the end of the connection at once.

docs/reliability.md ("A refused request on a kept-alive connection"); tests:
tests/core/test_api_unread_body.py.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

DRAIN_MAX_BYTES = 64 * 1024  # gunicorn's own drain bound
DRAIN_TIMEOUT_S = 5.0  # as long as gunicorn waits for a new connection's first bytes
_READ = 16 * 1024
_serving = threading.local()  # gthread: a request is read, served and answered by one thread


def serving(request: Any) -> None:
    """gunicorn's ``pre_request`` (``post_request``: None) in dlts.gunicorn_conf: the request this
    thread serves, whose ``must_close`` closes its connection after the response."""
    _serving.request = request


def _gunicorn_request(wsgi_input: Any) -> Any:
    """The gunicorn request this thread serves whose body is ``wsgi_input`` (environ's, as gunicorn
    made it), or None (another server, or a gunicorn run without the hooks)."""
    request = getattr(_serving, "request", None)
    return request if request is not None and getattr(request, "body", None) is wsgi_input else None


class CountingInput:
    """``wsgi.input`` as the application sees it: counts the bytes read, notes the end of the body."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.consumed = 0
        self.ended = False

    def _seen(self, data: bytes, asked: Any) -> bytes:
        self.consumed += len(data)
        if not data and asked != 0:
            self.ended = True
        return data

    def read(self, *args: Any) -> bytes:
        return self._seen(self.stream.read(*args), args[0] if args else None)

    def readline(self, *args: Any) -> bytes:
        return self._seen(self.stream.readline(*args), args[0] if args else None)

    def readlines(self, *args: Any) -> list[bytes]:
        lines = self.stream.readlines(*args)
        self.consumed += sum(len(line) for line in lines)
        if not args or args[0] is None or args[0] <= 0:
            self.ended = True
        return lines

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.readline, b"")


def _content_length(environ: dict) -> int | None:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return None
    return length if length >= 0 else None


def _is_werkzeug(environ: dict) -> bool:
    return "werkzeug.socket" in environ and str(environ.get("SERVER_SOFTWARE", "")).startswith("Werkzeug/")


def drain(body: CountingInput, remaining: int | None, sock: socket.socket | None) -> bool:
    """Read and drop the rest of the body (``remaining`` bytes; None: a chunked body, up to its end),
    at most DRAIN_MAX_BYTES, within DRAIN_TIMEOUT_S when the socket is known. True when all of it was
    read; False when the connection must close (too much, too slow, the client gone, a bad chunk)."""
    if remaining is not None and remaining > DRAIN_MAX_BYTES:
        return False
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    prior = sock.gettimeout() if sock is not None else None
    drained = 0
    try:
        while True:
            want = _READ if remaining is None else min(_READ, remaining - drained)
            if want <= 0:
                return True
            if sock is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                sock.settimeout(left)
            data = body.read(want)
            if not data:
                # the end of a chunked body; a sized one that ends early: the client has gone
                return remaining is None
            drained += len(data)
            if drained > DRAIN_MAX_BYTES:
                return False
    except Exception:  # noqa: BLE001 - socket.timeout, a reset, a server's own error for a malformed chunk: close
        return False
    finally:
        if sock is not None:
            try:
                sock.settimeout(prior)
            except OSError:
                pass


class UnreadBodyGuard:
    """WSGI middleware: see the module docstring."""

    def __init__(self, app: Callable) -> None:
        self.app = app

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        chunked = "chunked" in str(environ.get("HTTP_TRANSFER_ENCODING", "")).lower()
        length = None if chunked else _content_length(environ)
        if not chunked and not length:
            return self.app(environ, start_response)
        original = environ["wsgi.input"]
        body = CountingInput(original)
        environ["wsgi.input"] = body
        state: dict[str, Any] = {}

        def guarded_start_response(status: str, headers: list, exc_info: Any = None) -> Callable:
            if "close" not in state:
                state["close"] = self._settle(environ, body, original, length)
            state["status"], state["headers"] = status, headers
            return start_response(status, headers, exc_info) if exc_info else start_response(status, headers)

        response = self.app(environ, guarded_start_response)
        if state.get("close") and _is_werkzeug(environ) and _sized(state):
            return _ShutWritingAfter(response, environ["werkzeug.socket"])
        return response

    @staticmethod
    def _settle(environ: dict, body: CountingInput, original: Any, length: int | None) -> bool:
        """Whether the connection must close after this response (True), its body drained if not."""
        if body.ended or (length is not None and body.consumed >= length):
            return False
        if _is_werkzeug(environ):
            return True  # it closes every connection; the response's end shuts the socket's sending side
        if length is None and not environ.get("wsgi.input_terminated"):
            closes = True  # a body without a length whose end the server does not mark: never read past it
        else:
            remaining = None if length is None else length - body.consumed
            closes = not drain(body, remaining, environ.get("gunicorn.socket"))
        if closes:
            request = _gunicorn_request(original)
            if request is not None:
                request.must_close = True  # gunicorn: "Connection: close", then it closes
        return closes


def _sized(state: dict) -> bool:
    """A response whose end is its length (werkzeug then sends nothing after the application's bytes)."""
    status = str(state.get("status", ""))
    return not status.startswith("1") and any(str(name).lower() == "content-length" for name, _ in state.get("headers", ()))


class _ShutWritingAfter:
    """The response's bytes, then the socket's sending side shut: the client reads the whole answer,
    then the end of the connection, while werkzeug reads the rest of the body until the client closes."""

    def __init__(self, response: Iterable[bytes], sock: socket.socket) -> None:
        self.response, self.sock = response, sock

    def __iter__(self) -> Iterator[bytes]:
        sent = False
        for chunk in self.response:
            sent = True  # werkzeug has sent the headers with the first chunk, and flushes each one
            yield chunk
        if sent:
            try:
                self.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self) -> None:
        close = getattr(self.response, "close", None)
        if close is not None:
            close()
