"""The control plane's Prometheus metrics: the API's /metrics (who may read it, what it shows), the
job manager's tick and scheduler metrics, the database collectors, Kubernetes request counts, and
the instrumented periodic managers."""

from __future__ import annotations

import datetime as dt
import sys
import time
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from dlts import metrics
from dlts.config import ConfigError, load_settings

ROOT = Path(__file__).resolve().parents[2]


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def submit(url, world, user="alice", **body):
    job = {"vc": "vision", "image": "debian:12", "command": "sleep 30", "gpus": 1} | body
    response = requests.post(f"{url}/api/v1/jobs", json=job, headers=world.auth(user), timeout=10)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def test_the_api_counts_requests_by_url_rule_and_status_and_times_its_sql(live, world):
    job_id = submit(live.url, world)
    requests.get(f"{live.url}/api/v1/jobs/{job_id}", headers=world.auth("alice"), timeout=5)
    requests.get(f"{live.url}/api/v1/jobs/{job_id + 999}", headers=world.auth("alice"), timeout=5)
    requests.get(f"{live.url}/no/such/page", timeout=5)
    response = requests.get(f"{live.url}/metrics", timeout=5)
    assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/plain")
    got = samples(response.text)
    rule = "/api/v1/jobs/<job_id>"
    assert got[("dlts_http_requests_total", frozenset({"method": "POST", "endpoint": "/api/v1/jobs", "status": "201"}.items()))] >= 1
    assert got[("dlts_http_requests_total", frozenset({"method": "GET", "endpoint": rule, "status": "200"}.items()))] >= 1
    assert got[("dlts_http_requests_total", frozenset({"method": "GET", "endpoint": rule, "status": "404"}.items()))] >= 1
    assert got[("dlts_http_requests_total", frozenset({"method": "GET", "endpoint": "unmatched", "status": "404"}.items()))] >= 1
    assert got[("dlts_http_request_duration_seconds_count", frozenset({"method": "GET", "endpoint": rule}.items()))] >= 2
    assert got[("dlts_db_query_duration_seconds_count", frozenset({"operation": "select"}.items()))] > 0
    assert got[("dlts_db_query_duration_seconds_count", frozenset({"operation": "insert"}.items()))] > 0
    assert ("dlts_db_pool_connections_in_use", frozenset()) in got
    # aggregate only: no path with the job's id, no user, no token
    assert f"/jobs/{job_id}" not in response.text and "alice" not in response.text
    assert world.tokens["alice"] not in response.text and "job_id=" not in response.text


def test_metrics_refuses_addresses_outside_the_allowlist_and_accepts_the_scrape_token(tmp_path, settings, world):
    from dlts.app import create_app

    token = tmp_path / "scrape-token"
    token.write_text("s3cret-scrape-token\n")
    app = create_app(settings.model_copy(update={"metrics_allow_cidrs": ("10.9.0.0/16",), "metrics_token_file": token}))
    client = app.test_client()
    refused = client.get("/metrics", environ_base={"REMOTE_ADDR": "127.0.0.1"})
    assert refused.status_code == 403 and refused.get_json()["error"]["code"] == "forbidden"
    assert "metrics_allow_cidrs" in refused.get_json()["error"]["message"]
    assert client.get("/metrics", environ_base={"REMOTE_ADDR": "10.9.3.4"}).status_code == 200
    assert client.get("/metrics", environ_base={"REMOTE_ADDR": "::ffff:10.9.3.4"}).status_code == 200
    assert client.get("/metrics", environ_base={"REMOTE_ADDR": "192.0.2.1"},
                      headers={"Authorization": "Bearer wrong"}).status_code == 403
    assert client.get("/metrics", environ_base={"REMOTE_ADDR": "192.0.2.1"},
                      headers={"Authorization": f"Bearer {world.tokens['admin']}"}).status_code == 403
    scraped = client.get("/metrics", environ_base={"REMOTE_ADDR": "192.0.2.1"},
                         headers={"Authorization": "Bearer s3cret-scrape-token"})
    assert scraped.status_code == 200 and b"dlts_http_requests_total" in scraped.data


def test_the_metrics_settings_are_checked_at_start_up(tmp_path, settings, monkeypatch):
    from dlts.app import create_app

    with pytest.raises(ConfigError, match=r"metrics_token_file: cannot read .*missing"):
        create_app(settings.model_copy(update={"metrics_token_file": tmp_path / "missing"}))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="metrics_token_file: .* is empty"):
        create_app(settings.model_copy(update={"metrics_token_file": tmp_path / "empty"}))
    monkeypatch.setenv("DLTS_METRICS_ALLOW_CIDRS", "127.0.0.1/32, 10.0.0.0/33")
    with pytest.raises(ConfigError, match="METRICS_ALLOW_CIDRS.*10.0.0.0/33"):
        load_settings()
    monkeypatch.setenv("DLTS_METRICS_ALLOW_CIDRS", "127.0.0.1, 10.0.0.0/8")
    assert load_settings().metrics_allow_cidrs == ("127.0.0.1/32", "10.0.0.0/8")
    cfg = tmp_path / "dlts.yaml"
    cfg.write_text(f"metrics_token_file: {tmp_path / 'empty'}\nmetrics_allow_cidrs: ['192.0.2.0/24']\n")
    monkeypatch.delenv("DLTS_METRICS_ALLOW_CIDRS")
    loaded = load_settings(cfg)
    assert loaded.metrics_token_file == tmp_path / "empty" and loaded.metrics_allow_cidrs == ("192.0.2.0/24",)


def test_a_tick_records_its_duration_the_scheduler_phases_placements_waits_and_queue_wait(live, world):
    before = {"ticks": value("dlts_jobmanager_ticks_total"), "tick": value("dlts_jobmanager_tick_duration_seconds_count"),
              "pass": value("dlts_scheduler_pass_duration_seconds_count"),
              "assign": value("dlts_scheduler_phase_duration_seconds_count", phase="assign"),
              "start": value("dlts_scheduler_placements_total", kind="start"),
              "wait": value("dlts_job_queue_wait_seconds_count", vc="vision", type="batch")}
    for _ in range(5):  # 4 GPUs on testnode: 4 start, the fifth waits
        submit(live.url, world)
    live.tick()
    assert value("dlts_jobmanager_ticks_total") == before["ticks"] + 1
    assert value("dlts_jobmanager_tick_duration_seconds_count") == before["tick"] + 1
    assert value("dlts_scheduler_pass_duration_seconds_count") == before["pass"] + 1
    assert value("dlts_scheduler_phase_duration_seconds_count", phase="assign") == before["assign"] + 1
    assert value("dlts_scheduler_placements_total", kind="start") == before["start"] + 4
    assert value("dlts_scheduler_pass_placements") == 4
    assert value("dlts_job_queue_wait_seconds_count", vc="vision", type="batch") == before["wait"] + 4
    waiting = {r: value("dlts_scheduler_pass_waiting_jobs", reason=r) for r in ("vc_quota", "no_capacity", "fragmentation")}
    assert sum(waiting.values()) == 1, waiting


def test_tick_errors_are_counted_by_kind(sessions, settings):
    from dlts.backends.base import BackendUnavailable
    from dlts.jobmanager import JobManager

    class Down:
        def nodes(self):
            raise BackendUnavailable("the API server does not answer")

    class Broken:
        def nodes(self):
            raise RuntimeError("bug")

    unavailable, exception = value("dlts_jobmanager_tick_errors_total", error="backend_unavailable"), \
        value("dlts_jobmanager_tick_errors_total", error="exception")
    JobManager(sessions, Down(), settings).tick()
    with pytest.raises(RuntimeError):
        JobManager(sessions, Broken(), settings).tick()
    assert value("dlts_jobmanager_tick_errors_total", error="backend_unavailable") == unavailable + 1
    assert value("dlts_jobmanager_tick_errors_total", error="exception") == exception + 1


def test_the_cluster_collector_reads_jobs_allocation_and_capacity_from_the_database(live, world, sessions):
    from dlts.models import Job, utcnow

    for user in ("alice", "alice", "bob"):
        submit(live.url, world, user=user)
    submit(live.url, world, user="alice", gpus=4)  # waits: only one GPU left
    live.tick()
    with sessions() as s:
        s.execute(sa.update(Job).where(Job.status == "queued").values(queue_time=utcnow() - dt.timedelta(seconds=120)))
        s.commit()
    registry = CollectorRegistry()
    registry.register(metrics.ClusterMetrics(sessions))
    get = registry.get_sample_value
    active = sum(get("dlts_jobs", {"status": s, "vc": "vision"}) for s in ("scheduling", "running"))
    assert active == 3 and get("dlts_jobs", {"status": "queued", "vc": "vision"}) == 1
    assert get("dlts_jobs", {"status": "queued", "vc": "nlp"}) == 0
    assert 110 < get("dlts_jobs_oldest_queued_age_seconds", {"vc": "vision"}) < 400
    assert get("dlts_jobs_oldest_queued_age_seconds", {"vc": "nlp"}) == 0
    labels = {"vc": "vision", "sku": "demo-gpu", "preemptible": "false"}
    assert get("dlts_gpus_allocated", labels | {"user": "alice"}) == 2
    assert get("dlts_gpus_allocated", labels | {"user": "bob"}) == 1
    assert get("dlts_node_capacity_gpus", {"node": "testnode", "sku": "demo-gpu"}) == 4
    assert get("dlts_node_allocated_gpus", {"node": "testnode", "sku": "demo-gpu"}) == 3
    assert get("dlts_vc_gpu_quota", {"vc": "vision", "sku": "demo-gpu"}) == 4
    assert get("dlts_node_state", {"node": "testnode", "state": "in_service"}) == 1
    assert get("dlts_node_state", {"node": "testnode", "state": "lost"}) == 0
    assert get("dlts_node_last_heartbeat_timestamp_seconds", {"node": "testnode"}) is None  # no agent reported


def test_manager_runs_are_counted_timed_and_their_results_recorded():
    from dlts.managers.janitor import PurgeResult
    from dlts.managers.notify import NotifyRun

    ok, err = value("dlts_manager_runs_total", manager="t.janitor", result="ok"), \
        value("dlts_manager_runs_total", manager="t.janitor", result="error")
    rows = value("dlts_janitor_deleted_rows_total", table="events")
    sent = value("dlts_notify_messages_total", outcome="sent")
    metrics.instrumented("t.janitor", lambda: PurgeResult(jobs=2, attempts=3, events=40, batches=1, elapsed_s=0.1,
                                                          longest_batch_s=0.1))()
    metrics.instrumented("t.notify", lambda: NotifyRun(sent=3, failed=1))()

    def broken():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        metrics.instrumented("t.janitor", broken)()
    assert value("dlts_manager_runs_total", manager="t.janitor", result="ok") == ok + 1
    assert value("dlts_manager_runs_total", manager="t.janitor", result="error") == err + 1
    assert value("dlts_manager_run_duration_seconds_count", manager="t.janitor") >= 2
    assert value("dlts_janitor_deleted_rows_total", table="events") == rows + 40
    assert value("dlts_notify_messages_total", outcome="sent") == sent + 3
    assert value("dlts_manager_last_success_timestamp_seconds", manager="t.notify") > time.time() - 60


def test_kubernetes_requests_are_counted_by_verb_and_code():
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    from tests.fakes.kube_apiserver import FakeClock, FakeKubeApiServer

    with FakeKubeApiServer(FakeClock()) as server:
        server.add_node("n1", gpus=8, cpu="96", memory="900Gi", labels={})
        cfg = k8s.Configuration()
        cfg.host = server.url
        cfg.api_key = {"authorization": server.token}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        api_client = k8s.ApiClient(cfg)
        metrics.instrument_kubernetes(api_client)
        metrics.instrument_kubernetes(api_client)  # twice is harmless: counted once
        core = k8s.CoreV1Api(api_client)
        got, missing = value("dlts_kubernetes_requests_total", verb="get", code="200"), \
            value("dlts_kubernetes_requests_total", verb="get", code="404")
        deleted = value("dlts_kubernetes_requests_total", verb="delete", code="404")
        core.list_node()
        with pytest.raises(ApiException):
            core.read_namespaced_pod("nope", "default")
        with pytest.raises(ApiException):
            core.delete_namespaced_pod("nope", "default")
        api_client.close()
    assert value("dlts_kubernetes_requests_total", verb="get", code="200") == got + 1
    assert value("dlts_kubernetes_requests_total", verb="get", code="404") == missing + 1
    assert value("dlts_kubernetes_requests_total", verb="delete", code="404") == deleted + 1
    assert value("dlts_kubernetes_request_duration_seconds_count", verb="get") >= 2
