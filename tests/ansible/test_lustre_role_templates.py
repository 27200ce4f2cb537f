"""The Lustre parts of the role templates, rendered with jinja2 and Ansible's own filters (no
ansible-playbook run): the cluster defaults and the VC documents the storage manager reads, the
MGS's pool-only ssh wrapper run against the fake lctl, and the agent's server collector per host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
import yaml
from ansible.plugins.filter.core import FilterModule
from ansible.plugins.test import core as ansible_tests

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "ansible" / "roles"
FAKEBIN = REPO / "tests" / "lustre" / "fakebin"
INVENTORY = REPO / "inventory" / "example" / "group_vars" / "all"


def ansible_filters() -> dict:
    """Ansible's core filters, less its default/d (they expect Ansible's own Undefined; jinja2's
    built-in default behaves the same on these templates)."""
    return {k: v for k, v in FilterModule().filters().items() if k not in ("default", "d")}


def render(role: str, template: str, **variables) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(ROLES / role / "templates")),
                             undefined=jinja2.StrictUndefined, extensions=["jinja2.ext.do"])
    env.filters.update(ansible_filters())
    env.tests.update(ansible_tests.TestModule().tests())
    return env.get_template(template).render(ansible_managed="managed by Ansible", **variables)


def inventory_vars() -> dict:
    data = {}
    for name in ("lustre.yml", "dlts.yml"):
        data.update(yaml.safe_load((INVENTORY / name).read_text()))
    return data


def test_vc_documents_carry_the_lustre_settings_and_validate_as_dlts_stores_them():
    from dlts.services.vc_storage import check_lustre

    inv = inventory_vars()
    vcs = [{k: v for k, v in vc.items() if k != "storage"} for vc in inv["dlts_vcs"]]  # NFS server addresses need hostvars
    vcs[1]["lustre_default_dir_stripe_count"] = 2
    vcs.append({"name": "cpu", "quota": {}})  # neither storage nor Lustre: left out
    out = json.loads(render("dlts_control", "vc-storage.json.j2", dlts_vcs=vcs, dlts_deploy_lustre=True,
                            lustre_pools=inv["lustre_pools"], lustre_vc_dir=inv["lustre_vc_dir"]))
    assert set(out) == {"vision", "speech"}
    assert out["vision"]["lustre"] == {"pool": "vc_vision", "osts": list(range(10)), "mdt": 0, "directory": "vc/vision",
                                       "stripe_count": 1, "project_id": 1001,
                                       "project_quota": inv["dlts_vcs"][0]["lustre_project_quota"]}
    assert out["speech"]["lustre"]["mdt"] == "spread" and out["speech"]["lustre"]["default_dir_stripe_count"] == 2
    for name, document in out.items():
        assert check_lustre(name, document["lustre"]) == document["lustre"]  # what `dlts vc storage` accepts
    without = json.loads(render("dlts_control", "vc-storage.json.j2", dlts_vcs=vcs, dlts_deploy_lustre=False,
                                lustre_pools=[], lustre_vc_dir="vc"))
    assert without == {}


def test_the_lustre_defaults_file_is_what_the_storage_manager_accepts():
    from dlts_lustre.policy import policy_from_vcs

    inv = inventory_vars()
    text = render("dlts_control", "lustre-defaults.yaml.j2", lustre_fsname=inv["lustre_fsname"],
                  lustre_mount_point=inv["lustre_mount_point"], lustre_vc_dir=inv["lustre_vc_dir"],
                  lustre_user_quota=inv["lustre_user_quota"], lustre_project_grace=inv["lustre_project_grace"],
                  dlts_control_lustre_prune_pools=False)
    defaults = yaml.safe_load(text)
    policy = policy_from_vcs([{"name": "vision", "pool": "vc_vision", "osts": [0]}], defaults)
    assert policy.filesystem.mount == "/lustre" and policy.vc_path(policy.vcs[0]) == "/lustre/vc/vision"
    assert policy.user_quota.default is not None


@pytest.fixture
def mgs_wrapper(tmp_path):
    state_dir = tmp_path / "fake"
    state_dir.mkdir()
    gib = 1024 * 1024
    (state_dir / "state.json").write_text(json.dumps({
        "version": "2.15.4", "fsname": "labfs", "mount": str(tmp_path),
        "mdts": [{"index": 0, "kib_total": gib, "kib_used": 1, "inodes_total": 10, "inodes_used": 1}],
        "osts": [{"index": i, "kib_total": gib, "kib_used": 1, "inodes_total": 10, "inodes_used": 1} for i in range(2)],
        "pools": {}, "users": {}, "groups": {}, "quotas": {"u": {}, "g": {}, "p": {}}, "defaults": {}, "grace": {},
        "dirs": {}}))
    script = tmp_path / "dlts-mgs-lctl"
    script.write_text(render("dlts_control", "dlts-mgs-lctl.j2", lustre_fsname="labfs",
                             dlts_control_lustre_mgs_lctl=str(FAKEBIN / "lctl")))
    script.chmod(0o755)
    env = dict(os.environ, DLTS_FAKE_LUSTRE_DIR=str(state_dir), DLTS_FAKE_LUSTRE_PYTHON=sys.executable,
               DLTS_FAKE_LUSTRE_NODE="mgs")

    def ssh(line: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(script)], env={**env, "SSH_ORIGINAL_COMMAND": line}, capture_output=True,
                              text=True, timeout=60, check=False)

    return ssh, state_dir


def test_the_mgs_wrapper_runs_pool_commands_and_nothing_else(mgs_wrapper):
    ssh, state_dir = mgs_wrapper
    assert ssh("lctl pool_new labfs.vc_a").returncode == 0
    assert ssh("lctl pool_add labfs.vc_a labfs-OST0000 labfs-OST0001").returncode == 0
    assert json.loads((state_dir / "state.json").read_text())["pools"] == {"vc_a": [0, 1]}
    listed = ssh("lctl pool_list labfs.vc_a")
    assert listed.returncode == 0 and "labfs-OST0001_UUID" in listed.stdout
    for line in ("lctl conf_param labfs.quota.ost=none", "lctl pool_new otherfs.x", "rm -rf /",
                 "lctl pool_new labfs.x; reboot", "lctl pool_new $(id)", ""):
        result = ssh(line)
        assert result.returncode == 126 and "refused" in result.stderr, line
    assert json.loads((state_dir / "state.json").read_text())["pools"] == {"vc_a": [0, 1]}


@pytest.mark.parametrize("groups,sections", [
    (["lustre_mgs", "lustre_mds"], ["health", "targets", "pools", "mdt_stats"]),
    (["lustre_oss"], ["health", "targets", "ost_stats"]),
    (["kube_node", "lustre_clients"], None),
])
def test_the_agent_serves_the_server_metrics_on_lustre_servers_only(groups, sections, tmp_path):
    from dlts_agent.config import load_config

    role_defaults = (ROLES / "dlts_agent" / "defaults" / "main.yml").read_text()
    defaults = yaml.safe_load(role_defaults)
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters.update(ansible_filters())
    env.tests.update(ansible_tests.TestModule().tests())
    context = {"group_names": groups, "dlts_deploy_lustre": True, "dlts_backend": "kubernetes", "inventory_hostname": "h1",
               "groups": {"lustre_clients": ["h1"]}}
    for key in ("dlts_agent_lustre_server_groups", "dlts_agent_lustre_server", "dlts_agent_lustre_server_sections",
                "dlts_agent_local_run_dir", "dlts_agent_containerd_state_dir", "dlts_agent_containerd_namespace"):
        value = defaults[key]
        rendered = env.from_string(value).render(context) if isinstance(value, str) else value
        context[key] = yaml.safe_load(rendered) if rendered and isinstance(rendered, str) else rendered  # "" stays ""
    text = render("dlts_agent", "agent.yaml.j2", dlts_agent_interval_s=15,
                  dlts_agent_expected_gpu_count=0, dlts_agent_state_dir=str(tmp_path), dlts_agent_listen_address="0.0.0.0",
                  dlts_agent_metrics_port=9445, dlts_agent_disk_mounts=["/"],
                  dlts_agent_nfs_mounts=[], dlts_agent_report_to_api=False, dlts_api_url="https://x",
                  dlts_agent_token_file="/etc/dlts/node-token", dlts_agent_report_interval_s=30, dlts_agent_ca_file="",
                  dlts_agent_firewall_enabled=False, lustre_fsname="dltsfs", **context)
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    jobs = load_config(str(path), env={}).collectors.jobs  # a Kubernetes node: containerd's bundles, no local backend
    assert (jobs.local_run_dir, jobs.containerd_state_dir, jobs.containerd_namespace) == ("", "/run/containerd", "k8s.io")
    cfg = load_config(str(path), env={}).collectors.lustre_server
    assert cfg.enabled is (sections is not None)
    if sections is not None:
        assert list(cfg.sections) == sections and cfg.fsname == "dltsfs"


def test_the_agent_on_the_managers_host_of_a_local_backend_attributes_its_run_directorys_jobs():
    """docs/agent.md#job-attribution: with dlts_backend local the managers host runs the jobs, under
    dlts_control's home (/var/lib/dlts) + /run, and its agent attributes their processes from there."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters.update(ansible_filters())
    template = yaml.safe_load((ROLES / "dlts_agent" / "defaults" / "main.yml").read_text())["dlts_agent_local_run_dir"]
    groups = {"dlts_managers": ["m1"]}
    assert env.from_string(template).render(dlts_backend="local", inventory_hostname="m1", groups=groups) == "/var/lib/dlts/run"
    assert env.from_string(template).render(dlts_backend="local", inventory_hostname="w1", groups=groups) == ""
    assert env.from_string(template).render(dlts_backend="kubernetes", inventory_hostname="m1", groups=groups) == ""
