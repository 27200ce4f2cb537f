"""Parse ``lfs --version`` (``lfs 2.15.4``, ``lfs 2.16.52_12_gabc``, ``lfs version 2.12.9``)."""
from __future__ import annotations

import re

from dlts_lustre.errors import LustreParseError
from dlts_lustre.model import LustreVersion

_VERSION_RE = re.compile(r"\b(\d+)\.(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> LustreVersion:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if not line:
        raise LustreParseError("lfs --version", "empty output")
    match = _VERSION_RE.search(line)
    if not match:
        raise LustreParseError("lfs --version", "no version number found", line=line, line_no=1)
    major, minor, patch, fix = match.groups()
    return LustreVersion(int(major), int(minor), int(patch), int(fix or 0), raw=line)
