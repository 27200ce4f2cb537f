"""Parse ``lctl get_param -n health_check``: ``healthy``, ``NOT HEALTHY``, ``LBUG`` (+ device lines)."""
from __future__ import annotations

import re

from dlts_lustre.errors import LustreParseError
from dlts_lustre.model import Health, HealthState

_DEVICE_RE = re.compile(r"^device (\S+) reported unhealthy$")


def parse_health(text: str) -> Health:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # Without -n the value comes as "health_check=healthy"; accept both.
    lines = [ln.split("=", 1)[1].strip() if ln.startswith("health_check=") else ln for ln in lines]
    if not lines:
        raise LustreParseError("health_check", "empty output")
    devices = tuple(m[1] for ln in lines if (m := _DEVICE_RE.match(ln)))
    status_lines = [ln for ln in lines if not _DEVICE_RE.match(ln)]
    joined = " ".join(status_lines)
    if "LBUG" in joined:
        state = HealthState.LBUG
    elif status_lines == ["healthy"] and not devices:
        state = HealthState.HEALTHY
    else:
        # Anything other than a bare "healthy" is unhealthy (vendor builds add extra lines).
        state = HealthState.UNHEALTHY
    return Health(state=state, raw="\n".join(lines), unhealthy_devices=devices)
