"""Holes bad input found (issue 16): each answered 500 or 503, stored what MariaDB refuses, or leaked
what the caller may not see. Every case here is a clear 4xx with the envelope, on SQLite and under
``-m db`` on MariaDB."""

from __future__ import annotations

import base64
import json

import pytest
import sqlalchemy as sa

from dlts.models import AllowedIp, Job, Node, NodeFinding, NodeOrder
from dlts.services import nodes as node_service

from .helpers import assert_envelope, job_count, make_job

JOB = {"vc": "vision", "image": "debian:12", "command": "true"}


def _cursor(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


@pytest.fixture
def node_token(world, sessions) -> str:
    with sessions() as s:
        return node_service.issue_node_token(s, "testnode")


def report(**extra):
    body = {"schema_version": 1, "node": "testnode", "agent_version": "1.0", "heartbeat_at": "2026-11-29T20:00:00.000Z",
            "boot_id": "b1", "collectors": {"gpu": {"status": "ok", "errors": []}}, "findings": [],
            "metrics": {"gpu_count": 4, "load1": 0.5}, "order_results": []}
    return body | extra


def post_report(client, token, body):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return client.post("/api/v1/nodes/testnode/report", data=data, content_type="application/json",
                       headers={"Authorization": f"Bearer {token}"})


# -- pagination cursors --------------------------------------------------------------------------------

@pytest.mark.parametrize("raw", ["j:99999999999999999999", "j:9999999999999999999", "j:-5", "j:²", "j:١٢", "j: 7", "j:7_0"])
def test_a_tampered_job_cursor_is_a_400_not_an_overflow(client, world, raw):
    assert_envelope(client.get(f"/api/v1/jobs?cursor={_cursor(raw)}", headers=world.auth("alice")), 400, "invalid_cursor")


@pytest.mark.parametrize("raw", ["e:9999999999999999999", "e:²", "e:١"])
def test_a_tampered_event_cursor_is_a_400(client, world, sessions, settings, raw):
    job_id = make_job(sessions, settings)
    assert_envelope(client.get(f"/api/v1/jobs/{job_id}/events?cursor={_cursor(raw)}", headers=world.auth("alice")),
                    400, "invalid_cursor")


# -- JSON that MariaDB's json_valid refuses --------------------------------------------------------------

BAD_JSON = [
    ("NaN", '{"vc": "vision", "image": "x", "command": "true", "env": {"A": "1"}, "cpu": NaN}', "cpu"),
    ("Infinity", '{"vc": "vision", "image": "x", "command": "true", "cpu": Infinity}', "cpu"),
    ("-Infinity", '{"vc": "vision", "image": "x", "command": "true", "cpu": -Infinity}', "cpu"),
    ("1e400", '{"vc": "vision", "image": "x", "command": "true", "cpu": 1e400}', "cpu"),
    ("a lone surrogate in env", '{"vc": "vision", "image": "x", "command": "true", "env": {"A": "\\ud800"}}', "env.A"),
    ("a lone surrogate in a name", '{"vc": "vision", "image": "x", "command": "true", "name": "\\udfff"}', "name"),
    ("a lone surrogate in a key", '{"vc": "vision", "image": "x", "command": "true", "env": {"\\ud800": "1"}}', "env"),
    ("an enormous integer", '{"vc": "vision", "image": "x", "command": "true", "gpus": 1' + "0" * 5000 + "}", "gpus"),
]


@pytest.mark.parametrize("name,body,field", BAD_JSON, ids=[c[0] for c in BAD_JSON])
def test_json_the_database_refuses_is_a_400_at_the_door(client, world, sessions, name, body, field):
    response = client.post("/api/v1/jobs", data=body, content_type="application/json", headers=world.auth("alice"))
    error = assert_envelope(response, 400)
    assert error["details"].get("field") == field or field in json.dumps(error), error
    assert job_count(sessions) == 0


def test_json_nested_past_the_documented_limit_is_refused_and_within_it_accepted(client, world, node_token):
    from dlts.strict import MAX_JSON_DEPTH

    def nested(levels: int):
        value: object = 1
        for _ in range(levels):
            value = {"x": value}
        return value

    # the body is one level, "findings" a second, the finding a third, "evidence" the fourth
    ok = report(findings=[{"code": "c", "severity": "info", "evidence": nested(MAX_JSON_DEPTH - 3)}])
    assert post_report(client, node_token, ok).status_code == 200
    deep = report(findings=[{"code": "c", "severity": "info", "evidence": nested(40)}])
    error = assert_envelope(post_report(client, node_token, deep), 400, "invalid_json")
    assert str(MAX_JSON_DEPTH) in error["message"] and error["details"]["field"].startswith("findings.0.evidence")


@pytest.mark.parametrize("text,field", [
    ('"load1": NaN', "metrics.load1"),
    ('"load1": Infinity', "metrics.load1"),
    ('"load1": 1e400', "metrics.load1"),
    ('"extra": "\\ud83d"', "metrics.extra"),
])
def test_a_node_report_with_values_the_database_refuses_is_a_400_and_nothing_is_stored(client, world, sessions, node_token,
                                                                                     text, field):
    body = json.dumps(report()).replace('"load1": 0.5', text)
    error = assert_envelope(post_report(client, node_token, body), 400, "invalid_json")
    assert error["details"]["field"] == field
    with sessions() as s:
        node = s.scalar(sa.select(Node).where(Node.name == "testnode"))
        assert node.last_heartbeat_at is None and node.metrics == {}
    # and the node list stays valid JSON for everybody
    listed = client.get("/api/v1/nodes/testnode", headers=world.auth("admin"))
    assert listed.status_code == 200 and json.loads(listed.get_data(as_text=True), parse_constant=lambda c: 1 / 0)


def test_nan_never_reaches_the_database_even_from_inside(sessions, world):
    """The engine's JSON serializer refuses NaN: a bug elsewhere cannot store invalid JSON."""
    with sessions() as s:
        node = s.scalar(sa.select(Node).where(Node.name == "testnode"))
        node.metrics = {"load1": float("nan")}
        with pytest.raises(Exception) as info:
            s.commit()
        assert "NaN" in str(info.value) or "Out of range float" in str(info.value)
        s.rollback()
        assert s.scalar(sa.select(Node.metrics).where(Node.name == "testnode")) == {}


# -- the node report's shape ---------------------------------------------------------------------------

@pytest.mark.parametrize("metrics,field", [
    ({"gpus": 5}, "gpus"),
    ({"gpus": "abc"}, "gpus"),
    ({"gpus": [1, 2]}, "gpus"),
    ({"gpus": [{"index": "zero"}]}, "index"),
    ({"gpus": [{"index": 0, "utilization_ratio": "high"}]}, "utilization_ratio"),
    ({"gpus": [{"index": 0, "utilization_ratio": 7}]}, "utilization_ratio"),
    ({"gpus": [{"index": 0, "job_id": {"a": 1}}]}, "job_id"),
    ({"gpu_count": "4"}, "gpu_count"),
    ({"filesystems": [{"mount": "/", "size_bytes": -1}]}, "size_bytes"),
    ({"job_ids": "1,2"}, "job_ids"),
])
def test_node_metrics_of_the_wrong_shape_are_refused_before_anything_is_stored(client, world, sessions, node_token,
                                                                             metrics, field):
    error = assert_envelope(post_report(client, node_token, report(metrics=metrics)), 400)
    assert field in json.dumps(error["details"]), error
    with sessions() as s:
        assert s.scalar(sa.select(Node.last_heartbeat_at).where(Node.name == "testnode")) is None


def test_a_job_id_a_process_made_up_is_dropped_not_the_whole_report(client, world, sessions, node_token):
    """DLTS_JOB_ID is read from a process's environment, which the job itself can set for its
    children: a value that is no id of ours must not fail the node's heartbeat."""
    gpus = [{"index": 0, "job_id": "²", "utilization_ratio": 0.5}, {"index": 1, "job_id": "x" * 5000},
            {"index": 2, "job_id": "7"}]
    assert post_report(client, node_token, report(metrics={"gpus": gpus, "job_ids": ["²", "7"]})).status_code == 200
    with sessions() as s:
        metrics = s.scalar(sa.select(Node.metrics).where(Node.name == "testnode"))
    assert [g["job_id"] for g in metrics["gpus"]] == [None, None, "7"]


def test_collectors_and_findings_are_bounded(client, world, sessions, node_token):
    assert_envelope(post_report(client, node_token, report(collectors={"gpu": {"status": 5}})), 400)
    assert_envelope(post_report(client, node_token, report(collectors={"gpu": {"status": "ok", "errors": "boom"}})), 400)
    evidence = {f"k{i}": i for i in range(200)}
    assert_envelope(post_report(client, node_token, report(findings=[{"code": "c", "severity": "info", "evidence": evidence}])), 400)
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(NodeFinding.id))) == 0


def test_the_real_agents_payload_passes_the_report_schema():
    """The agent's own payload builder, with every GPU field filled, loads through the schema."""
    from dlts.api.schemas import NodeReportSchema
    from dlts_agent.metrics import _gpu_json
    from dlts_agent.model import GpuSample

    gpu = _gpu_json(GpuSample(index=0, uuid="GPU-0", bus_id="0000:3b:00.0", name="A100", utilization_ratio=0.5,
                              memory_used_bytes=1, memory_total_bytes=2, temperature_celsius=40.5, power_watts=300.0,
                              ecc_errors={("uncorrected", "volatile"): 2}, row_remap_pending=False, row_remap_failure=False,
                              remapped_rows_uncorrectable=0, retired_pages_single_bit=0, retired_pages_double_bit=0,
                              retired_pages_pending=False, recovery_action=0), None)
    gpu["job_id"] = "42"
    metrics = {"cpu_count": 8, "load1": 0.1, "memory_total_bytes": 2**35, "memory_available_bytes": 2**34,
               "filesystems": [{"mount": "/", "size_bytes": 10, "free_bytes": 5}], "gpu_count": 1, "driver_version": "550.1",
               "gpus": [gpu], "job_ids": ["42"], "a_future_field": {"kept": True}}
    loaded = NodeReportSchema().load(report(metrics=metrics))
    assert loaded["metrics"]["gpus"][0]["ecc_errors"] == {"uncorrected_volatile": 2}
    assert loaded["metrics"]["a_future_field"] == {"kept": True}


@pytest.mark.parametrize("order_id", ["²", "١", "99999999999999999999", "-1", " 1"])
def test_order_results_with_ids_that_are_not_ours_are_ignored(client, world, sessions, node_token, order_id):
    with sessions() as s:
        node_id = s.scalar(sa.select(Node.id).where(Node.name == "testnode"))
        s.add(NodeOrder(node_id=node_id, action="reboot", status="sent", result={}, created_by="admin"))
        s.commit()
    result = {"id": order_id, "action": "reboot", "status": "succeeded"}
    assert post_report(client, node_token, report(order_results=[result])).status_code == 200
    with sessions() as s:
        assert s.scalar(sa.select(NodeOrder.status)) == "sent"


def test_a_gpu_device_with_a_unicode_digit_does_not_break_the_repair_rules():
    from dlts.repair.machine import gpu_index

    assert gpu_index("gpu3") == 3
    assert gpu_index("gpu²") is None and gpu_index("gpu١") is None and gpu_index("gpu" + "9" * 30) is None


# -- information leaks ------------------------------------------------------------------------------------

def test_cluster_status_shows_only_the_vcs_the_caller_belongs_to(client, world, sessions):
    from dlts.services import admin

    with sessions() as s:
        admin.add_user(s, "loner")
        loner = admin.new_token(s, "loner", "t")
    names = lambda who: [v["vc"] for v in client.get("/api/v1/cluster/status", headers=who).get_json()["vcs"]]
    assert names(world.auth("admin")) == ["nlp", "vision"]
    assert names(world.auth("alice")) == ["vision"]
    assert names(world.auth("carol")) == ["nlp"]
    status = client.get("/api/v1/cluster/status", headers={"Authorization": f"Bearer {loner}"}).get_json()
    assert status["vcs"] == [] and status["skus"]  # the cluster's capacity stays public
    assert "vision" not in json.dumps(status) and "nlp" not in json.dumps(status)


@pytest.mark.parametrize("command", ["TOKEN=abc123secret python x.py", "  AWS_SECRET=s3cr3t ./run", "export K=v; ./go"])
def test_a_jobs_default_name_copies_no_command_text(client, world, command):
    job = client.post("/api/v1/jobs", json=JOB | {"command": command}, headers=world.auth("alice")).get_json()
    assert job["name"] == f"batch-{job['id']}"
    word = command.split()[0]
    public = client.get(f"/api/v1/jobs/{job['id']}", headers=world.auth("bob")).get_json()  # another member: public view
    assert public["visibility"] == "public" and word not in json.dumps(public)
    listed = client.get("/api/v1/jobs", headers=world.auth("bob")).get_json()["items"]
    assert word not in json.dumps(listed)
    named = client.post("/api/v1/jobs", json=JOB | {"command": command, "name": "mine"}, headers=world.auth("alice")).get_json()
    assert named["name"] == "mine"


# -- allowed IPs -------------------------------------------------------------------------------------------

NOT_ALLOWED = [
    ("fe80::1%eth0", "zone"),
    ("fe80::1%x/128", "zone"),
    ("2001:db8::1%25eth0", "zone"),
    ("fe80::1", "link-local"),
    ("fe80::/64", "link-local"),
    ("169.254.1.1", "link-local"),
    ("224.0.0.1", "multicast"),
    ("ff02::1", "multicast"),
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("::ffff:203.0.113.7", "IPv4-mapped"),
    ("::ffff:0:0/96", "IPv4-mapped"),
    ("::203.0.113.7", "IPv4-compatible"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.255", "reserved"),
]
LOOPBACK = [("127.0.0.1", "loopback"), ("127.0.0.0/8", "loopback"), ("::1", "loopback")]


@pytest.mark.parametrize("ip,why", NOT_ALLOWED, ids=[c[0] for c in NOT_ALLOWED])
def test_allowed_ips_refuse_zone_ids_and_addresses_nobody_connects_from(client, world, sessions, ip, why):
    response = client.post("/api/v1/me/allowed-ips", json={"ip": ip}, headers=world.auth("alice"))
    error = assert_envelope(response, 422, "address_not_allowed")
    assert error["details"]["field"] == "ip" and why in error["message"], error
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(AllowedIp.id))) == 0


@pytest.mark.parametrize("ip,why", LOOPBACK, ids=[c[0] for c in LOOPBACK])
def test_loopback_is_allowed_only_where_jobs_run_on_this_machine(client, world, sessions, settings, ip, why):
    from dlts.errors import Refused
    from dlts.services import allowed_ips

    from .helpers import principal

    with sessions() as s:  # Kubernetes: a node never sees a client come from its own loopback
        with pytest.raises(Refused) as info:
            allowed_ips.add_entry(s, settings.model_copy(update={"backend": "kubernetes"}), principal(s, "alice"), ip)
        assert why in info.value.message and info.value.details["field"] == "ip"
    # the local backend (the demo): the browser and the jobs share the machine
    assert client.post("/api/v1/me/allowed-ips", json={"ip": ip}, headers=world.auth("alice")).status_code == 201


@pytest.mark.parametrize("ip,stored", [("203.0.113.7", "203.0.113.7/32"), ("10.0.0.0/8", "10.0.0.0/8"),
                                       ("2001:db8::/48", "2001:db8::/48"), ("192.168.1.0/24", "192.168.1.0/24")])
def test_allowed_ips_still_take_ordinary_and_private_addresses(client, world, ip, stored):
    response = client.post("/api/v1/me/allowed-ips", json={"ip": ip}, headers=world.auth("alice"))
    assert response.status_code == 201, response.get_json()
    assert response.get_json()["cidr"] == stored


# -- bounded list responses and submission limits ----------------------------------------------------------

def test_the_job_list_carries_summaries_and_the_detail_route_the_full_job(client, world):
    env = {f"V{i}": "x" * 300 for i in range(90)}
    command = "python train.py " + "--flag " * 500
    job = client.post("/api/v1/jobs", json=JOB | {"command": command, "env": env, "ports": [6006]},
                      headers=world.auth("alice")).get_json()
    item = client.get("/api/v1/jobs", headers=world.auth("alice")).get_json()["items"][0]
    assert item["id"] == job["id"] and "env" not in item and "command" not in item and "ports" not in item
    from dlts.services.jobs import COMMAND_PREVIEW_CHARS

    assert item["command_preview"] == command[:COMMAND_PREVIEW_CHARS] and item["command_truncated"] is True
    assert len(json.dumps(item)) < 2000
    full = client.get(f"/api/v1/jobs/{job['id']}", headers=world.auth("alice")).get_json()
    assert full["env"] == env and full["command"] == command and full["ports"] == [6006]
    short = client.post("/api/v1/jobs", json=JOB, headers=world.auth("alice")).get_json()
    first = client.get("/api/v1/jobs", headers=world.auth("alice")).get_json()["items"][0]
    assert first["id"] == short["id"] and first["command_preview"] == "true" and first["command_truncated"] is False


def test_a_500_job_admin_listing_stays_small(client, world, sessions, settings):
    env = {f"V{i}": "y" * 300 for i in range(90)}
    for _ in range(60):
        make_job(sessions, settings, env=env)
    response = client.get("/api/v1/jobs?limit=500", headers=world.auth("admin"))
    assert response.status_code == 200 and len(response.get_json()["items"]) == 60
    assert len(response.get_data()) < 60 * 1500  # every job's env is ~27 KiB: none of it is in the list


@pytest.mark.parametrize("extra,field,limit", [
    ({"command": "x" * 16385}, "command", 16384),
    ({"env": {f"V{i}": "1" for i in range(101)}}, "env", 100),
    ({"env": {"BIG": "v" * 4097}}, "env.BIG", 4096),
    ({"env": {f"V{i}": "v" * 4000 for i in range(9)}}, "env", 32768),
])
def test_oversized_submissions_are_a_422_naming_the_field_and_the_limit(client, world, sessions, extra, field, limit):
    error = assert_envelope(client.post("/api/v1/jobs", json=JOB | extra, headers=world.auth("alice")), 422, "field_too_large")
    assert error["details"]["field"] == field and error["details"]["limit"] == limit and str(limit) in error["message"]
    assert job_count(sessions) == 0


def test_the_largest_allowed_submission_is_accepted(client, world, sessions):
    env = {f"V{i}": "v" * 300 for i in range(100)}
    response = client.post("/api/v1/jobs", json=JOB | {"command": "x" * 16384, "env": env}, headers=world.auth("alice"))
    assert response.status_code == 201, response.get_json()
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.length(Job.command))) == 16384


@pytest.mark.parametrize("memory", ["١Gi", "²Gi", "١٢"])
def test_sizes_take_ascii_digits_only(client, world, sessions, memory):
    error = assert_envelope(client.post("/api/v1/jobs", json=JOB | {"memory": memory}, headers=world.auth("alice")), 400)
    assert "memory" in json.dumps(error)
    assert job_count(sessions) == 0


@pytest.mark.parametrize("body", ['{"a": NaN}', '{"a": Infinity}', '{"a": 1e400}', '{"a": "\\ud800"}',
                                  '{"a": ' + "[" * 40 + "]" * 40 + "}"], ids=["NaN", "Infinity", "1e400", "surrogate", "deep"])
def test_every_operation_with_a_json_body_refuses_what_the_database_cannot_store(client, world, node_token, body):
    """Walks the served OpenAPI document: no route reads a JSON body past the strict parser."""
    doc = client.get("/api/v1/openapi.json").get_json()
    values = {"job_id": "1", "endpoint_id": "1", "name": "testnode", "cycle_id": "1", "credential_id": "1",
              "key_id": "1", "entry_id": "1", "token_id": "1", "user_name": "alice"}
    checked = []
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            if method not in ("post", "put", "patch") or "requestBody" not in operation:
                continue
            url = path
            for key, value in values.items():
                url = url.replace("{" + key + "}", value)
            if "/vcs/" in path:
                url = url.replace("testnode", "vision")
            token = node_token if path.endswith("/report") else world.tokens["admin"]
            response = client.open(url, method=method.upper(), data=body, content_type="application/json",
                                   headers={"Authorization": f"Bearer {token}"})
            assert_envelope(response, 400, "invalid_json")
            checked.append(f"{method} {path}")
    assert len(checked) >= 15, checked
