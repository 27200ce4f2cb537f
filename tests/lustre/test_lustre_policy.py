"""Policy schema: good files load; bad ones give a PolicyError naming the key; the VC hook."""
from __future__ import annotations

import pytest

from dlts_lustre.errors import PolicyError
from dlts_lustre.policy import load_policy, policy_from_mapping, policy_from_vcs

EXAMPLE = __import__("pathlib").Path(__file__).parents[2] / "lustre" / "examples" / "policy.yaml"
FS = {"name": "dltsfs", "mount": "/mnt/dltsfs"}


def test_the_sample_policy_loads():
    policy = load_policy(EXAMPLE)
    assert policy.filesystem.name == "dltsfs"
    assert [vc.pool for vc in policy.vcs] == ["vc_vision", "vc_speech"]
    assert policy.vcs[1].osts == (2, 3) and policy.vcs[1].mdt == "spread"
    assert policy.user_quota.default.block_soft == 500 * 1024**2
    assert policy.user_quota.grace.block == 604800
    assert policy.vc_path(policy.vcs[0]) == "/mnt/dltsfs/vcs/vision"


def _vc(**overrides):
    base = {"name": "a", "directory": "vcs/a", "pool": "vc_a", "osts": [0]}
    base.update(overrides)
    return base


@pytest.mark.parametrize("data, key", [
    ({"filesystem": FS, "vcs": [_vc(pool="this_name_is_too_long")]}, "vcs[0].pool"),
    ({"filesystem": FS, "vcs": [_vc(pool="none")]}, "vcs[0].pool"),
    ({"filesystem": FS, "vcs": [_vc(osts=[])]}, "vcs[0].osts"),
    ({"filesystem": FS, "vcs": [_vc(osts="3-1")]}, "vcs[0].osts"),
    ({"filesystem": FS, "vcs": [_vc(directory="/abs")]}, "vcs[0].directory"),
    ({"filesystem": FS, "vcs": [_vc(directory="../up")]}, "vcs[0].directory"),
    ({"filesystem": FS, "vcs": [_vc(mdt="everywhere")]}, "vcs[0].mdt"),
    ({"filesystem": FS, "vcs": [_vc(project_quota={"block_soft": "1T"})]}, "vcs[0]"),
    ({"filesystem": FS, "vcs": [_vc(project_id=5, project_quota={"block_soft": 500})]},
     "vcs[0].project_quota.block_soft"),
    ({"filesystem": FS, "user_quota": {"default": {"block_soft": "2T", "block_hard": "1T"}}}, "user_quota.default"),
    ({"filesystem": FS, "user_quota": {"grace": {"block": "soon"}}}, "user_quota.grace.block"),
    ({"filesystem": FS, "user_quota": {"overrides": {"bob": {"blok_soft": "1T"}}}},
     "user_quota.overrides.bob.blok_soft"),
    ({"filesystem": {"name": "dltsfs", "mount": "relative"}}, "filesystem.mount"),
    ({"filesystem": FS, "vcs": [_vc(), _vc(name="b", directory="vcs/b")]}, "vcs[1].pool"),
    ({"filesystem": FS, "colour": "blue"}, "colour"),
    ({"vcs": []}, "filesystem"),
])
def test_invalid_policies_name_the_key(data, key):
    with pytest.raises(PolicyError) as info:
        policy_from_mapping(data)
    assert f"  {key}" in str(info.value) or f"{key} " in str(info.value), str(info.value)


def test_unreadable_and_non_yaml_files(tmp_path):
    with pytest.raises(PolicyError, match="cannot read policy"):
        load_policy(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("filesystem: {name: x\n")
    with pytest.raises(PolicyError, match="not valid YAML at line"):
        load_policy(bad)
    bad.write_text("- just\n- a list\n")
    with pytest.raises(PolicyError, match="top level must be a mapping"):
        load_policy(bad)


def test_policy_from_vcs_builds_directories_under_the_vc_root():
    policy = policy_from_vcs(
        [{"name": "vision", "pool": "vc_vision", "osts": "0-1", "mdt": 1, "project_id": 11,
          "project_quota": {"block_soft": "10T", "block_hard": "12T"}},
         {"name": "speech", "pool": "vc_speech", "osts": [2], "mdt": "spread"}],
        {"filesystem": FS, "vc_root": "teams", "user_quota": {"default": {"block_soft": "1T", "block_hard": "2T"}}})
    assert [vc.directory for vc in policy.vcs] == ["teams/vision", "teams/speech"]
    assert policy.vcs[0].osts == (0, 1) and policy.vcs[0].project_quota.block_hard == 12 * 1024**3
    assert policy.user_quota.default.block_hard == 2 * 1024**3


def test_policy_from_vcs_names_the_vc_in_errors():
    with pytest.raises(PolicyError, match=r"vcs\[vision\]\.pool"):
        policy_from_vcs([{"name": "vision", "pool": "bad pool!", "osts": [0]}], {"filesystem": FS})
    with pytest.raises(PolicyError, match="filesystem"):
        policy_from_vcs([], {})
