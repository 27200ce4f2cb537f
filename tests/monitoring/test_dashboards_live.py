"""Every Grafana dashboard panel's PromQL returns series from a real Prometheus (Debian's
/usr/bin/prometheus) that scrapes a running system and evaluates monitoring/'s rules:

- ``dlts demo`` with 8 pretend GPUs (its /metrics serves the API's metrics and, having no managers
  process, the job manager's, the scheduler's and the database collectors', the repair loop's
  included), running the jobs the test submits;
- two node agents with exporters on, reading the fake NVML (healthy-8xa100 as the demo's node,
  dbe-gpu3 as a second node); both see the demo's job processes, so GPU series carry job labels;
  their Lustre collector runs the fake ``lctl`` of tests/lustre;
- ``dlts-lustre serve-metrics`` over the fake ``lfs``/``lctl`` (a filesystem with a pool and OST stats);
- the Kubernetes client of this test process, instrumented as the backend's is, against the fake
  API server of tests/fakes (the only Kubernetes here), served for the dlts_kubernetes_* panel.

Variables are resolved through Prometheus's label API (an "All" variable as its allValue ``.*``).
The rule groups' 30 s intervals are dropped in the copy Prometheus loads, so that it evaluates them
every second: the test takes about a minute.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "monitoring" / "grafana" / "dashboards").glob("*.json"))
RULES = sorted((ROOT / "monitoring" / "prometheus" / "rules").glob("*.yml"))
FAKE_LUSTRE_BIN = ROOT / "tests" / "lustre" / "fakebin"
RATE_INTERVAL = "5m"
DEADLINE_S = 75

pytestmark = [pytest.mark.timeout(240)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, what: str, timeout_s: float = 60, **kwargs) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if requests.get(url, timeout=10, **kwargs).status_code == 200:
                return
        except (requests.ConnectionError, requests.Timeout):
            pass
        if proc.poll() is not None:
            pytest.fail(f"{what} exited: {proc.stdout.read() if proc.stdout else ''}")
        assert time.monotonic() < deadline, f"{what} did not come up"
        time.sleep(0.2)


def lustre_state(mount: Path) -> dict:
    gib = 1024 * 1024  # KiB
    stats = {"snapshot_time": 1000.0, "start_time": 0.0, "counters": {
        "read_bytes": {"samples": 40, "unit": "bytes", "min": 4096, "max": 1048576, "sum": 9_000_000},
        "write_bytes": {"samples": 20, "unit": "bytes", "min": 4096, "max": 1048576, "sum": 5_000_000},
        "statfs": {"samples": 7, "unit": "usecs", "min": 1, "max": 9, "sum": 50}}}
    return {
        "version": "2.15.4", "fsname": "dltsfs", "mount": str(mount),
        "mdts": [{"index": 0, "kib_total": 100 * gib, "kib_used": 2 * gib, "inodes_total": 50_000_000,
                  "inodes_used": 1_000_000}],
        "osts": [{"index": i, "kib_total": 1000 * gib, "kib_used": 100 * gib * (i + 1), "inodes_total": 60_000_000,
                  "inodes_used": 500_000} for i in range(4)],
        "pools": {}, "users": {"alice": 1001}, "groups": {}, "quotas": {"u": {}, "g": {}, "p": {}},
        "defaults": {}, "grace": {}, "dirs": {}, "health": "healthy",
        "stats": {"obdfilter": {"OST0000": stats, "OST0001": stats}},
    }


def agent_config(path: Path, node: str, port: int, state_dir: Path, run_dir: Path) -> Path:
    """An agent on the demo's machine: its jobs are the demo's local units under ``run_dir`` (the
    agent attributes processes from the units' DLTS inits, never from their environment)."""
    state_dir.mkdir(parents=True)
    (state_dir / "kmsg").touch()
    path.write_text(yaml.safe_dump({
        "node_name": node, "interval_s": 1, "state_dir": str(state_dir), "expected_gpu_count": 8,
        "exporter": {"enabled": True, "listen_address": "127.0.0.1", "port": port},
        "firewall": {"enabled": False}, "actions": {"enabled": False}, "report": {"enabled": False},
        "collectors": {"host": {"mounts": [str(state_dir)]}, "nfs": {"mounts": ["/"]},
                       "jobs": {"local_run_dir": str(run_dir)},
                       "xid": {"source": "kmsg", "kmsg_path": str(state_dir / "kmsg")}},
    }))
    return path


def prometheus_rules(dest: Path) -> list[str]:
    """The rule files as shipped, without their groups' evaluation intervals."""
    out = []
    for path in RULES:
        doc = yaml.safe_load(path.read_text())
        for group in doc["groups"]:
            group.pop("interval", None)
        copy = dest / path.name
        copy.write_text(yaml.safe_dump(doc, sort_keys=False))
        out.append(str(copy))
    return out


def resolve(prom: str, query: str) -> list[str]:
    """label_values(SELECTOR, LABEL) through Prometheus's label API, as Grafana resolves it."""
    inner = query.strip()[len("label_values("):-1]
    selector, _, label = inner.rpartition(",")
    response = requests.get(f"{prom}/api/v1/label/{label.strip()}/values", params={"match[]": selector.strip()}, timeout=5)
    return [v for v in response.json()["data"] if v]


def substitute(expr: str, values: dict[str, str]) -> str:
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    for name, value in sorted(values.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    return expr


def panel_queries(dashboard: dict) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]


def test_dashboards_are_provisionable_grafana_json():
    assert {p.name for p in DASHBOARDS} == {"dlts-cluster.json", "dlts-vc.json", "dlts-job.json",
                                            "dlts-node-repair.json", "dlts-lustre.json"}
    template = (ROOT / "ansible" / "roles" / "monitoring" / "templates" / "grafana-datasources.yml.j2").read_text()
    datasource = re.search(r"uid: (\S+)", template).group(1)  # the datasource the role provisions
    uids = set()
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        assert dashboard["uid"] not in uids and dashboard["title"].startswith("DLTS / ")
        uids.add(dashboard["uid"])
        ids = [p["id"] for p in dashboard["panels"]]
        assert len(ids) == len(set(ids)) and dashboard["panels"], path.name
        for panel in dashboard["panels"]:
            assert panel["datasource"]["uid"] == datasource, (path.name, panel["title"])
            assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), (path.name, panel["title"])
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24, (path.name, panel["title"])
        for variable in dashboard["templating"]["list"]:
            assert variable["datasource"]["uid"] == datasource
            assert variable["query"]["query"].startswith("label_values(")
    job = json.loads((ROOT / "monitoring" / "grafana" / "dashboards" / "dlts-job.json").read_text())
    assert [v["name"] for v in job["templating"]["list"]] == ["job_id"]


def test_every_dashboard_query_returns_series_from_prometheus_scraping_the_demo_and_agents(tmp_path, monkeypatch):
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.fail("prometheus is required (apt-get install prometheus)")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from kubernetes import client as k8s
    from prometheus_client import REGISTRY, start_http_server

    from dlts.metrics import instrument_kubernetes
    from dlts_lustre.client import LustreClient, cmd_pool_add, cmd_pool_new
    from tests.fakes.kube_apiserver import FakeClock, FakeKubeApiServer

    procs: list[subprocess.Popen] = []
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("DLTS_", "PROMETHEUS_MULTIPROC"))}

    def start(args: list[str], env: dict | None = None) -> subprocess.Popen:
        proc = subprocess.Popen(args, env=env or base_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(proc)
        return proc

    # the fake Lustre on PATH, for the exporter, the agents' collector and this process's client
    lustre_dir, mount = tmp_path / "fake-lustre", tmp_path / "mnt" / "dltsfs"
    lustre_dir.mkdir()
    mount.mkdir(parents=True)
    (lustre_dir / "state.json").write_text(json.dumps(lustre_state(mount)))
    lustre_env = {"DLTS_FAKE_LUSTRE_DIR": str(lustre_dir), "DLTS_FAKE_LUSTRE_PYTHON": sys.executable,
                  "PATH": f"{FAKE_LUSTRE_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    for key, value in lustre_env.items():
        monkeypatch.setenv(key, value)
    # pools are made on the MGS, as on a real filesystem (the fake lctl refuses them elsewhere)
    monkeypatch.setenv("DLTS_LUSTRE_MGS_COMMAND", "env DLTS_FAKE_LUSTRE_NODE=mgs")
    client = LustreClient()
    client.execute(cmd_pool_new("dltsfs", "vc_default"))
    client.execute(cmd_pool_add("dltsfs", "vc_default", [0, 1]))
    env = base_env | lustre_env

    home, demo_port = tmp_path / "demo", free_port()
    home.mkdir()
    (home / "dlts.yaml").write_text("repair:\n  interval_s: 1\n")
    agents = {"healthy-8xa100": free_port(), "dbe-gpu3": free_port()}
    lustre_port, k8s_port, prom_port = free_port(), free_port(), free_port()
    k8s_server = FakeKubeApiServer(FakeClock()).start()
    try:
        demo = start([sys.executable, "-m", "dlts.cli", "demo", "--port", str(demo_port), "--demo-gpus", "8"],
                     env | {"DLTS_HOME": str(home), "DLTS_PREEMPT_GRACE_S": "1", "DLTS_TICK_S": "0.3"})
        demo_url = f"http://127.0.0.1:{demo_port}"
        wait_http(f"{demo_url}/readyz", demo, "the demo")
        admin = {"Authorization": "Bearer " + (home / "demo-token").read_text().strip()}
        node_name = requests.get(f"{demo_url}/api/v1/nodes", headers=admin, timeout=5).json()["items"][0]["name"]
        nodes = {"healthy-8xa100": node_name, "dbe-gpu3": "gpu-node-2"}
        for scenario, port in agents.items():
            config = agent_config(tmp_path / f"agent-{scenario}.yaml", nodes[scenario], port, tmp_path / f"agent-{scenario}",
                                  (home / "run").resolve())
            start([sys.executable, "-m", "dlts_agent.cli", "--config", str(config), "--fake-nvml", scenario], env)
        lustre = start([sys.executable, "-m", "dlts_lustre.cli", "serve-metrics", str(mount),
                        "--listen", f"127.0.0.1:{lustre_port}"], env)
        k8s_server.add_node("n1", gpus=8, cpu="96", memory="900Gi", labels={})
        cfg = k8s.Configuration()
        cfg.host = k8s_server.url
        cfg.api_key = {"authorization": k8s_server.token}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        api_client = k8s.ApiClient(cfg)
        instrument_kubernetes(api_client)
        k8s.CoreV1Api(api_client).list_node()
        metrics_server, _ = start_http_server(k8s_port, addr="127.0.0.1", registry=REGISTRY)

        rules_dir = tmp_path / "rules"
        rules_dir.mkdir()
        targets = [{"targets": [f"127.0.0.1:{port}"], "labels": {"node": nodes[scenario]}} for scenario, port in agents.items()]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "external_labels": {"cluster": "test"}},
            "rule_files": prometheus_rules(rules_dir),
            "scrape_configs": [
                {"job_name": "dlts-api", "static_configs": [{"targets": [f"127.0.0.1:{demo_port}"]}]},
                {"job_name": "dlts-agent", "static_configs": targets},
                # every scrape runs the fake lfs/lctl (Python processes): slower than a second
                {"job_name": "dlts-lustre", "scrape_interval": "5s", "scrape_timeout": "5s",
                 "static_configs": [{"targets": [f"127.0.0.1:{lustre_port}"]}]},
                {"job_name": "dlts-kubernetes-client", "static_configs": [{"targets": [f"127.0.0.1:{k8s_port}"]}]},
            ],
        }))
        prom_proc = start([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                           f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"])
        prom = f"http://127.0.0.1:{prom_port}"
        wait_http(f"{prom}/-/ready", prom_proc, "prometheus")
        wait_http(f"http://127.0.0.1:{lustre_port}/metrics", lustre, "dlts-lustre serve-metrics")

        # jobs after Prometheus scrapes, so the queue-wait histogram and the counters rise inside its window
        time.sleep(2)
        alice = {"Authorization": "Bearer " + (home / "alice-token").read_text().strip()}
        for body in ({"gpus": 2}, {"gpus": 1}, {"gpus": 1, "preemptible": True}, {"gpus": 8}):
            job = {"vc": "default", "image": "debian:12", "command": "sleep 600"} | body
            response = requests.post(f"{demo_url}/api/v1/jobs", json=job, headers=alice, timeout=10)
            assert response.status_code == 201, response.text

        deadline = time.monotonic() + DEADLINE_S
        while True:
            empty = []
            for path in DASHBOARDS:
                dashboard = json.loads(path.read_text())
                values = {}
                for variable in dashboard["templating"]["list"]:
                    options = resolve(prom, variable["query"]["query"])
                    values[variable["name"]] = variable["allValue"] if variable.get("includeAll") else \
                        (options[0] if options else "none")
                for title, expr in panel_queries(dashboard):
                    query = substitute(expr, values)
                    response = requests.get(f"{prom}/api/v1/query", params={"query": query}, timeout=10).json()
                    assert response["status"] == "success", (path.name, title, query, response)
                    if not response["data"]["result"]:
                        empty.append(f"{path.name}: {title}: {query}")
            if not empty:
                break
            for proc in procs:
                assert proc.poll() is None, proc.args
            if time.monotonic() > deadline:
                targets = requests.get(f"{prom}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
                health = [f"{t['labels']['job']} {t['scrapeUrl']}: {t['health']} {t['lastError']}" for t in targets]
                seen = {q: requests.get(f"{prom}/api/v1/query", params={"query": q}, timeout=10).json()["data"]["result"]
                        for q in ("count by (node) (dlts_gpu_utilization_ratio)", "dlts_node_capacity_gpus")}
                groups = requests.get(f"{prom}/api/v1/rules", timeout=5).json()["data"]["groups"]
                failing = [f"{r['name']}: {r['lastError']}" for g in groups for r in g["rules"] if r.get("lastError")]
                pytest.fail("panels without series:\n" + "\n".join(empty) + "\ntargets:\n" + "\n".join(health)
                            + f"\nrules failing: {failing}\nnodes the agents and the managers report: {seen}")
            time.sleep(2)
        api_client.close()
        metrics_server.shutdown()
    finally:
        k8s_server.stop()
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
