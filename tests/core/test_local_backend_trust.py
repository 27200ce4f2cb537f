"""``backend: local`` outside the demo runs every member's command as the DLTS service user: it is
refused at start-up (``make_backend``, ``dlts managers``, ``dlts api``) unless dlts.yaml says
``local_backend_trusted_users: true``; the demo keeps working on loopback (docs/security-host.md)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dlts.backend_factory import make_backend
from dlts.backends.local import LocalBackend
from dlts.cli import main
from dlts.config import ConfigError, load_settings

DLTS = [sys.executable, "-m", "dlts.cli"]


def write_config(tmp_path, extra: str = "") -> str:
    path = tmp_path / "dlts.yaml"
    path.write_text(f"home: {tmp_path / 'home'}\nbackend: local\nrun_dir: {tmp_path / 'run'}\n{extra}")
    return str(path)


def test_a_dlts_yaml_with_the_local_backend_is_refused_by_the_factory_naming_the_key(tmp_path):
    settings = load_settings(write_config(tmp_path), environ={})
    with pytest.raises(ConfigError) as refused:
        make_backend(settings)
    message = str(refused.value)
    assert "backend: local" in message and "local_backend_trusted_users: true" in message
    assert "backend: kubernetes" in message  # what to do instead
    assert not (tmp_path / "run").exists()  # nothing was made


def test_the_operator_can_say_every_user_is_trusted(tmp_path):
    settings = load_settings(write_config(tmp_path, "local_backend_trusted_users: true\n"), environ={})
    backend = make_backend(settings)
    assert isinstance(backend, LocalBackend) and backend.run_dir == tmp_path / "run"


def test_the_setting_comes_from_the_environment_too_and_a_bad_value_names_it(tmp_path):
    path = write_config(tmp_path)
    assert load_settings(path, environ={"DLTS_LOCAL_BACKEND_TRUSTED_USERS": "true"}).local_backend_trusted_users
    with pytest.raises(ConfigError, match="local_backend_trusted_users"):
        load_settings(write_config(tmp_path, "local_backend_trusted_users: maybe\n"), environ={})


def clean_env(tmp_path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLTS_")}
    return env | {"DLTS_CONFIG": write_config(tmp_path), **extra}


def test_dlts_managers_and_dlts_api_refuse_to_start_with_one_line(tmp_path):
    for command in (["managers"], ["api", "--workers", "1"]):
        done = subprocess.run(DLTS + command, env=clean_env(tmp_path), capture_output=True, text=True, timeout=60)
        assert done.returncode != 0, command
        assert "local_backend_trusted_users: true" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_dlts_managers_starts_when_the_operator_trusts_the_users(tmp_path, monkeypatch):
    import dlts.managers

    seen = []
    monkeypatch.setattr(dlts.managers, "run_forever", lambda entries, **kw: seen.extend(e.id for e in entries))
    for key, value in clean_env(tmp_path, DLTS_LOCAL_BACKEND_TRUSTED_USERS="true",
                                DLTS_MANAGERS_METRICS_LISTEN="").items():
        monkeypatch.setenv(key, value)
    for key in [k for k in os.environ if k.startswith("DLTS_") and k not in ("DLTS_CONFIG",
                                                                              "DLTS_LOCAL_BACKEND_TRUSTED_USERS",
                                                                              "DLTS_MANAGERS_METRICS_LISTEN")]:
        monkeypatch.delenv(key)
    result = CliRunner().invoke(main, ["managers"])
    assert result.exit_code == 0, result.output
    assert "jobmanager.tick" in seen


def test_the_demo_refuses_to_listen_beyond_loopback_without_the_setting(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLTS_")} | {
        "DLTS_HOME": str(tmp_path / "home"), "DLTS_LISTEN_HOST": "0.0.0.0"}
    done = subprocess.run(DLTS + ["demo", "--port", "0"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "listen_host: 0.0.0.0" in done.stderr and "local_backend_trusted_users: true" in done.stderr, done.stderr
    assert not (tmp_path / "home" / "demo-token").exists()
