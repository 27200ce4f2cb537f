"""Prometheus collector for Lustre: health, capacity/free per target and per pool, and op rates.

The node agent registers it (``registry.register(LustreCollector("/mnt/dltsfs"))``). It reads at
scrape time; each section (health, df, pools, ost_stats, mdt_stats) reports its own success and
duration, and one failing section never fails the scrape. Units are bytes and seconds.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dlts_lustre.client import MDT_STATS_PARAM, OST_STATS_PARAM, LustreClient, ost_name
from dlts_lustre.errors import LustreError
from dlts_lustre.model import DfReport, Rate, StatsBlock
from dlts_lustre.parsers import compute_rates
from dlts_lustre.parsers._common import decode_target
from dlts_lustre.units import KIB

log = logging.getLogger(__name__)
SECTIONS = ("health", "df", "pools", "ost_stats", "mdt_stats")
# "targets" is the server-side view of "df": the space of the MDTs/OSTs this MDS/OSS holds, from
# `lctl get_param osd-*.FS-*.kbytes*` (no client mount needed), plus each target's quota enforcement.
ALL_SECTIONS = SECTIONS + ("targets",)
SERVER_SECTIONS = ("health", "targets", "pools", "ost_stats", "mdt_stats")
QUOTA_TYPE_NAMES = {"u": "user", "g": "group", "p": "project"}


def fsname_from_df(df: DfReport) -> str:
    for target in df.targets:
        _, _, fs = decode_target(target.uuid, "lfs df")
        if fs:
            return fs
    raise LustreError("cannot tell the filesystem name from lfs df (no FS-MDT/OST UUIDs)")


class LustreCollector(Collector):
    """Collects ``dlts_lustre_*`` metrics for the filesystem mounted at ``mount``.

    ``client``: the LustreClient to use (default: a new one with ``timeout_s``).
    ``sections``: which of health, df, pools, ost_stats, mdt_stats to collect (stats only exist on
    OSS/MDS nodes; on a client they are reported as empty, not failed).
    ``clock``: monotonic seconds, only used to time the sections.
    """

    def __init__(self, mount: str | None, *, client: LustreClient | None = None, fsname: str | None = None,
                 sections: tuple[str, ...] = SECTIONS, timeout_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        unknown = set(sections) - set(ALL_SECTIONS)
        if unknown:
            raise ValueError(f"unknown LustreCollector sections {sorted(unknown)}; choose from {ALL_SECTIONS}")
        if "df" in sections and "targets" in sections:
            raise ValueError("LustreCollector: choose df (a client's view) or targets (a server's), not both")
        if mount is None and fsname is None:
            raise ValueError("LustreCollector needs the client mount point, or the fsname on a server")
        if mount is None and "df" in sections:
            raise ValueError("LustreCollector: the df section needs a client mount point")
        if client is None:
            from dlts_lustre.runner import Runner
            client = LustreClient(Runner(timeout_s=timeout_s))
        self.mount = mount
        self.client = client
        self.fsname = fsname
        self.sections = tuple(sections)
        self.clock = clock
        self._previous_stats: dict[str, tuple[StatsBlock, ...]] = {}
        self._last_rates: dict[str, dict[tuple[str, str], Rate]] = {}

    def describe(self) -> Iterator[Metric]:
        return iter(())  # do not run lfs at registration time

    def collect(self) -> Iterator[Metric]:
        success = GaugeMetricFamily("dlts_lustre_collector_success",
                                    "1 if the section was collected without error", labels=["section"])
        duration = GaugeMetricFamily("dlts_lustre_collector_duration_seconds",
                                     "Time spent collecting the section", labels=["section"])
        out: list[Metric] = []
        df: DfReport | None = None
        for section in self.sections:
            start = self.clock()
            ok = 1.0
            try:
                if section == "health":
                    out += self._health()
                elif section == "df":
                    df, metrics = self._df()
                    out += metrics
                elif section == "pools":
                    out += self._pools(df)
                elif section == "targets":
                    out += self._targets()
                else:
                    out += self._stats(section)
            except (LustreError, ValueError) as exc:
                ok = 0.0
                log.warning("lustre collector section %s failed: %s", section, exc)
            success.add_metric([section], ok)
            duration.add_metric([section], max(0.0, self.clock() - start))
        yield from out
        yield success
        yield duration

    def _fs(self, df: DfReport | None = None) -> str:
        if self.fsname is None:
            assert self.mount is not None  # checked in __init__
            self.fsname = fsname_from_df(df or self.client.df(self.mount))
        return self.fsname

    def _targets(self) -> list[Metric]:
        fs = self._fs()
        labels = ["fs", "target", "kind", "index"]
        cap = GaugeMetricFamily("dlts_lustre_target_capacity_bytes", "Target size", labels=labels)
        free = GaugeMetricFamily("dlts_lustre_target_free_bytes", "Target space available", labels=labels)
        ifiles = GaugeMetricFamily("dlts_lustre_target_inodes", "Target inode count", labels=labels)
        ifree = GaugeMetricFamily("dlts_lustre_target_inodes_free", "Target free inodes", labels=labels)
        active = GaugeMetricFamily("dlts_lustre_target_active", "1 if the target answers, 0 if inactive",
                                   labels=labels)
        enforced = GaugeMetricFamily("dlts_lustre_target_quota_enforced", "1 if the target enforces this "
                                     "quota type (quota_slave.enabled; lctl conf_param FS.quota.KIND=ugp)",
                                     labels=labels + ["type"])
        for t in self.client.server_targets(fs):
            key = [fs, t.name, t.kind.value, str(t.index)]
            active.add_metric(key, 1.0)
            if t.kib_total is not None:
                cap.add_metric(key, float(t.kib_total * KIB))
            available = t.kib_available if t.kib_available is not None else t.kib_free
            if available is not None:
                free.add_metric(key, float(available * KIB))
            if t.inodes_total is not None:
                ifiles.add_metric(key, float(t.inodes_total))
            if t.inodes_free is not None:
                ifree.add_metric(key, float(t.inodes_free))
            if t.quota_enforced is not None:
                for letter, name in QUOTA_TYPE_NAMES.items():
                    enforced.add_metric(key + [name], 1.0 if letter in t.quota_enforced else 0.0)
        return [cap, free, ifiles, ifree, active, enforced]

    def _health(self) -> list[Metric]:
        health = self.client.health()
        gauge = GaugeMetricFamily("dlts_lustre_healthy", "1 if lctl health_check says healthy, else 0",
                                  labels=["state"])
        gauge.add_metric([health.state.value], 1.0 if health.healthy else 0.0)
        return [gauge]

    def _df(self) -> tuple[DfReport, list[Metric]]:
        assert self.mount is not None  # the df section needs a mount (checked in __init__)
        blocks = self.client.df(self.mount)
        inodes = self.client.df(self.mount, inodes=True)
        fs = self._fs(blocks)
        labels = ["fs", "target", "kind", "index"]
        cap = GaugeMetricFamily("dlts_lustre_target_capacity_bytes", "Target size", labels=labels)
        free = GaugeMetricFamily("dlts_lustre_target_free_bytes", "Target space available", labels=labels)
        ifiles = GaugeMetricFamily("dlts_lustre_target_inodes", "Target inode count", labels=labels)
        ifree = GaugeMetricFamily("dlts_lustre_target_inodes_free", "Target free inodes", labels=labels)
        active = GaugeMetricFamily("dlts_lustre_target_active", "1 if the target answers, 0 if inactive",
                                   labels=labels)
        flag = GaugeMetricFamily("dlts_lustre_target_flag", "Set lfs df flags (D degraded, N no-create, "
                                 "R read-only, S out of space, I out of inodes)", labels=labels + ["flag"])
        for t in blocks.targets:
            key = [fs, t.uuid.removesuffix("_UUID"), t.kind.value, str(t.index)]
            active.add_metric(key, 1.0 if t.active else 0.0)
            if not t.active:
                continue
            cap.add_metric(key, float(t.total * KIB))
            free.add_metric(key, float(t.available * KIB))
            for f in sorted(t.flags, key=lambda f: f.value):
                flag.add_metric(key + [f.name.lower()], 1.0)
        for t in inodes.targets:
            if t.active:
                key = [fs, t.uuid.removesuffix("_UUID"), t.kind.value, str(t.index)]
                ifiles.add_metric(key, float(t.total))
                ifree.add_metric(key, float(t.available))
        return blocks, [cap, free, ifiles, ifree, active, flag]

    def _pools(self, df: DfReport | None) -> list[Metric]:
        fs = self._fs(df)
        if df is None and self.mount is not None and "targets" not in self.sections:
            df = self.client.df(self.mount)
        # On a server (no client mount) only the membership is known here; the pool's space is the
        # sum of its OSTs' space, which the OSS agents export (recording rules in monitoring/).
        by_index = {t.index: t for t in df.osts() if t.active} if df is not None else None
        member = GaugeMetricFamily("dlts_lustre_pool_ost", "1 for each OST in the pool", labels=["fs", "pool", "target"])
        cap = GaugeMetricFamily("dlts_lustre_pool_capacity_bytes", "Sum of the pool's active OST sizes",
                                labels=["fs", "pool"])
        free = GaugeMetricFamily("dlts_lustre_pool_free_bytes", "Sum of the pool's active OST free space",
                                 labels=["fs", "pool"])
        osts = GaugeMetricFamily("dlts_lustre_pool_osts", "OSTs in the pool", labels=["fs", "pool"])
        for name in self.client.pools(fs):
            members = self.client.pool(fs, name).ost_indices
            for i in members:
                member.add_metric([fs, name, ost_name(fs, i)], 1.0)
            osts.add_metric([fs, name], float(len(members)))
            if by_index is None:
                continue
            # One lfs df already covers every OST: sum its rows instead of one `lfs df --pool` per pool.
            cap.add_metric([fs, name], float(sum(by_index[i].total for i in members if i in by_index) * KIB))
            free.add_metric([fs, name], float(sum(by_index[i].available for i in members if i in by_index) * KIB))
        return [cap, free, osts, member]

    def _stats(self, section: str) -> list[Metric]:
        param = OST_STATS_PARAM if section == "ost_stats" else MDT_STATS_PARAM
        blocks = self.client.stats(param)
        previous = {b.param: b for b in self._previous_stats.get(section, ())}
        self._previous_stats[section] = blocks
        # A target whose snapshot did not move (two scrapes within the same tick) keeps its last rates.
        moved = {b.target for b in blocks
                 if b.param in previous and b.snapshot_time_s != previous[b.param].snapshot_time_s}
        present = {b.target for b in blocks}
        rates = {key: r for key, r in self._last_rates.get(section, {}).items()
                 if key[0] in present and key[0] not in moved}
        rates.update({(r.target, r.counter): r for r in compute_rates(previous.values(), blocks)})
        self._last_rates[section] = rates
        ops = CounterMetricFamily("dlts_lustre_ops", "Operations served by the target (lctl stats samples)",
                                  labels=["target", "op"])
        io = CounterMetricFamily("dlts_lustre_io_bytes", "Bytes read/written by the target",
                                 labels=["target", "direction"])
        rate = GaugeMetricFamily("dlts_lustre_op_rate_per_second", "Operations per second between the last "
                                 "two scrapes", labels=["target", "op"])
        io_rate = GaugeMetricFamily("dlts_lustre_io_rate_bytes_per_second", "Bytes per second between the "
                                    "last two scrapes", labels=["target", "direction"])
        for block in blocks:
            for name, counter in sorted(block.counters.items()):
                ops.add_metric([block.target, name], float(counter.samples))
                if counter.unit == "bytes" and counter.total is not None and name in ("read_bytes", "write_bytes"):
                    io.add_metric([block.target, name.removesuffix("_bytes")], float(counter.total))
        for _, r in sorted(rates.items()):
            rate.add_metric([r.target, r.counter], r.ops_per_s)
            if r.bytes_per_s is not None and r.counter in ("read_bytes", "write_bytes"):
                io_rate.add_metric([r.target, r.counter.removesuffix("_bytes")], r.bytes_per_s)
        return [ops, io, rate, io_rate]
