"""What the real tools do on a real cluster's different nodes: pool changes and conf_param only on
the MGS (the fake refuses them elsewhere, as lctl does), the MGS route of the Runner, quota
enforcement read from the servers' osd parameters, the server-side LustreCollector, `lfs quota -q`
in both formats, and the VC's default directory striping across MDTs (idempotent)."""
from __future__ import annotations

import os

import pytest
from click.testing import CliRunner
from lustre_fixtures import MGS_PREFIX, load_fixture
from prometheus_client import CollectorRegistry

from dlts_lustre.cli import main
from dlts_lustre.client import LustreClient, cmd_pool_add, cmd_pool_new, cmd_pool_remove
from dlts_lustre.errors import LustreCommandError
from dlts_lustre.metrics import SERVER_SECTIONS, LustreCollector
from dlts_lustre.model import QuotaKind, TargetKind
from dlts_lustre.parsers.params import osd_values, parse_params
from dlts_lustre.parsers.quota import parse_quota
from dlts_lustre.plan import ActionKind, apply_plan, build_plan
from dlts_lustre.policy import policy_from_vcs
from dlts_lustre.runner import Runner, needs_mgs

GIB = 1024 * 1024


class NodeRunner(Runner):
    """Runs every command as if on ``node`` (what the agent on that server does); no MGS route."""

    def __init__(self, node: str):
        super().__init__(mgs_command=())
        self.node = node

    def run(self, argv, **kwargs):
        saved = os.environ.get("DLTS_FAKE_LUSTRE_NODE")
        os.environ["DLTS_FAKE_LUSTRE_NODE"] = self.node
        try:
            return super().run(argv, **kwargs)
        finally:
            os.environ["DLTS_FAKE_LUSTRE_NODE"] = saved or "client"


def on(node: str) -> Runner:
    return NodeRunner(node)


def test_pool_commands_are_refused_off_the_mgs_with_lctls_own_error(fake_lustre):
    client = LustreClient(Runner(mgs_command=()))  # no route: runs on the client
    with pytest.raises(LustreCommandError) as err:
        client.execute(cmd_pool_new("dltsfs", "vc_a"))
    expected = load_fixture("lctl_pool_new_not_mgs.txt")
    assert err.value.exit_code == 19 and err.value.stderr.strip() == expected.strip()
    assert "vc_a" not in fake_lustre.state()["pools"]
    # reading pools works on a client (lctl reads the client's lov pools), creating them on the MGS
    assert client.pools("dltsfs") == ()
    routed = LustreClient(Runner(mgs_command=tuple(MGS_PREFIX.split())))
    routed.execute(cmd_pool_new("dltsfs", "vc_a"))
    routed.execute(cmd_pool_add("dltsfs", "vc_a", [0, 1]))
    assert client.pool("dltsfs", "vc_a").ost_indices == (0, 1)
    with pytest.raises(LustreCommandError, match="must be run on the MGS"):
        client.execute(cmd_pool_remove("dltsfs", "vc_a", [1]))
    assert fake_lustre.state()["pools"]["vc_a"] == [0, 1]


def test_only_mgs_commands_take_the_route():
    assert needs_mgs(("lctl", "pool_new", "fs.p")) and needs_mgs(("lctl", "conf_param", "fs.quota.ost=ugp"))
    assert needs_mgs(("lctl", "set_param", "-P", "x=1"))
    assert not needs_mgs(("lctl", "pool_list", "fs")) and not needs_mgs(("lfs", "setquota", "-u", "a"))
    assert not needs_mgs(("lctl", "get_param", "health_check"))


def test_apply_from_a_client_sends_exactly_the_pool_commands_to_the_mgs(fake_lustre, tmp_path, monkeypatch):
    log = tmp_path / "routed.log"
    # the MGS route through a recording wrapper: what reaches it is what an ssh would carry
    wrapper = tmp_path / "to-mgs"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec env DLTS_FAKE_LUSTRE_NODE=mgs "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("DLTS_LUSTRE_MGS_COMMAND", str(wrapper))
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"filesystem: {{name: dltsfs, mount: {fake_lustre.mount}}}\n"
                      "vcs:\n  - {name: vision, directory: vcs/vision, pool: vc_vision, osts: 0-1, mdt: 1}\n")
    result = CliRunner().invoke(main, ["apply", str(policy)])
    assert result.exit_code == 0, result.output
    routed = log.read_text().splitlines()
    assert routed == ["lctl pool_new dltsfs.vc_vision", "lctl pool_add dltsfs.vc_vision dltsfs-OST0000 dltsfs-OST0001"]
    assert fake_lustre.state()["pools"] == {"vc_vision": [0, 1]}


def test_conf_param_is_refused_off_the_mgs_and_quota_enforcement_reaches_the_servers(fake_lustre):
    mds, oss = LustreClient(on("mds")), LustreClient(on("oss"))
    assert set(mds.quota_enforcement("dltsfs").values()) == {"none"}
    assert sorted(oss.quota_enforcement("dltsfs")) == [f"dltsfs-OST{i:04x}" for i in range(6)]
    assert LustreClient(on("client")).quota_enforcement("dltsfs") == {}  # a client holds no target
    with pytest.raises(LustreCommandError) as err:
        LustreClient(Runner(mgs_command=())).execute(("lctl", "conf_param", "dltsfs.quota.ost=ugp"))
    assert err.value.exit_code == 19 and "error: conf_param: No such device" in err.value.stderr
    mgs = LustreClient(Runner(mgs_command=tuple(MGS_PREFIX.split())))
    with pytest.raises(LustreCommandError, match="Invalid argument"):
        mgs.execute(("lctl", "conf_param", "dltsfs.quota.ost=ugx"))
    mgs.execute(("lctl", "conf_param", "dltsfs.quota.ost=ugp"))
    assert set(oss.quota_enforcement("dltsfs").values()) == {"ugp"}
    assert set(mds.quota_enforcement("dltsfs").values()) == {"none"}  # quota.mdt is separate
    mgs.execute(("lctl", "conf_param", "dltsfs.quota.mdt=gu"))
    assert set(mds.quota_enforcement("dltsfs").values()) == {"ug"}


def test_osd_parameters_parse_including_the_newer_split_slaves(fixture_text):
    params = parse_params(fixture_text("get_param_osd_space.txt"))
    assert osd_values(params, "kbytesavail") == {"dltsfs-OST0000": "891289600", "dltsfs-OST0001": "0"}
    assert osd_values(params, "quota_slave*.enabled") == {"dltsfs-OST0000": "ugp", "dltsfs-OST0001": "none"}
    split = parse_params(fixture_text("get_param_quota_slave_md_dt.txt"))
    assert osd_values(split, "quota_slave_md.enabled") == {"dltsfs-MDT0000": "ugp"}


def test_server_targets_and_the_server_side_collector(fake_lustre):
    fake_lustre.update(lambda s: s["osts"][1].update(kib_used=999 * GIB, kib_reserved=0))
    oss = LustreClient(on("oss"))
    targets = {t.name: t for t in oss.server_targets("dltsfs")}
    assert set(targets) == {f"dltsfs-OST{i:04x}" for i in range(6)}
    assert targets["dltsfs-OST0001"].kind is TargetKind.OST and targets["dltsfs-OST0001"].kib_available == GIB
    registry = CollectorRegistry()
    registry.register(LustreCollector(None, client=oss, fsname="dltsfs", sections=("health", "targets", "ost_stats")))
    labels = {"fs": "dltsfs", "target": "dltsfs-OST0001", "kind": "OST", "index": "1"}
    assert registry.get_sample_value("dlts_lustre_target_free_bytes", labels) == GIB * 1024
    assert registry.get_sample_value("dlts_lustre_target_capacity_bytes", labels) == 1000 * GIB * 1024
    assert registry.get_sample_value("dlts_lustre_target_quota_enforced", {**labels, "type": "project"}) == 0.0
    assert registry.get_sample_value("dlts_lustre_collector_success", {"section": "targets"}) == 1.0
    assert registry.get_sample_value("dlts_lustre_collector_success", {"section": "ost_stats"}) == 1.0  # none: empty


def test_pool_membership_on_the_mgs_without_a_client_mount(fake_lustre):
    LustreClient().execute(cmd_pool_new("dltsfs", "vc_a"))
    LustreClient().execute(cmd_pool_add("dltsfs", "vc_a", [2, 3]))
    registry = CollectorRegistry()
    registry.register(LustreCollector(None, client=LustreClient(on("mgs")), fsname="dltsfs", sections=SERVER_SECTIONS))
    assert registry.get_sample_value("dlts_lustre_pool_ost", {"fs": "dltsfs", "pool": "vc_a",
                                                              "target": "dltsfs-OST0003"}) == 1.0
    assert registry.get_sample_value("dlts_lustre_pool_osts", {"fs": "dltsfs", "pool": "vc_a"}) == 2.0
    assert registry.get_sample_value("dlts_lustre_pool_free_bytes", {"fs": "dltsfs", "pool": "vc_a"}) is None
    with pytest.raises(ValueError, match="not both"):
        LustreCollector("/mnt", sections=("df", "targets"))


def test_pool_list_on_an_oss_fails_as_lctl_does(fake_lustre):
    with pytest.raises(LustreCommandError, match="no local MGS/MDT or client"):
        LustreClient(on("oss")).pools("dltsfs")


@pytest.mark.parametrize("name,kind,used,over,grace", [
    ("quota_user_2.15_quiet.txt", QuotaKind.USER, 6291460, True, "running"),
    ("quota_project_2.16.52_quiet.txt", QuotaKind.PROJECT, 52428800, False, "not_started"),
    ("quota_user_human_kb.txt", QuotaKind.USER, 4, False, "not_started"),
])
def test_quiet_quota_rows_parse(fixture_text, name, kind, used, over, grace):
    report = parse_quota(fixture_text(name), kind=kind, quiet=True)
    assert report.total.block_used_kib == used and report.total.block_over_limit is over
    assert report.total.block_grace.state.value == grace


def test_quiet_quota_against_the_fake_in_both_formats(fake_lustre_any):
    fake_lustre_any.update(lambda s: s["quotas"]["u"].update({"1002": {
        "bs": 1000, "bh": 2000, "is": 0, "ih": 0, "used_kib": 1500, "used_inodes": 12, "explicit": True}}))
    report = LustreClient().quota(QuotaKind.USER, 1002, str(fake_lustre_any.mount), quiet=True)
    assert (report.total.block_used_kib, report.total.inode_used, report.total.block_over_limit) == (1500, 12, True)
    assert ["lfs", "quota", "-q", "-u", "1002", str(fake_lustre_any.mount)] in fake_lustre_any.calls()


def test_default_directory_striping_is_applied_once_and_checked(fake_lustre):
    client = LustreClient()
    policy = policy_from_vcs([{"name": "nlp", "pool": "vc_nlp", "osts": [0], "mdt": 0, "default_dir_stripe_count": 2}],
                             {"filesystem": {"name": "dltsfs", "mount": str(fake_lustre.mount)}})
    plan = build_plan(policy, client)
    defaults = [a for a in plan.actions if a.kind is ActionKind.SET_DIR_DEFAULT]
    assert [a.argv for a in defaults] == [("lfs", "setdirstripe", "-D", "-c", "2", "-i", "-1",
                                           str(fake_lustre.mount / "vcs" / "nlp"))]
    apply_plan(plan, client)
    assert client.getdirstripe(str(fake_lustre.mount / "vcs" / "nlp"), default=True).stripe_count == 2
    fake_lustre.clear_calls()
    assert build_plan(policy, client).actions == ()
    assert ["lfs", "getdirstripe", "-D", str(fake_lustre.mount / "vcs" / "nlp")] in fake_lustre.calls()
    # a count beyond the MDTs is refused before anything runs
    too_many = policy_from_vcs([{"name": "nlp", "pool": "vc_nlp", "osts": [0], "default_dir_stripe_count": 3}],
                               {"filesystem": {"name": "dltsfs", "mount": str(fake_lustre.mount)}})
    with pytest.raises(Exception, match="default_dir_stripe_count: 3 exceeds the 2 MDTs"):
        build_plan(too_many, client)
