"""Disk pressure (jobmanager/disk_pressure.py): a volume's level from its free bytes and inodes, a
line and the gauges for each change of level, the reason launches wait, and a pass's decisions with
its launches held. The real full volumes are tests/core/test_disk_full.py; here ``statvfs`` is a
value."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from dlts.config import ConfigError, DiskPressureSettings, load_settings
from dlts.jobmanager.disk_pressure import DiskPressure, Level, Volume, hold_launches, judge
from dlts.scheduler import decide
from dlts.scheduler.model import StopReason, WaitReason
from tests.scheduler.builders import job, node, running, snap, vc

MiB = 1024**2
CFG = DiskPressureSettings(soft_free_bytes=100 * MiB, hard_free_bytes=10 * MiB, soft_free_inodes=1000,
                           hard_free_inodes=100, interval_s=5)


def stat(free_bytes: int, free_inodes: int = 10**6, inodes: int = 10**7, size_bytes: int = 1000 * MiB):
    block = 4096
    return os.statvfs_result((block, block, size_bytes // block, free_bytes // block, free_bytes // block,
                              inodes, free_inodes, free_inodes, 0, 255))


@pytest.mark.parametrize(("reading", "level", "why"), [
    (stat(500 * MiB), Level.OK, ""),
    (stat(50 * MiB), Level.SOFT, "50.0 MiB free, below the soft threshold of 100.0 MiB"),
    (stat(5 * MiB), Level.HARD, "5.0 MiB free, below the hard threshold of 10.0 MiB"),
    (stat(500 * MiB, free_inodes=500), Level.SOFT, "500 inodes free, below the soft threshold of 1000 inodes"),
    (stat(500 * MiB, free_inodes=50), Level.HARD, "50 inodes free, below the hard threshold of 100 inodes"),
    (stat(50 * MiB, free_inodes=50), Level.HARD, "50 inodes free, below the hard threshold of 100 inodes"),
    (stat(500 * MiB, free_inodes=0, inodes=0), Level.OK, ""),  # a file system that counts no inodes
])
def test_a_volume_is_at_the_worst_level_its_bytes_or_inodes_put_it(reading, level, why):
    judged = judge(Volume("log", Path("/logs")), reading, CFG)
    assert (judged.level, judged.why) == (level, why)


def test_each_change_of_level_is_one_line_and_sets_the_gauges_and_readings_come_every_interval(caplog):
    free = {"bytes": 500 * MiB}
    reads = []

    def statvfs(path):
        reads.append(path)
        return stat(free["bytes"])

    pressure = DiskPressure([Volume("log", Path("/srv/logs")), Volume("run", Path("/srv/run"))], CFG, "ctl1", statvfs)
    labels = {"volume": "log", "path": "/srv/logs"}
    with caplog.at_level(logging.INFO, logger="dlts.jobmanager.disk_pressure"):
        assert pressure.check(0.0) == [] and pressure.hold() is None
        free["bytes"] = 5 * MiB
        assert pressure.check(1.0) == []  # not due: interval_s 5
        assert [r.volume.role for r in pressure.check(5.0)] == ["log", "run"]
        assert pressure.check(10.0) == []  # still hard: nothing new to say
        assert REGISTRY.get_sample_value("dlts_volume_pressure", labels) == 2
        assert REGISTRY.get_sample_value("dlts_volume_free_bytes", labels) == 5 * MiB
        assert pressure.hold() == ("log volume full on ctl1: 5.0 MiB free, below the hard threshold of 10.0 MiB; "
                                   "run volume full on ctl1: 5.0 MiB free, below the hard threshold of 10.0 MiB")
        assert [r.volume.role for r in pressure.to_notice()] == ["log", "run"]
        for reading in pressure.to_notice():
            pressure.noticed(reading)
        assert pressure.to_notice() == []
        free["bytes"] = 50 * MiB
        pressure.check(15.0)
        assert pressure.hold() is None and pressure.to_notice() == []  # soft after hard: told already
        free["bytes"] = 500 * MiB
        pressure.check(20.0)
    assert len(reads) == 10  # at 0, 5, 10, 15 and 20 s, of 2 volumes (not at 1 s)
    assert REGISTRY.get_sample_value("dlts_volume_pressure", labels) == 0
    assert [r.getMessage() for r in caplog.records if "/srv/logs" in r.getMessage()] == [
        "log volume /srv/logs on ctl1: 5.0 MiB free, below the hard threshold of 10.0 MiB; no new job is launched "
        "until it is above it",
        "log volume /srv/logs on ctl1: 50.0 MiB free, below the soft threshold of 100.0 MiB; new jobs are launched again",
        "log volume /srv/logs on ctl1 has room again (500.0 MiB free)",
    ]


def test_a_volume_that_cannot_be_read_keeps_its_level_and_says_so_once(caplog):
    def statvfs(path):
        raise OSError(5, "Input/output error")

    pressure = DiskPressure([Volume("log", Path("/srv/logs"))], CFG, "ctl1", statvfs)
    with caplog.at_level(logging.WARNING, logger="dlts.jobmanager.disk_pressure"):
        for now in (0.0, 5.0, 10.0):
            assert pressure.check(now) == []
    assert [r.getMessage() for r in caplog.records] == [
        "log volume /srv/logs on ctl1 cannot be read (Input/output error); its pressure stays ok"]


def test_held_launches_wait_with_the_reason_in_their_queue_places_and_no_job_is_preempted_for_them():
    cluster = [node("n0", "v100")]
    holder = running(job(1, 4, sku="v100", preemptible=True), ("n0", (0, 1, 2, 3)))
    wants = job(2, 4, sku="v100")  # non-preemptible: reclaims the node from the preemptible job
    snapshot = snap(cluster, vc(quota={"v100": 4}), [holder, wants])
    decisions = decide(snapshot, 10.0)
    assert [(s.job_id, s.reason, s.for_job) for s in decisions.stops] == [(1, StopReason.PREEMPTED, 2)]
    held = hold_launches(decisions, snapshot, "log volume full on ctl1: 0 B free")
    assert held.stops == () and held.starts == ()
    assert [(w.job_id, w.reason, w.detail) for w in held.waits] == [
        (2, WaitReason.DISK_PRESSURE, "log volume full on ctl1: 0 B free")]

    free = [node("n1", "v100")]
    three = [job(3, 1, sku="v100"), job(4, 1, sku="v100"), job(5, 8, sku="v100")]
    snapshot = snap(free, vc(quota={"v100": 4}), three)
    decisions = decide(snapshot, 10.0)
    assert sorted(s.job_id for s in decisions.starts) == [3, 4]
    held = hold_launches(decisions, snapshot, "full")
    assert held.starts == ()
    assert sorted((w.job_id, w.reason_code, w.queue_position) for w in held.waits) == [
        (3, "disk_pressure", 1), (4, "disk_pressure", 2), (5, decisions.waits[0].reason_code, 3)]


def test_a_wall_time_stop_still_goes_through_while_launches_are_held():
    late = running(job(1, 1, sku="v100", max_time_s=10), ("n0", (0,)), started_at=0.0)
    snapshot = snap([node("n0", "v100")], vc(), [late])
    held = hold_launches(decide(snapshot, 100.0), snapshot, "full")
    assert [(s.job_id, s.reason) for s in held.stops] == [(1, StopReason.WALL_TIME)]


def test_a_hard_threshold_above_the_soft_one_stops_start_up_with_the_key(tmp_path):
    config = tmp_path / "dlts.yaml"
    config.write_text("disk_pressure:\n  soft_free_bytes: 1000\n  hard_free_bytes: 2000\n")
    with pytest.raises(ConfigError, match="disk_pressure.*hard_free_bytes must not be above soft_free_bytes"):
        load_settings(config, environ={})
    config.write_text("disk_pressure:\n  soft_free_bytes: 3000\n  hard_free_bytes: 2000\n  interval_s: 0\n")
    assert load_settings(config, environ={}).disk_pressure.hard_free_bytes == 2000
