"""`dlts node list/show/repair/return/cancel-repair` and `dlts repair pause/resume/status` against
the test database (the CLI acts as a cluster admin named after the OS user)."""

from __future__ import annotations

import sqlalchemy as sa
from click.testing import CliRunner

from dlts.cli import main


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_the_repair_commands(world, sessions, settings, monkeypatch):
    monkeypatch.setenv("DLTS_DATABASE_URL", settings.database_url)
    code, out = run("node", "list")
    assert code == 0 and "testnode" in out and "in_service" in out
    code, out = run("node", "repair", "testnode", "--step", "reset_gpu", "--step", "ticket", "--gpu", "2", "--reason", "noisy")
    assert code == 0 and "started" in out, out
    code, out = run("node", "list")
    assert "quarantined" in out and "GPU 2" in out
    code, out = run("node", "show", "testnode")
    assert code == 0 and "reset_gpu -> ticket" in out and "in_service -> quarantined" in out, out
    code, out = run("node", "show", "testnode", "--json")
    assert code == 0 and '"kind": "manual"' in out
    code, out = run("node", "repair", "testnode")
    assert code != 0 and "starts from in_service" in out
    code, out = run("node", "return", "testnode")
    assert code != 0 and "only out_of_service or rma" in out
    with sessions() as s:
        cycle_id = s.scalar(sa.text("SELECT id FROM repair_cycles"))
    code, out = run("node", "cancel-repair", "testnode", str(cycle_id))
    assert code == 0 and "cancelled" in out
    assert run("repair", "pause", "--reason", "upgrade")[0] == 0
    assert run("repair", "pause", "testnode")[0] == 0
    code, out = run("repair", "status")
    assert code == 0 and "PAUSED by cli:" in out and "upgrade" in out and "paused nodes: testnode" in out
    assert "budget demo-gpu: 0 of 1 in repair" in out
    assert run("repair", "resume")[0] == 0 and run("repair", "resume", "testnode")[0] == 0
    code, out = run("repair", "status")
    assert "repair loop: running" in out
    code, out = run("repair", "pause", "nosuch")
    assert code != 0 and "No node named" in out
