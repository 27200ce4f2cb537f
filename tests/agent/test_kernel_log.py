"""Kernel-log parsing and the XID collector: every line counted once, across restarts and sources."""

from __future__ import annotations

import pytest
from agent_testkit import BTIME, FAKEBIN, FIXTURES, FakeNode, agent_config
from hypothesis import given, settings
from hypothesis import strategies as st

from dlts_agent.actions import OrderError, parse_order
from dlts_agent.agent import Agent
from dlts_agent.collectors.infiniband import _enum_name
from dlts_agent.collectors.xid import XidCollector
from dlts_agent.kernel_log import XidLineParser, parse_kmsg_record
from dlts_agent.model import CollectorStatus
from dlts_agent.nvml import Nvml
from dlts_agent.state import AgentState
from dlts_testing.fake_nvml import healthy_8xa100


@pytest.mark.parametrize(
    "line, expected",
    [
        (
            "NVRM: Xid (PCI:0000:65:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
            ("0000:65:00.0", 79),
        ),
        (
            "NVRM: Xid (PCI:0000:4e:00): 63, Row Remapper: New row marked for remapping, reset gpu to activate.",
            ("0000:4e:00.0", 63),
        ),  # no pid= at all
        ("NVRM: Xid (PCI:0000:07:00): 13, pid=4411, name=train.py, Graphics Exception", ("0000:07:00.0", 13)),
        (
            "NVRM: Xid (0000:b7:00): 119, pid=1, name=x, Timeout after 6s of waiting for RPC response",
            ("0000:b7:00.0", 119),
        ),
        ("NVRM: GPU 0000:87:00.0: GPU has fallen off the bus.", ("0000:87:00.0", None)),
        ("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.127.05", None),
        ("usb 1-1: new high-speed USB device", None),
    ],
)
def test_xid_line_parser_recognises_each_documented_form(line, expected):
    parsed = XidLineParser().feed(line)
    assert (None if parsed is None else (parsed.bus_id, parsed.xid)) == expected


def test_multi_line_fallen_off_bus_message_is_joined_to_its_bus_id():
    p = XidLineParser()
    assert p.feed("NVRM: The NVIDIA GPU 0000:b7:00.0") is None
    assert p.feed("NVRM: (PCI ID: 10de:20b2) installed in this system has") is None
    parsed = p.feed("NVRM: fallen off the bus and is not responding to commands.")
    assert parsed is not None and parsed.bus_id == "0000:b7:00.0" and parsed.xid is None


def test_fallen_off_bus_without_any_bus_id_is_still_reported():
    parsed = XidLineParser().feed("NVRM: GPU has fallen off the bus and is not responding to commands.")
    assert parsed is not None and parsed.bus_id is None and parsed.xid is None


@pytest.mark.parametrize("line", ["garbage", "6,abc,1;x", "6;no fields", "6,-5,10,-;negative seq", " KEY=cont"])
def test_malformed_kmsg_records_are_rejected_not_raised(line):
    assert parse_kmsg_record(line, BTIME) is None


def test_kmsg_record_time_is_boot_time_plus_monotonic_offset():
    rec = parse_kmsg_record("4,1004,12000200,-;NVRM: Xid (PCI:0000:4e:00): 48, x", BTIME)
    assert rec.seq == 1004 and rec.time_s == pytest.approx(BTIME + 12.0002)


def _collector(node: FakeNode, state: AgentState, **kw) -> XidCollector:
    return XidCollector(state, kmsg_path=str(node.kmsg), proc_root=str(node.proc), clock=lambda: BTIME + 100.0, **kw)


def test_recorded_kernel_log_counts_each_xid_and_fallen_off_bus_once(node: FakeNode):
    node.kmsg.write_text((FIXTURES / "kmsg_xid.txt").read_text())
    state = AgentState(None)
    sample, errors = _collector(node, state).collect()
    assert errors == []
    assert sample.counts == {
        ("0000:4e:00.0", 48, "kernel"): 1,
        ("0000:4e:00.0", 63, "kernel"): 1,
        ("0000:87:00.0", 79, "kernel"): 1,
        ("0000:07:00.0", 13, "kernel"): 1,
    }
    assert sample.fell_off_bus_counts == {"0000:87:00.0": 1, "0000:b7:00.0": 1}
    assert len(sample.recent) == 6


def test_each_kernel_line_is_counted_once_across_agent_restarts(node: FakeNode):
    node.kmsg.write_text((FIXTURES / "kmsg_xid.txt").read_text())
    state_path = str(node.root / "state" / "state.json")
    st = AgentState.load(state_path)
    _collector(node, st).collect()
    st.save()
    # restart: same boot, same kernel ring buffer, plus one new line
    node.append_kmsg("4,1013,15000000,-;NVRM: Xid (PCI:0000:4e:00): 48, pid=1, name=x, DBE again")
    st2 = AgentState.load(state_path)
    sample, _ = _collector(node, st2).collect()
    assert sample.counts[("0000:4e:00.0", 48, "kernel")] == 2
    assert sample.counts[("0000:87:00.0", 79, "kernel")] == 1
    st2.save()
    # and a restart with nothing new counts nothing
    sample3, _ = _collector(node, AgentState.load(state_path)).collect()
    assert sample3.counts == sample.counts


def test_a_new_boot_reads_the_new_ring_buffer_and_forgets_old_boot_events(node: FakeNode):
    node.kmsg.write_text((FIXTURES / "kmsg_xid.txt").read_text())
    state_path = str(node.root / "state" / "state.json")
    st = AgentState.load(state_path)
    _collector(node, st).collect()
    st.save()
    node.set_boot_id("9f0e1d2c-0000-4000-8000-000000000002")
    node.kmsg.write_text("4,3,9000000,-;NVRM: Xid (PCI:0000:07:00): 13, pid=1, name=x, Graphics Exception\n")
    sample, _ = _collector(node, AgentState.load(state_path)).collect()
    assert sample.counts[("0000:07:00.0", 13, "kernel")] == 2  # seq 3 < old cursor, but a new boot
    assert [(e.bus_id, e.xid) for e in sample.recent] == [("0000:07:00.0", 13)]  # the XID 79 was before the reboot


def test_malformed_kmsg_lines_raise_the_xid_error_count_without_losing_good_lines(node: FakeNode):
    node.kmsg.write_text("not a record\n6,x,y,-;bad numbers\n4,10,1000,-;NVRM: Xid (PCI:0000:07:00): 31, pid=1, x\n")
    sample, errors = _collector(node, AgentState(None)).collect()
    assert sample.counts == {("0000:07:00.0", 31, "kernel"): 1}
    assert errors and "2 malformed" in errors[0]


def test_unreadable_kernel_log_is_reported_and_nvml_events_still_count(node: FakeNode):
    lib = healthy_8xa100()
    nvml = Nvml(lib)
    nvml.read()
    lib.inject_xid(2, 94)
    c = XidCollector(AgentState(None), kmsg_path=str(node.root / "missing"), proc_root=str(node.proc), nvml=nvml)
    sample, errors = c.collect()
    assert not sample.kernel_log_readable
    assert "kernel log unreadable" in errors[0]
    assert sample.counts == {("0000:47:00.0", 94, "nvml"): 1}


def test_journal_source_uses_and_persists_the_cursor(node: FakeNode, command_log, monkeypatch):
    monkeypatch.setenv("DLTS_FAKE_JOURNAL", str(FIXTURES / "journal_kernel.jsonl"))
    st = AgentState(None)
    c = XidCollector(
        st,
        source="journal",
        journalctl=str(FAKEBIN / "journalctl"),
        proc_root=str(node.proc),
        clock=lambda: 1795000020.0,
    )
    sample, errors = c.collect()
    assert sample.counts == {
        ("0000:4e:00.0", 48, "kernel"): 1,
        ("0000:87:00.0", 79, "kernel"): 1,
        ("0000:07:00.0", 13, "kernel"): 1,
    }
    assert any("malformed" in e for e in errors)
    assert st.journal_cursor == "s=1a;i=103;b=4c6b;m=4;t=5f3;x=4"
    c.collect()
    calls = command_log.read_text().splitlines()
    assert "-b" in calls[0] and "--after-cursor=s=1a;i=103;b=4c6b;m=4;t=5f3;x=4" in calls[1]
    assert st.xid_counts[("0000:4e:00.0", 48, "kernel")] == 1


def test_agent_exports_xid_counter_with_gpu_labels(node: FakeNode):
    node.kmsg.write_text((FIXTURES / "kmsg_xid.txt").read_text())
    agent = Agent(agent_config(node), nvml_lib=healthy_8xa100())
    agent.collect_once()
    v = agent.registry.get_sample_value(
        "dlts_gpu_xid_errors_total",
        {
            "gpu": "3",
            "uuid": "GPU-a1000003-5c1e-4b3a-9f00-000000000003",
            "bus_id": "0000:4e:00.0",
            "xid": "48",
            "source": "kernel",
        },
    )
    assert v == 1.0
    assert agent.registry.get_sample_value("dlts_gpu_fell_off_bus_messages_total", {"bus_id": "0000:b7:00.0"}) == 1
    assert agent.latest().collection.status("xid") is CollectorStatus.OK


def test_nvml_xid_events_are_taken_even_with_the_gpu_collector_off(node: FakeNode):
    lib = healthy_8xa100()
    agent = Agent(agent_config(node, collectors={"gpu": {"enabled": False}}), nvml_lib=lib)
    agent.collect_once()
    lib.inject_xid(7, 79)
    agent.collect_once()
    xid = agent.latest().collection.sample("xid")
    assert xid.counts == {("0000:bd:00.0", 79, "nvml"): 1}
    assert [f.code.value for f in agent.latest().findings] == ["gpu_xid"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=200), max_size=20))
def test_no_kernel_line_can_crash_the_parsers(lines):
    parser = XidLineParser()
    for line in lines:
        rec = parse_kmsg_record(line, BTIME)
        parsed = parser.feed(rec.message if rec else line)
        if parsed is not None and parsed.xid is not None:
            assert parsed.xid >= 0


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60))
def test_no_sysfs_state_text_can_crash_the_ib_parser(text):
    name = _enum_name(text)
    assert name is None or name == name.upper()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["id", "action", "target", "dry_run", "force", "reason", "x"]), json_values)
    | json_values
)
def test_any_json_order_is_parsed_or_refused_with_order_error(raw):
    try:
        order = parse_order(raw)
    except OrderError:
        return
    assert order.id and isinstance(order.dry_run, bool)


@pytest.mark.parametrize("content", ["{not json", '{"version": 99}', '{"version": 1, "xid_counts": [["a"]]}'])
def test_a_corrupt_state_file_starts_over_instead_of_stopping_the_agent(node: FakeNode, content):
    path = node.root / "state" / "state.json"
    path.write_text(content)
    st = AgentState.load(str(path))
    assert st.load_error and str(path) in st.load_error
    assert st.xid_counts == {} and st.kmsg_seq == -1
    node.kmsg.write_text((FIXTURES / "kmsg_xid.txt").read_text())
    sample, _ = _collector(node, st).collect()
    st.save()
    assert AgentState.load(str(path)).xid_counts == sample.counts


WRONG_SHAPES = [
    "[]", "null", '"state"', "7",
    '{"version": 1, "kmsg": []}',
    '{"version": 1, "kmsg": {"seq": null}}',
    '{"version": 1, "xid_counts": {"a": 1}}',
    '{"version": 1, "fell_off_bus_counts": [1, 2]}',
    '{"version": 1, "recent_xids": [5]}',
    '{"version": 1, "recent_xids": [{"bus_id": "0000:07:00.0"}]}',
    '{"version": 1, "gpu_reset_at": {"0000:07:00.0": "yesterday"}}',
    '{"version": 1, "orders": []}',
    '{"version": 1, "orders": {"r1": 5}}',
    '{"version": 1, "orders": {"r1": {"id": "r1", "action": "reboot", "status": "exploded"}}}',
    '{"version": 1, "orders": {"r1": {"id": "r1", "action": "reboot", "status": "succeeded", "finished_at": "x"}}}',
]


@pytest.mark.parametrize("content", WRONG_SHAPES)
def test_a_state_file_of_the_wrong_shape_is_kept_aside_and_the_agent_starts_empty(node: FakeNode, content, caplog):
    path = node.root / "state" / "state.json"
    path.write_text(content)
    with caplog.at_level("ERROR", logger="dlts_agent.state"):
        agent = Agent(agent_config(node), nvml_lib=healthy_8xa100())  # start-up reads the state
    assert agent.state.load_error and "starting with empty state" in agent.state.load_error
    assert f"kept as {path}.bad" in caplog.text
    assert (node.root / "state" / "state.json.bad").read_text() == content
    node.kmsg.write_text((FIXTURES / "kmsg_xid.txt").read_text())
    agent.executor.resolve_reboots()  # what run() does first with the orders
    snap = agent.collect_once()  # every round reads the state back (XID window, orders)
    assert snap.collection.status("xid") is CollectorStatus.OK
    assert agent.executor.unreported() == []
    assert AgentState.load(str(path)).load_error is None  # the state saved after the round is good
