"""An in-memory copy of DLTS's pods kept current by one list and a watch (an informer, in short).

With it, ``KubernetesBackend.observe`` reads memory instead of listing every pod each tick: the API
server sends only changes. The list pages (``limit``/``continue``) like every list DLTS sends. It
owns the watch thread, the resourceVersion bookkeeping (a 410 Expired means "list again"),
reconnects with back-off, and says when it cannot be trusted (``snapshot()`` returns None until the
first list and after any failure, until the next successful list), in which case the backend lists
as before. Nothing is inferred from a broken watch.

Events are decoded when the copy is read, not when they arrive. A burst of launches brings one
ADDED event per pod (and later MODIFIED ones) while the launches still run in this interpreter;
decoding each ~6 KB event there (``json.loads``, ~50-100 us) and the create response that
``remember_raw`` keeps took CPU from the launches. The watch thread now only recognises an
ADDED/MODIFIED/DELETED line by its head and reads its ``resourceVersion`` with one regular
expression (what it needs to continue the watch), and queues the raw line; ``snapshot()``,
``names()`` and ``forget()`` decode the queue in arrival order first. Anything else (ERROR,
BOOKMARK, a line whose version cannot be read unambiguously) is decoded at once, as before, so a
410 Expired still ends the watch when it arrives.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)


class WatchExpired(Exception):
    """The server no longer has the history our resourceVersion points into (410)."""


# The head of a pod change as the API server writes it (``metav1.WatchEvent``: type, then object).
_CHANGE_HEAD = re.compile(rb'\{\s*"type"\s*:\s*"(ADDED|MODIFIED|DELETED)"\s*,\s*"object"\s*:')
# The same head up to the object's metadata.name, when only its kind and apiVersion come before
# (the API server's order): a match is the start of the JSON parsed, so this is the pod's name.
_CHANGE_NAME = re.compile(rb'\{\s*"type"\s*:\s*"(?:ADDED|MODIFIED|DELETED)"\s*,\s*"object"\s*:\s*\{\s*'
                          rb'(?:"(?:kind|apiVersion)"\s*:\s*"[^"\\]*"\s*,\s*)*'
                          rb'"metadata"\s*:\s*\{\s*"name"\s*:\s*"([^"\\]+)"')
# Every member named resourceVersion and its value when that is a string of digits. Inside a JSON
# string every quote is escaped, so `resourceVersion"` followed by a colon only occurs where a
# member's key ends: JSON held in an annotation's value never matches (its quotes are escaped).
_VERSION_MEMBER = re.compile(rb'"resourceVersion"\s*:\s*(?:"(\d+)")?')


def event_version(line: bytes) -> str | None:
    """The ``metadata.resourceVersion`` of a pod change, read without decoding the event: None
    unless the line is an ADDED/MODIFIED/DELETED event with exactly one ``resourceVersion``
    match whose value is a string of digits. Every object the server sends carries
    ``metadata.resourceVersion``, so a single match is that one; anything else (a second member
    of that name, say an annotation's key) is left to the full decode."""
    return object_version(line) if _CHANGE_HEAD.match(line) is not None else None


def event_name(line: bytes) -> str | None:
    """The pod's name in a pod change, read without decoding it when the event starts as the
    API server writes it (type, object; the object's kind and apiVersion, then metadata with
    its name first); else None."""
    match = _CHANGE_NAME.match(line)
    return match.group(1).decode() if match else None


def object_version(text: bytes) -> str | None:
    """The resourceVersion of one object (or of the one object an event carries) as raw JSON:
    the single ``resourceVersion`` member's digits, else None."""
    found = _VERSION_MEMBER.findall(text)
    return found[0].decode() if len(found) == 1 and found[0] else None


def _decode(what: str, payload: bytes | dict) -> tuple[str, dict]:
    """A queued change as (ADDED/MODIFIED/DELETED, the pod); a remembered pod counts as ADDED."""
    if what == "event":
        event = payload if isinstance(payload, dict) else json.loads(payload)
        kind, obj = event["type"], event["object"]
    else:
        kind, obj = "ADDED", payload if isinstance(payload, dict) else json.loads(payload)
    if kind not in ("ADDED", "MODIFIED", "DELETED") or not isinstance(obj["metadata"]["name"], str):
        raise ValueError(f"not a pod change: {kind}")
    return kind, obj


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
        # Not applied yet, in arrival order: ("event", a watch event: its raw line, or decoded when
        # it had to be) or ("pod", a pod from remember: raw JSON or a dict), each with the pod's
        # name and resourceVersion where they could be read without decoding (else None). _flush
        # decodes the newest of each pod and applies it; a list drops them (and bumps the generation).
        self._pending: list[tuple[str, bytes | dict, str | None, int | None]] = []
        self._generation = 0
        # Nobody reading (ticks failing before observe, say) must not let the queue grow without
        # bound: past this many entries the watch thread applies it itself (~6 KB each; a burst of
        # 1,000 launches queues ~2,000: each create's response and its ADDED event).
        self.flush_after = 5000
        self._flush_lock = threading.Lock()  # one flusher at a time: queued changes apply in order
        self._undecodable = False  # a queued line did not decode: the watch thread must relist
        self.resource_version: str | None = None
        self._healthy = False
        self._stop = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None
        self.relists = 0

    # -- reading ----------------------------------------------------------------------------------

    def snapshot(self) -> list[dict] | None:
        """The pods as last seen, or None when the copy cannot be trusted (list instead)."""
        self._flush()
        with self._lock:
            return list(self._pods.values()) if self._healthy else None

    def remember(self, pod: dict) -> None:
        """Read-your-writes: a pod we just created is known before its watch event arrives."""
        with self._lock:
            self._pending.append(("pod", pod, pod["metadata"]["name"], _rv(pod)))

    def remember_raw(self, name: str, pod_json: bytes) -> None:
        """``remember`` for a pod as the API server answered it (raw JSON), decoded when read."""
        version = object_version(pod_json)
        with self._lock:
            self._pending.append(("pod", pod_json, name, None if version is None else int(version)))

    def forget(self, names: set[str]) -> None:
        self._flush()  # changes that arrived before must not bring the pods back later
        with self._lock:
            for name in names:
                self._pods.pop(name, None)

    def names(self) -> set[str]:
        self._flush()
        with self._lock:
            return set(self._pods)

    def _flush(self) -> None:
        """Apply what is queued. Only each pod's newest change (highest resourceVersion; of two
        alike, the later) is decoded, outside the lock the watch thread appends under: a pod
        created, scheduled and started between two reads is decoded once, not four times (its
        create's response, ADDED, two MODIFIED). An entry whose name or version could not be read
        raw is decoded to learn them. A change that does not decode distrusts the copy: the watch
        thread lists again (``snapshot()`` says None until then)."""
        with self._flush_lock:
            with self._lock:
                pending, self._pending = self._pending, []
                generation = self._generation
            if not pending:
                return
            try:
                decoded: dict[int, tuple[str, dict]] = {}
                newest: dict[str, tuple[int, int]] = {}  # name -> (version, index into pending)
                for index, (what, payload, name, version) in enumerate(pending):
                    if name is None or version is None:
                        decoded[index] = kind_obj = _decode(what, payload)
                        name, version = kind_obj[1]["metadata"]["name"], _rv(kind_obj[1])
                    best = newest.get(name)
                    if best is None or version >= best[0]:
                        newest[name] = (version, index)
                changes = [decoded[index] if index in decoded else _decode(*pending[index][:2])
                           for _version, index in newest.values()]
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                log.warning("pod watch: an undecodable change (%s); listing again", exc)
                with self._lock:
                    self._healthy = False
                    self._undecodable = True
                return
            with self._lock:
                if generation != self._generation:  # listed again since: the list saw all of this
                    return
                for kind, obj in changes:
                    self._change(kind, obj)

    def _change(self, kind: str, obj: dict) -> None:  # under self._lock
        name = obj["metadata"]["name"]
        current = self._pods.get(name)
        if current is not None and _rv(current) > _rv(obj):
            return  # we know a newer state of this pod already
        if kind == "DELETED":
            self._pods.pop(name, None)
        else:
            self._pods[name] = obj

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
            self._pending = []  # changes before the list: it has them, or newer
            self._generation += 1
            self._undecodable = False
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
                if self._undecodable:  # a reader could not decode a queued event
                    raise ValueError("an undecodable watch event")
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._receive(line)
        finally:
            self._response = None
            resp.release_conn()

    def _receive(self, line: bytes) -> None:
        """One line of the stream: a pod change is queued raw (its version read, not decoded);
        anything else is decoded and handled now."""
        version = event_version(line)
        if version is not None:
            name = event_name(line)
            with self._lock:
                self._pending.append(("event", line, name, int(version)))
                self.resource_version = version
                queued = len(self._pending)
            if queued > self.flush_after:
                self._flush()
        elif line.strip():
            self._apply(json.loads(line))

    def _apply(self, event: dict) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise WatchExpired(obj.get("message", ""))
            raise ValueError(f"watch error: {obj.get('message', obj)}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        with self._lock:
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._pending.append(("event", event, obj["metadata"]["name"], _rv(obj)))  # behind the changes queued before it
            if version:  # a BOOKMARK carries only this
                self.resource_version = version
