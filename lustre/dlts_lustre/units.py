"""Unit handling for Lustre sizes (KiB based) and grace times (``XwXdXhXmXs``).

Lustre block quotas and ``lfs df`` are in KiB (1024 bytes); suffixes are powers of two. Keeping the
conversions here means no other module multiplies by 1024 by hand.
"""
from __future__ import annotations

import re

KIB = 1024
# Suffix -> multiplier in KiB (lfs setquota: "K/M/G/T/P/E, powers of 2", bare numbers are KiB).
_SIZE_SUFFIX_KIB = {"K": 1, "M": 1024, "G": 1024**2, "T": 1024**3, "P": 1024**4, "E": 1024**5}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTPE])?(?:I?B)?\s*$", re.IGNORECASE)

_GRACE_UNITS_S = (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
_GRACE_RE = re.compile(r"^(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")

DEFAULT_GRACE_S = 604800  # MAX_DQ_TIME in Lustre: one week


def parse_size_kib(text: str, *, require_unit: bool = False) -> int:
    """Parse ``"500G"``, ``"1T"``, ``"1024"`` (KiB) into KiB. ``require_unit`` rejects bare numbers."""
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a size; write a number with a unit such as 500G or 2T")
    number, suffix = match.groups()
    if suffix is None:
        if require_unit and float(number) != 0:
            raise ValueError(f"{text!r} has no unit; write e.g. {number}G (bare numbers would be KiB)")
        value = float(number)
    else:
        value = float(number) * _SIZE_SUFFIX_KIB[suffix.upper()]
    if value != int(value):
        raise ValueError(f"{text!r} is not a whole number of KiB")
    return int(value)


def format_size_kib(kib: int) -> str:
    """Render KiB with the largest exact power-of-two suffix (``lfs setquota`` accepts it back)."""
    if kib == 0:
        return "0"
    for suffix in ("E", "P", "T", "G", "M"):
        mult = _SIZE_SUFFIX_KIB[suffix]
        if kib % mult == 0:
            return f"{kib // mult}{suffix}"
    return f"{kib}K"


def human_kib(kib: int) -> str:
    """Approximate human rendering for reports (not for commands)."""
    value = float(kib)
    for suffix in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or suffix == "PiB":
            return f"{value:.1f} {suffix}" if suffix != "KiB" else f"{int(value)} KiB"
        value /= 1024
    return f"{kib} KiB"  # pragma: no cover - loop always returns


def parse_grace_s(text: str) -> int:
    """Parse a grace time as printed or accepted by Lustre: seconds, or ``1w2d3h4m5s`` (any subset)."""
    token = str(text).strip()
    if token.isdigit():
        return int(token)
    match = _GRACE_RE.match(token)
    if not token or not match or not any(match.groups()):
        raise ValueError(f"{text!r} is not a grace time; use seconds or a form like 1w, 3d12h, 90m")
    return sum(int(part) * mult for part, (_, mult) in zip(match.groups(), _GRACE_UNITS_S) if part)


def format_grace_s(seconds: int) -> str:
    """Format seconds like Lustre's ``__sec2str``: descending units, zero fields omitted, ``0s`` for zero."""
    if seconds < 0:
        raise ValueError(f"grace time cannot be negative: {seconds}")
    if seconds == 0:
        return "0s"
    parts = []
    rest = seconds
    for unit, mult in _GRACE_UNITS_S:
        count, rest = divmod(rest, mult)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
