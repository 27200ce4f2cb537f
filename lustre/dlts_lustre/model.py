"""Value types returned by the parsers and the typed operations: frozen dataclasses and Enums only.

Sizes are in KiB (``*_kib``) because that is Lustre's native unit; conversions live in ``units``.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class QuotaKind(enum.Enum):
    """Who a quota applies to; the value is the ``lfs`` flag letter."""

    USER = "u"
    GROUP = "g"
    PROJECT = "p"

    @property
    def default_flag(self) -> str:
        """The upper-case flag that addresses the default quota of this kind (``-U/-G/-P``)."""
        return "-" + self.value.upper()


class GraceState(enum.Enum):
    """The grace column of a quota row."""

    NOT_STARTED = "not_started"  # "-": under the soft limit, no timer
    RUNNING = "running"          # "6d23h59m58s": over the soft limit, timer running
    EXPIRED = "expired"          # "none" (<= 2.16.0) or "expired" (2.16.52+)


@dataclass(frozen=True)
class GraceStatus:
    state: GraceState
    remaining_s: int | None = None

    @classmethod
    def not_started(cls) -> GraceStatus:
        return cls(GraceState.NOT_STARTED)


@dataclass(frozen=True)
class QuotaLimits:
    """Soft/hard limits; 0 means unlimited, as in Lustre."""

    block_soft_kib: int = 0
    block_hard_kib: int = 0
    inode_soft: int = 0
    inode_hard: int = 0


@dataclass(frozen=True)
class QuotaEntry:
    """One row of ``lfs quota``. ``None`` is a ``-`` column (not applicable, e.g. on a target row)."""

    block_used_kib: int | None
    block_soft_kib: int | None
    block_hard_kib: int | None
    block_grace: GraceStatus
    inode_used: int | None
    inode_soft: int | None
    inode_hard: int | None
    inode_grace: GraceStatus
    block_over_limit: bool = False
    inode_over_limit: bool = False
    # Columns printed inside "[...]": a target did not answer, the value is a lower bound.
    inaccurate_columns: frozenset[str] = frozenset()

    @property
    def limits(self) -> QuotaLimits:
        return QuotaLimits(self.block_soft_kib or 0, self.block_hard_kib or 0,
                           self.inode_soft or 0, self.inode_hard or 0)


@dataclass(frozen=True)
class TargetQuota:
    """A per-target row of ``lfs quota -v``."""

    uuid: str
    entry: QuotaEntry | None  # None when the target is inactive
    inactive: bool = False


@dataclass(frozen=True)
class QuotaReport:
    kind: QuotaKind
    name: str | None         # as printed ("bob", "1001")
    numeric_id: int | None
    mount: str
    total: QuotaEntry
    targets: tuple[TargetQuota, ...] = ()
    uses_default_block: bool = False
    uses_default_file: bool = False
    inaccurate: bool = False
    errors: tuple[str, ...] = ()   # e.g. "quotactl ost0 failed."
    pool: str | None = None


@dataclass(frozen=True)
class DefaultQuota:
    """``lfs quota -U/-G/-P MOUNT``: the default limits and grace of a kind."""

    kind: QuotaKind
    mount: str
    limits: QuotaLimits
    block_grace_s: int | None
    inode_grace_s: int | None


@dataclass(frozen=True)
class GraceTimes:
    """``lfs quota -t``; ``None`` marks a value printed as ``[...]`` (unknown) and ``notify`` is -1."""

    block_grace_s: int | None
    inode_grace_s: int | None


GRACE_NOTIFY_S = -1  # "notify": warn only, never enforce


class TargetKind(enum.Enum):
    MDT = "MDT"
    OST = "OST"


class TargetFlag(enum.Enum):
    """Trailing flags of ``lfs df`` rows."""

    DEGRADED = "D"
    NO_CREATE = "N"
    READ_ONLY = "R"
    OUT_OF_SPACE = "S"
    OUT_OF_INODES = "I"
    FLASH = "f"


@dataclass(frozen=True)
class DfRow:
    """One target of ``lfs df``; for ``-i`` the numbers are inodes rather than KiB."""

    uuid: str
    kind: TargetKind
    index: int
    total: int
    used: int
    available: int
    mount: str
    active: bool = True
    flags: frozenset[TargetFlag] = frozenset()


@dataclass(frozen=True)
class DfSummary:
    total: int
    used: int
    available: int
    mount: str


@dataclass(frozen=True)
class DfReport:
    """``lfs df`` for one filesystem; ``inodes`` tells whether the numbers are inodes (``-i``)."""

    inodes: bool
    targets: tuple[DfRow, ...]
    summary: DfSummary | None
    pool: str | None = None

    def osts(self) -> tuple[DfRow, ...]:
        return tuple(t for t in self.targets if t.kind is TargetKind.OST)

    def mdts(self) -> tuple[DfRow, ...]:
        return tuple(t for t in self.targets if t.kind is TargetKind.MDT)


@dataclass(frozen=True)
class Pool:
    fsname: str
    name: str
    ost_indices: tuple[int, ...] = ()


@dataclass(frozen=True)
class StripeLayout:
    """Default file layout of a directory (``lfs getstripe -d``). ``None`` means not set there."""

    stripe_count: int | None = None
    stripe_size_bytes: int | None = None
    stripe_offset: int | None = None
    pool: str | None = None
    composite: bool = False


@dataclass(frozen=True)
class DirStripe:
    """``lfs getdirstripe`` (``default`` for ``-D``)."""

    stripe_count: int
    stripe_offset: int
    hash_type: str
    mdt_indices: tuple[int, ...] = ()
    max_inherit: int | None = None
    default: bool = False


@dataclass(frozen=True)
class ProjectInfo:
    """``lfs project -d DIR``: the project id and whether the inherit flag (``P``) is set."""

    project_id: int
    inherit: bool
    path: str


class HealthState(enum.Enum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    LBUG = "lbug"


@dataclass(frozen=True)
class Health:
    state: HealthState
    raw: str
    unhealthy_devices: tuple[str, ...] = ()

    @property
    def healthy(self) -> bool:
        return self.state is HealthState.HEALTHY


@dataclass(frozen=True)
class StatCounter:
    name: str
    samples: int
    unit: str | None = None
    minimum: int | None = None
    maximum: int | None = None
    total: int | None = None      # SUM column
    sum_squares: int | None = None


@dataclass(frozen=True)
class StatsBlock:
    """One ``param.name=`` block of ``obdfilter.*.stats`` / ``mdt.*.md_stats``."""

    param: str          # e.g. "obdfilter.fs-OST0000.stats"
    target: str         # e.g. "fs-OST0000"
    snapshot_time_s: float
    counters: dict[str, StatCounter] = field(default_factory=dict, hash=False, compare=True)


@dataclass(frozen=True)
class Rate:
    target: str
    counter: str
    ops_per_s: float
    bytes_per_s: float | None  # for byte counters (read_bytes/write_bytes): SUM delta / time


@dataclass(frozen=True)
class LustreVersion:
    major: int
    minor: int
    patch: int
    fix: int = 0
    raw: str = ""

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.major, self.minor, self.patch, self.fix)

    @property
    def new_quota_header(self) -> bool:
        """2.16.52 renamed the quota columns (bquota/blimit/...) and added ``-q --delimiter``."""
        return (self.major, self.minor, self.patch) >= (2, 16, 52)

    @property
    def has_default_quotas(self) -> bool:
        return (self.major, self.minor) >= (2, 12)

    def __str__(self) -> str:
        base = f"{self.major}.{self.minor}.{self.patch}"
        return base + (f".{self.fix}" if self.fix else "")


@dataclass(frozen=True)
class ServerTarget:
    """A target this server holds, from its osd-* parameters (no client mount needed)."""

    name: str            # "dltsfs-OST0001"
    kind: TargetKind
    index: int
    kib_total: int | None = None
    kib_free: int | None = None
    kib_available: int | None = None
    inodes_total: int | None = None
    inodes_free: int | None = None
    quota_enforced: str | None = None  # "ugp", "ug", "none"; None when the release shows no quota_slave
