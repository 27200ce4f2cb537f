"""LustreCollector on a fresh registry against the fake: values, rates across scrapes, failing sections."""
from __future__ import annotations

import pytest
from lustre_fixtures import load_fixture
from prometheus_client import CollectorRegistry, generate_latest

from dlts_lustre.client import LustreClient, cmd_pool_add, cmd_pool_new
from dlts_lustre.metrics import LustreCollector

GIB = 1024 * 1024


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        self.now += 0.25
        return self.now


def scrape(registry):
    """One collection, queried like registry.get_sample_value (which re-collects on every call)."""
    values = {(sample.name, frozenset(sample.labels.items())): sample.value
              for metric in registry.collect() for sample in metric.samples}
    return lambda name, labels=None: values.get((name, frozenset((labels or {}).items())))


def registry_for(collector):
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def _stats_state(snapshot, read_samples, read_sum):
    return {"obdfilter": {"OST0000": {"snapshot_time": snapshot, "start_time": 0.0, "counters": {
        "read_bytes": {"samples": read_samples, "unit": "bytes", "min": 4096, "max": 1048576, "sum": read_sum},
        "statfs": {"samples": read_samples // 10, "unit": "usecs", "min": 1, "max": 9, "sum": 50},
        "punch": {"samples": 0, "unit": "usecs", "min": 0, "max": 0, "sum": 0}}}}}


def test_capacity_pool_and_health_metrics(fake_lustre):
    client = LustreClient()
    client.execute(cmd_pool_new("dltsfs", "vc_a"))
    client.execute(cmd_pool_add("dltsfs", "vc_a", [0, 5]))
    fake_lustre.update(lambda s: s["osts"][5].update(active=False))
    registry = registry_for(LustreCollector(str(fake_lustre.mount), clock=Clock(),
                                            sections=("health", "df", "pools")))
    get = scrape(registry)
    labels = {"fs": "dltsfs", "target": "dltsfs-OST0000", "kind": "OST", "index": "0"}
    assert get("dlts_lustre_healthy", {"state": "healthy"}) == 1.0
    assert get("dlts_lustre_target_capacity_bytes", labels) == 1000 * GIB * 1024
    assert get("dlts_lustre_target_free_bytes", labels) == 900 * GIB * 1024
    assert get("dlts_lustre_target_inodes_free", labels) == 60_000_000 - 500_000
    assert get("dlts_lustre_target_active", {**labels, "target": "dltsfs-OST0005", "index": "5"}) == 0.0
    # OST0005 is inactive: only OST0000 counts toward the pool
    assert get("dlts_lustre_pool_capacity_bytes", {"fs": "dltsfs", "pool": "vc_a"}) == 1000 * GIB * 1024
    assert get("dlts_lustre_pool_osts", {"fs": "dltsfs", "pool": "vc_a"}) == 2.0
    assert get("dlts_lustre_collector_success", {"section": "df"}) == 1.0
    assert get("dlts_lustre_collector_duration_seconds", {"section": "df"}) == pytest.approx(0.25)


def test_unhealthy_and_flags(fake_lustre):
    fake_lustre.update(lambda s: (s.update(health="NOT HEALTHY"), s["osts"][2].update(flags="R")))
    registry = registry_for(LustreCollector(str(fake_lustre.mount), sections=("health", "df")))
    assert registry.get_sample_value("dlts_lustre_healthy", {"state": "unhealthy"}) == 0.0
    assert registry.get_sample_value("dlts_lustre_target_flag", {
        "fs": "dltsfs", "target": "dltsfs-OST0002", "kind": "OST", "index": "2", "flag": "read_only"}) == 1.0


def test_op_rates_come_from_deltas_between_scrapes(fake_lustre):
    fake_lustre.update(lambda s: s.update(stats=_stats_state(1000.0, 100, 409600)))
    collector = LustreCollector(str(fake_lustre.mount), sections=("ost_stats", "mdt_stats"))
    registry = registry_for(collector)
    target = {"target": "dltsfs-OST0000"}
    get = scrape(registry)
    assert get("dlts_lustre_ops_total", {**target, "op": "read_bytes"}) == 100
    assert get("dlts_lustre_io_bytes_total", {**target, "direction": "read"}) == 409600
    assert get("dlts_lustre_op_rate_per_second", {**target, "op": "read_bytes"}) is None
    # not an MDS: no md_stats, which is not a failure
    assert get("dlts_lustre_collector_success", {"section": "mdt_stats"}) == 1.0
    fake_lustre.update(lambda s: s.update(stats=_stats_state(1010.0, 300, 409600 + 10 * 1048576)))
    get = scrape(registry)
    assert get("dlts_lustre_op_rate_per_second", {**target, "op": "read_bytes"}) == 20.0
    assert get("dlts_lustre_io_rate_bytes_per_second", {**target, "direction": "read"}) == pytest.approx(1048576.0)
    assert get("dlts_lustre_op_rate_per_second", {**target, "op": "statfs"}) == 2.0
    # A second scrape before the snapshot moves keeps the rates instead of dropping them.
    assert scrape(registry)("dlts_lustre_op_rate_per_second", {**target, "op": "read_bytes"}) == 20.0


def test_a_failing_section_does_not_fail_the_scrape(fake_lustre):
    fake_lustre.update(lambda s: s.setdefault("fail", {}).update({"lctl pool_list": {"rc": 19, "stderr": "no"}}))
    fake_lustre.update(lambda s: s.update(stats=_stats_state(1000.0, 100, 409600)))
    fake_lustre.update(lambda s: s.setdefault("raw", {}).update({"lctl get_param": "garbage\n"}))
    registry = registry_for(LustreCollector(str(fake_lustre.mount)))
    get = scrape(registry)
    assert get("dlts_lustre_collector_success", {"section": "pools"}) == 0.0
    assert get("dlts_lustre_collector_success", {"section": "health"}) == 1.0  # "garbage" is simply unhealthy
    assert get("dlts_lustre_collector_success", {"section": "ost_stats"}) == 0.0
    assert get("dlts_lustre_collector_success", {"section": "df"}) == 1.0
    assert b"dlts_lustre_target_capacity_bytes" in generate_latest(registry)


def test_registration_runs_no_command(fake_lustre):
    registry_for(LustreCollector(str(fake_lustre.mount)))
    assert fake_lustre.calls() == []


def test_unknown_section_is_rejected():
    with pytest.raises(ValueError, match="unknown LustreCollector sections"):
        LustreCollector("/mnt/x", sections=("df", "gpus"))


def test_fixture_rates_match_the_collector_math():
    from dlts_lustre.parsers import compute_rates, parse_stats
    rates = compute_rates(parse_stats(load_fixture("obdfilter_stats_t0.txt")),
                          parse_stats(load_fixture("obdfilter_stats_t1.txt")))
    assert {r.counter for r in rates if r.target == "dltsfs-OST0000"} == {"read_bytes", "write_bytes", "read",
                                                                         "statfs", "punch"}
