"""Passwords: `dlts user password`, the demo's random first-start passwords, hashing and login checks."""

from __future__ import annotations

import datetime as dt
import stat

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from werkzeug.security import generate_password_hash

from dlts.backends.local import LocalBackend
from dlts.cli import main
from dlts.demo import bootstrap
from dlts.errors import InvalidInput, Unauthenticated
from dlts.models import User
from dlts.services import portal_auth


def test_password_is_stored_only_as_a_scrypt_hash_and_checks(sessions, world):
    with sessions() as s:
        portal_auth.set_password(s, "alice", "a-long-enough-secret")
        stored = s.scalar(sa.select(User.password_hash).where(User.name == "alice"))
        assert stored.startswith("scrypt:") and "a-long-enough-secret" not in stored
        assert portal_auth.authenticate_password(s, "alice", "a-long-enough-secret").name == "alice"
        for user, password in (("alice", "wrong-password-123"), ("nobody", "a-long-enough-secret"), ("bob", "x" * 20)):
            with pytest.raises(Unauthenticated) as err:  # bob has no password: same answer as a wrong one
                portal_auth.authenticate_password(s, user, password)
            assert err.value.message == portal_auth.LOGIN_FAILED


def test_short_passwords_are_refused_with_the_length(sessions, world):
    with sessions() as s, pytest.raises(InvalidInput, match="at least 12 characters; it has 5"):
        portal_auth.set_password(s, "alice", "short")


def test_cli_sets_a_password_that_logs_in(settings, sessions, world, monkeypatch):
    monkeypatch.setenv("DLTS_HOME", str(settings.home))
    monkeypatch.setenv("DLTS_DATABASE_URL", settings.database_url)
    runner = CliRunner()
    result = runner.invoke(main, ["user", "password", "bob"], input="bobs-new-password\nbobs-new-password\n")
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["user", "password", "carol", "--random"])
    assert result.exit_code == 0, result.output
    carol_password = result.output.strip().rsplit(": ", 1)[1]
    with sessions() as s:
        assert portal_auth.authenticate_password(s, "bob", "bobs-new-password").name == "bob"
        assert portal_auth.authenticate_password(s, "carol", carol_password).name == "carol"
    bad = runner.invoke(main, ["user", "password", "bob"], input="short\nshort\n")
    assert bad.exit_code != 0 and "at least 12 characters" in bad.output and "Traceback" not in bad.output
    missing = runner.invoke(main, ["user", "password", "nobody", "--random"])
    assert missing.exit_code != 0 and "No user named 'nobody'" in missing.output


def test_demo_first_start_writes_random_credentials_mode_600(settings, sessions, tmp_path):
    home = settings.home
    home.mkdir(parents=True, exist_ok=True)
    backend = LocalBackend(tmp_path / "run", node_name="demo-node", demo_gpus=2, demo_sku="demo-gpu")
    with sessions() as s:
        assert bootstrap(s, backend, home) is True
    path = home / "demo-credentials"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    pairs = dict(line.split(":", 1) for line in path.read_text().split())
    assert set(pairs) == {"admin", "alice"} and pairs["admin"] != pairs["alice"] and len(pairs["admin"]) >= 16
    with sessions() as s:
        assert portal_auth.authenticate_password(s, "admin", pairs["admin"]).is_cluster_admin
        assert portal_auth.authenticate_password(s, "alice", pairs["alice"]).name == "alice"
        assert bootstrap(s, backend, home) is False  # second start: nothing regenerated
    assert dict(line.split(":", 1) for line in path.read_text().split()) == pairs


def test_login_limit_blocks_a_user_after_five_attempts_an_address_after_thirty_and_forgets(sessions, world):
    limits = portal_auth.LoginLimits(per_user=5, per_ip=30, window_s=300)
    t0 = dt.datetime(2030, 1, 1, 12, 0, 0)
    with sessions() as s:
        s.execute(sa.update(User).where(User.name == "bob").values(
            password_hash=generate_password_hash("bobs-password-123", method="scrypt:1024:8:1")))
        s.commit()

        def attempt(user, ip, seconds, password="wrong-password-123"):
            return portal_auth.login(s, limits, user, password, ip, now=t0 + dt.timedelta(seconds=seconds))

        for _ in range(5):
            with pytest.raises(Unauthenticated):
                attempt("alice", "1.2.3.4", 0)
        with pytest.raises(portal_auth.TooManyAttempts, match="wait 300 s") as err:
            attempt("Alice", "9.9.9.9", 0)  # the user name alone is enough to block, whatever its case
        assert err.value.retry_after_s == 300 and err.value.details["limit_per_user"] == 5
        assert attempt("bob", "1.2.3.4", 1, "bobs-password-123").name == "bob"  # others behind the address may
        for i in range(25):
            with pytest.raises(Unauthenticated):
                attempt(f"u{i}", "1.2.3.4", 2)
        with pytest.raises(portal_auth.TooManyAttempts, match="wait 298 s"):
            attempt("bob", "1.2.3.4", 2, "bobs-password-123")  # 30 attempts from one address (bob's was given back)
        assert attempt("bob", "5.5.5.5", 3, "bobs-password-123").name == "bob"
        # the window ends: alice's name and the address may try again
        with pytest.raises(Unauthenticated):
            attempt("alice", "1.2.3.4", 300)
