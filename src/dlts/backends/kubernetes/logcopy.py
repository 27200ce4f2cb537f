"""Copying the output of an attempt's pods into the log store, so that it outlives the pods.

On Kubernetes a job writes to its container's stdout and nothing else; the kubelet keeps that
output only while the pod exists. ``LogCopier`` reads it with the pod log API and appends it
through ``dlts.logstore.AttemptLogWriter`` (so the store's size cap and rotation apply):

* **What is read.** The ``job`` container of every pod of the attempt whose container has started,
  ``timestamps=true`` so each line carries the kubelet's RFC 3339 time, ``sinceTime`` from the last
  line copied and ``limitBytes`` per request (``chunk_bytes``; a response cut there loses its last,
  partial line, which the next request reads again). ``sinceTime`` reaches the kubelet at whole
  seconds, so a read starts at the second of the last copied line and the lines already copied
  are skipped by time (and, for several lines with the same time, by count).
* **Whose log.** Each pod carries its attempt's log key (annotation ``dlts.io/log-key``, from the
  attempt row); its output goes to the log of that key (``dlts.logstore``). A pod left over from a
  job that a database restore discarded, with the same job id and attempt number as a new one,
  writes to its own (orphaned) log, never to the new job's.
* **Nothing twice, nothing lost, across calls and restarts.** Where each pod's copy stands is in a
  small cursor file next to the log, ``<log_dir>/<job>/attempt-<n>-<key>.k8s-cursor`` (JSON: per pod its
  uid, the time of its last copied line and how many lines at that time were copied, plus the log's
  size then). A batch is journalled before it is appended: the cursor first records the batch as
  pending with the log size it will make, then the lines go to the log, then the cursor commits.
  A copier that starts again (a new managers process) finds a pending batch committed if the log
  reached that size, else discards it and reads those lines again. A pod whose uid differs from the
  cursor's (a replica created again under the same name) is copied from its start.
* **Several pods per attempt** (distributed ranks, inference replicas): one log per attempt. Pods
  are copied one after another in index order, each batch as a block of whole lines; the lines of
  the pod of index 0 are written as printed, those of index ``i > 0`` start with ``[i] ``. Lines of
  different pods are therefore in the order they were copied, not interleaved by time within one
  copy interval (``log_sync_s``).
* **Bounded parallelism.** ``sync`` copies up to ``parallelism`` attempts at once (a small thread
  pool); the pods of one attempt are copied by one thread (one writer per attempt log). A pod whose
  log cannot be read now (node unreachable, pod gone, a refusal) is skipped with a warning and
  tried again on the next call; ``copy_rest`` (before ``forget``) raises ``KubernetesRefused``
  instead, so the pods are kept until their output is safe. That is about this attempt only: the
  job manager records it on the job and goes on with the others.
* **A node that is lost.** Before ``forget`` deletes the pods of a lost node (NotReady or gone for
  ``node_lost_after_s``), whatever its kubelet still serves is copied; what it cannot serve went with
  the node (at most ``log_sync_s`` of output, the rest was copied while the job ran), and the log
  says so in one line, as below, instead of keeping the pods until a node that may never return does.
* **A full log volume** (``ENOSPC``, ``EDQUOT``, ``EIO``): the output stays with the kubelet. ``sync``
  copies nothing more until the volume has room (one warning when that starts, one when it ends);
  ``copy_rest`` raises ``KubernetesRefused``, so the pods are kept, and their output with them,
  until it can be copied (the job manager records the refusal on the job and ends it all the same).
* **A log the node cannot return.** The kubelet answers a log it can no longer read (the container
  or its log file is gone) with HTTP 200 and its error as the body. Since every line of real output
  starts with its timestamp, such a body is told apart: the attempt's log gets one line
  ``[dlts] the rest of this output could not be read from the node: <the kubelet's words>``, the pod
  is not read again, and ``forget`` goes on to delete it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from dlts.backends.kubernetes.api import (
    KubernetesApi,
    KubernetesRefused,
    status_message,
)
from dlts.backends.kubernetes.names import JOB_CONTAINER, log_key, replica_index
from dlts.backends.kubernetes.translate import started_at
from dlts.logstore import AttemptLogWriter, attempt_stem, job_dir, volume_error

log = logging.getLogger(__name__)

CHUNK_BYTES = 4 * 1024 * 1024  # limitBytes of one log request
_MAX_CHUNK_BYTES = 64 * 1024 * 1024  # more output than this within one second: copied next time


def cursor_path(log_dir: Path, job_id: int, attempt: int, *, key: str | None) -> Path:
    return job_dir(log_dir, job_id) / f"{attempt_stem(attempt, key)}.k8s-cursor"


def parse_stamp(text: bytes | str) -> tuple[int, int] | None:
    """(seconds since the epoch, nanoseconds) of a kubelet RFC 3339 (nano) timestamp; None if not one."""
    if isinstance(text, bytes):
        try:
            text = text.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not text.endswith("Z") or "T" not in text:
        return None
    whole, _, frac = text[:-1].partition(".")
    if frac and not frac.isdigit():
        return None
    try:
        seconds = int(dt.datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.UTC).timestamp())
    except ValueError:
        return None
    return seconds, int((frac + "000000000")[:9]) if frac else 0


def _second(stamp: tuple[int, int]) -> str:
    return dt.datetime.fromtimestamp(stamp[0], dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Cursor:
    """The cursor file of one attempt (see the module docstring)."""

    def __init__(self, path: Path, log_size: int) -> None:
        self.path = path
        self.pods: dict[str, dict[str, Any]] = {}
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return
        except ValueError:
            log.warning("log cursor %s is unreadable; copying its pods' output from their start", path)
            return
        self.pods = dict(data.get("pods") or {})
        pending = data.get("pending")
        if pending and log_size >= int(pending["size"]):
            self.pods[pending["pod"]] = {k: pending[k] for k in ("uid", "ts", "n", "gone") if k in pending}

    def save(self, size: int, pending: Mapping[str, Any] | None = None) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640)
        with os.fdopen(fd, "w") as fh:
            json.dump({"size": size, "pods": self.pods, "pending": pending}, fh)
        os.replace(tmp, self.path)


class LogCopier:
    def __init__(self, api: KubernetesApi, namespace: str, log_dir: Path, log_max_bytes: int, *,
                 parallelism: int = 4, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.api = api
        self.namespace = namespace
        self.log_dir = Path(log_dir)
        self.log_max_bytes = int(log_max_bytes)
        self.parallelism = max(1, int(parallelism))
        self.chunk_bytes = int(chunk_bytes)
        self._locks: dict[tuple[int, int], threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._volume_fault = ""  # why the log volume refused the last write ("" while it takes them)

    def _lock(self, key: tuple[int, int]) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    def sync(self, attempts: Mapping[tuple[int, int], Sequence[Mapping[str, Any]]]) -> None:
        """Copy what is new in each attempt's pods; a pod that cannot be read now waits for next time."""
        work = [(key, pods) for key, pods in sorted(attempts.items()) if any(started_at(p) for p in pods)]
        if not work:
            return
        if len(work) == 1:
            self.copy(*work[0], strict=False)
            return
        with ThreadPoolExecutor(max_workers=min(self.parallelism, len(work)),
                                thread_name_prefix="dlts-k8s-logs") as pool:
            for future in [pool.submit(self.copy, key, pods, strict=False) for key, pods in work]:
                future.result()

    def copy_rest(self, key: tuple[int, int], pods: Sequence[Mapping[str, Any]],
                  lost_nodes: Mapping[str, str] | None = None) -> None:
        """Copy everything not yet copied (before the pods are deleted); raises
        ``KubernetesRefused`` when a started pod's log cannot be read, unless the pod's node is in
        ``lost_nodes`` (name -> why): the rest of that output went with the node, and the log says so."""
        self.copy(key, pods, strict=True, lost_nodes=lost_nodes or {})

    def forget(self, key: tuple[int, int]) -> None:
        with self._locks_guard:
            self._locks.pop(key, None)

    def copy(self, key: tuple[int, int], pods: Iterable[Mapping[str, Any]], *, strict: bool,
             lost_nodes: Mapping[str, str] | None = None) -> None:
        started = sorted((p for p in pods if started_at(p) is not None), key=replica_index)
        if not started:
            return
        by_log: dict[str | None, list[Mapping[str, Any]]] = {}
        for pod in started:  # one log key per attempt; pods of another attempt row write elsewhere
            by_log.setdefault(log_key(pod), []).append(pod)
        with self._lock(key):
            try:
                self._copy_logs(key, by_log, strict, lost_nodes or {})
            except OSError as exc:
                if not volume_error(exc):
                    raise
                if not self._volume_fault:
                    log.warning("the log volume %s refuses the pods' output (%s): it stays with the kubelet and is "
                                "copied once there is room", self.log_dir, exc.strerror)
                self._volume_fault = exc.strerror or str(exc)
                if strict:
                    raise KubernetesRefused(f"the log volume has no room for the pods' output ({exc.strerror}); "
                                            "the pods are kept until it is copied") from None
                return
        if self._volume_fault:
            log.warning("the log volume %s takes the pods' output again", self.log_dir)
            self._volume_fault = ""

    def _copy_logs(self, key: tuple[int, int], by_log: Mapping[str | None, list[Mapping[str, Any]]], strict: bool,
                   lost_nodes: Mapping[str, str]) -> None:
        job_id, attempt = key
        for log_key_, group in by_log.items():
            try:
                writer = AttemptLogWriter(self.log_dir, job_id, attempt, self.log_max_bytes, key=log_key_)
            except ValueError as exc:  # an annotation DLTS did not write: no file is named from it
                log.warning("job %s attempt %s: pods %s not copied: %s", job_id, attempt,
                            ", ".join(p["metadata"]["name"] for p in group), exc)
                continue
            try:
                cursor = _Cursor(cursor_path(self.log_dir, job_id, attempt, key=log_key_), writer.size)
                for pod in group:
                    self._copy_pod(pod, writer, cursor, strict, lost_nodes)
            finally:
                writer.close()

    def _output_gone(self, name: str, uid: str, entry: Mapping[str, Any] | None, prefix: bytes, data: bytes,
                     writer: AttemptLogWriter, cursor: _Cursor) -> None:
        """With ``timestamps=true`` every line a container printed starts with its time. A body that
        does not is the kubelet saying it cannot read the log, answered with HTTP 200: "unable to
        retrieve container logs for containerd://..." once the container is gone, "failed to try
        resolving symlinks in path /var/log/pods/..." once its log file is. It is not the job's
        output: the log gets one line saying the rest could not be read, and the pod is not read
        again (its output is gone, so its objects can go)."""
        said = data.split(b"\n", 1)[0].decode("utf-8", "replace").strip()[:300]
        log.warning("pod %s: its node cannot return the rest of its log: %s", name, said)
        note = prefix + f"[dlts] the rest of this output could not be read from the node: {said}\n".encode()
        gone = {"uid": uid, "ts": list(entry["ts"]) if entry else [0, 0], "n": int(entry["n"]) if entry else 0,
                "gone": True}
        cursor.save(writer.size, pending={"pod": name, **gone, "size": writer.size + len(note)})
        writer.write(note)
        cursor.pods[name] = gone
        cursor.save(writer.size)

    def _copy_pod(self, pod: Mapping[str, Any], writer: AttemptLogWriter, cursor: _Cursor, strict: bool,
                  lost_nodes: Mapping[str, str]) -> None:
        meta = pod["metadata"]
        name, uid = str(meta["name"]), str(meta.get("uid") or "")
        entry = cursor.pods.get(name)
        if entry is not None and entry.get("uid") != uid:
            entry = None  # another pod under the same name: its own output, from its start
        if entry is not None and entry.get("gone"):
            return  # its node could not return the rest of its output; the log says so once
        index = replica_index(pod)
        prefix = b"" if index == 0 else f"[{index}] ".encode()
        limit = self.chunk_bytes
        while True:
            last = tuple(entry["ts"]) if entry else None
            try:
                data = self.api.pod_log(name, self.namespace, container=JOB_CONTAINER,
                                        since_time=_second(last) if last else None,
                                        limit_bytes=limit)
            except (ApiException, KubernetesRefused) as exc:
                if exc.status == 404:  # the pod is gone: nothing more can be read
                    return
                message = status_message(exc) if isinstance(exc, ApiException) else str(exc)
                what = f"cannot read the log of pod {name} (HTTP {exc.status}): {message}"
                node = str((pod.get("spec") or {}).get("nodeName") or "")
                if strict and node in lost_nodes:  # gone with its node: at most log_sync_s of it
                    self._output_gone(name, uid, entry, prefix, lost_nodes[node].encode(), writer, cursor)
                    return
                if strict:
                    raise KubernetesRefused(what, status=int(exc.status or 0)) from None
                log.warning("%s; trying again later", what)
                return
            if data and parse_stamp(data.partition(b" ")[0]) is None:
                self._output_gone(name, uid, entry, prefix, data, writer, cursor)
                return
            truncated = len(data) >= limit
            lines = data.split(b"\n")
            tail = lines.pop()
            if tail and not truncated:
                lines.append(tail)  # a last line without a newline, complete as it is
            skip = int(entry["n"]) if entry else 0
            batch: list[bytes] = []
            stamp = last
            count = skip
            for raw in lines:
                head, _, text = raw.partition(b" ")
                this = parse_stamp(head)
                if this is None:  # not a timestamped line: keep it whole, at the previous time
                    this, text = stamp or (0, 0), raw
                if last is not None and this < last:
                    continue
                if last is not None and this == last and skip > 0:
                    skip -= 1
                    continue
                count = count + 1 if this == stamp else 1
                stamp = this
                batch.append(prefix + text + b"\n")
            if batch:
                blob = b"".join(batch)
                entry = {"uid": uid, "ts": list(stamp or (0, 0)), "n": count}
                cursor.save(writer.size, pending={"pod": name, **entry, "size": writer.size + len(blob)})
                writer.write(blob)
                cursor.pods[name] = entry
                cursor.save(writer.size)
            if not truncated:
                return
            if not batch:
                limit *= 2  # a second holding more than one read: read more of it at once
                if limit > _MAX_CHUNK_BYTES:
                    log.warning("pod %s printed more than %d bytes within one second; the rest of that second "
                                "is skipped", name, _MAX_CHUNK_BYTES)
                    if entry is not None:
                        entry = {**entry, "ts": [entry["ts"][0] + 1, 0], "n": 0}
                        cursor.pods[name] = entry
                        cursor.save(writer.size)
                    return
            else:
                limit = self.chunk_bytes
