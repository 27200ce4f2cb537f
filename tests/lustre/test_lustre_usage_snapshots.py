"""The control plane on a real cluster's layout: `dlts managers` built from a dlts.yaml applies the VCs'
Lustre settings with the pool commands sent to the MGS (lustre_mgs_command), and records Lustre usage
per user and per VC from `lfs quota` (no tree walk) as a storage snapshot that GET /storage/usage,
/storage/snapshots and the Storage tab show. Against the stateful fake lfs/lctl; SQLite or MariaDB."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa
import yaml
from lustre_fixtures import MGS_PREFIX
from werkzeug.security import generate_password_hash

from dlts.config import load_settings
from dlts.managers.storage import LustreStorageManager, periodic_entries
from dlts.models import StorageSnapshot, User, VirtualCluster
from dlts.services import admin
from dlts_lustre.errors import LustreCommandError

GIB_KIB = 1024 * 1024


def _quota(used_kib: int, inodes: int, soft: int = 0) -> dict:
    return {"bs": soft, "bh": 0, "is": 0, "ih": 0, "used_kib": used_kib, "used_inodes": inodes, "explicit": True}


@pytest.fixture
def cluster(world, sessions, fake_lustre, tmp_path, database_url, monkeypatch):
    """Users with uids, VC vision (project 1001) and nlp (gid 2000 only), usage in the quota accounting,
    and the dlts.yaml a deployment renders; the MGS route comes from dlts.yaml only."""
    monkeypatch.delenv("DLTS_LUSTRE_MGS_COMMAND")
    with sessions() as s:
        for user in s.scalars(sa.select(User)):
            user.uid = {"alice": 1001, "bob": 1002}.get(user.name)
        s.execute(sa.update(VirtualCluster).where(VirtualCluster.name == "nlp").values(gid=2000))
        s.commit()
        admin.set_vc_lustre(s, "vision", {"pool": "vc_vision", "osts": "0-1", "mdt": "spread", "project_id": 1001,
                                          "default_dir_stripe_count": 2})
    fake_lustre.update(lambda st: st["quotas"].update({
        "u": {"1001": _quota(5 * GIB_KIB, 40_000, soft=4 * GIB_KIB), "1002": _quota(GIB_KIB, 10)},
        "p": {"1001": _quota(3 * GIB_KIB, 25_000)},
        "g": {"2000": _quota(7 * 1024, 3)}}))
    defaults = tmp_path / "lustre-defaults.yaml"
    defaults.write_text(yaml.safe_dump({"filesystem": {"name": "dltsfs", "mount": str(fake_lustre.mount)},
                                        "vc_root": "vcs"}))
    config = tmp_path / "dlts.yaml"
    config.write_text(yaml.safe_dump({"database_url": database_url, "secret_key": "test-secret-key-0123456789",
                                      "lustre_defaults_file": str(defaults), "lustre_mgs_command": MGS_PREFIX,
                                      "lustre_usage_interval_s": 600}))
    return config, defaults


def _login(app, sessions, name: str):
    password = f"{name}-lustre-pw-123"
    with sessions() as s:
        s.execute(sa.update(User).where(User.name == name)
                  .values(password_hash=generate_password_hash(password, method="scrypt:1024:8:1")))
        s.commit()
    client = app.test_client()
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/login").get_data(as_text=True)).group(1)
    assert client.post("/login", data={"username": name, "password": password, "csrf_token": token}).status_code == 302
    return client


def test_the_managers_apply_with_pools_on_the_mgs_and_record_usage_from_lfs_quota(
        cluster, world, sessions, fake_lustre, client, app):
    config, _ = cluster
    settings = load_settings(config, environ={})
    assert settings.lustre_mgs_command == tuple(MGS_PREFIX.split())
    entries = {e.id: e for e in periodic_entries(settings, sessions)}
    assert entries["storage.lustre_usage"].interval_s == 600.0
    entries["storage.lustre_apply"].run()
    state = fake_lustre.state()
    assert state["pools"] == {"vc_vision": [0, 1]}  # created through the MGS route
    vision = str(fake_lustre.mount / "vcs" / "vision")
    assert state["dirs"][vision]["default_dirstripe"] == {"count": 2, "offset": -1}

    fake_lustre.clear_calls()
    entries["storage.lustre_usage"].run()
    calls = fake_lustre.calls()
    assert ["lfs", "quota", "-q", "-u", "1001", str(fake_lustre.mount)] in calls
    assert ["lfs", "quota", "-q", "-p", "1001", str(fake_lustre.mount)] in calls
    assert ["lfs", "quota", "-q", "-g", "2000", str(fake_lustre.mount)] in calls
    assert not [c for c in calls if c[:2] in (["lfs", "find"], ["lfs", "getstripe"])]  # no tree walk
    rows = {(r["vc"], r["user"], r["directory"]): r for r in
            client.get("/api/v1/storage/usage", headers=world.auth("admin")).get_json()["rows"]
            if r["mount"] == str(fake_lustre.mount)}
    assert rows[(None, "alice", None)]["bytes_used"] == 5 * GIB_KIB * 1024 and rows[(None, "alice", None)]["files"] == 40_000
    assert rows[(None, "bob", None)]["bytes_used"] == GIB_KIB * 1024
    assert rows[("vision", None, None)]["bytes_used"] == 3 * GIB_KIB * 1024  # the project quota
    assert rows[("vision", None, "vcs/vision")]["files"] == 25_000
    assert rows[("nlp", None, None)]["bytes_used"] == 7 * 1024 * 1024  # the group quota
    total = rows[(None, None, None)]
    df_used_kib = sum(o["kib_used"] for o in state["osts"])
    assert total["bytes_used"] == df_used_kib * 1024
    snaps = client.get("/api/v1/storage/snapshots", query_string={"root": str(fake_lustre.mount)},
                       headers=world.auth("admin")).get_json()["items"]
    assert [s["kind"] for s in snaps] == ["lustre"] and snaps[0]["status"] == "complete"
    assert "alice" in snaps[0]["message"]  # over her soft limit (the * of lfs quota)
    assert snaps[0]["top_dirs"][0]["path"] == vision and snaps[0]["fs_total_bytes"] == 6000 * GIB_KIB * 1024
    page = _login(app, sessions, "admin").get("/storage").get_data(as_text=True)
    assert str(fake_lustre.mount) in page and "vcs/vision" in page


def test_without_the_mgs_route_the_pool_commands_fail_as_on_a_client(cluster, sessions, fake_lustre):
    _, defaults = cluster
    with pytest.raises(LustreCommandError, match="must be run on the MGS"):
        LustreStorageManager(sessions, defaults, mgs_command=()).run()
    assert fake_lustre.state()["pools"] == {}


def test_a_failing_quota_query_is_counted_and_the_rest_recorded(cluster, sessions, fake_lustre):
    _, defaults = cluster
    fake_lustre.update(lambda st: st["users"].pop("bob"))  # bob's uid is unknown to the fake: lfs quota fails
    fake_lustre.update(lambda st: st.update(fail={"lfs quota": {"rc": 5, "stderr": "quotactl failed"}}))
    result = LustreStorageManager(sessions, defaults).usage_once()
    assert result.status == "complete" and result.errors == 4  # alice, bob, vision, nlp
    with sessions() as s:
        assert s.scalar(sa.select(StorageSnapshot.errors).where(StorageSnapshot.root == str(fake_lustre.mount))) == 4
