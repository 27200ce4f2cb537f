"""An in-memory copy of DLTS's pods kept current by one list and a watch (an informer, in short).

With it, ``KubernetesBackend.observe`` reads memory instead of listing every pod each tick: the API
server sends only changes. The list pages (``limit``/``continue``) like every list DLTS sends. It
owns the watch thread, the resourceVersion bookkeeping (a 410 Expired means "list again"),
reconnects with back-off, and says when it cannot be trusted (``snapshot()`` returns None until the
first list and after any failure, until the next successful list), in which case the backend lists
as before. Nothing is inferred from a broken watch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)


class WatchExpired(Exception):
    """The server no longer has the history our resourceVersion points into (410)."""


def _rv(obj: dict) -> int:
    try:
        return int(obj["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return 0


class PodWatch:
    def __init__(self, core: k8s.CoreV1Api, namespace: str, selector: str, *, watch_timeout_s: float = 300.0,
                 request_timeout_s: float = 10.0, page_size: int = 500,
                 on_request: Callable[[], None] = lambda: None) -> None:
        self.core = core
        self.namespace = namespace
        self.selector = selector
        self.watch_timeout_s = watch_timeout_s
        self.request_timeout_s = request_timeout_s
        self.page_size = page_size
        self.on_request = on_request  # counts requests for the calls-per-tick measurement
        self._lock = threading.Lock()
        self._pods: dict[str, dict] = {}
        self.resource_version: str | None = None
        self._healthy = False
        self._stop = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None
        self.relists = 0

    # -- reading ----------------------------------------------------------------------------------

    def snapshot(self) -> list[dict] | None:
        """The pods as last seen, or None when the copy cannot be trusted (list instead)."""
        with self._lock:
            return list(self._pods.values()) if self._healthy else None

    def remember(self, pod: dict) -> None:
        """Read-your-writes: a pod we just created is known before its watch event arrives."""
        name = pod["metadata"]["name"]
        with self._lock:
            current = self._pods.get(name)
            if current is None or _rv(current) < _rv(pod):
                self._pods[name] = pod

    def forget(self, names: set[str]) -> None:
        with self._lock:
            for name in names:
                self._pods.pop(name, None)

    def names(self) -> set[str]:
        with self._lock:
            return set(self._pods)

    # -- the thread ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dlts-k8s-pod-watch", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        response = self._response
        if response is not None:  # unblock a read waiting for the next event
            for method in ("shutdown", "close"):  # shutdown: urllib3 >= 2.3
                with contextlib.suppress(AttributeError, OSError, urllib3.exceptions.HTTPError):
                    getattr(response, method)()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        backoff_s = 1.0
        while not self._stop.is_set():
            try:
                self.step()
                backoff_s = 1.0
            except WatchExpired:
                log.info("pod watch expired at resourceVersion %s; listing again", self.resource_version)
                self.resource_version = None
            except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError, KeyError) as exc:
                if self._stop.is_set():
                    break
                with self._lock:
                    self._healthy = False
                self.resource_version = None
                log.warning("pod watch failed (%s); relisting in %.0f s", exc, backoff_s)
                self._stop.wait(backoff_s)
                backoff_s = min(60.0, backoff_s * 2)
            except Exception:
                if self._stop.is_set():  # stop() closed the response under a read (urllib3 then fails oddly)
                    break
                raise

    def step(self) -> None:
        """List if needed, then follow one watch request to its end (or to an error)."""
        if self.resource_version is None:
            self.relist()
        self.watch_once()

    def relist(self) -> None:
        """List every pod, ``page_size`` at a time; the watch continues from the list's version.
        A continue token that expired while paging (410) means listing again from the start."""
        pods: dict[str, dict] = {}
        token: str | None = None
        while True:
            self.on_request()
            try:
                resp: Any = self.core.list_namespaced_pod(
                    self.namespace, label_selector=self.selector, limit=self.page_size, _continue=token,
                    _preload_content=False, _request_timeout=self.request_timeout_s)
            except ApiException as exc:
                if exc.status == 410 and token:
                    raise WatchExpired(f"list continue token expired: {exc.reason}") from None
                raise
            data = json.loads(resp.data)
            pods.update((p["metadata"]["name"], p) for p in data.get("items") or [])
            token = (data.get("metadata") or {}).get("continue") or None
            if token is None:
                break
        with self._lock:
            self._pods = pods
            self.resource_version = data["metadata"]["resourceVersion"]
            self._healthy = True
        self.relists += 1

    def watch_once(self) -> None:
        self.on_request()
        resp: Any = self.core.list_namespaced_pod(  # an urllib3 response when not preloaded
            self.namespace, label_selector=self.selector, watch=True, resource_version=self.resource_version,
            allow_watch_bookmarks=True, timeout_seconds=int(self.watch_timeout_s), _preload_content=False,
            _request_timeout=(self.request_timeout_s, self.watch_timeout_s + self.request_timeout_s))
        self._response = resp
        try:
            pending = b""
            for chunk in resp.stream(amt=None, decode_content=False):
                if self._stop.is_set():
                    return
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        self._apply(json.loads(line))
        finally:
            self._response = None
            resp.release_conn()

    def _apply(self, event: dict) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise WatchExpired(obj.get("message", ""))
            raise ValueError(f"watch error: {obj.get('message', obj)}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        with self._lock:
            if kind in ("ADDED", "MODIFIED"):
                self._pods[obj["metadata"]["name"]] = obj
            elif kind == "DELETED":
                self._pods.pop(obj["metadata"]["name"], None)
            if version:
                self.resource_version = version
