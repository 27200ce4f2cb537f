"""The storage manager applies each VC's Lustre settings through dlts_lustre, against the fake lfs/lctl."""

from __future__ import annotations

import pytest
import yaml

from dlts.errors import InvalidInput
from dlts.managers.storage import LustreStorageManager, StorageConfigError
from dlts.services import admin


@pytest.fixture
def defaults_file(tmp_path, fake_lustre):
    path = tmp_path / "lustre-defaults.yaml"
    path.write_text(yaml.safe_dump({
        "filesystem": {"name": "dltsfs", "mount": str(fake_lustre.mount)},
        "vc_root": "vcs",
        "user_quota": {"default": {"block_soft": "1T", "block_hard": "2T", "inode_soft": 1000000, "inode_hard": 2000000},
                       "grace": {"block": "1w", "inode": "1w"}},
    }))
    return path


def test_a_new_vc_gets_its_pool_and_directory_and_a_second_pass_does_nothing(world, sessions, fake_lustre, defaults_file):
    with sessions() as s:
        admin.set_vc_lustre(s, "vision", {"pool": "vc_vision", "osts": "0-1", "mdt": 1, "project_id": 1001})
    manager = LustreStorageManager(sessions, defaults_file)
    result = manager.run()
    assert result is not None and result.executed
    state = fake_lustre.state()
    assert "vc_vision" in state["pools"]
    assert "vcs/vision" in str(state["dirs"])
    fake_lustre.clear_calls()
    assert manager.run() is None  # nothing changed: nothing to do
    assert fake_lustre.mutating_calls() == []


def test_bad_vc_settings_are_refused_naming_the_key(world, sessions):
    with sessions() as s, pytest.raises(InvalidInput, match=r"vcs\[vision\]\.osts"):
        admin.set_vc_lustre(s, "vision", {"pool": "vc_vision", "osts": "zero"})


def test_a_bad_defaults_file_stops_the_manager_naming_the_problem(world, sessions, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("filesystem: {name: dltsfs}\n")  # no mount
    with pytest.raises(StorageConfigError, match="mount"):
        LustreStorageManager(sessions, path).check()
