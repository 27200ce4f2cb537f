"""Parse ``lfs df [-i] [--pool FS.POOL] [MOUNT]``: per-target rows, flags, inactive targets, summary.

Output may hold several filesystems (no MOUNT given); each starts with its own ``UUID`` header.
"""
from __future__ import annotations

import re

from dlts_lustre.errors import LustreParseError
from dlts_lustre.model import DfReport, DfRow, DfSummary, TargetFlag, TargetKind
from dlts_lustre.parsers._common import decode_target, human_to_kib, to_int

WHAT = "lfs df"
_ROW_RE = re.compile(
    r"^(?P<uuid>\S+)\s+(?P<total>\S+)\s+(?P<used>\S+)\s+(?P<avail>\S+)\s+(?P<pct>\d+%|-)\s+"
    r"(?P<mount>\S+)\[(?P<kind>MDT|OST):(?P<idx>\d+)\](?:\s+(?P<flags>[DNRSIf]+))?\s*$")
_SUMMARY_RE = re.compile(
    r"^filesystem_summary:\s+(?P<total>\S+)\s+(?P<used>\S+)\s+(?P<avail>\S+)\s+(?P<pct>\d+%|-)\s+(?P<mount>\S+)\s*$")
_INACTIVE_RE = re.compile(r"^(?P<name>\S+)\s*:\s*inactive device\s*$")


def _number(token: str, human: bool, line: str, n: int) -> int:
    return human_to_kib(token, WHAT, line, n) if human else to_int(token, WHAT, line, n)


def parse_df(text: str) -> tuple[DfReport, ...]:
    """Parse every filesystem block in the output."""
    reports: list[DfReport] = []
    rows: list[DfRow] = []
    mode: str | None = None  # "blocks" | "inodes" | "human"
    summary: DfSummary | None = None

    def flush() -> None:
        nonlocal rows, summary
        if mode is not None:
            reports.append(DfReport(inodes=(mode == "inodes"), targets=tuple(rows), summary=summary))
        rows, summary = [], None

    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("UUID"):
            flush()
            header = line.split()
            if "Inodes" in header:
                mode = "inodes"
            elif "1K-blocks" in header:
                mode = "blocks"
            elif "bytes" in header:
                mode = "human"
            else:
                raise LustreParseError(WHAT, "unknown header", line=line, line_no=n)
            continue
        if mode is None:
            raise LustreParseError(WHAT, "data before the UUID header", line=line, line_no=n)
        human = mode == "human"
        if (m := _SUMMARY_RE.match(line)) is not None:
            summary = DfSummary(_number(m["total"], human, line, n), _number(m["used"], human, line, n),
                                _number(m["avail"], human, line, n), m["mount"])
            continue
        if (m := _INACTIVE_RE.match(line)) is not None:
            kind, index, fs = decode_target(m["name"], WHAT)
            uuid = m["name"] if m["name"].endswith("_UUID") or fs is None else m["name"] + "_UUID"
            rows.append(DfRow(uuid=uuid, kind=kind, index=index, total=0, used=0, available=0,
                              mount="", active=False))
            continue
        if (m := _ROW_RE.match(line)) is not None:
            kind = TargetKind(m["kind"])
            flags = frozenset(TargetFlag(c) for c in (m["flags"] or ""))
            rows.append(DfRow(uuid=m["uuid"], kind=kind, index=int(m["idx"]),
                              total=_number(m["total"], human, line, n), used=_number(m["used"], human, line, n),
                              available=_number(m["avail"], human, line, n), mount=m["mount"], flags=flags))
            continue
        raise LustreParseError(WHAT, "unrecognised line", line=line, line_no=n)
    flush()
    if not reports:
        raise LustreParseError(WHAT, "no UUID header in output")
    return tuple(reports)


def parse_df_single(text: str, pool: str | None = None) -> DfReport:
    """Parse output for one MOUNT; an inactive row is given that filesystem's mount point."""
    reports = parse_df(text)
    if len(reports) != 1:
        raise LustreParseError(WHAT, f"expected one filesystem, found {len(reports)}")
    report = reports[0]
    mount = report.summary.mount if report.summary else next((t.mount for t in report.targets if t.mount), "")
    fsnames = {decode_target(t.uuid, WHAT)[2] for t in report.targets if t.active}
    fsname = next(iter(fsnames)) if len(fsnames) == 1 else None

    def complete(row: DfRow) -> DfRow:
        # "OST0003 : inactive device" carries no filesystem name; give it the full UUID of its siblings.
        uuid = row.uuid
        if fsname and not uuid.startswith(f"{fsname}-"):
            uuid = f"{fsname}-{row.kind.value}{row.index:04x}_UUID"
        return DfRow(**{**row.__dict__, "mount": mount, "uuid": uuid})

    targets = tuple(t if t.active else complete(t) for t in report.targets)
    return DfReport(inodes=report.inodes, targets=targets, summary=report.summary, pool=pool)
