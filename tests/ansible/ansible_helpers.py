"""Helpers of the Ansible tests: where things are, how to run ansible-playbook, and the
template renderer that feeds the real checking tools.

Ansible comes from the project venv (ansible-core, the `ansible` bundle for collections,
ansible-lint, yamllint); nothing here reaches Ansible Galaxy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO / "ansible"
ROLES_DIR = ANSIBLE_DIR / "roles"
INVENTORIES = {name: REPO / "inventory" / name for name in ("vagrant", "example")}
VENV_BIN = Path(sys.executable).parent
PLAYBOOKS = sorted(p.name for p in ANSIBLE_DIR.glob("*.yml"))

# The example inventory ships REPLACE-ME secrets that validate_inventory refuses on purpose; the
# tests stand in for an operator who has filled the vault.
EXAMPLE_SECRETS = {
    "vault_dlts_db_password": "3f9c1b7e2a8d4c6f0b5e9a1d7c3f8b2e",
    "vault_dlts_secret_key": "9e1d4c7b2a5f8e3d6c9b1a4f7e2d5c8b0a3f6e9d",
    "vault_dlts_node_token_seed": "c4b7a1e8d2f5c9b3a6e0d4f7c1b8a5e2",
    "vault_monitoring_smtp_auth_password": "7a2d5f8c1e4b9a3d6f0c2e5b8a1d4f7c",
    "vault_monitoring_grafana_admin_password": "1c4f7a2d5e8b3c6f9a0d2e5b7c1f4a8d",
    "vault_dlts_notify_smtp_password": "5b8e1d4a7c0f3b6e9d2a5c8f1b4e7d0a",
}


# An operator's whole set of sections (dlts_notify, dlts_repair, ...) with their vaulted passwords:
# validate_inventory passes them, the dlts_control role renders them into a dlts.yaml that
# `dlts config check` accepts and load_settings reads back key for key.
OPERATOR_SECTIONS = {
    "dlts_notify": {"smtp_host": "mx.lab.example", "smtp_port": 587, "security": "starttls", "username": "dlts",
                    "from_address": "dlts@lab.example", "portal_url": "https://dlts.lab.example",
                    "rate_limit_per_hour": 30, "subject_prefix": "[lab]"},
    "dlts_repair": {"max_nodes_in_repair": "20%", "dry_run": True, "flap_window_s": 7200},
    "dlts_storage": {"scan_interval_s": 1800, "threads_per_root": 8,
                     "roots": [{"path": "/srv/nfs/home", "kind": "nfs", "owner_by": "directory", "alert_percent": 90},
                               {"path": "/srv/nfs/scratch", "expire_after_days": 30, "expire_paths": ["*"],
                                "warn_days": 7, "keep": ["datasets"]}]},
    "dlts_insight": {"idle_min": 45, "low_ratio": 0.25},
    "dlts_disk_pressure": {"soft_free_bytes": 21474836480, "hard_free_bytes": 5368709120, "interval_s": 30},
    "dlts_directory": {"url": "ldaps://ldap.lab.example", "bind_dn": "cn=dlts,ou=services,dc=lab,dc=example",
                       "user_base": "ou=people,dc=lab,dc=example", "group_base": "ou=groups,dc=lab,dc=example",
                       "vc_roles": [{"group": "vision-admins", "vc": "research", "role": "admin"}]},
}
# dlts_scheduling: the scheduler's top-level settings of dlts.yaml, rendered key for key
SCHEDULING = {"fair_share_half_life_h": 72, "fair_share_max_wait_s": 43200, "reservation_depth": 4, "limit_weight": 0.25,
              "forecast": {"interval_s": 120, "max_passes": 80},
              "vc_scheduling": {"research": {"fair_share_max_wait_s": 3600, "min_runtime_s": 600, "limit_weight": 1}}}
OPERATOR_SECRETS = {"dlts_notify_smtp_password": "smtp-password-from-the-vault",
                    "dlts_directory_bind_password": "bind-password-from-the-vault"}

def tool(name: str) -> str:
    """Path of a command the tests need; a missing one fails the test with the package to install."""
    venv_tool = VENV_BIN / name
    if venv_tool.exists():
        return str(venv_tool)
    found = shutil.which(name)
    if found is None:
        packages = {
            "systemd-analyze": "apt-get install systemd",
            "nginx": "apt-get install nginx",
            "promtool": "apt-get install prometheus",
            "amtool": "apt-get install prometheus-alertmanager",
            "mariadbd": "apt-get install mariadb-server",
            "openssl": "apt-get install openssl",
            "nfs-cp": "apt-get install libnfs-utils",
        }
        hint = packages.get(name, f"pip install into {VENV_BIN.parent} or apt-get install it")
        pytest.fail(f"{name} is required by this test but not installed ({hint})")
    return found


def ansible_env(tmp_path: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["ANSIBLE_CONFIG"] = str(ANSIBLE_DIR / "ansible.cfg")
    env["ANSIBLE_NOCOLOR"] = "1"
    env["ANSIBLE_FORCE_COLOR"] = "0"
    env["ANSIBLE_DEPRECATION_WARNINGS"] = "0"
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    if tmp_path is not None:
        env["ANSIBLE_LOCAL_TEMP"] = str(tmp_path / "ansible-tmp")
        env["ANSIBLE_HOME"] = str(tmp_path / "ansible-home")
    return env


def run_playbook(
    playbook: str | Path,
    inventory: Path,
    *args: str,
    extra_vars: dict | None = None,
    tmp_path: Path | None = None,
    timeout_s: float = 300,
    log_path: Path | None = None,
) -> subprocess.CompletedProcess:
    """Run a playbook; with log_path, output streams to that file (follow long runs with tail -f)."""
    cmd = [tool("ansible-playbook"), "-i", str(inventory), str(ANSIBLE_DIR / playbook if isinstance(playbook, str) else playbook)]
    if extra_vars:
        cmd += ["--extra-vars", json.dumps(extra_vars)]
    cmd += list(args)
    if log_path is None:
        return subprocess.run(
            cmd, cwd=ANSIBLE_DIR, env=ansible_env(tmp_path), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    with log_path.open("w") as log:
        result = subprocess.run(
            cmd, cwd=ANSIBLE_DIR, env=ansible_env(tmp_path), stdout=log, stderr=subprocess.STDOUT, text=True,
            timeout=timeout_s, check=False,
        )
    return subprocess.CompletedProcess(cmd, result.returncode, log_path.read_text(), "")


# -- template rendering --------------------------------------------------------------------------

# Which host of an inventory stands for each role when its templates are rendered.
ROLE_HOST_GROUP = {
    "common": "all",
    "mariadb": "mariadb",
    "nfs_server": "nfs_server",
    "kubernetes_node": "kube_node",
    "kubernetes_control_plane": "kube_control_plane",
    "lustre_client": "lustre_clients",
    "lustre_policy": "lustre_clients",
    "dlts_control": "dlts_control",
    "dlts_agent": "kube_node",
    "monitoring": "monitoring",
}

# Values that roles normally register from the hosts before templating (CA, tokens).
FAKE_REGISTERED = {
    "kubernetes_control_plane": {
        "kubernetes_control_plane_ca": {"content": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="},
        "kubernetes_control_plane_sa_token": {"stdout": "ZmFrZS1zZXJ2aWNlLWFjY291bnQtdG9rZW4="},
    },
}


def render_templates(inventory: str, out: Path, overrides: dict, roles_only: tuple[str, ...] = ()) -> dict[str, Path]:
    """Render every role template (or those of ``roles_only``) with the inventory's variables;
    return {role: output dir}.

    Each role gets a generated stand-in role whose defaults/ and vars/ are the real role's (so
    variable precedence is exactly a real run's: role defaults < inventory < extra vars) and whose
    only tasks render the real role's templates into ``out``. Facts come from this machine.
    """
    roles = out / "roles"
    chosen = {role: group for role, group in ROLE_HOST_GROUP.items() if not roles_only or role in roles_only}
    plays = [
        {
            "name": "Gather facts once for the rendering hosts",
            "hosts": ",".join(f"{group}[0]" for group in sorted(set(chosen.values()))),
            "connection": "local",
            "gather_facts": True,
            "gather_subset": ["!all", "min", "hardware"],
        }
    ]
    outputs = {}
    for role, group in chosen.items():
        real = ROLES_DIR / role
        stand_in = roles / f"render_{role}"
        (stand_in / "tasks").mkdir(parents=True)
        for part in ("defaults", "vars"):
            if (real / part).exists():
                (stand_in / part).symlink_to(real / part)
        dest = out / "rendered" / role
        dest.mkdir(parents=True)
        tasks = []
        if role in FAKE_REGISTERED:
            tasks.append({"name": "Stand in for registered results", "ansible.builtin.set_fact": FAKE_REGISTERED[role]})
        for template in sorted((real / "templates").glob("*.j2")):
            tasks.append(
                {
                    "name": f"Render {template.name}",
                    "ansible.builtin.template": {"src": str(template), "dest": str(dest / template.stem), "mode": "0644"},
                }
            )
        (stand_in / "tasks" / "main.yml").write_text(json.dumps(tasks, indent=1))
        # role_path-relative lookups and playbook_dir must behave as in ansible/.
        plays.append(
            {
                "name": f"Render the {role} templates",
                "hosts": f"{group}[0]",
                "connection": "local",
                "gather_facts": False,
                "roles": [f"render_{role}"],
            }
        )
        outputs[role] = dest
    playbook = ANSIBLE_DIR / f".render-{os.getpid()}-{inventory}.yml"
    playbook.write_text(json.dumps(plays, indent=1))
    try:
        env_vars = {
            "ansible_python_interpreter": sys.executable,
            "ansible_become": False,
            **overrides,
        }
        if inventory == "example":
            env_vars.update(EXAMPLE_SECRETS)
        cmd = [
            tool("ansible-playbook"),
            "-i", str(INVENTORIES[inventory]),
            str(playbook),
            "--extra-vars", json.dumps(env_vars),
        ]
        env = ansible_env(out)
        env["ANSIBLE_ROLES_PATH"] = f"{roles}{os.pathsep}{ROLES_DIR}"
        result = subprocess.run(cmd, cwd=ANSIBLE_DIR, env=env, capture_output=True, text=True, timeout=300, check=False)
    finally:
        playbook.unlink(missing_ok=True)
    if result.returncode != 0:
        raise AssertionError(f"rendering failed for {inventory}:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}")
    return outputs


def make_stub_executables(bin_dir: Path, names: tuple[str, ...]) -> None:
    """ExecStart targets for systemd-analyze verify, which checks that they exist and are executable."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = bin_dir / name
        path.write_text("#!/bin/sh\nexit 0\n")
        path.chmod(0o755)


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip()
