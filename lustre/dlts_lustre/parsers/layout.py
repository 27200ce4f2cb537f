"""Parse directory layout output: ``lfs getstripe -d``, ``lfs getdirstripe [-D|-m]``, ``lfs project -d``."""
from __future__ import annotations

import re

from dlts_lustre.errors import LustreParseError
from dlts_lustre.model import DirStripe, ProjectInfo, StripeLayout

_KV_RE = re.compile(r"([a-z_]+):\s*(\S+)")
_PROJECT_RE = re.compile(r"^\s*(\d+)\s+([P-])\s+(.+?)\s*$")


def _int_or_none(value: str | None, what: str, key: str) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise LustreParseError(what, f"{key} is not an integer: {value!r}") from None


def parse_getstripe(text: str) -> StripeLayout:
    """Default layout of a directory. ``has no stripe info`` means no default layout is set there."""
    what = "lfs getstripe -d"
    body = text.strip()
    if not body or body.endswith("has no stripe info"):
        return StripeLayout()
    if "lcm_layout_gen" in body:
        # Composite (PFL) layout: take the first component's count and the first pool named.
        values: dict[str, str] = {}
        for key, value in _KV_RE.findall(body):
            values.setdefault(key, value)
        return StripeLayout(
            stripe_count=_int_or_none(values.get("lmm_stripe_count"), what, "lmm_stripe_count"),
            stripe_size_bytes=_int_or_none(values.get("lmm_stripe_size"), what, "lmm_stripe_size"),
            stripe_offset=_int_or_none(values.get("lmm_stripe_offset"), what, "lmm_stripe_offset"),
            pool=values.get("lmm_pool"), composite=True)
    lines = [ln for ln in body.splitlines() if ln.strip()]
    # "lfs getstripe -d DIR" prints the directory path first on some versions.
    kv_lines = [ln for ln in lines if _KV_RE.search(ln)]
    if not kv_lines:
        raise LustreParseError(what, "no 'key: value' fields", line=lines[0], line_no=1)
    values = dict(_KV_RE.findall(" ".join(kv_lines)))
    if "stripe_count" not in values:
        raise LustreParseError(what, "stripe_count missing", line=kv_lines[0])
    return StripeLayout(
        stripe_count=_int_or_none(values.get("stripe_count"), what, "stripe_count"),
        stripe_size_bytes=_int_or_none(values.get("stripe_size"), what, "stripe_size"),
        stripe_offset=_int_or_none(values.get("stripe_offset"), what, "stripe_offset"),
        pool=values.get("pool"))


def parse_getdirstripe(text: str, *, default: bool = False) -> DirStripe:
    what = "lfs getdirstripe" + (" -D" if default else "")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise LustreParseError(what, "empty output")
    values = dict(_KV_RE.findall(lines[0]))
    missing = [k for k in ("lmv_stripe_count", "lmv_stripe_offset", "lmv_hash_type") if k not in values]
    if missing:
        raise LustreParseError(what, f"missing {', '.join(missing)}", line=lines[0], line_no=1)
    indices = []
    for n, line in enumerate(lines[1:], 2):
        tokens = line.split()
        if tokens[0] == "mdtidx":
            continue
        if len(tokens) != 2 or not tokens[0].isdigit() or not tokens[1].startswith("["):
            raise LustreParseError(what, "expected 'MDTIDX [FID]'", line=line, line_no=n)
        indices.append(int(tokens[0]))
    return DirStripe(
        stripe_count=_int_or_none(values["lmv_stripe_count"], what, "lmv_stripe_count") or 0,
        stripe_offset=_int_or_none(values["lmv_stripe_offset"], what, "lmv_stripe_offset") or 0,
        hash_type=values["lmv_hash_type"], mdt_indices=tuple(indices),
        max_inherit=_int_or_none(values.get("lmv_max_inherit"), what, "lmv_max_inherit"), default=default)


def parse_getdirstripe_mdt(text: str) -> int:
    """``lfs getdirstripe -m DIR`` prints only the MDT index."""
    token = text.strip()
    if not token.lstrip("-").isdigit():
        raise LustreParseError("lfs getdirstripe -m", "expected an MDT index", line=token)
    return int(token)


def parse_project(text: str) -> ProjectInfo:
    """``lfs project -d DIR``: ``%5u %c %s`` (project id, ``P`` if inherit is set, path)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) != 1:
        raise LustreParseError("lfs project -d", f"expected one line, got {len(lines)}")
    match = _PROJECT_RE.match(lines[0])
    if not match:
        raise LustreParseError("lfs project -d", "expected 'PROJID P|- PATH'", line=lines[0], line_no=1)
    return ProjectInfo(project_id=int(match[1]), inherit=match[2] == "P", path=match[3])
