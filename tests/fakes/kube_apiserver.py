"""A stateful stand-in for the Kubernetes API server, served over real HTTP on loopback.

No real API server can be installed on the machines DLTS is built and tested on, so the
Kubernetes backend is tested against this one with the *official* ``kubernetes`` client talking
HTTP through an ordinary kubeconfig. What it owns:

* the resources the backend uses: core/v1 namespaces, pods (+ ``/status``, + ``/log``), services,
  secrets (``kubernetes.io/dockerconfigjson`` checked), configmaps, events, nodes (+ ``/status``,
  with ``InternalIP`` / ``Hostname`` addresses), and networking.k8s.io/v1 NetworkPolicies; create,
  get, list, replace, patch (JSON merge, strategic merge, JSON patch), delete and deletecollection;
* the API semantics the backend relies on, as the real server implements them: label selectors
  (equality, set-based, existence, ``!=``/``notin`` matching objects *without* the key), field
  selectors, paged lists (``limit``/``continue`` served from the first page's snapshot,
  ``remainingItemCount``; a token of a compacted revision, see ``Store.compact``, is 410 Expired),
  ``resourceVersion`` preconditions (409 Conflict when stale), 409 AlreadyExists,
  404 NotFound, 422 Invalid for bad names/labels, 401 without the bearer token, all as real
  ``Status`` objects; graceful pod deletion (``deletionTimestamp`` first, removal by the kubelet);
* the pod log endpoint (``container``, ``timestamps`` in RFC 3339 nano, ``sinceTime`` in whole
  seconds as it reaches the kubelet, ``sinceSeconds``, ``tailLines``, ``limitBytes``; 400 for a
  container that has not started) serving what the fake containers printed (``echo`` in their
  program, or ``FakeKubeApiServer.print_output``) as text/plain, after the server's content
  negotiation: an ``Accept`` header none of whose entries is application/json, application/yaml,
  application/vnd.kubernetes.protobuf, ``application/*`` or ``*/*`` (``text/plain`` alone) is a
  406 NotAcceptable Status;
* ``/version`` for the ``version`` the server is made with (default ``v1.30.0-dlts-fake``);
* a scheduler (``FakeScheduler``) that binds pods without ``nodeName`` by kube-scheduler's filters
  (unschedulable nodes, taints incl. not-ready, node affinity with ``matchFields metadata.name``,
  resource fit against allocatable minus bound pods) or leaves them Pending with PodScheduled
  False, reason Unschedulable and a message shaped like the real one;
* Services as the real allocator treats them: a NodePort service's ports get ``nodePort`` values
  unique across the cluster from 30000-32767 (an explicit one is checked: range, already
  allocated), an update that omits a port's ``nodePort`` keeps the one the port *of the same name*
  had, ``clusterIP`` is kept across updates, and the port list is validated (names, duplicates,
  at least one port); a full range is a 500 "failed to allocate a nodePort", as from the real one;
* a simulated kubelet (``FakeKubelet``) of that version that first admits each pod by its sysctls
  (only the "safe" sysctls of that version, none of a namespace shared with the host; else the pod
  is Failed, reason SysctlForbidden, message ``Pod forbidden sysctl: "NAME" not whitelisted`` as
  from 1.20, "not allowlisted" from 1.22, "Pod was rejected: ..." from 1.26, and nothing of it
  starts), pulls images from a table of known images and their
  files (``ImageTable``: busybox has ``/bin/busybox`` and ``/bin/sh``; python:3.11, pytorch/pytorch,
  debian:12 have ``/bin/sh`` and no busybox or tini; distroless has no shell; anything else is
  ErrImagePull then ImagePullBackOff), runs init containers in order (a command that needs a file
  the container lacks fails; a failed init container fails the pod, Init:Error), refuses
  ``runAsNonRoot`` without a non-zero uid on an image that runs as root
  (CreateContainerConfigError), fails a container whose entry binary is missing (StartError),
  then moves pods Running -> Succeeded/Failed according to a tiny script in the pod's command
  (see "Script convention" below), freezes pods on a node that is NotReady, and marks nodes
  NotReady on request;
* instrumentation for tests and benchmarks: per-verb request counters, injected errors and delays.

Script convention (what the fake kubelet runs)
-----------------------------------------------
Containers run no processes: a small POSIX-shell interpreter (``parse_script``) works out how a
program ends on the fake clock. The job container's program is its env variable ``DLTS_COMMAND``
when present (DLTS passes the user's command that way), else the last element of
``command + args``; init containers run their ``command + args`` as a kubelet would (a shell's
``-c`` script is interpreted, ``busybox APPLET ...`` and ``/path/busybox APPLET`` dispatch to the
applet, a name without ``/`` is looked up on ``$PATH``). The shell knows:

* quoting ('...', "...", backslashes), ``$VAR``, ``${VAR}``, ``${VAR:-default}`` (and ``-``, ``=``,
  ``+``, ``?``), ``$?``, ``$#``, ``$1``..., ``$((...))``; values come from the container's ``env``
  and the script's own assignments (``$(...)`` expands to nothing: no program runs for output);
* ``;``, newlines, ``&&``, ``||``, ``|``, ``&`` (run in line), ``!``, ``{ ...; }``, ``( ... )``,
  ``if/then/elif/else/fi``, ``for/in/do/done``, ``while``/``until`` (a loop past 1000 rounds runs
  until the pod is deleted), functions; ``case`` is a syntax error of the fake;
* builtins ``echo``, ``printf``, ``exit N``, ``true``/``:``, ``false``, ``set`` (``-e``, ``-u``,
  ``--``), ``export``, ``unset``, ``umask``, ``test``/``[`` (files, strings, integers), ``cd``,
  ``command -v``, ``exec``, ``shift``, ``eval``; others (``trap``, ``wait``, ``kill``) succeed;
* ``sleep N`` (seconds, may be fractional): N more seconds of the fake clock; ``sleep infinity``
  runs until the pod is deleted; ``echo``/``printf`` print a line at that point of the run;
* redirections: ``>``/``>>`` write the file (so stdout is not printed), ``<`` needs the file,
  ``2>``/``2>&1``/``>&2`` are accepted.

In init containers every file is checked against the container's view (``_ContainerFiles``: its
mounts, subPath included, then the image's files): a command that is not there exits 127 with
``sh: NAME: not found``; an applet busybox lacks, 127 ``NAME: applet not found``; ``cp``/``mv``
sources, ``chmod`` targets, ``awk``/``cat`` inputs must exist (busybox's words); a write needs a
mount that is not ``readOnly`` or a root filesystem that is not ``readOnlyRootFilesystem``. What
an init writes into an emptyDir (and removes from it) is there for the containers after it; a
subPath of an emptyDir nobody wrote is made a directory, which cannot be mounted on a file the
image has (StartError, as from runc). The job container's own program is not checked against
files: it stands for the user's program (``python train.py`` succeeds at once). The last
command's status is the exit code (``set -e`` and ``exit`` end it earlier).

So ``sleep 5; exit 3`` runs 5 s then fails with 3; ``python train.py`` succeeds at once.
A pod annotation ``fake.dlts.io/start-delay-s`` delays Pending -> Running (image pull time).

Time is a ``FakeClock`` that tests advance explicitly; ``FakeKubelet.tick()`` applies what is due.
Watches stream JSON-line events (ADDED, MODIFIED, DELETED, BOOKMARK; ERROR with 410 Expired for a
compacted resourceVersion) over chunked HTTP until ``timeoutSeconds``.

Limits (documented, not hidden): no admission beyond the validations named above (no
PriorityClass lookup: a pod's ``preemptionPolicy`` is taken as given; no quota), no kubelet
admission but of sysctls (pods bound with ``nodeName`` run even when they do not fit), init containers
run once (``restartPolicy`` is taken as Never), the shell runs no real program (file contents are
not modelled: ``awk`` and ``cat`` only need their inputs to exist), and only core/v1 and
networking.k8s.io/v1.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import fnmatch
import itertools
import json
import random
import re
import socket
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

NAMESPACED = {"pods": "Pod", "services": "Service", "secrets": "Secret", "configmaps": "ConfigMap", "events": "Event",
              "networkpolicies": "NetworkPolicy"}
CLUSTER_SCOPED = {"nodes": "Node", "namespaces": "Namespace"}
KINDS = {**NAMESPACED, **CLUSTER_SCOPED}
# The API group/version each resource is served under (the path prefix and the objects' apiVersion).
GROUP_VERSIONS = dict.fromkeys(KINDS, "v1") | {"networkpolicies": "networking.k8s.io/v1"}

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
NODE_PORT_RANGE = (30000, 32767)  # the apiserver's default --service-node-port-range
CONFIGMAP_MAX_BYTES = 1024 * 1024
DEFAULT_VERSION = "v1.30.0-dlts-fake"
# What an API server's answer to an Accept header may name (its serializers), and the ranges
# that cover one of them; parameters (";q=", ";as=") are not looked at.
ACCEPTABLE_MEDIA_RANGES = frozenset({"application/json", "application/yaml", "application/vnd.kubernetes.protobuf",
                                     "application/*", "*/*"})
# The kubelet's "safe" sysctls (pkg/kubelet/sysctl/safe_sysctls.go), allowed without
# --allowed-unsafe-sysctls: name -> (the first minor version of 1.x that has it, its namespace).
# The kernel version each needs is taken as met.
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced": (0, "ipc"),
    "net.ipv4.ip_local_port_range": (0, "net"),
    "net.ipv4.tcp_syncookies": (0, "net"),
    "net.ipv4.ping_group_range": (18, "net"),
    "net.ipv4.ip_unprivileged_port_start": (22, "net"),
    "net.ipv4.ip_local_reserved_ports": (27, "net"),
    "net.ipv4.tcp_keepalive_time": (29, "net"),
    "net.ipv4.tcp_fin_timeout": (29, "net"),
    "net.ipv4.tcp_keepalive_intvl": (29, "net"),
    "net.ipv4.tcp_keepalive_probes": (29, "net"),
    "net.ipv4.tcp_rmem": (32, "net"),
    "net.ipv4.tcp_wmem": (32, "net"),
}
_GIT_VERSION = re.compile(r"^v(\d+)\.(\d+)(\.\d+)?(-[^+]*)?(\+.*)?$")


def _git_version(git_version: str) -> re.Match[str]:
    match = _GIT_VERSION.match(git_version)
    if not match:
        raise ValueError(f"not a Kubernetes gitVersion: {git_version!r}")
    return match


def parse_version(git_version: str) -> tuple[int, int]:
    """(major, minor) of a gitVersion such as "v1.20.2" or "v1.30.0-dlts-fake"."""
    match = _git_version(git_version)
    return int(match[1]), int(match[2])


def version_info(git_version: str) -> dict[str, str]:
    """``GET /version`` as a server built at ``git_version`` answers it: hack/lib/version.sh
    makes major and minor from it, minor with a "+" when a pre-release suffix ("-...") follows."""
    match = _git_version(git_version)
    return {"major": match[1], "minor": match[2] + ("+" if match[4] else ""), "gitVersion": git_version}


def acceptable(accept: str | None) -> bool:
    """Whether an ``Accept`` header lets the API server answer (no header, or any entry it serves)."""
    if accept is None or not accept.strip():
        return True
    ranges = {entry.split(";", 1)[0].strip().lower() for entry in accept.split(",")}
    return bool(ranges & ACCEPTABLE_MEDIA_RANGES)


def rfc3339(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339nano(t: float) -> str:
    """Go's time.RFC3339Nano, as the kubelet stamps log lines: nanoseconds, trailing zeros dropped."""
    seconds = int(t // 1)
    frac = round((t - seconds) * 1e9)  # t * 1e9 would lose the nanoseconds to float rounding
    seconds, frac = seconds + frac // 1_000_000_000, frac % 1_000_000_000
    whole = dt.datetime.fromtimestamp(seconds, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{frac:09d}".rstrip("0").rstrip(".") + "Z"


class FakeClock:
    """Seconds since the epoch that only move when a test says so (thread-safe)."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        with self._lock:
            self._now += seconds
            return self._now


class ApiError(Exception):
    """Raised inside the server; rendered as a Kubernetes ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None,
                 metadata: dict | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}
        self.metadata = metadata or {}

    def status(self) -> dict:
        out = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": dict(self.metadata),
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:  # the real server leaves details out when it has none
            out["details"] = self.details
        return out


def _bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


# -- label and field selectors ------------------------------------------------------------------


def _valid_qualified_name(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_LABEL_NAME.match(name))


def _valid_label_value(value: str) -> bool:
    return len(value) <= 63 and bool(_LABEL_VALUE.match(value))


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if not present:
            return False
        try:
            number = int(value)  # type: ignore[arg-type]
        except ValueError:
            return False
        bound = int(self.values[0])
        return number > bound if self.op == "gt" else number < bound


_TOKEN = re.compile(r"\s*(==|!=|=|!|\(|\)|,|<|>|[^\s=!(),<>]+)")


def parse_label_selector(text: str) -> tuple[Requirement, ...]:
    """Parse a label selector with the grammar of k8s.io/apimachinery/pkg/labels.Parse."""
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m:
            raise _bad_request(f"unable to parse requirement: {text!r}")
        tokens.append(m.group(1))
        pos = m.end()
    reqs: list[Requirement] = []
    i = 0

    def expect_key(tok: str) -> str:
        if not _valid_qualified_name(tok):
            raise _bad_request(
                f"unable to parse requirement: invalid label key {tok!r}: name part must consist of "
                "alphanumeric characters, '-', '_' or '.'"
            )
        return tok

    def expect_value(tok: str) -> str:
        if not _valid_label_value(tok):
            raise _bad_request(f"unable to parse requirement: invalid label value: {tok!r}")
        return tok

    while i < len(tokens):
        tok = tokens[i]
        if tok == "!":
            if i + 1 >= len(tokens):
                raise _bad_request("unable to parse requirement: found '', expected: identifier")
            reqs.append(Requirement(expect_key(tokens[i + 1]), "!"))
            i += 2
        else:
            key = expect_key(tok)
            nxt = tokens[i + 1] if i + 1 < len(tokens) else ","
            if nxt == ",":
                reqs.append(Requirement(key, "exists"))
                i += 1
            elif nxt in ("=", "==", "!="):
                value = ""
                j = i + 2
                if j < len(tokens) and tokens[j] not in (",",):
                    value = expect_value(tokens[j])
                    j += 1
                reqs.append(Requirement(key, "!=" if nxt == "!=" else "=", (value,)))
                i = j
            elif nxt in ("in", "notin"):
                if i + 2 >= len(tokens) or tokens[i + 2] != "(":
                    raise _bad_request(f"unable to parse requirement: found {tokens[i+2:i+3]}, expected: '('")
                j = i + 3
                values: list[str] = []
                while j < len(tokens) and tokens[j] != ")":
                    if tokens[j] != ",":
                        values.append(expect_value(tokens[j]))
                    j += 1
                if j >= len(tokens):
                    raise _bad_request("unable to parse requirement: found '', expected: ')'")
                reqs.append(Requirement(key, nxt, tuple(values)))
                i = j + 1
            elif nxt in ("<", ">"):
                if i + 2 >= len(tokens) or not re.fullmatch(r"-?\d+", tokens[i + 2]):
                    raise _bad_request("unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer")
                reqs.append(Requirement(key, "gt" if nxt == ">" else "lt", (tokens[i + 2],)))
                i += 3
            else:
                raise _bad_request(f"unable to parse requirement: found {nxt!r}, expected: in, notin, =, ==, !=, gt, lt")
        if i < len(tokens):
            if tokens[i] != ",":
                raise _bad_request(f"unable to parse requirement: found {tokens[i]!r}, expected: ','")
            i += 1
            if i >= len(tokens):
                raise _bad_request("unable to parse requirement: found '', expected: identifier")
    return tuple(reqs)


_FIELDS: dict[str, Callable[[dict], str]] = {
    "metadata.name": lambda o: o["metadata"].get("name", ""),
    "metadata.namespace": lambda o: o["metadata"].get("namespace", ""),
    "spec.nodeName": lambda o: (o.get("spec") or {}).get("nodeName", ""),
    "status.phase": lambda o: (o.get("status") or {}).get("phase", ""),
    "spec.unschedulable": lambda o: str(bool((o.get("spec") or {}).get("unschedulable"))).lower(),
}


def parse_field_selector(text: str, resource: str) -> list[tuple[str, bool, str]]:
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"([A-Za-z.]+)\s*(==|!=|=)\s*(.*)", part)
        if not m:
            raise _bad_request(f"invalid selector: {part!r}; can't understand {part!r}")
        field, op, value = m.groups()
        if field not in _FIELDS:
            raise _bad_request(f'"{field}" is not a known field selector: only "{", ".join(_FIELDS)}"')
        out.append((field, op == "!=", value))
    return out


# -- patches ------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# Merge keys of the list fields we care about (from the Kubernetes OpenAPI x-kubernetes-patch-merge-key).
_MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "env": "name", "volumes": "name",
    "volumeMounts": "mountPath", "ports": "containerPort", "conditions": "type",
    "taints": "key", "imagePullSecrets": "name", "containerStatuses": "name",
}


def strategic_merge_patch(target: Any, patch: Any, field: str = "") -> Any:
    """Strategic merge patch for the fields the fake knows merge keys for (others: replace)."""
    if isinstance(patch, list):
        key = _MERGE_KEYS.get(field)
        if field == "ports" and patch and all(isinstance(p, dict) and "containerPort" not in p for p in patch):
            key = "port"  # a Service's ports (ServiceSpec.ports: patchMergeKey "port")
        if key and isinstance(target, list) and all(isinstance(p, dict) and key in p for p in patch):
            merged = [copy.deepcopy(t) for t in target]
            for item in patch:
                for idx, existing in enumerate(merged):
                    if isinstance(existing, dict) and existing.get(key) == item[key]:
                        if item.get("$patch") == "delete":
                            merged.pop(idx)
                        else:
                            merged[idx] = strategic_merge_patch(existing, item)
                        break
                else:
                    if item.get("$patch") != "delete":
                        merged.append(copy.deepcopy(item))
            return merged
        return copy.deepcopy(patch)
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for k, value in patch.items():
        if k == "$patch":
            continue
        if value is None:
            result.pop(k, None)
        else:
            result[k] = strategic_merge_patch(result.get(k), value, k)
    return result


def _json_pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"json patch path must start with '/': {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(target: dict, ops: list) -> dict:
    """RFC 6902 JSON patch (add, remove, replace, test)."""
    doc = copy.deepcopy(target)
    for op in ops:
        parts = _json_pointer(op.get("path", ""))
        parent: Any = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.setdefault(p, {})
        last = parts[-1]
        kind = op.get("op")
        if kind == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if current != op.get("value"):
                raise ApiError(422, "Invalid",
                               f"the server rejected our request due to an error in our request: test failed at {op['path']}")
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                idx = len(parent) if last == "-" else int(last)
                if kind == "add":
                    parent.insert(idx, op["value"])
                else:
                    parent[idx] = op["value"]
            else:
                if kind == "replace" and last not in parent:
                    raise ApiError(422, "Invalid", f"replace operation does not apply: doc is missing path: {op['path']}")
                parent[last] = op["value"]
        elif kind == "remove":
            if isinstance(parent, list):
                parent.pop(int(last))
            elif last in parent:
                del parent[last]
            else:
                raise ApiError(422, "Invalid", f"remove operation does not apply: doc is missing path: {op['path']}")
        else:
            raise ApiError(422, "Invalid", f"unsupported json patch op {kind!r}")
    return doc


# -- the store ----------------------------------------------------------------------------------


class Store:
    """All objects, keyed by (resource, namespace, name); every write bumps resourceVersion."""

    def __init__(self, clock: Callable[[], float], history_max: int = 100_000,
                 node_port_range: tuple[int, int] = NODE_PORT_RANGE) -> None:
        self.clock = clock
        self.node_port_range = node_port_range  # the apiserver's --service-node-port-range
        self._random = random.Random(0)  # nodePorts are random, as from the real allocator, yet repeatable
        self.lock = threading.RLock()
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.revision = 1
        self.created = Counter()  # resource -> successful creations (for "created nothing twice")
        # Watch history: (revision, event type, resource, namespace, object JSON). Bounded, like
        # etcd's compaction: a watch from a revision older than what is kept gets 410 Gone.
        self.history: deque[tuple[int, str, str, str, dict, str]] = deque(maxlen=history_max)
        self.changed = threading.Condition(self.lock)
        self.stopping = False
        # Paged lists: a first page with ``limit`` keeps the rest of that list (serialised, as of
        # its resourceVersion) under a continue token, as etcd serves later pages from the same
        # revision. ``compact()`` (etcd compaction) expires the tokens and watches from before.
        self._snapshots: dict[str, tuple[int, list[str]]] = {}
        self.compacted = 0
        # Container output: (namespace, pod uid, container) -> [(time, line without newline)].
        self.logs: dict[tuple[str, str, str], list[tuple[float, bytes]]] = {}
        # (namespace, pod, container) -> what the kubelet answers once that container's log is gone
        self.lost_logs: dict[tuple[str, str, str], str] = {}
        for ns in ("default", "kube-system"):
            self._put("namespaces", "", self._new_meta({"metadata": {"name": ns}}, "namespaces", ""), "ADDED")

    def _bump(self) -> str:
        self.revision += 1
        return str(self.revision)

    def _new_meta(self, obj: dict, resource: str, namespace: str, copied: bool = True) -> dict:
        obj = copy.deepcopy(obj) if copied else obj
        obj["apiVersion"] = GROUP_VERSIONS[resource]
        obj["kind"] = KINDS[resource]
        meta = obj.setdefault("metadata", {})
        meta.pop("deletionTimestamp", None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = rfc3339(self.clock())
        meta["resourceVersion"] = self._bump()
        if namespace:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        return obj

    def _put(self, resource: str, namespace: str, obj: dict, event: str = "MODIFIED") -> str:
        self.objects[(resource, namespace, obj["metadata"]["name"])] = obj
        return self._record(event, resource, namespace, obj)

    def _record(self, event: str, resource: str, namespace: str, obj: dict) -> str:
        """Append a watch event for ``obj`` at the current revision and wake the watchers; returns
        the object's JSON as recorded (what a write answers with)."""
        if event == "DELETED":
            obj = dict(obj, metadata=dict(obj["metadata"], resourceVersion=str(self.revision)))
        labels = dict(obj["metadata"].get("labels") or {})
        text = json.dumps(obj)
        with self.lock:
            self.history.append((self.revision, event, resource, namespace, labels, text))
            self.changed.notify_all()
        return text

    def oldest_watchable(self) -> int:
        """The oldest resourceVersion a watch or a continue token may start from (older ones are
        compacted away)."""
        kept = 0 if len(self.history) < (self.history.maxlen or 0) else self.history[0][0] - 1
        return max(kept, self.compacted)

    def compact(self) -> None:
        """What etcd's periodic compaction does: everything before now is history no one can read."""
        with self.lock:
            self.compacted = self.revision
            self._snapshots.clear()

    def get(self, resource: str, namespace: str, name: str) -> dict:
        with self.lock:
            obj = self.objects.get((resource, namespace, name))
            if obj is None:
                raise not_found(resource, name)
            return copy.deepcopy(obj)

    def list(self, resource: str, namespace: str | None, label_selector: str = "",
             field_selector: str = "", copy_items: bool = True) -> dict:
        reqs = parse_label_selector(label_selector) if label_selector else ()
        fields = parse_field_selector(field_selector, resource) if field_selector else []
        with self.lock:
            items = []
            for (res, ns, _), obj in self.objects.items():
                if res != resource or (namespace is not None and ns != namespace):
                    continue
                labels = obj["metadata"].get("labels") or {}
                if not all(r.matches(labels) for r in reqs):
                    continue
                if not all((_FIELDS[f](obj) == v) != neg for f, neg, v in fields):
                    continue
                items.append(copy.deepcopy(obj) if copy_items else obj)
            items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
            return {
                "apiVersion": GROUP_VERSIONS[resource],
                "kind": f"{KINDS[resource]}List",
                "metadata": {"resourceVersion": str(self.revision)},
                "items": items,
            }

    def list_json(self, resource: str, namespace: str | None, label_selector: str = "",
                  field_selector: str = "", limit: int = 0, continue_token: str = "") -> bytes:
        """The list response serialised under the lock (no copies: the HTTP path's hot spot).

        ``limit`` > 0 pages: ``metadata.continue`` and ``remainingItemCount`` while items remain;
        a continue token of a compacted revision answers 410 Expired as the real server does.
        """
        with self.lock:
            if continue_token:
                rv, start, items = self._continued(continue_token)
            else:
                listed = self.list(resource, namespace, label_selector, field_selector, copy_items=False)
                if not limit:
                    return json.dumps(listed).encode()
                rv, start, items = self.revision, 0, [json.dumps(o) for o in listed["items"]]
            end = start + limit if limit else len(items)
            meta: dict[str, Any] = {"resourceVersion": str(rv)}
            if end < len(items):
                token_id = uuid.uuid4().hex
                self._snapshots[token_id] = (rv, items)
                while len(self._snapshots) > 256:  # old unfinished lists go first
                    self._snapshots.pop(next(iter(self._snapshots)))
                meta["continue"] = base64.urlsafe_b64encode(json.dumps(
                    {"v": "meta.k8s.io/v1", "rv": rv, "start": end, "id": token_id}).encode()).decode()
                meta["remainingItemCount"] = len(items) - end
            head = json.dumps({"apiVersion": GROUP_VERSIONS[resource], "kind": f"{KINDS[resource]}List",
                               "metadata": meta})[:-1]
            return (head + ', "items": [' + ", ".join(items[start:end]) + "]}").encode()

    def _continued(self, token: str) -> tuple[int, int, list[str]]:
        try:
            data = json.loads(base64.urlsafe_b64decode(token.encode()))
            rv, start, token_id = int(data["rv"]), int(data["start"]), str(data["id"])
        except (ValueError, KeyError, TypeError):
            raise _bad_request(f"continue key is not valid: {token!r}") from None
        snapshot = self._snapshots.get(token_id)
        if rv < self.oldest_watchable() or snapshot is None:
            raise ApiError(410, "Expired", (
                "The provided continue parameter is too old to display a consistent list result. You can start "
                "a new list without the continue parameter, or use the continue token in this response to "
                "retrieve the remainder of the results. Continuing with the provided token results in an "
                "inconsistent list - objects that were created, modified, or deleted between the time the first "
                "chunk was returned and now may show up in the list."))
        return snapshot[0], start, snapshot[1]

    # container output ----------------------------------------------------------------------------

    def append_log(self, namespace: str, uid: str, container: str, t: float, text: str | bytes) -> None:
        data = text.encode() if isinstance(text, str) else text
        with self.lock:
            lines = self.logs.setdefault((namespace, uid, container), [])
            for line in data.split(b"\n") if data else [b""]:
                lines.append((t, line))

    def read_log(self, namespace: str, name: str, query: dict[str, str]) -> bytes:
        """``GET .../pods/NAME/log`` as the kubelet answers it through the API server."""
        with self.lock:
            pod = self.objects.get(("pods", namespace, name))
            if pod is None:
                raise not_found("pods", name)
            spec, status = pod.get("spec") or {}, pod.get("status") or {}
            names = [c["name"] for c in spec.get("containers") or []]
            init_names = [c["name"] for c in spec.get("initContainers") or []]
            container = query.get("container") or ""
            if not container:
                if len(names) != 1:
                    raise _bad_request(f"a container name must be specified for pod {name}, choose one of: "
                                       f"[{' '.join(names)}]" + (f" or one of the init containers: [{' '.join(init_names)}]"
                                                                 if init_names else ""))
                container = names[0]
            if container not in names + init_names:
                raise _bad_request(f"container {container} is not valid for pod {name}")
            statuses = (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or [])
            state = next((cs.get("state") or {} for cs in statuses if cs.get("name") == container), {})
            if not state.get("running") and not state.get("terminated"):
                why = (state.get("waiting") or {}).get("reason") or "ContainerCreating"
                raise _bad_request(f'container "{container}" in pod "{name}" is waiting to start: {why}')
            lines = list(self.logs.get((namespace, pod["metadata"]["uid"], container), []))
            lost = self.lost_logs.get((namespace, name, container))
        if lost is not None:
            # a real kubelet whose container (or its log file) is gone answers 200 with its error as the
            # body, with or without timestamps=true
            return lost.encode() + b"\n"
        if query.get("sinceTime"):
            try:
                since = dt.datetime.fromisoformat(query["sinceTime"]).timestamp()
            except ValueError:
                raise _bad_request(f"unable to parse sinceTime {query['sinceTime']!r}") from None
            # PodLogOptions.sinceTime is a metav1.Time: the API server hands it to the kubelet in
            # whole seconds, and the kubelet keeps lines at or after it.
            since = float(int(since))
            lines = [(t, line) for t, line in lines if t >= since]
        elif query.get("sinceSeconds"):
            since = self.clock() - int(query["sinceSeconds"])
            lines = [(t, line) for t, line in lines if t >= since]
        if query.get("tailLines"):
            lines = lines[-int(query["tailLines"]):] if int(query["tailLines"]) else []
        stamps = query.get("timestamps") in ("true", "1")
        out = b"".join((rfc3339nano(t).encode() + b" " if stamps else b"") + line + b"\n" for t, line in lines)
        if query.get("limitBytes"):
            out = out[:int(query["limitBytes"])]
        return out

    def create(self, resource: str, namespace: str, body: dict) -> dict:
        return json.loads(self.create_json(resource, namespace, body, copied=True))

    def create_json(self, resource: str, namespace: str, body: dict, copied: bool = False) -> bytes:
        """``create`` answering with the object's JSON (what the HTTP handler sends). ``body`` is
        the store's from now on unless ``copied`` (the handler's is freshly decoded)."""
        name = (body.get("metadata") or {}).get("name")
        if not name and (body.get("metadata") or {}).get("generateName"):
            name = body["metadata"]["generateName"] + uuid.uuid4().hex[:5]
            body = merge_patch(body, {"metadata": {"name": name}})
        validate(resource, body)
        with self.lock:
            if namespace and ("namespaces", "", namespace) not in self.objects:
                raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found',
                               {"name": namespace, "kind": "namespaces"})
            if (resource, namespace, name) in self.objects:
                raise ApiError(409, "AlreadyExists", f'{resource} "{name}" already exists',
                               {"name": name, "kind": resource})
            obj = self._new_meta(body, resource, namespace, copied)
            if resource == "pods":
                obj["spec"].setdefault("restartPolicy", "Always")
                obj["spec"].setdefault("terminationGracePeriodSeconds", 30)
                status: dict[str, Any] = {"phase": "Pending", "conditions": []}
                if obj["spec"].get("nodeName"):
                    status["conditions"].append({"type": "PodScheduled", "status": "True",
                                                 "lastTransitionTime": rfc3339(self.clock())})
                obj["status"] = status
            if resource == "services":
                self._service_spec(namespace, obj, None)
            text = self._put(resource, namespace, obj, "ADDED")
            self.created[resource] += 1
            return text.encode()

    def replace(self, resource: str, namespace: str, name: str, body: dict, subresource: str = "") -> dict:
        with self.lock:
            current = self.objects.get((resource, namespace, name))
            if current is None:
                raise not_found(resource, name)
            sent_rv = (body.get("metadata") or {}).get("resourceVersion")
            if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
                raise conflict(resource, name)
            if subresource == "status":
                new = copy.deepcopy(current)
                new["status"] = copy.deepcopy(body.get("status") or {})
            else:
                new = copy.deepcopy(body)
                new["status"] = copy.deepcopy(current.get("status"))
                meta = new.setdefault("metadata", {})
                for keep in ("uid", "creationTimestamp", "namespace", "deletionTimestamp",
                             "deletionGracePeriodSeconds"):
                    if keep in current["metadata"]:
                        meta[keep] = current["metadata"][keep]
                meta["name"] = name
                new["apiVersion"], new["kind"] = GROUP_VERSIONS[resource], KINDS[resource]
                validate(resource, new)
                if resource == "services":
                    self._service_spec(namespace, new, current)
            return self._commit(resource, namespace, new)

    def patch(self, resource: str, namespace: str, name: str, patch: Any, content_type: str,
              subresource: str = "") -> dict:
        with self.lock:
            current = self.objects.get((resource, namespace, name))
            if current is None:
                raise not_found(resource, name)
            if "json-patch" in content_type:
                if not isinstance(patch, list):
                    raise _bad_request("json patch body must be a list of operations")
                new = json_patch(current, patch)
            elif not isinstance(patch, dict):
                raise _bad_request("patch body must be a JSON object")
            elif "strategic-merge-patch" in content_type:
                new = strategic_merge_patch(current, patch)
            elif "merge-patch" in content_type:
                new = merge_patch(current, patch)
            else:
                raise ApiError(415, "UnsupportedMediaType",
                               "the body of the request was in an unknown format - accepted media types include: "
                               "application/json-patch+json, application/merge-patch+json, "
                               f"application/strategic-merge-patch+json; got {content_type}")
            # A resourceVersion inside a patch is a precondition (optimistic concurrency).
            sent_rv = (new.get("metadata") or {}).get("resourceVersion")
            if sent_rv != current["metadata"]["resourceVersion"]:
                raise conflict(resource, name)
            for keep in ("uid", "creationTimestamp", "name", "namespace", "deletionTimestamp"):
                if keep in current["metadata"]:
                    new["metadata"][keep] = current["metadata"][keep]
            if subresource == "status":
                spec_side = copy.deepcopy(current)
                spec_side["status"] = new.get("status")
                new = spec_side
            elif "status" in current:
                new["status"] = current["status"]
            validate(resource, new)
            if resource == "services" and subresource != "status":
                self._service_spec(namespace, new, current)
            return self._commit(resource, namespace, new)

    def _node_ports_in_use(self, namespace: str, name: str) -> set[int]:
        """Every nodePort held by a service other than ``namespace/name`` (the cluster-wide allocator)."""
        used: set[int] = set()
        for (res, ns, other), obj in self.objects.items():
            if res == "services" and (ns, other) != (namespace, name):
                used.update(int(p["nodePort"]) for p in (obj.get("spec") or {}).get("ports") or []
                            if p.get("nodePort"))
        return used

    def _service_spec(self, namespace: str, new: dict, current: dict | None) -> None:
        """Validate a Service's ports and allocate what the real apiserver allocates (clusterIP and
        nodePorts), in place. On update, clusterIP is kept and a port without ``nodePort`` keeps the
        one its namesake had (kube-apiserver's patchAllocatedValues maps them by port name)."""
        name = new["metadata"]["name"]
        spec = new.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        old_spec = (current or {}).get("spec") or {}
        causes: list[tuple[str, str]] = []
        if current is not None and spec.get("clusterIP") in (None, ""):
            spec["clusterIP"] = old_spec.get("clusterIP")
        elif current is not None and spec.get("clusterIP") != old_spec.get("clusterIP"):
            causes.append(("spec.clusterIP", f"Invalid value: {spec.get('clusterIP')!r}: field is immutable"))
        elif current is None and spec.get("clusterIP") != "None":
            spec["clusterIP"] = f"10.96.{self.revision % 250}.{self.revision // 250 % 250 + 1}"
        ports = spec.get("ports") or []
        if not ports and spec.get("clusterIP") != "None":
            causes.append(("spec.ports", "Required value"))
        node_type = spec["type"] in ("NodePort", "LoadBalancer")
        names: set[str] = set()
        numbers: set[tuple[Any, str]] = set()
        for i, port in enumerate(ports):
            where = f"spec.ports[{i}]"
            pname = port.get("name") or ""
            if len(ports) > 1 and not pname:
                causes.append((f"{where}.name", "Required value"))
            elif pname and not (len(pname) <= 63 and _DNS1123_LABEL.match(pname)):
                causes.append((f"{where}.name", (f"Invalid value: {pname!r}: a lowercase RFC 1123 label must consist "
                                                "of lower case alphanumeric characters or '-', and must start and "
                                                "end with an alphanumeric character")))
            elif pname in names:
                causes.append((f"{where}.name", f"Duplicate value: {pname!r}"))
            names.add(pname)
            number = port.get("port")
            if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= 65535:
                causes.append((f"{where}.port", f"Invalid value: {number!r}: must be between 1 and 65535, inclusive"))
            protocol = port.setdefault("protocol", "TCP")
            if (number, protocol) in numbers:
                causes.append((where, f"Duplicate value: {{port: {number}, protocol: {protocol}}}"))
            numbers.add((number, protocol))
            port.setdefault("targetPort", number)
            if port.get("nodePort") and not node_type:
                causes.append((f"{where}.nodePort", f"Forbidden: may not be used when `type` is '{spec['type']}'"))
        if causes:
            raise _invalid("services", name, causes)
        if not node_type:
            return
        lo, hi = self.node_port_range
        used = self._node_ports_in_use(namespace, name)
        taken: set[int] = set()
        for i, port in enumerate(ports):
            node_port = port.get("nodePort")
            if not node_port:
                continue
            if not isinstance(node_port, int) or not lo <= node_port <= hi:
                causes.append((f"spec.ports[{i}].nodePort", (f"Invalid value: {node_port!r}: provided port is not in "
                                                            f"the valid range. The range of valid ports is {lo}-{hi}")))
            elif node_port in used or node_port in taken:
                causes.append((f"spec.ports[{i}].nodePort", f"Invalid value: {node_port}: provided port is already allocated"))
            taken.add(node_port)
        if causes:
            raise _invalid("services", name, causes)
        by_name = {p.get("name") or "": p["nodePort"] for p in old_spec.get("ports") or [] if p.get("nodePort")}
        for port in ports:
            inherited = by_name.get(port.get("name") or "")
            if not port.get("nodePort") and inherited and inherited not in taken:
                port["nodePort"] = inherited
                taken.add(inherited)
        for port in ports:
            if not port.get("nodePort"):
                free = [n for n in range(lo, hi + 1) if n not in used and n not in taken]
                if not free:
                    raise ApiError(500, "InternalError", "Internal error occurred: failed to allocate a nodePort: "
                                   "range is full", {"causes": [{"message": "failed to allocate a nodePort: range is full"}]})
                port["nodePort"] = self._random.choice(free)
                taken.add(port["nodePort"])

    def _commit(self, resource: str, namespace: str, new: dict) -> dict:
        new["metadata"]["resourceVersion"] = self._bump()
        self._put(resource, namespace, new)
        return copy.deepcopy(new)

    def delete(self, resource: str, namespace: str, name: str, grace_s: int | None,
               preconditions: dict | None = None) -> dict:
        with self.lock:
            current = self.objects.get((resource, namespace, name))
            if current is None:
                raise not_found(resource, name)
            pre = preconditions or {}
            if pre.get("resourceVersion") and pre["resourceVersion"] != current["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f"Operation cannot be fulfilled on {resource} \"{name}\": "
                               f"Precondition failed: ResourceVersion in precondition: {pre['resourceVersion']}, "
                               f"ResourceVersion in object meta: {current['metadata']['resourceVersion']}",
                               {"name": name, "kind": resource})
            if pre.get("uid") and pre["uid"] != current["metadata"]["uid"]:
                raise ApiError(409, "Conflict", f"Operation cannot be fulfilled on {resource} \"{name}\": "
                               "Precondition failed: UID mismatch", {"name": name, "kind": resource})
            if resource == "pods":
                phase = current["status"].get("phase")
                graceful = (current["spec"].get("nodeName") and phase not in ("Succeeded", "Failed"))
                if grace_s is None:
                    grace_s = int(current["spec"].get("terminationGracePeriodSeconds", 30))
                if graceful and grace_s > 0:
                    meta = current["metadata"]
                    if "deletionTimestamp" not in meta or grace_s < meta.get("deletionGracePeriodSeconds", 1 << 30):
                        meta["deletionTimestamp"] = rfc3339(self.clock() + grace_s)
                        meta["deletionGracePeriodSeconds"] = grace_s
                        meta["resourceVersion"] = self._bump()
                        self._record("MODIFIED", resource, namespace, current)
                    return copy.deepcopy(current)
            del self.objects[(resource, namespace, name)]
            self._forget_logs(resource, namespace, current)
            self._bump()
            self._record("DELETED", resource, namespace, current)
            return copy.deepcopy(current)

    def delete_collection(self, resource: str, namespace: str, label_selector: str, field_selector: str,
                          grace_s: int | None) -> dict:
        """DELETE on a collection: every matching object, each as a single delete would (a list back)."""
        with self.lock:
            matching = self.list(resource, namespace if resource in NAMESPACED else None,
                                 label_selector, field_selector)
            items = []
            for obj in matching["items"]:
                try:
                    items.append(self.delete(resource, namespace, obj["metadata"]["name"], grace_s))
                except ApiError:
                    pass
            return {"apiVersion": GROUP_VERSIONS[resource], "kind": matching["kind"],
                    "metadata": {"resourceVersion": str(self.revision)},
                    "items": items}

    # internal writes (controllers) -------------------------------------------------------------

    def _forget_logs(self, resource: str, namespace: str, obj: dict) -> None:
        """A pod's output goes with the pod (the kubelet removes its log files with it)."""
        if resource == "pods":
            uid = obj["metadata"].get("uid")
            for key in [k for k in self.logs if k[0] == namespace and k[1] == uid]:
                del self.logs[key]

    def update_internal(self, resource: str, namespace: str, name: str, fn: Callable[[dict], None]) -> None:
        with self.lock:
            obj = self.objects.get((resource, namespace, name))
            if obj is None:
                return
            fn(obj)
            obj["metadata"]["resourceVersion"] = self._bump()
            self._record("MODIFIED", resource, namespace, obj)

    def remove_internal(self, resource: str, namespace: str, name: str) -> None:
        with self.lock:
            obj = self.objects.pop((resource, namespace, name), None)
            if obj is not None:
                self._forget_logs(resource, namespace, obj)
                self._bump()
                self._record("DELETED", resource, namespace, obj)


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": resource})


def conflict(resource: str, name: str) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": the object has '
                    "been modified; please apply your changes to the latest version and try again",
                    {"name": name, "kind": resource})


def _invalid(resource: str, name: str, causes: list[tuple[str, str]]) -> ApiError:
    msg = "; ".join(f"{field}: {text}" for field, text in causes)
    return ApiError(422, "Invalid", f'{KINDS[resource]} "{name}" is invalid: {msg}',
                    {"name": name, "kind": KINDS[resource],
                     "causes": [{"reason": "FieldValueInvalid", "message": t, "field": f} for f, t in causes]})


def validate(resource: str, obj: dict) -> None:
    """The subset of apiserver validation whose absence would hide backend bugs."""
    meta = obj.get("metadata") or {}
    name = meta.get("name") or ""
    causes: list[tuple[str, str]] = []
    if resource == "services":
        if not (len(name) <= 63 and _DNS1035_LABEL.match(name)):
            causes.append(("metadata.name", (f"Invalid value: {name!r}: a DNS-1035 label must consist of lower "
                                             "case alphanumeric characters or '-', start with an alphabetic "
                                             "character, and end with an alphanumeric character")))
    elif resource != "events" and not (len(name) <= 253 and _DNS1123_SUBDOMAIN.match(name)):
        causes.append(("metadata.name", (f"Invalid value: {name!r}: a lowercase RFC 1123 subdomain must consist "
                                         "of lower case alphanumeric characters, '-' or '.'")))
    for key, value in (meta.get("labels") or {}).items():
        if not _valid_qualified_name(str(key)):
            causes.append(("metadata.labels", f"Invalid value: {key!r}: name part must consist of alphanumeric characters"))
        if not isinstance(value, str) or not _valid_label_value(value):
            causes.append(("metadata.labels", (f"Invalid value: {value!r}: a valid label must be an empty string "
                                               "or consist of alphanumeric characters, '-', '_' or '.', and must "
                                               "start and end with an alphanumeric character (max 63 characters)")))
    for key in (meta.get("annotations") or {}):
        if not _valid_qualified_name(str(key)):
            causes.append(("metadata.annotations", f"Invalid value: {key!r}"))
    if resource == "pods":
        spec = obj.get("spec") or {}
        containers = spec.get("containers") or []
        if not containers:
            causes.append(("spec.containers", "Required value"))
        for field, group in (("spec.initContainers", spec.get("initContainers") or []), ("spec.containers", containers)):
            for i, c in enumerate(group):
                if not c.get("name") or not _DNS1123_LABEL.match(c["name"]):
                    causes.append((f"{field}[{i}].name", f"Invalid value: {c.get('name')!r}"))
                if not c.get("image"):
                    causes.append((f"{field}[{i}].image", "Required value"))
                res = c.get("resources") or {}
                for rname, qty in (res.get("requests") or {}).items():
                    if "/" in rname and not rname.startswith("kubernetes.io/") and (res.get("limits") or {}).get(rname) != qty:
                        causes.append((f"{field}[{i}].resources.requests[{rname}]",
                                       f"Invalid value: {qty!r}: must be equal to {rname} limit"))
    if resource == "configmaps":
        data, binary = obj.get("data") or {}, obj.get("binaryData") or {}
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            raise _bad_request("ConfigMap in version \"v1\" cannot be handled as a ConfigMap: data values must be strings")
        for key in list(data) + list(binary):
            if not (len(key) <= 253 and _CONFIG_KEY.match(key)):
                causes.append((f"data[{key}]", (f"Invalid value: {key!r}: a valid config key must consist of alphanumeric "
                                               "characters, '-', '_' or '.' (regex used for validation is '[-._a-zA-Z0-9]+')")))
            if key in data and key in binary:
                causes.append((f"data[{key}]", "Invalid value: duplicate of key present in binaryData"))
        size = sum(len(k) + len(v.encode()) for k, v in data.items()) + sum(len(k) + len(v) for k, v in binary.items())
        if size > CONFIGMAP_MAX_BYTES:
            causes.append(("[]", f"Too long: must have at most {CONFIGMAP_MAX_BYTES} bytes"))
    if resource == "secrets":
        decoded: dict[str, bytes] = {}
        for key, value in (obj.get("data") or {}).items():
            try:
                decoded[key] = base64.b64decode(value, validate=True)
            except (ValueError, TypeError):
                causes.append((f"data[{key}]", "Invalid value: illegal base64 data"))
        if obj.get("type") == "kubernetes.io/dockerconfigjson":
            if ".dockerconfigjson" not in decoded:
                causes.append(("data[.dockerconfigjson]", "Required value"))
            else:
                try:
                    json.loads(decoded[".dockerconfigjson"])
                except ValueError as exc:
                    causes.append(("data[.dockerconfigjson]", f"Invalid value: \"<secret contents redacted>\": {exc}"))
    if resource == "networkpolicies":
        spec = obj.get("spec")
        if not isinstance(spec, dict) or not isinstance(spec.get("podSelector"), dict):
            causes.append(("spec.podSelector", "Required value"))
        else:
            for i, ptype in enumerate(spec.get("policyTypes") or []):
                if ptype not in ("Ingress", "Egress"):
                    causes.append((f"spec.policyTypes[{i}]", (f'Unsupported value: "{ptype}": supported values: '
                                                            '"Ingress", "Egress"')))
            for direction, peers_key in (("ingress", "from"), ("egress", "to")):
                for i, rule in enumerate(spec.get(direction) or []):
                    for j, port in enumerate(rule.get("ports") or []):
                        if port.get("protocol", "TCP") not in ("TCP", "UDP", "SCTP"):
                            causes.append((f"spec.{direction}[{i}].ports[{j}].protocol",
                                           f'Unsupported value: "{port.get("protocol")}"'))
                    for j, peer in enumerate(rule.get(peers_key) or []):
                        block = peer.get("ipBlock")
                        if block is not None:
                            import ipaddress

                            try:
                                ipaddress.ip_network(block.get("cidr", ""), strict=False)
                            except ValueError:
                                causes.append((f"spec.{direction}[{i}].{peers_key}[{j}].ipBlock.cidr",
                                               f"Invalid value: {block.get('cidr')!r}: must be a valid CIDR"))
                        if block is not None and len(peer) > 1:
                            causes.append((f"spec.{direction}[{i}].{peers_key}[{j}]",
                                           "Forbidden: may not specify more than 1 peer type"))
    if causes:
        raise _invalid(resource, name, causes)


# -- images, the scheduler and the simulated kubelet ---------------------------------------------


@dataclass(frozen=True)
class Image:
    """What the fake container runtime knows of an image: its files, default argv and user."""

    files: frozenset[str]
    entrypoint: tuple[str, ...] = ()
    user: int | str = 0  # the image's USER: 0 is root
    # A private image: pulling it needs an imagePullSecrets entry with auths for this server.
    registry_auth: str = ""


_BUSYBOX_APPLETS = (
    "sh", "ash", "cp", "chmod", "chown", "mkdir", "sleep", "echo", "cat", "ls", "env", "true", "false", "test", "[",
    "[[", "kill", "id", "whoami", "ln", "rm", "mv", "printf", "sed", "grep", "nc", "wget", "awk", "setsid",
    "head", "tail", "tr", "cut", "wc", "touch", "basename", "dirname", "expr", "seq", "hostname", "uname", "tee",
    "xargs", "find", "ps", "nohup", "timeout", "sort", "uniq", "stat", "readlink", "realpath", "date", "pwd",
    "install", "df", "du", "ip", "ping", "nslookup", "vi", "which", "yes", "usleep", "mktemp", "sync")
_COREUTILS = ("sh", "dash", "bash", "cp", "chmod", "mkdir", "sleep", "echo", "cat", "ls", "env", "true", "false",
              "test", "[", "kill", "id", "whoami", "ln", "rm", "mv", "printf", "sed", "grep", "tail", "head")
_ETC = {"/etc/passwd", "/etc/group"}  # every image here has them (distroless too)
BUSYBOX = Image(frozenset({"/bin/busybox"} | {f"/bin/{a}" for a in _BUSYBOX_APPLETS} | _ETC), ("sh",))
DEBIAN = Image(frozenset({f"/bin/{a}" for a in _COREUTILS} | {f"/usr/bin/{a}" for a in _COREUTILS} | _ETC
                         | {"/usr/bin/awk", "/usr/bin/mawk", "/usr/bin/setsid"}), ("bash",))
PYTHON = Image(DEBIAN.files | {"/usr/local/bin/python", "/usr/local/bin/python3"}, ("python3",))
PYTORCH = Image(DEBIAN.files | {"/opt/conda/bin/python", "/opt/conda/bin/python3"}, ("/bin/bash",))
DISTROLESS = Image(frozenset(_ETC))
DISTROLESS_NONROOT = Image(frozenset(_ETC), user=65532)

# Repository (registry prefix and library/ stripped) -> tag glob -> image. The defaults are the
# images the tests and the docs use; ``FakeKubeApiServer.images.add`` registers more.
DEFAULT_IMAGES: dict[str, Image] = {
    "busybox:*": BUSYBOX, "python:3.11*": PYTHON, "pytorch/pytorch:*": PYTORCH, "debian:12*": DEBIAN,
    "ubuntu:22.04": DEBIAN, "ubuntu:24.04": DEBIAN, "gcr.io/distroless/*:nonroot": DISTROLESS_NONROOT,
    "gcr.io/distroless/*": DISTROLESS,
}
PATH_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin", "/opt/conda/bin")


def normalize_image(ref: str) -> str:
    """``docker.io/library/busybox:1.36.1`` -> ``busybox:1.36.1`` (a missing tag is ``latest``)."""
    ref = ref.split("@", 1)[0]
    for prefix in ("docker.io/", "index.docker.io/", "registry-1.docker.io/"):
        ref = ref.removeprefix(prefix)
    ref = ref.removeprefix("library/")
    last = ref.rsplit("/", 1)[-1]
    return ref if ":" in last else ref + ":latest"


class ImageTable:
    def __init__(self) -> None:
        self._images: dict[str, Image] = dict(DEFAULT_IMAGES)
        self._lock = threading.Lock()

    def add(self, pattern: str, files: set[str] | frozenset[str] = frozenset(), *, entrypoint: tuple[str, ...] = (),
            user: int | str = 0, registry_auth: str = "") -> None:
        """Make ``pattern`` (a normalized reference; ``*`` globs) pullable with these files."""
        with self._lock:
            self._images = {pattern: Image(frozenset(files), entrypoint, user, registry_auth), **self._images}

    def find(self, ref: str) -> Image | None:
        name = normalize_image(ref)
        with self._lock:
            for pattern, image in self._images.items():
                if fnmatch.fnmatchcase(name, pattern):
                    return image
        return None


@dataclass(frozen=True)
class Script:
    duration_s: float  # inf: runs until deleted
    exit_code: int
    # (seconds after the start, line) the program prints
    output: tuple[tuple[float, str], ...] = ()
    # files the program left behind: absolute paths (written, copied or moved into place)
    created: tuple[str, ...] = ()
    # files the program removed (``mv`` sources, ``rm``)
    removed: tuple[str, ...] = ()


class FileView:
    """What a container's program can see of files: ``exists``, ``is_dir`` and ``writable`` of an
    absolute path. The default sees everything and may write anywhere (a program whose files the
    fake does not model: the job's own command)."""

    def exists(self, path: str) -> bool:
        return True

    def is_dir(self, path: str) -> bool:
        return False

    def writable(self, path: str) -> bool:
        return True


class _CallableFiles(FileView):
    def __init__(self, exists: Callable[[str], bool]) -> None:
        self._exists = exists

    def exists(self, path: str) -> bool:
        return self._exists(path)


# What busybox (the docker.io/library/busybox build) answers to ``busybox APPLET``.
BUSYBOX_APPLETS = frozenset(_BUSYBOX_APPLETS)
# The shell's own commands (busybox ash, dash): they need no file.
_BUILTINS = frozenset({"echo", "exit", "true", "false", "cd", "export", "set", "test", "[", "command", "exec", "trap",
                       "wait", "kill", "printf", "read", ":", "umask", "unset", "shift", "eval", "local", "return",
                       ".", "readonly", "type", "alias", "ulimit"})
_SHELLS = frozenset({"sh", "bash", "dash", "ash"})
_RESERVED = frozenset({"if", "then", "elif", "else", "fi", "for", "in", "do", "done", "while", "until", "{", "}",
                       "!", "case", "esac"})
_LOOP_MAX = 1000  # iterations after which a loop is taken to run for ever (until the pod is deleted)


class _Forever(Exception):
    """``sleep infinity`` or an endless loop: the program runs until it is killed."""


class _Exit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class _ScriptError(Exception):
    """What the shell refuses to run (a syntax error): ``sh: ...`` and exit 2."""


# -- the shell's words ------------------------------------------------------------------------------
# A word is a tuple of parts (kind, text): "lit" (unquoted: expanded and split), "dq" (double-quoted:
# expanded, not split), "sq" (single-quoted or escaped: as it is).

_OPERATORS = ("&&", "||", ";;", ">>", ">&", "<&", "2>&1", ";", "&", "|", "(", ")", "<", ">", "\n")


def _lex(text: str) -> list[tuple[str, Any]]:
    """[("op", operator) | ("word", parts)] of a shell script, quote-aware; comments dropped."""
    tokens: list[tuple[str, Any]] = []
    parts: list[tuple[str, str]] = []
    buf: list[str] = []
    i, n = 0, len(text)

    def flush_buf(kind: str = "lit") -> None:
        if buf:
            parts.append((kind, "".join(buf)))
            buf.clear()

    def end_word() -> None:
        flush_buf()
        if parts:
            tokens.append(("word", tuple(parts)))
            parts.clear()

    while i < n:
        ch = text[i]
        if ch == "\\" and i + 1 < n:
            if text[i + 1] == "\n":
                i += 2
                continue
            flush_buf()
            parts.append(("sq", text[i + 1]))
            i += 2
        elif ch == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise _ScriptError("unterminated quoted string")
            flush_buf()
            parts.append(("sq", text[i + 1:end]))
            i = end + 1
        elif ch == '"':
            flush_buf()
            j, out = i + 1, []
            while j < n and text[j] != '"':
                if text[j] == "\\" and j + 1 < n and text[j + 1] in '"\\$`\n':
                    out.append("\\" + text[j + 1] if text[j + 1] == "$" else text[j + 1])
                    j += 2
                else:
                    out.append(text[j])
                    j += 1
            if j >= n:
                raise _ScriptError("unterminated quoted string")
            parts.append(("dq", "".join(out)))
            i = j + 1
        elif ch == "$" and text.startswith("$(", i):
            depth, j = 0, i + 1  # $(...) and $((...)) kept whole for the expansion
            while j < n:
                if text[j] == "(":
                    depth += 1
                elif text[j] == ")":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            buf.append(text[i:j + 1])
            i = j + 1
        elif ch == "$" and text.startswith("${", i):
            j = text.find("}", i)
            j = n - 1 if j < 0 else j
            buf.append(text[i:j + 1])
            i = j + 1
        elif ch == "#" and not buf and not parts:
            while i < n and text[i] != "\n":
                i += 1
        elif ch in " \t":
            end_word()
            i += 1
        else:
            op = next((o for o in _OPERATORS if text.startswith(o, i)), None)
            if op is not None and op == "2>&1" and (buf or parts):
                op = None
            if op is None and ch.isdigit() and not buf and not parts and text.startswith(">", i + 1):
                op = ch + ">>" if text.startswith(">>", i + 1) else ch + ">"  # 2>file
            if op is None:
                buf.append(ch)
                i += 1
                continue
            end_word()
            tokens.append(("op", op))
            i += len(op)
    end_word()
    return tokens


def _literal(word: tuple[tuple[str, str], ...]) -> str | None:
    """The word's text when it is one unquoted literal (a reserved word can only be that)."""
    return word[0][1] if len(word) == 1 and word[0][0] == "lit" else None


class _Parser:
    """Shell grammar, the parts scripts use: lists, and-or lists, pipelines, ``!``, ``if``, ``for``,
    ``while``/``until``, ``{ ...; }``, ``( ... )``, functions, simple commands with assignments and
    redirections."""

    def __init__(self, tokens: list[tuple[str, Any]]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> tuple[str, Any] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def peek_word(self) -> str | None:
        tok = self.peek()
        return _literal(tok[1]) if tok and tok[0] == "word" else None

    def skip_newlines(self) -> None:
        while self.peek() in (("op", "\n"), ("op", ";")):
            self.pos += 1

    def expect(self, word: str) -> None:
        self.skip_newlines()
        if self.peek_word() != word:
            tok = self.peek()
            got = "end of file" if tok is None else (tok[1] if tok[0] == "op" else "".join(t for _, t in tok[1]))
            raise _ScriptError(f"syntax error: unexpected {got!r} (expecting {word!r})")
        self.pos += 1

    def program(self) -> list:
        body = self.list_until(set())
        if self.peek() is not None:
            tok = self.peek()
            raise _ScriptError(f"syntax error: unexpected {tok[1] if tok[0] == 'op' else _literal(tok[1])!r}")
        return body

    def list_until(self, stops: set[str]) -> list:
        items: list = []
        while True:
            self.skip_newlines()
            tok = self.peek()
            if tok is None or (tok == ("op", ")") and ")" in stops) or self.peek_word() in stops:
                return items
            items.append(self.and_or())
            tok = self.peek()
            if tok is not None and tok[0] == "op" and tok[1] in (";", "\n", "&"):
                self.pos += 1

    def and_or(self) -> tuple:
        first = self.pipeline()
        rest: list[tuple[str, tuple]] = []
        while self.peek() in (("op", "&&"), ("op", "||")):
            op = self.peek()[1]  # type: ignore[index]
            self.pos += 1
            while self.peek() == ("op", "\n"):
                self.pos += 1
            rest.append((op, self.pipeline()))
        return ("andor", first, rest)

    def pipeline(self) -> tuple:
        negate = False
        if self.peek_word() == "!":
            negate = True
            self.pos += 1
        commands = [self.command()]
        while self.peek() == ("op", "|"):
            self.pos += 1
            while self.peek() == ("op", "\n"):
                self.pos += 1
            commands.append(self.command())
        return ("pipe", negate, commands)

    def command(self) -> tuple:
        word = self.peek_word()
        if word == "if":
            self.pos += 1
            branches = []
            cond = self.list_until({"then"})
            self.expect("then")
            body = self.list_until({"elif", "else", "fi"})
            branches.append((cond, body))
            otherwise: list = []
            while True:
                self.skip_newlines()
                word = self.peek_word()
                self.pos += 1
                if word == "elif":
                    cond = self.list_until({"then"})
                    self.expect("then")
                    branches.append((cond, self.list_until({"elif", "else", "fi"})))
                elif word == "else":
                    otherwise = self.list_until({"fi"})
                    self.expect("fi")
                    break
                elif word == "fi":
                    break
                else:
                    raise _ScriptError("syntax error: unexpected end of file (expecting 'fi')")
            return ("if", branches, otherwise, self.redirections())
        if word in ("while", "until"):
            self.pos += 1
            cond = self.list_until({"do"})
            self.expect("do")
            body = self.list_until({"done"})
            self.expect("done")
            return ("while", word == "until", cond, body, self.redirections())
        if word == "for":
            self.pos += 1
            tok = self.peek()
            if tok is None or tok[0] != "word":
                raise _ScriptError("syntax error: bad for loop variable")
            name = _literal(tok[1]) or ""
            self.pos += 1
            items: list | None = None
            while self.peek() == ("op", "\n"):
                self.pos += 1
            if self.peek_word() == "in":
                self.pos += 1
                items = []
                while self.peek() is not None and self.peek()[0] == "word":  # type: ignore[index]
                    items.append(self.peek()[1])  # type: ignore[index]
                    self.pos += 1
            self.expect("do")
            body = self.list_until({"done"})
            self.expect("done")
            return ("for", name, items, body, self.redirections())
        if word == "{":
            self.pos += 1
            body = self.list_until({"}"})
            self.expect("}")
            return ("group", body, self.redirections())
        if self.peek() == ("op", "("):
            self.pos += 1
            body = self.list_until({")"})
            if self.peek() != ("op", ")"):
                raise _ScriptError("syntax error: unexpected end of file (expecting ')')")
            self.pos += 1
            return ("subshell", body, self.redirections())
        if word == "case":
            raise _ScriptError("the fake shell does not know 'case'")
        if word is not None and self.tokens[self.pos + 1:self.pos + 3] == [("op", "("), ("op", ")")]:
            self.pos += 3
            self.skip_newlines()
            return ("function", word, self.command())
        return self.simple()

    def redirections(self) -> list[tuple[str, tuple]]:
        out: list[tuple[str, tuple]] = []
        while True:
            tok = self.peek()
            if tok is None or tok[0] != "op":
                return out
            op = tok[1]
            if op == "2>&1":
                self.pos += 1
                continue
            if op not in ("<", ">", ">>", ">&", "<&") and not (op[:1].isdigit() and ">" in op):
                return out
            self.pos += 1
            target = self.peek()
            if target is None or target[0] != "word":
                raise _ScriptError(f"syntax error: unexpected redirection {op!r}")
            self.pos += 1
            out.append((op, target[1]))

    def simple(self) -> tuple:
        assignments: list[tuple[str, tuple]] = []
        words: list[tuple] = []
        redirects: list[tuple[str, tuple]] = []
        while True:
            redirects += self.redirections()
            tok = self.peek()
            if tok is None or tok[0] != "word":
                break
            first = tok[1][0]
            m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)=", first[1]) if first[0] == "lit" else None
            if not words and m:
                value = ((("lit", first[1][m.end():]),) if first[1][m.end():] else ()) + tuple(tok[1][1:])
                assignments.append((m.group(1), value))
            else:
                if not words and not assignments and _literal(tok[1]) in ("then", "do", "done", "fi", "elif",
                                                                           "else", "}", "esac"):
                    raise _ScriptError(f"syntax error: unexpected {_literal(tok[1])!r}")
                words.append(tok[1])
            self.pos += 1
        if not words and not assignments and not redirects:
            tok = self.peek()
            raise _ScriptError(f"syntax error: unexpected {tok[1] if tok else 'end of file'!r}")
        return ("simple", assignments, words, redirects)


class _Shell:
    """Runs a parsed script against a container's files and env, on the fake clock (no processes)."""

    def __init__(self, files: FileView, env: dict[str, str], checks: bool) -> None:
        self.files = files
        self.checks = checks  # check commands against the files (init containers); the job's own program is not
        self.vars: dict[str, str] = dict(env)
        self.vars.setdefault("PATH", ":".join(PATH_DIRS))
        self.exported: set[str] = set(env) | {"PATH"}
        self.args: list[str] = []
        self.functions: dict[str, tuple] = {}
        self.flags: set[str] = set()
        self.status = 0
        self.duration = 0.0
        self.output: list[tuple[float, str]] = []
        self.created: dict[str, None] = {}
        self.removed: set[str] = set()
        self.made_dirs: set[str] = set()

    # -- files as the script changed them
    def exists(self, path: str) -> bool:
        path = path.rstrip("/") or "/"
        if path.startswith("/dev/") or path in self.created or path in self.made_dirs:
            return True
        return path not in self.removed and self.files.exists(path)

    def is_dir(self, path: str) -> bool:
        path = path.rstrip("/") or "/"
        return path in self.made_dirs or (path not in self.removed and self.files.is_dir(path))

    def write(self, path: str, who: str) -> bool:
        if path.startswith("/dev/"):
            return True
        if not self.files.writable(path):
            self.say(f"{who}: can't create '{path}': Read-only file system")
            return False
        parent = path.rsplit("/", 1)[0] or "/"
        if self.checks and not self.exists(parent):
            self.say(f"{who}: can't create '{path}': No such file or directory")
            return False
        self.removed.discard(path)
        self.created[path] = None
        return True

    def remove(self, path: str) -> None:
        self.created.pop(path, None)
        self.removed.add(path)

    def say(self, line: str) -> None:
        self.output.append((self.duration, line))

    # -- expansion
    def _param(self, name: str, word: str) -> str:
        if name == "?":
            return str(self.status)
        if name in ("$", "!"):
            return "1" if name == "$" else "2"
        if name == "#":
            return str(len(self.args))
        if name in ("@", "*"):
            return " ".join(self.args)
        if name.isdigit():
            k = int(name)
            return "sh" if k == 0 else (self.args[k - 1] if k <= len(self.args) else self._unset(name, word))
        if name in self.vars:
            return self.vars[name]
        return self._unset(name, word)

    def _unset(self, name: str, word: str) -> str:
        if "u" in self.flags:
            self.say(f"sh: {name}: parameter not set")
            raise _Exit(2)
        return ""

    def _braced(self, inner: str) -> str:
        m = re.match(r"^(#?)([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[?$!#@*])(?:(:?[-=+?])(.*))?$", inner, re.DOTALL)
        if not m:
            self.say("sh: syntax error: bad substitution")
            raise _Exit(2)
        length, name, op, arg = m.group(1), m.group(2), m.group(3), m.group(4) or ""
        value = self.vars.get(name) if not (name.isdigit() or name in "?$!#@*") else self._param(name, inner)
        if length:
            return str(len(value or ""))
        if op is None:
            return value if value is not None else self._unset(name, inner)
        empty = value is None or (op.startswith(":") and value == "")
        kind = op[-1]
        if kind == "-":
            return self.expand_text(arg) if empty else value or ""
        if kind == "=":
            if empty:
                self.vars[name] = self.expand_text(arg)
            return self.vars[name]
        if kind == "+":
            return "" if empty else self.expand_text(arg)
        if empty:  # ?
            self.say(f"sh: {name}: {self.expand_text(arg) or 'parameter not set'}")
            raise _Exit(2)
        return value or ""

    def _arith(self, expr: str) -> str:
        expr = re.sub(r"\$?\b([A-Za-z_][A-Za-z0-9_]*)\b", lambda m: self.vars.get(m.group(1), "0") or "0",
                      self.expand_text(expr))
        if not re.fullmatch(r"[0-9+\-*/%()<>=!&| ]*", expr):
            return "0"
        try:
            return str(int(eval(expr.replace("/", "//").replace("&&", " and ").replace("||", " or "),
                                {"__builtins__": {}})))
        except Exception:  # noqa: BLE001 - an arithmetic error is the script's
            return "0"

    def expand_text(self, text: str) -> str:
        out: list[str] = []
        i, n = 0, len(text)
        while i < n:
            ch = text[i]
            if ch == "\\" and i + 1 < n and text[i + 1] == "$":
                out.append("$")
                i += 2
            elif ch == "$" and text.startswith("$((", i):
                end = text.find("))", i)
                end = n if end < 0 else end
                out.append(self._arith(text[i + 3:end]))
                i = end + 2
            elif ch == "$" and text.startswith("$(", i):
                end = text.find(")", i)  # command substitution: the fake runs no program for its output
                i = n if end < 0 else end + 1
            elif ch == "$" and text.startswith("${", i):
                end = text.find("}", i)
                end = n if end < 0 else end
                out.append(self._braced(text[i + 2:end]))
                i = end + 1
            elif ch == "$" and i + 1 < n:
                m = re.match(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]|[?$!#@*]", text[i + 1:])
                if m:
                    out.append(self._param(m.group(0), text))
                    i += 1 + m.end()
                else:
                    out.append("$")
                    i += 1
            else:
                out.append(ch)
                i += 1
        return "".join(out)

    def expand(self, word: tuple, split: bool = True) -> list[str]:
        fields: list[str] = []
        current: list[str] = []
        have = False  # a quoted part makes a field even when empty
        for kind, text in word:
            if kind == "sq":
                current.append(text)
                have = True
            elif kind == "dq":
                current.append(self.expand_text(text))
                have = True
            else:
                value = self.expand_text(text)
                if not split:
                    current.append(value)
                    continue
                pieces = re.split(r"[ \t\n]+", value)
                for k, piece in enumerate(pieces):
                    if k > 0 and (current or have):
                        fields.append("".join(current))
                        current, have = [], False
                    if piece:
                        current.append(piece)
        if current or have:
            fields.append("".join(current))
        return fields

    # -- running
    def run(self, nodes: list, checked: bool = True) -> int:
        for node in nodes:
            self.status = self.run_andor(node, checked)
        return self.status

    def run_andor(self, node: tuple, checked: bool) -> int:
        _, first, rest = node
        status = self.run_pipe(first, checked and not rest)
        for k, (op, pipe) in enumerate(rest):
            if (op == "&&") == (status == 0):
                status = self.run_pipe(pipe, checked and k == len(rest) - 1)
        return status

    def run_pipe(self, node: tuple, checked: bool) -> int:
        _, negate, commands = node
        status = 0
        for command in commands:
            status = self.run_command(command, checked and not negate)
        self.status = status
        if negate:
            return 0 if status else 1
        return status

    def run_command(self, node: tuple, checked: bool) -> int:
        kind = node[0]
        if kind == "simple":
            status = self.run_simple(node)
        elif kind == "if":
            status = 0
            for cond, body in node[1]:
                if self.run(cond, checked=False) == 0:
                    status = self.run(body, checked)
                    break
            else:
                status = self.run(node[2], checked) if node[2] else 0
        elif kind == "while":
            status, rounds = 0, 0
            while (self.run(node[2], checked=False) == 0) != node[1]:
                status = self.run(node[3], checked)
                rounds += 1
                if rounds >= _LOOP_MAX:
                    raise _Forever
        elif kind == "for":
            items = [f for w in node[2] for f in self.expand(w)] if node[2] is not None else list(self.args)
            status = 0
            for item in items:
                self.vars[node[1]] = item
                status = self.run(node[3], checked)
        elif kind == "group":
            status = self.run(node[1], checked)
        elif kind == "subshell":
            saved = (dict(self.vars), list(self.args), set(self.flags))
            try:
                status = self.run(node[1], checked)
            except _Exit as e:
                status = e.code
            self.vars, self.args, self.flags = saved[0], saved[1], saved[2]
        elif kind == "function":
            self.functions[node[1]] = node[2]
            status = 0
        else:
            raise _ScriptError(f"unknown node {kind}")
        self.status = status
        if status != 0 and checked and "e" in self.flags and kind == "simple":
            raise _Exit(status)
        return status

    def run_simple(self, node: tuple) -> int:
        _, assignments, words, redirects = node
        argv = [f for w in words for f in self.expand(w)]
        values = {name: "".join(self.expand(value, split=False)) for name, value in assignments}
        quiet = False
        for op, target in redirects:
            path = "".join(self.expand(target, split=False))
            if op in ("<", "<&") or (op == ">&" and path.isdigit()):
                if op == "<" and self.checks and not self.exists(path):
                    self.say(f"sh: can't open '{path}': No such file or directory")
                    return 1
                if op == ">&" and path == "2":
                    continue
                continue
            if op.startswith("2"):
                if not path.startswith("/dev/") and not self.write(path, "sh"):
                    return 1
                continue
            if not self.write(path, "sh"):
                return 1
            quiet = True  # stdout goes to the file
        if not argv:
            self.vars.update(values)
            return 0
        env = {**{k: v for k, v in self.vars.items() if k in self.exported}, **values}
        return self.call(argv, env, quiet)

    def call(self, argv: list[str], env: dict[str, str], quiet: bool = False) -> int:
        """Run one command: a builtin, a function, busybox's applet or a program in the container."""
        cmd, args = argv[0], argv[1:]
        if "/" not in cmd and cmd in self.functions:
            saved = self.args
            self.args = args
            try:
                return self.run_command(self.functions[cmd], checked=True)
            finally:
                self.args = saved
        if "/" not in cmd and cmd in _BUILTINS:
            return self.builtin(cmd, args, env, quiet)
        path = self.lookup(cmd, env)
        if path is None:
            self.say(f"sh: {cmd}: not found")
            return 127
        name = path.rsplit("/", 1)[-1]
        if name == "busybox":
            if not args:
                return 0
            if args[0] not in BUSYBOX_APPLETS:
                self.say(f"{args[0]}: applet not found")
                return 127
            name, args = args[0], args[1:]
        return self.program(name, args, env, quiet)

    def lookup(self, cmd: str, env: dict[str, str]) -> str | None:
        if "/" in cmd:
            return cmd if not self.checks or self.exists(cmd) else None
        if not self.checks:
            return f"/usr/bin/{cmd}"
        for d in (env.get("PATH") or self.vars.get("PATH") or "").split(":"):
            if d and self.exists(f"{d}/{cmd}"):
                return f"{d}/{cmd}"
        return None

    def builtin(self, cmd: str, args: list[str], env: dict[str, str], quiet: bool) -> int:
        if cmd in ("true", ":"):
            return 0
        if cmd == "false":
            return 1
        if cmd == "exit":
            try:
                raise _Exit(int(args[0]) & 0xFF if args else self.status)
            except ValueError:
                self.say(f"sh: exit: Illegal number: {args[0]}")
                raise _Exit(2) from None
        if cmd == "echo":
            words = args[1:] if args[:1] == ["-n"] else args
            if not quiet:
                self.say(" ".join(words))
            return 0
        if cmd == "printf":
            if not args:
                self.say("printf: usage: printf FORMAT [ARGUMENT...]")
                return 2
            if not quiet:
                text = self.printf(args[0], args[1:])
                for line in text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"):
                    self.say(line)
            return 0
        if cmd in ("test", "["):
            if cmd == "[":
                if not args or args[-1] != "]":
                    self.say("sh: [: missing ]")
                    return 2
                args = args[:-1]
            return self.test(args)
        if cmd == "set":
            if args and args[0] == "--":
                self.args = args[1:]
                return 0
            for a in args:
                if a[:1] in "-+" and len(a) > 1 and a[1] != "o":
                    for flag in a[1:]:
                        (self.flags.add if a[0] == "-" else self.flags.discard)(flag)
            rest = [a for a in args if a[:1] not in "-+"]
            if rest:
                self.args = rest
            return 0
        if cmd in ("export", "readonly", "local"):
            for a in args:
                if a.startswith("-"):
                    continue
                name, eq, value = a.partition("=")
                if eq:
                    self.vars[name] = value
                self.exported.add(name)
            return 0
        if cmd == "unset":
            for a in args:
                self.vars.pop(a, None)
                self.functions.pop(a, None)
            return 0
        if cmd == "umask":
            if args and not re.fullmatch(r"[0-7]{1,4}", args[0]):
                self.say(f"sh: umask: Illegal mode: {args[0]}")
                return 1
            return 0
        if cmd == "shift":
            k = int(args[0]) if args and args[0].isdigit() else 1
            if k > len(self.args):
                return 1
            self.args = self.args[k:]
            return 0
        if cmd == "exec":
            if not args:
                return 0
            raise _Exit(self.call(args, env, quiet))
        if cmd == "command":
            if args[:1] == ["-v"]:
                found = [a for a in args[1:] if a in _BUILTINS or a in self.functions or self.lookup(a, env)]
                return 0 if len(found) == len(args[1:]) and found else 1
            return self.call(args, env, quiet) if args else 0
        if cmd == "eval":
            return self.run(_Parser(_lex(" ".join(args))).program())
        if cmd == "cd":
            target = args[0] if args else self.vars.get("HOME", "/")
            if self.checks and not self.exists(target):
                self.say(f"sh: cd: can't cd to {target}: No such file or directory")
                return 2
            return 0
        if cmd == "read":
            return 1  # no input
        return 0  # trap, wait, kill, type, alias, ulimit, return, .

    def printf(self, fmt: str, values: list[str]) -> str:
        fmt = fmt.replace("\\n", "\n").replace("\\t", "\t").replace("\\\\", "\\")
        out, rest = [], list(values)
        while True:
            def sub(m: re.Match[str]) -> str:
                if m.group(0) == "%%":
                    return "%"
                return rest.pop(0) if rest else ""
            out.append(re.sub(r"%%|%[-0-9.]*[sdixXfuc]", sub, fmt))
            if not rest or not re.search(r"%[-0-9.]*[sdixXfuc]", fmt):
                return "".join(out)

    def test(self, args: list[str]) -> int:
        if not args:
            return 1
        if args[0] == "!":
            return 1 - self.test(args[1:]) if self.test(args[1:]) in (0, 1) else 2
        if "-a" in args[1:-1] or "-o" in args[1:-1]:
            k = next(i for i, a in enumerate(args) if i > 0 and a in ("-a", "-o"))
            left, right = self.test(args[:k]), self.test(args[k + 1:])
            return 0 if ((left == 0 and right == 0) if args[k] == "-a" else (left == 0 or right == 0)) else 1
        if len(args) == 1:
            return 0 if args[0] else 1
        if len(args) == 2:
            op, value = args
            if op == "-z":
                return 0 if not value else 1
            if op == "-n":
                return 0 if value else 1
            if op in ("-e", "-f", "-r", "-x", "-s", "-w", "-L", "-h", "-S", "-b", "-c", "-p"):
                return 0 if self.exists(value) else 1
            if op == "-d":
                return 0 if self.is_dir(value) else 1
            self.say(f"sh: {op}: unknown operand")
            return 2
        if len(args) == 3:
            left, op, right = args
            if op in ("=", "=="):
                return 0 if left == right else 1
            if op == "!=":
                return 0 if left != right else 1
            ops = {"-eq": int.__eq__, "-ne": int.__ne__, "-lt": int.__lt__, "-le": int.__le__, "-gt": int.__gt__,
                   "-ge": int.__ge__}
            if op in ops:
                try:
                    return 0 if ops[op](int(left), int(right)) else 1
                except ValueError:
                    self.say(f"sh: {left if not left.lstrip('-').isdigit() else right}: bad number")
                    return 2
        self.say("sh: [: syntax error")
        return 2

    def program(self, name: str, args: list[str], env: dict[str, str], quiet: bool) -> int:
        """A program of the container (or busybox's applet of that name) on the files the fake knows."""
        if name in _BUILTINS and name not in ("exec", "command", "eval", "exit", "set", "export", "unset", "cd",
                                              "shift", "umask", "readonly", "local"):
            return self.builtin(name, args, env, quiet)
        if name == "sleep":
            if not args:
                self.say("sleep: missing operand")
                return 1
            if args[0] == "infinity":
                raise _Forever
            try:
                self.duration += float(args[0].rstrip("s"))
            except ValueError:
                self.say(f"sleep: invalid number '{args[0]}'")
                return 1
            return 0
        if name in _SHELLS:
            if "-c" in args:
                rest = args[args.index("-c") + 1:]
                saved = (dict(self.vars), list(self.args), set(self.flags), set(self.exported))
                self.vars = dict(env, PATH=env.get("PATH", self.vars.get("PATH", "")))
                self.args, self.flags, self.exported = rest[2:], set(), set(env)
                try:
                    status = self.run(_Parser(_lex(rest[0] if rest else "")).program())
                except _Exit as e:
                    status = e.code
                except _ScriptError as e:
                    self.say(f"sh: {e}")
                    status = 2
                self.vars, self.args, self.flags, self.exported = saved
                return status
            if args and self.checks and not self.exists(args[0]):
                self.say(f"{name}: can't open '{args[0]}': No such file or directory")
                return 2 if name != "bash" else 127
            return 0
        if name in ("setsid", "nohup", "env", "timeout", "nice"):
            rest = list(args)
            while rest and (rest[0].startswith("-") or (name == "env" and "=" in rest[0])):
                if name == "env" and "=" in rest[0]:
                    k, _, v = rest[0].partition("=")
                    env = {**env, k: v}
                rest.pop(0)
            if name == "timeout" and rest:
                rest.pop(0)
            return self.call(rest, env, quiet) if rest else 0
        if not self.checks:
            return 0
        opts = [a for a in args if a.startswith("-") and len(a) > 1]
        operands = [a for a in args if not (a.startswith("-") and len(a) > 1)]
        if name in ("cp", "mv", "install", "ln"):
            if name == "install" and opts and any(o in ("-d",) for o in opts):
                return self._mkdir(operands, name)
            if len(operands) < 2:
                self.say(f"{name}: missing destination file operand")
                return 1
            *sources, target = operands
            for source in sources:
                if name != "ln" and not self.exists(source):
                    self.say(f"{name}: can't stat '{source}': No such file or directory")
                    return 1
            for source in sources:
                dest = target.rstrip("/") + "/" + source.rstrip("/").rsplit("/", 1)[-1] \
                    if target.endswith("/") or self.is_dir(target) else target
                if not self.write(dest, name):
                    return 1
                if name == "mv":
                    self.remove(source)
            return 0
        if name in ("chmod", "chown"):
            for path in operands[1:]:
                if not self.exists(path):
                    self.say(f"{name}: {path}: No such file or directory")
                    return 1
            return 0
        if name == "mkdir":
            return self._mkdir(operands, name, parents="-p" in opts)
        if name == "touch":
            return 0 if all(self.write(p, name) for p in operands) else 1
        if name == "rm":
            for path in operands:
                if not self.exists(path):
                    if "-f" in opts or "-rf" in opts or "-fr" in opts:
                        continue
                    self.say(f"rm: can't remove '{path}': No such file or directory")
                    return 1
                self.remove(path)
            return 0
        if name == "awk":
            files, program, k = [], None, 0
            while k < len(args):
                a = args[k]
                if a in ("-F", "-v", "-f"):
                    if a == "-f":
                        program = ""
                    k += 2
                    continue
                if a.startswith(("-F", "-v")):
                    k += 1
                    continue
                if program is None:
                    program = a
                else:
                    files.append(a)
                k += 1
            for path in files:
                if path != "-" and "=" not in path and not self.exists(path):
                    self.say(f"awk: cannot open {path} (No such file or directory)")
                    return 2
            return 0
        if name in ("cat", "head", "tail", "grep", "sed", "sort", "uniq", "wc", "cut", "tr", "stat", "tee"):
            files = operands[1:] if name in ("grep", "sed") else ([] if name in ("tr", "tee") else operands)
            for path in files:
                if path != "-" and not self.exists(path):
                    self.say(f"{name}: {path}: No such file or directory" if name != "cat"
                             else f"cat: can't open '{path}': No such file or directory")
                    return 2 if name == "grep" else 1
            if name == "tee":
                return 0 if all(self.write(p, name) for p in operands) else 1
            return 0
        return 0

    def _mkdir(self, paths: list[str], who: str, parents: bool = True) -> int:
        for path in paths:
            path = path.rstrip("/")
            if not self.files.writable(path + "/."):
                self.say(f"{who}: can't create directory '{path}': Read-only file system")
                return 1
            if not parents and not self.exists(path.rsplit("/", 1)[0] or "/"):
                self.say(f"{who}: can't create directory '{path}': No such file or directory")
                return 1
            self.made_dirs.add(path)
        return 0


def parse_script(command: str, exists: Callable[[str], bool] | FileView | None = None,
                 env: dict[str, str] | None = None, *, argv: list[str] | None = None) -> Script:
    """Run ``command`` (a shell script; or ``argv``, a program started without a shell) as the
    module docstring describes and say how it ends.

    With ``exists`` (does this absolute path exist in the container?, or a ``FileView``) the files
    the script uses are checked as a shell and busybox find out: a command that is not there
    exits 127 with ``sh: NAME: not found``; ``busybox APPLET`` needs the applet; ``cp``/``mv``
    sources, ``chmod`` targets, ``awk``/``cat`` inputs, ``<`` and ``[ -e ]`` see the container's
    files and what the script made; ``>`` and ``cp``/``mv`` targets must be writable. What stays
    written is ``created`` (``removed``: what it removed).
    """
    files = FileView() if exists is None else exists if isinstance(exists, FileView) else _CallableFiles(exists)
    shell = _Shell(files, dict(env or {}), checks=exists is not None)
    code = 0
    try:
        if argv is not None:
            code = shell.call(list(argv), dict(env or {})) if argv else 0
        else:
            code = shell.run(_Parser(_lex(command)).program())
    except _Exit as e:
        code = e.code
    except _ScriptError as e:
        shell.say(f"sh: {e}")
        code = 2
    except _Forever:
        return Script(float("inf"), 0, tuple(shell.output), tuple(shell.created), tuple(shell.removed))
    return Script(shell.duration, code & 0xFF, tuple(shell.output), tuple(shell.created), tuple(shell.removed))


def _container_script(container: dict) -> str:
    for env in container.get("env") or []:
        if env.get("name") == "DLTS_COMMAND" and "value" in env:
            return env["value"]
    argv = list(container.get("command") or []) + list(container.get("args") or [])
    return argv[-1] if argv else ""


def _container_env(container: dict) -> dict[str, str]:
    """The literal ``env`` values of a container (``valueFrom`` is not resolved by the fake)."""
    return {e["name"]: str(e["value"]) for e in container.get("env") or [] if "value" in e}


def _condition(obj: dict, ctype: str) -> dict | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c
    return None


def _set_condition(obj: dict, ctype: str, status: str, now: float, reason: str = "", message: str = "") -> None:
    conds = obj.setdefault("status", {}).setdefault("conditions", [])
    for c in conds:
        if c.get("type") == ctype:
            if c.get("status") != status:
                c["lastTransitionTime"] = rfc3339(now)
            c.update(status=status, reason=reason, message=message, lastHeartbeatTime=rfc3339(now))
            return
    conds.append({"type": ctype, "status": status, "reason": reason, "message": message,
                  "lastTransitionTime": rfc3339(now), "lastHeartbeatTime": rfc3339(now)})


def _quantity(value: Any) -> float:
    from kubernetes.utils import parse_quantity

    return float(parse_quantity(str(value)))


def pod_requests(spec: dict) -> dict[str, float]:
    """What the scheduler counts for a pod: per resource, the larger of the containers' sum and
    the largest init container (requests; limits where a container sets only limits)."""
    def of(container: dict) -> dict[str, float]:
        res = container.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {k: _quantity(v) for k, v in merged.items()}

    total: dict[str, float] = {}
    for c in spec.get("containers") or []:
        for k, v in of(c).items():
            total[k] = total.get(k, 0.0) + v
    for c in spec.get("initContainers") or []:
        for k, v in of(c).items():
            total[k] = max(total.get(k, 0.0), v)
    return total


def _match_expression(expr: dict, value: str | None) -> bool:
    op, values = expr.get("operator"), [str(v) for v in expr.get("values") or []]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and values:
        try:
            return int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0])
        except ValueError:
            return False
    return False


def _affinity_matches(pod: dict, node: dict) -> bool:
    spec = pod.get("spec") or {}
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms")
    if not terms:
        return True
    fields = {"metadata.name": node["metadata"]["name"]}
    for term in terms:  # terms are ORed; the requirements of one term are ANDed
        if not term.get("matchExpressions") and not term.get("matchFields"):
            continue  # an empty term matches no node
        if all(_match_expression(e, labels.get(e.get("key"))) for e in term.get("matchExpressions") or []) and \
                all(_match_expression(e, fields.get(e.get("key"))) for e in term.get("matchFields") or []):
            return True
    return False


def _tolerates(tolerations: list[dict], taint: dict) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t["key"] == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def node_taints(node: dict) -> list[dict]:
    """The node's taints plus those the node lifecycle controller adds for a node that is not Ready."""
    taints = list((node.get("spec") or {}).get("taints") or [])
    ready = _condition(node, "Ready")
    if ready is None or ready.get("status") == "Unknown":
        taints.append({"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"})
    elif ready.get("status") != "True":
        taints.append({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})
    return taints


class FakeScheduler:
    """kube-scheduler's filters for the fields DLTS uses: NodeUnschedulable, TaintToleration,
    NodeAffinity (nodeSelector, required terms with matchExpressions and matchFields
    ``metadata.name``), NodeResourcesFit (every requested resource, ``nvidia.com/gpu``, cpu, memory,
    ephemeral-storage, against allocatable minus the requests of the pods bound there and not
    finished; and the pod count). A pod that fits no node stays Pending with PodScheduled False,
    reason Unschedulable and the scheduler's message; it is tried again on every tick."""

    def __init__(self, store: Store, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock

    def schedule(self) -> None:
        with self.store.lock:
            objects = list(self.store.objects.items())
            nodes = [o for (res, _, _), o in objects if res == "nodes"]
            pods = [o for (res, _, _), o in objects if res == "pods"]
            used: dict[str, dict[str, float]] = {n["metadata"]["name"]: {"pods": 0.0} for n in nodes}
            for pod in pods:
                node = (pod.get("spec") or {}).get("nodeName")
                if node in used and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                    for k, v in pod_requests(pod["spec"]).items():
                        used[node][k] = used[node].get(k, 0.0) + v
                    used[node]["pods"] += 1
            waiting = sorted((p for p in pods if not (p.get("spec") or {}).get("nodeName")
                              and not p["metadata"].get("deletionTimestamp")
                              and (p.get("spec") or {}).get("schedulerName", "default-scheduler") == "default-scheduler"),
                             key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"]))
            for pod in waiting:
                self._place(pod, nodes, used)

    def _place(self, pod: dict, nodes: list[dict], used: dict[str, dict[str, float]]) -> None:
        requests = pod_requests(pod["spec"])
        reasons: Counter[str] = Counter()
        resolvable = 0  # nodes where only resources were short (preemption could help)
        tolerations = (pod.get("spec") or {}).get("tolerations") or []
        for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
            name = node["metadata"]["name"]
            if (node.get("spec") or {}).get("unschedulable") and not _tolerates(
                    tolerations, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}):
                reasons["node(s) were unschedulable"] += 1
                continue
            untolerated = [t for t in node_taints(node) if t.get("effect") in ("NoSchedule", "NoExecute")
                           and not _tolerates(tolerations, t)]
            if untolerated:
                t = untolerated[0]
                reasons[f"node(s) had untolerated taint {{{t['key']}: {t.get('value') or ''}}}"] += 1
                continue
            if not _affinity_matches(pod, node):
                reasons["node(s) didn't match Pod's node affinity/selector"] += 1
                continue
            alloc = {k: _quantity(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
            short = [k for k, v in sorted(requests.items()) if v > 0 and used[name].get(k, 0.0) + v > alloc.get(k, 0.0)]
            if used[name]["pods"] + 1 > alloc.get("pods", 110):
                short.insert(0, "pods")
            if short:
                for k in short:
                    reasons["Too many pods" if k == "pods" else f"Insufficient {k}"] += 1
                resolvable += 1
                continue
            self._bind(pod, name)
            for k, v in requests.items():
                used[name][k] = used[name].get(k, 0.0) + v
            used[name]["pods"] += 1
            return
        total = len(nodes)
        detail = ", ".join(sorted(f"{n} {r}" for r, n in reasons.items()))
        message = f"0/{total} nodes are available" + (f": {detail}." if detail else ".")
        if (pod.get("spec") or {}).get("preemptionPolicy") == "Never":
            message += " preemption: not eligible due to preemptionPolicy=Never."
        elif total:
            parts = [f"{resolvable} No preemption victims found for incoming pod"] if resolvable else []
            if total - resolvable:
                parts.append(f"{total - resolvable} Preemption is not helpful for scheduling")
            message += f" preemption: 0/{total} nodes are available: {', '.join(parts)}."
        cond = _condition(pod, "PodScheduled")
        if cond and cond.get("status") == "False" and cond.get("message") == message:
            return
        ns, pname = pod["metadata"]["namespace"], pod["metadata"]["name"]
        self.store.update_internal("pods", ns, pname, lambda o: _set_condition(
            o, "PodScheduled", "False", self.clock(), "Unschedulable", message))
        _record_event(self.store, self.clock, pod, "FailedScheduling", message, "Warning", "default-scheduler")

    def _bind(self, pod: dict, node: str) -> None:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]

        def bind(o: dict) -> None:
            o["spec"]["nodeName"] = node
            _set_condition(o, "PodScheduled", "True", self.clock())

        self.store.update_internal("pods", ns, name, bind)
        _record_event(self.store, self.clock, pod, "Scheduled", f"Successfully assigned {ns}/{name} to {node}",
                      "Normal", "default-scheduler")


def _record_event(store: Store, clock: Callable[[], float], pod: dict, reason: str, message: str,
                  etype: str = "Normal", component: str = "kubelet") -> None:
    ns = pod["metadata"]["namespace"]
    name = f"{pod['metadata']['name']}.{uuid.uuid4().hex[:12]}"
    body = {"metadata": {"name": name}, "type": etype, "reason": reason, "message": message,
            "involvedObject": {"kind": "Pod", "name": pod["metadata"]["name"], "namespace": ns,
                               "uid": pod["metadata"]["uid"]},
            "firstTimestamp": rfc3339(clock()), "lastTimestamp": rfc3339(clock()), "count": 1,
            "source": {"component": component, "host": (pod.get("spec") or {}).get("nodeName", "")}}
    store.create("events", ns, body)


class _ContainerFiles(FileView):
    """A container's view of files: its volume mounts (emptyDir contents as the kubelet's run
    remembers them, subPath mounts, configMap keys; nfs and hostPath volumes are taken to hold
    whatever is asked), else the image's files; writes need a mount that is not ``readOnly``, or a
    root filesystem that is not ``readOnlyRootFilesystem``."""

    def __init__(self, store: Store, pod: dict, container: dict, image: Image, run: _PodRun) -> None:
        self.store, self.pod, self.image, self.run = store, pod, image, run
        self.volumes = {v.get("name"): v for v in (pod.get("spec") or {}).get("volumes") or []}
        self.mounts = sorted(container.get("volumeMounts") or [],
                             key=lambda m: -len(m.get("mountPath", "").rstrip("/")))
        self.read_only_root = bool((container.get("securityContext") or {}).get("readOnlyRootFilesystem"))

    def locate(self, path: str) -> tuple[dict, dict, str] | None:
        """(mount, volume, path inside the volume) of the mount ``path`` is under, if any."""
        path = path.rstrip("/") or "/"
        for m in self.mounts:
            mount_path = m.get("mountPath", "").rstrip("/")
            if path == mount_path or path.startswith(mount_path + "/"):
                rel = path[len(mount_path):].strip("/")
                key = "/".join(p for p in ((m.get("subPath") or "").strip("/"), rel) if p)
                return m, self.volumes.get(m.get("name")) or {}, key
        return None

    def exists(self, path: str) -> bool:
        found = self.locate(path)
        if found is None:
            path = path.rstrip("/") or "/"
            return path in self.image.files or any(f.startswith(path + "/") for f in self.image.files)
        mount, volume, key = found
        if "emptyDir" in volume:
            return key == "" or key in self.run.volumes.get(mount.get("name"), set())
        if "configMap" in volume:
            cm = self.store.objects.get(("configmaps", self.pod["metadata"]["namespace"],
                                         volume["configMap"].get("name")))
            return key == "" or key in ((cm or {}).get("data") or {})
        return True  # nfs, hostPath, ...: what is there is not the fake's to know

    def is_dir(self, path: str) -> bool:
        found = self.locate(path)
        if found is None:
            path = path.rstrip("/") or "/"
            return any(f.startswith(path + "/") for f in self.image.files)
        mount, volume, key = found
        if key == "":
            return "configMap" in volume or "emptyDir" in volume or not mount.get("subPath")
        entries = self.run.volumes.get(mount.get("name"), set())
        return key in self.run.dirs.get(mount.get("name"), set()) or any(e.startswith(key + "/") for e in entries)

    def writable(self, path: str) -> bool:
        found = self.locate(path)
        if found is None:
            return not self.read_only_root
        mount, volume, _ = found
        return not mount.get("readOnly") and not ({"configMap", "secret", "downwardAPI", "projected"} & set(volume))


@dataclass
class _PodRun:
    """The kubelet's memory of one pod: its emptyDir contents and where its containers are."""

    volumes: dict[str, set[str]]  # emptyDir name -> the paths in it (relative), files and directories
    dirs: dict[str, set[str]] = field(default_factory=dict)  # emptyDir name -> which of them are directories
    init_index: int = 0
    init_started: float | None = None
    init_script: Script | None = None
    main_started: float | None = None
    main_script: Script | None = None
    printed: int = 0  # lines of the running container's output already logged
    pulls: dict[str, int] | None = None  # image -> failed pull attempts
    start_error: str = ""  # why the running init container could not be started
    admitted: bool = False  # the kubelet's admission (sysctls) has let the pod in


class FakeKubelet:
    """Runs pods on the fake nodes: one ``tick()`` applies every transition due at the clock's now.

    In order, as a kubelet does: admit the pod (its sysctls must be "safe" ones of this kubelet's
    ``version``; a pod it rejects fails at once), pull each init container's image and run the init
    containers one after another (each must exit 0; one that fails fails the pod, ``restartPolicy:
    Never``), then pull the containers' images, check their security context, start them (the entry
    binary must exist in the image or a mounted volume) and run the first container's program.
    """

    def __init__(self, store: Store, clock: Callable[[], float], images: ImageTable | None = None,
                 version: str = DEFAULT_VERSION) -> None:
        self.store = store
        self.clock = clock
        self.images = images or ImageTable()
        self.version = parse_version(version)  # (major, minor) of the kubelet (and its API server)
        self.scheduler = FakeScheduler(store, clock)
        self._runs: dict[str, _PodRun] = {}  # pod uid -> its run

    def node_ready(self, node_name: str) -> bool:
        try:
            node = self.store.get("nodes", "", node_name)
        except ApiError:
            return False
        cond = _condition(node, "Ready")
        return bool(cond and cond.get("status") == "True")

    def tick(self) -> None:
        self.scheduler.schedule()
        now = self.clock()
        with self.store.lock:
            pods = [o for (res, _, _), o in list(self.store.objects.items()) if res == "pods"]
            ready = {name: self.node_ready(name) for name in {(p.get("spec") or {}).get("nodeName") for p in pods} if name}
            for pod in pods:
                self._step(pod, now, ready)
            live = {p["metadata"]["uid"] for (res, _, _), p in self.store.objects.items() if res == "pods"}
            for uid in set(self._runs) - live:
                del self._runs[uid]

    def _event(self, pod: dict, reason: str, message: str, etype: str = "Normal") -> None:
        _record_event(self.store, self.clock, pod, reason, message, etype)

    def _host_ip(self, node_name: str) -> str:
        node = self.store.objects.get(("nodes", "", node_name)) or {}
        for address in (node.get("status") or {}).get("addresses") or []:
            if address.get("type") == "InternalIP":
                return str(address["address"])
        return ""

    # -- admission ---------------------------------------------------------------------------------

    def _forbidden_sysctl(self, pod: dict) -> str:
        """Why the kubelet's sysctl admission handler rejects the pod ("" when it admits it): the
        first sysctl of ``spec.securityContext.sysctls`` that is not a safe one of this version (no
        --allowed-unsafe-sysctls), or a safe one of a namespace the pod shares with the host."""
        spec = pod.get("spec") or {}
        allowlist = "allowlisted" if self.version >= (1, 22) else "whitelisted"
        for sysctl in (spec.get("securityContext") or {}).get("sysctls") or []:
            name = str(sysctl.get("name") or "")
            quoted = json.dumps(name)  # Go's %q
            if name not in SAFE_SYSCTLS or self.version < (1, SAFE_SYSCTLS[name][0]):
                return f"forbidden sysctl: {quoted} not {allowlist}"
            namespace = SAFE_SYSCTLS[name][1]
            if spec.get({"net": "hostNetwork", "ipc": "hostIPC"}[namespace]):
                return f"forbidden sysctl: {quoted} not allowed with host {namespace} enabled"
        return ""

    def _admit(self, pod: dict, run: _PodRun, now: float) -> bool:
        """The kubelet's admission of a pod bound to its node, before anything of it starts. A
        rejected pod is Failed with the handler's reason and message (kubelet's ``rejectPod``)."""
        if run.admitted:
            return True
        message = self._forbidden_sysctl(pod)
        if not message:
            run.admitted = True
            return True
        prefix = "Pod was rejected: " if self.version >= (1, 26) else "Pod "

        def reject(o: dict) -> None:
            st = o["status"]
            st.update(phase="Failed", reason="SysctlForbidden", message=prefix + message)
            st.setdefault("startTime", rfc3339(now))

        self._set_status(pod, reject)
        self._event(pod, "SysctlForbidden", message, "Warning")
        return False

    # -- files, images, security ------------------------------------------------------------------

    def _files(self, pod: dict, container: dict, image: Image, run: _PodRun) -> _ContainerFiles:
        return _ContainerFiles(self.store, pod, container, image, run)

    def _mount_error(self, pod: dict, container: dict, image: Image, run: _PodRun) -> str:
        """runc's words when a subPath mount cannot be made ("" when all can). A subPath the
        emptyDir lacks is made a directory by the kubelet; a directory cannot be mounted on a file."""
        volumes = {v.get("name"): v for v in (pod.get("spec") or {}).get("volumes") or []}
        for k, m in enumerate(container.get("volumeMounts") or []):
            sub = (m.get("subPath") or "").strip("/")
            if not sub or "emptyDir" not in (volumes.get(m.get("name")) or {}):
                continue
            entries = run.volumes.setdefault(m["name"], set())
            if sub in entries:
                continue
            entries.add(sub)
            run.dirs.setdefault(m["name"], set()).add(sub)
            target = m.get("mountPath", "")
            if target in image.files:
                source = f"/var/lib/kubelet/pods/{pod['metadata']['uid']}/volume-subpaths/{m['name']}/" \
                         f"{container['name']}/{k}"
                return ("failed to create containerd task: failed to create shim task: OCI runtime create failed: "
                        "runc create failed: unable to start container process: error during container init: "
                        f'error mounting "{source}" to rootfs at "{target}": mount {source}:{target} (via '
                        "/proc/self/fd/6), flags: 0x5001: not a directory: unknown: Are you trying to mount a "
                        "directory onto a file (or vice-versa)? Check if the specified host path exists and is "
                        "the expected type")
        return ""

    def _config_error(self, pod: dict, container: dict, image: Image) -> str:
        """The kubelet's CreateContainerConfigError message for the container ("" when none)."""
        pod_sc = (pod.get("spec") or {}).get("securityContext") or {}
        sc = container.get("securityContext") or {}
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        user = sc.get("runAsUser", pod_sc.get("runAsUser"))
        where = f'(pod: "{pod["metadata"]["name"]}_{pod["metadata"]["namespace"]}({pod["metadata"]["uid"]})", ' \
                f'container: {container["name"]})'
        if not non_root:
            return ""
        if user is not None:
            return f"container's runAsUser breaks non-root policy {where}" if int(user) == 0 else ""
        if isinstance(image.user, str) and not image.user.isdigit():
            return f"container has runAsNonRoot and image has non-numeric user ({image.user}), cannot verify user is non-root {where}"
        if int(image.user) == 0:
            return f"container has runAsNonRoot and image will run as root {where}"
        return ""

    def _pull(self, pod: dict, container: dict, run: _PodRun) -> tuple[Image | None, dict | None]:
        """(the image, None) once pulled; (None, waiting state) while the pull fails."""
        ref = container.get("image") or ""
        image = self.images.find(ref)
        if image is not None and image.registry_auth and not self._has_pull_secret(pod, image.registry_auth):
            image = None
            denied = True
        else:
            denied = False
        if image is not None:
            return image, None
        run.pulls = run.pulls or {}
        tries = run.pulls.get(ref, 0)
        run.pulls[ref] = tries + 1
        if tries == 0:
            why = ("pull access denied, repository does not exist or may require authorization: authorization failed"
                   if denied else f"{normalize_image(ref).rsplit(':', 1)[0]}: not found")
            return None, {"reason": "ErrImagePull", "message": (
                f'failed to pull and unpack image "{ref}": failed to resolve reference "{ref}": {why}')}
        return None, {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{ref}"'}

    def _has_pull_secret(self, pod: dict, server: str) -> bool:
        ns = pod["metadata"]["namespace"]
        for ref in (pod.get("spec") or {}).get("imagePullSecrets") or []:
            secret = self.store.objects.get(("secrets", ns, ref.get("name")))
            if not secret or secret.get("type") != "kubernetes.io/dockerconfigjson":
                continue
            try:
                auths = json.loads(base64.b64decode((secret.get("data") or {}).get(".dockerconfigjson", "")))["auths"]
            except (ValueError, KeyError, TypeError):
                continue
            if server in auths:
                return True
        return False

    def _argv(self, container: dict, image: Image) -> list[str]:
        argv = list(container.get("command") or image.entrypoint) + list(container.get("args") or [])
        return argv

    # -- the pod's life ---------------------------------------------------------------------------

    def _step(self, pod: dict, now: float, ready: dict[str, bool]) -> None:
        meta, spec, status = pod["metadata"], pod["spec"], pod["status"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        node = spec.get("nodeName")
        if not node:
            return
        if not ready.get(node, False):
            # The node controller marks pods on an unreachable node not ready; nothing else moves.
            cond = _condition(pod, "Ready")
            if status.get("phase") == "Running" and (cond is None or cond.get("status") != "False"):
                self.store.update_internal("pods", ns, name, lambda o: _set_condition(
                    o, "Ready", "False", now, "NodeLost", f"node {node} is not ready"))
            return
        if meta.get("deletionTimestamp"):
            if status.get("phase") == "Running":
                self._event(pod, "Killing", "Stopping container " + spec["containers"][0]["name"])
            self._runs.pop(uid, None)
            self.store.remove_internal("pods", ns, name)
            return
        phase = status.get("phase")
        if phase in ("Succeeded", "Failed"):
            return
        run = self._runs.get(uid)
        if run is None:
            run = self._runs[uid] = _PodRun({v["name"]: set() for v in spec.get("volumes") or [] if "emptyDir" in v})
        if phase == "Pending":
            if not self._admit(pod, run, now):
                return
            delay = float((meta.get("annotations") or {}).get("fake.dlts.io/start-delay-s", 0))
            created = dt.datetime.strptime(meta["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(
                tzinfo=dt.UTC).timestamp()
            if now < created + delay:
                return
            if not self._run_init(pod, run, now) or not self._start_main(pod, run, now):
                return
        self._run_main(pod, run, now)

    def _set_status(self, pod: dict, fn: Callable[[dict], None]) -> None:
        """Apply ``fn`` to the pod's status; write (and bump resourceVersion) only on a change."""
        before = json.dumps(pod.get("status"), sort_keys=True)
        probe = copy.deepcopy(pod)
        fn(probe)
        if json.dumps(probe.get("status"), sort_keys=True) == before:
            return
        self.store.update_internal("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], fn)

    @staticmethod
    def _waiting_statuses(containers: list[dict], reason: str) -> list[dict]:
        return [{"name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 0,
                 "started": False, "state": {"waiting": {"reason": reason}}} for c in containers]

    def _run_init(self, pod: dict, run: _PodRun, now: float) -> bool:
        """Advance the init containers; True once all have succeeded."""
        spec = pod["spec"]
        inits = spec.get("initContainers") or []
        while run.init_index < len(inits):
            c = inits[run.init_index]
            i = run.init_index
            image, waiting = self._pull(pod, c, run)
            if image is None or self._config_error(pod, c, image):
                state = waiting or {"reason": "CreateContainerConfigError", "message": self._config_error(pod, c, image)}
                self._set_status(pod, lambda o, i=i, state=state: self._init_status(o, i, {"waiting": state}, now))
                return False
            if run.init_started is None:
                files = self._files(pod, c, image, run)
                argv = self._argv(c, image)
                run.init_started = now
                run.start_error = self._mount_error(pod, c, image, run)
                if not argv or not (files.exists(argv[0]) if argv[0].startswith("/") else
                                    any(files.exists(f"{d}/{argv[0]}") for d in PATH_DIRS)):
                    run.start_error = _start_error(argv[0] if argv else "<none>")
                if run.start_error:
                    run.init_script = None
                else:
                    # the program runs as the container's argv: a shell interprets its -c script
                    run.init_script = parse_script("", files, _container_env(c), argv=argv)
                    for t, line in run.init_script.output:
                        self.store.append_log(pod["metadata"]["namespace"], pod["metadata"]["uid"], c["name"],
                                              now + t, line)
                self._set_status(pod, lambda o, i=i: self._init_status(o, i, {"running": {"startedAt": rfc3339(now)}},
                                                                       now))
            script = run.init_script
            if script is None:  # the entry binary is not there, or a mount could not be made
                self._fail_init(pod, i, 128, "StartError", run, now, run.start_error)
                return False
            if now < run.init_started + script.duration_s:
                return False
            if script.exit_code != 0:
                self._fail_init(pod, i, script.exit_code, "Error", run, now)
                return False
            files = self._files(pod, c, image, run)
            for path, keep in [(p, False) for p in script.removed] + [(p, True) for p in script.created]:
                found = files.locate(path)  # what the init wrote into (or removed from) shared volumes
                if found is None or found[0].get("name") not in run.volumes or not found[2]:
                    continue
                entries = run.volumes[found[0]["name"]]
                (entries.add if keep else entries.discard)(found[2])
            started = run.init_started
            done = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": rfc3339(started),
                                   "finishedAt": rfc3339(now)}}
            self._set_status(pod, lambda o, i=i, done=done: self._init_status(o, i, done, now))
            run.init_index += 1
            run.init_started = None
            run.init_script = None
        return True

    def _init_status(self, o: dict, index: int, state: dict, now: float) -> None:
        spec, st = o["spec"], o["status"]
        inits = spec.get("initContainers") or []
        statuses = st.get("initContainerStatuses") or self._waiting_statuses(inits, "PodInitializing")
        statuses[index] = {**statuses[index], "state": state, "ready": "terminated" in state and
                           state["terminated"].get("exitCode") == 0}
        st["initContainerStatuses"] = statuses
        st.setdefault("containerStatuses", self._waiting_statuses(spec["containers"], "PodInitializing"))
        st["hostIP"] = self._host_ip(spec["nodeName"])
        st.setdefault("startTime", rfc3339(now))
        pending = [c["name"] for c, cs in zip(inits, statuses) if not (cs.get("state") or {}).get("terminated")
                   or cs["state"]["terminated"].get("exitCode") != 0]
        if pending:
            _set_condition(o, "Initialized", "False", now, "ContainersNotInitialized",
                           f"containers with incomplete status: [{' '.join(pending)}]")
        else:
            _set_condition(o, "Initialized", "True", now)

    def _fail_init(self, pod: dict, index: int, code: int, reason: str, run: _PodRun, now: float,
                   message: str = "") -> None:
        started = run.init_started or now

        def fail(o: dict) -> None:
            term = {"exitCode": code, "reason": reason, "startedAt": rfc3339(started), "finishedAt": rfc3339(now)}
            if message:
                term["message"] = message
            self._init_status(o, index, {"terminated": term}, now)
            o["status"]["phase"] = "Failed"  # restartPolicy Never: a failed init container fails the pod
            _set_condition(o, "Ready", "False", now, "PodFailed")

        self._set_status(pod, fail)
        self._event(pod, "Failed", f"init container {pod['spec']['initContainers'][index]['name']} exited with {code}",
                    "Warning")

    def _start_main(self, pod: dict, run: _PodRun, now: float) -> bool:
        """Pull, check and start the containers; True once they run."""
        spec = pod["spec"]
        ns, uid = pod["metadata"]["namespace"], pod["metadata"]["uid"]
        blocked: dict[str, dict] = {}
        images: dict[str, Image] = {}
        for c in spec["containers"]:
            image, waiting = self._pull(pod, c, run)
            if image is None:
                blocked[c["name"]] = waiting or {}
                continue
            error = self._config_error(pod, c, image)
            if error:
                blocked[c["name"]] = {"reason": "CreateContainerConfigError", "message": error}
                continue
            images[c["name"]] = image
        if blocked:
            def wait(o: dict) -> None:
                st = o["status"]
                statuses = self._waiting_statuses(o["spec"]["containers"], "ContainerCreating")
                for cs in statuses:
                    if cs["name"] in blocked:
                        cs["state"] = {"waiting": blocked[cs["name"]]}
                st["containerStatuses"] = statuses
                st["hostIP"] = self._host_ip(o["spec"]["nodeName"])
                st.setdefault("startTime", rfc3339(now))
                _set_condition(o, "Ready", "False", now, "ContainersNotReady",
                               f"containers with unready status: [{' '.join(sorted(blocked))}]")
            self._set_status(pod, wait)
            return False
        first = spec["containers"][0]
        argv = self._argv(first, images[first["name"]])
        files = self._files(pod, first, images[first["name"]], run)
        failure = "" if argv and (files.exists(argv[0]) if argv[0].startswith("/") else
                                  any(files.exists(f"{d}/{argv[0]}") for d in PATH_DIRS)) \
            else _start_error(argv[0] if argv else "<none>")
        failure = self._mount_error(pod, first, images[first["name"]], run) or failure
        if failure:
            def start_error(o: dict) -> None:
                st = o["status"]
                st["phase"] = "Failed"
                st["containerStatuses"] = [
                    {"name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 0,
                     "started": False, "state": {"terminated": {
                         "exitCode": 128, "reason": "StartError", "message": failure,
                         "startedAt": "1970-01-01T00:00:00Z", "finishedAt": rfc3339(now)}}}
                    for c in o["spec"]["containers"]]
                _set_condition(o, "Ready", "False", now, "PodFailed")
            self._set_status(pod, start_error)
            self._event(pod, "Failed", f"Error: {failure}", "Warning")
            return False
        script = parse_script(_container_script(first), env=_container_env(first))
        run.main_started, run.main_script, run.printed = now, script, 0
        host_ip = self._host_ip(spec["nodeName"])
        count = sum(1 for r in self._runs.values() if r.main_started is not None)

        def start(o: dict) -> None:
            st = o["status"]
            st.update(phase="Running", hostIP=host_ip,
                      podIP=f"10.244.{count % 250}.{count // 250 % 250 + 2}")
            st.setdefault("startTime", rfc3339(now))
            st["containerStatuses"] = [
                {"name": c["name"], "image": c["image"], "imageID": "", "ready": True, "restartCount": 0,
                 "started": True, "state": {"running": {"startedAt": rfc3339(now)}}}
                for c in o["spec"]["containers"]]
            _set_condition(o, "Initialized", "True", now)
            _set_condition(o, "Ready", "True", now)

        self.store.update_internal("pods", ns, pod["metadata"]["name"], start)
        self._event(pod, "Started", "Started container " + first["name"])
        del uid
        return True

    def _run_main(self, pod: dict, run: _PodRun, now: float) -> None:
        if run.main_script is None:  # a pod this kubelet did not start (a restart of the fake)
            run.main_started, run.main_script = now, Script(float("inf"), 0)
        script, started = run.main_script, run.main_started or now
        first = pod["spec"]["containers"][0]["name"]
        due = [(t, line) for t, line in script.output[run.printed:] if started + t <= now]
        for t, line in due:
            self.store.append_log(pod["metadata"]["namespace"], pod["metadata"]["uid"], first, started + t, line)
        run.printed += len(due)
        if now < started + script.duration_s:
            return

        def finish(o: dict) -> None:
            st = o["status"]
            st["phase"] = "Succeeded" if script.exit_code == 0 else "Failed"
            for cs in st.get("containerStatuses") or []:
                cs["ready"] = False
                cs["started"] = False
                cs["state"] = {"terminated": {
                    "exitCode": script.exit_code, "reason": "Completed" if script.exit_code == 0 else "Error",
                    "startedAt": rfc3339(started), "finishedAt": rfc3339(now)}}
            _set_condition(o, "Ready", "False", now, "PodCompleted")

        self.store.update_internal("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], finish)


def _start_error(entry: str) -> str:
    return ("failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create "
            f'failed: unable to start container process: exec: "{entry}": '
            + (f"stat {entry}: no such file or directory" if entry.startswith("/") else
               "executable file not found in $PATH") + ": unknown")


# -- HTTP ---------------------------------------------------------------------------------------


def _events_after(history: deque, revision: int) -> list:
    """The recorded events after ``revision``, oldest first: read from the newest end, since a watch
    wakes for every write and the history holds up to ``history_max`` events."""
    newer = list(itertools.takewhile(lambda e: e[0] > revision, reversed(history)))
    newer.reverse()
    return newer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HttpServer

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes; without NODELAY, Nagle + the client's delayed
        # ACK add ~40 ms to every response.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.api.connected()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, body: dict | bytes, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        raw = self._raw
        if not raw:
            return None
        try:
            if "yaml" in (self.headers.get("Content-Type") or ""):
                return yaml.safe_load(raw)
            return json.loads(raw)
        except ValueError as exc:
            raise _bad_request(f"the body of the request could not be decoded: {exc}") from None

    def _dispatch(self, method: str) -> None:
        api: FakeKubeApiServer = self.server.api
        # Read the whole body first: an error answered before reading it would leave it in the
        # keep-alive stream and corrupt the next request.
        length = int(self.headers.get("Content-Length") or 0)
        self._raw = self.rfile.read(length) if length else b""
        try:
            if api.token and self.headers.get("Authorization") != f"Bearer {api.token}":
                raise ApiError(401, "Unauthorized", "Unauthorized")
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
            segs = [unquote(s) for s in parts.path.strip("/").split("/") if s]
            if segs in (["version"],):
                self._send(200, version_info(api.version))
                return
            if segs[:2] == ["api", "v1"]:
                group_version, segs = "v1", segs[2:]
            elif segs[:1] == ["apis"] and len(segs) >= 3:
                group_version, segs = f"{segs[1]}/{segs[2]}", segs[3:]
            else:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            namespace: str | None = None
            if len(segs) >= 3 and segs[0] == "namespaces" and segs[2] in NAMESPACED:
                namespace = segs[1]
                segs = segs[2:]
            if (not segs or segs[0] not in KINDS or GROUP_VERSIONS[segs[0]] != group_version
                    or (segs[0] in NAMESPACED and namespace is None and method != "GET")):
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            resource = segs[0]
            name = segs[1] if len(segs) > 1 else None
            sub = segs[2] if len(segs) > 2 else ""
            if sub not in ("", "status") and not (resource == "pods" and sub == "log" and method == "GET"):
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            ns = namespace or ""
            verb = {"GET": "get" if name else "list", "POST": "create", "PUT": "update",
                    "PATCH": "patch", "DELETE": "delete" if name else "deletecollection"}[method]
            if sub == "log":
                verb = "log"
            if verb == "list" and query.get("watch") in ("true", "1"):
                verb = "watch"
            api.record(verb, resource)
            api.before_request(verb, resource)
            store = api.store
            if method == "GET" and name is None:
                if query.get("watch") in ("true", "1"):
                    self._watch(resource, namespace if resource in NAMESPACED else None, query)
                    return
                try:
                    limit = int(query.get("limit") or 0)
                except ValueError:
                    raise _bad_request(f"limit: invalid value {query.get('limit')!r}") from None
                self._send(200, store.list_json(resource, namespace if resource in NAMESPACED else None,
                                                query.get("labelSelector", ""), query.get("fieldSelector", ""),
                                                limit=max(0, limit), continue_token=query.get("continue", "")))
            elif method == "GET" and sub == "log":
                # the output media type is negotiated before the pod is looked up: a log is sent
                # as text/plain, but only to a request that accepts one of the serializers' types
                if not acceptable(self.headers.get("Accept")):
                    raise ApiError(406, "NotAcceptable", "only the following media types are accepted: "
                                   "application/json, application/yaml, application/vnd.kubernetes.protobuf")
                self._send(200, store.read_log(ns, name, query), content_type="text/plain")
            elif method == "GET":
                self._send(200, store.get(resource, ns, name))
            elif method == "POST" and name is None:
                body = self._body()
                if not isinstance(body, dict):
                    raise _bad_request("the body of the request must be an object")
                if body.get("kind") not in (None, KINDS[resource]):
                    raise _bad_request(f"the kind of the body ({body.get('kind')}) does not match {KINDS[resource]}")
                if resource in NAMESPACED and (body.get("metadata") or {}).get("namespace") not in (None, ns):
                    raise _bad_request("the namespace of the provided object does not match the namespace sent on the request")
                self._send(201, store.create_json(resource, ns, body))
            elif method == "PUT" and name:
                self._send(200, store.replace(resource, ns, name, self._body() or {}, sub))
            elif method == "PATCH" and name:
                self._send(200, store.patch(resource, ns, name, self._body(),
                                            self.headers.get("Content-Type") or "", sub))
            elif method == "DELETE" and name is None:
                opts = self._body() or {}
                grace = opts.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
                self._send(200, store.delete_collection(resource, ns, query.get("labelSelector", ""),
                                                        query.get("fieldSelector", ""),
                                                        None if grace is None else int(grace)))
            elif method == "DELETE" and name:
                opts = self._body() or {}
                grace = opts.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
                obj = store.delete(resource, ns, name, None if grace is None else int(grace), opts.get("preconditions"))
                self._send(200, obj)
            else:
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {self.path}")
        except ApiError as exc:
            self._send(exc.code, exc.status())
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # noqa: BLE001 - a bug in the fake must surface as a 500, not a hang
            self._send(500, ApiError(500, "InternalError", f"fake apiserver bug: {exc!r}").status())

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _watch(self, resource: str, namespace: str | None, query: dict[str, str]) -> None:
        """A watch: events after ``resourceVersion`` as JSON lines, until ``timeoutSeconds``.

        ``resourceVersion`` unset or "0" starts with synthetic ADDED events for what exists now;
        one older than the kept history gets an ERROR event carrying a 410 Expired Status, as
        the real server does, and the client must list again.
        """
        store = self.server.api.store
        reqs = parse_label_selector(query.get("labelSelector", ""))
        timeout_s = min(float(query.get("timeoutSeconds") or 1800), 3600.0)
        deadline = time.monotonic() + timeout_s
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        lines: list[bytes] = []
        with store.lock:
            since = query.get("resourceVersion") or "0"
            if since == "0":
                for obj in store.list(resource, namespace, query.get("labelSelector", ""),
                                      query.get("fieldSelector", ""), copy_items=False)["items"]:
                    lines.append(json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n")
                last = store.revision
            else:
                last = int(since)
                if last < store.oldest_watchable():
                    gone = ApiError(410, "Expired", f"too old resource version: {last} ({store.oldest_watchable()})")
                    lines.append(json.dumps({"type": "ERROR", "object": gone.status()}).encode() + b"\n")
                    deadline = 0.0
        try:
            for line in lines:
                self._chunk(line)
            last_bookmark = time.monotonic()
            while time.monotonic() < deadline and not store.stopping:
                with store.lock:
                    pending = _events_after(store.history, last)
                    if not pending:
                        store.changed.wait(timeout=min(0.2, max(0.0, deadline - time.monotonic())))
                        pending = _events_after(store.history, last)
                    if pending:
                        last = pending[-1][0]
                    current = store.revision
                out = [f'{{"type": "{etype}", "object": {obj}}}\n'.encode()
                       for _rv, etype, res, ns, labels, obj in pending
                       if res == resource and (namespace is None or ns == namespace)
                       and all(r.matches(labels) for r in reqs)]
                if not out and bookmarks and time.monotonic() - last_bookmark > 1.0:
                    out = [json.dumps({"type": "BOOKMARK", "object": {
                        "kind": KINDS[resource], "apiVersion": GROUP_VERSIONS[resource],
                        "metadata": {"resourceVersion": str(max(last, current))}}}).encode() + b"\n"]
                    last_bookmark = time.monotonic()
                for line in out:
                    self._chunk(line)
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default listen backlog is 5: a burst of more parallel connections than that
    # (launch_parallelism is 16) gets resets a real API server's backlog would never give
    request_queue_size = 1024
    api: FakeKubeApiServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return  # a client went away (closed pool, timed-out request): not a server fault
        super().handle_error(request, client_address)


class FakeKubeApiServer:
    """Start with ``with FakeKubeApiServer() as api:``; ``api.write_kubeconfig(path)`` for the client.

    ``version``: the cluster's Kubernetes version (a gitVersion, "v1.20.2"): what ``/version``
    reports and what the kubelet admits (its safe sysctls, its words).
    """

    def __init__(self, clock: FakeClock | None = None, token: str = "dlts-test-token",
                 node_port_range: tuple[int, int] = NODE_PORT_RANGE, version: str = DEFAULT_VERSION) -> None:
        self.clock = clock or FakeClock()
        self.token = token
        self.version = version
        self.store = Store(self.clock, node_port_range=node_port_range)
        self.kubelet = FakeKubelet(self.store, self.clock, version=version)
        self.images = self.kubelet.images  # what the container runtime can pull (``images.add``)
        self.requests: Counter[tuple[str, str]] = Counter()
        self._faults: list[tuple[int, set[str] | None, set[str] | None]] = []
        self.delay_s = 0.0
        self.connections = 0  # TCP connections accepted (a client that keeps them alive opens few)
        self._lock = threading.Lock()
        self._http = _HttpServer(("127.0.0.1", 0), _Handler)
        self._http.api = self
        self._thread: threading.Thread | None = None

    # lifecycle
    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._http.serve_forever, args=(0.02,), name="fake-kube-apiserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self.store.lock:
            self.store.stopping = True
            self.store.changed.notify_all()
        self._http.shutdown()
        self._http.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "dlts", "user": {"token": self.token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "dlts", "namespace": namespace}}],
        }
        path.write_text(yaml.safe_dump(cfg))
        return path

    # instrumentation
    def connected(self) -> None:
        with self._lock:
            self.connections += 1

    def record(self, verb: str, resource: str) -> None:
        with self._lock:
            self.requests[(verb, resource)] += 1

    def reset_counts(self) -> None:
        with self._lock:
            self.requests.clear()

    def total_requests(self) -> int:
        with self._lock:
            return sum(self.requests.values())

    def fail_next(self, count: int, code: int = 503, verbs: set[str] | None = None,
                  resources: set[str] | None = None) -> None:
        """The next ``count`` matching requests (of these verbs, on these resources: all when None)
        answer ``code`` (a real Status) instead of working."""
        with self._lock:
            self._faults.extend([(code, verbs, resources)] * count)

    def clear_faults(self) -> None:
        """Drop the faults ``fail_next`` queued that have not fired yet."""
        with self._lock:
            self._faults.clear()

    def before_request(self, verb: str, resource: str) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)
        with self._lock:
            for i, (code, verbs, resources) in enumerate(self._faults):
                if (verbs is None or verb in verbs) and (resources is None or resource in resources):
                    self._faults.pop(i)
                    reason = HTTPStatus(code).phrase.replace(" ", "")
                    raise ApiError(code, reason, f"injected fault: {HTTPStatus(code).phrase}")

    # helpers for tests (they go straight to the store, like a cluster admin would through kubectl)
    def add_node(self, name: str, *, gpus: int = 8, cpu: str = "96", memory: str = "900Gi",
                 ephemeral_storage: str = "1800Gi", labels: dict[str, str] | None = None, ready: bool = True,
                 unschedulable: bool = False, annotations: dict[str, str] | None = None,
                 internal_ip: str | None = "", taints: list[dict] | None = None) -> dict:
        """A node as the kubelet registers it. ``internal_ip``: its InternalIP address ("" picks
        192.168.0.N by order of registration; None: a node that reports no InternalIP)."""
        allocatable = {"cpu": cpu, "memory": memory, "ephemeral-storage": ephemeral_storage, "pods": "110"}
        if internal_ip == "":
            count = len(self.objects("nodes", None))
            internal_ip = f"192.168.{count // 250}.{count % 250 + 10}"
        addresses = ([{"type": "InternalIP", "address": internal_ip}] if internal_ip else []) + [
            {"type": "Hostname", "address": name}]
        if gpus:
            allocatable["nvidia.com/gpu"] = str(gpus)
        now = self.clock()
        node_spec: dict[str, Any] = {"unschedulable": True} if unschedulable else {}
        if taints:
            node_spec["taints"] = taints
        body = {"metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
                "spec": node_spec,
                "status": {"capacity": dict(allocatable), "allocatable": allocatable, "addresses": addresses,
                           "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                           "reason": "KubeletReady" if ready else "KubeletNotReady",
                                           "lastTransitionTime": rfc3339(now), "lastHeartbeatTime": rfc3339(now)}]}}
        return self.store.create("nodes", "", body)

    def set_node_ready(self, name: str, ready: bool, status: str | None = None) -> None:
        """Flip a node's Ready condition (``status`` "Unknown" is what the node controller writes when
        the kubelet stops posting)."""
        value = status or ("True" if ready else "False")
        self.store.update_internal("nodes", "", name, lambda o: _set_condition(
            o, "Ready", value, self.clock(), "KubeletReady" if value == "True" else "NodeStatusUnknown"))

    def remove_node(self, name: str) -> None:
        self.store.remove_internal("nodes", "", name)

    def print_output(self, pod: str, text: str, *, container: str = "job", namespace: str = "default") -> None:
        """The container of ``pod`` prints ``text`` now (each line gets the clock's time), as if
        its program wrote to stdout; the pod log endpoint serves it."""
        uid = self.store.get("pods", namespace, pod)["metadata"]["uid"]
        self.store.append_log(namespace, uid, container, self.clock(), text.removesuffix("\n"))

    def lose_log(self, pod: str, message: str, *, container: str = "job", namespace: str = "default") -> None:
        """The container's log is gone from its node (the container removed, its log file deleted):
        the kubelet now answers ``message`` as the body of a 200, as a real one does."""
        with self.store.lock:
            self.store.lost_logs[(namespace, pod, container)] = message

    def pods(self, namespace: str = "default", selector: str = "") -> list[dict]:
        return self.store.list("pods", namespace, selector)["items"]

    def objects(self, resource: str, namespace: str | None = "default", selector: str = "") -> list[dict]:
        return self.store.list(resource, namespace if resource in NAMESPACED else None, selector)["items"]

    def run_until_idle(self, seconds: float, step_s: float = 1.0) -> None:
        """Advance the clock ``seconds`` in steps, ticking the kubelet at each step."""
        end = self.clock() + seconds
        self.kubelet.tick()
        while self.clock() < end:
            self.clock.advance(min(step_s, end - self.clock()))
            self.kubelet.tick()
