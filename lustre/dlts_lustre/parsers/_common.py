"""Helpers shared by the parsers: target-name decoding and number parsing with typed errors."""
from __future__ import annotations

import re

from dlts_lustre.errors import LustreParseError
from dlts_lustre.model import TargetKind

# "fs-OST000a_UUID", "OST0003", "fs-MDT0000" -> kind and (hex) index.
TARGET_RE = re.compile(r"^(?:(?P<fs>[A-Za-z0-9_]+)-)?(?P<kind>OST|MDT)(?P<idx>[0-9a-fA-F]{4,})(?:_UUID)?$")

_HUMAN_KIB = {"": 1 / 1024, "B": 1 / 1024, "K": 1, "M": 1024, "G": 1024**2, "T": 1024**3,
              "P": 1024**4, "E": 1024**5}
# "9.4G", "0k", "4kB", "1.5MiB", "512B"
_HUMAN_RE = re.compile(r"^(\d+(?:\.\d+)?)([kKMGTPE]?)(i?B)?$")


def decode_target(name: str, what: str) -> tuple[TargetKind, int, str | None]:
    match = TARGET_RE.match(name)
    if not match:
        raise LustreParseError(what, f"{name!r} is not a Lustre target name (FS-OST0000_UUID)")
    return TargetKind(match["kind"]), int(match["idx"], 16), match["fs"]


def to_int(token: str, what: str, line: str, line_no: int) -> int:
    try:
        return int(token)
    except ValueError:
        raise LustreParseError(what, f"expected an integer, got {token!r}", line=line, line_no=line_no) from None


def human_to_kib(token: str, what: str, line: str, line_no: int) -> int:
    """``-h`` renders sizes like ``9.4G``/``0k``/``1001M``; converts back to (approximate) KiB."""
    match = _HUMAN_RE.match(token)
    if not match:
        raise LustreParseError(what, f"expected a size, got {token!r}", line=line, line_no=line_no)
    number, suffix, _unit = match.groups()
    return round(float(number) * _HUMAN_KIB[suffix.upper()])
