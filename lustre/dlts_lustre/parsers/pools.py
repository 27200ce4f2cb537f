"""Parse ``lctl pool_list FSNAME`` (pool names) and ``lctl pool_list FSNAME.POOL`` (members)."""
from __future__ import annotations

from dlts_lustre.errors import LustreParseError
from dlts_lustre.model import Pool, TargetKind
from dlts_lustre.parsers._common import TARGET_RE


def parse_pool_list(text: str, fsname: str) -> tuple[str, ...]:
    what = f"lctl pool_list {fsname}"
    lines = [(n, ln.strip()) for n, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    if not lines or lines[0][1] != f"Pools from {fsname}:":
        first = lines[0] if lines else (1, "")
        raise LustreParseError(what, f"expected 'Pools from {fsname}:'", line=first[1], line_no=first[0])
    names = []
    for n, line in lines[1:]:
        fs, dot, pool = line.partition(".")
        if not dot or fs != fsname or not pool:
            raise LustreParseError(what, f"expected '{fsname}.POOL'", line=line, line_no=n)
        names.append(pool)
    return tuple(names)


def parse_pool_members(text: str, fsname: str, pool: str) -> Pool:
    what = f"lctl pool_list {fsname}.{pool}"
    lines = [(n, ln.strip()) for n, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    if not lines or lines[0][1] != f"Pool: {fsname}.{pool}":
        first = lines[0] if lines else (1, "")
        raise LustreParseError(what, f"expected 'Pool: {fsname}.{pool}'", line=first[1], line_no=first[0])
    indices = []
    for n, line in lines[1:]:
        match = TARGET_RE.match(line)
        if not match or match["kind"] != TargetKind.OST.value:
            raise LustreParseError(what, "expected an OST UUID such as FS-OST0001_UUID", line=line, line_no=n)
        indices.append(int(match["idx"], 16))
    return Pool(fsname=fsname, name=pool, ost_indices=tuple(sorted(indices)))
