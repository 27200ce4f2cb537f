"""Fixtures for the dlts_lustre tests: recorded outputs and a stateful fake lfs/lctl on PATH."""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from lustre_fixtures import MGS_PREFIX, load_fixture

HERE = Path(__file__).parent
FAKEBIN = HERE / "fakebin"



@pytest.fixture
def fixture_text():
    return load_fixture


def base_state(mount: Path, version: str = "2.15.4") -> dict:
    gib = 1024 * 1024
    return {
        "version": version,
        "fsname": "dltsfs",
        "mount": str(mount),
        "mdts": [{"index": i, "kib_total": 100 * gib, "kib_used": 2 * gib, "inodes_total": 50_000_000,
                  "inodes_used": 1_000_000} for i in range(2)],
        "osts": [{"index": i, "kib_total": 1000 * gib, "kib_used": 100 * gib * (i + 1), "inodes_total": 60_000_000,
                  "inodes_used": 500_000} for i in range(6)],
        "pools": {},
        "users": {"alice": 1001, "bob": 1002, "carol": 1003},
        "groups": {"research": 2000},
        "quotas": {"u": {}, "g": {}, "p": {}},
        "defaults": {},
        "grace": {},
        "dirs": {},
        "health": "healthy",
    }


@dataclass
class FakeLustre:
    """Handle on the fake: read/modify its state, read the calls it received."""

    dir: Path
    mount: Path

    @property
    def state_path(self) -> Path:
        return self.dir / "state.json"

    def state(self) -> dict:
        return json.loads(self.state_path.read_text())

    def write(self, state: dict) -> None:
        self.state_path.write_text(json.dumps(state, indent=1))

    def update(self, fn) -> None:
        state = self.state()
        fn(state)
        self.write(state)

    def calls(self) -> list[list[str]]:
        log = self.dir / "calls.log"
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines()]

    def clear_calls(self) -> None:
        (self.dir / "calls.log").unlink(missing_ok=True)

    def mutating_calls(self) -> list[list[str]]:
        reads = {"quota", "df", "getstripe", "getdirstripe", "pool_list", "get_param", "list_param", "--version"}
        return [c for c in self.calls() if c[1] not in reads and not (c[1] == "project" and "-d" in c)]


def _install(tmp_path: Path, monkeypatch, version: str) -> FakeLustre:
    state_dir = tmp_path / "fake-lustre"
    state_dir.mkdir()
    # A long mount point (> 15 characters) so the <= 2.16.0 quota output wraps, as on real clusters.
    mount = tmp_path / "mnt" / "dltsfs-scratch"
    mount.mkdir(parents=True)
    fake = FakeLustre(state_dir, mount)
    fake.write(base_state(mount, version))
    monkeypatch.setenv("DLTS_FAKE_LUSTRE_DIR", str(state_dir))
    monkeypatch.setenv("DLTS_FAKE_LUSTRE_PYTHON", sys.executable)
    monkeypatch.setenv("PATH", f"{FAKEBIN}{os.pathsep}{os.environ.get('PATH', '')}")
    # Commands run on the client by default; the MGS-only ones (pool changes, conf_param) reach the
    # fake's MGS node through this prefix, as they reach the real MGS through ssh.
    monkeypatch.setenv("DLTS_FAKE_LUSTRE_NODE", "client")
    monkeypatch.setenv("DLTS_LUSTRE_MGS_COMMAND", MGS_PREFIX)
    return fake


@pytest.fixture
def fake_lustre(tmp_path, monkeypatch) -> FakeLustre:
    """Fake Lustre 2.15.4 (old quota header, wrapped mount points)."""
    return _install(tmp_path, monkeypatch, "2.15.4")


@pytest.fixture(params=["2.15.4", "2.16.52"])
def fake_lustre_any(request, tmp_path, monkeypatch) -> FakeLustre:
    """The fake at both quota output formats."""
    return _install(tmp_path, monkeypatch, request.param)
