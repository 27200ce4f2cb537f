"""Parse ``lctl get_param obdfilter.*.stats`` / ``mdt.*.md_stats`` and turn two scrapes into rates."""
from __future__ import annotations

import re
from collections.abc import Iterable

from dlts_lustre.errors import LustreParseError
from dlts_lustre.model import Rate, StatCounter, StatsBlock

WHAT = "lctl get_param stats"
_PARAM_RE = re.compile(r"^(?P<param>[\w.-]+\.(?:stats|md_stats))=\s*$")
_TIME_RE = re.compile(r"^(snapshot_time|start_time|elapsed_time)\s+(\d+(?:\.\d+)?)\s+secs\.[nu]secs$")
_COUNTER_RE = re.compile(r"^(?P<name>\w+)\s+(?P<count>\d+)\s+samples(?:\s+\[(?P<unit>\w+)\])?(?P<rest>(?:\s+\d+)*)\s*$")


def parse_stats(text: str) -> tuple[StatsBlock, ...]:
    blocks: list[StatsBlock] = []
    param: str | None = None
    snapshot: float | None = None
    counters: dict[str, StatCounter] = {}

    def flush() -> None:
        if param is None:
            return
        if snapshot is None:
            raise LustreParseError(WHAT, f"block {param} has no snapshot_time")
        target = param.split(".")[1] if param.count(".") >= 2 else param
        blocks.append(StatsBlock(param=param, target=target, snapshot_time_s=snapshot, counters=dict(counters)))

    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if (m := _PARAM_RE.match(line)) is not None:
            flush()
            param, snapshot, counters = m["param"], None, {}
            continue
        if param is None:
            raise LustreParseError(WHAT, "expected 'param.name=' first (run without -n)", line=line, line_no=n)
        if (m := _TIME_RE.match(line)) is not None:
            if m[1] == "snapshot_time":
                snapshot = float(m[2])
            continue
        if (m := _COUNTER_RE.match(line)) is not None:
            rest = [int(tok) for tok in m["rest"].split()]
            if len(rest) > 4:
                raise LustreParseError(WHAT, "too many numbers on a counter line", line=line, line_no=n)
            rest += [None] * (4 - len(rest))  # type: ignore[list-item]
            counters[m["name"]] = StatCounter(name=m["name"], samples=int(m["count"]), unit=m["unit"],
                                              minimum=rest[0], maximum=rest[1], total=rest[2], sum_squares=rest[3])
            continue
        raise LustreParseError(WHAT, "unrecognised line", line=line, line_no=n)
    flush()
    return tuple(blocks)


def compute_rates(previous: Iterable[StatsBlock], current: Iterable[StatsBlock]) -> tuple[Rate, ...]:
    """Rates per target and counter from two scrapes.

    Counters with 0 samples are omitted by Lustre, so a counter missing before counts as 0. A block whose
    counters went backwards (``stats=clear`` or a target restart) yields no rates for that scrape.
    """
    before = {b.param: b for b in previous}
    rates: list[Rate] = []
    for block in current:
        old = before.get(block.param)
        if old is None:
            continue
        elapsed_s = block.snapshot_time_s - old.snapshot_time_s
        if elapsed_s <= 0:
            continue
        deltas = []
        for name, counter in block.counters.items():
            prev = old.counters.get(name)
            d_count = counter.samples - (prev.samples if prev else 0)
            d_sum = None
            if counter.unit == "bytes" and counter.total is not None:
                d_sum = counter.total - (prev.total or 0 if prev else 0)
            deltas.append((name, d_count, d_sum))
        if any(dc < 0 or (ds is not None and ds < 0) for _, dc, ds in deltas) or \
                any(name not in block.counters for name in old.counters):
            continue  # reset between scrapes
        for name, d_count, d_sum in sorted(deltas):
            rates.append(Rate(target=block.target, counter=name, ops_per_s=d_count / elapsed_s,
                              bytes_per_s=None if d_sum is None else d_sum / elapsed_s))
    return tuple(rates)
