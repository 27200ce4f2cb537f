"""Layered settings: defaults < file < DLTS_* environment; a bad value names its key."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from dlts.cli import main
from dlts.config import ConfigError, load_settings, require_production_secrets


def test_the_environment_beats_the_file_which_beats_the_defaults(tmp_path):
    path = tmp_path / "dlts.yaml"
    path.write_text("tick_s: 5\nlisten_port: 6000\n")
    settings = load_settings(path, environ={"DLTS_LISTEN_PORT": "7000"})
    assert (settings.tick_s, settings.listen_port, settings.max_body_bytes) == (5.0, 7000, 1024 * 1024)


def test_dlts_home_holds_the_config_and_the_database(tmp_path):
    (tmp_path / "dlts.yaml").write_text("demo_gpus: 3\n")
    settings = load_settings(environ={"DLTS_HOME": str(tmp_path)})
    assert settings.demo_gpus == 3
    assert settings.effective_database_url == f"sqlite:///{tmp_path.resolve() / 'dlts.db'}"


@pytest.mark.parametrize("environ,key", [
    ({"DLTS_TICK_S": "soon"}, "DLTS_TICK_S"),
    ({"DLTS_LISTEN_PORT": "70000"}, "DLTS_LISTEN_PORT"),
    ({"DLTS_DATABASE_URL": "postgres://x"}, "DLTS_DATABASE_URL"),
    ({"DLTS_BACKEND": "slurm"}, "DLTS_BACKEND"),
])
def test_a_bad_environment_value_names_the_variable(environ, key):
    with pytest.raises(ConfigError, match=key):
        load_settings(environ=environ)


def test_an_unknown_key_in_the_file_is_refused(tmp_path):
    path = tmp_path / "dlts.yaml"
    path.write_text("tick_seconds: 5\n")
    with pytest.raises(ConfigError, match="tick_seconds: unknown key"):
        load_settings(path, environ={})


def test_a_file_that_is_not_a_mapping_is_refused(tmp_path):
    path = tmp_path / "dlts.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_settings(path, environ={})


def test_production_needs_a_secret_key():
    settings = load_settings(environ={"DLTS_DATABASE_URL": "mysql+pymysql://u:p@h/db"})
    with pytest.raises(ConfigError, match="secret_key"):
        require_production_secrets(settings)


def test_config_check_hides_secrets_and_reports_bad_keys_without_a_traceback(tmp_path):
    runner = CliRunner()
    env = {"DLTS_HOME": str(tmp_path), "DLTS_SECRET_KEY": "0123456789abcdefXYZ",
           "DLTS_DATABASE_URL": "mysql+pymysql://dlts:hunter2@db/dlts"}
    result = runner.invoke(main, ["config", "check"], env=env)
    assert result.exit_code == 0, result.output
    assert "hunter2" not in result.output and "0123456789abcdefXYZ" not in result.output
    bad = runner.invoke(main, ["config", "check"], env={"DLTS_HOME": str(tmp_path), "DLTS_TICK_S": "-1"})
    assert bad.exit_code == 1 and "DLTS_TICK_S" in bad.output and "Traceback" not in bad.output
