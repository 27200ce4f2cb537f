"""Lustre collector: client health through ``dlts_lustre`` (the only code that runs lfs/lctl).

Skips cleanly when ``dlts_lustre`` is not installed or does not yet provide ``client_health()``,
and when this node has no Lustre client (the probe raises FileNotFoundError for a missing lctl).
"""

from __future__ import annotations

import importlib
from typing import Callable

from dlts_agent.collectors.base import Skip
from dlts_agent.model import LustreSample


def _default_probe() -> Callable[[], str]:
    try:
        mod = importlib.import_module("dlts_lustre")
    except ImportError:
        raise Skip("dlts_lustre is not installed") from None
    probe = getattr(mod, "client_health", None)
    if not callable(probe):
        raise Skip("dlts_lustre has no client_health() yet")
    return probe


class LustreCollector:
    name = "lustre"

    def __init__(self, probe: Callable[[], str] | None = None) -> None:
        self._probe = probe

    def collect(self) -> tuple[LustreSample, list[str]]:
        probe = self._probe or _default_probe()
        try:
            text = probe()
        except FileNotFoundError:
            raise Skip("no Lustre client on this node (lctl not found)") from None
        if not isinstance(text, str):
            raise TypeError(f"client_health() returned {type(text).__name__}, expected the health_check text")
        text = text.strip()
        # lctl get_param -n health_check prints "healthy"; anything else is not (reference F6)
        return LustreSample(healthy=text == "healthy", health_text=text[:500]), []

    def close(self) -> None:
        pass
