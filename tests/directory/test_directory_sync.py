"""The directory sync against a real OpenLDAP slapd: users, uid/gid, e-mail and groups over ldaps:// and
StartTLS with a paged search, group -> VC role mappings, disabling users missing from the directory (and
the max_disable_percent brake), all through the production path: dlts.yaml -> `dlts directory sync`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml
from click.testing import CliRunner

from dlts.cli import main
from dlts.config import load_settings
from dlts.models import ApiToken, Group, GroupMember, Job, JobStatus, User
from dlts.services import admin
from dlts.services.auth import principal_for
from tests.api.helpers import make_job
from tests.slapd_server import SIZE_LIMIT, SUFFIX


def write_config(tmp_path: Path, settings, directory: dict) -> Path:
    path = tmp_path / "dlts.yaml"
    path.write_text(yaml.safe_dump({"database_url": settings.database_url, "home": str(settings.home),
                                    "secret_key": settings.secret_key, "directory": directory}))
    return path


def sync(config: Path, *extra: str) -> tuple[int, dict | str]:
    result = CliRunner().invoke(main, ["--config", str(config), "directory", "sync", *extra])
    assert "Traceback" not in result.output, result.output
    assert result.exit_code in (0, 1, 3), (result.exit_code, result.output, result.exception)
    if "--json" in extra and result.exit_code in (0, 3):
        return result.exit_code, json.loads(result.output)
    if result.exit_code == 1 and not isinstance(result.exception, SystemExit):
        import traceback

        raise AssertionError("".join(traceback.format_exception(*result.exc_info)))
    return result.exit_code, result.output


def seed(slapd, n: int = 12) -> list[str]:
    names = [f"user{i:02d}" for i in range(n)]
    for i, name in enumerate(names):
        slapd.add_user(name, 5000 + i, 6000, mail=f"{name}@example.org")
    slapd.add_group("vision-users", 7000, names[:3])
    slapd.add_group("vision-admins", 7001, names[:1])
    return names


def users(sessions) -> dict[str, User]:
    with sessions() as s:
        return {u.name: u for u in s.scalars(sa.select(User))}


def roles(sessions, name: str):
    with sessions() as s:
        who = principal_for(s, admin.get_user(s, name))
        return who.is_vc_member("vision"), who.is_vc_admin("vision")


MAPPINGS = [{"group": "vision-users", "vc": "vision", "role": "member"},
            {"group": "vision-admins", "vc": "vision", "role": "admin"}]


def test_ldaps_sync_creates_users_groups_and_vc_roles_with_a_paged_search(slapd, world, sessions, settings, tmp_path):
    names = seed(slapd)
    assert len(names) > SIZE_LIMIT  # a plain search would stop at the server's size limit
    plain = subprocess.run(["ldapsearch", "-x", "-H", f"ldap://127.0.0.1:{slapd.port}", "-D", f"cn=dlts,ou=services,{SUFFIX}",
                            "-w", "dlts-bind-secret", "-b", f"ou=people,{SUFFIX}", "(objectClass=posixAccount)", "uid"],
                           capture_output=True, text=True, timeout=60, check=False)
    assert plain.returncode == 4, plain.stdout[-500:]  # sizeLimitExceeded
    config = write_config(tmp_path, settings, slapd.settings(vc_roles=MAPPINGS))
    code, report = sync(config, "--dry-run", "--json")
    assert code == 0, report
    assert report["dry_run"] and sorted(report["created"]) == names
    assert "user00" not in users(sessions)  # a dry run writes nothing

    code, report = sync(config, "--json")
    assert code == 0, report
    assert sorted(report["created"]) == names and report["disabled"] == []
    assert sorted(report["groups_created"]) == ["vision-admins", "vision-users"]
    assert sorted(report["bindings_added"]) == ["vision-admins -> vision: admin", "vision-users -> vision: member"]
    now = users(sessions)
    assert (now["user03"].uid, now["user03"].gid, now["user03"].email, now["user03"].source) == (5003, 6000,
                                                                                                  "user03@example.org", "directory")
    assert now["alice"].disabled_at is None  # made by hand, not the directory's
    assert roles(sessions, "user00") == (True, True)
    assert roles(sessions, "user02") == (True, False)
    assert roles(sessions, "user05") == (False, False)
    code, report = sync(config, "--json")
    assert code == 0 and report["changes"] == 0  # idempotent

    # the directory changes: a uid, an e-mail, group members; a mapping leaves the settings
    slapd.modify(f"dn: uid=user05,ou=people,{SUFFIX}\nchangetype: modify\nreplace: uidNumber\nuidNumber: 5105\n-\n"
                 f"replace: mail\nmail: five@example.org\n")
    slapd.modify(f"dn: cn=vision-users,ou=groups,{SUFFIX}\nchangetype: modify\ndelete: memberUid\nmemberUid: user02\n-\n"
                 f"add: memberUid\nmemberUid: user05\n")
    config = write_config(tmp_path, settings, slapd.settings(vc_roles=MAPPINGS[:1]))
    code, report = sync(config, "--json")
    assert code == 0, report
    assert report["updated"] == ["user05: uid/gid 5005/6000 -> 5105/6000, email user05@example.org -> five@example.org"]
    assert report["members_added"] == ["vision-users: user05"] and report["members_removed"] == ["vision-users: user02"]
    assert report["bindings_removed"] == ["vision-admins -> vision"]
    assert roles(sessions, "user02") == (False, False) and roles(sessions, "user05") == (True, False)
    assert roles(sessions, "user00") == (True, False)  # the admin mapping is gone
    with sessions() as s:
        group = s.scalar(sa.select(Group).where(Group.name == "vision-users"))
        assert group.source == "directory"
        assert s.scalar(sa.select(sa.func.count()).select_from(GroupMember).where(GroupMember.group_id == group.id)) == 3


def test_users_missing_from_the_directory_are_disabled_never_deleted_and_the_brake_holds(slapd, world, sessions, settings,
                                                                                         tmp_path):
    names = seed(slapd)
    config = write_config(tmp_path, settings, slapd.settings(vc_roles=MAPPINGS, max_disable_percent=10))
    assert sync(config, "--json")[0] == 0
    with sessions() as s:
        admin.new_token(s, "user01", "t")
    job = make_job(sessions, settings, "user01", status=JobStatus.QUEUED)

    slapd.delete_user("user01")
    code, report = sync(config, "--json")
    assert code == 0, report
    assert report["disabled"] == ["user01"] and report["held_jobs"] == [job]
    user = users(sessions)["user01"]
    assert user.disabled_at is not None and user.disabled_reason == "missing from the directory"
    with sessions() as s:
        assert s.get(Job, job).status is JobStatus.PAUSED
        assert s.scalar(sa.select(sa.func.count()).select_from(ApiToken).where(ApiToken.user_id == user.id,
                                                                             ApiToken.revoked_at.is_(None))) == 0

    # five more gone at once (5 of 11 enabled, 45%): stopped, nothing written, exit 3
    for name in names[2:7]:
        slapd.delete_user(name)
    code, report = sync(config, "--json")
    assert code == 3 and report["stopped"] and sorted(report["disabled"]) == names[2:7]
    assert all(users(sessions)[n].disabled_at is None for n in names[2:7])
    code, text = sync(config)
    assert code == 3 and "STOPPED, nothing written" in text and "max_disable_percent" in text

    # the one disabled by the sync comes back: enabled, its held job queued again
    slapd.add_user("user01", 5001, 6000, mail="user01@example.org")
    for i, name in enumerate(names[2:7], start=2):
        slapd.add_user(name, 5000 + i, 6000)
    code, report = sync(config, "--json")
    assert code == 0 and report["enabled"] == ["user01"], report
    with sessions() as s:
        assert s.get(Job, job).status is JobStatus.QUEUED
    assert users(sessions)["user01"].disabled_at is None


def test_all_users_mode_spares_keep_users(slapd, world, sessions, settings, tmp_path):
    seed(slapd, 30)
    config = write_config(tmp_path, settings, slapd.settings(disable_missing="all_users", keep_users=["admin"],
                                                             max_disable_percent=20))
    code, report = sync(config, "--json")
    assert code == 0, report
    assert sorted(report["disabled"]) == ["alice", "bob", "carol", "vcadmin"]
    assert users(sessions)["admin"].disabled_at is None


def test_the_sync_never_disables_the_last_cluster_admins(slapd, world, sessions, settings, tmp_path):
    seed(slapd, 30)
    config = write_config(tmp_path, settings, slapd.settings(disable_missing="all_users", max_disable_percent=20))
    code, report = sync(config, "--json")
    assert code == 0, report
    assert sorted(report["disabled"]) == ["alice", "bob", "carol", "vcadmin"]
    assert any("last enabled cluster admins" in line for line in report["skipped"])
    assert users(sessions)["admin"].disabled_at is None


def test_starttls_works_and_a_wrong_ca_or_password_stops_with_a_clear_message(slapd, world, sessions, settings, tmp_path):
    seed(slapd, 3)
    starttls = write_config(tmp_path, settings, slapd.settings(url=f"ldap://127.0.0.1:{slapd.port}", start_tls=True))
    code, report = sync(starttls, "--json")
    assert code == 0 and len(report["created"]) == 3, report

    other = tmp_path / "other"
    other.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-keyout", str(other / "k.pem"), "-out", str(other / "c.pem")], check=True, capture_output=True)
    slapd.add_user("late", 5999, 6000)
    for overrides in ({"ca_file": str(other / "c.pem")},
                      {"url": f"ldap://127.0.0.1:{slapd.port}", "start_tls": True, "ca_file": str(other / "c.pem")}):
        code, text = sync(write_config(tmp_path, settings, slapd.settings(**overrides)))
        assert code == 1 and "TLS" in text and "ca_file" in text, text
    wrong = tmp_path / "wrong-password"
    wrong.write_text("nope\n")
    code, text = sync(write_config(tmp_path, settings, slapd.settings(bind_password_file=str(wrong))))
    assert code == 1 and "invalid credentials" in text, text
    assert "late" not in users(sessions)


def test_the_settings_refuse_a_cleartext_bind_and_managers_get_a_periodic_entry(slapd, world, sessions, settings, tmp_path):
    from dlts.config import ConfigError
    from dlts.managers.directory import periodic_entries

    with pytest.raises(ConfigError, match="start_tls"):
        load_settings(write_config(tmp_path, settings, slapd.settings(url=f"ldap://127.0.0.1:{slapd.port}")))
    seed(slapd, 2)
    loaded = load_settings(write_config(tmp_path, settings, slapd.settings(interval_s=600)))
    entries = periodic_entries(loaded, sessions)
    assert [(e.id, e.interval_s) for e in entries] == [("directory.sync", 600)]
    entries[0].run()
    assert {"user00", "user01"} <= set(users(sessions))
    from_env = load_settings(write_config(tmp_path, settings, slapd.settings()),
                             environ={"DLTS_DIRECTORY__MAX_DISABLE_PERCENT": "2.5", "DLTS_DIRECTORY__INTERVAL_S": "900"})
    assert (from_env.directory.max_disable_percent, from_env.directory.interval_s) == (2.5, 900)
    bare = load_settings(write_config(tmp_path, settings, {}))
    assert periodic_entries(bare, sessions) == []
    code, text = sync(write_config(tmp_path, settings, {}))
    assert code == 1 and "directory.url is not set" in text


def test_groups_with_member_dns_and_a_name_dlts_cannot_use(slapd, world, sessions, settings, tmp_path):
    seed(slapd, 3)
    slapd.add(f"dn: cn=leads,ou=groups,{SUFFIX}\nobjectClass: groupOfNames\ncn: leads\n"
              f"member: uid=user01,ou=people,{SUFFIX}\nmember: uid=USER02,ou=people,{SUFFIX}\n"
              f"member: uid=ghost,ou=people,{SUFFIX}\n")
    slapd.add(f"dn: uid=Bad User,ou=people,{SUFFIX}\nobjectClass: inetOrgPerson\nobjectClass: posixAccount\n"
              f"uid: Bad User\ncn: b\nsn: b\nhomeDirectory: /home/b\nuidNumber: 5900\ngidNumber: 6000\n")
    config = write_config(tmp_path, settings, slapd.settings(group_filter="(objectClass=groupOfNames)",
                                                             group_member_attribute="member",
                                                             vc_roles=[{"group": "leads", "vc": "nlp", "role": "admin"}]))
    code, report = sync(config, "--json")
    assert code == 0, report
    assert sorted(report["created"]) == ["user00", "user01", "user02"]
    assert sorted(report["members_added"]) == ["leads: user01", "leads: user02"]  # DNs, case-insensitive; ghost is nobody
    assert any("Bad User" in line for line in report["skipped"])
    assert roles_in(sessions, "user02", "nlp") == (True, True)


def roles_in(sessions, name: str, vc: str):
    with sessions() as s:
        who = principal_for(s, admin.get_user(s, name))
        return who.is_vc_member(vc), who.is_vc_admin(vc)
