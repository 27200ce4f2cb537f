"""`dlts-lustre status` and `dlts-lustre quota`, text and --json, against the fake; error exits."""
from __future__ import annotations

import json

from click.testing import CliRunner

from dlts_lustre.cli import main
from dlts_lustre.client import LustreClient, cmd_pool_add, cmd_pool_new, cmd_setquota
from dlts_lustre.model import QuotaKind, QuotaLimits

GIB = 1024 * 1024


def run(*args):
    return CliRunner().invoke(main, list(args))


def _populate(fake):
    client = LustreClient()
    client.execute(cmd_pool_new("dltsfs", "vc_a"))
    client.execute(cmd_pool_add("dltsfs", "vc_a", [0, 1]))
    client.execute(cmd_pool_new("dltsfs", "empty"))
    client.execute(cmd_setquota(QuotaKind.USER, "alice", str(fake.mount), QuotaLimits(10 * GIB, 20 * GIB, 0, 0)))

    def usage(state):
        state["quotas"]["u"]["1001"].update(used_kib=15 * GIB, used_inodes=7)
        state["quotas"]["u"]["1002"] = {"bs": 0, "bh": 0, "is": 0, "ih": 0, "used_kib": 3 * GIB,
                                        "used_inodes": 2, "explicit": False}
        state["osts"][5]["active"] = False
        state["osts"][4]["flags"] = "DN"
    fake.update(usage)


def test_status_text_shows_health_targets_pools_and_top_users(fake_lustre_any):
    _populate(fake_lustre_any)
    result = run("status", str(fake_lustre_any.mount), "--user", "bob", "--user", "alice", "--top", "5")
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"dltsfs on {fake_lustre_any.mount}" in out and ": healthy" in out
    assert "dltsfs-OST0005_UUID" in out and "inactive" in out
    assert "DN" in out
    assert "vc_a" in out and "0,1" in out and "(empty)" in out
    users = out[out.index("top users:"):]
    assert users.index("alice") < users.index("bob")  # sorted by usage
    assert "alice *" in users  # over her soft limit


def test_status_json_is_machine_readable(fake_lustre):
    _populate(fake_lustre)
    fake_lustre.update(lambda s: s.update(health="device dltsfs-OST0003 reported unhealthy\nNOT HEALTHY"))
    result = run("status", str(fake_lustre.mount), "--user", "alice", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["health"]["state"] == "unhealthy"
    assert data["health"]["unhealthy_devices"] == ["dltsfs-OST0003"]
    pool = next(p for p in data["pools"] if p["name"] == "vc_a")
    assert pool["total_kib"] == 2 * 1000 * GIB and pool["ost_indices"] == [0, 1]
    assert data["top_users"][0]["user"] == "alice" and data["top_users"][0]["used_kib"] == 15 * GIB
    assert {t["kind"] for t in data["targets"]} == {"MDT", "OST"}


def test_status_takes_the_mount_and_users_from_a_policy(fake_lustre, tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text(f"filesystem: {{name: dltsfs, mount: {fake_lustre.mount}}}\n"
                      "user_quota: {overrides: {carol: {block_soft: 1T, block_hard: 2T}}}\n")
    result = run("status", "--policy", str(policy), "--json")
    assert result.exit_code == 0, result.output
    assert [u["user"] for u in json.loads(result.output)["top_users"]] == ["carol"]


def test_quota_text_and_json(fake_lustre_any):
    _populate(fake_lustre_any)
    mount = str(fake_lustre_any.mount)
    text = run("quota", "--user", "alice", mount)
    assert text.exit_code == 0, text.output
    assert "Quota for user alice (id 1001)" in text.output and "15.0 GiB*" in text.output
    as_json = run("quota", "--user", "alice", mount, "--json", "-v")
    data = json.loads(as_json.output)
    assert data["lustre_version"] in ("2.15.4", "2.16.52")
    assert data["numeric_id"] == 1001 and data["total"]["block_over_limit"] is True
    assert data["total"]["block_grace"]["state"] == "running"
    assert any(t["inactive"] for t in data["targets"])


def test_quota_for_a_project_and_a_group(fake_lustre):
    mount = str(fake_lustre.mount)
    assert run("quota", "--project", "1001", mount).exit_code == 0
    result = run("quota", "--group", "research", mount, "--json")
    assert json.loads(result.output)["kind"] == "g"


def test_quota_needs_a_kind_and_reports_command_errors(fake_lustre, tmp_path):
    assert run("quota", "alice", str(fake_lustre.mount)).exit_code == 2
    wrong = run("quota", "--user", "alice", str(tmp_path))
    assert wrong.exit_code == 1
    assert "error: `lfs quota -u alice" in wrong.output and "not on a Lustre filesystem" in wrong.output
    unknown = run("quota", "--user", "mallory", str(fake_lustre.mount))
    assert unknown.exit_code == 1 and "can't find user 'mallory'" in unknown.output


def test_unparseable_output_is_a_clean_error(fake_lustre):
    fake_lustre.update(lambda s: s.setdefault("raw", {}).update({"lfs df": "lfs df: garbage\n"}))
    result = run("status", str(fake_lustre.mount))
    assert result.exit_code == 1
    assert "cannot parse lfs df" in result.output and "Traceback" not in result.output


def test_console_script_is_installed():
    import shutil
    import subprocess
    import sys
    from pathlib import Path
    script = shutil.which("dlts-lustre") or str(Path(sys.executable).parent / "dlts-lustre")
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "apply" in result.stdout
