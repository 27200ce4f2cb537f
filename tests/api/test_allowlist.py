"""The endpoint allowlist's desired state (services/allowlist.py), against SQLite and, with -m db and
DLTS_TEST_DATABASE_URL, MariaDB: which ports are guarded for whom, what changes the version, the
one query it costs, its settings, and the managers entry that purges expired allowed IPs."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from dlts.config import ConfigError, load_settings
from dlts.db import engine_of
from dlts.models import AllowedIp, EndpointKind, EndpointStatus, JobEndpoint, JobStatus, User, utcnow
from dlts.repositories import jobs as job_repo
from dlts.services import allowed_ips, allowlist

from .helpers import make_job, principal


def add_ip(sessions, settings, user: str, ip: str) -> None:
    with sessions() as s:
        allowed_ips.add_entry(s, settings, principal(s, user), ip)


def add_endpoint(sessions, job_id: int, host_port: int | None, *, status=EndpointStatus.READY, attempt: int | None = 1,
                 port: int | None = None) -> int:
    with sessions() as s:
        row = JobEndpoint(job_id=job_id, kind=EndpointKind.PORT, name=f"port-{port or host_port}", port=port or host_port or 8000,
                          status=status, attempt=attempt, host="10.0.0.5" if host_port else None, host_port=host_port,
                          created_by="test")
        s.add(row)
        s.commit()
        return row.id


def state(sessions, settings, **kwargs):
    with sessions() as s:
        return allowlist.desired_state(s, settings, **kwargs)


def rules(sessions, settings) -> dict[int, list[str]]:
    return {r["port"]: r["cidrs"] for r in state(sessions, settings)["rules"]}


def test_a_ready_endpoint_of_a_running_job_is_open_to_its_owner_only(sessions, settings, world):
    alice_job = make_job(sessions, settings, "alice", status=JobStatus.RUNNING)
    bob_job = make_job(sessions, settings, "bob", status=JobStatus.RUNNING)
    add_endpoint(sessions, alice_job, 31001)
    add_endpoint(sessions, alice_job, 31002, port=8888)
    add_endpoint(sessions, bob_job, 31003)
    add_ip(sessions, settings, "alice", "203.0.113.7")
    add_ip(sessions, settings, "alice", "2001:db8:1::/48")
    add_ip(sessions, settings, "bob", "198.51.100.0/24")
    add_ip(sessions, settings, "carol", "192.0.2.1")  # no endpoints: nowhere
    got = state(sessions, settings)
    assert got["port_range"] == [30000, 32767]
    assert got["rules"] == [
        {"port": 31001, "cidrs": ["203.0.113.7/32", "2001:db8:1::/48"]},  # IPv4 first, then IPv6
        {"port": 31002, "cidrs": ["203.0.113.7/32", "2001:db8:1::/48"]},
        {"port": 31003, "cidrs": ["198.51.100.0/24"]},
    ]
    assert len(got["version"]) == 64 and int(got["version"], 16) >= 0


@pytest.mark.parametrize("case", [
    "pending endpoint", "failed endpoint", "closing endpoint", "address of an earlier attempt", "no address yet",
    "queued job", "paused job", "finished job", "port below the guarded range", "port above the guarded range",
])
def test_only_ready_endpoints_of_running_jobs_inside_the_range_are_listed(sessions, settings, world, case):
    status = {"queued job": JobStatus.QUEUED, "paused job": JobStatus.PAUSED, "finished job": JobStatus.FINISHED}
    job = make_job(sessions, settings, "alice", status=status.get(case, JobStatus.RUNNING))
    add_ip(sessions, settings, "alice", "203.0.113.7")
    kwargs = {
        "pending endpoint": {"status": EndpointStatus.PENDING},
        "failed endpoint": {"status": EndpointStatus.FAILED},
        "closing endpoint": {"status": EndpointStatus.CLOSING},
        "address of an earlier attempt": {"attempt": 0},
        "no address yet": {"host_port": None, "attempt": None},
    }.get(case, {})
    host_port = {"port below the guarded range": 8888, "port above the guarded range": 40000}.get(case, 31001)
    add_endpoint(sessions, job, **{"host_port": host_port, **kwargs})
    assert state(sessions, settings)["rules"] == []
    # the same job with a ready endpoint inside the range is listed (the case above is what kept it out)
    if case not in ("queued job", "paused job", "finished job"):
        add_endpoint(sessions, job, 31500)
        assert rules(sessions, settings) == {31500: ["203.0.113.7/32"]}


def test_expired_entries_are_left_out(sessions, settings, world):
    job = make_job(sessions, settings, "alice", status=JobStatus.RUNNING)
    add_endpoint(sessions, job, 31001)
    add_ip(sessions, settings, "alice", "203.0.113.7")
    add_ip(sessions, settings, "alice", "198.51.100.9")
    with sessions() as s:
        row = s.scalar(sa.select(AllowedIp).where(AllowedIp.cidr == "198.51.100.9/32"))
        row.expires_at = utcnow() - dt.timedelta(seconds=1)
        s.commit()
    assert rules(sessions, settings) == {31001: ["203.0.113.7/32"]}
    # and one expiring later drops out when its time comes
    later = utcnow() + dt.timedelta(days=settings.allow_ip_days, minutes=1)
    assert state(sessions, settings, now=later)["rules"] == []


def test_cluster_wide_networks_reach_every_endpoint_and_overlaps_are_collapsed(sessions, settings, world):
    vpn = settings.model_copy(update={"endpoint_allow_cidrs": ("10.8.0.0/16", "fd00:8::/64")})
    alice_job = make_job(sessions, settings, "alice", status=JobStatus.RUNNING)
    bob_job = make_job(sessions, settings, "bob", status=JobStatus.RUNNING)
    add_endpoint(sessions, alice_job, 31001)
    add_endpoint(sessions, bob_job, 31002)  # bob has no allowed IPs: only the VPN reaches it
    add_ip(sessions, settings, "alice", "10.0.0.0/8")  # contains the VPN's 10.8.0.0/16
    add_ip(sessions, settings, "alice", "192.0.2.0/25")
    add_ip(sessions, settings, "alice", "192.0.2.128/25")  # adjacent: one /24
    assert rules(sessions, vpn) == {31001: ["10.0.0.0/8", "192.0.2.0/24", "fd00:8::/64"],
                                    31002: ["10.8.0.0/16", "fd00:8::/64"]}
    # without cluster-wide networks bob's port has no source at all and is not listed
    assert rules(sessions, settings) == {31001: ["10.0.0.0/8", "192.0.2.0/24"]}


def test_the_guarded_range_is_a_setting(sessions, settings, world):
    narrow = settings.model_copy(update={"endpoint_port_range": (31000, 31001)})
    job = make_job(sessions, settings, "alice", status=JobStatus.RUNNING)
    add_endpoint(sessions, job, 31001)
    add_endpoint(sessions, job, 31002)
    add_ip(sessions, settings, "alice", "203.0.113.7")
    got = state(sessions, narrow)
    assert got["port_range"] == [31000, 31001] and [r["port"] for r in got["rules"]] == [31001]


def test_the_version_changes_when_and_only_when_the_content_changes(sessions, settings, world):
    job = make_job(sessions, settings, "alice", status=JobStatus.RUNNING)
    endpoint = add_endpoint(sessions, job, 31001)
    add_ip(sessions, settings, "alice", "203.0.113.7")
    first = state(sessions, settings)
    assert state(sessions, settings) == first  # stable: same content, same structure and version
    # changes that leave the content alone keep the version
    add_ip(sessions, settings, "alice", "203.0.113.7")  # renewed: a later expiry
    add_ip(sessions, settings, "bob", "198.51.100.7")  # bob has no endpoint
    add_endpoint(sessions, job, 31002, status=EndpointStatus.PENDING)
    assert state(sessions, settings)["version"] == first["version"]
    # a new source changes it, and removing it brings the first version back
    add_ip(sessions, settings, "alice", "198.51.100.0/24")
    second = state(sessions, settings)
    assert second["version"] != first["version"]
    with sessions() as s:
        s.execute(sa.delete(AllowedIp).where(AllowedIp.cidr == "198.51.100.0/24"))
        s.commit()
    assert state(sessions, settings)["version"] == first["version"]
    # the job running again: its endpoint's address belonged to attempt 1, so the port closes
    with sessions() as s:
        s.execute(sa.update(JobEndpoint).where(JobEndpoint.id == endpoint).values(host_port=31009))
        s.commit()
    moved = state(sessions, settings)
    assert moved["version"] not in (first["version"], second["version"]) and moved["rules"][0]["port"] == 31009
    with sessions() as s:
        assert job_repo.set_status(s, job, JobStatus.RUNNING, JobStatus.QUEUED, actor="test")
        s.commit()
    assert state(sessions, settings)["rules"] == []


def test_it_costs_one_query_however_many_endpoints(app, sessions, settings, world):
    for user in ("alice", "bob", "vcadmin"):
        add_ip(sessions, settings, user, {"alice": "203.0.113.7", "bob": "198.51.100.7", "vcadmin": "192.0.2.7"}[user])
        for n in range(3):
            job = make_job(sessions, settings, user, status=JobStatus.RUNNING)
            add_endpoint(sessions, job, 31000 + len(user) * 100 + n * 10)
            add_endpoint(sessions, job, 31001 + len(user) * 100 + n * 10, port=8888)
    statements = []

    def count(conn, cursor, statement, *args):
        statements.append(statement)

    engine = engine_of(app)
    sa.event.listen(engine, "before_cursor_execute", count)
    try:
        got = state(sessions, settings)
    finally:
        sa.event.remove(engine, "before_cursor_execute", count)
    assert len(got["rules"]) == 18
    assert len(statements) == 1 and "job_endpoints" in statements[0], statements


# -- settings -------------------------------------------------------------------------------------

def test_settings_take_lists_or_comma_separated_strings_in_canonical_form():
    s = load_settings(environ={"DLTS_ENDPOINT_ALLOW_CIDRS": "10.8.0.0/16, 2001:db8::/32,192.0.2.7",
                               "DLTS_ENDPOINT_PORT_RANGE": "31000-31999"})
    assert s.endpoint_allow_cidrs == ("10.8.0.0/16", "2001:db8::/32", "192.0.2.7/32")
    assert s.endpoint_port_range == (31000, 31999)
    assert load_settings(environ={}, endpoint_port_range=[30000, 30010]).endpoint_port_range == (30000, 30010)
    assert load_settings(environ={}).endpoint_allow_cidrs == ()


@pytest.mark.parametrize("key,value,says", [
    ("endpoint_allow_cidrs", ["10.0.0.1/8"], "host bits set"),
    ("endpoint_allow_cidrs", "vpn.example.com", "not an IPv4/IPv6 address"),
    ("endpoint_port_range", "32767-30000", "LO <= HI"),
    ("endpoint_port_range", [0, 30000], "between 1 and 65535"),
    ("endpoint_port_range", "30000:32767", "LO-HI"),
])
def test_bad_settings_stop_start_up_naming_the_key(key, value, says):
    with pytest.raises(ConfigError, match=key) as refused:
        load_settings(environ={}, **{key: value})
    assert says in str(refused.value)


# -- the managers entry -----------------------------------------------------------------------------

def test_dlts_managers_purges_expired_allowed_ips_every_ten_minutes(settings, sessions, world, monkeypatch):
    from click.testing import CliRunner

    import dlts.managers
    from dlts.cli import main

    add_ip(sessions, settings, "alice", "203.0.113.7")
    add_ip(sessions, settings, "bob", "198.51.100.7")
    with sessions() as s:
        s.execute(sa.update(AllowedIp).where(AllowedIp.cidr == "198.51.100.7/32")
                  .values(expires_at=utcnow() - dt.timedelta(minutes=1)))
        s.commit()
    seen = {}
    monkeypatch.setattr(dlts.managers, "run_forever",
                        lambda entries, **kw: seen.update({e.id: e for e in entries}, lease=kw["lease"]))
    monkeypatch.setenv("DLTS_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("DLTS_HOME", str(settings.home))
    monkeypatch.setenv("DLTS_LOCAL_BACKEND_TRUSTED_USERS", "true")  # dlts managers with the local backend
    result = CliRunner().invoke(main, ["managers"])
    assert result.exit_code == 0, result.output
    assert seen["lease"].keep()  # the entries act only while this process holds the managers' lease
    entry = seen["allowlist.purge_expired"]
    assert entry.interval_s == 600
    assert entry.run() == 1
    with sessions() as s:
        assert s.execute(sa.select(User.name, AllowedIp.cidr).join(User, User.id == AllowedIp.user_id)).all() == [
            ("alice", "203.0.113.7/32")]
    assert entry.run() == 0
