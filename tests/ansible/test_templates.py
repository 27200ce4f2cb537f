"""Every role template, rendered with both inventories, checked by the tool that reads it for real.

systemd-analyze verify for units, nginx -t for the proxy, promtool/amtool for Prometheus and
Alertmanager, mariadbd for the server settings, `dlts config check` for the control-plane config,
dlts_lustre's planner (against the fake lfs/lctl of tests/lustre) for the storage manager's Lustre inputs,
the Kubernetes client for the managers' kubeconfig, and parsers (TOML, YAML) where no tool exists
on this machine (containerd, kubeadm, exports).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from ansible_helpers import (
    INVENTORIES,
    OPERATOR_SECRETS,
    OPERATOR_SECTIONS,
    REPO,
    SCHEDULING,
    ansible_env,
    make_stub_executables,
    render_templates,
    tool,
)

pytestmark = pytest.mark.slow

FAKE_LUSTRE_BIN = REPO / "tests" / "lustre" / "fakebin"
OPTIONAL_SETTINGS = {"dlts_log_max_bytes": 1048576, "dlts_start_timeout_s": 900, "dlts_node_lost_after_s": 240}


@pytest.fixture(scope="module", params=sorted(INVENTORIES))
def rendered(request, tmp_path_factory):
    """(inventory name, {role: dir of rendered files}, work dir) for each inventory."""
    name = request.param
    work = tmp_path_factory.mktemp(f"render-{name}")
    # Paths the checking tools open are pointed into the work dir; everything else is the inventory's.
    make_stub_executables(work / "venv" / "bin", ("gunicorn", "dlts"))
    make_stub_executables(work / "agent-venv" / "bin", ("dlts-agent", "dlts-lustre"))
    make_stub_executables(work / "sbin", ("dlts-db-backup",))
    subprocess.run(
        [tool("openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=dlts-test",
         "-keyout", str(work / "tls.key"), "-out", str(work / "tls.crt")],
        check=True, capture_output=True,
    )
    (work / "k8s-token").write_text("token\n")
    shutil.copy(work / "tls.crt", work / "k8s-ca.crt")
    (work / "lustre-mount").mkdir()
    overrides = {
        "dlts_control_venv": str(work / "venv"),
        "dlts_agent_venv": str(work / "agent-venv"),
        "dlts_control_tls_cert": str(work / "tls.crt"),
        "dlts_control_tls_key": str(work / "tls.key"),
        "monitoring_kubernetes_token_file": str(work / "k8s-token"),
        "monitoring_kubernetes_ca_file": str(work / "k8s-ca.crt"),
        "lustre_mount_point": str(work / "lustre-mount"),
        "lustre_policy_command": str(work / "agent-venv" / "bin" / "dlts-lustre"),
        "mariadb_backup_script": str(work / "sbin" / "dlts-db-backup"),
    }
    if name == "example":  # the optional lifecycle settings, set (the lab leaves them to DLTS's defaults)
        overrides.update(OPTIONAL_SETTINGS)
    return name, render_templates(name, work / "out", overrides), work


def _verify_units(unit_dir: Path, *units: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, SYSTEMD_UNIT_PATH=f"{unit_dir}:")
    return subprocess.run(
        [tool("systemd-analyze"), "verify", *(str(unit_dir / u) for u in units)],
        env=env, capture_output=True, text=True, timeout=60,
    )


def test_control_plane_units_pass_systemd_analyze_verify(rendered):
    _, out, work = rendered
    units = work / "units-control"
    units.mkdir()
    for unit in ("dlts-api.service", "dlts-managers.service"):
        shutil.copy(out["dlts_control"] / unit, units / unit)
    result = _verify_units(units, "dlts-api.service", "dlts-managers.service")
    assert result.returncode == 0, result.stderr
    api = (units / "dlts-api.service").read_text()
    assert "'dlts.app:create_app()'" in api
    assert "--bind 127.0.0.1:5000" in api


def test_database_backup_units_pass_systemd_analyze_verify_and_the_scripts_parse(rendered):
    _, out, work = rendered
    units = work / "units-db-backup"
    units.mkdir()
    for unit in ("dlts-db-backup.service", "dlts-db-backup.timer"):
        shutil.copy(out["mariadb"] / unit, units / unit)
    result = _verify_units(units, "dlts-db-backup.timer", "dlts-db-backup.service")
    assert result.returncode == 0, result.stderr
    timer = (units / "dlts-db-backup.timer").read_text()
    assert "OnCalendar=*-*-* 02:15:00" in timer and "Persistent=true" in timer
    assert "User=mysql" in (units / "dlts-db-backup.service").read_text()
    # The scripts run for real in test_db_backup.py; here bash parses each as rendered.
    for script in ("dlts-db-backup", "dlts-db-restore", "dlts-db-replica-setup"):
        parsed = subprocess.run(["bash", "-n", str(out["mariadb"] / script)], capture_output=True, text=True, check=False)
        assert parsed.returncode == 0, (script, parsed.stderr)


@pytest.mark.parametrize("unit_source", ["repository", "role fallback"])
def test_agent_unit_with_the_ansible_drop_in_passes_systemd_analyze_verify(rendered, unit_source):
    _, out, work = rendered
    units = work / f"units-agent-{unit_source.replace(' ', '-')}"
    (units / "dlts-agent.service.d").mkdir(parents=True)
    repo_unit = REPO / "agents" / "systemd" / "dlts-agent.service"
    if unit_source == "repository":
        assert repo_unit.exists(), "agents/systemd/dlts-agent.service is missing"
        shutil.copy(repo_unit, units / "dlts-agent.service")
    else:
        shutil.copy(out["dlts_agent"] / "dlts-agent.service", units / "dlts-agent.service")
    shutil.copy(out["dlts_agent"] / "dlts-agent-override.conf", units / "dlts-agent.service.d" / "10-ansible.conf")
    result = _verify_units(units, "dlts-agent.service")
    assert result.returncode == 0, result.stderr
    # The drop-in really takes part: pointing it at a missing binary must fail the check.
    dropin = units / "dlts-agent.service.d" / "10-ansible.conf"
    dropin.write_text(dropin.read_text().replace("/bin/dlts-agent", "/bin/missing-agent"))
    assert _verify_units(units, "dlts-agent.service").returncode != 0


def test_nginx_site_passes_nginx_t(rendered):
    _, out, work = rendered
    prefix = work / "nginx"
    prefix.mkdir()
    (prefix / "nginx.conf").write_text(
        f"pid {prefix}/nginx.pid;\nerror_log {prefix}/error.log;\nevents {{}}\n"
        f"http {{\n  access_log off;\n  client_body_temp_path {prefix}/body;\n  proxy_temp_path {prefix}/proxy;\n"
        f"  include {out['dlts_control'] / 'nginx-dlts.conf'};\n}}\n"
    )
    result = subprocess.run(
        [tool("nginx"), "-t", "-p", str(prefix), "-c", str(prefix / "nginx.conf")],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_nginx_body_limit_matches_the_api_limit(rendered):
    _, out, _ = rendered
    config = yaml.safe_load((out["dlts_control"] / "dlts.yaml").read_text())
    site = (out["dlts_control"] / "nginx-dlts.conf").read_text()
    assert f"client_max_body_size {config['max_body_bytes']};" in site


def test_dlts_config_passes_dlts_config_check(rendered):
    name, out, _ = rendered
    dlts = Path(sys.executable).parent / "dlts"
    result = subprocess.run(
        [str(dlts), "config", "check"],
        env=dict(os.environ, DLTS_CONFIG=str(out["dlts_control"] / "dlts.yaml")),
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "database_url: mysql+pymysql://***@" in result.stdout
    expected_backend = "kubernetes"  # both inventories run jobs on Kubernetes
    assert f"backend: {expected_backend}" in result.stdout, name


def test_the_kubernetes_section_comes_from_the_inventory(rendered):
    from dlts.config import load_settings

    name, out, _ = rendered
    inventory = yaml.safe_load((INVENTORIES[name] / "group_vars/all/dlts.yml").read_text())
    k8s = load_settings(out["dlts_control"] / "dlts.yaml", environ={}).kubernetes
    assert k8s.kubeconfig == "/etc/dlts/kubeconfig"  # written there by the kubernetes_control_plane role
    assert (k8s.namespace, k8s.sku_label, k8s.ib_domain_label, k8s.vc_label) == tuple(
        inventory[v] for v in ("dlts_namespace", "dlts_node_label_sku", "dlts_node_label_ib_domain", "dlts_node_label_vc"))
    assert (k8s.priority_class, k8s.preemptible_priority_class) == (
        inventory["dlts_priority_class"], inventory["dlts_preemptible_priority_class"])
    settings = load_settings(out["dlts_control"] / "dlts.yaml", environ={})
    lifecycle = (settings.log_max_bytes, settings.start_timeout_s, settings.node_lost_after_s)
    if name == "example":
        assert lifecycle == tuple(OPTIONAL_SETTINGS.values())
    else:
        defaults = load_settings(environ={})
        assert lifecycle == (defaults.log_max_bytes, defaults.start_timeout_s, defaults.node_lost_after_s)
    dumped = k8s.model_dump(mode="json")
    for key, value in inventory["dlts_kubernetes"].items():
        if isinstance(value, dict):  # privileged_policy: VC -> features, dumped sorted
            value = {vc: sorted(features) for vc, features in value.items()}
        assert dumped[key] == value, key


def test_dlts_config_check_rejects_a_bad_rendered_value(rendered, tmp_path):
    _, out, _ = rendered
    broken = tmp_path / "dlts.yaml"
    broken.write_text((out["dlts_control"] / "dlts.yaml").read_text().replace("listen_port: 5000", "listen_port: 99999"))
    result = subprocess.run(
        [str(Path(sys.executable).parent / "dlts"), "config", "check"],
        env=dict(os.environ, DLTS_CONFIG=str(broken)), capture_output=True, text=True, timeout=60,
    )
    assert result.returncode != 0
    assert "listen_port" in result.stdout + result.stderr


def test_prometheus_config_passes_promtool(rendered):
    _, out, _ = rendered
    result = subprocess.run(
        [tool("promtool"), "check", "config", str(out["monitoring"] / "prometheus.yml")],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load((out["monitoring"] / "prometheus.yml").read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert {"dlts-agent", "dlts-api", "kubernetes-apiservers", "kubernetes-cadvisor"} <= jobs


def test_prometheus_scrapes_the_agent_on_every_host(rendered):
    name, out, _ = rendered
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    hosts = {h.name for h in InventoryManager(loader=DataLoader(), sources=[str(INVENTORIES[name])]).get_hosts()}
    config = yaml.safe_load((out["monitoring"] / "prometheus.yml").read_text())
    agent_job = next(job for job in config["scrape_configs"] if job["job_name"] == "dlts-agent")
    scraped = {entry["labels"]["node"] for entry in agent_job["static_configs"]}
    assert scraped == hosts
    assert all(t.endswith(":9445") for entry in agent_job["static_configs"] for t in entry["targets"])


def test_alertmanager_config_passes_amtool(rendered):
    _, out, _ = rendered
    result = subprocess.run(
        [tool("amtool"), "check-config", str(out["monitoring"] / "alertmanager.yml")],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_scrapes_the_managers_through_nginx_and_nginx_serves_them(rendered):
    name, out, _ = rendered
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    inventory = InventoryManager(loader=DataLoader(), sources=[str(INVENTORIES[name])])
    managers = inventory.get_groups_dict()["dlts_managers"]
    config = yaml.safe_load((out["monitoring"] / "prometheus.yml").read_text())
    job = next(job for job in config["scrape_configs"] if job["job_name"] == "dlts-managers")
    assert job["metrics_path"] == "/metrics/managers" and job["scheme"] == "https"
    targets = [t for entry in job["static_configs"] for t in entry["targets"]]
    assert len(targets) == len(managers) and all("labels" not in entry for entry in job["static_configs"])
    dlts_yaml = yaml.safe_load((out["dlts_control"] / "dlts.yaml").read_text())
    assert dlts_yaml["managers_metrics_listen"] == "127.0.0.1:9465"
    site = (out["dlts_control"] / "nginx-dlts.conf").read_text()
    assert "location = /metrics/managers" in site and "proxy_pass http://127.0.0.1:9465/metrics;" in site
    unit = (out["dlts_control"] / "dlts-api.service").read_text()
    assert "PROMETHEUS_MULTIPROC_DIR=/run/dlts-api-metrics" in unit and "RuntimeDirectory=dlts-api-metrics" in unit
    assert "--config python:dlts.gunicorn_conf" in unit


def test_the_lustre_metrics_unit_passes_systemd_analyze_and_prometheus_scrapes_it(rendered):
    name, out, work = rendered
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    units = work / "units-lustre"
    units.mkdir()
    shutil.copy(out["lustre_policy"] / "dlts-lustre-exporter.service", units / "dlts-lustre-exporter.service")
    result = _verify_units(units, "dlts-lustre-exporter.service")
    assert result.returncode == 0, result.stdout + result.stderr
    unit = (units / "dlts-lustre-exporter.service").read_text()
    assert f"serve-metrics {work / 'lustre-mount'} --listen 0.0.0.0:9446" in unit
    inventory = InventoryManager(loader=DataLoader(), sources=[str(INVENTORIES[name])])
    first = inventory.get_groups_dict()["lustre_clients"][0]
    address = inventory.get_host(first).vars.get("ansible_host", first)
    config = yaml.safe_load((out["monitoring"] / "prometheus.yml").read_text())
    job = next(job for job in config["scrape_configs"] if job["job_name"] == "dlts-lustre")
    assert [t for entry in job["static_configs"] for t in entry["targets"]] == [f"{address}:9446"]


def test_alertmanager_routes_each_severity_to_its_receiver(rendered):
    _, out, _ = rendered
    config = out["monitoring"] / "alertmanager.yml"
    for labels, receiver in ((["severity=critical", "alertname=DltsNodeLost"], "critical"),
                             (["severity=warning", "alertname=DltsDiskNearlyFull"], "warning"),
                             (["severity=info", "alertname=DltsLargeJobLowGpuEfficiency"], "info"),
                             (["alertname=Unlabelled"], "email")):
        result = subprocess.run([tool("amtool"), "config", "routes", "test", f"--config.file={config}", *labels],
                                capture_output=True, text=True, timeout=60)
        assert result.stdout.strip() == receiver, (labels, result.stdout, result.stderr)


def test_grafana_provisioning_files_are_valid(rendered):
    _, out, _ = rendered
    datasources = yaml.safe_load((out["monitoring"] / "grafana-datasources.yml").read_text())
    assert datasources["datasources"][0]["type"] == "prometheus"
    dashboards = yaml.safe_load((out["monitoring"] / "grafana-dashboards.yml").read_text())
    assert dashboards["providers"][0]["options"]["path"].startswith("/")


def test_mariadb_settings_are_accepted_by_mariadbd(rendered):
    _, out, _ = rendered
    result = subprocess.run(
        [tool("mariadbd"), f"--defaults-file={out['mariadb'] / '60-dlts.cnf'}", "--verbose", "--help"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "transaction-isolation" in result.stdout and "READ-COMMITTED" in result.stdout


def _fake_lustre_env(work: Path, fsname: str, mount: Path, mdts: int, osts: int) -> dict[str, str]:
    """State for the stateful fake lfs/lctl of tests/lustre (same format its tests use)."""
    gib_kib = 1024 * 1024
    state_dir = work / "fake-lustre"
    state_dir.mkdir(exist_ok=True)
    state = {
        "version": "2.15.4", "fsname": fsname, "mount": str(mount),
        "mdts": [{"index": i, "kib_total": 100 * gib_kib, "kib_used": gib_kib, "inodes_total": 50_000_000,
                  "inodes_used": 1000} for i in range(mdts)],
        "osts": [{"index": i, "kib_total": 1000 * gib_kib, "kib_used": gib_kib, "inodes_total": 60_000_000,
                  "inodes_used": 1000} for i in range(osts)],
        "pools": {}, "users": {}, "groups": {}, "quotas": {"u": {}, "g": {}, "p": {}}, "defaults": {}, "grace": {},
        "dirs": {}, "health": "healthy",
    }
    (state_dir / "state.json").write_text(json.dumps(state))
    return dict(
        os.environ,
        DLTS_FAKE_LUSTRE_DIR=str(state_dir),
        DLTS_FAKE_LUSTRE_PYTHON=sys.executable,
        PATH=f"{FAKE_LUSTRE_BIN}{os.pathsep}{os.environ['PATH']}",
    )


def test_the_rendered_lustre_defaults_and_seeded_vc_settings_apply_idempotently_against_the_fake(rendered):
    """The storage manager's inputs as the roles write them (dlts_control's lustre-defaults.yaml and
    the VC documents `dlts vc storage` seeds into the database) make a policy that converges, with the
    pool commands on the MGS, and a second pass changes nothing."""
    from dlts_lustre.client import LustreClient
    from dlts_lustre.plan import apply_plan, build_plan
    from dlts_lustre.policy import policy_from_vcs
    from dlts_lustre.runner import Runner

    name, out, work = rendered
    defaults = yaml.safe_load((out["dlts_control"] / "lustre-defaults.yaml").read_text())
    documents = json.loads((out["dlts_control"] / "vc-storage.json").read_text())
    vcs = [{"name": vc, **doc["lustre"]} for vc, doc in documents.items() if "lustre" in doc]
    pools = {p["name"] for p in yaml.safe_load((INVENTORIES[name] / "group_vars/all/lustre.yml").read_text())["lustre_pools"]}
    assert {vc["pool"] for vc in vcs} == pools
    layout = {"vagrant": (2, 2), "example": (4, 16)}[name]  # (MDTs, OSTs) the inventory's servers provide
    env = _fake_lustre_env(work, defaults["filesystem"]["name"], Path(defaults["filesystem"]["mount"]), *layout)
    saved = dict(os.environ)
    os.environ.update(env)
    os.environ["DLTS_FAKE_LUSTRE_NODE"] = "client"
    try:
        client = LustreClient(Runner(mgs_command=("env", "DLTS_FAKE_LUSTRE_NODE=mgs")))
        policy = policy_from_vcs(vcs, defaults)
        plan = build_plan(policy, client)
        assert plan.actions and not plan.unsafe, "a fresh file system needs pools, directories and quotas"
        apply_plan(plan, client)
        assert build_plan(policy, client).actions == ()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    state = json.loads((work / "fake-lustre" / "state.json").read_text())
    assert set(state["pools"]) == pools


def test_the_managers_reach_the_mgs_for_pool_commands(rendered):
    name, out, _ = rendered
    config = yaml.safe_load((out["dlts_control"] / "dlts.yaml").read_text())
    assert config["lustre_defaults_file"] == "/etc/dlts/lustre-defaults.yaml"
    if name == "vagrant":  # the control host is the MGS
        assert config["lustre_mgs_command"] == []
    else:
        assert config["lustre_mgs_command"][0] == "ssh" and config["lustre_mgs_command"][-1] == "root@10.10.1.11"
    unit = (out["dlts_control"] / "dlts-managers.service").read_text()
    assert "AmbientCapabilities=CAP_SYS_ADMIN" in unit and "/lustre-mount" in unit


def test_managers_kubeconfig_loads_in_the_kubernetes_client(rendered):
    from kubernetes import client, config

    _, out, _ = rendered
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(out["kubernetes_control_plane"] / "dlts-kubeconfig"),
                            client_configuration=configuration)
    assert configuration.host.startswith("https://") and configuration.host.endswith(":6443")
    assert "Bearer fake-service-account-token" in configuration.api_key.values()


def _granted(rules: list[dict], group: str, resource: str) -> set[str]:
    return {verb for rule in rules if group in rule.get("apiGroups", []) and resource in rule.get("resources", [])
            for verb in rule["verbs"]}


def test_kubernetes_manifests_parse_and_grant_what_the_managers_need(rendered):
    name, out, _ = rendered
    docs = list(yaml.safe_load_all((out["kubernetes_control_plane"] / "dlts-rbac.yaml").read_text()))
    kinds = [doc["kind"] for doc in docs]
    assert kinds.count("ServiceAccount") == 2 and "ClusterRole" in kinds and "Namespace" in kinds
    node_rules = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "dlts-nodes")["rules"]
    assert {"get", "list", "patch"} <= _granted(node_rules, "", "nodes")  # node sync, cordon
    jobs = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "dlts-jobs")
    inventory = yaml.safe_load((INVENTORIES[name] / "group_vars/all/dlts.yml").read_text())
    assert jobs["metadata"]["namespace"] == inventory["dlts_namespace"]
    objects = {"get", "list", "watch", "create", "delete", "deletecollection", "patch"}
    for resource in ("pods", "services", "configmaps", "secrets"):
        assert objects <= _granted(jobs["rules"], "", resource), resource
    assert "get" in _granted(jobs["rules"], "", "pods/log")  # the log store copies pod output
    assert objects <= _granted(jobs["rules"], "networking.k8s.io", "networkpolicies")
    classes = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PriorityClass"}
    normal, preemptible = classes[inventory["dlts_priority_class"]], classes[inventory["dlts_preemptible_priority_class"]]
    assert normal["preemptionPolicy"] == preemptible["preemptionPolicy"] == "Never"  # only DLTS preempts
    assert preemptible["value"] < normal["value"] and not normal["globalDefault"] and not preemptible["globalDefault"]


def test_kubernetes_manifests_pass_kubernetes_validate_for_the_installed_release(rendered):
    import kubernetes_validate

    name, out, _ = rendered
    release = yaml.safe_load((INVENTORIES[name] / "group_vars/all/kubernetes.yml").read_text())["kube_version"]
    for doc in yaml.safe_load_all((out["kubernetes_control_plane"] / "dlts-rbac.yaml").read_text()):
        kubernetes_validate.validate(doc, f"{release}.0", strict=True)
    kubeadm = list(yaml.safe_load_all((out["kubernetes_control_plane"] / "kubeadm-config.yaml").read_text()))
    assert [d["kind"] for d in kubeadm] == ["InitConfiguration", "ClusterConfiguration", "KubeletConfiguration"]
    assert kubeadm[2]["cgroupDriver"] == "systemd"


def test_containerd_config_is_valid_toml_with_systemd_cgroups(rendered):
    _, out, _ = rendered
    config = tomllib.loads((out["kubernetes_node"] / "containerd-config.toml").read_text())
    runtimes = config["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    assert runtimes["runc"]["options"]["SystemdCgroup"] is True


def test_gpu_workers_run_containers_through_the_nvidia_runtime(rendered):
    name, out, _ = rendered
    config = tomllib.loads((out["kubernetes_node"] / "containerd-config.toml").read_text())
    default = config["plugins"]["io.containerd.grpc.v1.cri"]["containerd"].get("default_runtime_name")
    assert default == ("nvidia" if name == "example" else None)


def test_agent_config_matches_the_inventory(rendered):
    name, out, _ = rendered
    agent = yaml.safe_load((out["dlts_agent"] / "agent.yaml").read_text())
    assert agent["exporter"]["port"] == 9445
    assert agent["expected_gpu_count"] == (8 if name == "example" else 0)
    assert agent["collectors"]["gpu"]["enabled"] is (name == "example")
    assert agent["report"]["node_token_file"] == "/etc/dlts/node-token"
    # a worker is a DLTS node: it reports, trusting the lab's self-signed certificate
    assert agent["report"]["enabled"] is True
    assert agent["report"]["ca_file"] == ("/etc/dlts/api-ca.crt" if name == "vagrant" else "")
    assert "DLTS_AGENT_API_URL=https://" in (out["dlts_agent"] / "agent.env").read_text()
    from dlts_agent.config import load_config  # the agent's own typed validation

    load_config(str(out["dlts_agent"] / "agent.yaml"), env={})


def test_exports_and_lnet_files_have_the_expected_shape(rendered):
    _, out, _ = rendered
    for line in (out["nfs_server"] / "dlts.exports").read_text().splitlines():
        if line and not line.startswith("#"):
            path, clients = line.split(maxsplit=1)
            assert path.startswith("/") and "(" in clients and clients.endswith(")")
    lnet = (out["lustre_client"] / "lustre.conf").read_text()
    assert 'options lnet networks="' in lnet


def _ganesha_blocks(text: str) -> list[dict]:
    """The blocks of an NFS-Ganesha config as {name, settings, blocks} (one statement a line, as rendered)."""
    root: dict = {"name": "", "settings": {}, "blocks": []}
    stack = [root]
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("%include"):
            continue
        if line.endswith("{"):
            block = {"name": line[:-1].strip(), "settings": {}, "blocks": []}
            stack[-1]["blocks"].append(block)
            stack.append(block)
        elif line == "}":
            stack.pop()
        else:
            key, value = line.removesuffix(";").split("=", 1)
            stack[-1]["settings"][key.strip()] = value.strip().strip('"')
    assert len(stack) == 1, "unbalanced braces"
    return root["blocks"]


def _kernel_meaning(options: list[str]) -> dict[str, str]:
    """What exports(5) options mean to the kernel server, in NFS-Ganesha's CLIENT settings (written
    here from the man page, apart from the role's table, so that the two check each other)."""
    meaning = {"Protocols": "4", "Access_Type": "RO", "Anonymous_Uid": "65534", "Anonymous_Gid": "65534",
               "PrivilegedPort": "true", "SecType": "sys"}
    root_squash, all_squash = True, False
    for option in options:
        name, _, value = option.partition("=")
        if name in ("rw", "ro"):
            meaning["Access_Type"] = name.upper()
        elif name in ("root_squash", "no_root_squash"):
            root_squash = name == "root_squash"
        elif name in ("all_squash", "no_all_squash"):
            all_squash = name == "all_squash"
        elif name in ("secure", "insecure"):
            meaning["PrivilegedPort"] = "true" if name == "secure" else "false"
        elif name in ("anonuid", "anongid"):
            meaning["Anonymous_Uid" if name == "anonuid" else "Anonymous_Gid"] = value
        elif name == "sec":
            meaning["SecType"] = ", ".join(value.split(":"))
    meaning["Squash"] = "all_squash" if all_squash else "root_squash" if root_squash else "no_root_squash"
    return meaning


def _assert_ganesha_says_what_the_kernel_exports_say(exports: list[dict], ganesha_text: str) -> None:
    blocks = [b for b in _ganesha_blocks(ganesha_text) if b["name"] == "EXPORT"]
    assert [(b["settings"]["Path"], int(b["settings"]["Export_Id"])) for b in blocks] == [
        (e["path"], e["export_id"]) for e in exports]
    for export, block in zip(exports, blocks, strict=True):
        # NFSv4 clients see the export at its own path, as with the kernel server; no one else gets in
        assert block["settings"]["Pseudo"] == export["path"] and block["settings"]["Access_Type"] == "None"
        assert block["settings"]["Protocols"] == "4"
        clients = [b for b in block["blocks"] if b["name"] == "CLIENT"]
        specs = export["clients"].split()
        assert len(clients) == len(specs), export
        for spec, client in zip(specs, clients, strict=True):
            host, _, options = spec.partition("(")
            assert client["settings"] == {"Clients": host, **_kernel_meaning(options.rstrip(")").split(","))}, spec
        fsal = next(b for b in block["blocks"] if b["name"] == "FSAL")
        assert fsal["settings"] == {k: str(v) for k, v in export.get("ganesha_fsal", {"Name": "VFS"}).items()}


def test_the_ganesha_exports_say_what_the_kernel_exports_say(rendered):
    """The same inventory, rendered for either implementation, exports the same paths to the same
    clients with the same access and squashing."""
    name, out, _ = rendered
    exports = yaml.safe_load((INVENTORIES[name] / "group_vars/all/nfs.yml").read_text())["nfs_exports"]
    kernel = [line.split(maxsplit=1) for line in (out["nfs_server"] / "dlts.exports").read_text().splitlines()
              if line and not line.startswith("#")]
    assert kernel == [[e["path"], e["clients"]] for e in exports]
    _assert_ganesha_says_what_the_kernel_exports_say(exports, (out["nfs_server"] / "ganesha-exports.conf").read_text())
    core = {b["name"]: b["settings"] for b in _ganesha_blocks((out["nfs_server"] / "ganesha.conf").read_text())}
    assert core["NFS_CORE_PARAM"] == {"Protocols": "4", "NFS_Port": "2049", "Enable_NLM": "false", "Enable_RQUOTA": "false"}
    assert core["NFS_KRB5"] == {"Active_krb5": "false"}
    assert '%include "/etc/ganesha/dlts-exports.conf"' in (out["nfs_server"] / "ganesha.conf").read_text()


def test_nfs_ganesha_expresses_every_export_option_it_accepts(tmp_path):
    """Per-VC exports with every option validate_inventory lets through for NFS-Ganesha."""
    exports = [
        {"path": "/srv/nfs/vc/research", "export_id": 10,
         "clients": "192.168.56.11(rw,sync,no_subtree_check,sec=sys:krb5p) 192.168.56.0/24(ro,insecure) *.lab.example"},
        {"path": "/srv/nfs/vc/product", "export_id": 11,
         "clients": "192.168.56.12(rw,all_squash,root_squash,anonuid=4001,anongid=4002) "
                    "192.168.56.13(rw,all_squash,no_all_squash,no_root_squash,wdelay,async,subtree_check,secure)"},
        {"path": "/volumes/vision", "export_id": 12, "ganesha_fsal": {"Name": "CEPH", "Filesystem": "cephfs"},
         "clients": "@vision-nodes(rw,no_wdelay)"},
    ]
    out = render_templates("vagrant", tmp_path / "out", {"nfs_server_implementation": "ganesha", "nfs_exports": exports,
                                                         "nfs_server_ganesha_port": 12049}, roles_only=("nfs_server",))
    _assert_ganesha_says_what_the_kernel_exports_say(exports, (out["nfs_server"] / "ganesha-exports.conf").read_text())
    core = {b["name"]: b["settings"] for b in _ganesha_blocks((out["nfs_server"] / "ganesha.conf").read_text())}
    assert core["NFS_CORE_PARAM"]["NFS_Port"] == "12049"
    assert core["NFS_KRB5"] == {"Active_krb5": "true"}  # an export asks for krb5p


@pytest.mark.parametrize("inventory_name", sorted(INVENTORIES))
def test_only_dlts_nodes_report_to_the_api_and_register_a_token(inventory_name, tmp_path):
    """dlts_agent's defaults per host: the hosts the backend lists as nodes (Kubernetes nodes here)
    report and get their token registered; storage and monitoring hosts only export metrics. The
    self-signed lab certificate is trusted; the example's CA-signed one uses the system store."""
    stand_in = tmp_path / "roles" / "agent_vars"
    (stand_in / "tasks").mkdir(parents=True)
    (stand_in / "defaults").symlink_to(REPO / "ansible" / "roles" / "dlts_agent" / "defaults")
    (stand_in / "tasks" / "main.yml").write_text(json.dumps([{
        "name": "Write the reporting decision",
        "ansible.builtin.copy": {
            "content": "{{ {'report': dlts_agent_report_to_api | bool, 'ca_file': dlts_agent_ca_file} | to_json }}",
            "dest": f"{tmp_path}/{{{{ inventory_hostname }}}}.json", "mode": "0644"},
        "delegate_to": "localhost",
    }]))
    playbook = tmp_path / "agent-vars.yml"
    playbook.write_text(json.dumps([{"name": "Agent variables", "hosts": "all", "gather_facts": False,
                                     "connection": "local", "roles": ["agent_vars"]}]))
    env = ansible_env(tmp_path)
    env["ANSIBLE_ROLES_PATH"] = str(tmp_path / "roles")
    extra = {"ansible_python_interpreter": sys.executable, "ansible_become": False}
    result = subprocess.run(
        [tool("ansible-playbook"), "-i", str(INVENTORIES[inventory_name]), str(playbook), "--extra-vars", json.dumps(extra)],
        cwd=REPO / "ansible", env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    decided = {path.stem: json.loads(path.read_text()) for path in tmp_path.glob("*.json")}
    reporting = {host for host, d in decided.items() if d["report"]}
    if inventory_name == "vagrant":
        assert set(decided) == {"control", "worker1", "worker2", "mds1", "oss1"}
        assert reporting == {"control", "worker1", "worker2"}  # the Kubernetes nodes, not mds1 and oss1
        assert {d["ca_file"] for d in decided.values()} == {"/etc/dlts/api-ca.crt"}
    else:
        assert reporting == {"cp1", "cp2", "cp3"} | {f"gpu{n:03d}" for n in range(1, 65)}
        assert {"mds1", "oss1", "mon1"} <= set(decided) - reporting
        assert {d["ca_file"] for d in decided.values()} == {""}


def test_the_operator_sections_come_from_the_inventory(tmp_path):
    """dlts_notify, dlts_repair, dlts_storage, dlts_insight, dlts_directory and dlts_disk_pressure become
    the sections of dlts.yaml key for key; the vaulted passwords become files the config names, never keys."""
    from dlts.config import load_settings

    make_stub_executables(tmp_path / "venv" / "bin", ("gunicorn", "dlts"))
    config_dir = tmp_path / "etc"
    overrides = {"dlts_control_venv": str(tmp_path / "venv"), "dlts_control_config_dir": str(config_dir),
                 **OPERATOR_SECTIONS, **OPERATOR_SECRETS}
    out = render_templates("vagrant", tmp_path / "out", overrides, roles_only=("dlts_control",))
    config_file = out["dlts_control"] / "dlts.yaml"
    text = config_file.read_text()
    assert all(secret not in text for secret in OPERATOR_SECRETS.values())
    result = subprocess.run([str(Path(sys.executable).parent / "dlts"), "config", "check"],
                            env=dict(os.environ, DLTS_CONFIG=str(config_file)), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    settings = load_settings(config_file, environ={})
    for variable, values in OPERATOR_SECTIONS.items():
        dumped = getattr(settings, variable.removeprefix("dlts_")).model_dump(mode="json", exclude_unset=True)
        for key, value in values.items():
            if key == "roots":
                assert [{k: r[k] for k in given} for r, given in zip(dumped["roots"], value)] == value
            else:
                assert dumped[key] == value, (variable, key)
    assert settings.notify.password_file == config_dir / "smtp-password"
    assert settings.directory.bind_password_file == config_dir / "ldap-bind-password"
    # the role's task writes the vaulted password into that file; the notifier reads it from there
    settings.notify.password_file.parent.mkdir(parents=True)
    settings.notify.password_file.write_text(OPERATOR_SECRETS["dlts_notify_smtp_password"] + "\n")
    assert settings.notify.read_password() == OPERATOR_SECRETS["dlts_notify_smtp_password"]


def test_the_scheduler_settings_come_from_the_inventory(tmp_path):
    """dlts_scheduling becomes top-level keys of dlts.yaml, which `dlts config check` accepts and the
    job manager's snapshot reads per VC (the VC's vc_scheduling entry, else the cluster's value)."""
    from dlts.config import load_settings
    from dlts.services.vcs import scheduling_of

    make_stub_executables(tmp_path / "venv" / "bin", ("gunicorn", "dlts"))
    overrides = {"dlts_control_venv": str(tmp_path / "venv"), "dlts_control_config_dir": str(tmp_path / "etc"),
                 "dlts_scheduling": SCHEDULING}
    out = render_templates("vagrant", tmp_path / "out", overrides, roles_only=("dlts_control",))
    config_file = out["dlts_control"] / "dlts.yaml"
    result = subprocess.run([str(Path(sys.executable).parent / "dlts"), "config", "check"],
                            env=dict(os.environ, DLTS_CONFIG=str(config_file)), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    settings = load_settings(config_file, environ={})
    assert (settings.fair_share_half_life_h, settings.fair_share_max_wait_s, settings.reservation_depth) == (72, 43200, 4)
    assert (settings.forecast.interval_s, settings.forecast.max_passes, settings.forecast.precision) == (120, 80, 0.05)
    research, vision = scheduling_of(settings, "research", {}), scheduling_of(settings, "vision", {})
    assert (research["fair_share_max_wait_s"].value, research["fair_share_max_wait_s"].source) == (3600.0, "config")
    assert (research["min_runtime_s"].value, vision["fair_share_max_wait_s"].value) == (600.0, 43200.0)
    assert (research["limit_weight"].value, vision["limit_weight"].value) == (1.0, 0.25)


def test_operator_sections_the_inventory_leaves_out_keep_dlts_defaults(rendered):
    from dlts.config import Settings, load_settings

    name, out, _ = rendered
    inventory = yaml.safe_load((INVENTORIES[name] / "group_vars/all/dlts.yml").read_text())
    config = yaml.safe_load((out["dlts_control"] / "dlts.yaml").read_text())
    settings = load_settings(out["dlts_control"] / "dlts.yaml", environ={})
    sections = {"notify", "repair", "storage", "insight", "directory", "disk_pressure"}
    given = {s for s in sections if f"dlts_{s}" in inventory}
    assert given == ({"notify", "repair"} if name == "example" else set()), name
    assert set(config) & sections == given
    for section in sections - given:
        assert getattr(settings, section) == Settings.model_fields[section].default_factory(), section
    if name == "example":  # the relay's account, its password in a file the role writes from the vault
        assert (settings.notify.smtp_host, settings.notify.username) == ("smtp.example.com", "dlts@example.com")
        assert settings.notify.password_file == Path("/etc/dlts/smtp-password")
        assert settings.repair.max_nodes_in_repair == "20%"
