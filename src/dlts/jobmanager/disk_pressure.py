"""Disk pressure: the room left on the volumes the job manager writes, as kubelet's eviction
thresholds judge a node's file systems.

The volumes (``watched_volumes``): ``log`` (the log store, ``log_dir``: the local init and the
Kubernetes log copy write every job's output there), ``run`` (the local backend's run directories)
and ``database`` (the directory of a SQLite database). Each reading (``os.statvfs``: the bytes and
inodes a user may still take) puts a volume at one level:

    ok    at or above both soft thresholds (``disk_pressure.soft_free_bytes`` / ``soft_free_inodes``)
    soft  below a soft threshold: a warning (the gauges, the DltsVolumeLowSpace alert, one notice to
          the cluster admins each time a volume gets there)
    hard  below a hard threshold: the job manager launches no new job (``hold``); the jobs that would
          have started wait with a reason that names the volume, and start by themselves once it is
          above the threshold again (DltsVolumeFull)

Jobs that run go on (their output path never blocks: ``logstore.CuttingLog``). Each change of a
volume's level is one log line. The readings are the job manager's; the node agent reports its own
mounts (free bytes and inodes, docs/agent.md).
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlts import metrics
from dlts.scheduler.model import Decisions, Snapshot, StopReason, Wait, WaitReason

if TYPE_CHECKING:
    from dlts.config import DiskPressureSettings, Settings

log = logging.getLogger(__name__)
ROLES = {"log": "log volume", "run": "run volume", "database": "database volume"}


class Level(enum.IntEnum):
    OK = 0
    SOFT = 1
    HARD = 2


@dataclass(frozen=True)
class Volume:
    role: str  # log | run | database
    path: Path


@dataclass(frozen=True)
class Reading:
    volume: Volume
    level: Level
    free_bytes: int | None = None
    size_bytes: int | None = None
    free_inodes: int | None = None  # None: the file system reports no inode count
    why: str = ""  # at soft or hard: "812.0 KiB free, below the hard threshold of 1.0 MiB"
    error: str = ""  # the volume could not be read (its level stays what it was)


def watched_volumes(settings: Settings, backend: Any) -> list[Volume]:
    """The volumes the job manager writes: the log store, the local backend's run directories,
    SQLite's database."""
    volumes = [Volume("log", settings.effective_log_dir)]
    run_dir = getattr(backend, "run_dir", None)
    if isinstance(run_dir, Path):
        volumes.append(Volume("run", run_dir))
    url = settings.effective_database_url
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        volumes.append(Volume("database", Path(url[len("sqlite:///"):]).parent))
    return volumes


def _existing(path: Path) -> Path:
    """The path, or its nearest existing parent (a log directory made at the first job)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return path


def _human(value: int) -> str:
    from dlts.managers.storage import human_bytes

    return human_bytes(value)


def judge(volume: Volume, st: os.statvfs_result, cfg: DiskPressureSettings) -> Reading:
    """A volume's level from its ``statvfs``; the worst of bytes and inodes."""
    free_bytes = st.f_bavail * st.f_frsize
    size_bytes = st.f_blocks * st.f_frsize
    free_inodes = st.f_favail if st.f_files > 0 else None
    level, why = Level.OK, ""
    for threshold_level, bytes_limit, inodes_limit, name in ((Level.HARD, cfg.hard_free_bytes, cfg.hard_free_inodes, "hard"),
                                                              (Level.SOFT, cfg.soft_free_bytes, cfg.soft_free_inodes, "soft")):
        if free_bytes < bytes_limit:
            level, why = threshold_level, (f"{_human(free_bytes)} free, below the {name} threshold of "
                                           f"{_human(bytes_limit)}")
        elif free_inodes is not None and free_inodes < inodes_limit:
            level, why = threshold_level, (f"{free_inodes} inodes free, below the {name} threshold of "
                                           f"{inodes_limit} inodes")
        if level is not Level.OK:
            break
    return Reading(volume, level, free_bytes, size_bytes, free_inodes, why)


class DiskPressure:
    """The volumes' levels, read at most every ``interval_s`` (``check``); ``hold`` is why new
    launches wait, or None."""

    def __init__(self, volumes: Sequence[Volume], cfg: DiskPressureSettings, host: str,
                 statvfs: Callable[[Path], os.statvfs_result] = os.statvfs) -> None:
        self.volumes = list(volumes)
        self.cfg = cfg
        self.host = host
        self.statvfs = statvfs
        self.readings: dict[str, Reading] = {v.role: Reading(v, Level.OK) for v in self.volumes}
        self._next = float("-inf")
        self._noticed: dict[str, Level] = {}  # the level each volume's last notice was queued for

    def check(self, now: float) -> list[Reading]:
        """Read the volumes if ``interval_s`` has passed since the last reading; the readings whose
        level changed (each change is logged once, and the gauges set)."""
        if not self.cfg.enabled or now < self._next:
            return []
        self._next = now + self.cfg.interval_s
        changed = []
        for volume in self.volumes:
            before = self.readings[volume.role]
            try:
                reading = judge(volume, self.statvfs(_existing(volume.path)), self.cfg)
            except OSError as exc:
                if not before.error:
                    log.warning("%s %s on %s cannot be read (%s); its pressure stays %s", ROLES[volume.role],
                                volume.path, self.host, exc.strerror, before.level.name.lower())
                self.readings[volume.role] = Reading(volume, before.level, before.free_bytes, before.size_bytes,
                                                     before.free_inodes, before.why, error=exc.strerror or str(exc))
                continue
            self.readings[volume.role] = reading
            self._gauges(reading)
            if reading.level is not before.level:
                changed.append(reading)
                self._log_change(before.level, reading)
            if reading.level is Level.OK:
                self._noticed.pop(volume.role, None)
        return changed

    def _log_change(self, before: Level, reading: Reading) -> None:
        where = f"{ROLES[reading.volume.role]} {reading.volume.path} on {self.host}"
        if reading.level is Level.HARD:
            log.error("%s: %s; no new job is launched until it is above it", where, reading.why)
        elif reading.level is Level.SOFT:
            log.warning("%s: %s%s", where, reading.why,
                        "; new jobs are launched again" if before is Level.HARD else "")
        else:
            log.warning("%s has room again (%s free)%s", where, _human(reading.free_bytes or 0),
                        "; new jobs are launched again" if before is Level.HARD else "")

    @staticmethod
    def _gauges(reading: Reading) -> None:
        labels = (reading.volume.role, str(reading.volume.path))
        metrics.VOLUME_FREE_BYTES.labels(*labels).set(reading.free_bytes or 0)
        metrics.VOLUME_SIZE_BYTES.labels(*labels).set(reading.size_bytes or 0)
        if reading.free_inodes is not None:
            metrics.VOLUME_FREE_INODES.labels(*labels).set(reading.free_inodes)
        metrics.VOLUME_PRESSURE.labels(*labels).set(int(reading.level))

    def hold(self) -> str | None:
        """Why no new job is launched now (a volume below a hard threshold), or None."""
        full = [r for r in self.readings.values() if r.level is Level.HARD]
        if not full:
            return None
        return "; ".join(f"{ROLES[r.volume.role]} full on {self.host}: {r.why}" for r in full)

    def to_notice(self) -> list[Reading]:
        """Volumes at soft or hard whose notice for that level (or a worse one) is not queued yet."""
        return [r for r in self.readings.values()
                if r.level is not Level.OK and self._noticed.get(r.volume.role, Level.OK) < r.level]

    def noticed(self, reading: Reading) -> None:
        self._noticed[reading.volume.role] = reading.level


def hold_launches(decisions: Decisions, snapshot: Snapshot, detail: str) -> Decisions:
    """A pass's decisions with no new launch: its starts and scale-ups go, and so do the preemptions
    and scale-downs made to make room; each job that would have started, or had room made for it,
    waits with ``disk_pressure`` and ``detail`` (in its VC's queue position). Wall-time stops and the
    other waits stand."""
    kept_stops = tuple(s for s in decisions.stops if s.for_job is None and s.reason is not StopReason.PREEMPTED)
    room_for = {s.for_job for s in decisions.stops if s not in kept_stops and s.for_job is not None}
    vc_of = {j.id: j.vc for j in snapshot.jobs}
    taken: dict[str, set[int]] = {}
    waits = []
    for wait in decisions.waits:
        if wait.job_id in room_for:
            wait = Wait(wait.job_id, WaitReason.DISK_PRESSURE, detail, queue_position=wait.queue_position)
        if wait.queue_position is not None:
            taken.setdefault(vc_of.get(wait.job_id, ""), set()).add(wait.queue_position)
        waits.append(wait)
    for start in decisions.starts:
        if start.scale_up:
            continue
        used = taken.setdefault(vc_of.get(start.job_id, ""), set())
        position = next(p for p in range(1, len(used) + 2) if p not in used)  # the place the start left
        used.add(position)
        waits.append(Wait(start.job_id, WaitReason.DISK_PRESSURE, detail, queue_position=position))
    return replace(decisions, starts=(), stops=kept_stops, waits=tuple(waits))
