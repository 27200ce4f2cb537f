"""The declarative Lustre policy (``dlts-lustre apply POLICY.yaml``) and the control-plane hook that
builds one from the virtual clusters' storage settings (``policy_from_vcs``).

Schema validation is pydantic 2; every error is re-raised as ``PolicyError`` naming the key path
(``vcs[1].pool``) so an operator can fix the file without reading a traceback.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dlts_lustre.errors import PolicyError
from dlts_lustre.model import QuotaLimits
from dlts_lustre.units import DEFAULT_GRACE_S, parse_grace_s, parse_size_kib

POOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,15}$")
RESERVED_POOL_NAMES = frozenset({"none", "ignore", "inherit"})
SPREAD = "spread"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _size(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected a size such as 500G")
    if isinstance(value, int):
        if value == 0:
            return 0
        raise ValueError(f"{value} has no unit; write e.g. {value}G (0 means unlimited)")
    if isinstance(value, str) and value.strip().lower() in ("unlimited", "none"):
        return 0
    return parse_size_kib(str(value), require_unit=True)


class Limits(_Strict):
    """Soft/hard limits. Block limits take units (``500G``, ``2T``; 0 or ``unlimited`` = none); inode
    limits are counts. Stored as KiB."""

    block_soft: int = 0
    block_hard: int = 0
    inode_soft: int = Field(0, ge=0)
    inode_hard: int = Field(0, ge=0)

    @field_validator("block_soft", "block_hard", mode="before")
    @classmethod
    def _parse_block(cls, value: Any) -> int:
        return _size(value)

    @model_validator(mode="after")
    def _hard_over_soft(self) -> Limits:
        if self.block_hard and self.block_soft > self.block_hard:
            raise ValueError("block_soft must not exceed block_hard")
        if self.inode_hard and self.inode_soft > self.inode_hard:
            raise ValueError("inode_soft must not exceed inode_hard")
        return self

    def to_limits(self) -> QuotaLimits:
        return QuotaLimits(self.block_soft, self.block_hard, self.inode_soft, self.inode_hard)


class Grace(_Strict):
    """Grace periods (``1w``, ``3d12h``, seconds, or ``notify`` = warn only)."""

    block: int = DEFAULT_GRACE_S
    inode: int = DEFAULT_GRACE_S

    @field_validator("block", "inode", mode="before")
    @classmethod
    def _parse(cls, value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError("expected a grace time such as 1w")
        if value == "notify":
            return -1
        return parse_grace_s(str(value))


class Filesystem(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_]{1,8}$")
    mount: str

    @field_validator("mount")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("mount must be an absolute path")
        return value.rstrip("/") or "/"


class UserQuota(_Strict):
    default: Limits | None = None
    grace: Grace | None = None
    overrides: dict[str, Limits] = Field(default_factory=dict)
    reset_to_default: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _no_conflict(self) -> UserQuota:
        both = sorted(set(self.overrides) & set(self.reset_to_default))
        if both:
            raise ValueError(f"users both in overrides and reset_to_default: {', '.join(both)}")
        return self


def _ost_list(value: Any) -> tuple[int, ...]:
    """OST indices as a list of ints and ``"START-END"`` ranges, or one such string."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    out: list[int] = []
    for item in items:
        if isinstance(item, bool):
            raise ValueError("OST indices are integers or ranges like 0-3")
        if isinstance(item, int):
            out.append(item)
            continue
        text = str(item).strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", text)
        if not match:
            raise ValueError(f"{text!r} is not an OST index or range like 0-3")
        start, end = int(match[1]), int(match[2] or match[1])
        if end < start:
            raise ValueError(f"range {text!r} runs backwards")
        out.extend(range(start, end + 1))
    if any(i < 0 for i in out):
        raise ValueError("OST indices cannot be negative")
    if len(set(out)) != len(out):
        raise ValueError("OST index listed twice")
    return tuple(sorted(out))


class VcStorage(_Strict):
    """One VC's Lustre settings, as the control plane stores them on the VC (see docs/lustre.md)."""

    name: str = Field(min_length=1)
    directory: str = Field(min_length=1, description="path relative to the mount, e.g. vcs/vision")
    pool: str
    osts: tuple[int, ...]
    mdt: int | str = 0
    dir_stripe_count: int | None = Field(None, ge=2)
    # default layout of new subdirectories: striped over this many MDTs (lfs setdirstripe -D -c N
    # -i -1; -1 = every MDT). "spread" alone means 1 (each subdirectory on one MDT, round-robin).
    default_dir_stripe_count: int | None = Field(None, ge=-1)
    stripe_count: int | None = Field(None, ge=-1)
    project_id: int | None = Field(None, ge=1, le=4294967294)
    project_quota: Limits | None = None

    @field_validator("osts", mode="before")
    @classmethod
    def _parse_osts(cls, value: Any) -> tuple[int, ...]:
        return _ost_list(value)

    @field_validator("osts")
    @classmethod
    def _not_empty(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value:
            raise ValueError("a VC pool needs at least one OST (files cannot be created in an empty pool)")
        return value

    @field_validator("pool")
    @classmethod
    def _pool_name(cls, value: str) -> str:
        if not POOL_NAME_RE.match(value) or value in RESERVED_POOL_NAMES:
            raise ValueError("pool names are 1-15 characters from [A-Za-z0-9_-] and not none/ignore/inherit")
        return value

    @field_validator("mdt", mode="before")
    @classmethod
    def _mdt(cls, value: Any) -> int | str:
        if value == SPREAD:
            return SPREAD
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        raise ValueError(f"mdt is an MDT index (0, 1, ...) or 'spread', not {value!r}")

    @field_validator("directory")
    @classmethod
    def _relative(cls, value: str) -> str:
        path = PurePosixPath(value)
        if path.is_absolute() or ".." in path.parts or str(path) in (".", ""):
            raise ValueError("directory is a path below the mount, without '..', e.g. vcs/vision")
        return str(path)

    @field_validator("default_dir_stripe_count")
    @classmethod
    def _default_dir_stripe(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("default_dir_stripe_count is a number of MDTs (1, 2, ...) or -1 for all of them")
        return value

    @property
    def wanted_dir_default(self) -> int | None:
        """The stripe count of the default directory layout this VC asks for (None: none)."""
        if self.default_dir_stripe_count is not None:
            return self.default_dir_stripe_count
        return 1 if self.mdt == SPREAD else None

    @model_validator(mode="after")
    def _quota_needs_project(self) -> VcStorage:
        if self.project_quota is not None and self.project_id is None:
            raise ValueError("project_quota needs project_id")
        return self


class Policy(_Strict):
    filesystem: Filesystem
    user_quota: UserQuota = Field(default_factory=UserQuota)
    project_grace: Grace | None = None
    prune_pools: bool = False
    vcs: tuple[VcStorage, ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> Policy:
        for key in ("name", "directory", "pool"):
            seen: dict[Any, int] = {}
            for i, vc in enumerate(self.vcs):
                value = getattr(vc, key)
                if value in seen:
                    raise ValueError(f"vcs[{i}].{key} {value!r} is also used by vcs[{seen[value]}]")
                seen[value] = i
        ids: dict[int, int] = {}
        for i, vc in enumerate(self.vcs):
            if vc.project_id is not None:
                if vc.project_id in ids:
                    raise ValueError(f"vcs[{i}].project_id {vc.project_id} is also used by vcs[{ids[vc.project_id]}]")
                ids[vc.project_id] = i
        return self

    def vc_path(self, vc: VcStorage) -> str:
        return str(PurePosixPath(self.filesystem.mount) / vc.directory)


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part) in ("function-after", "function-before") or str(part).startswith(("int", "literal")):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _validation_message(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see docs/lustre.md)"
        where = _loc(err["loc"])
        # Cross-field checks at the top level already name their keys (vcs[1].pool ...).
        lines.append(f"  {msg}" if where == "(top level)" and re.match(r"^[a-z_]+(\[\d+\])?\.", msg)
                     else f"  {where}: {msg}")
    return f"invalid policy {source}:\n" + "\n".join(dict.fromkeys(lines))


def policy_from_mapping(data: Any, source: str = "(in memory)") -> Policy:
    if not isinstance(data, Mapping):
        raise PolicyError(f"invalid policy {source}: the top level must be a mapping with a 'filesystem' key")
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(_validation_message(exc, source)) from None


def load_policy(path: str | Path) -> Policy:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise PolicyError(f"cannot read policy {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise PolicyError(f"policy {path} is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    return policy_from_mapping(data, str(path))


class ClusterLustreDefaults(_Strict):
    """Cluster-wide settings the control plane keeps next to the VCs' storage settings."""

    filesystem: Filesystem
    user_quota: UserQuota = Field(default_factory=UserQuota)
    project_grace: Grace | None = None
    vc_root: str = "vcs"
    prune_pools: bool = False


def policy_from_vcs(vcs: Iterable[Mapping[str, Any] | VcStorage],
                    defaults: Mapping[str, Any] | ClusterLustreDefaults) -> Policy:
    """Build the Policy for the control plane's VCs.

    Each VC's settings are a mapping (or ``VcStorage``) with ``name``, ``pool``, ``osts`` and optionally
    ``directory`` (default ``<vc_root>/<name>``), ``mdt`` (index or ``"spread"``), ``stripe_count``,
    ``dir_stripe_count``, ``project_id`` and ``project_quota``. Raises ``PolicyError`` naming the VC and
    key (``vcs[vision].pool``) when a setting is invalid.
    """
    try:
        cluster = defaults if isinstance(defaults, ClusterLustreDefaults) else \
            ClusterLustreDefaults.model_validate(defaults)
    except ValidationError as exc:
        raise PolicyError(_validation_message(exc, "cluster Lustre defaults")) from None
    entries = []
    for i, vc in enumerate(vcs):
        if isinstance(vc, VcStorage):
            entries.append(vc)
            continue
        data = dict(vc)
        label = data.get("name", i)
        data.setdefault("directory", f"{cluster.vc_root.strip('/')}/{data.get('name', '')}")
        try:
            entries.append(VcStorage.model_validate(data))
        except ValidationError as exc:
            raise PolicyError(_validation_message(exc, f"storage settings of VC {label!r}")
                              .replace("\n  ", f"\n  vcs[{label}].")) from None
    try:
        return Policy(filesystem=cluster.filesystem, user_quota=cluster.user_quota,
                      project_grace=cluster.project_grace, prune_pools=cluster.prune_pools, vcs=tuple(entries))
    except ValidationError as exc:
        raise PolicyError(_validation_message(exc, "built from the VC storage settings")) from None
