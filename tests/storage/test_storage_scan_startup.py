"""`dlts storage scan` of a path outside storage.roots loads only what it uses: the storage: section
of the configuration (file and DLTS_STORAGE__* variables, errors named as dlts.config names them),
not the whole Settings, the user commands, yaml without a file, the database or the scheduler
(docs/benchmarks.md#storage-scan: each was CPU time of every scan's start)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlts.config import load_settings
from dlts.config_layers import ConfigError, load_section
from dlts.storage.settings import StorageSettings

# modules `dlts storage scan` of an unconfigured path must not import (each cost start-up CPU)
HEAVY = ("dlts.config", "dlts.backends", "dlts.directory_settings", "dlts.repair", "dlts.insight",
         "dlts.notify_settings", "dlts.client", "dlts.managers", "dlts.scheduler", "dlts.app", "dlts.db",
         "sqlalchemy", "flask", "yaml", "kubernetes")

PROBE = """
import atexit, gc, json, sys
atexit.register(lambda: print(json.dumps({"frozen_at_exit": gc.get_freeze_count()}), file=sys.stderr))  # runs last
from dlts.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def run_cli(args: list[str], env_extra: dict[str, str], tmp_path: Path) -> tuple[int, str, list[str]]:
    code, out, modules, _ = run_probe(args, env_extra, tmp_path)
    return code, out, modules


def run_probe(args: list[str], env_extra: dict[str, str], tmp_path: Path) -> tuple[int, str, list[str], int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLTS_")}
    env.update({"DLTS_HOME": str(tmp_path / "home"), **env_extra})
    p = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=120)
    probe, at_exit = (json.loads(line) for line in p.stderr.strip().splitlines()[-2:])
    return probe["code"], p.stdout, probe["modules"], at_exit["frozen_at_exit"]


def loaded(modules: list[str], prefix: str) -> bool:
    return any(m == prefix or m.startswith(prefix + ".") for m in modules)


def test_scan_of_an_unconfigured_path_imports_none_of_the_heavy_modules(tmp_path):
    (tmp_path / "data" / "a").mkdir(parents=True)
    (tmp_path / "data" / "a" / "f").write_bytes(b"x" * 5000)
    code, out, modules, frozen = run_probe(["storage", "scan", str(tmp_path / "data"), "--json"], {}, tmp_path)
    assert code == 0
    assert json.loads(out)["files"] == 1  # the whole document, flushed at exit
    assert [m for m in HEAVY if loaded(modules, m)] == []
    # at exit the start-up's objects are frozen (the last collections skip them; _cheap_exit)
    assert frozen > 1000
    # the probe sees them when a command does load them: `dlts config check` builds every section
    code, out, modules, frozen = run_probe(["config", "check"], {}, tmp_path)
    assert code == 0 and "storage:" in out and frozen == 0
    assert loaded(modules, "dlts.config") and loaded(modules, "dlts.backends") and loaded(modules, "yaml")


def test_the_storage_section_of_the_file_and_environment_applies_and_its_errors_name_the_key(tmp_path):
    data = tmp_path / "data"
    for name in ("a", "b", "c"):
        (data / name).mkdir(parents=True)
        (data / name / "f").write_bytes(b"x" * 5000)
    config = tmp_path / "dlts.yaml"
    config.write_text("storage:\n  top_dirs: 2\n")
    code, out, modules = run_cli(["storage", "scan", str(data), "--json"], {"DLTS_CONFIG": str(config)}, tmp_path)
    assert code == 0 and len(json.loads(out)["top_dirs"]) == 2
    assert not loaded(modules, "dlts.config")
    code, out, _ = run_cli(["storage", "scan", str(data), "--json"],
                           {"DLTS_CONFIG": str(config), "DLTS_STORAGE__TOP_DIRS": "1"}, tmp_path)
    assert code == 0 and len(json.loads(out)["top_dirs"]) == 1

    runner = CliRunner()
    from dlts.cli import main

    config.write_text("storage:\n  top_dirs: 0\n  bogus: 1\n")
    bad = runner.invoke(main, ["--config", str(config), "storage", "scan", str(data), "--json"], env={"DLTS_HOME": None})
    assert bad.exit_code == 1
    assert f"invalid configuration in {config}: storage.top_dirs: Input should be greater than or equal to 1" in bad.output
    assert "storage.bogus: unknown key" in bad.output and "Traceback" not in bad.output
    config.write_text("storage:\n  top_dirs: 3\n")
    bad = runner.invoke(main, ["--config", str(config), "storage", "scan", str(data)],
                        env={"DLTS_STORAGE__SCAN_INTERVAL_S": "soon"})
    assert bad.exit_code == 1 and "DLTS_STORAGE__SCAN_INTERVAL_S: Input should be a valid number" in bad.output
    config.write_text("storage: [1]\n")
    bad = runner.invoke(main, ["--config", str(config), "storage", "scan", str(data)])
    assert bad.exit_code == 1 and "storage: Input should be a valid dictionary or instance of StorageSettings" in bad.output


def test_a_bad_key_elsewhere_stops_only_the_scan_of_a_configured_root(tmp_path):
    """The documented difference: a path outside storage.roots is scanned with the storage: section
    alone; a configured root needs the database, so the whole configuration is checked first."""
    from dlts.cli import main

    data = tmp_path / "data"
    data.mkdir()
    config = tmp_path / "dlts.yaml"
    config.write_text(f"kubernetes:\n  bogus: 1\nstorage:\n  roots: [{{path: {tmp_path / 'root'}, kind: local}}]\n")
    runner = CliRunner()
    ok = runner.invoke(main, ["--config", str(config), "storage", "scan", str(data), "--json"])
    assert ok.exit_code == 0, ok.output
    (tmp_path / "root").mkdir()
    bad = runner.invoke(main, ["--config", str(config), "storage", "scan", str(tmp_path / "root"), "--json"])
    assert bad.exit_code == 1 and "kubernetes.bogus: unknown key" in bad.output


@pytest.mark.parametrize("text", [
    "",
    "storage:\n",
    "storage:\n  top_dirs: 7\n  roots:\n    - {path: /srv/nfs, kind: local, expire_after_days: 30, expire_paths: [scratch/*]}\n"
    "    - {path: /srv/home/, owner_by: directory, uid_owners: {1001: alice}}\nlisten_port: 5001\n",
])
def test_load_section_equals_the_whole_settings_section(tmp_path, text):
    config = tmp_path / "dlts.yaml"
    config.write_text(text)
    environ = {"DLTS_STORAGE__SCAN_INTERVAL_S": "600", "DLTS_STORAGE__OLDEST_FILES": "3", "DLTS_LISTEN_PORT": "5002",
               "DLTS_STORAGE__NOT_A_KEY": "x"}
    section = load_section("storage", StorageSettings, config, environ)
    assert section == load_settings(config, environ).storage
    assert section.scan_interval_s == 600 and section.oldest_files == 3
    environ["DLTS_STORAGE__KEEP_SNAPSHOTS"] = "1"
    with pytest.raises(ConfigError) as whole:
        load_settings(config, environ)
    with pytest.raises(ConfigError) as alone:
        load_section("storage", StorageSettings, config, environ)
    assert str(alone.value) == str(whole.value)
    assert "DLTS_STORAGE__KEEP_SNAPSHOTS: Input should be greater than or equal to 2" in str(alone.value)
