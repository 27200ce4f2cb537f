"""SSH keys (parse, validate, fingerprint, duplicates), allowed IPs (ipaddress, expiry), storage usage."""

from __future__ import annotations

import csv
import datetime as dt
import io
import subprocess

import pytest
import sqlalchemy as sa

from dlts.models import AllowedIp, StorageSnapshot, StorageUsage, utcnow

from .helpers import assert_envelope, ssh_public_key


@pytest.mark.parametrize("kind,bits", [("ed25519", 256), ("rsa", 2048), ("ecdsa", 256)])
def test_a_valid_key_is_stored_with_the_fingerprint_ssh_keygen_prints(client, world, tmp_path, kind, bits):
    line = ssh_public_key(kind, bits)
    r = client.post("/api/v1/me/ssh-keys", json={"public_key": "  " + line + "\n"}, headers=world.auth("alice"))
    assert r.status_code == 201, r.get_json()
    key = r.get_json()
    (tmp_path / "k.pub").write_text(line + "\n")
    expected = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "k.pub")], capture_output=True, text=True, check=True).stdout.split()
    assert key["fingerprint"] == expected[1] and key["bits"] == int(expected[0]) == bits
    assert key["name"] == "me@laptop" and key["public_key"] == line
    listed = client.get("/api/v1/me/ssh-keys", headers=world.auth("alice")).get_json()["items"]
    assert [k["fingerprint"] for k in listed] == [key["fingerprint"]]
    assert client.get("/api/v1/me/ssh-keys", headers=world.auth("bob")).get_json()["items"] == []


def test_duplicate_keys_are_refused_for_the_same_and_for_another_user(client, world):
    line = ssh_public_key()
    assert client.post("/api/v1/me/ssh-keys", json={"public_key": line}, headers=world.auth("alice")).status_code == 201
    assert_envelope(client.post("/api/v1/me/ssh-keys", json={"public_key": line.rsplit(" ", 1)[0] + " other"},
                                headers=world.auth("alice")), 409, "duplicate_ssh_key")
    assert_envelope(client.post("/api/v1/me/ssh-keys", json={"public_key": line}, headers=world.auth("bob")), 409, "duplicate_ssh_key")


@pytest.mark.parametrize("text,status,code", [
    (None, 422, "weak_ssh_key"),  # 1024-bit RSA, built below
    ("ssh-dss AAAAB3NzaC1kc3MAAACBAP", 422, "weak_ssh_key"),
    ("ssh-ed25519 not-base64!!", 400, "invalid_ssh_key"),
    ("ssh-ed25519 AAAAB3NzaC1yc2EAAAADAQABAAABAQ==", 400, "invalid_ssh_key"),  # an RSA blob labelled ed25519
    ("-----BEGIN OPENSSH PRIVATE KEY----- b3BlbnNzaC1rZXktdjEAAAAA", 400, "private_key"),
    ("hello", 400, "invalid_ssh_key"),
    ("", 400, None),
])
def test_bad_keys_are_refused_with_what_to_do(client, world, text, status, code):
    if text is None:
        text = ssh_public_key("rsa", 1024)
    error = assert_envelope(client.post("/api/v1/me/ssh-keys", json={"public_key": text}, headers=world.auth("alice")), status, code)
    assert client.get("/api/v1/me/ssh-keys", headers=world.auth("alice")).get_json()["items"] == []
    if code == "weak_ssh_key":
        assert "ssh-keygen -t ed25519" in error["message"]


def test_deleting_a_key(client, world):
    key = client.post("/api/v1/me/ssh-keys", json={"public_key": ssh_public_key()}, headers=world.auth("alice")).get_json()
    assert_envelope(client.delete(f"/api/v1/me/ssh-keys/{key['id']}", headers=world.auth("bob")), 404)
    assert client.delete(f"/api/v1/me/ssh-keys/{key['id']}", headers=world.auth("alice")).status_code == 204
    assert client.get("/api/v1/me/ssh-keys", headers=world.auth("alice")).get_json()["items"] == []


@pytest.mark.parametrize("given,stored", [("203.0.113.7", "203.0.113.7/32"), ("198.51.100.0/24", "198.51.100.0/24"),
                                          ("2001:db8::1", "2001:db8::1/128"), ("2001:DB8::/48", "2001:db8::/48")])
def test_allowed_ips_are_canonical_and_expire_after_allow_ip_days(client, world, settings, given, stored):
    r = client.post("/api/v1/me/allowed-ips", json={"ip": given}, headers=world.auth("alice"))
    assert r.status_code == 201, r.get_json()
    entry = r.get_json()
    assert entry["cidr"] == stored and entry["renewed"] is False
    expires = dt.datetime.fromisoformat(entry["expires_at"].rstrip("Z"))
    assert abs((expires - utcnow()) - dt.timedelta(days=settings.allow_ip_days)) < dt.timedelta(minutes=1)
    again = client.post("/api/v1/me/allowed-ips", json={"ip": given}, headers=world.auth("alice")).get_json()
    assert again["renewed"] is True and again["id"] == entry["id"]


@pytest.mark.parametrize("given,status,fragment", [
    ("10.0.0.5/24", 400, "did you mean 10.0.0.0/24"), ("0.0.0.0/0", 422, "too wide"), ("::/0", 422, "too wide"),
    ("300.1.1.1", 400, "not an IPv4/IPv6"), ("example.com", 400, "not an IPv4/IPv6"), ("1.2.3.4; DROP TABLE users", 400, "not an"),
])
def test_bad_allowed_ips_are_refused(client, world, sessions, given, status, fragment):
    error = assert_envelope(client.post("/api/v1/me/allowed-ips", json={"ip": given}, headers=world.auth("alice")), status)
    assert fragment in error["message"]
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(AllowedIp.id))) == 0


def test_expired_entries_are_not_listed_and_admins_manage_anyones(client, world, sessions):
    client.post("/api/v1/me/allowed-ips", json={"ip": "203.0.113.9"}, headers=world.auth("alice"))
    with sessions() as s:
        s.execute(sa.update(AllowedIp).values(expires_at=utcnow() - dt.timedelta(seconds=1)))
        s.commit()
    assert client.get("/api/v1/me/allowed-ips", headers=world.auth("alice")).get_json()["items"] == []
    r = client.post("/api/v1/me/allowed-ips", json={"ip": "203.0.113.10", "user": "alice"}, headers=world.auth("admin"))
    assert r.status_code == 201 and r.get_json()["user"] == "alice"
    listed = client.get("/api/v1/me/allowed-ips", query_string={"user": "alice"}, headers=world.auth("admin")).get_json()["items"]
    assert [e["cidr"] for e in listed] == ["203.0.113.10/32"]
    assert_envelope(client.get("/api/v1/me/allowed-ips", query_string={"user": "nobody"}, headers=world.auth("admin")), 404)


def test_storage_usage_reads_the_last_scan_as_json_and_csv(client, world, sessions):
    assert client.get("/api/v1/storage/usage", headers=world.auth("admin")).get_json() == {"scanned_at": None, "rows": []}
    old, new = utcnow() - dt.timedelta(hours=1), utcnow()
    with sessions() as s:
        s.add_all([StorageUsage(scanned_at=old, mount="/data", vc="vision", user="alice", bytes_used=1, files=1),
                   StorageUsage(scanned_at=new, mount="/data", vc="vision", user="alice", bytes_used=10**12, files=5),
                   StorageUsage(scanned_at=new, mount="/data", vc="vision", user="=cmd|calc", bytes_used=2, files=None)])
        s.commit()
    body = client.get("/api/v1/storage/usage", headers=world.auth("admin")).get_json()
    assert body["scanned_at"].startswith(new.isoformat()[:19]) and len(body["rows"]) == 2
    assert body["rows"][1] == {"mount": "/data", "vc": "vision", "user": "alice", "bytes_used": 10**12, "files": 5,
                               "directory": None, "apparent_bytes": None, "oldest_at": None,
                               "previous_bytes_used": 1}  # the same row in the scan before: the trend
    r = client.get("/api/v1/storage/usage?format=csv&user=alice", headers=world.auth("admin"))
    assert r.mimetype == "text/csv"
    rows = list(csv.reader(io.StringIO(r.get_data(as_text=True))))
    assert rows[0] == ["scanned_at", "mount", "vc", "user", "directory", "bytes_used", "files", "apparent_bytes",
                       "oldest_at", "previous_bytes_used"]
    assert rows[1][1:] == ["/data", "vision", "alice", "", str(10**12), "5", "", "", "1"]
    answer = client.get("/api/v1/storage/usage?format=csv", headers=world.auth("admin"))
    formula = list(csv.reader(io.StringIO(answer.get_data(as_text=True))))
    assert [row[3] for row in formula[1:] if "calc" in row[3]] == ["'=cmd|calc"]
    assert_envelope(client.get("/api/v1/storage/usage?format=xml", headers=world.auth("admin")), 400)


def test_storage_views_are_scoped_by_role_in_the_api_and_its_csv(client, world, sessions):
    """Cluster admins see every row; vcadmin every row of vision; alice and bob (members of vision)
    vision's totals and their own rows; carol (nlp) nothing of vision; nobody but cluster admins the
    rows of a mount outside any VC, or a scan's paths."""
    new = utcnow()
    rows = [("/data", None, None, None, 500), ("/data", "vision", None, None, 300),
            ("/data", "vision", "alice", None, 200), ("/data", "vision", "bob", None, 100),
            ("/data", "vision", "alice", "alice-runs", 150), ("/data", "vision", None, "shared-set", 50),
            ("/data", "nlp", None, None, 70), ("/data", "nlp", "carol", None, 70)]
    with sessions() as s:
        s.add_all([StorageUsage(scanned_at=new, mount=m, vc=vc, user=u, directory=d, bytes_used=b, files=1)
                   for m, vc, u, d, b in rows])
        s.add(StorageSnapshot(root="/data", kind="nfs", started_at=new, scanned_at=new, duration_s=1.0, status="complete",
                              message="slow at /data/nlp/carol/secret-project", errors=0, other_filesystems=0, dirs=3,
                              files=8, allocated_bytes=500, apparent_bytes=500,
                              detail={"top_dirs": [{"path": "/data/nlp/carol/secret-project", "bytes": 70}],
                                      "oldest_files": [{"path": "/data/vision/alice/old.ckpt"}]}))
        s.commit()

    def seen(user):
        body = client.get("/api/v1/storage/usage", headers=world.auth(user)).get_json()
        api = sorted((r["vc"] or "", r["user"] or "", r["directory"] or "") for r in body["rows"])
        text = client.get("/api/v1/storage/usage?format=csv", headers=world.auth(user)).get_data(as_text=True)
        csv_rows = sorted((r[2], r[3], r[4]) for r in list(csv.reader(io.StringIO(text)))[1:])
        assert csv_rows == api
        return api

    assert len(seen("admin")) == len(rows)
    assert seen("vcadmin") == [("vision", "", ""), ("vision", "", "shared-set"), ("vision", "alice", ""),
                               ("vision", "alice", "alice-runs"), ("vision", "bob", "")]
    assert seen("alice") == [("vision", "", ""), ("vision", "alice", ""), ("vision", "alice", "alice-runs")]
    assert seen("bob") == [("vision", "", ""), ("vision", "bob", "")]
    assert seen("carol") == [("nlp", "", ""), ("nlp", "carol", "")]
    # the scans: when, how, how full for everybody; the paths and the message for cluster admins only
    [mine] = client.get("/api/v1/storage/snapshots", headers=world.auth("alice")).get_json()["items"]
    assert mine["status"] == "complete" and mine["top_dirs"] == [] and mine["oldest_files"] == [] and mine["message"] is None
    [full] = client.get("/api/v1/storage/snapshots", headers=world.auth("admin")).get_json()["items"]
    assert full["top_dirs"][0]["path"] == "/data/nlp/carol/secret-project"


def test_tokens_are_shown_once_listed_by_prefix_and_stop_working_when_revoked(client, world):
    r = client.post("/api/v1/me/tokens", json={"name": "laptop", "expires_days": 30}, headers=world.auth("alice"))
    assert r.status_code == 201
    created = r.get_json()
    token = created["token"]
    assert token.startswith("dlts_") and created["prefix"] == token[:12] and created["expires_at"]
    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"}).get_json()["name"] == "alice"
    listed = client.get("/api/v1/me/tokens", headers=world.auth("alice")).get_json()["items"]
    assert {t["name"] for t in listed} == {"test", "laptop"} and all(t["token"] is None for t in listed)
    assert_envelope(client.delete(f"/api/v1/me/tokens/{created['id']}", headers=world.auth("bob")), 404)
    assert client.delete(f"/api/v1/me/tokens/{created['id']}", headers=world.auth("alice")).status_code == 204
    assert_envelope(client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"}), 401)
    assert_envelope(client.post("/api/v1/me/tokens", json={"name": "x", "expires_days": 0}, headers=world.auth("alice")), 400)
