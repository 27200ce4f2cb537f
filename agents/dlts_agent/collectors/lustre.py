"""Lustre collector: client health and per-target client stats through ``dlts_lustre``.

``dlts_lustre.client.LustreClient`` is the only code that runs lfs/lctl; we call its ``health()``
(``lctl get_param -n health_check``) and ``stats("osc.*.stats")`` (one block per OST this client
talks to). The collector skips cleanly on a node without ``lctl`` or without ``dlts_lustre``, and
checks for ``lctl`` first so that such nodes never import the Lustre package at all.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

from dlts_agent.collectors.base import Skip
from dlts_agent.model import LustreSample, LustreTargetSample

CLIENT_STATS_PARAM = "osc.*.stats"


def _default_client() -> Any:
    if shutil.which("lctl") is None:
        raise Skip("no Lustre client on this node (lctl not on PATH)")
    try:
        from dlts_lustre.client import LustreClient
    except ImportError as e:
        raise Skip(f"dlts_lustre is not installed ({e})") from None
    return LustreClient()


class LustreCollector:
    name = "lustre"

    def __init__(self, client_factory: Callable[[], Any] | None = None, stats_param: str = CLIENT_STATS_PARAM) -> None:
        self._factory = client_factory or _default_client
        self._client: Any = None
        self.stats_param = stats_param

    def collect(self) -> tuple[LustreSample, list[str]]:
        if self._client is None:
            self._client = self._factory()
        errors: list[str] = []
        health = self._client.health()  # LustreError -> this collector FAILED
        targets: list[LustreTargetSample] = []
        try:
            blocks = self._client.stats(self.stats_param)
        except Exception as e:  # noqa: BLE001 - stats are secondary to health; count and go on
            errors.append(f"lctl get_param {self.stats_param}: {e}")
            blocks = ()
        for b in blocks:
            counters = b.counters
            read = counters.get("read_bytes")
            write = counters.get("write_bytes")
            targets.append(
                LustreTargetSample(
                    target=b.target,
                    read_bytes=read.total if read is not None else None,
                    write_bytes=write.total if write is not None else None,
                    operations={
                        name: c.samples for name, c in counters.items() if name not in ("read_bytes", "write_bytes")
                    },
                )
            )
        sample = LustreSample(
            healthy=bool(health.healthy),
            health_text=str(health.raw)[:500],
            unhealthy_devices=tuple(health.unhealthy_devices),
            targets=tuple(targets),
        )
        return sample, errors

    def close(self) -> None:
        pass
