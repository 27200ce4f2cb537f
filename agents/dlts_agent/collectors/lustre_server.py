"""Lustre server collector: the filesystem's server-side metrics on an MGS, MDS or OSS.

Runs ``dlts_lustre.metrics.LustreCollector`` once per round (not at scrape time, like every other
collector) and keeps the metric families it produced; the exporter serves them with the rest of the
snapshot. What it reads needs no client mount: the targets this server holds (space, inodes and quota
enforcement, ``lctl get_param osd-*.FS-*.*``), the OST pools and their members where ``lctl
pool_list`` answers (the MGS, an MDS), and the op rates of ``mdt.*.md_stats`` (MDS) and
``obdfilter.*.stats`` (OSS), computed between two rounds. One failing section is reported as such
(``dlts_lustre_collector_success{section}``) and never fails the collector.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

from dlts_agent.collectors.base import Skip


def _default_client(timeout_s: float) -> Any:
    if shutil.which("lctl") is None:
        raise Skip("no Lustre server utilities on this node (lctl not on PATH)")
    try:
        from dlts_lustre.client import LustreClient
        from dlts_lustre.runner import Runner
    except ImportError as e:
        raise Skip(f"dlts_lustre is not installed ({e})") from None
    # everything runs here: on a server the collector only reads
    return LustreClient(Runner(timeout_s=timeout_s, mgs_command=()))


class LustreServerCollector:
    name = "lustre_server"

    def __init__(self, fsname: str, sections: tuple[str, ...], *, mount: str = "", timeout_s: float = 10.0,
                 client_factory: Callable[[], Any] | None = None) -> None:
        self.fsname = fsname
        self.sections = sections
        self.mount = mount or None
        self.timeout_s = timeout_s
        self._factory = client_factory or (lambda: _default_client(timeout_s))
        self._collector: Any = None

    def collect(self) -> tuple[tuple[Any, ...], list[str]]:
        if self._collector is None:
            from dlts_lustre.metrics import LustreCollector

            self._collector = LustreCollector(self.mount, client=self._factory(), fsname=self.fsname,
                                              sections=self.sections, timeout_s=self.timeout_s)
        families = tuple(self._collector.collect())
        failed = [s.labels["section"] for f in families if f.name == "dlts_lustre_collector_success"
                  for s in f.samples if s.value == 0]
        return families, [f"section {name} failed (see the agent log)" for name in failed]

    def close(self) -> None:
        pass
