"""A client of the REST API over the standard library's urllib (no extra dependency on a laptop).

Every error is an :class:`ApiError` with the API's envelope (``code``, ``message``, ``details``)
and the field it names, or a connection problem said in one line; the commands print them, never a
traceback."""

from __future__ import annotations

import json
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import urllib.error

DEFAULT_TIMEOUT_S = 30.0


class ApiError(Exception):
    """The API refused (``status`` >= 400), or could not be reached (``status`` 0)."""

    def __init__(self, status: int, code: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details or {}

    @property
    def field(self) -> str | None:
        """The field the API names: ``details.field``, or the first of ``details.fields``."""
        if isinstance(self.details.get("field"), str):
            return self.details["field"]
        fields = self.details.get("fields")
        if isinstance(fields, dict) and fields:
            return str(next(iter(fields)))
        return None

    def __str__(self) -> str:
        return self.describe()

    def describe(self, label: str | None = None) -> str:
        """One line: the field (or ``label``, a flag naming it), the API's message, code and status."""
        if self.status == 0:
            return self.message
        text = self.message
        field = self.field
        if field and label:
            text = f"{label}: {text[len(field) + 2:] if text.startswith(field + ': ') else text}"
        elif field and not text.startswith(field):
            text = f"{field}: {text}"
        if self.status == 401:
            text += " Run `dlts login URL` with a new token: this one is unknown, revoked or expired."
        return f"{text} ({self.code}, HTTP {self.status})"


class Client:
    def __init__(self, url: str, token: str | None, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.base = url.rstrip("/")
        self.base = self.base.removesuffix("/api/v1")
        self.token = token
        self.timeout_s = timeout_s

    def url(self, path: str, params: dict[str, Any] | None = None) -> str:
        query = {k: v for k, v in (params or {}).items() if v is not None}
        for key, value in list(query.items()):
            if isinstance(value, bool):
                query[key] = "1" if value else "0"
        return f"{self.base}/api/v1{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")

    def _open(self, method: str, path: str, params: dict | None = None, body: Any = None,
              extra_headers: dict[str, str] | None = None):
        data = None
        headers = {"Accept": "application/json", "User-Agent": "dlts-cli", **(extra_headers or {})}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        # http.client and urllib.request (ssl, email, hashlib with them) load with the first request:
        # every `dlts` command imports this module, the server's included
        import http.client
        import urllib.error
        import urllib.request

        request = urllib.request.Request(self.url(path, params), data=data, method=method, headers=headers)
        try:
            return urllib.request.urlopen(request, timeout=self.timeout_s)
        except urllib.error.HTTPError as exc:
            raise _from_http_error(exc) from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            why = getattr(reason, "strerror", None) or str(reason)
            raise ApiError(0, "unreachable", f"cannot reach {self.base}: {why}") from None
        except TimeoutError:
            raise ApiError(0, "timeout", f"{self.base} did not answer within {self.timeout_s:g} s") from None
        except (ValueError, http.client.HTTPException) as exc:
            raise ApiError(0, "unreachable", f"cannot talk to {self.base}: {exc}") from None

    def request(self, method: str, path: str, params: dict | None = None, body: Any = None,
                headers: dict[str, str] | None = None) -> Any:
        with self._open(method, path, params, body, headers) as response:
            try:
                raw = response.read()
            except TimeoutError:
                raise ApiError(0, "timeout", f"{self.base} did not answer within {self.timeout_s:g} s") from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(0, "bad_response", f"{self.base} answered something that is not JSON; "
                                              "is the URL that of a DLTS API?") from None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params)

    def post(self, path: str, body: Any = None, **params: Any) -> Any:
        return self.request("POST", path, params, body if body is not None else {})

    def put(self, path: str, body: Any = None) -> Any:
        return self.request("PUT", path, None, body if body is not None else {})

    def patch(self, path: str, body: Any = None) -> Any:
        return self.request("PATCH", path, None, body if body is not None else {})

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def submit(self, spec: dict, retries: int = 2, pause_s: float = 1.0) -> dict:
        """POST /jobs with an ``Idempotency-Key``: after a timeout, a lost connection or a 503 the
        same request is sent again (``retries`` times), and the API answers the job the first try
        stored, if it did, instead of making a second one."""
        key = uuid.uuid4().hex
        for attempt in range(retries + 1):
            try:
                return self.request("POST", "/jobs", None, spec, {"Idempotency-Key": key})
            except ApiError as exc:
                if attempt == retries or not (exc.status in (0, 502, 503, 504) and exc.code != "bad_response"):
                    raise
                time.sleep(pause_s * (attempt + 1))
        raise AssertionError("unreachable")

    def text(self, path: str, **params: Any) -> str:
        with self._open("GET", path, params) as response:
            return response.read().decode("utf-8", errors="replace")

    def stream(self, path: str, chunk: int = 1 << 16, **params: Any) -> Iterator[bytes]:
        """The body in pieces (a log download)."""
        with self._open("GET", path, params) as response:
            while piece := response.read(chunk):
                yield piece

    def pages(self, path: str, limit: int | None = None, page_size: int = 200, **params: Any) -> Iterator[dict]:
        """Every item of a keyset-paginated list, following ``next_cursor``; at most ``limit`` items."""
        cursor = None
        seen = 0
        while True:
            size = page_size if limit is None else max(1, min(page_size, limit - seen))
            page = self.get(path, **params, limit=size, cursor=cursor)
            for item in page.get("items", []):
                yield item
                seen += 1
                if limit is not None and seen >= limit:
                    return
            cursor = page.get("next_cursor")
            if not cursor:
                return


def _from_http_error(exc: urllib.error.HTTPError) -> ApiError:
    try:
        raw = exc.read()
    except Exception:  # noqa: BLE001 - a broken body still leaves the status to report
        raw = b""
    try:
        error = json.loads(raw)["error"]
        return ApiError(exc.code, str(error.get("code") or "error"), str(error.get("message") or exc.reason),
                        error.get("details") if isinstance(error.get("details"), dict) else {})
    except (ValueError, KeyError, TypeError):
        return ApiError(exc.code, "http_error", f"the server answered HTTP {exc.code} {exc.reason} "
                                                "(not a DLTS API error; is the URL right?)")
