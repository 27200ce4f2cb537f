"""Reading ``dlts sim`` inputs: CLUSTER.yaml and TRACE.csv (formats in SCHEDULING.md).

Both readers turn every problem into a ``SimInputError`` naming the file, the line and the field,
so the command line can print one actionable sentence instead of a traceback.

TRACE.csv may carry two optional trailing columns, ``min_replicas`` and ``max_replicas``, for
inference jobs (default 1 and 1); every other job ignores them.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from dlts.scheduler.model import CPU_SKU, MAX_LIMIT_WEIGHT, JobType, Node, Policy, SkuShape, Vc

GIB = 1024**3

TRACE_COLUMNS = (
    "id",
    "submit_s",
    "vc",
    "user",
    "type",
    "sku",
    "gpus",
    "nodes",
    "duration_s",
    "max_time_s",
    "priority",
    "preemptible",
)
OPTIONAL_TRACE_COLUMNS = ("min_replicas", "max_replicas")


class SimInputError(Exception):
    """A bad input file; ``str()`` is the message a person reads."""

    def __init__(self, path: str | Path, line: int | None, field: str | None, message: str) -> None:
        self.path, self.line, self.field = str(path), line, field
        where = self.path + (f", line {line}" if line else "") + (f", field {field!r}" if field else "")
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class Cluster:
    skus: dict[str, SkuShape]
    nodes: tuple[Node, ...]
    vcs: dict[str, Vc]
    tick_s: float
    preempt_grace_s: float = 0.0
    reservation_depth: int = 8  # backfill: reservations per pass
    # fair share: the half-life of a user's GPU time in hours (dlts.yaml's setting, same default);
    # 0 orders by priority and queue time alone
    fair_share_half_life_h: float = 168.0


@dataclass(frozen=True)
class TraceJob:
    # The core numbers jobs with ints: a trace whose ids are all whole numbers keeps them; any
    # other trace (Philly, PAI, Helios use ids like ``application_1506638472019_14199``) is
    # numbered 1.. in (submit_s, line) order and ``label`` keeps the trace's own id for output.
    id: int
    submit_s: float
    vc: str
    user: str
    type: JobType
    sku: str | None
    gpus: int
    nodes: int
    duration_s: float
    max_time_s: int | None
    priority: int
    preemptible: bool
    min_replicas: int = 0
    max_replicas: int = 0
    line: int = 0
    label: int | str | None = None  # the id as the trace writes it (an int when it is a whole number)

    @property
    def trace_id(self) -> int | str:
        return self.id if self.label is None else self.label


# -- CLUSTER.yaml -----------------------------------------------------------------------------


class _LineDict(dict):
    line: int = 0


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> _LineDict:
    d = _LineDict(loader.construct_mapping(node, deep=True))
    d.line = node.start_mark.line + 1
    return d


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


class _Fields:
    """Typed access to one YAML mapping, with errors that point at it."""

    def __init__(self, path: Path, data: Any, what: str, line: int = 0) -> None:
        self.path = path
        if not isinstance(data, dict):
            raise SimInputError(path, line or None, what, f"expected a mapping, got {type(data).__name__}")
        self.data = data
        self.line = getattr(data, "line", line) or None
        self.what = what

    def _err(self, key: str, msg: str) -> SimInputError:
        return SimInputError(self.path, self.line, f"{self.what}.{key}", msg)

    def get(self, key: str, kind: type, default: Any = ..., minimum: float | None = None) -> Any:
        if key not in self.data or self.data[key] is None:
            if default is ...:
                raise self._err(key, "is required")
            return default
        value = self.data[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind is int and isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, kind) or (kind in (int, float) and isinstance(value, bool)):
            raise self._err(key, f"must be {kind.__name__}, got {value!r}")
        if minimum is not None and isinstance(value, (int, float)) and value < minimum:
            raise self._err(key, f"must be >= {minimum:g}, got {value!r}")
        return value

    def unknown(self, allowed: set[str]) -> None:
        extra = sorted(set(self.data) - allowed)
        if extra:
            raise self._err(extra[0], f"unknown key; allowed: {', '.join(sorted(allowed))}")


MAX_HALF_LIFE_H = 24 * 365  # as dlts.yaml's fair_share_half_life_h


def load_cluster(path: str | Path) -> Cluster:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SimInputError(path, None, None, f"cannot read: {exc.strerror}") from None
    try:
        data = yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise SimInputError(path, mark.line + 1 if mark else None, None, f"not valid YAML: {exc}") from None
    top = _Fields(path, data, "cluster")
    top.unknown({"skus", "nodes", "vcs", "tick_s", "preempt_grace_s", "reservation_depth", "fair_share_half_life_h"})

    skus: dict[str, SkuShape] = {}
    raw_skus = top.get("skus", dict)
    for name, spec in raw_skus.items():
        f = _Fields(path, spec, f"skus.{name}", raw_skus.line)
        f.unknown({"gpus", "cpu", "memory_gb", "cpu_per_gpu", "memory_per_gpu_gb"})
        mpg = f.get("memory_per_gpu_gb", float, None, minimum=0)
        skus[str(name)] = SkuShape(
            str(name),
            f.get("gpus", int, minimum=0),
            f.get("cpu", float, minimum=0),
            int(f.get("memory_gb", float, minimum=0) * GIB),
            f.get("cpu_per_gpu", float, None, minimum=0),
            None if mpg is None else int(mpg * GIB),
        )

    nodes: list[Node] = []
    raw_nodes = top.get("nodes", list)
    for i, spec in enumerate(raw_nodes):
        f = _Fields(path, spec, f"nodes[{i}]", top.line or 0)
        f.unknown({"name", "prefix", "count", "sku", "ib_domain", "ib_domains", "vc", "schedulable"})
        sku = f.get("sku", str)
        if sku not in skus:
            raise f._err("sku", f"unknown SKU {sku!r}; defined: {', '.join(sorted(skus))}")
        shape = skus[sku]
        vc = f.get("vc", str, None)
        schedulable = f.get("schedulable", bool, True)
        if "prefix" in f.data:
            prefix = f.get("prefix", str)
            count = f.get("count", int, minimum=1)
            domains = f.get("ib_domains", int, 1, minimum=1)
            width = max(3, len(str(count - 1)))
            block = math.ceil(count / domains)
            base = f.get("ib_domain", str, "pod")
            for k in range(count):
                dom = f"{base}{k // block}" if domains > 1 or "ib_domain" not in f.data else base
                nodes.append(
                    Node(f"{prefix}{k:0{width}d}", sku, shape.gpus, shape.cpu, shape.memory_bytes, dom, vc, schedulable)
                )
        else:
            name = f.get("name", str)
            dom = f.get("ib_domain", str, "default")
            nodes.append(Node(name, sku, shape.gpus, shape.cpu, shape.memory_bytes, dom, vc, schedulable))
    seen: set[str] = set()
    for n in nodes:
        if n.name in seen:
            raise SimInputError(path, top.line, "nodes", f"node name {n.name!r} appears twice")
        seen.add(n.name)

    vcs: dict[str, Vc] = {}
    raw_vcs = top.get("vcs", list)
    for i, spec in enumerate(raw_vcs):
        f = _Fields(path, spec, f"vcs[{i}]", top.line or 0)
        f.unknown(
            {
                "name",
                "quota",
                "policy",
                "max_job_time_s",
                "max_interactive_gpus",
                "user_gpu_quota",
                "cpu_quota",
                "memory_quota_gb",
                "allow_cpu_jobs_on_gpu_nodes",
                "default_runtime_estimate_s",
                "fair_share",
                "fair_share_max_wait_s",
                "limit_weight",
                "min_runtime_s",
                "max_reclaim_delay_s",
                "max_preemptions",
            }
        )
        name = f.get("name", str)
        quota = f.get("quota", dict, {})
        for sku, amount in quota.items():
            if sku not in skus:
                raise f._err("quota", f"unknown SKU {sku!r}; defined: {', '.join(sorted(skus))}")
            if not isinstance(amount, int) or isinstance(amount, bool) or amount < 0:
                raise f._err("quota", f"quota for {sku} must be a whole number >= 0, got {amount!r}")
        policy_name = f.get("policy", str, "RF")
        try:
            policy = Policy(policy_name)
        except ValueError:
            raise f._err("policy", f"must be one of {', '.join(p.value for p in Policy)}, got {policy_name!r}") from None
        mem_gb = f.get("memory_quota_gb", float, None, minimum=0)
        limit_weight = f.get("limit_weight", float, 0.0, minimum=0)
        if not limit_weight <= MAX_LIMIT_WEIGHT:  # NaN too
            raise f._err("limit_weight", f"must be between 0 and {MAX_LIMIT_WEIGHT:g}, got {limit_weight!r}")
        if name in vcs:
            raise f._err("name", f"VC {name!r} appears twice")
        vcs[name] = Vc(
            name,
            {str(k): int(v) for k, v in quota.items()},
            policy,
            f.get("max_job_time_s", int, None, minimum=1),
            f.get("max_interactive_gpus", int, None, minimum=0),
            f.get("user_gpu_quota", int, None, minimum=0),
            f.get("cpu_quota", float, None, minimum=0),
            None if mem_gb is None else int(mem_gb * GIB),
            f.get("allow_cpu_jobs_on_gpu_nodes", bool, False),
            default_runtime_estimate_s=f.get("default_runtime_estimate_s", int, None, minimum=1),
            fair_share=f.get("fair_share", bool, True),
            fair_share_max_wait_s=f.get("fair_share_max_wait_s", float, None, minimum=0),
            limit_weight=limit_weight,
            min_runtime_s=f.get("min_runtime_s", float, 0.0, minimum=0),
            max_reclaim_delay_s=f.get("max_reclaim_delay_s", float, None, minimum=0),
            max_preemptions=f.get("max_preemptions", int, 0, minimum=0),
        )
    for n in nodes:
        if n.vc is not None and n.vc not in vcs:
            raise SimInputError(path, top.line, "nodes", f"node {n.name} is assigned to unknown VC {n.vc!r}")
    half_life_h = top.get("fair_share_half_life_h", float, 168.0, minimum=0)
    if not half_life_h <= MAX_HALF_LIFE_H:  # NaN too
        raise top._err("fair_share_half_life_h", f"must be <= {MAX_HALF_LIFE_H} (hours), got {half_life_h!r}")
    return Cluster(
        skus,
        tuple(nodes),
        vcs,
        top.get("tick_s", float, 10.0, minimum=0.001),
        top.get("preempt_grace_s", float, 0.0, minimum=0),
        top.get("reservation_depth", int, 8, minimum=0),
        half_life_h,
    )


# -- TRACE.csv --------------------------------------------------------------------------------

_TRUE = {"true", "1", "yes", "y", "t"}
_FALSE = {"false", "0", "no", "n", "f", ""}


def load_trace(path: str | Path, cluster: Cluster) -> list[TraceJob]:
    path = Path(path)
    try:
        fh = path.open(newline="")
    except OSError as exc:
        raise SimInputError(path, None, None, f"cannot read: {exc.strerror}") from None
    with fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        missing = [c for c in TRACE_COLUMNS if c not in header]
        if missing:
            raise SimInputError(path, 1, missing[0], f"header lacks column(s) {', '.join(missing)}; expected {','.join(TRACE_COLUMNS)}")
        extra = [c for c in header if c not in TRACE_COLUMNS + OPTIONAL_TRACE_COLUMNS]
        if extra:
            raise SimInputError(path, 1, extra[0], f"unknown column; optional ones are {', '.join(OPTIONAL_TRACE_COLUMNS)}")
        jobs: list[TraceJob] = []
        ids: set[str] = set()
        for row in reader:
            line = reader.line_num
            jobs.append(_parse_row(path, line, row, cluster, ids))
    if all(isinstance(j.label, int) for j in jobs):  # every id a whole number: keep them
        jobs = [replace(j, id=j.label) for j in jobs if isinstance(j.label, int)]
        jobs.sort(key=lambda j: (j.submit_s, j.id))
    else:
        jobs.sort(key=lambda j: (j.submit_s, j.line))
        jobs = [replace(j, id=k) for k, j in enumerate(jobs, start=1)]
    return jobs


def _parse_row(path: Path, line: int, row: dict, cluster: Cluster, ids: set[str]) -> TraceJob:
    def err(field: str, msg: str) -> SimInputError:
        return SimInputError(path, line, field, msg)

    def num(field: str, kind: type, default: Any = ..., minimum: float | None = None) -> Any:
        raw = (row.get(field) or "").strip()
        if raw == "":
            if default is ...:
                raise err(field, "is empty")
            return default
        try:
            value = kind(raw)
        except ValueError:
            raise err(field, f"must be {'a whole number' if kind is int else 'a number'}, got {raw!r}") from None
        if kind is float and not math.isfinite(value):
            raise err(field, f"must be finite, got {raw!r}")
        if minimum is not None and value < minimum:
            raise err(field, f"must be >= {minimum:g}, got {raw!r}")
        return value

    if None in row:
        raise err("", "has more values than the header has columns")
    raw_id = (row.get("id") or "").strip()
    if not raw_id:
        raise err("id", "is empty")
    label: int | str = int(raw_id) if re.fullmatch(r"[0-9]{1,18}", raw_id) else raw_id
    key = str(label)  # "007" and "7" are the same job
    if key in ids:
        raise err("id", f"job id {raw_id} appears twice")
    ids.add(key)
    vc = (row.get("vc") or "").strip()
    if vc not in cluster.vcs:
        raise err("vc", f"unknown VC {vc!r}; CLUSTER.yaml defines {', '.join(sorted(cluster.vcs))}")
    try:
        jtype = JobType((row.get("type") or "").strip())
    except ValueError:
        raise err("type", f"must be one of {', '.join(t.value for t in JobType)}, got {row.get('type')!r}") from None
    gpus = num("gpus", int, minimum=0)
    sku = (row.get("sku") or "").strip() or None
    if sku is not None and sku not in cluster.skus:
        raise err("sku", f"unknown SKU {sku!r}; CLUSTER.yaml defines {', '.join(sorted(cluster.skus))}")
    if gpus > 0 and sku in (None, CPU_SKU):
        raise err("sku", f"a job asking {gpus} GPUs needs a GPU SKU")
    nodes = num("nodes", int, 0, minimum=0)
    if jtype is JobType.DISTRIBUTED and nodes < 1:
        raise err("nodes", "a distributed job needs nodes >= 1")
    if jtype is not JobType.DISTRIBUTED and nodes != 0:
        raise err("nodes", f"must be 0 for a {jtype.value} job")
    raw_pre = (row.get("preemptible") or "").strip().lower()
    if raw_pre not in _TRUE | _FALSE:
        raise err("preemptible", f"must be true or false, got {row.get('preemptible')!r}")
    min_r = num("min_replicas", int, 1, minimum=1) if jtype is JobType.INFERENCE else 0
    max_r = num("max_replicas", int, min_r, minimum=1) if jtype is JobType.INFERENCE else 0
    if max_r < min_r:
        raise err("max_replicas", f"must be >= min_replicas ({min_r}), got {max_r}")
    return TraceJob(
        id=0,
        label=label,
        submit_s=num("submit_s", float, minimum=0),
        vc=vc,
        user=(row.get("user") or "").strip() or "anonymous",
        type=jtype,
        sku=sku,
        gpus=gpus,
        nodes=nodes,
        duration_s=num("duration_s", float, minimum=0.001),
        max_time_s=num("max_time_s", int, None, minimum=1),
        priority=num("priority", int, 100, minimum=1),
        preemptible=raw_pre in _TRUE,
        min_replicas=min_r,
        max_replicas=max_r,
        line=line,
    )
