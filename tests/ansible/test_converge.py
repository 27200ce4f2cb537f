"""A real converge of mariadb, dlts_control, dlts_agent and monitoring into a disposable Debian 12 system.

The system boots from a debootstrapped image (dlts_vm.py: cached under /var/cache/dlts-ci/, real
systemd as PID 1, reached over SSH), by default as a systemd-nspawn container (the VM where KVM
can boot it; see dlts_vm.boot_target), or as a qemu VM in the opt-in ``qemu`` case
(DLTS_TEST_VM=1: about 45 minutes under TCG emulation). ansible/dlts-services.yml runs twice: the
first run must succeed, the second must report changed=0. Then the services must answer from the
host: the API's /readyz through nginx and TLS, the agent's Prometheus metrics, and the API's and
the managers' metrics through nginx from loopback (refused from the host), and the same two
scraped by the monitoring role's Prometheus on the machine (targets up, DLTS series stored, the
role's rules loaded and evaluating; Grafana is left out, monitoring_deploy_grafana: false); the agent's
reports must be accepted with the node token the playbook registered, and the VCs of the
inventory must exist with its quota and policy (read through the API with an admin token).
Last, the database backups: jobs, a backup through the installed dlts-db-backup service, the
datadir destroyed, ansible/restore-db.yml to a point in time, and the jobs are back.

In the container, the same machine is also the NFS server, with the NFS-Ganesha variant of the
nfs_server role (the kernel here has no nfsd): site.yml's NFS plays run twice (changed=0 the second
time), and a real NFSv4 client on the host (libnfs-utils) writes and reads as a user's uid, finds
root squashed, and finds each VC's export refused to the other VC's client address.

The dlts distribution comes from this checkout: its wheel plus every dependency go into a
wheelhouse that the roles copy to the target and install with no package index (the offline path
the roles support for production too).
"""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import urllib3
import yaml
from ansible_helpers import ANSIBLE_DIR, REPO, run_playbook, tool
from dlts_vm import (
    ACCEL,
    CACHE_ROOT,
    DebianContainer,
    DebianVM,
    boot_target,
    build_image,
    choose_target,
    missing_host_tools,
)

pytestmark = [pytest.mark.slow]

# "default" boots what boot_target() picks (the container here, the VM where KVM works; override
# with DLTS_CI_TARGET=container|vm) and runs in CI; "qemu" always boots the VM and is opt-in.
# A converge under TCG emulation takes about 45 minutes, elsewhere 4 to 13 (more on a loaded host).
TCG_TIMEOUT_S, TIMEOUT_S = 2700, 1200
ROUTES = [
    pytest.param(
        None, id="default",
        marks=pytest.mark.timeout(TCG_TIMEOUT_S if choose_target() == "vm" and ACCEL != "kvm" else TIMEOUT_S),
    ),
    pytest.param("vm", id="qemu", marks=[pytest.mark.vm, pytest.mark.timeout(TCG_TIMEOUT_S if ACCEL != "kvm" else TIMEOUT_S)]),
]

API_HTTPS_PORT = 443
AGENT_METRICS_PORT = 9445
NFS_PORT = 2049  # nfs_server_ganesha_port's default
# The VCs' Unix groups (dlts_vcs' gid) and a member's uid, as the directory sync would make them.
RESEARCH_GID, PRODUCT_GID, USER_UID = 4000, 4001, 1234
# The plays of site.yml that export and mount NFS (run alone here: site.yml's other plays set up
# kernel modules and Kubernetes, which a container cannot take).
NFS_PLAYS = ("Export the NFS shares", "Mount the NFS shares")


def _dlts_version() -> str:
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    return parser["metadata"]["version"]


def build_wheelhouse(dest: Path) -> None:
    """The dlts wheel of this checkout plus its dependencies (cached by setup.cfg's hash)."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    setup_hash = hashlib.sha256((REPO / "setup.cfg").read_bytes()).hexdigest()[:16]
    deps = CACHE_ROOT / f"wheels-{setup_hash}"
    if not (deps / "READY").exists():
        staging = CACHE_ROOT / f"wheels-{setup_hash}.partial"
        subprocess.run(
            pip + ["wheel", "--wheel-dir", str(staging), f"{REPO}[mysql,k8s,agent]", "gunicorn>=21.2"],
            check=True, timeout=600,
        )
        for own in staging.glob("dlts-*.whl"):
            own.unlink()  # rebuilt from the checkout on every run
        (staging / "READY").write_text(setup_hash + "\n")
        staging.rename(deps)
    dest.mkdir(parents=True)
    for wheel in deps.glob("*.whl"):
        (dest / wheel.name).write_bytes(wheel.read_bytes())
    # Build from a copy: an in-tree build would leave build/ and egg-info in the checkout.
    source = dest.parent / "dlts-source"
    shutil.copytree(
        REPO, source,
        ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".dlts", "node_modules"),
    )
    subprocess.run(pip + ["wheel", "--no-deps", "--wheel-dir", str(dest), str(source)], check=True, timeout=300)


def nfs_settings(machine: DebianContainer) -> dict:
    """The NFS-Ganesha server with per-VC exports: each VC's directory (its group's, setgid, as the
    storage manager makes them) to that VC's client only: the host's address is product's client,
    its second address research's; the scratch directory (sticky, world-writable) to both, read-only
    to research's. The exports sit on a tmpfs (see _nfs_for_real)."""
    product, research = machine.host_ip, machine.second_host_ip
    options = "sync,no_subtree_check,root_squash"
    return {
        "nfs_server_implementation": "ganesha",
        "nfs_exports": [
            {"path": "/srv/nfs/vc/product", "export_id": 1, "group": str(PRODUCT_GID), "mode": "2770",
             "clients": f"{product}/32(rw,{options})"},
            {"path": "/srv/nfs/vc/research", "export_id": 2, "group": str(RESEARCH_GID), "mode": "2770",
             "clients": f"{research}/32(rw,{options})"},
            {"path": "/srv/nfs/scratch", "export_id": 3, "mode": "1777",
             "clients": f"{product}/32(rw,{options}) {research}/32(ro,{options})"},
        ],
        # The host is no kernel NFS client (and the container could not mount one).
        "nfs_mounts": [],
    }


def write_inventory(root: Path, machine: DebianVM | DebianContainer, wheelhouse: Path, emulated: bool) -> Path:
    host_vars = dict(machine.inventory_vars())
    # NFS only in the container: the checks need a second client address on the guest's network
    # (qemu's user network shows the guest one address for every host connection).
    nfs = isinstance(machine, DebianContainer)
    groups = ("mariadb", "dlts_control", "dlts_managers", "monitoring") + (("nfs_server",) if nfs else ())
    hosts = {
        "all": {
            "hosts": {"dlts-vm": host_vars},
            "children": {group: {"hosts": {"dlts-vm": None}} for group in groups},
        }
    }
    settings = {
        "dlts_cluster_name": "dlts-ci",
        "dlts_deploy_kubernetes": False,
        "dlts_deploy_nfs": nfs,
        **(nfs_settings(machine) if nfs else {}),
        "dlts_deploy_lustre": False,
        # Prometheus and Alertmanager from Debian's packages (baked into the image); Grafana comes
        # from Grafana's apt repository, which the disposable system is not meant to reach.
        "dlts_deploy_monitoring": True,
        "monitoring_deploy_grafana": False,
        # short intervals so that the first scrapes and rule evaluations come within seconds
        "monitoring_scrape_interval_s": 5,
        "monitoring_evaluation_interval_s": 5,
        # Alertmanager's config needs a receiver address and a smarthost (nothing listens there).
        "monitoring_alert_email_to": "operators@dlts-ci.invalid",
        "monitoring_smtp_from": "alertmanager@dlts-ci.invalid",
        "monitoring_smtp_smarthost": "127.0.0.1:25",
        "monitoring_smtp_require_tls": False,
        "dlts_version": _dlts_version(),
        "dlts_wheelhouse_dir": str(wheelhouse),
        "dlts_pip_index_url": "",
        "dlts_server_name": "localhost",
        "dlts_api_url": "https://localhost",
        "dlts_tls_cert_file": "",
        "dlts_tls_key_file": "",
        "dlts_listen_port": 5000,
        "dlts_https_port": API_HTTPS_PORT,
        "dlts_max_body_bytes": 1048576,
        "dlts_backend": "local",
        # one machine and the test's own users: the local backend is allowed (docs/security-host.md)
        "dlts_control_local_backend_trusted_users": True,
        "dlts_namespace": "dlts",
        "dlts_node_label_sku": "dlts.io/sku",
        "dlts_node_label_ib_domain": "dlts.io/ib-domain",
        "dlts_node_label_vc": "dlts.io/vc",
        "dlts_priority_class": "dlts-default",
        "dlts_preemptible_priority_class": "dlts-preemptible",
        "dlts_preempt_grace_s": 30,
        "dlts_tick_s": 1,
        "dlts_retention_days": 180,
        "dlts_allow_ip_days": 30,
        "dlts_agent_metrics_port": AGENT_METRICS_PORT,
        # The agent reports over TLS to the API with the token dlts_agent registers on the control host.
        "dlts_agent_report_enabled": True,
        "dlts_agent_report_interval_s": 10,
        # With the local backend the node's SKU is "cpu" (its quota counts cores).
        "dlts_vcs": [{"name": "research", "quota": {"cpu": 1}}, {"name": "product", "quota": {}, "policy": "FIFO"}],
        "dlts_db_host": "127.0.0.1",
        "dlts_db_port": 3306,
        "dlts_db_name": "dlts",
        "dlts_db_user": "dlts",
        "dlts_db_password": "ci-db-password-7c1f4a8d2e5b",
        "dlts_secret_key": "ci-secret-key-3f9c1b7e2a8d4c6f0b5e9a1d",
        "dlts_node_token_seed": "ci-node-token-seed-9e1d4c7b2a5f",
        "mariadb_bind_address": "127.0.0.1",
        # Under TCG emulation byte-compiling ~60 packages would cost minutes; elsewhere the roles'
        # default (compile) is kept.
        "dlts_control_pip_compile": not emulated,
        "dlts_agent_pip_compile": not emulated,
        "mariadb_innodb_buffer_pool_bytes": 134217728,
    }
    (root / "group_vars" / "all").mkdir(parents=True)
    (root / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    (root / "group_vars" / "all" / "main.yml").write_text(yaml.safe_dump(settings, sort_keys=False))
    return root


def recap(output: str, host: str = "dlts-vm") -> dict[str, int]:
    match = re.search(rf"^{re.escape(host)}\s+:\s+(.*)$", output, re.MULTILINE)
    assert match, f"no PLAY RECAP line for {host}:\n{output[-4000:]}"
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group(1))}


def changed_tasks(output: str) -> list[str]:
    """Names of the tasks that reported a change (for a readable idempotence failure)."""
    names, current = [], None
    for line in output.splitlines():
        if line.startswith("TASK ["):
            current = line
        elif line.startswith("changed:") and current:
            names.append(current)
    return names


@pytest.mark.parametrize("route", ROUTES)
def test_converge_mariadb_control_and_agent(tmp_path, route):
    if route == "vm" and os.environ.get("DLTS_TEST_VM") != "1":
        pytest.skip("the qemu route is opt-in: DLTS_TEST_VM=1 (about 45 minutes where KVM cannot be used)")
    if os.geteuid() != 0:
        # debootstrap, mount, ip netns and systemd-nspawn need root; CI runs as root and must not skip.
        message = "the converge test builds and boots its Debian system as root; run it as root"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    target = route or choose_target()
    missing = missing_host_tools(target)
    assert not missing, f"install these to run the converge test ({target}): {missing}"
    tool("ansible-playbook")
    emulated = target == "vm" and ACCEL != "kvm"
    timings: dict[str, float | str] = {"target": target if target == "container" else f"vm ({ACCEL})"}
    started = time.monotonic()
    image = build_image()
    timings["image_s"] = time.monotonic() - started

    wheelhouse = tmp_path / "wheelhouse"
    mark = time.monotonic()
    build_wheelhouse(wheelhouse)
    timings["wheelhouse_s"] = time.monotonic() - mark

    mark = time.monotonic()
    with boot_target(image, tmp_path, guest_ports=(API_HTTPS_PORT, AGENT_METRICS_PORT), target=target) as machine:
        timings["boot_s"] = time.monotonic() - mark
        inventory = write_inventory(tmp_path / "inventory", machine, wheelhouse, emulated)

        mark = time.monotonic()
        first = run_playbook(
            "dlts-services.yml", inventory, "-v", tmp_path=tmp_path, timeout_s=1500, log_path=tmp_path / "first-run.log"
        )
        timings["first_run_s"] = time.monotonic() - mark
        assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-2000:]
        first_recap = recap(first.stdout)
        assert first_recap["failed"] == 0 and first_recap["changed"] > 0

        mark = time.monotonic()
        second = run_playbook(
            "dlts-services.yml", inventory, tmp_path=tmp_path, timeout_s=1200, log_path=tmp_path / "second-run.log"
        )
        timings["second_run_s"] = time.monotonic() - mark
        assert second.returncode == 0, second.stdout[-6000:]
        assert recap(second.stdout)["changed"] == 0, f"not idempotent: {changed_tasks(second.stdout)}"

        if isinstance(machine, DebianContainer):
            mark = time.monotonic()
            _nfs_for_real(machine, inventory, tmp_path, timings)
            timings["nfs_s"] = time.monotonic() - mark

        # The services answer from the host, through nginx/TLS and the exporter port.
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        api = f"https://{machine.endpoint(API_HTTPS_PORT)}"
        ready = _get_when_up(f"{api}/readyz", verify=False)
        assert ready.status_code == 200, ready.text
        too_big = requests.post(f"{api}/api/v1/jobs", data=b"x" * (1048576 + 1), verify=False, timeout=30)
        assert too_big.status_code == 413  # nginx enforces the API's max_body_bytes
        metrics = _get_when_up(f"http://{machine.endpoint(AGENT_METRICS_PORT)}/metrics")
        assert metrics.status_code == 200
        assert "dlts_" in metrics.text

        # What the monitoring role's Prometheus scrapes (dlts-api at /metrics, dlts-managers at
        # /metrics/managers, both through nginx) answers an allowed address (loopback here, the
        # monitoring hosts in production) and refuses the others (this host is not allowlisted).
        for path, expected in (("/metrics", "dlts_http_requests_total"), ("/metrics/managers", "dlts_jobmanager_ticks_total")):
            assert requests.get(f"{api}{path}", verify=False, timeout=30).status_code == 403, path
            scraped = machine.ssh(
                "python3 -c 'import ssl, sys, urllib.request; "
                f"print(urllib.request.urlopen(\"https://127.0.0.1:{API_HTTPS_PORT}{path}\", "
                "context=ssl._create_unverified_context(), timeout=30).read().decode())'")
            assert scraped.returncode == 0 and expected in scraped.stdout, (path, scraped.stdout[-2000:], scraped.stderr)
        # ... and the monitoring role's Prometheus on this machine scrapes both through nginx.
        _assert_prometheus_scrapes_dlts(machine)
        # gunicorn's workers write their metrics into the unit's runtime directory (multiprocess mode)
        files = machine.ssh("ls /run/dlts-api-metrics")
        assert files.returncode == 0 and ".db" in files.stdout, files.stdout + files.stderr

        # Exactly one managers process, running; the units are the ones Ansible installed.
        state = machine.ssh(
            "systemctl is-active dlts-api dlts-managers dlts-agent mariadb nginx prometheus prometheus-alertmanager")
        assert state.stdout.split() == ["active"] * 7, state.stdout + state.stderr
        managers = machine.ssh("pgrep -fc 'dlts managers'")
        assert managers.stdout.strip() == "1", managers.stdout

        # An admin token, made the way an operator would, to read what the playbook created.
        dlts = "runuser -u dlts -- env DLTS_CONFIG=/etc/dlts/dlts.yaml /opt/dlts/venv/bin/dlts"
        made = machine.ssh(f"{dlts} user add ci-admin --admin && {dlts} user token ci-admin --label converge", timeout_s=180)
        assert made.returncode == 0, made.stdout + made.stderr
        admin = {"Authorization": f"Bearer {made.stdout.split()[-1]}"}

        # The inventory's VCs exist with its quota and policy, created by the playbook ("cli" events).
        research = requests.get(f"{api}/api/v1/vcs/research", headers=admin, verify=False, timeout=30)
        assert research.status_code == 200, research.text
        assert (research.json()["quota"], research.json()["policy"]) == ({"cpu": 1}, "RF")
        product = requests.get(f"{api}/api/v1/vcs/product", headers=admin, verify=False, timeout=30).json()
        assert (product["quota"], product["policy"]) == ({}, "FIFO")
        events = requests.get(f"{api}/api/v1/vcs/research/events", headers=admin, verify=False, timeout=30).json()
        assert [(e["actor"], e["field"]) for e in events["items"]] == [("cli", "created")]

        # The node token the playbook registered is the agent's: its reports are accepted (a
        # heartbeat is stored only after the token checks out) and the API saw no refused report.
        node = _node_when_reported(f"{api}/api/v1/nodes/dlts-vm", admin)
        assert node["details"]["has_agent_token"] is True
        assert node["details"]["metrics"]["agent_version"], node["details"]["metrics"]
        refused = machine.ssh("journalctl -u dlts-agent --no-pager | grep -c 'refused the node token' || true")
        assert refused.stdout.strip() == "0", machine.ssh("journalctl -u dlts-agent --no-pager | tail -20").stdout
        # ... and the endpoint firewall from the report's answer is in the kernel: the agent's nft
        # (CAP_NET_ADMIN from the role's drop-in) replaced table inet dlts_endpoints.
        deadline = time.monotonic() + 90
        while (table := machine.ssh("nft list table inet dlts_endpoints")).returncode != 0 and time.monotonic() < deadline:
            time.sleep(3)
        assert table.returncode == 0 and "30000-32767" in table.stdout, (
            table.stdout + table.stderr + machine.ssh("journalctl -u dlts-agent --no-pager | tail -20").stdout)

        mark = time.monotonic()
        _backup_destroy_restore(machine, inventory, tmp_path, api, admin, dlts)
        timings["backup_restore_s"] = time.monotonic() - mark
    timings["total_s"] = time.monotonic() - started
    (tmp_path / "timings.json").write_text(json.dumps(timings, indent=1))
    print("converge timings:", json.dumps({k: v if isinstance(v, str) else round(v, 1) for k, v in timings.items()}))


def _nfs_for_real(machine: DebianContainer, inventory: Path, tmp_path: Path, timings: dict) -> None:
    """site.yml's NFS plays converge the NFS-Ganesha server (twice: changed=0 the second time); then
    a real NFSv4 client on the host (libnfs) checks what the exports promise: a user's files are
    the user's on the server, root is squashed, and each VC's export is refused to the other's."""
    tool("nfs-cp")
    # The site's export file system (CephFS, GPFS, XFS in production) is a tmpfs here: the
    # container's root is an overlay, which cannot hand out the file handles NFS needs.
    made = machine.ssh("mkdir -p /srv/nfs && mount -t tmpfs -o mode=0755,size=64m dlts-nfs /srv/nfs")
    assert made.returncode == 0, made.stderr
    site = yaml.safe_load((ANSIBLE_DIR / "site.yml").read_text())
    plays = [play for play in site if play.get("name") in NFS_PLAYS]
    assert [play["name"] for play in plays] == list(NFS_PLAYS)
    playbook = tmp_path / "nfs.yml"
    playbook.write_text(yaml.safe_dump([{"ansible.builtin.import_playbook": str(ANSIBLE_DIR / "validate.yml")}, *plays]))
    for run, key in (("first", "nfs_first_run_s"), ("second", "nfs_second_run_s")):
        mark = time.monotonic()
        result = run_playbook(playbook, inventory, tmp_path=tmp_path, timeout_s=600, log_path=tmp_path / f"nfs-{run}-run.log")
        timings[key] = time.monotonic() - mark
        assert result.returncode == 0, result.stdout[-6000:]
        if run == "second":
            assert recap(result.stdout)["changed"] == 0, f"not idempotent: {changed_tasks(result.stdout)}"
    state = machine.ssh(f"systemctl is-active nfs-ganesha && ss -Htln 'sport = :{NFS_PORT}'")
    assert state.returncode == 0 and "LISTEN" in state.stdout, state.stdout + state.stderr

    mark = time.monotonic()
    payload = tmp_path / "payload.txt"
    payload.write_text("written over NFSv4 as a user\n")

    # product's client (the host's address): the user writes into the VC's directory; the file is
    # the user's (uid and the VC's group) on the server, and reads back.
    product = _nfs_url(machine, "/srv/nfs/vc/product/by-user.txt", USER_UID, PRODUCT_GID)
    written = _nfs("nfs-cp", str(payload), product)
    assert written.returncode == 0, written.stdout + written.stderr
    read = _nfs("nfs-cat", product)
    assert read.returncode == 0 and read.stdout == payload.read_text(), read.stdout + read.stderr
    owner = machine.ssh("stat -c '%u %g' /srv/nfs/vc/product/by-user.txt")
    assert owner.stdout.split() == [str(USER_UID), str(PRODUCT_GID)], owner.stdout + owner.stderr
    # Root is squashed: refused in the root-owned VC directory (2770), and where anyone may write
    # (scratch, 1777) its file belongs to the anonymous uid, not to root.
    as_root = _nfs("nfs-cp", str(payload), _nfs_url(machine, "/srv/nfs/vc/product/by-root.txt", 0, 0))
    assert as_root.returncode != 0 and "NFS4ERR_ACCESS" in as_root.stderr, as_root.stdout + as_root.stderr
    squashed = _nfs("nfs-cp", str(payload), _nfs_url(machine, "/srv/nfs/scratch/by-root.txt", 0, 0))
    assert squashed.returncode == 0, squashed.stdout + squashed.stderr
    owner = machine.ssh("stat -c '%u %g' /srv/nfs/scratch/by-root.txt; ls /srv/nfs/vc/product")
    assert owner.stdout.split() == ["65534", "65534", "by-user.txt"], owner.stdout + owner.stderr
    # research's export is not there for product's client.
    refused = _nfs("nfs-ls", _nfs_url(machine, "/srv/nfs/vc/research/", USER_UID, RESEARCH_GID))
    assert refused.returncode != 0 and "NFS4ERR_NOENT" in refused.stderr, refused.stdout + refused.stderr

    # research's client (the host's second address): the other way round, and scratch is read-only.
    with machine.from_second_host_ip():
        research = _nfs_url(machine, "/srv/nfs/vc/research/by-user.txt", USER_UID + 1, RESEARCH_GID)
        written = _nfs("nfs-cp", str(payload), research)
        assert written.returncode == 0, written.stdout + written.stderr
        refused = _nfs("nfs-ls", _nfs_url(machine, "/srv/nfs/vc/product/", USER_UID, PRODUCT_GID))
        assert refused.returncode != 0 and "NFS4ERR_NOENT" in refused.stderr, refused.stdout + refused.stderr
        listed = _nfs("nfs-ls", _nfs_url(machine, "/srv/nfs/scratch/", USER_UID + 1, RESEARCH_GID))
        assert listed.returncode == 0 and "by-root.txt" in listed.stdout, listed.stdout + listed.stderr
        read_only = _nfs("nfs-cp", str(payload), _nfs_url(machine, "/srv/nfs/scratch/by-research.txt", USER_UID + 1,
                                                          RESEARCH_GID))
        assert read_only.returncode != 0 and "NFS4ERR_ROFS" in read_only.stderr, read_only.stdout + read_only.stderr
    owner = machine.ssh("stat -c '%u %g' /srv/nfs/vc/research/by-user.txt; ls /srv/nfs/scratch")
    assert owner.stdout.split() == [str(USER_UID + 1), str(RESEARCH_GID), "by-root.txt"], owner.stdout + owner.stderr
    timings["nfs_checks_s"] = time.monotonic() - mark


def _nfs_url(machine: DebianContainer, path: str, uid: int, gid: int) -> str:
    """A libnfs URL of an NFSv4 path on the machine, with the AUTH_SYS identity the client sends."""
    return f"nfs://{machine.guest_ip}{path}?version=4&nfsport={NFS_PORT}&uid={uid}&gid={gid}"


def _nfs(command: str, *args: str, timeout_s: float = 150) -> subprocess.CompletedProcess:
    """A libnfs-utils command; retried while the server is in its grace period after a (re)start,
    when it refuses opens for up to 90 s."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = subprocess.run([command, *args], capture_output=True, text=True, timeout=60, check=False)
        if "NFS4ERR_GRACE" not in result.stderr or time.monotonic() > deadline:
            return result
        time.sleep(5)


def _backup_destroy_restore(machine, inventory: Path, tmp_path: Path, api: str, admin: dict, dlts: str) -> None:
    """The mariadb role's backups, for real: jobs, a backup through the installed service, a job
    after it, a chosen time, a job after that; the datadir destroyed; ansible/restore-db.yml with
    that time; the jobs before the time are back (the one after the backup from the binlogs), the
    one after it is not, and the API and managers run again."""
    timer = machine.ssh("systemctl is-enabled dlts-db-backup.timer && systemctl is-active dlts-db-backup.timer")
    assert timer.stdout.split() == ["enabled", "active"], timer.stdout + timer.stderr
    modes = machine.ssh("stat -c '%a %U' /var/backups/dlts-db /etc/mysql/dlts-backup.cnf /etc/mysql/dlts-backup.password")
    assert modes.stdout.split() == ["700", "mysql", "600", "mysql", "600", "root"], modes.stdout + modes.stderr
    made = machine.ssh(f"{dlts} vc member product ci-admin", timeout_s=120)
    assert made.returncode == 0, made.stdout + made.stderr

    def submit(name: str) -> int:
        job = {"name": name, "vc": "product", "image": "debian:12", "command": "sleep 1"}
        response = requests.post(f"{api}/api/v1/jobs", json=job, headers=admin, verify=False, timeout=30)
        assert response.status_code == 201, response.text
        return response.json()["id"]

    before = [submit("before-backup-1"), submit("before-backup-2")]
    backup = machine.ssh("systemctl start dlts-db-backup.service", timeout_s=300)
    assert backup.returncode == 0, backup.stderr + machine.ssh("journalctl -u dlts-db-backup --no-pager | tail -30").stdout
    listed = machine.ssh("/usr/local/sbin/dlts-db-restore --list")
    assert len(listed.stdout.splitlines()) == 1 and " binlog mysql-bin." in listed.stdout, listed.stdout + listed.stderr
    after_backup = submit("after-backup")
    # The chosen time (the database host's clock, one-second resolution): the second after the next
    # one after the last wanted job, so at least a whole second lies between its commit and the
    # chosen time (with only the next second, a CI run saw the job's binary-log event stamped with
    # that very second and the restore, which stops before it, left the job out); the job
    # submitted after it must not come back.
    clock = machine.ssh(
        "python3 -c 'import time; s = int(time.time())\nwhile int(time.time()) <= s + 1: time.sleep(0.05)\n"
        "print(time.strftime(\"%Y-%m-%d %H:%M:%S\"))'")
    assert clock.returncode == 0, clock.stderr
    until = clock.stdout.strip()
    after_until = submit("after-until")

    # The database is lost: server stopped, datadir emptied (API and managers still running).
    socket_state = machine.ssh("systemctl is-active mariadb.socket").stdout.strip()
    # (mariadb.socket too: Debian's socket activation would start it again on the next connection)
    lost = machine.ssh(
        "systemctl stop mariadb.socket mariadb.service && rm -rf /var/lib/mysql/* && ls -A /var/lib/mysql | wc -l")
    assert lost.returncode == 0 and lost.stdout.strip() == "0", lost.stdout + lost.stderr

    restore = run_playbook(
        "restore-db.yml", inventory, extra_vars={"until": until}, tmp_path=tmp_path, timeout_s=900,
        log_path=tmp_path / "restore-db.log",
    )
    assert restore.returncode == 0, restore.stdout[-6000:]
    assert f"rolled forward to {until}" in restore.stdout, restore.stdout[-4000:]

    for job_id in [*before, after_backup]:
        got = requests.get(f"{api}/api/v1/jobs/{job_id}", headers=admin, verify=False, timeout=30)
        if got.status_code != 200:  # what the restore replayed, and what the binary logs hold, for the report
            replayed = [line for line in restore.stdout.splitlines() if "dlts-db-restore:" in line]
            events = machine.ssh("for f in /var/lib/mysql-binlog/pre-restore-*/mysql-bin.0*; do echo \"== $f\"; "
                                 "mariadb-binlog --base64-output=decode-rows -v \"$f\" | grep -E '^#[0-9]{6}|INSERT INTO `jobs`' "
                                 "| tail -n 40; done", timeout_s=120)
            pytest.fail(f"job {job_id} ({got.status_code}) is not back after the restore to {until}:\n"
                        + "\n".join(replayed) + "\n" + events.stdout[-6000:] + events.stderr[-1000:])
    gone = requests.get(f"{api}/api/v1/jobs/{after_until}", headers=admin, verify=False, timeout=30)
    assert gone.status_code == 404, gone.text
    state = machine.ssh("systemctl is-active dlts-api dlts-managers mariadb")
    assert state.stdout.split() == ["active"] * 3, state.stdout + state.stderr
    assert machine.ssh("systemctl is-active mariadb.socket").stdout.strip() == socket_state  # as before
    # The playbook took a fresh backup of the restored database.
    listed = machine.ssh("/usr/local/sbin/dlts-db-restore --list")
    assert len(listed.stdout.splitlines()) == 2, listed.stdout + listed.stderr
    # The restored database takes new submissions.
    submit("after-restore")


def _prometheus(machine, path: str, query: str | None = None) -> dict:
    """The ``data`` of an answer of the machine's Prometheus HTTP API, read on the machine."""
    encoded = f" --get --data-urlencode {shlex.quote('query=' + query)}" if query else ""
    got = machine.ssh(f"curl -fsS --max-time 20{encoded} http://127.0.0.1:9090{path}")
    assert got.returncode == 0, (path, query, got.stdout[-2000:], got.stderr[-2000:])
    body = json.loads(got.stdout)
    assert body["status"] == "success", body
    return body["data"]


def _assert_prometheus_scrapes_dlts(machine, timeout_s: float = 180) -> None:
    """The monitoring role's Prometheus scrapes the API (``dlts-api``, /metrics) and the managers
    (``dlts-managers``, /metrics/managers) through nginx: both targets up, DLTS series stored, the
    role's rule files loaded and evaluating, and Alertmanager known."""
    jobs = ("dlts-api", "dlts-managers")
    deadline = time.monotonic() + timeout_s
    while True:
        targets = _prometheus(machine, "/api/v1/targets")["activeTargets"]
        ours = {job: [t for t in targets if t["labels"].get("job") == job] for job in jobs}
        if all(ours[job] and all(t["health"] == "up" for t in ours[job]) for job in jobs):
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"scrape targets not up within {timeout_s} s: {ours}")
        time.sleep(2)
    for job in jobs:
        (target,) = ours[job]
        assert target["scrapeUrl"].startswith("https://") and target["lastError"] == "", target
    for job, metric in (("dlts-api", "dlts_http_requests_total"), ("dlts-managers", "dlts_jobmanager_ticks_total")):
        up = _prometheus(machine, "/api/v1/query", f'up{{job="{job}"}}')["result"]
        assert [sample["value"][1] for sample in up] == ["1"], up
        series = _prometheus(machine, "/api/v1/query", f'{metric}{{job="{job}"}}')["result"]
        assert series, f"no {metric} series from {job} in Prometheus"
    # Every group of the repository's rule files is loaded; within a few evaluations each rule has
    # been evaluated without error (the role's promtool validate only checked the syntax).
    expected = {
        group["name"]
        for path in sorted((REPO / "monitoring" / "prometheus" / "rules").glob("*.y*ml"))
        for group in yaml.safe_load(path.read_text())["groups"]
    }
    assert expected
    while True:
        groups = _prometheus(machine, "/api/v1/rules")["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        if {g["name"] for g in groups} >= expected and rules and all(r["health"] == "ok" for r in rules):
            break
        if time.monotonic() > deadline:
            raise AssertionError(
                f"rules not loaded and evaluated within {timeout_s} s: expected groups {sorted(expected)}, "
                f"loaded {[(g['name'], [(r['name'], r['health'], r.get('lastError')) for r in g['rules']]) for g in groups]}")
        time.sleep(2)
    alertmanagers = _prometheus(machine, "/api/v1/alertmanagers")["activeAlertmanagers"]
    assert [am["url"] for am in alertmanagers] == ["http://127.0.0.1:9093/api/v2/alerts"], alertmanagers


def _node_when_reported(url: str, headers: dict[str, str], timeout_s: float = 240) -> dict:
    """The node as the API shows it once its agent's first report has been accepted."""
    deadline = time.monotonic() + timeout_s
    node: dict = {}
    while time.monotonic() < deadline:
        response = requests.get(url, headers=headers, verify=False, timeout=30)
        if response.status_code == 200:
            node = response.json()
            if node.get("last_heartbeat_at"):
                return node
        time.sleep(5)
    raise AssertionError(f"no accepted agent report within {timeout_s} s: {node or response.text}")


def _get_when_up(url: str, verify: bool = True, timeout_s: float = 90) -> requests.Response:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            response = requests.get(url, verify=verify, timeout=10)
            if response.status_code < 500:
                return response
        except requests.RequestException as exc:
            last = exc
        time.sleep(2)
    raise AssertionError(f"{url} did not answer within {timeout_s} s: {last}")
