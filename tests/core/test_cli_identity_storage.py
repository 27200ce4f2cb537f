"""`dlts user add/set --uid --gid`, `dlts vc set --gid --ephemeral-storage` and `dlts vc storage`: idempotent,
saying what they did (Ansible's changed_when reads the output), refusing bad input with the field's name."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from dlts.cli import main
from dlts.models import User, VcEvent, VirtualCluster


@pytest.fixture
def dlts(settings, monkeypatch):
    monkeypatch.setenv("DLTS_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("DLTS_HOME", str(settings.home))

    def run(*args: str):
        result = CliRunner().invoke(main, list(args))
        return result.exit_code, result.output.strip()

    return run


def identity(sessions, name):
    with sessions() as s:
        return s.execute(sa.select(User.uid, User.gid).where(User.name == name)).one_or_none()


def vc_row(sessions, name):
    with sessions() as s:
        return s.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == name))


def test_user_add_with_uid_and_gid_then_set_reports_what_changed(dlts, sessions):
    assert dlts("user", "add", "dana", "--uid", "20005", "--gid", "20000") == (0, "user dana added, uid 20005 gid 20000")
    assert tuple(identity(sessions, "dana")) == (20005, 20000)
    assert dlts("user", "set", "dana", "--uid", "20005", "--gid", "20000") == (0, "user dana unchanged")
    assert dlts("user", "set", "dana", "--gid", "20001") == (0, "user dana updated: gid 20000 -> 20001")
    assert tuple(identity(sessions, "dana")) == (20005, 20001)


@pytest.mark.parametrize("args, message", [
    (["add", "erin", "--uid", "0", "--gid", "1000"], "root"),
    (["add", "erin", "--uid", "500", "--gid", "1000"], "below 1000 belong to the system"),
    (["add", "erin", "--uid", "20010"], "both a uid and a gid"),
    (["add", "erin", "--uid", "-3", "--gid", "1000"], "--uid"),
])
def test_user_add_refuses_bad_ids_and_adds_nobody(dlts, sessions, args, message):
    code, output = dlts("user", *args)
    assert code != 0 and message in output, output
    assert identity(sessions, "erin") is None


def test_user_set_refuses_a_taken_uid_and_an_unknown_user(dlts, sessions):
    dlts("user", "add", "dana", "--uid", "20005", "--gid", "20000")
    dlts("user", "add", "erin")
    code, output = dlts("user", "set", "erin", "--uid", "20005", "--gid", "20000")
    assert code != 0 and "already belongs to user dana" in output
    assert tuple(identity(sessions, "erin")) == (None, None)
    code, output = dlts("user", "set", "nobody", "--uid", "20006", "--gid", "20000")
    assert code != 0 and "No user named 'nobody'" in output
    code, output = dlts("user", "set", "erin")
    assert code != 0 and "--uid and/or --gid" in output


def test_vc_set_changes_group_and_scratch_space_only_when_given(dlts, sessions):
    assert dlts("vc", "set", "research", "--gid", "30000", "--ephemeral-storage", "20Gi") == (
        0, "VC research added: quota {}, policy RF, gid 30000, ephemeral_storage_bytes 21474836480")
    assert dlts("vc", "set", "research") == (0, "VC research unchanged")
    vc = vc_row(sessions, "research")
    assert (vc.gid, vc.ephemeral_storage_bytes) == (30000, 20 * 2**30)
    assert dlts("vc", "set", "research", "--gid", "none", "--ephemeral-storage", "none") == (
        0, "VC research updated: gid 30000 -> None; ephemeral_storage_bytes 21474836480 -> None")
    code, output = dlts("vc", "set", "research", "--gid", "12")
    assert code != 0 and "gid 12 is outside 1000" in output
    code, output = dlts("vc", "set", "research", "--ephemeral-storage", "lots")
    assert code != 0 and "--ephemeral-storage" in output


STORAGE = {"nfs": [{"name": "data", "server": "10.0.0.5", "path": "/export/research", "mount_path": "/data"}],
           "home": {"kind": "host", "path": "/mnt/home", "mount_path": "/home"}}


def test_vc_storage_sets_the_whole_document_idempotently_and_shows_it(dlts, sessions, world):
    assert dlts("vc", "storage", "vision", "--json", json.dumps(STORAGE)) == (0, "VC vision storage updated")
    assert dlts("vc", "storage", "vision", "--json", json.dumps(STORAGE)) == (0, "VC vision storage unchanged")
    code, output = dlts("vc", "storage", "vision", "--show")
    assert code == 0
    shown = json.loads(output)
    assert shown["nfs"] == [STORAGE["nfs"][0] | {"read_only": False}] and shown["home"] == STORAGE["home"]
    with sessions() as s:
        assert [(e.actor, e.field) for e in s.scalars(sa.select(VcEvent).where(VcEvent.vc == "vision"))] == [("cli", "storage")]


@pytest.mark.parametrize("args, message", [
    (["--json", "{not json"], "not JSON"),
    (["--json", json.dumps({"nfs": [{"path": "/e", "mount_path": "/d"}]})], "storage.nfs[0].server"),
    (["--json", json.dumps({"host": [{"path": "/e/../etc", "mount_path": "/d"}]})], "storage.host[0].path"),
    ([], "--json JSON"),
    (["--json", "{}", "--show"], "--json JSON"),
])
def test_vc_storage_refuses_bad_documents_and_changes_nothing(dlts, sessions, world, args, message):
    code, output = dlts("vc", "storage", "vision", *args)
    assert code != 0 and message in output, output
    assert vc_row(sessions, "vision").storage == {}


def test_vc_storage_of_an_unknown_vc(dlts, world):
    code, output = dlts("vc", "storage", "nosuch", "--show")
    assert code != 0 and "No VC named 'nosuch'" in output
