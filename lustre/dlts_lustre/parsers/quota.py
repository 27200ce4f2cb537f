"""Parse ``lfs quota`` in every supported shape.

* Lustre <= 2.16.0 header ``Filesystem kbytes quota limit grace files quota limit grace``; a mount
  point longer than 15 characters (and ``-v`` target names) is printed on its own line with the numbers
  on the next; expired grace is ``none``.
* 2.16.52+ header ``Filesystem kbytes bquota blimit bgrace files iquota ilimit igrace``; no wrap;
  expired grace is ``expired``; ``-q --delimiter=,`` prints bare delimited rows in that column order.
* ``-h`` prints ``used`` and human sizes; columns are found by header name, so both work.
* ``*`` after a usage value marks over-limit, ``[...]`` marks an inaccurate value (then the trailer
  ``Some errors happened ...``), ``-v`` adds per-target rows, ``[inact]`` marks inactive targets.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from dlts_lustre.errors import LustreParseError
from dlts_lustre.model import (
    GRACE_NOTIFY_S,
    DefaultQuota,
    GraceState,
    GraceStatus,
    GraceTimes,
    QuotaEntry,
    QuotaKind,
    QuotaLimits,
    QuotaReport,
    TargetQuota,
)
from dlts_lustre.parsers._common import human_to_kib
from dlts_lustre.units import parse_grace_s

WHAT = "lfs quota"
COLUMNS = ("block_used", "block_soft", "block_hard", "block_grace",
           "inode_used", "inode_soft", "inode_hard", "inode_grace")
_SIZE_COLUMNS = {"block_used", "block_soft", "block_hard"}
_UNIT_ENDINGS = set("kKMGTPEB")

_KIND_WORDS = {"usr": QuotaKind.USER, "user": QuotaKind.USER, "grp": QuotaKind.GROUP, "group": QuotaKind.GROUP,
               "prj": QuotaKind.PROJECT, "project": QuotaKind.PROJECT}
_TITLE_RE = re.compile(r"^Disk quotas for (?P<kind>usr|user|grp|group|prj|project) (?P<name>.+?)"
                       r"(?: \((?:uid|gid|pid|prjid|projid) (?P<id>\d+)\))?:$")
_DEFAULT_TITLE_RE = re.compile(r"^Disk default (?P<kind>usr|user|grp|group|prj|project) quota:$")
_USES_DEFAULT_RE = re.compile(r"^[ugp]id (\d+) is using default (block|file) quota setting$")
_POOL_RE = re.compile(r"^Quotas for pool: (\S+)$")
_QUOTACTL_FAIL_RE = re.compile(r"^quotactl (?:ost|mdt)\d+ failed\.?$")
_ERRORS_TRAILER = "Some errors happened when getting quota info."
_TOTAL_ALLOCATED = "Total allocated inode limit:"
_INACT = "[inact]"


@dataclass(frozen=True)
class _Cell:
    value: int | None
    over: bool = False
    inaccurate: bool = False


def _header_columns(tokens: list[str], line: str, n: int) -> tuple[str, ...]:
    """Map header names to canonical column names; old headers repeat quota/limit/grace for inodes."""
    names = []
    inode_section = False
    for tok in tokens:
        low = tok.lower()
        if low == "filesystem":
            names.append("fs")
        elif low in ("kbytes", "used"):
            names.append("block_used")
        elif low == "files":
            names.append("inode_used")
            inode_section = True
        elif low in ("quota", "limit", "grace"):
            base = {"quota": "soft", "limit": "hard", "grace": "grace"}[low]
            names.append(("inode_" if inode_section else "block_") + base)
        elif low in ("bquota", "blimit", "bgrace", "iquota", "ilimit", "igrace"):
            names.append(("block_" if low[0] == "b" else "inode_") +
                         {"quota": "soft", "limit": "hard", "grace": "grace"}[low[1:]])
        else:
            raise LustreParseError(WHAT, f"unknown header column {tok!r}", line=line, line_no=n)
    if not names or names[0] != "fs" or len(set(names)) != len(names):
        raise LustreParseError(WHAT, "malformed header", line=line, line_no=n)
    return tuple(names)


def _grace_cell(token: str, line: str, n: int) -> GraceStatus:
    tok = token.strip("[]")
    if tok == "-":
        return GraceStatus.not_started()
    if tok in ("none", "expired"):
        return GraceStatus(GraceState.EXPIRED, 0)
    try:
        return GraceStatus(GraceState.RUNNING, parse_grace_s(tok))
    except ValueError:
        raise LustreParseError(WHAT, f"bad grace value {token!r}", line=line, line_no=n) from None


def _value_cell(token: str, column: str, human: bool, line: str, n: int) -> _Cell:
    tok = token
    inaccurate = False
    over = False
    if tok.endswith("*"):
        over, tok = True, tok[:-1]
    if tok.startswith("[") and tok.endswith("]"):
        inaccurate, tok = True, tok[1:-1]
    if tok.endswith("*"):  # "[123*]" has been seen in the wild as well as "[123]*"
        over, tok = True, tok[:-1]
    if tok == "-":
        return _Cell(None, over, inaccurate)
    if human and column in _SIZE_COLUMNS:
        return _Cell(human_to_kib(tok, WHAT, line, n), over, inaccurate)
    if column in _SIZE_COLUMNS and tok[-1:] in _UNIT_ENDINGS and tok[:1].isdigit():
        # a size with a unit where no header said -h (-q -h prints no header): "4kB", "1.5G"
        return _Cell(human_to_kib(tok, WHAT, line, n), over, inaccurate)
    if not tok.isdigit():
        raise LustreParseError(WHAT, f"column {column} is not a number: {token!r}", line=line, line_no=n)
    return _Cell(int(tok), over, inaccurate)


def _entry(tokens: list[str], columns: tuple[str, ...], human: bool, line: str, n: int) -> QuotaEntry:
    if len(tokens) != len(columns):
        raise LustreParseError(WHAT, f"expected {len(columns)} values, got {len(tokens)}", line=line, line_no=n)
    values: dict[str, object] = {}
    inaccurate: set[str] = set()
    over = {"block": False, "inode": False}
    for column, token in zip(columns, tokens):
        if column.endswith("_grace"):
            values[column] = _grace_cell(token, line, n)
            if token.startswith("["):
                inaccurate.add(column)
            continue
        cell = _value_cell(token, column, human, line, n)
        values[column] = cell.value
        if cell.inaccurate:
            inaccurate.add(column)
        if cell.over:
            over[column.split("_")[0]] = True
    return QuotaEntry(
        block_used_kib=values.get("block_used"), block_soft_kib=values.get("block_soft"),  # type: ignore[arg-type]
        block_hard_kib=values.get("block_hard"),  # type: ignore[arg-type]
        block_grace=values.get("block_grace", GraceStatus.not_started()),  # type: ignore[arg-type]
        inode_used=values.get("inode_used"), inode_soft=values.get("inode_soft"),  # type: ignore[arg-type]
        inode_hard=values.get("inode_hard"),  # type: ignore[arg-type]
        inode_grace=values.get("inode_grace", GraceStatus.not_started()),  # type: ignore[arg-type]
        block_over_limit=over["block"], inode_over_limit=over["inode"], inaccurate_columns=frozenset(inaccurate))


def _starts_with_value(line: str) -> bool:
    tok = line.split()[0]
    return tok[0].isdigit() or tok[0] in "[-"


def parse_quota(text: str, *, kind: QuotaKind | None = None, delimiter: str | None = None,
                quiet: bool = False) -> QuotaReport:
    """Parse ``lfs quota {-u|-g|-p} ID [-v] [--pool P] MOUNT``.

    ``delimiter`` is given when the command ran with ``-q --delimiter=X`` (2.16.52+): rows are then
    delimited in the documented column order and there are no header lines. ``quiet`` is ``-q``
    alone (every version): no title and no header, the columns in the documented order
    (``kbytes quota limit grace files quota limit grace``), a long mount point still wrapped before
    2.16.52; ``kind`` must then be given.
    """
    lines = [(n, raw.rstrip()) for n, raw in enumerate(text.splitlines(), 1) if raw.strip()]
    if not lines:
        raise LustreParseError(WHAT, "empty output")
    name = numeric_id = pool = None
    columns: tuple[str, ...] | None = ("fs",) + COLUMNS if (delimiter or quiet) else None
    human = False
    total: QuotaEntry | None = None
    mount = ""
    targets: list[TargetQuota] = []
    uses_block = uses_file = inaccurate = False
    errors: list[str] = []
    pending_name: tuple[int, str] | None = None

    def data_row(row_name: str, values: list[str], line: str, n: int) -> None:
        nonlocal total, mount
        assert columns is not None
        if row_name.endswith(_INACT) or values == [_INACT] or _INACT in values:
            targets.append(TargetQuota(uuid=row_name.replace(_INACT, "").strip(), entry=None, inactive=True))
            return
        entry = _entry(values, columns[1:], human, line, n)
        if total is None:
            total, mount = entry, row_name
        else:
            targets.append(TargetQuota(uuid=row_name, entry=entry))

    for n, line in lines:
        stripped = line.strip()
        if pending_name is not None:
            if not _starts_with_value(stripped):
                raise LustreParseError(WHAT, f"numbers expected after wrapped name {pending_name[1]!r}",
                                       line=stripped, line_no=n)
            data_row(pending_name[1], stripped.split(), stripped, n)
            pending_name = None
            continue
        if (m := _TITLE_RE.match(stripped)) is not None:
            found = _KIND_WORDS[m["kind"]]
            if kind is not None and found is not kind:
                raise LustreParseError(WHAT, f"asked for {kind.name.lower()} quota, output is {found.name.lower()}",
                                       line=stripped, line_no=n)
            kind, name = found, m["name"]
            numeric_id = int(m["id"]) if m["id"] else (int(name) if name.isdigit() else None)
            continue
        if (m := _POOL_RE.match(stripped)) is not None:
            pool = m[1]
            continue
        if stripped.split()[0] == "Filesystem":
            columns = _header_columns(stripped.split(), stripped, n)
            human = "used" in [t.lower() for t in stripped.split()]
            continue
        if (m := _USES_DEFAULT_RE.match(stripped)) is not None:
            uses_block |= m[2] == "block"
            uses_file |= m[2] == "file"
            numeric_id = numeric_id if numeric_id is not None else int(m[1])
            continue
        if stripped.startswith(_ERRORS_TRAILER):
            inaccurate = True
            continue
        if stripped.startswith(_TOTAL_ALLOCATED):
            continue
        if _QUOTACTL_FAIL_RE.match(stripped):
            errors.append(stripped)
            continue
        if columns is None:
            raise LustreParseError(WHAT, "data before the Filesystem header", line=stripped, line_no=n)
        if delimiter and delimiter in stripped:
            cells = [c.strip() for c in stripped.split(delimiter)]
            data_row(cells[0], cells[1:], stripped, n)
            continue
        tokens = stripped.split()
        if len(tokens) == 1 and tokens[0].endswith(_INACT):
            targets.append(TargetQuota(uuid=tokens[0][: -len(_INACT)], entry=None, inactive=True))
            continue
        if len(tokens) == 1:
            pending_name = (n, tokens[0])  # wrapped: the name alone, numbers on the next line
            continue
        data_row(tokens[0], tokens[1:], stripped, n)
    if pending_name is not None:
        raise LustreParseError(WHAT, f"output ends after wrapped name {pending_name[1]!r}")
    if total is None:
        raise LustreParseError(WHAT, "no quota row for the filesystem")
    if kind is None:
        raise LustreParseError(WHAT, "no 'Disk quotas for' title and no kind given")
    inaccurate = inaccurate or bool(total.inaccurate_columns)
    return QuotaReport(kind=kind, name=name, numeric_id=numeric_id, mount=mount, total=total,
                       targets=tuple(targets), uses_default_block=uses_block, uses_default_file=uses_file,
                       inaccurate=inaccurate, errors=tuple(errors), pool=pool)


def _default_grace(token: str, line: str, n: int) -> int | None:
    tok = token.strip()
    if tok.startswith("["):
        return None
    if tok == "notify":
        return GRACE_NOTIFY_S
    if tok == "-":
        return None
    try:
        return parse_grace_s(tok)
    except ValueError:
        raise LustreParseError("lfs quota -U/-G/-P", f"bad grace {token!r}", line=line, line_no=n) from None


def parse_default_quota(text: str, *, kind: QuotaKind | None = None) -> DefaultQuota:
    """Parse ``lfs quota {-U|-G|-P} MOUNT`` (header ``Disk default usr quota:``)."""
    what = "lfs quota -U/-G/-P"
    lines = [(n, raw.strip()) for n, raw in enumerate(text.splitlines(), 1) if raw.strip()]
    found_kind = kind
    columns: list[str] | None = None
    pending: str | None = None
    for n, line in lines:
        if (m := _DEFAULT_TITLE_RE.match(line)) is not None:
            found_kind = _KIND_WORDS[m["kind"]]
            continue
        tokens = line.split()
        if tokens[0] == "Filesystem":
            columns = [t.lower() for t in tokens[1:]]
            continue
        if columns is None:
            raise LustreParseError(what, "data before the Filesystem header", line=line, line_no=n)
        if pending is None and len(tokens) == 1:
            pending = tokens[0]
            continue
        if pending is not None:
            mount, values = pending, tokens
        else:
            mount, values = tokens[0], tokens[1:]
        if len(values) != len(columns):
            raise LustreParseError(what, f"expected {len(columns)} values, got {len(values)}", line=line, line_no=n)
        # Older releases print the full usage layout here (kbytes quota limit grace files ...).
        row = dict(zip(_normalise_default_columns(columns, line, n), values))
        limits = {}
        for key in ("block_soft", "block_hard", "inode_soft", "inode_hard"):
            tok = row.get(key, "0").rstrip("*").strip("[]")
            if not tok.isdigit():
                raise LustreParseError(what, f"{key} is not a number: {tok!r}", line=line, line_no=n)
            limits[key] = int(tok)
        if found_kind is None:
            raise LustreParseError(what, "no 'Disk default ... quota:' title and no kind given")
        return DefaultQuota(kind=found_kind, mount=mount,
                            limits=QuotaLimits(limits["block_soft"], limits["block_hard"],
                                               limits["inode_soft"], limits["inode_hard"]),
                            block_grace_s=_default_grace(row.get("block_grace", "-"), line, n),
                            inode_grace_s=_default_grace(row.get("inode_grace", "-"), line, n))
    raise LustreParseError(what, "no quota row found")


def _normalise_default_columns(columns: list[str], line: str, n: int) -> tuple[str, ...]:
    return _header_columns(["Filesystem", *columns], line, n)[1:]


_GRACE_LINE_RE = re.compile(r"Block grace time:\s*(?P<block>\S+?);\s*Inode grace time:\s*(?P<inode>\S+)")


def parse_grace_times(text: str) -> GraceTimes:
    """Parse ``lfs quota -t {-u|-g|-p} MOUNT``: ``Block grace time: 1w; Inode grace time: 1w``."""
    match = _GRACE_LINE_RE.search(text)
    if not match:
        first = text.strip().splitlines()[0] if text.strip() else ""
        raise LustreParseError("lfs quota -t", "no 'Block grace time: ..; Inode grace time: ..' line", line=first)

    def value(token: str) -> int | None:
        if token.startswith("["):
            return None  # the MDS could not be asked; unknown
        if token == "notify":
            return GRACE_NOTIFY_S
        try:
            return parse_grace_s(token)
        except ValueError:
            raise LustreParseError("lfs quota -t", f"bad grace value {token!r}", line=match.group(0)) from None

    return GraceTimes(block_grace_s=value(match["block"]), inode_grace_s=value(match["inode"]))
