"""Fixtures for the node agent tests; the helpers live in agent_testkit.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_testkit import FakeNode, enable_command_log, make_fake_node


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    return make_fake_node(tmp_path)


@pytest.fixture
def command_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return enable_command_log(tmp_path, monkeypatch)
