"""Accounting: who used the GPUs, how busy they were, and each attempt's utilisation history
(docs/accounting.md).

Booking (``book``, run by the accounting manager) is incremental: per attempt not fully booked yet,
it adds the GPU time since the attempt's ``booked_until`` mark (allocated GPUs x time, split at UTC
midnights) and the busy GPU time of the utilisation minutes since ``utilisation_booked_until`` to the
day, month and job-day rollups, and moves both marks, in one transaction with a compare-and-set on
the mark: a crash before the commit books nothing, a second booker books nothing twice. When the job
manager records an end earlier than what was booked (the backend saw the process end before the
manager did), the next pass books the difference back, negative: the totals stay equal to the sum
of the attempts.

The node report (services/nodes.py) folds each job's GPU utilisation and memory, CPU cores and host
memory into one ``utilisation_points`` row per attempt, node and minute (running means).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import logging
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.errors import Forbidden, InvalidInput
from dlts.models import (
    ACTIVE,
    Job,
    JobAttempt,
    UsageJobDay,
    UsageTotal,
    User,
    UtilisationPoint,
    VirtualCluster,
    iso,
)
from dlts.repositories import accounting as repo
from dlts.services import policy
from dlts.services.auth import Principal
from dlts.services.transaction import step

log = logging.getLogger(__name__)

EPOCH = dt.datetime(1970, 1, 1)
MS = dt.timedelta(milliseconds=1)
MINUTE = dt.timedelta(minutes=1)
MINUTE_MS = 60_000
# a utilisation minute is booked this long after it ends: a report that read the clock inside the
# minute has committed by then
CLOSED_LAG = dt.timedelta(minutes=2)
DEFAULT_BATCH = 500
GROUPS = ("user", "vc", "sku", "preemptible", "month", "day", "job")
MAX_JOB_ROWS = 10_000


def _ms(t: dt.datetime) -> int:
    return (t - EPOCH) // MS


def _at(ms: int) -> dt.datetime:
    return EPOCH + ms * MS


def floor_minute(t: dt.datetime) -> dt.datetime:
    return t.replace(second=0, microsecond=0)


def ceil_minute(t: dt.datetime) -> dt.datetime:
    down = floor_minute(t)
    return down if down == t else down + MINUTE


def month_of(day: dt.date) -> dt.date:
    return day.replace(day=1)


def day_pieces(start: dt.datetime, end: dt.datetime) -> list[tuple[dt.date, int]]:
    """[start, end) split at UTC midnights: (day, milliseconds) pieces that add up to end - start."""
    pieces = []
    a = _ms(start)
    while start < end:
        midnight = dt.datetime.combine(start.date() + dt.timedelta(days=1), dt.time())
        stop = min(midnight, end)
        b = _ms(stop)
        pieces.append((start.date(), b - a))
        start, a = stop, b
    return pieces


def allocated_gpus(placements: Sequence[Mapping[str, Any]] | None, gpus: int, nodes: int) -> int:
    """GPUs the attempt holds now: its placements' GPU indices (inference replicas come and go), or
    the job's ask where the placements name no indices."""
    held = sum(len(p.get("gpu_indices") or ()) for p in placements or ())
    return held or gpus * (nodes if nodes > 0 else 1)


# -- booking ------------------------------------------------------------------------------------------

@dataclass
class BookResult:
    attempts: int = 0  # attempts whose marks moved
    closed: int = 0  # attempts fully booked by this pass
    gpu_ms: int = 0
    busy_gpu_ms: int = 0
    conflicts: int = 0  # batches given up because another booker moved a mark first


@dataclass
class _Delta:
    gpu_ms: int = 0
    busy_gpu_ms: int = 0
    sampled_gpu_ms: int = 0

    def add(self, gpu: int = 0, busy: int = 0, sampled: int = 0) -> None:
        self.gpu_ms += gpu
        self.busy_gpu_ms += busy
        self.sampled_gpu_ms += sampled


def point_gpu_ms(point: UtilisationPoint, started: dt.datetime, ended: dt.datetime | None) -> tuple[int, int]:
    """(busy, sampled) GPU-milliseconds of one utilisation minute, clipped to the attempt's run."""
    a = max(_ms(point.minute), _ms(started))
    b = _ms(point.minute) + MINUTE_MS
    if ended is not None:
        b = min(b, _ms(ended))
    covered = max(0, b - a)
    busy = sampled = 0
    for n, ratio, _mem in (point.gpus or {}).values():
        if n and ratio is not None:
            busy += round(min(1.0, max(0.0, float(ratio))) * covered)
            sampled += covered
    return busy, sampled


def book(session: Session, now: dt.datetime, *, batch: int = DEFAULT_BATCH, max_batches: int = 1000) -> BookResult:
    """Book every open attempt up to ``now``, ``batch`` attempts a transaction. Commits."""
    result = BookResult()
    after = 0
    for _ in range(max_batches):
        rows = repo.open_attempts(session, after, batch)
        if not rows:
            break
        after = rows[-1].id
        try:
            with step(session):  # committed, or on a conflict rolled back
                done = _book_batch(session, rows, now)
        except _Conflict:
            result.conflicts += 1
            continue
        for key in ("attempts", "closed", "gpu_ms", "busy_gpu_ms"):
            setattr(result, key, getattr(result, key) + getattr(done, key))
        if len(rows) < batch:
            break
    return result


class _Conflict(Exception):
    pass


# who an attempt's booking counts for: (user id, VC id, SKU, preemptible)
_Who = tuple[int, int, str, bool]


def _book_batch(session: Session, rows: list[sa.Row[*tuple[Any, ...]]], now: dt.datetime) -> BookResult:
    result = BookResult()
    util_end = floor_minute(now - CLOSED_LAG)
    # utilisation minutes to book, per attempt: [from, to)
    windows: dict[int, tuple[dt.datetime, dt.datetime]] = {}
    for r in rows:
        if r.started_at is None:
            continue
        start = r.utilisation_booked_until or floor_minute(r.started_at)
        end = min(util_end, ceil_minute(r.ended_at)) if r.ended_at is not None else util_end
        if end > start:
            windows[r.id] = (start, end)
    points: dict[int, list[UtilisationPoint]] = defaultdict(list)
    if windows:
        lo = min(w[0] for w in windows.values())
        for p in repo.points_between(session, windows, lo, None):
            w = windows[p.attempt_id]
            if w[0] <= p.minute < w[1]:
                points[p.attempt_id].append(p)
    totals: dict[tuple[str, dt.date, int, int, str, bool], _Delta] = defaultdict(_Delta)  # (period, start, *who)
    job_days: dict[tuple[int, dt.date], _Delta] = defaultdict(_Delta)
    meta: dict[int, _Who] = {}
    bookings: list[repo.Booking] = []
    for r in rows:
        sku = r.sku or ""
        who: _Who = (r.user_id, r.vc_id, sku, bool(r.preemptible))
        meta[r.job_id] = who
        if r.started_at is None:
            if r.ended_at is not None:  # ended before it ever ran: nothing to book
                bookings.append(repo.Booking(r.id, r.booked_until, r.booked_until, r.utilisation_booked_until, True))
                result.closed += 1
            continue
        attempt = _Delta()
        frm = r.booked_until or r.started_at
        to = min(r.ended_at, now) if r.ended_at is not None else now
        to = max(to, r.started_at)
        gpus = allocated_gpus(r.placements, r.gpus, r.nodes)
        if to != frm:
            sign = 1 if to > frm else -1
            for day, ms in day_pieces(min(frm, to), max(frm, to)):
                delta = sign * ms * gpus
                attempt.add(gpu=delta)
                totals[("day", day, *who)].add(gpu=delta)
                totals[("month", month_of(day), *who)].add(gpu=delta)
                job_days[(r.job_id, day)].add(gpu=delta)
        utilisation_until = r.utilisation_booked_until
        if r.id in windows:
            utilisation_until = windows[r.id][1]
            for p in points.get(r.id, ()):
                busy, sampled = point_gpu_ms(p, r.started_at, r.ended_at)
                day = p.minute.date()
                attempt.add(busy=busy, sampled=sampled)
                totals[("day", day, *who)].add(busy=busy, sampled=sampled)
                totals[("month", month_of(day), *who)].add(busy=busy, sampled=sampled)
                job_days[(r.job_id, day)].add(busy=busy, sampled=sampled)
        close = (r.ended_at is not None and to >= r.ended_at
                 and utilisation_until is not None and utilisation_until >= ceil_minute(r.ended_at))
        if to == frm and utilisation_until == r.utilisation_booked_until and not close:
            continue
        bookings.append(repo.Booking(r.id, r.booked_until, to, utilisation_until, close, attempt.gpu_ms,
                                     attempt.busy_gpu_ms, attempt.sampled_gpu_ms))
        result.attempts += 1
        result.closed += int(close)
        result.gpu_ms += attempt.gpu_ms
        result.busy_gpu_ms += attempt.busy_gpu_ms
    if not repo.mark_booked(session, bookings):
        raise _Conflict
    repo.add_totals(session, [
        {"period": k[0], "start": k[1], "user_id": k[2], "vc_id": k[3], "sku": k[4], "preemptible": k[5],
         "gpu_ms": d.gpu_ms, "busy_gpu_ms": d.busy_gpu_ms, "sampled_gpu_ms": d.sampled_gpu_ms}
        for k, d in sorted(totals.items(), key=lambda kv: (kv[0][0], kv[0][1], *kv[0][2:]))])
    repo.add_job_days(session, [
        {"job_id": job_id, "day": day, "user_id": meta[job_id][0], "vc_id": meta[job_id][1], "sku": meta[job_id][2],
         "preemptible": meta[job_id][3], "gpu_ms": d.gpu_ms, "busy_gpu_ms": d.busy_gpu_ms,
         "sampled_gpu_ms": d.sampled_gpu_ms}
        for (job_id, day), d in sorted(job_days.items())])
    return result


# -- utilisation from the node report -----------------------------------------------------------------

MAX_SAMPLE = 2**62  # bytes fit a BIGINT; anything larger is not a reading


def _number(value: Any, *, integer: bool = False) -> float | int | None:
    """A finite, non-negative reading, or None (junk in a report is no value, never an error)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value < MAX_SAMPLE:
        return None
    return int(value) if integer else float(value)


def _job_id(value: Any) -> int | None:
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    return int(text) if text.isdigit() and len(text) <= 18 else None


def _mean(old: float | None, n: int, value: float | None) -> float | None:
    if value is None:
        return old
    return value if old is None or n <= 0 else old + (value - old) / (n + 1)


def record_utilisation(session: Session, node: str, metrics: Mapping[str, Any], now: dt.datetime) -> int:
    """Fold the report's per-job samples into this minute's points. Does not commit (the report's
    transaction does). Returns the number of attempts sampled.

    ``metrics.gpus[]`` carries each GPU's ``job_id``, ``utilization_ratio`` and ``memory_used_bytes``;
    ``metrics.jobs[]`` each job's ``cpu_cores`` and ``memory_bytes`` (docs/agent.md). Malformed
    entries are skipped: a report is never refused for its samples.
    """
    gpus: dict[int, dict[str, tuple[float | None, int | None]]] = defaultdict(dict)
    for g in metrics.get("gpus") or () if isinstance(metrics.get("gpus"), list) else ():
        if not isinstance(g, Mapping) or g.get("lost"):
            continue
        job, index = _job_id(g.get("job_id")), _number(g.get("index"), integer=True)
        if job is None or index is None:
            continue
        ratio = _number(g.get("utilization_ratio"))
        gpus[job][str(index)] = (min(ratio, 1.0) if ratio is not None else None,
                                 _number(g.get("memory_used_bytes"), integer=True))  # type: ignore[assignment]
    hosts: dict[int, tuple[float | None, int | None]] = {}
    for j in metrics.get("jobs") or () if isinstance(metrics.get("jobs"), list) else ():
        if not isinstance(j, Mapping) or (job := _job_id(j.get("job_id"))) is None:
            continue
        hosts[job] = (_number(j.get("cpu_cores")), _number(j.get("memory_bytes"), integer=True))  # type: ignore[assignment]
    attempts = repo.current_attempts(session, sorted(set(gpus) | set(hosts))[:1000], sorted(ACTIVE))
    if not attempts:
        return 0
    minute = floor_minute(now)
    existing = {p.attempt_id: p for p in session.scalars(sa.select(UtilisationPoint).where(
        UtilisationPoint.attempt_id.in_(list(attempts.values())), UtilisationPoint.node == node,
        UtilisationPoint.minute == minute))}
    for job, attempt_id in attempts.items():
        point = existing.get(attempt_id)
        if point is None:
            point = UtilisationPoint(attempt_id=attempt_id, node=node[:253], minute=minute, samples=0, gpus={},
                                     cpu_samples=0)
            session.add(point)
        merged = {k: list(v) for k, v in (point.gpus or {}).items()}
        for key, (ratio, memory) in gpus.get(job, {}).items():
            n, old_ratio, old_memory = merged.get(key, [0, None, None])
            merged[key] = [n + 1, _mean(old_ratio, n, ratio), _mean(old_memory, n, memory)]
        point.gpus = merged
        if job in hosts:
            cores, memory = hosts[job]
            n = point.cpu_samples or 0
            point.cpu_cores = _mean(point.cpu_cores, n, cores)
            mem = _mean(float(point.memory_bytes) if point.memory_bytes is not None else None, n,
                        float(memory) if memory is not None else None)
            point.memory_bytes = int(mem) if mem is not None else None
            point.cpu_samples = n + 1
        point.samples = (point.samples or 0) + 1
    return len(attempts)


def purge_utilisation(session: Session, now: dt.datetime, retention_days: int, *, batch: int = 5000,
                      max_batches: int = 100) -> int:
    """Delete utilisation points older than ``retention_days``, in short transactions. Commits."""
    cutoff = now - dt.timedelta(days=retention_days)
    deleted = 0
    for _ in range(max_batches):
        with step(session):
            n = repo.delete_points_before(session, cutoff, batch)
        deleted += n
        if n < batch:
            break
    return deleted


# -- reading the history ------------------------------------------------------------------------------

@dataclass(frozen=True)
class UtilisationHistory:
    job_id: int
    attempt: int
    interval_s: int
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    # [{"at", "gpus": [{"node", "index", "utilization_ratio", "memory_used_bytes"}], "cpu_cores", "memory_bytes"}]
    points: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """The body of ``GET /jobs/{id}/utilisation``: times as ISO 8601 text."""
        return {"job_id": self.job_id, "attempt": self.attempt, "interval_s": self.interval_s,
                "started_at": iso(self.started_at), "ended_at": iso(self.ended_at),
                "points": [{**p, "at": iso(p["at"])} for p in self.points]}


MAX_POINTS = 20_000


def utilisation(session: Session, principal: Principal, job_id: int, attempt: int | None = None) -> UtilisationHistory:
    """The attempt's minutes (the current attempt by default): owner, VC admins, cluster admins; 404
    outside the job's VC, 403 for its other members (utilisation is not a public field)."""
    job = session.get(Job, job_id)
    policy.require_visible(principal, job, job_id)
    assert job is not None
    if policy.job_visibility(principal, job) is not policy.Visibility.FULL:
        raise Forbidden(f"Only the job's owner ({job.user.name}) or an admin of VC {job.vc.name} may read the "
                        f"utilisation of job {job.id}.")
    number = job.attempt if attempt is None else attempt
    row = session.scalar(sa.select(JobAttempt).where(JobAttempt.job_id == job.id, JobAttempt.number == number))
    if row is None:
        if attempt is not None:
            raise InvalidInput(f"Job {job.id} has no attempt {attempt}; it has {job.attempt}.",
                               details={"field": "attempt"})
        return UtilisationHistory(job.id, number, 60, None, None, [])
    minutes: dict[dt.datetime, dict[str, Any]] = {}
    query = (sa.select(UtilisationPoint).where(UtilisationPoint.attempt_id == row.id)
             .order_by(UtilisationPoint.minute.desc(), UtilisationPoint.node).limit(MAX_POINTS))
    for p in session.scalars(query):
        entry = minutes.setdefault(p.minute, {"at": p.minute, "gpus": [], "cpu_cores": None, "memory_bytes": None})
        for index, (_n, ratio, memory) in sorted((p.gpus or {}).items(), key=lambda kv: int(kv[0])):
            entry["gpus"].append({"node": p.node, "index": int(index),
                                  "utilization_ratio": round(ratio, 4) if ratio is not None else None,
                                  "memory_used_bytes": int(memory) if memory is not None else None})
        if p.cpu_cores is not None:
            entry["cpu_cores"] = round((entry["cpu_cores"] or 0.0) + p.cpu_cores, 3)
        if p.memory_bytes is not None:
            entry["memory_bytes"] = (entry["memory_bytes"] or 0) + p.memory_bytes
    return UtilisationHistory(job.id, number, 60, row.started_at, row.ended_at,
                              [minutes[m] for m in sorted(minutes)])


# -- the usage report ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class UsageQuery:
    group_by: tuple[str, ...]
    start: dt.date  # inclusive
    end: dt.date  # inclusive
    vc: str | None = None
    user: str | None = None
    limit: int = 1000  # rows of group_by=job


@dataclass(frozen=True)
class UsageRow:
    keys: dict[str, Any]
    gpu_ms: int
    busy_gpu_ms: int
    sampled_gpu_ms: int
    preemptible_gpu_ms: int

    def as_json(self) -> dict[str, Any]:
        idle = max(0, self.sampled_gpu_ms - self.busy_gpu_ms)
        unmeasured = max(0, self.gpu_ms - self.sampled_gpu_ms)
        return {**self.keys,
                "gpu_seconds": self.gpu_ms / 1000, "busy_gpu_seconds": self.busy_gpu_ms / 1000,
                "idle_gpu_seconds": idle / 1000, "unmeasured_gpu_seconds": unmeasured / 1000,
                "preemptible_gpu_seconds": self.preemptible_gpu_ms / 1000,
                "gpu_hours": round(self.gpu_ms / 3_600_000, 4), "busy_gpu_hours": round(self.busy_gpu_ms / 3_600_000, 4),
                "idle_gpu_hours": round(idle / 3_600_000, 4), "unmeasured_gpu_hours": round(unmeasured / 3_600_000, 4),
                "preemptible_gpu_hours": round(self.preemptible_gpu_ms / 3_600_000, 4),
                "preemptible_share": round(self.preemptible_gpu_ms / self.gpu_ms, 4) if self.gpu_ms > 0 else 0.0}


@dataclass(frozen=True)
class UsageReport:
    query: UsageQuery
    rows: list[UsageRow]
    truncated: bool = False

    def as_json(self) -> dict[str, Any]:
        """The body of ``GET /usage`` (documented by the API's UsageSchema; built here, not by
        marshmallow, which took ~1 ms a row)."""
        q = self.query
        return {"group_by": list(q.group_by), "from": q.start.isoformat(), "to": q.end.isoformat(), "vc": q.vc,
                "user": q.user, "truncated": self.truncated, "items": [r.as_json() for r in self.rows]}


def parse_group_by(text: str | None) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in (text or "user").split(",") if p.strip())
    bad = [p for p in parts if p not in GROUPS]
    if bad or not parts:
        raise InvalidInput(f"group_by takes a comma-separated list of {', '.join(GROUPS)}; got {(text or '')[:100]!r}.",
                           details={"field": "group_by"})
    return tuple(dict.fromkeys(parts))


def parse_range(start: str | None, end: str | None, today: dt.date) -> tuple[dt.date, dt.date]:
    """``from``/``to`` as YYYY-MM-DD (that day) or YYYY-MM (that month's first or last day); both
    inclusive. Defaults: this month up to today."""
    def one(text: str, field_name: str, last: bool) -> dt.date:
        try:
            if len(text) == 7:
                first = dt.datetime.strptime(text, "%Y-%m").date()
                return (month_of(first + dt.timedelta(days=31)) - dt.timedelta(days=1)) if last else first
            return dt.datetime.strptime(text, "%Y-%m-%d").date()
        except ValueError:
            raise InvalidInput(f"{field_name} must be a date like 2026-11-30 or a month like 2026-11; got {text[:40]!r}.",
                               details={"field": field_name}) from None

    first = one(start, "from", False) if start else month_of(today)
    last = one(end, "to", True) if end else max(today, first)
    if last < first:
        raise InvalidInput(f"to ({last}) is before from ({first}).", details={"field": "to"})
    if (last - first).days > 3700:
        raise InvalidInput("Ask for at most ten years at a time.", details={"field": "to"})
    return first, last


def _full_months(start: dt.date, end: dt.date) -> tuple[dt.date, dt.date] | None:
    """[first, last) month starts wholly inside [start, end], or None."""
    first = start if start.day == 1 else month_of(start + dt.timedelta(days=31))
    after = end + dt.timedelta(days=1)
    last = after if after.day == 1 else month_of(after)
    return (first, last) if first < last else None


def usage(session: Session, principal: Principal, q: UsageQuery) -> UsageReport:
    """GPU time by the query's groups, over the VCs ``principal`` may see jobs of (cluster admins:
    all). Read from the rollup only: whole months from the month rows, the days around them from the
    day rows; ``job`` from the job-day rows."""
    visible = None if principal.is_cluster_admin else sorted(principal.vc_ids.values())
    vc_id = user_id = None
    if q.vc:
        vc_id = session.scalar(sa.select(VirtualCluster.id).where(VirtualCluster.name == q.vc))
        if vc_id is None or (visible is not None and vc_id not in visible):
            return UsageReport(q, [])
    if q.user:
        user_id = session.scalar(sa.select(User.id).where(User.name == q.user))
        if user_id is None:
            return UsageReport(q, [])
    if visible is not None and not visible:
        return UsageReport(q, [])
    if "job" in q.group_by:
        return _usage_by_job(session, q, visible, vc_id, user_id)
    t = UsageTotal
    dims = {"user": t.user_id, "vc": t.vc_id, "sku": t.sku, "preemptible": t.preemptible}
    ranges: list[tuple[str, dt.date, dt.date]] = []  # (period, first start, after last start)
    months = None if "day" in q.group_by else _full_months(q.start, q.end)
    if months is None:
        ranges.append(("day", q.start, q.end + dt.timedelta(days=1)))
    else:
        if q.start < months[0]:
            ranges.append(("day", q.start, months[0]))
        ranges.append(("month", months[0], months[1]))
        if months[1] <= q.end:
            ranges.append(("day", months[1], q.end + dt.timedelta(days=1)))
    # key: the grouped columns' values as the database returns them, then ("day"|"month", date) pairs
    sums: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    names = [g for g in q.group_by if g in dims]
    for period, lo, hi in ranges:
        cols = [dims[g] for g in names]
        time_cols = []
        if "day" in q.group_by:
            time_cols.append(t.start)
        if "month" in q.group_by:
            time_cols.append(t.start)  # a month row's start is its month; day rows fold into months below
        query = (sa.select(*cols, *time_cols, t.preemptible,
                           sa.func.sum(t.gpu_ms), sa.func.sum(t.busy_gpu_ms), sa.func.sum(t.sampled_gpu_ms))
                 .where(t.period == period, t.start >= lo, t.start < hi)
                 .group_by(*cols, *time_cols, t.preemptible))
        if visible is not None:
            query = query.where(t.vc_id.in_(visible))
        if vc_id is not None:
            query = query.where(t.vc_id == vc_id)
        if user_id is not None:
            query = query.where(t.user_id == user_id)
        for row in session.execute(query):
            values = list(row)
            gpu, busy, sampled = (int(v or 0) for v in values[-3:])
            pre = bool(values[-4])
            key_values = values[:len(cols)]
            times = values[len(cols):len(cols) + len(time_cols)]
            key = list(key_values)
            if "day" in q.group_by:
                key.append(("day", _date(times[0])))
            if "month" in q.group_by:
                key.append(("month", month_of(_date(times[-1]))))
            entry = sums[tuple(key)]
            entry[0] += gpu
            entry[1] += busy
            entry[2] += sampled
            entry[3] += gpu if pre else 0
    return UsageReport(q, _rows(session, names, q.group_by, sums))


def _date(value: Any) -> dt.date:
    return value if isinstance(value, dt.date) and not isinstance(value, dt.datetime) else (
        value.date() if isinstance(value, dt.datetime) else dt.date.fromisoformat(str(value)[:10]))


def _rows(session: Session, names: list[str], group_by: tuple[str, ...], sums: Mapping[tuple[Any, ...], list[int]]) -> list[UsageRow]:
    user_ids = {k[names.index("user")] for k in sums} if "user" in names else set()
    vc_ids = {k[names.index("vc")] for k in sums} if "vc" in names else set()
    users = dict(session.execute(sa.select(User.id, User.name).where(User.id.in_(user_ids))).all()) if user_ids else {}
    vcs = dict(session.execute(sa.select(VirtualCluster.id, VirtualCluster.name)
                               .where(VirtualCluster.id.in_(vc_ids))).all()) if vc_ids else {}
    rows = []
    for key, (gpu, busy, sampled, pre) in sums.items():
        keys: dict[str, Any] = {}
        for name, value in zip(names, key):
            if name == "user":
                keys["user"] = users.get(value, f"user#{value}")
            elif name == "vc":
                keys["vc"] = vcs.get(value, f"vc#{value}")
            elif name == "sku":
                keys["sku"] = value or None
            else:
                keys["preemptible"] = bool(value)
        for name, value in key[len(names):]:
            keys[name] = value.isoformat() if name == "day" else value.strftime("%Y-%m")
        rows.append(UsageRow(keys, gpu, busy, sampled, pre))
    order = [g for g in group_by if g != "job"]
    rows.sort(key=lambda r: tuple("" if r.keys.get(g) is None else str(r.keys.get(g)) for g in order))
    return rows


def _usage_by_job(session: Session, q: UsageQuery, visible: list[int] | None, vc_id: int | None,
                  user_id: int | None) -> UsageReport:
    d = UsageJobDay
    time_cols = [d.day] if "day" in q.group_by else []
    query = (sa.select(d.job_id, *time_cols, sa.func.max(d.user_id), sa.func.max(d.vc_id), sa.func.max(d.sku),
                       sa.func.max(d.preemptible), sa.func.sum(d.gpu_ms), sa.func.sum(d.busy_gpu_ms),
                       sa.func.sum(d.sampled_gpu_ms))
             .where(d.day >= q.start, d.day <= q.end).group_by(d.job_id, *time_cols)
             .order_by(d.job_id.desc(), *time_cols).limit(q.limit + 1))
    if visible is not None:
        query = query.where(d.vc_id.in_(visible))
    if vc_id is not None:
        query = query.where(d.vc_id == vc_id)
    if user_id is not None:
        query = query.where(d.user_id == user_id)
    found = list(session.execute(query))
    truncated = len(found) > q.limit
    found = found[:q.limit]
    job_ids = {r[0] for r in found}
    jobs = dict(session.execute(sa.select(Job.id, Job.name).where(Job.id.in_(job_ids))).all()) if job_ids else {}
    users = {r[-7] for r in found}
    vcs = {r[-6] for r in found}
    user_names = dict(session.execute(sa.select(User.id, User.name).where(User.id.in_(users))).all()) if users else {}
    vc_names = dict(session.execute(sa.select(VirtualCluster.id, VirtualCluster.name)
                                    .where(VirtualCluster.id.in_(vcs))).all()) if vcs else {}
    rows = []
    for r in found:
        job_id, *rest = r
        day = rest.pop(0) if time_cols else None
        uid, vid, sku, pre, gpu, busy, sampled = rest
        keys = {"job_id": int(job_id), "job_name": jobs.get(job_id), "user": user_names.get(uid, f"user#{uid}"),
                "vc": vc_names.get(vid, f"vc#{vid}"), "sku": sku or None, "preemptible": bool(pre)}
        if day is not None:
            keys["day"] = _date(day).isoformat()
        gpu, busy, sampled = int(gpu or 0), int(busy or 0), int(sampled or 0)
        rows.append(UsageRow(keys, gpu, busy, sampled, gpu if pre else 0))
    return UsageReport(q, rows, truncated)


# -- CSV ------------------------------------------------------------------------------------------------

FORMULA_LEADS = ("=", "+", "-", "@", "\t", "\r")
CSV_METRICS = ("gpu_hours", "busy_gpu_hours", "idle_gpu_hours", "unmeasured_gpu_hours", "preemptible_gpu_hours",
               "preemptible_share", "gpu_seconds", "busy_gpu_seconds", "idle_gpu_seconds", "unmeasured_gpu_seconds",
               "preemptible_gpu_seconds")


def safe_cell(value: object) -> object:
    """A text cell a spreadsheet would run as a formula (= + - @, or a leading tab or CR) gets a quote."""
    if isinstance(value, str) and value.startswith(FORMULA_LEADS):
        return "'" + value
    return "" if value is None else value


def to_csv(report: UsageReport) -> str:
    out = io.StringIO()
    # RFC 4180 line ends: a CR inside a cell (a job name) then makes the writer quote the cell
    writer = csv.writer(out, lineterminator="\r\n")
    keys: list[str] = []
    for g in report.query.group_by:
        keys += ["job_id", "job_name", "user", "vc", "sku", "preemptible"] if g == "job" else [g]
    keys = list(dict.fromkeys(keys))
    writer.writerow(["from", "to", *keys, *CSV_METRICS])
    for row in report.rows:
        data = row.as_json()
        writer.writerow([report.query.start.isoformat(), report.query.end.isoformat(),
                         *(safe_cell(data.get(k)) for k in keys), *(data[m] for m in CSV_METRICS)])
    return out.getvalue()
