"""The runner against the fake executables: errors name the command, timeouts, dry-run recording."""
from __future__ import annotations

import pytest

from dlts_lustre.errors import LustreCommandError
from dlts_lustre.runner import Runner


def test_runs_a_tool_and_returns_its_output(fake_lustre):
    result = Runner().run(("lfs", "--version"))
    assert result.exit_code == 0 and result.stdout == "lfs 2.15.4\n"


def test_failure_raises_a_typed_error_naming_the_command_and_stderr(fake_lustre):
    fake_lustre.update(lambda s: s.setdefault("fail", {}).update(
        {"lfs df": {"rc": 5, "stderr": "lfs df: cannot get statfs: Input/output error"}}))
    with pytest.raises(LustreCommandError) as info:
        Runner().run(("lfs", "df", str(fake_lustre.mount)))
    err = info.value
    assert err.exit_code == 5 and err.command == ("lfs", "df", str(fake_lustre.mount))
    assert f"`lfs df {fake_lustre.mount}` exited with status 5" in str(err)
    assert "Input/output error" in str(err)


def test_expected_nonzero_exit_codes_are_accepted(fake_lustre):
    fake_lustre.update(lambda s: s.setdefault("fail", {}).update({"lfs df": {"rc": 5, "stderr": "x"}}))
    assert Runner().run(("lfs", "df"), ok_codes=(0, 5)).exit_code == 5


def test_timeout_raises_a_typed_error(fake_lustre):
    fake_lustre.update(lambda s: s.setdefault("sleep_s", {}).update({"lfs df": 5}))
    with pytest.raises(LustreCommandError, match="timed out after 0.5 s") as info:
        Runner(timeout_s=0.5).run(("lfs", "df"))
    assert info.value.timed_out


def test_missing_tool_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LustreCommandError, match="lfs not found on PATH"):
        Runner().run(("lfs", "--version"))


def test_only_lfs_and_lctl_may_be_run():
    with pytest.raises(ValueError):
        Runner().run(("rm", "-rf", "/"))


def test_dry_run_records_mutations_but_still_reads(fake_lustre):
    runner = Runner(dry_run=True)
    runner.run(("lctl", "pool_new", "dltsfs.p1"), mutating=True)
    assert runner.run(("lctl", "pool_list", "dltsfs")).stdout == "Pools from dltsfs:\n"
    assert runner.recorded == [("lctl", "pool_new", "dltsfs.p1")]
    assert fake_lustre.state()["pools"] == {}
    assert [c[1] for c in fake_lustre.calls()] == ["pool_list"]


def test_the_command_history_is_bounded_for_long_lived_collectors(fake_lustre, monkeypatch):
    monkeypatch.setattr("dlts_lustre.runner.EXECUTED_KEPT", 2)
    runner = Runner()
    for _ in range(3):
        runner.run(("lfs", "--version"))
    assert len(runner.executed) == 2 and runner.call_count == 3
