"""Typed operations round-trip through the stateful fake, at both quota output formats."""
from __future__ import annotations

import pytest

from dlts_lustre.client import (
    LustreClient,
    cmd_mkdir,
    cmd_pool_add,
    cmd_pool_destroy,
    cmd_pool_new,
    cmd_pool_remove,
    cmd_set_default_quota,
    cmd_set_grace,
    cmd_set_project,
    cmd_setdirstripe_default,
    cmd_setquota,
    cmd_setstripe,
    cmd_use_default_quota,
)
from dlts_lustre.errors import LustreCommandError, LustreError
from dlts_lustre.model import GraceState, QuotaKind, QuotaLimits

GIB = 1024 * 1024


def test_quota_set_and_get_user_by_name(fake_lustre_any):
    mount = str(fake_lustre_any.mount)
    client = LustreClient()
    client.execute(cmd_setquota(QuotaKind.USER, "alice", mount, QuotaLimits(10 * GIB, 20 * GIB, 1000, 2000)))
    report = client.quota(QuotaKind.USER, "alice", mount)
    assert report.numeric_id == 1001 and report.mount == mount
    assert report.total.limits == QuotaLimits(10 * GIB, 20 * GIB, 1000, 2000)


def test_over_soft_limit_shows_mark_and_grace(fake_lustre_any):
    mount = str(fake_lustre_any.mount)
    fake_lustre_any.update(lambda s: s["quotas"]["u"].update({"1002": {
        "bs": 100, "bh": 200, "is": 0, "ih": 0, "used_kib": 150, "used_inodes": 3, "explicit": True,
        "block_grace_remaining_s": 0}}))
    report = LustreClient().quota(QuotaKind.USER, "bob", mount, verbose=True)
    assert report.total.block_over_limit
    assert report.total.block_grace.state is GraceState.EXPIRED  # "none" or "expired" depending on version
    assert len(report.targets) == 2 + 6


def test_default_quota_and_following_it(fake_lustre_any):
    mount = str(fake_lustre_any.mount)
    client = LustreClient()
    client.execute(cmd_set_default_quota(QuotaKind.USER, mount, QuotaLimits(GIB, 2 * GIB, 100, 200)))
    assert client.default_quota(QuotaKind.USER, mount).limits == QuotaLimits(GIB, 2 * GIB, 100, 200)
    carol = client.quota(QuotaKind.USER, "carol", mount)
    assert carol.uses_default_block and carol.uses_default_file
    assert carol.total.limits == QuotaLimits(GIB, 2 * GIB, 100, 200)
    client.execute(cmd_setquota(QuotaKind.USER, "carol", mount, QuotaLimits(5 * GIB, 6 * GIB, 0, 0)))
    assert not client.quota(QuotaKind.USER, "carol", mount).uses_default_block
    client.execute(cmd_use_default_quota(QuotaKind.USER, "carol", mount))
    assert client.quota(QuotaKind.USER, "carol", mount).uses_default_block


def test_default_quotas_need_2_12(fake_lustre):
    fake_lustre.update(lambda s: s.update(version="2.10.8"))
    with pytest.raises(LustreError, match="need Lustre 2.12"):
        LustreClient().default_quota(QuotaKind.USER, str(fake_lustre.mount))


def test_delimited_quota_only_on_new_versions(fake_lustre_any):
    client = LustreClient()
    mount = str(fake_lustre_any.mount)
    if client.version().new_quota_header:
        assert client.quota(QuotaKind.USER, "alice", mount, delimited=True).mount == mount
    else:
        with pytest.raises(LustreError, match="2.16.52"):
            client.quota(QuotaKind.USER, "alice", mount, delimited=True)


def test_grace_times_round_trip(fake_lustre):
    mount = str(fake_lustre.mount)
    client = LustreClient()
    client.execute(cmd_set_grace(QuotaKind.PROJECT, mount, 3 * 86400, -1))
    grace = client.grace_times(QuotaKind.PROJECT, mount)
    assert (grace.block_grace_s, grace.inode_grace_s) == (3 * 86400, -1)


def test_pool_lifecycle(fake_lustre):
    client = LustreClient()
    client.execute(cmd_pool_new("dltsfs", "p1"))
    client.execute(cmd_pool_add("dltsfs", "p1", [0, 1, 5]))
    assert client.pools("dltsfs") == ("p1",)
    assert client.pool("dltsfs", "p1").ost_indices == (0, 1, 5)
    client.execute(cmd_pool_remove("dltsfs", "p1", [1]))
    assert client.pool("dltsfs", "p1").ost_indices == (0, 5)
    with pytest.raises(LustreCommandError, match="not empty"):
        client.execute(cmd_pool_destroy("dltsfs", "p1"))
    client.execute(cmd_pool_remove("dltsfs", "p1", [0, 5]))
    client.execute(cmd_pool_destroy("dltsfs", "p1"))
    assert client.pools("dltsfs") == ()


def test_directory_placement_layout_and_project(fake_lustre):
    client = LustreClient()
    root = fake_lustre.mount
    client.execute(cmd_pool_new("dltsfs", "p1"))
    client.execute(cmd_pool_add("dltsfs", "p1", [2]))
    client.execute(cmd_mkdir(str(root / "a"), mdt_index=1))
    assert client.dir_mdt(str(root / "a")) == 1
    client.execute(cmd_mkdir(str(root / "b"), stripe_count=2, mdt_index=0))
    assert client.getdirstripe(str(root / "b")).mdt_indices == (0, 1)
    client.execute(cmd_setdirstripe_default(str(root / "a")))
    default = client.getdirstripe(str(root / "a"), default=True)
    assert (default.stripe_count, default.stripe_offset) == (1, -1)
    client.execute(cmd_setstripe(str(root / "a"), pool="p1", stripe_count=2))
    layout = client.getstripe(str(root / "a"))
    assert (layout.pool, layout.stripe_count) == ("p1", 2)
    client.execute(cmd_set_project(str(root / "a"), 77))
    project = client.project(str(root / "a"))
    assert (project.project_id, project.inherit) == (77, True)


def test_df_by_pool_and_health_and_missing_stats(fake_lustre):
    client = LustreClient()
    client.execute(cmd_pool_new("dltsfs", "p1"))
    client.execute(cmd_pool_add("dltsfs", "p1", [4, 5]))
    df = client.df(str(fake_lustre.mount), pool="p1", fsname="dltsfs")
    assert [t.index for t in df.osts()] == [4, 5] and df.pool == "p1"
    assert client.health().healthy
    assert client.stats("obdfilter.*.stats") == ()  # not an OSS: no such param, no error


def test_per_pool_quota_and_grace(fake_lustre):
    mount = str(fake_lustre.mount)
    client = LustreClient()
    client.execute(cmd_pool_new("dltsfs", "flash"))
    client.execute(cmd_pool_add("dltsfs", "flash", range(2)))  # indices or a range
    client.execute(cmd_setquota(QuotaKind.USER, "alice", mount, QuotaLimits(GIB, 2 * GIB, 0, 0), pool="flash"))
    pooled = client.quota(QuotaKind.USER, "alice", mount, pool="flash")
    assert pooled.pool == "flash" and pooled.total.block_hard_kib == 2 * GIB
    assert client.quota(QuotaKind.USER, "alice", mount).total.block_hard_kib == 0  # filesystem-wide unchanged
    client.execute(cmd_set_grace(QuotaKind.USER, mount, 3600, 7200, pool="flash"))
    assert fake_lustre.calls()[-1] == ["lfs", "setquota", "-t", "-u", "--pool", "flash", "-b", "3600", "-i", "7200",
                                       mount]
    pooled_grace = client.grace_times(QuotaKind.USER, mount, pool="flash")
    assert (pooled_grace.block_grace_s, pooled_grace.inode_grace_s) == (3600, 7200)
    assert client.grace_times(QuotaKind.USER, mount).block_grace_s == 604800


def test_verbose_target_rows_parse_at_both_formats(fake_lustre_any):
    fake_lustre_any.update(lambda s: s["osts"][3].update(active=False))
    report = LustreClient().quota(QuotaKind.USER, "bob", str(fake_lustre_any.mount), verbose=True)
    assert [t.inactive for t in report.targets].count(True) == 1
    assert report.targets[0].uuid == "dltsfs-MDT0000_UUID"
