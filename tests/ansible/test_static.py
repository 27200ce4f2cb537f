"""Static checks of ansible/, inventory/ and the Vagrantfile: syntax, lint, layout conventions."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml
from ansible_helpers import ANSIBLE_DIR, INVENTORIES, PLAYBOOKS, REPO, ROLES_DIR, ansible_env, tool

LIFECYCLE_PLAYBOOKS = {
    "site.yml", "scale.yml", "remove-node.yml", "drain-node.yml", "return-node.yml", "upgrade-dlts.yml",
    "validate.yml", "dlts-services.yml", "restore-db.yml",
}
ROLES = {
    "validate_inventory", "common", "nfs_server", "nfs_client", "kubernetes_control_plane", "kubernetes_node",
    "lustre_server", "lustre_client", "lustre_policy", "mariadb", "dlts_control", "dlts_agent", "monitoring",
}


def test_every_lifecycle_playbook_and_role_exists():
    assert set(PLAYBOOKS) >= LIFECYCLE_PLAYBOOKS
    assert {p.name for p in ROLES_DIR.iterdir() if p.is_dir()} >= ROLES


def test_every_playbook_passes_syntax_check_with_every_inventory(inventory_name):
    # One ansible-playbook run checks all playbooks; it stops at the first bad one and names it.
    cmd = [tool("ansible-playbook"), "-i", str(INVENTORIES[inventory_name]), "--syntax-check", *PLAYBOOKS]
    result = subprocess.run(cmd, cwd=ANSIBLE_DIR, env=ansible_env(), capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    for playbook in PLAYBOOKS:
        assert f"playbook: {playbook}" in result.stdout


def test_every_playbook_validates_the_inventory_first():
    for playbook in LIFECYCLE_PLAYBOOKS - {"validate.yml"}:
        plays = yaml.safe_load((ANSIBLE_DIR / playbook).read_text())
        assert plays[0].get("ansible.builtin.import_playbook") == "validate.yml", playbook


@pytest.mark.slow
def test_ansible_lint_production_profile_passes():
    result = subprocess.run(
        [tool("ansible-lint"), "--offline", "--profile", "production", "--nocolor"],
        cwd=ANSIBLE_DIR, env=ansible_env(), capture_output=True, text=True, timeout=400,
    )
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-4000:]
    assert "Profile 'production' was required, and it passed" in result.stderr + result.stdout


def test_yamllint_is_clean_on_ansible_and_inventories():
    result = subprocess.run(
        [tool("yamllint"), "--strict", "-c", str(ANSIBLE_DIR / ".yamllint"), "ansible", "inventory"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _undocumented_keys(path) -> list[str]:
    """Top-level keys of a YAML vars file not preceded by a comment line (blank lines allowed between
    consecutive keys of one commented group)."""
    missing = []
    lines = path.read_text().splitlines()
    commented = False
    for line in lines:
        if line.startswith("#"):
            commented = True
        elif not line.strip():
            commented = False
        elif re.match(r"^[A-Za-z_][A-Za-z0-9_]*:", line):
            if not commented:
                missing.append(line.split(":")[0])
        # continuation lines and list items keep the comment state of their key
    return missing


def test_every_role_default_is_documented():
    missing = {}
    for defaults in sorted(ROLES_DIR.glob("*/defaults/main.yml")):
        keys = _undocumented_keys(defaults)
        if keys:
            missing[defaults.parent.parent.name] = keys
    assert not missing, f"role defaults without a comment above them: {missing}"


def test_every_inventory_variable_is_commented():
    missing = {}
    for inventory in INVENTORIES.values():
        for vars_file in sorted(inventory.glob("*_vars/**/*.yml")):
            keys = _undocumented_keys(vars_file)
            if keys:
                missing[str(vars_file.relative_to(REPO))] = keys
    assert not missing, f"inventory variables without a comment: {missing}"


def test_group_vars_are_split_one_file_per_concern():
    for inventory in INVENTORIES.values():
        names = {p.stem for p in (inventory / "group_vars" / "all").glob("*.yml")}
        assert {"cluster", "dlts", "mariadb", "kubernetes", "nfs", "lustre", "monitoring", "vault"} <= names


def test_role_layout_follows_the_conventions():
    for role in sorted(ROLES):
        root = ROLES_DIR / role
        assert (root / "meta" / "main.yml").exists(), role
        assert (root / "defaults" / "main.yml").exists(), role
        main = yaml.safe_load((root / "tasks" / "main.yml").read_text())
        # tasks/main.yml only includes ordered task files (or another role's task file).
        for task in main:
            modules = set(task) - {"name", "when", "tags"}
            assert modules <= {"ansible.builtin.include_tasks", "ansible.builtin.include_role"}, (role, task)
        # Every template a task names exists, and every template is used.
        task_text = "\n".join(p.read_text() for p in (root / "tasks").glob("*.yml"))
        for template in (root / "templates").glob("*.j2") if (root / "templates").exists() else []:
            assert template.name in task_text, f"{role}: {template.name} is never used"


def test_vagrantfile_matches_the_vagrant_inventory():
    text = (REPO / "Vagrantfile").read_text()
    lab = dict(re.findall(r'name: "([a-z0-9]+)",\s+ip: "([0-9.]+)"', text))
    hosts = yaml.safe_load((INVENTORIES["vagrant"] / "hosts.yml").read_text())["all"]["hosts"]
    assert lab == {name: spec["ansible_host"] for name, spec in hosts.items()}
    # vagrant validate does not notice a missing playbook or inventory.
    assert re.search(r'ansible\.playbook = "ansible/site\.yml"', text)
    assert (REPO / "ansible" / "site.yml").exists()
    assert re.search(r'ansible\.inventory_path = "inventory/vagrant"', text)
    # The lab layout the issue asks for: 2 MDT disks on the MDS, 2 OST disks on the OSS.
    assert re.search(r'name: "mds1".*extra_disks_gib: \[4, 4\]', text)
    assert re.search(r'name: "oss1".*extra_disks_gib: \[8, 8\]', text)


def test_vagrant_validate_accepts_the_vagrantfile():
    if shutil.which("vagrant") is None:
        pytest.skip("vagrant is not installed (1.26 GB; CI does not install it): vagrant validate not run")
    result = subprocess.run(
        ["vagrant", "validate", "--ignore-provider"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_example_inventory_has_the_production_layout():
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    manager = InventoryManager(loader=DataLoader(), sources=[str(INVENTORIES["example"])])
    groups = {name: [h.name for h in group.get_hosts()] for name, group in manager.groups.items()}
    assert len(groups["kube_control_plane"]) == 3
    assert len(groups["lustre_mds"]) == 2
    assert len(groups["lustre_oss"]) == 4
    assert len(groups["gpu_a100"]) == 64
    assert [len(groups[f"ib_domain_{n}"]) for n in range(1, 5)] == [16, 16, 16, 16]
    assert len(groups["dlts_managers"]) == 2  # one acts, one stands by (the lease)
