"""Parse ``lctl get_param NAME...`` for single-value parameters (``name=value`` per line, or with
``-n`` the bare values). Multi-line values (``name=`` alone, then the lines) are kept joined."""
from __future__ import annotations

import fnmatch
import re

from dlts_lustre.errors import LustreParseError

WHAT = "lctl get_param"
_NAME_RE = re.compile(r"^([A-Za-z0-9_.*-]+\.[A-Za-z0-9_-]+)=(.*)$")
# osd-ldiskfs.dltsfs-OST0001.kbytestotal, osd-zfs.dltsfs-MDT0000.quota_slave_md.enabled
OSD_PARAM_RE = re.compile(r"^osd-[a-z]+\.(?P<target>[A-Za-z0-9_]+-(?:MDT|OST)[0-9a-fA-F]{4,})\.(?P<param>.+)$")


def parse_params(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    current: str | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not line.strip():
            continue
        match = _NAME_RE.match(line)
        if match is not None:
            current = match[1]
            out[current] = match[2]
            continue
        if current is None:
            raise LustreParseError(WHAT, "a value before any parameter name", line=line, line_no=n)
        out[current] = (out[current] + "\n" + line) if out[current] else line
    return out


def osd_values(params: dict[str, str], param: str) -> dict[str, str]:
    """``{target: value}`` of one osd parameter (``kbytestotal``, ``quota_slave*.enabled``: a glob
    covers the variants, e.g. ``quota_slave_md``/``quota_slave_dt`` of newer releases)."""
    out = {}
    for name, value in params.items():
        match = OSD_PARAM_RE.match(name)
        if match is not None and fnmatch.fnmatchcase(match["param"], param):
            out[match["target"]] = value.strip()
    return out
