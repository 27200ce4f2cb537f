"""Fixtures for the repair tests: the test world with e-mail addresses (the repair notices go
through the real notifier's outbox), the shared in-process SMTP server (tests/smtp_server.py), and
the real node agent reporting to the live API (repair_agents.py)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from repair_agents import FakeDriver, RunningAgent, agent_config, make_fake_node

from tests.smtp_server import down_smtp_server, smtp_server  # noqa: F401  (fixtures)


@pytest.fixture
def world(world, sessions):
    """The shared world (tests/conftest.py) whose users have addresses: NAME@example.org."""
    from dlts.models import User

    with sessions() as s:
        for user in s.scalars(sa.select(User)):
            user.email = f"{user.name}@example.org"
        s.commit()
    return world


@pytest.fixture
def start_agent(tmp_path, live, sessions, app):
    """start_agent(name, lib) -> a RunningAgent reporting to the live API every 0.2 s. The API runs
    as the demo does (it acts on reports read from a fake NVML; any other API ignores their findings)."""
    from dlts.services import nodes as node_service

    app.config["DLTS_DEMO"] = True
    agents: list[RunningAgent] = []

    def start(name: str, lib, gpus: int = 4) -> RunningAgent:
        root = tmp_path / f"agent-{name}"
        root.mkdir()
        node = make_fake_node(root)
        with sessions() as s:
            token = node_service.issue_node_token(s, name)
        token_file = root / "node-token"
        token_file.write_text(token)
        cfg = agent_config(node, node_name=name, interval_s=0.2, expected_gpu_count=gpus,
                           report={"enabled": True, "api_url": live.url, "node_token_file": str(token_file),
                                   "interval_s": 0.2, "timeout_s": 5, "backoff_initial_s": 0.2, "backoff_max_s": 1})
        running = RunningAgent(name, node, lib, FakeDriver(lib), cfg).start()
        agents.append(running)
        return running

    yield start
    for a in agents:
        a.halt()


