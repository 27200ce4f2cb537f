"""Who jobs run as (users' uid/gid, the VC's group), what they mount (the VC's storage document), what
they pull with (registry credentials, encrypted, never returned) and what they may ask (scratch space,
root) through the API."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from dlts.models import RegistryCredential, User, VcEvent, VirtualCluster
from dlts.services import registry_credentials

from .helpers import assert_envelope

JOB = {"vc": "vision", "image": "debian:12", "command": "true"}


def vc_events(sessions, field):
    with sessions() as s:
        return [(e.actor, e.old_value, e.new_value)
                for e in s.scalars(sa.select(VcEvent).where(VcEvent.vc == "vision", VcEvent.field == field).order_by(VcEvent.id))]


# -- identity ------------------------------------------------------------------------------------------

def test_a_cluster_admin_sets_a_users_uid_and_gid_and_the_user_sees_them(client, world, sessions):
    assert client.get("/api/v1/me", headers=world.auth("alice")).get_json()["uid"] is None
    response = client.patch("/api/v1/users/alice", json={"uid": 20001, "gid": 20000}, headers=world.auth("admin"))
    assert response.status_code == 200
    assert {k: response.get_json()[k] for k in ("name", "email", "uid", "gid")} == {"name": "alice", "email": None,
                                                                                     "uid": 20001, "gid": 20000}
    me = client.get("/api/v1/me", headers=world.auth("alice")).get_json()
    assert (me["uid"], me["gid"]) == (20001, 20000)
    # only the gid: the uid stays
    assert client.patch("/api/v1/users/alice", json={"gid": 20002}, headers=world.auth("admin")).get_json()["uid"] == 20001
    # both null: unset again
    assert client.patch("/api/v1/users/alice", json={"uid": None, "gid": None}, headers=world.auth("admin")).get_json()["uid"] is None


def test_a_uid_names_one_person(client, world):
    client.patch("/api/v1/users/alice", json={"uid": 20001, "gid": 20000}, headers=world.auth("admin"))
    error = assert_envelope(client.patch("/api/v1/users/bob", json={"uid": 20001, "gid": 20000}, headers=world.auth("admin")),
                            409, "uid_taken")
    assert "alice" in error["message"]
    # giving alice her own uid again is not a conflict
    assert client.patch("/api/v1/users/alice", json={"uid": 20001, "gid": 20000}, headers=world.auth("admin")).status_code == 200


def test_uid_0_is_refused_with_a_reason(sessions, world):
    from dlts.errors import InvalidInput
    from dlts.services import admin

    with sessions() as s, pytest.raises(InvalidInput, match="root"):
        admin.set_user(s, "alice", {"uid": 0, "gid": 1000})


def test_unknown_user_is_404_for_a_cluster_admin_and_403_for_others(client, world):
    assert_envelope(client.patch("/api/v1/users/nobody", json={"uid": 3000, "gid": 3000}, headers=world.auth("admin")),
                    404, "user_not_found")
    assert_envelope(client.patch("/api/v1/users/nobody", json={"uid": 3000, "gid": 3000}, headers=world.auth("vcadmin")), 403)


def test_vc_group_scratch_space_and_pod_policy_are_cluster_admin_settings(client, world, sessions):
    body = {"gid": 30000, "ephemeral_storage_bytes": "20Gi", "pod_policy": {"run_as_root": True}}
    assert_envelope(client.patch("/api/v1/vcs/vision", json=body, headers=world.auth("vcadmin")), 403)
    vc = client.patch("/api/v1/vcs/vision", json=body, headers=world.auth("admin")).get_json()
    assert (vc["gid"], vc["ephemeral_storage_bytes"], vc["pod_policy"]) == (30000, 20 * 2**30, {"run_as_root": True})
    assert vc_events(sessions, "gid") == [("admin", None, 30000)]
    assert_envelope(client.patch("/api/v1/vcs/vision", json={"pod_policy": {"sudo": True}}, headers=world.auth("admin")), 400)
    assert_envelope(client.patch("/api/v1/vcs/vision", json={"gid": 0}, headers=world.auth("admin")), 400)


# -- storage ---------------------------------------------------------------------------------------------

STORAGE = {
    "nfs": [{"name": "datasets", "server": "10.0.0.5", "path": "/export/datasets", "mount_path": "/datasets", "read_only": True},
            {"server": "NFS1.lab", "path": "/export/vision", "mount_path": "/vc"}],
    "host": [{"path": "/mnt/lustre/vision", "mount_path": "/lustre"}],
    "home": {"kind": "nfs", "server": "nfs1.lab", "path": "/export/home", "mount_path": "/home"},
}
STORED = {
    "nfs": [{"name": "datasets", "server": "10.0.0.5", "path": "/export/datasets", "mount_path": "/datasets", "read_only": True},
            {"name": "nfs-1", "server": "nfs1.lab", "path": "/export/vision", "mount_path": "/vc", "read_only": False}],
    "host": [{"name": "host-0", "path": "/mnt/lustre/vision", "mount_path": "/lustre", "read_only": False}],
    "home": {"kind": "nfs", "server": "nfs1.lab", "path": "/export/home", "mount_path": "/home"},
}


def test_storage_is_replaced_whole_stored_normalized_readable_by_members_and_recorded(client, world, sessions):
    response = client.put("/api/v1/vcs/vision/storage", json=STORAGE, headers=world.auth("admin"))
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["storage"] == STORED
    assert client.get("/api/v1/vcs/vision", headers=world.auth("bob")).get_json()["storage"] == STORED
    assert vc_events(sessions, "storage") == [("admin", {}, STORED)]
    # the same document again changes nothing and records nothing
    client.put("/api/v1/vcs/vision/storage", json=STORAGE, headers=world.auth("admin"))
    assert len(vc_events(sessions, "storage")) == 1
    # whole replacement: what is left out goes
    smaller = client.put("/api/v1/vcs/vision/storage", json={"host": STORAGE["host"]}, headers=world.auth("admin")).get_json()
    assert smaller["storage"] == {"host": STORED["host"]}


def test_lustre_settings_live_in_the_same_document_and_the_lustre_command_keeps_the_rest(client, world, sessions):
    from dlts.services import admin

    body = {"host": STORAGE["host"], "lustre": {"pool": "vision", "osts": "0-1", "mdt": 0}}
    stored = client.put("/api/v1/vcs/vision/storage", json=body, headers=world.auth("admin")).get_json()["storage"]
    assert stored["lustre"] == {"pool": "vision", "osts": "0-1", "mdt": 0}
    with sessions() as s:
        admin.set_vc_lustre(s, "vision", {"pool": "vision2", "osts": "2", "mdt": 1})
        storage = s.scalar(sa.select(VirtualCluster.storage).where(VirtualCluster.name == "vision"))
    assert storage == {"host": STORED["host"], "lustre": {"pool": "vision2", "osts": "2", "mdt": 1}}
    # a document without a lustre key (the inventory's mounts) replaces the mounts and keeps Lustre
    kept = client.put("/api/v1/vcs/vision/storage", json={"nfs": STORAGE["nfs"]}, headers=world.auth("admin")).get_json()
    assert kept["storage"] == {"nfs": STORED["nfs"], "lustre": {"pool": "vision2", "osts": "2", "mdt": 1}}


def test_a_vc_admin_cannot_change_storage(client, world, sessions):
    assert_envelope(client.put("/api/v1/vcs/vision/storage", json=STORAGE, headers=world.auth("vcadmin")), 403)
    with sessions() as s:
        assert s.scalar(sa.select(VirtualCluster.storage).where(VirtualCluster.name == "vision")) == {}


# -- registry credentials -------------------------------------------------------------------------------

def test_a_users_registry_credential_is_stored_encrypted_and_never_returned(client, world, sessions, settings):
    password = "ghp_very-secret-token-0123456789"
    response = client.post("/api/v1/me/registry-credentials", json={"server": "GHCR.io", "username": "alice-gh",
                                                                    "password": password}, headers=world.auth("alice"))
    assert response.status_code == 201
    created = response.get_json()
    assert set(created) == {"id", "scope", "owner", "server", "username", "created_by", "created_at"}
    assert (created["scope"], created["owner"], created["server"], created["username"]) == ("user", "alice", "ghcr.io", "alice-gh")
    listed = client.get("/api/v1/me/registry-credentials", headers=world.auth("alice"))
    assert [c["id"] for c in listed.get_json()["items"]] == [created["id"]]
    assert password not in listed.get_data(as_text=True) and password not in response.get_data(as_text=True)
    assert client.get("/api/v1/me/registry-credentials", headers=world.auth("bob")).get_json()["items"] == []
    with sessions() as s:
        row = s.get(RegistryCredential, created["id"])
        assert password not in row.password_encrypted
        assert registry_credentials.fernet(settings.secret_key).decrypt(row.password_encrypted.encode()).decode() == password
    assert_envelope(client.post("/api/v1/me/registry-credentials", json={"server": "ghcr.io", "username": "x", "password": "y"},
                                headers=world.auth("alice")), 409, "duplicate_registry_credential")
    assert_envelope(client.delete(f"/api/v1/me/registry-credentials/{created['id']}", headers=world.auth("bob")), 404)
    assert client.delete(f"/api/v1/me/registry-credentials/{created['id']}", headers=world.auth("alice")).status_code == 204
    assert client.get("/api/v1/me/registry-credentials", headers=world.auth("alice")).get_json()["items"] == []


def test_a_vcs_registry_credentials_are_its_admins_and_their_changes_are_recorded_without_the_password(client, world, sessions):
    body = {"server": "registry.lab:5000", "username": "robot", "password": "robot-password"}
    created = client.post("/api/v1/vcs/vision/registry-credentials", json=body, headers=world.auth("vcadmin")).get_json()
    assert (created["scope"], created["owner"], created["created_by"]) == ("vc", "vision", "vcadmin")
    assert [c["server"] for c in client.get("/api/v1/vcs/vision/registry-credentials",
                                            headers=world.auth("admin")).get_json()["items"]] == ["registry.lab:5000"]
    assert_envelope(client.get("/api/v1/vcs/vision/registry-credentials", headers=world.auth("alice")), 403)
    assert_envelope(client.get("/api/v1/vcs/vision/registry-credentials", headers=world.auth("carol")), 404)
    # a VC credential cannot be deleted through /me, nor through another VC
    assert_envelope(client.delete(f"/api/v1/me/registry-credentials/{created['id']}", headers=world.auth("vcadmin")), 404)
    assert_envelope(client.delete(f"/api/v1/vcs/nlp/registry-credentials/{created['id']}", headers=world.auth("admin")), 404)
    assert client.delete(f"/api/v1/vcs/vision/registry-credentials/{created['id']}", headers=world.auth("vcadmin")).status_code == 204
    events = vc_events(sessions, "registry_credential")
    assert events == [("vcadmin", None, {"server": "registry.lab:5000", "username": "robot"}),
                      ("vcadmin", {"server": "registry.lab:5000", "username": "robot"}, None)]
    with sessions() as s:
        assert "robot-password" not in str(s.execute(sa.text("SELECT old_value, new_value FROM vc_events")).all())


def test_without_a_secret_key_no_password_is_stored(sessions, world):
    from dlts.errors import Refused

    from .helpers import principal

    with sessions() as s, pytest.raises(Refused, match="secret_key"):
        registry_credentials.add_mine(s, "", principal(s, "alice"), "ghcr.io", "alice", "pw")
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(RegistryCredential.id))) == 0


def test_credentials_go_with_their_user(sessions, world, settings):
    from .helpers import principal

    with sessions() as s:
        registry_credentials.add_mine(s, settings.secret_key, principal(s, "bob"), "ghcr.io", "bob", "pw")
        s.delete(s.scalar(sa.select(User).where(User.name == "bob")))
        s.commit()
        assert s.scalar(sa.select(sa.func.count(RegistryCredential.id))) == 0


# -- what a job may ask ------------------------------------------------------------------------------------

def test_scratch_space_may_be_asked_up_to_the_vcs_default(client, world, settings):
    client.patch("/api/v1/vcs/vision", json={"ephemeral_storage_bytes": "20Gi"}, headers=world.auth("admin"))
    job = client.post("/api/v1/jobs", json=JOB | {"ephemeral_storage_bytes": "10Gi"}, headers=world.auth("alice")).get_json()
    assert job["ephemeral_storage_bytes"] == 10 * 2**30
    error = assert_envelope(client.post("/api/v1/jobs", json=JOB | {"ephemeral_storage_bytes": "21Gi"},
                                        headers=world.auth("alice")), 422, "ephemeral_storage_exceeds_vc")
    assert error["details"]["field"] == "ephemeral_storage_bytes" and error["details"]["max"] == 20 * 2**30
    assert "VC vision's limit" in error["message"]


def test_without_a_vc_default_the_cluster_default_is_the_limit(client, world, settings):
    limit = settings.kubernetes.default_ephemeral_storage_bytes
    assert client.post("/api/v1/jobs", json=JOB | {"ephemeral_storage_bytes": limit}, headers=world.auth("alice")).status_code == 201
    error = assert_envelope(client.post("/api/v1/jobs", json=JOB | {"ephemeral_storage_bytes": limit + 1},
                                        headers=world.auth("alice")), 422, "ephemeral_storage_exceeds_vc")
    assert "cluster's default" in error["message"]


def test_root_only_where_the_vcs_policy_allows_it(client, world):
    error = assert_envelope(client.post("/api/v1/jobs", json=JOB | {"run_as_root": True}, headers=world.auth("alice")),
                            422, "run_as_root_not_allowed")
    assert error["details"]["field"] == "run_as_root" and "pod_policy" in error["message"]
    client.patch("/api/v1/vcs/vision", json={"pod_policy": {"run_as_root": True}}, headers=world.auth("admin"))
    job = client.post("/api/v1/jobs", json=JOB | {"run_as_root": True}, headers=world.auth("alice")).get_json()
    assert job["run_as_root"] is True
    assert client.post("/api/v1/jobs", json=JOB, headers=world.auth("alice")).get_json()["run_as_root"] is False
