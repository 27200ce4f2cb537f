"""The storage manager against the database (SQLite, or MariaDB with DLTS_TEST_DATABASE_URL): scans as
snapshots read by GET /storage/usage, /storage/snapshots and the Storage tab; the alert mail through
the real notifier and an in-process SMTP server, once per crossing; expiry's warning, then deletion,
recorded; a hung mount recorded without hiding the last complete scan; the registration from a
dlts.yaml through the factory; dlts storage expire by hand."""

from __future__ import annotations

import csv
import functools
import io
import json
import os
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml
from click.testing import CliRunner

from dlts.config import load_settings
from dlts.managers.notify import NotifyManager
from dlts.managers.storage import StorageManager, periodic_entries
from dlts.models import (
    OutboxMessage,
    StorageExpiryLog,
    StorageSnapshot,
    StorageUsage,
    User,
)
from dlts.storage import scan as scan_module
from dlts.storage.scan import scan_root
from dlts.storage.settings import StorageRoot, StorageSettings
from tests.smtp_server import with_notify

DAY = 86400.0
ALICE_UID, BOB_UID = 3001, 3002


@pytest.fixture
def people(world, sessions):
    with sessions() as s:
        for user in s.scalars(sa.select(User)):
            user.email = f"{user.name}@example.org"
            user.uid = {"alice": ALICE_UID, "bob": BOB_UID}.get(user.name)
        s.commit()
    return world


@pytest.fixture
def nfs(tmp_path) -> Path:
    root = tmp_path / "nfs"
    for rel, size, uid in (("alice/big.bin", 3_000_000, ALICE_UID), ("alice/run/x.bin", 10_000, ALICE_UID),
                           ("bob/small.bin", 5_000, BOB_UID), ("scratch/bob/old.log", 2_000, BOB_UID)):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
        os.lchown(path, uid, -1)
    os.lchown(root / "alice", ALICE_UID, -1)
    os.lchown(root / "bob", BOB_UID, -1)
    os.lchown(root / "scratch" / "bob", BOB_UID, -1)
    return root


def with_storage(settings, **storage):
    return settings.model_copy(update={"storage": StorageSettings(**storage)})


def test_a_scan_becomes_a_snapshot_the_api_and_the_storage_tab_read(people, sessions, settings, nfs, client, as_user):
    root = StorageRoot(path=nfs, vc_dirs={"alice": "vision"})
    manager = StorageManager(sessions, with_storage(settings, roots=[root], keep_snapshots=2))
    [result] = manager.scan_once()
    assert result.status == "complete"
    body = client.get("/api/v1/storage/usage", headers=people.auth("admin")).get_json()
    rows = {(r["vc"], r["user"], r["directory"]): r for r in body["rows"]}
    assert rows[(None, None, None)]["files"] == 4 and rows[(None, None, None)]["apparent_bytes"] == 3_017_000
    assert rows[("vision", "alice", None)]["apparent_bytes"] == 3_010_000
    assert rows[("vision", None, None)]["files"] == 2
    assert rows[(None, "bob", None)]["files"] == 2
    assert rows[("vision", "alice", "alice")]["files"] == 2  # the top-level directory, its owner and VC
    assert rows[(None, None, None)]["previous_bytes_used"] is None

    # bob (a member of vision): vision's total and his own rows, not alice's nor the mount's
    mine = client.get("/api/v1/storage/usage", headers=people.auth("bob")).get_json()["rows"]
    assert {(r["vc"], r["user"], r["directory"]) for r in mine} == {
        key for key in rows if key[1] == "bob"} | {("vision", None, None)}
    (nfs / "bob" / "more.bin").write_bytes(os.urandom(100_000))
    manager.scan_once()
    body = client.get("/api/v1/storage/usage", headers=people.auth("admin")).get_json()
    total = next(r for r in body["rows"] if (r["vc"], r["user"], r["directory"]) == (None, None, None))
    assert total["files"] == 5 and total["previous_bytes_used"] < total["bytes_used"]  # the trend
    manager.scan_once()
    with sessions() as s:  # keep_snapshots: 2; the rows of older snapshots go with them
        assert s.scalar(sa.select(sa.func.count()).select_from(StorageSnapshot)) == 2
        assert s.scalar(sa.select(sa.func.count(sa.distinct(StorageUsage.snapshot_id)))) == 2

    snaps = client.get("/api/v1/storage/snapshots", query_string={"root": str(nfs)}, headers=people.auth("admin")).get_json()
    assert len(snaps["items"]) == 2 and snaps["items"][0]["status"] == "complete"
    assert snaps["items"][0]["top_dirs"][0]["path"] == str(nfs / "alice") and snaps["items"][0]["fs_total_bytes"] > 0
    theirs = client.get("/api/v1/storage/snapshots", query_string={"root": str(nfs)}, headers=people.auth("carol")).get_json()
    assert theirs["items"][0]["fs_total_bytes"] > 0 and theirs["items"][0]["top_dirs"] == []  # no paths
    assert client.get("/api/v1/storage/snapshots?limit=0", headers=people.auth("bob")).status_code == 400

    page = as_user("admin").get("/storage").get_data(as_text=True)
    assert 'id="storage-scans"' in page and 'id="storage-dirs"' in page and str(nfs) in page
    exported = list(csv.DictReader(io.StringIO(as_user("admin").get("/storage?format=csv").get_data(as_text=True))))
    assert {r["directory"] for r in exported} >= {"alice", "bob", "scratch"}
    exported = list(csv.DictReader(io.StringIO(as_user("bob").get("/storage?format=csv").get_data(as_text=True))))
    assert {r["directory"] for r in exported} >= {"bob"} and "alice" not in {r["directory"] for r in exported}


def test_the_alert_mails_admins_and_owners_of_the_biggest_paths_once_per_crossing(
        people, sessions, settings, nfs, smtp_server):
    low = StorageRoot(path=nfs, alert_percent=0.001)  # any real file system is fuller than that
    high = StorageRoot(path=nfs, alert_percent=100)
    manager = StorageManager(sessions, with_storage(settings, roots=[low]))
    manager.scan_once()
    manager.scan_once()  # still above: no second alert

    def alerts():
        with sessions() as s:
            return s.scalars(sa.select(OutboxMessage).where(OutboxMessage.template == "storage_alert")
                             .order_by(OutboxMessage.id)).all()

    [first] = alerts()
    assert first.recipients == ["admin@example.org", "alice@example.org", "bob@example.org"]
    notifier = NotifyManager(sessions, with_notify(settings, smtp_port=smtp_server.port))
    notifier.run_once()
    [mail] = smtp_server.received
    assert f"{nfs} is " in mail.message["Subject"] and "% full (alert at 0.001%)" in mail.message["Subject"]
    assert str(nfs / "alice") in mail.body and "alice" in mail.body and set(mail.rcpt_tos) == set(first.recipients)

    StorageManager(sessions, with_storage(settings, roots=[high])).scan_once()  # below the threshold again
    manager.scan_once()  # a new crossing: a new alert
    assert len(alerts()) == 2


def test_a_hung_mount_is_a_snapshot_and_the_last_complete_scan_stays_shown(people, sessions, settings, nfs, client,
                                                                          as_user):
    root = StorageRoot(path=nfs)
    StorageManager(sessions, with_storage(settings, roots=[root])).scan_once()
    release = threading.Event()

    def list_dir(path):
        if path.endswith("/bob"):
            release.wait(30)
        return scan_module._list_dir(path)

    hung = StorageManager(sessions, with_storage(settings, roots=[root], dir_timeout_s=0.3),
                          scan=functools.partial(scan_root, list_dir=list_dir))
    try:
        started = time.monotonic()
        [result] = hung.scan_once()
        assert result.status == "hung" and time.monotonic() - started < 5
    finally:
        release.set()
    items = client.get("/api/v1/storage/snapshots", headers=people.auth("admin")).get_json()["items"]
    assert [i["status"] for i in items] == ["hung", "complete"] and "hung" in items[0]["message"]
    rows = client.get("/api/v1/storage/usage", headers=people.auth("admin")).get_json()["rows"]
    assert any(r["files"] == 4 for r in rows if r["user"] is None and r["directory"] is None)
    page = as_user("admin").get("/storage").get_data(as_text=True)
    scans = page[page.index('id="storage-scans"'):page.index("</table>", page.index('id="storage-scans"'))]
    assert f"<code>{nfs}</code>" in scans and 'class="warn">hung: ' in scans and 'id="storage-users"' in page
    page = as_user("bob").get("/storage").get_data(as_text=True)  # the outcome, not the message (it names paths)
    scans = page[page.index('id="storage-scans"'):page.index("</table>", page.index('id="storage-scans"'))]
    assert 'class="warn">hung<' in scans and 'class="warn">hung: ' not in scans


def test_expiry_warns_first_then_deletes_and_records_per_owner(people, sessions, settings, nfs, smtp_server):
    root = StorageRoot(path=nfs, expire_after_days=30, warn_days=5, expire_paths=("scratch/*",))
    at = [time.time() + 31 * DAY]
    manager = StorageManager(sessions, with_storage(settings, roots=[root]), now=lambda: at[0])
    report, = manager.expire_once()
    assert not report.deleted and report.held["bob"].files == 1  # never warned: nothing goes yet
    assert (nfs / "scratch" / "bob" / "old.log").exists()
    with sessions() as s:
        [warning] = s.scalars(sa.select(OutboxMessage).where(OutboxMessage.template == "storage_expiry_warning")).all()
        assert warning.recipients == ["bob@example.org"]
    manager.expire_once()  # the same day again: no second warning
    NotifyManager(sessions, with_notify(settings, smtp_port=smtp_server.port)).run_once()
    [mail] = smtp_server.received
    assert str(nfs / "scratch" / "bob" / "old.log") in mail.body and ".dlts-keep" in mail.body

    at[0] += 5 * DAY + 60  # the warning is warn_days old
    report, = manager.expire_once()
    assert report.deleted["bob"].files == 1 and not (nfs / "scratch" / "bob" / "old.log").exists()
    with sessions() as s:
        logged = s.execute(sa.select(StorageExpiryLog.owner, StorageExpiryLog.action, StorageExpiryLog.files,
                                     StorageExpiryLog.bytes).order_by(StorageExpiryLog.id)).all()
    assert [(o, a, f) for o, a, f, _b in logged] == [("bob", "warned", 1), ("bob", "deleted", 1)]
    assert logged[1][3] > 0


def test_the_managers_register_storage_from_a_dlts_yaml_through_the_factory(people, sessions, settings, nfs, tmp_path,
                                                                          database_url):
    config = tmp_path / "dlts.yaml"
    config.write_text(yaml.safe_dump({
        "database_url": database_url, "secret_key": settings.secret_key,
        "storage": {"scan_interval_s": 600, "expire_interval_s": 3600, "threads_per_root": 2,
                    "roots": [{"path": str(nfs), "kind": "nfs", "uid_owners": {4000: "svc"},
                               "vc_dirs": {"alice": "vision"}},
                              {"path": str(nfs / "scratch"), "kind": "local", "owner_by": "directory",
                               "expire_after_days": 14, "warn_days": 3, "expire_paths": ["*"]}]}}))
    loaded = load_settings(config, environ={})
    entries = periodic_entries(loaded, sessions)
    assert [(e.id, e.interval_s) for e in entries] == [("storage.scan", 600.0), ("storage.expire", 3600.0)]
    entries[0].run()
    with sessions() as s:
        assert sorted(s.scalars(sa.select(StorageSnapshot.root))) == [str(nfs), str(nfs / "scratch")]
        owners = set(s.scalars(sa.select(StorageUsage.user).where(StorageUsage.mount == str(nfs / "scratch"))))
    assert "bob" in owners  # owner_by: directory
    assert periodic_entries(load_settings(None, environ={}), sessions) == []
    from_env = load_settings(config, environ={"DLTS_STORAGE__SCAN_INTERVAL_S": "900"})
    assert periodic_entries(from_env, sessions)[0].interval_s == 900.0 and len(from_env.storage.roots) == 2

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"storage": {"roots": [{"path": "relative/dir"}]}}))
    with pytest.raises(Exception, match="storage.roots.0.path"):
        load_settings(bad, environ={})
    bad.write_text(yaml.safe_dump({"storage": {"roots": [{"path": "/x", "expire_after_days": 3}]}}))
    with pytest.raises(Exception, match="needs expire_paths"):
        load_settings(bad, environ={})


def test_dlts_storage_expire_dry_run_lists_what_would_go_and_changes_nothing(people, settings, nfs, tmp_path,
                                                                           database_url, sessions):
    config = tmp_path / "dlts.yaml"
    config.write_text(yaml.safe_dump({"database_url": database_url, "secret_key": settings.secret_key, "storage": {
        "roots": [{"path": str(nfs), "expire_after_days": 30, "warn_days": 0, "expire_paths": ["scratch/*"]}]}}))
    from dlts.cli import main

    runner = CliRunner()
    time.sleep(1.0)  # the files' ctime cannot be set back: they become older than 0.00001 days (0.86 s)
    out = runner.invoke(main, ["--config", str(config), "storage", "expire", str(nfs), "--older-than-days", "0.00001",
                               "--dry-run", "--json"], env={"DLTS_CONFIG": None, "DLTS_HOME": None})
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert [i["path"] for i in doc["items"]] == [str(nfs / "scratch" / "bob" / "old.log"), str(nfs / "scratch" / "bob")]
    assert doc["deleted"]["bob"] == {"files": 1, "dirs": 1, "bytes": doc["items"][0]["bytes"]} and doc["dry_run"]
    assert (nfs / "scratch" / "bob" / "old.log").exists()
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(StorageExpiryLog)) == 0
    unknown = runner.invoke(main, ["--config", str(config), "storage", "expire", str(tmp_path)], env={"DLTS_CONFIG": None})
    assert unknown.exit_code == 2 and "is not in storage.roots" in unknown.output
    real = runner.invoke(main, ["--config", str(config), "storage", "expire", str(nfs), "--older-than-days", "0.00001"],
                         env={"DLTS_CONFIG": None, "DLTS_HOME": None})
    assert real.exit_code == 0 and "bob: 1 file(s), 1 dir(s)" in real.output and not (nfs / "scratch" / "bob").exists()


def test_dlts_storage_scan_record_writes_a_snapshot_of_a_configured_root(people, settings, nfs, tmp_path, database_url,
                                                                        sessions):
    config = tmp_path / "dlts.yaml"
    config.write_text(yaml.safe_dump({"database_url": database_url, "secret_key": settings.secret_key,
                                      "storage": {"roots": [{"path": str(nfs)}]}}))
    from dlts.cli import main

    out = CliRunner().invoke(main, ["--config", str(config), "storage", "scan", "--record", str(nfs)],
                             env={"DLTS_CONFIG": None, "DLTS_HOME": None})
    assert out.exit_code == 0, out.output
    assert "user alice: " in out.output  # the database's uid of alice names her files
    with sessions() as s:
        assert s.scalar(sa.select(StorageSnapshot.status).where(StorageSnapshot.root == str(nfs))) == "complete"
    refused = CliRunner().invoke(main, ["--config", str(config), "storage", "scan", "--record", str(tmp_path)],
                                 env={"DLTS_CONFIG": None, "DLTS_HOME": None})
    assert refused.exit_code == 2 and "not in storage.roots" in refused.output


def test_names_that_are_not_utf8_reach_the_snapshot_the_api_and_the_csv(people, sessions, settings, nfs, client, as_user):
    odd = os.path.join(os.fsencode(nfs), b"r\xe9sultats")  # Latin-1 bytes, as an old client wrote them
    os.mkdir(odd)
    with open(os.path.join(odd, b"\xff.bin"), "wb") as f:
        f.write(os.urandom(40_000_000))  # the biggest directory: its path is in top_dirs too
    os.lchown(odd, BOB_UID, -1)
    manager = StorageManager(sessions, with_storage(settings, roots=[StorageRoot(path=nfs)]))
    [result] = manager.scan_once()
    assert result.status == "complete"
    body = client.get("/api/v1/storage/usage", headers=people.auth("bob")).get_json()
    shown = {r["directory"]: r for r in body["rows"] if r["directory"] is not None}
    assert shown["r\\xe9sultats"]["files"] == 1 and shown["r\\xe9sultats"]["apparent_bytes"] == 40_000_000
    snaps = client.get("/api/v1/storage/snapshots", headers=people.auth("admin")).get_json()
    assert snaps["items"][0]["top_dirs"][0]["path"] == str(nfs / "r\\xe9sultats")
    exported = as_user("bob").get("/storage?format=csv")
    assert exported.status_code == 200 and "r\\xe9sultats" in exported.get_data(as_text=True)


def test_expiry_of_a_name_that_is_not_utf8_warns_by_mail_and_deletes_it(people, sessions, settings, nfs, smtp_server):
    odd = os.path.join(os.fsencode(nfs / "scratch" / "bob"), b"\xe9t\xe9.log")
    with open(odd, "wb") as f:
        f.write(b"z" * 5000)
    os.lchown(odd, BOB_UID, -1)
    root = StorageRoot(path=nfs, expire_after_days=30, warn_days=5, expire_paths=("scratch/*",))
    at = [time.time() + 31 * DAY]
    manager = StorageManager(sessions, with_storage(settings, roots=[root]), now=lambda: at[0])
    report, = manager.expire_once()
    assert report.held["bob"].files == 2
    NotifyManager(sessions, with_notify(settings, smtp_port=smtp_server.port)).run_once()
    [mail] = smtp_server.received
    assert str(nfs / "scratch" / "bob" / "\\xe9t\\xe9.log") in mail.body  # as `ls -b` writes it
    at[0] += 5 * DAY + 60
    report, = manager.expire_once()
    assert report.deleted["bob"].files == 2 and not os.path.lexists(odd)
