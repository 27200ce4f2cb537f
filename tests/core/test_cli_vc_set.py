"""`dlts vc set`: create a VC or bring its quota and policy to the given values, idempotently, saying
what it did (Ansible's changed_when reads the output), with each change recorded as a VC event."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from dlts.cli import main
from dlts.models import VcEvent, VirtualCluster


@pytest.fixture
def dlts(settings, monkeypatch):
    monkeypatch.setenv("DLTS_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("DLTS_HOME", str(settings.home))

    def run(*args: str):
        result = CliRunner().invoke(main, list(args))
        return result.exit_code, result.output.strip()

    return run


def vc_row(sessions, name):
    with sessions() as s:
        vc = s.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == name))
        return None if vc is None else (vc.quota, vc.policy)


def events(sessions, name):
    with sessions() as s:
        return [(e.actor, e.field, e.old_value, e.new_value)
                for e in s.scalars(sa.select(VcEvent).where(VcEvent.vc == name).order_by(VcEvent.id))]


def test_set_creates_the_vc_then_reports_unchanged(dlts, sessions):
    assert dlts("vc", "set", "research", "--quota", "a100=8", "--quota", "h100=0") == (
        0, "VC research added: quota {'a100': 8}, policy RF")
    assert vc_row(sessions, "research") == ({"a100": 8}, "RF")
    assert dlts("vc", "set", "research", "--quota", "a100=8") == (0, "VC research unchanged")
    assert events(sessions, "research") == [("cli", "created", None, {"quota": {"a100": 8}, "policy": "RF"})]


def test_set_replaces_the_whole_quota_and_changes_the_policy_only_when_given(dlts, sessions):
    dlts("vc", "set", "research", "--quota", "a100=8", "--quota", "v100=4", "--policy", "FIFO")
    assert dlts("vc", "set", "research", "--quota", "a100=16") == (
        0, "VC research updated: quota {'a100': 8, 'v100': 4} -> {'a100': 16}")
    assert vc_row(sessions, "research") == ({"a100": 16}, "FIFO")  # policy not given: kept
    assert dlts("vc", "set", "research", "--quota", "a100=16", "--policy", "RF") == (
        0, "VC research updated: policy FIFO -> RF")
    assert [e[1] for e in events(sessions, "research")] == ["created", "quota", "policy"]


def test_set_brings_a_vc_made_elsewhere_to_the_declared_quota(dlts, sessions, world):
    # the world fixture made VC nlp with {"demo-gpu": 2} through `dlts vc add`'s service
    assert dlts("vc", "set", "nlp", "--quota", "demo-gpu=2") == (0, "VC nlp unchanged")
    assert dlts("vc", "set", "nlp") == (0, "VC nlp updated: quota {'demo-gpu': 2} -> {}")


@pytest.mark.parametrize("args, message", [
    (["Bad_Name", "--quota", "a100=1"], "must start with a lowercase letter"),
    (["research", "--quota", "a100=-1"], "must look like SKU=GPUS"),
    (["research", "--quota", "a100"], "must look like SKU=GPUS"),
    (["research", "--policy", "LIFO"], "'LIFO' is not one of 'RF', 'FIFO', 'backfill'"),
])
def test_set_refuses_bad_input_and_changes_nothing(dlts, sessions, args, message):
    code, output = dlts("vc", "set", *args)
    assert code != 0 and message in output, output
    assert vc_row(sessions, "research") is None


def test_set_changes_the_abuse_limits_only_when_given(dlts, sessions, world):
    assert dlts("vc", "set", "nlp", "--quota", "demo-gpu=2", "--max-queued-jobs-per-user", "50",
                "--max-submissions-per-minute", "0") == (
        0, "VC nlp updated: max_queued_jobs_per_user None -> 50; max_submissions_per_minute None -> 0")
    assert dlts("vc", "set", "nlp", "--quota", "demo-gpu=2") == (0, "VC nlp unchanged")
    assert dlts("vc", "set", "nlp", "--quota", "demo-gpu=2", "--max-queued-jobs-per-user", "none") == (
        0, "VC nlp updated: max_queued_jobs_per_user 50 -> None")
    with sessions() as s:
        vc = s.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == "nlp"))
        assert (vc.max_queued_jobs_per_user, vc.max_submissions_per_minute) == (None, 0)
    assert [e[1] for e in events(sessions, "nlp")][-3:] == ["max_queued_jobs_per_user", "max_submissions_per_minute",
                                                            "max_queued_jobs_per_user"]
    for bad in ("-3", "lots", "²"):
        code, output = dlts("vc", "set", "nlp", "--max-submissions-per-minute", bad)
        assert code != 0 and "--max-submissions-per-minute" in output and "Traceback" not in output, output
    code, output = dlts("vc", "set", "nlp", "--max-queued-jobs-per-user", "99999999")
    assert code != 0 and "max_queued_jobs_per_user must be a whole number between 0" in output, output
