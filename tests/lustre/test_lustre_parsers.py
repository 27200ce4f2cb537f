"""Every parser against the recorded outputs in fixtures/, plus malformed input -> LustreParseError."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lustre_fixtures import load_fixture

from dlts_lustre.errors import LustreParseError
from dlts_lustre.model import GRACE_NOTIFY_S, GraceState, HealthState, QuotaKind, TargetFlag
from dlts_lustre.parsers import (
    compute_rates,
    parse_default_quota,
    parse_df,
    parse_df_single,
    parse_getdirstripe,
    parse_getdirstripe_mdt,
    parse_getstripe,
    parse_grace_times,
    parse_health,
    parse_pool_list,
    parse_pool_members,
    parse_project,
    parse_quota,
    parse_stats,
    parse_version,
)

# ------------------------------------------------------------------------------------------- version


@pytest.mark.parametrize("text, expected, new_header", [
    ("lfs 2.15.4\n", (2, 15, 4, 0), False),
    ("lfs 2.16.52_12_gabcdef\n", (2, 16, 52, 0), True),
    ("lfs version 2.12.9.1\n", (2, 12, 9, 1), False),
    ("lfs 2.17.0\n", (2, 17, 0, 0), True),
])
def test_version_is_parsed_and_picks_the_quota_header(text, expected, new_header):
    version = parse_version(text)
    assert version.as_tuple() == expected
    assert version.new_quota_header is new_header


@pytest.mark.parametrize("text", ["", "lfs: command failed\n"])
def test_version_without_a_number_is_a_parse_error(text):
    with pytest.raises(LustreParseError):
        parse_version(text)


# ------------------------------------------------------------------------------------------- quota


def test_quota_2_15_wrapped_mount_over_limit_with_running_grace():
    r = parse_quota(load_fixture("quota_user_2.15_wrapped.txt"), kind=QuotaKind.USER)
    assert (r.kind, r.name, r.numeric_id) == (QuotaKind.USER, "bob", 1001)
    assert r.mount == "/mnt/lustre-scratch01"
    t = r.total
    assert (t.block_used_kib, t.block_soft_kib, t.block_hard_kib) == (6291460, 6291456, 8388608)
    assert t.block_over_limit and not t.inode_over_limit
    assert t.block_grace.state is GraceState.RUNNING
    assert t.block_grace.remaining_s == 6 * 86400 + 23 * 3600 + 59 * 60 + 58
    assert t.inode_grace.state is GraceState.NOT_STARTED
    assert (t.inode_used, t.inode_soft, t.inode_hard) == (1024, 0, 0)
    assert r.uses_default_file and not r.uses_default_block
    assert not r.inaccurate


def test_quota_short_mount_on_one_line():
    r = parse_quota(load_fixture("quota_user_2.15_short.txt"))
    assert (r.name, r.numeric_id, r.mount) == ("root", 0, "/lustre/")
    assert r.total.block_used_kib == 9857068 and r.total.inode_used == 4490


def test_quota_verbose_rows_inactive_target_failed_quotactl_and_inaccurate_trailer():
    r = parse_quota(load_fixture("quota_user_2.15_verbose.txt"))
    assert r.inaccurate
    assert r.total.block_used_kib == 1048576
    assert "block_used" in r.total.inaccurate_columns
    assert r.errors == ("quotactl ost2 failed.",)
    uuids = [t.uuid for t in r.targets]
    assert uuids == ["dltsfs-MDT0000_UUID", "dltsfs-OST0000_UUID", "dltsfs-OST0001_UUID", "dltsfs-OST0003_UUID"]
    mdt = r.targets[0].entry
    assert mdt.block_soft_kib is None and mdt.inode_used == 1000 and mdt.inode_hard == 1024
    ost = r.targets[1].entry
    assert ost.block_used_kib == 524288 and ost.block_hard_kib == 1048576 and ost.inode_used is None
    assert r.targets[3].inactive and r.targets[3].entry is None


def test_quota_group_expired_grace_prints_none_before_2_16_52():
    r = parse_quota(load_fixture("quota_group_2.15_expired.txt"))
    assert r.kind is QuotaKind.GROUP and r.numeric_id == 2000
    assert r.total.block_grace.state is GraceState.EXPIRED
    assert r.total.inode_over_limit and r.total.inode_grace.remaining_s == 2 * 86400 + 3 * 3600 + 4 * 60 + 5


def test_quota_2_16_52_header_names_and_expired():
    r = parse_quota(load_fixture("quota_project_2.16.52.txt"), kind=QuotaKind.PROJECT)
    assert r.kind is QuotaKind.PROJECT and r.numeric_id == 1001
    assert r.mount == "/mnt/lustre-scratch01"
    assert r.total.block_soft_kib == 53687091200 and r.total.block_hard_kib == 64424509440
    assert r.total.inode_soft == 50000000 and r.total.inode_hard == 60000000
    assert r.total.block_grace.state is GraceState.EXPIRED and r.total.block_over_limit


def test_quota_2_16_52_delimited_rows():
    r = parse_quota(load_fixture("quota_user_2.16.52_delimited.txt"), kind=QuotaKind.USER, delimiter=",")
    assert r.name is None and r.mount == "/mnt/dltsfs"
    assert r.total.block_used_kib == 6291460 and r.total.block_over_limit
    assert r.total.block_grace.remaining_s == 86400
    assert [t.uuid for t in r.targets] == ["dltsfs-MDT0000_UUID", "dltsfs-OST0000_UUID"]


def test_quota_human_readable_used_column():
    r = parse_quota(load_fixture("quota_user_2.15_human.txt"))
    assert r.total.block_used_kib == round(9.4 * 1024 * 1024)
    assert r.total.block_soft_kib == 0


def test_both_header_generations_give_the_same_values():
    old = ("Disk quotas for usr bob (uid 1001):\n"
           "     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace\n"
           "    /mnt/dltsfs     100     200     300       -       4       5       6       -\n")
    new = old.replace("kbytes   quota   limit   grace   files   quota   limit   grace",
                      "kbytes  bquota  blimit  bgrace   files  iquota  ilimit  igrace")
    assert parse_quota(old) == parse_quota(new)


def test_quota_for_the_wrong_kind_is_an_error():
    with pytest.raises(LustreParseError, match="asked for group"):
        parse_quota(load_fixture("quota_user_2.15_short.txt"), kind=QuotaKind.GROUP)


@pytest.mark.parametrize("text, message", [
    ("", "empty output"),
    ("Disk quotas for usr bob (uid 1):\n     /mnt 1 2 3 - 4 5 6 -\n", "before the Filesystem header"),
    (("Disk quotas for usr bob (uid 1):\n Filesystem kbytes quota limit grace files quota limit grace\n"
     "   /mnt 1 2 3 -\n"), "expected 8 values"),
    (("Disk quotas for usr bob (uid 1):\n Filesystem kbytes quota limit grace files quota limit grace\n"
     "   /mnt 1 x 3 - 4 5 6 -\n"), "not a number"),
    (("Disk quotas for usr bob (uid 1):\n Filesystem kbytes quota limit grace files quota limit grace\n"
     "   /mnt 1 2 3 soon 4 5 6 -\n"), "bad grace"),
    (("Disk quotas for usr bob (uid 1):\n Filesystem kbytes quota limit grace files quota limit grace\n"
     "/a/very/long/mount/point\n"), "ends after wrapped name"),
    (("Disk quotas for usr bob (uid 1):\n Filesystem kbytes quota limit grace files quota limit grace\n"
     "/a/very/long/mount/point\nDisk quotas for usr bob (uid 1):\n"), "numbers expected"),
    ("Disk quotas for usr bob (uid 1):\n Filesystem kbytes colour\n", "unknown header column"),
    ("Disk quotas for usr bob (uid 1):\n Filesystem kbytes quota limit grace files quota limit grace\n",
     "no quota row"),
])
def test_malformed_quota_output_raises_a_typed_error(text, message):
    with pytest.raises(LustreParseError, match=message):
        parse_quota(text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([
    "Disk quotas for usr bob (uid 1001):", "     Filesystem  kbytes   quota   limit   grace   files   quota   limit",
    "/mnt/x", "   1 2 3 - 4 5 6 -", "[1]* 2", "uid 1001 is using default file quota setting", "", "x",
    "dltsfs-OST0000_UUID", "dltsfs-OST0001_UUID[inact]", "1,2,3", "Some errors happened when getting quota info.",
]), max_size=8), st.sampled_from([None, ","]))
def test_quota_parser_never_crashes_with_anything_but_a_parse_error(lines, delimiter):
    try:
        parse_quota("\n".join(lines), kind=QuotaKind.USER, delimiter=delimiter)
    except LustreParseError:
        pass


def test_default_quota_wrapped_mount():
    d = parse_default_quota(load_fixture("quota_default_usr_2.15.txt"))
    assert d.kind is QuotaKind.USER and d.mount == "/mnt/lustre-scratch01"
    assert d.limits.block_soft_kib == 524288000 and d.limits.block_hard_kib == 629145600
    assert (d.limits.inode_soft, d.limits.inode_hard) == (1000000, 1200000)
    assert d.block_grace_s == d.inode_grace_s == 604800


def test_default_quota_with_seconds_grace():
    text = ("Disk default grp quota:\n     Filesystem  bquota  blimit  bgrace  iquota  ilimit  igrace\n"
            "    /mnt/dltsfs       0       0      10       0       0      10\n")
    d = parse_default_quota(text)
    assert d.kind is QuotaKind.GROUP and d.block_grace_s == 10


def test_default_quota_garbage_is_a_parse_error():
    with pytest.raises(LustreParseError):
        parse_default_quota("Disk default usr quota:\n Filesystem bquota blimit\n /mnt x 1\n")


def test_grace_times():
    g = parse_grace_times(load_fixture("quota_grace.txt"))
    assert (g.block_grace_s, g.inode_grace_s) == (9 * 86400, 0)


def test_grace_times_unknown_and_notify():
    g = parse_grace_times(load_fixture("quota_grace_error.txt"))
    assert g.block_grace_s is None and g.inode_grace_s == GRACE_NOTIFY_S


def test_grace_times_garbage():
    with pytest.raises(LustreParseError):
        parse_grace_times("lfs: quotactl failed: Operation not supported\n")


# ------------------------------------------------------------------------------------------- df


def test_df_blocks_flags_inactive_and_hex_indices():
    r = parse_df_single(load_fixture("df_blocks.txt"))
    assert not r.inodes and len(r.mdts()) == 2
    by_index = {t.index: t for t in r.osts()}
    assert sorted(by_index) == [0, 1, 2, 3, 10]
    assert not by_index[2].active and by_index[2].mount == "/mnt/dltsfs"
    assert by_index[2].uuid == "dltsfs-OST0002_UUID"
    assert by_index[3].flags == frozenset({TargetFlag.DEGRADED, TargetFlag.NO_CREATE})
    assert by_index[10].flags == frozenset({TargetFlag.READ_ONLY}) and by_index[10].uuid == "dltsfs-OST000a_UUID"
    assert by_index[0].total == 3771392000 and by_index[0].available == 3528448000
    assert r.summary.total == 15085568000


def test_df_inodes():
    r = parse_df_single(load_fixture("df_inodes.txt"))
    assert r.inodes
    assert r.mdts()[0].total == 1048576 and r.osts()[1].flags == frozenset({TargetFlag.OUT_OF_INODES})


def test_df_several_filesystems():
    reports = parse_df(load_fixture("df_two_filesystems.txt"))
    assert [r.summary.mount for r in reports] == ["/home", "/scratch"]
    assert reports[1].osts()[1].flags == frozenset({TargetFlag.FLASH})
    with pytest.raises(LustreParseError, match="expected one filesystem"):
        parse_df_single(load_fixture("df_two_filesystems.txt"))


@pytest.mark.parametrize("text", [
    "", "dltsfs-OST0000_UUID 1 2 3 1% /mnt[OST:0]\n",
    "UUID 1K-blocks Used Available Use% Mounted on\ndltsfs-OST0000_UUID 1 2 /mnt[OST:0]\n",
    "UUID 1K-blocks Used Available Use% Mounted on\ndltsfs-OST0000_UUID x 2 3 1% /mnt[OST:0]\n",
    "UUID 1K-blocks Used Available Use% Mounted on\nbogus : inactive device\n",
    "UUID Apples Pears\n",
])
def test_malformed_df_raises_a_typed_error(text):
    with pytest.raises(LustreParseError):
        parse_df(text)


# ------------------------------------------------------------------------------------------- pools


def test_pool_list_and_members():
    assert parse_pool_list(load_fixture("pool_list.txt"), "dltsfs") == ("vc_vision", "flash")
    pool = parse_pool_members(load_fixture("pool_members.txt"), "dltsfs", "vc_vision")
    assert pool.ost_indices == (0, 1, 11)


def test_empty_pool_list():
    assert parse_pool_list("Pools from dltsfs:\n", "dltsfs") == ()
    assert parse_pool_members("Pool: dltsfs.p\n", "dltsfs", "p").ost_indices == ()


@pytest.mark.parametrize("text", ["", "Pools from other:\n", "Pools from dltsfs:\nother.p\n", "Pools from dltsfs:\nnodot\n"])
def test_malformed_pool_list(text):
    with pytest.raises(LustreParseError):
        parse_pool_list(text, "dltsfs")


def test_malformed_pool_members():
    with pytest.raises(LustreParseError):
        parse_pool_members("Pool: dltsfs.p\ndltsfs-MDT0000_UUID\n", "dltsfs", "p")


# ------------------------------------------------------------------------------------------- layout


def test_getstripe_plain_none_and_composite():
    s = parse_getstripe(load_fixture("getstripe_dir.txt"))
    assert (s.stripe_count, s.stripe_size_bytes, s.stripe_offset, s.pool) == (1, 1048576, -1, "vc_vision")
    assert parse_getstripe(load_fixture("getstripe_none.txt")).pool is None
    pfl = parse_getstripe(load_fixture("getstripe_pfl.txt"))
    assert pfl.composite and pfl.pool == "flash" and pfl.stripe_count == 1


def test_getstripe_without_pool_field():
    s = parse_getstripe("stripe_count:  4 stripe_size:   4194304 pattern:       raid0 stripe_offset: -1\n")
    assert s.stripe_count == 4 and s.pool is None


@pytest.mark.parametrize("text", ["gibberish\n", "stripe_size: 1\n", "stripe_count: many\n"])
def test_malformed_getstripe(text):
    with pytest.raises(LustreParseError):
        parse_getstripe(text)


def test_getdirstripe_variants():
    plain = parse_getdirstripe(load_fixture("getdirstripe_plain.txt"))
    assert (plain.stripe_count, plain.stripe_offset, plain.hash_type) == (0, 1, "none")
    striped = parse_getdirstripe(load_fixture("getdirstripe_striped.txt"))
    assert striped.stripe_count == 2 and striped.mdt_indices == (0, 1) and striped.hash_type == "fnv_1a_64"
    default = parse_getdirstripe(load_fixture("getdirstripe_default.txt"), default=True)
    assert (default.stripe_count, default.stripe_offset, default.max_inherit, default.default) == (1, -1, 3, True)
    assert parse_getdirstripe_mdt("1\n") == 1


@pytest.mark.parametrize("text", ["", "lmv_stripe_count: 2\n",
                                  "lmv_stripe_count: 2 lmv_stripe_offset: 0 lmv_hash_type: x\nmdtidx FID\n0\n"])
def test_malformed_getdirstripe(text):
    with pytest.raises(LustreParseError):
        parse_getdirstripe(text)


def test_malformed_getdirstripe_mdt():
    with pytest.raises(LustreParseError):
        parse_getdirstripe_mdt("lfs getdirstripe: error\n")


def test_project():
    p = parse_project(load_fixture("project.txt"))
    assert (p.project_id, p.inherit, p.path) == (1001, True, "/mnt/dltsfs/vcs/vision")
    assert not parse_project("    0 - /mnt/x y\n").inherit
    assert parse_project("    0 - /mnt/x y\n").path == "/mnt/x y"


@pytest.mark.parametrize("text", ["", "x P /a\n", "1 P /a\n2 P /b\n"])
def test_malformed_project(text):
    with pytest.raises(LustreParseError):
        parse_project(text)


# ------------------------------------------------------------------------------------------- health


def test_health_states():
    assert parse_health(load_fixture("health_healthy.txt")).healthy
    assert parse_health("health_check=healthy\n").healthy
    sick = parse_health(load_fixture("health_devices.txt"))
    assert sick.state is HealthState.UNHEALTHY
    assert sick.unhealthy_devices == ("dltsfs-OST0012", "dltsfs-OST0013")
    assert parse_health(load_fixture("health_lbug.txt")).state is HealthState.LBUG
    assert parse_health("something odd\n").state is HealthState.UNHEALTHY
    with pytest.raises(LustreParseError):
        parse_health("\n")


# ------------------------------------------------------------------------------------------- stats


def test_stats_blocks_and_counters():
    blocks = parse_stats(load_fixture("obdfilter_stats_t0.txt"))
    assert [b.target for b in blocks] == ["dltsfs-OST0000", "dltsfs-OST0001"]
    wb = blocks[0].counters["write_bytes"]
    assert (wb.samples, wb.unit, wb.minimum, wb.maximum, wb.total) == (25001, "bytes", 98304, 4194304, 104857600000)
    assert blocks[0].snapshot_time_s == 1700000000.0


def test_stats_old_units_without_sums():
    (block,) = parse_stats(load_fixture("md_stats_old_units.txt"))
    assert block.target == "dltsfs-MDT0000" and block.param == "mdt.dltsfs-MDT0000.md_stats"
    assert block.counters["open"].unit == "reqs" and block.counters["open"].total is None
    assert block.counters["getattr"].unit == "usec" and block.counters["getattr"].total == 300


def test_rates_from_two_scrapes_skip_a_reset_target():
    before = parse_stats(load_fixture("obdfilter_stats_t0.txt"))
    after = parse_stats(load_fixture("obdfilter_stats_t1.txt"))
    rates = {(r.target, r.counter): r for r in compute_rates(before, after)}
    assert rates[("dltsfs-OST0000", "read_bytes")].ops_per_s == pytest.approx(50.0)
    assert rates[("dltsfs-OST0000", "read_bytes")].bytes_per_s == pytest.approx(52428800 / 10)
    assert rates[("dltsfs-OST0000", "write_bytes")].bytes_per_s == pytest.approx(10000000 / 10)
    assert rates[("dltsfs-OST0000", "punch")].ops_per_s == pytest.approx(0.5)  # absent before = 0 samples
    assert rates[("dltsfs-OST0000", "read")].bytes_per_s is None
    assert not any(t == "dltsfs-OST0001" for t, _ in rates)  # cleared between scrapes: no bogus negative rate


@pytest.mark.parametrize("text", [
    "snapshot_time 1.0 secs.nsecs\n",
    "obdfilter.x-OST0000.stats=\nread_bytes 1 samples [bytes] 1 2 3 4\n",
    "obdfilter.x-OST0000.stats=\nsnapshot_time 1.0 secs.nsecs\nread_bytes lots\n",
    "obdfilter.x-OST0000.stats=\nsnapshot_time 1.0 secs.nsecs\nread_bytes 1 samples [bytes] 1 2 3 4 5\n",
])
def test_malformed_stats(text):
    with pytest.raises(LustreParseError):
        parse_stats(text)
