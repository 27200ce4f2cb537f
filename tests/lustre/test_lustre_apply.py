"""`dlts-lustre apply` end to end against the stateful fake lfs/lctl: plan, apply, idempotence, refusals."""
from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from dlts_lustre.cli import main
from dlts_lustre.client import LustreClient, cmd_mkdir, cmd_pool_add, cmd_pool_new, cmd_setquota
from dlts_lustre.model import QuotaKind, QuotaLimits
from dlts_lustre.plan import ActionKind, apply_plan, build_plan
from dlts_lustre.policy import load_policy, policy_from_mapping, policy_from_vcs

GIB = 1024 * 1024
TIB = 1024 * GIB


def policy_dict(fake, **changes) -> dict:
    data = {
        "filesystem": {"name": "dltsfs", "mount": str(fake.mount)},
        "user_quota": {
            "default": {"block_soft": "500G", "block_hard": "600G", "inode_soft": 1000000, "inode_hard": 1200000},
            "grace": {"block": "3d", "inode": "1w"},
            "overrides": {"alice": {"block_soft": "2T", "block_hard": "3T"}},
            "reset_to_default": ["bob"],
        },
        "project_grace": {"block": "2w", "inode": "2w"},
        "vcs": [
            {"name": "vision", "directory": "vcs/vision", "pool": "vc_vision", "osts": [0, 1], "mdt": 1,
             "stripe_count": 2, "project_id": 1001,
             "project_quota": {"block_soft": "50T", "block_hard": "60T", "inode_soft": 1000, "inode_hard": 2000}},
            {"name": "speech", "directory": "vcs/speech", "pool": "vc_speech", "osts": "2-3", "mdt": "spread",
             "project_id": 1002, "project_quota": {"block_soft": "20T", "block_hard": "25T"}},
        ],
    }
    data.update(changes)
    return data


def small_policy(fake, **changes) -> dict:
    """One VC and the user quotas: enough for the refusal and diff cases, half the fake calls."""
    data = policy_dict(fake, **changes)
    data["vcs"] = data["vcs"][:1]
    data.pop("project_grace")
    return data


def write_policy(fake, tmp_path, data=None, name="policy.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data or policy_dict(fake)))
    return str(path)


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result


def test_apply_converges_and_a_second_run_does_nothing(fake_lustre_any, tmp_path):
    fake = fake_lustre_any
    policy = write_policy(fake, tmp_path)
    first = run("apply", policy)
    assert first.exit_code == 0, first.output
    assert "done:" in first.output
    state = fake.state()
    assert state["pools"] == {"vc_vision": [0, 1], "vc_speech": [2, 3]}
    vision = state["dirs"][str(fake.mount / "vcs" / "vision")]
    assert vision["mdt"] == 1 and vision["layout"]["pool"] == "vc_vision" and vision["layout"]["count"] == 2
    assert (vision["projid"], vision["inherit"]) == (1001, True)
    speech = state["dirs"][str(fake.mount / "vcs" / "speech")]
    assert speech["default_dirstripe"] == {"count": 1, "offset": -1}
    assert state["defaults"]["u"] == {"bs": 500 * GIB, "bh": 600 * GIB, "is": 1000000, "ih": 1200000}
    assert state["grace"]["u"] == {"b": 3 * 86400, "i": 604800}
    assert state["grace"]["p"] == {"b": 14 * 86400, "i": 14 * 86400}
    assert state["quotas"]["u"]["1001"]["bh"] == 3 * TIB and state["quotas"]["u"]["1001"]["explicit"]
    assert state["quotas"]["p"]["1001"]["ih"] == 2000 and state["quotas"]["p"]["1002"]["bs"] == 20 * TIB

    fake.clear_calls()
    second = run("apply", policy)
    assert second.exit_code == 0, second.output
    assert "nothing to do" in second.output
    assert fake.mutating_calls() == []


def test_dry_run_prints_the_plan_and_changes_nothing(fake_lustre, tmp_path):
    before = fake_lustre.state()
    result = run("apply", write_policy(fake_lustre, tmp_path), "--dry-run")
    assert result.exit_code == 0, result.output
    assert "plan (" in result.output
    assert "$ lctl pool_new dltsfs.vc_vision" in result.output
    assert f"$ lfs mkdir -i 1 {fake_lustre.mount}/vcs/vision" in result.output
    assert fake_lustre.mutating_calls() == []
    assert fake_lustre.state() == before


def test_plan_orders_pools_before_pinning_and_json_lists_commands(fake_lustre, tmp_path):
    result = run("apply", write_policy(fake_lustre, tmp_path), "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    kinds = [a["kind"] for a in data["actions"]]
    assert kinds.index("pool_add") < kinds.index("set_stripe")
    assert data["dry_run"] is True and data["unsafe"] == []
    # bob has no limits of his own yet: nothing to reset.
    assert not any(a["kind"] == "use_default_quota" for a in data["actions"])


def test_only_what_changed_is_run(fake_lustre, tmp_path):
    data = small_policy(fake_lustre)
    assert run("apply", write_policy(fake_lustre, tmp_path, data)).exit_code == 0
    data["vcs"][0]["osts"] = [1, 4]
    data["user_quota"]["overrides"]["alice"]["block_hard"] = "4T"
    fake_lustre.clear_calls()
    result = run("apply", write_policy(fake_lustre, tmp_path, data))
    assert result.exit_code == 0, result.output
    assert fake_lustre.mutating_calls() == [
        ["lctl", "pool_add", "dltsfs.vc_vision", "dltsfs-OST0004"],
        ["lfs", "setquota", "-u", "alice", "-b", str(2 * TIB), "-B", str(4 * TIB), "-i", "0", "-I", "0",
         str(fake_lustre.mount)],
        ["lctl", "pool_remove", "dltsfs.vc_vision", "dltsfs-OST0000"],
    ]


def test_a_user_with_explicit_limits_is_reset_to_the_default(fake_lustre, tmp_path):
    LustreClient().execute(cmd_setquota(QuotaKind.USER, "bob", str(fake_lustre.mount), QuotaLimits(GIB, 2 * GIB, 0, 0)))
    result = run("apply", write_policy(fake_lustre, tmp_path, small_policy(fake_lustre)))
    assert result.exit_code == 0, result.output
    assert "user bob: follow the default quota again" in result.output
    assert fake_lustre.state()["quotas"]["u"]["1002"]["explicit"] is False
    fake_lustre.clear_calls()
    assert "nothing to do" in run("apply", write_policy(fake_lustre, tmp_path, small_policy(fake_lustre))).output


def test_shrinking_a_quota_below_usage_is_refused_without_force(fake_lustre, tmp_path):
    fake_lustre.update(lambda s: s["quotas"]["u"].update({"1001": {
        "bs": 0, "bh": 0, "is": 0, "ih": 0, "used_kib": 2 * TIB + 5 * GIB, "used_inodes": 10, "explicit": True}}))
    policy = write_policy(fake_lustre, tmp_path, small_policy(fake_lustre))
    refused = run("apply", policy)
    assert refused.exit_code == 3
    assert "refusing to apply" in refused.output
    assert "user alice: block soft limit 2T is below current usage" in refused.output
    assert "--force" in refused.output
    assert fake_lustre.mutating_calls() == []  # nothing at all was applied
    forced = run("apply", policy, "--force")
    assert forced.exit_code == 0, forced.output
    assert fake_lustre.state()["quotas"]["u"]["1001"]["bs"] == 2 * TIB


def test_destroying_a_non_empty_pool_is_refused_but_an_empty_one_is_pruned(fake_lustre, tmp_path):
    client = LustreClient()
    client.execute(cmd_pool_new("dltsfs", "legacy"))
    client.execute(cmd_pool_add("dltsfs", "legacy", [5]))
    client.execute(cmd_pool_new("dltsfs", "unused"))
    data = small_policy(fake_lustre, prune_pools=True)
    refused = run("apply", write_policy(fake_lustre, tmp_path, data))
    assert refused.exit_code == 3
    assert "pool legacy is not in the policy but still has OST 5" in refused.output
    assert "legacy" in fake_lustre.state()["pools"]
    forced = run("apply", write_policy(fake_lustre, tmp_path, data), "--force")
    assert forced.exit_code == 0, forced.output
    assert set(fake_lustre.state()["pools"]) == {"vc_vision"}


def test_moving_a_directory_to_another_project_is_unsafe(fake_lustre, tmp_path):
    assert run("apply", write_policy(fake_lustre, tmp_path, small_policy(fake_lustre))).exit_code == 0
    data = small_policy(fake_lustre)
    data["vcs"][0]["project_id"] = 4242
    data["vcs"][0].pop("project_quota")
    result = run("apply", write_policy(fake_lustre, tmp_path, data))
    assert result.exit_code == 3
    assert "belongs to project 1001" in result.output


def test_an_existing_directory_on_the_wrong_mdt_is_reported_not_moved(fake_lustre, tmp_path):
    (fake_lustre.mount / "vcs").mkdir()
    LustreClient().execute(cmd_mkdir(str(fake_lustre.mount / "vcs" / "vision"), mdt_index=0))
    result = run("apply", write_policy(fake_lustre, tmp_path, small_policy(fake_lustre)))
    assert result.exit_code == 0, result.output
    assert "is on MDT 0, the policy says MDT 1" in result.output
    assert f"lfs migrate -m 1 {fake_lustre.mount}/vcs/vision" in result.output


def test_policy_naming_a_missing_ost_or_mdt_fails_with_the_key(fake_lustre, tmp_path):
    data = policy_dict(fake_lustre)
    data["vcs"][1]["osts"] = [2, 9]
    result = run("apply", write_policy(fake_lustre, tmp_path, data))
    assert result.exit_code == 2
    assert "vcs[1].osts: OST index 9 does not exist in dltsfs (OSTs: 0, 1, 2, 3, 4, 5)" in result.output
    data = policy_dict(fake_lustre)
    data["vcs"][0]["mdt"] = 7
    result = run("apply", write_policy(fake_lustre, tmp_path, data))
    assert result.exit_code == 2 and "vcs[0].mdt: MDT 7 does not exist" in result.output


def test_bad_policy_file_names_the_key_without_a_traceback(fake_lustre, tmp_path):
    data = policy_dict(fake_lustre)
    data["vcs"][0]["pool"] = "a-pool-name-that-is-too-long"
    result = run("apply", write_policy(fake_lustre, tmp_path, data))
    assert result.exit_code == 2
    assert "vcs[0].pool: pool names are 1-15 characters" in result.output
    assert "Traceback" not in result.output


def test_a_failing_command_stops_apply_and_a_rerun_finishes(fake_lustre, tmp_path):
    fake_lustre.update(lambda s: s.setdefault("fail", {}).update(
        {"lfs project": {"rc": 95, "stderr": "lfs project: failed to set xattr: Operation not supported"}}))
    policy = write_policy(fake_lustre, tmp_path, small_policy(fake_lustre))
    result = run("apply", policy)
    assert result.exit_code == 1
    assert "`lfs project -p 1001 -s -r" in result.output and "Operation not supported" in result.output
    assert "earlier action(s) were applied, re-run apply" in result.output
    assert "Traceback" not in result.output
    fake_lustre.update(lambda s: s.pop("fail"))
    rerun = run("apply", policy)
    assert rerun.exit_code == 0, rerun.output
    assert "pool_new" not in rerun.output  # the pools were made by the first run
    assert fake_lustre.state()["dirs"][str(fake_lustre.mount / "vcs" / "vision")]["projid"] == 1001


def test_a_new_vc_from_the_control_plane_gets_its_directory_and_pool(fake_lustre):
    defaults = {"filesystem": {"name": "dltsfs", "mount": str(fake_lustre.mount)}, "vc_root": "vcs"}
    vcs = [{"name": "vision", "pool": "vc_vision", "osts": [0, 1], "mdt": 0, "project_id": 11}]
    client = LustreClient()
    apply_plan(build_plan(policy_from_vcs(vcs, defaults), client), client)
    vcs.append({"name": "nlp", "pool": "vc_nlp", "osts": "4-5", "mdt": "spread", "project_id": 12,
                "project_quota": {"block_soft": "1T", "block_hard": "2T"}})
    plan = build_plan(policy_from_vcs(vcs, defaults), client)
    assert {a.kind for a in plan.actions} == {ActionKind.POOL_NEW, ActionKind.POOL_ADD, ActionKind.MKDIR,
                                              ActionKind.SET_DIR_DEFAULT, ActionKind.SET_STRIPE,
                                              ActionKind.SET_PROJECT, ActionKind.SET_QUOTA}
    assert all("nlp" in a.command or "vc_nlp" in a.command or a.argv[:3] == ("lfs", "setquota", "-p")
               for a in plan.actions)
    apply_plan(plan, client)
    assert build_plan(policy_from_vcs(vcs, defaults), client).empty


def test_a_missing_mount_is_a_policy_error(fake_lustre, tmp_path):
    data = policy_dict(fake_lustre)
    data["filesystem"]["mount"] = str(tmp_path / "not-mounted")
    result = run("apply", write_policy(fake_lustre, tmp_path, data))
    assert result.exit_code == 2 and "does not exist on this host" in result.output


@pytest.mark.parametrize("version", ["2.10.8"])
def test_default_quota_on_an_old_release_is_a_clear_error(fake_lustre, tmp_path, version):
    fake_lustre.update(lambda s: s.update(version=version))
    result = run("apply", write_policy(fake_lustre, tmp_path, small_policy(fake_lustre)))
    assert result.exit_code == 1 and "need Lustre 2.12+" in result.output


def test_policy_from_mapping_matches_yaml(fake_lustre, tmp_path):
    assert load_policy(write_policy(fake_lustre, tmp_path)) == policy_from_mapping(policy_dict(fake_lustre))
