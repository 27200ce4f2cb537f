"""Every request the Kubernetes backend sends: connection, back-off, paged lists, raw JSON.

What this module owns:

* loading credentials (a kubeconfig and context, else the in-cluster service account) into one
  ``ApiClient`` with urllib3's own retries off: the back-off here decides when to try again;
* ``call``: one request. 5xx, 429, 401 and transport errors (refused connection, timeout) raise
  ``KubernetesUnavailable`` and start an exponential back-off (``backoff_initial_s`` doubling up
  to ``backoff_max_s``) during which calls fail fast without a request; the first success ends
  it. Statuses a caller expects are either "fine" (``ok``: 404 on delete, 409 AlreadyExists on
  create; the call returns None) or handed back as ``ApiException`` (``passthrough``); any other
  refusal (403 from a missing RBAC rule, 404, 406, 409, 422, ...) raises ``KubernetesRefused``,
  which costs the caller's step for one attempt and never the job manager's tick;
* ``list_all``: every list pages with ``limit=list_page_size`` and ``continue``, as client-go's pager
  does. A continue token the server no longer honours (410 Expired: its resourceVersion was
  compacted while we paged) restarts the list from the first page; a list is never stitched
  together from two snapshots;
* the count of requests sent (``calls``), for the calls-per-tick measurements.

Responses are read as raw JSON (``_preload_content=False``): deserialising thousands of pods into
the client's models costs more than the request.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from dlts.backends.base import BackendRefused, BackendUnavailable
from dlts.backends.k8s_settings import KubernetesSettings

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
TOKEN_REFRESH_S = 1.0  # how often the kubeconfig's token refresh hook may run (see connect)
_LIST_RESTARTS = 3  # a list whose continue token expires this many times in a row gives up
_CREATE_PATHS = {  # where ``create`` POSTs each kind of object
    "Pod": "/api/v1/namespaces/{namespace}/pods", "Service": "/api/v1/namespaces/{namespace}/services",
    "Secret": "/api/v1/namespaces/{namespace}/secrets", "ConfigMap": "/api/v1/namespaces/{namespace}/configmaps",
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies",
}


class KubernetesUnavailable(BackendUnavailable):
    """The API server did not answer usefully (error, timeout, back-off); retry on a later tick."""


class KubernetesRefused(BackendRefused):
    """The API server refused one request (4xx other than 401 and 429); ``status`` is its HTTP status."""

    def __init__(self, message: str, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def status_message(exc: ApiException) -> str:
    """The message of the ``Status`` object the server answered with (else the HTTP reason)."""
    try:
        return str(json.loads(exc.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return str(exc.reason or "")


def status_reason(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "")["reason"])
    except (TypeError, ValueError, KeyError):
        return ""


def connect(settings: KubernetesSettings) -> k8s.ApiClient:
    """An ``ApiClient`` from the kubeconfig (and context) in ``settings``, else in-cluster."""
    cfg = k8s.Configuration()
    try:
        if settings.kubeconfig:
            k8s_config.load_kube_config(config_file=settings.kubeconfig, context=settings.context,
                                        client_configuration=cfg)
        else:
            k8s_config.load_incluster_config(client_configuration=cfg)
    except k8s_config.ConfigException as exc:
        where = settings.kubeconfig or "the in-cluster service account"
        raise KubernetesUnavailable(f"cannot load Kubernetes credentials from {where}: {exc}; set the "
                                    "cluster config's kubernetes.kubeconfig to a readable kubeconfig") from None
    # One attempt per call: the back-off below decides when to try again, not urllib3.
    cfg.retries = False
    _refresh_token_at_most_every(cfg, TOKEN_REFRESH_S)
    # Log copies and launches run in small thread pools: one connection each, plus the ticks'.
    cfg.connection_pool_maxsize = max(8, settings.launch_parallelism + 4)
    return k8s.ApiClient(cfg)


def _refresh_token_at_most_every(cfg: k8s.Configuration, seconds: float) -> None:
    """The kubeconfig loader installs a hook that runs before every request: it reloads an
    expiring token (exec plugins, OIDC; the service account's file in a pod) and sets the whole
    configuration again, host included, whose setter reads the proxy variables of the
    environment: ~0.3 ms per request, for a token that changes every few minutes at most (the
    loader refreshes 5 minutes before expiry). Running it once per ``seconds`` keeps every
    refresh and drops the rest."""
    if cfg.refresh_api_key_hook is None:
        return
    lock = threading.Lock()
    state: dict[str, Any] = {"hook": cfg.refresh_api_key_hook, "last": float("-inf")}

    def refresh(configuration: k8s.Configuration) -> None:
        now = time.monotonic()
        with lock:
            if now - state["last"] < seconds:
                return
            state["last"] = now
            state["hook"](configuration)
            # the loader's hook installs a new hook of its own each time it runs: keep it inside
            if configuration.refresh_api_key_hook is not refresh:
                state["hook"] = configuration.refresh_api_key_hook or state["hook"]
                configuration.refresh_api_key_hook = refresh

    cfg.refresh_api_key_hook = refresh


class KubernetesApi:
    """The typed clients plus the back-off state they share. Thread-safe."""

    def __init__(self, settings: KubernetesSettings, api_client: k8s.ApiClient, clock: Callable[[], float]) -> None:
        self.settings = settings
        self.clock = clock
        self.client = api_client
        from dlts.metrics import instrument_kubernetes

        instrument_kubernetes(api_client)  # dlts_kubernetes_requests_total{verb,code}
        self.core = k8s.CoreV1Api(api_client)
        self.networking = k8s.NetworkingV1Api(api_client)
        self._lock = threading.Lock()
        self._failures = 0
        self._retry_at = 0.0
        self.calls = 0  # every request sent

    def count_request(self) -> None:
        with self._lock:
            self.calls += 1

    def call(self, fn: Callable[..., Any], *args: Any, ok: tuple[int, ...] = (),
             passthrough: tuple[int, ...] = (), **kwargs: Any) -> Any:
        """One API request.

        ``ok`` statuses return None (404 on delete, 409 on create); ``passthrough`` statuses are
        re-raised as ``ApiException`` for the caller to interpret (even a 5xx: the caller decides
        whether to back off); other 5xx, 429, 401 and transport errors start the back-off
        (``KubernetesUnavailable``); any other refusal becomes ``KubernetesRefused`` with the
        server's status and message (the server answered: no back-off).
        """
        now = self.clock()
        with self._lock:
            if now < self._retry_at:
                raise KubernetesUnavailable(
                    f"Kubernetes API backing off after {self._failures} failed calls; next try in "
                    f"{self._retry_at - now:.1f} s")
            self.calls += 1
        kwargs.setdefault("_request_timeout", self.settings.request_timeout_s)
        try:
            result = fn(*args, **kwargs)
            if kwargs.get("_preload_content") is False and isinstance(result, urllib3.BaseHTTPResponse):
                # Read the whole body now: urllib3 gives the connection back to the pool only
                # once the body has been read. A response nobody reads (a create's, a delete's)
                # would otherwise keep its connection until garbage collection closes it, and
                # every request would pay a new TCP connection (and the server a new thread).
                result.data  # noqa: B018 - kept on the response (``.data`` again returns it)
        except ApiException as exc:
            if exc.status in ok:
                self.succeeded()
                return None
            if exc.status in passthrough:
                self.succeeded()
                raise
            if exc.status in (0, 401, 429) or exc.status >= 500:
                self.failed(f"HTTP {exc.status} {status_message(exc)}")
            self.succeeded()
            raise KubernetesRefused(f"Kubernetes refused the request (HTTP {exc.status} {status_reason(exc) or exc.reason}): "
                                    f"{status_message(exc)}", status=int(exc.status), reason=status_reason(exc)) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            self.failed(f"{type(exc).__name__}: {exc}")
        self.succeeded()
        return result

    def failed(self, what: str) -> None:
        """Record a failure, start (or lengthen) the back-off, and raise ``KubernetesUnavailable``."""
        with self._lock:
            self._failures += 1
            delay = min(self.settings.backoff_max_s, self.settings.backoff_initial_s * 2 ** (self._failures - 1))
            self._retry_at = self.clock() + delay
            failures = self._failures
        log.warning("Kubernetes API call failed (%s); backing off %.1f s", what, delay)
        raise KubernetesUnavailable(f"Kubernetes API call failed ({what}); {failures} in a row, retrying "
                                    f"in {delay:.1f} s")

    def succeeded(self) -> None:
        with self._lock:
            self._failures = 0
            self._retry_at = 0.0

    def read(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict | None:
        """One object as raw JSON; None when it does not exist (404)."""
        resp = self.call(fn, *args, ok=(404,), _preload_content=False, **kwargs)
        return None if resp is None else self.json(resp)

    def json(self, resp: Any) -> Any:
        try:
            return json.loads(resp.data)
        except (ValueError, TypeError, AttributeError) as exc:
            self.failed(f"unreadable response: {exc}")

    def list_all(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[dict]:
        """Every item of a list, page by page (``limit`` / ``continue``)."""
        for _ in range(_LIST_RESTARTS):
            items: list[dict] = []
            token: str | None = None
            try:
                while True:
                    page_kwargs = dict(kwargs, limit=self.settings.list_page_size)
                    if token:
                        page_kwargs["_continue"] = token
                    resp = self.call(fn, *args, passthrough=(410,), _preload_content=False, **page_kwargs)
                    page = self.json(resp)
                    try:
                        items.extend(page.get("items") or [])
                        meta = page.get("metadata") or {}
                    except AttributeError as exc:
                        self.failed(f"unreadable list response: {exc}")
                    token = meta.get("continue") or None
                    if token is None:
                        return items
            except ApiException as exc:  # 410 Expired: the snapshot we paged through is gone
                if token is None:  # a 410 on the first page is no expired token: the server is unwell
                    self.failed(f"HTTP 410 {status_message(exc)}")
                log.info("list continue token expired after %d items (%s); listing again", len(items),
                         status_message(exc))
        raise KubernetesUnavailable(f"every list of {getattr(fn, '__name__', 'objects')} expired while paging "
                                    f"({_LIST_RESTARTS} tries, {self.settings.list_page_size} per page); the API "
                                    "server compacts faster than DLTS pages: raise kubernetes.list_page_size")

    def pod_log(self, name: str, namespace: str, *, container: str, since_time: str | None,
                limit_bytes: int) -> bytes:
        """One read of a container's log with timestamps (``GET .../pods/NAME/log``).

        The generated client's ``read_namespaced_pod_log`` has no ``sinceTime`` (the OpenAPI
        spec of the log endpoint omits it, though ``PodLogOptions`` has it), so the request is
        built here with the client's own serializer and auth. The log is plain text, but the API
        server's log endpoint offers only ``application/json`` and ``*/*`` (a real 1.20 server
        answers ``Accept: text/plain`` with 406), so the request accepts ``*/*``. Raises
        ``ApiException`` for the refusals a log read meets (400: the container has not started;
        403; 404: the pod is gone; 5xx: the node's kubelet cannot be reached); other refusals as
        ``KubernetesRefused``, transport errors and back-off as ``call``.
        """
        query: list[tuple[str, Any]] = [("container", container), ("timestamps", "true"),
                                        ("limitBytes", int(limit_bytes))]
        if since_time:
            query.append(("sinceTime", since_time))
        request = self.client.param_serialize(
            method="GET", resource_path="/api/v1/namespaces/{namespace}/pods/{name}/log",
            path_params={"namespace": namespace, "name": name}, query_params=query,
            header_params={"Accept": "*/*"}, auth_settings=["BearerToken"])

        def send(_request_timeout: float) -> bytes:
            resp = self.client.call_api(*request, _request_timeout=_request_timeout)
            resp.read()
            if not 200 <= resp.status <= 299:
                raise ApiException.from_response(http_resp=resp, body=None, data=None)
            return bytes(resp.data or b"")

        return self.call(send, passthrough=(400, 403, 404, 500, 502, 503, 504))

    def create(self, kind: str, namespace: str, doc: dict, *, ok: tuple[int, ...] = (),
               passthrough: tuple[int, ...] = ()) -> Any:
        """``POST`` one rendered object; returns the raw response (None for an ``ok`` status),
        errors as ``call``.

        The request is built here with the client's own ``param_serialize`` (auth, default
        headers) and sent through its ``call_api`` (same pool, same instrumentation), with the
        object as the JSON body. The generated ``create_namespaced_*`` methods would first turn
        the body into the client's model (pydantic's ``validate_call``: ~2 ms per object) and
        then walk it again to serialise it (~0.1 ms); the renderer has validated each object
        against those models once per template shape, and the body is plain JSON already.
        """
        path = _CREATE_PATHS[kind]

        def send(_request_timeout: Any, _preload_content: bool = False) -> Any:
            method, url, headers, _body, _params = self.client.param_serialize(
                method="POST", resource_path=path, path_params={"namespace": namespace},
                header_params={"Content-Type": "application/json", "Accept": "application/json"},
                auth_settings=["BearerToken"])
            resp = self.client.call_api(method, url, headers, doc, _request_timeout=_request_timeout)
            if not 200 <= resp.status <= 299:
                resp.read()
                raise ApiException.from_response(http_resp=resp, body=None, data=None)
            return resp.response

        return self.call(send, ok=ok, passthrough=passthrough, _preload_content=False)

    def close(self) -> None:
        self.client.close()
