"""validate_inventory: each broken inventory fails fast with the message an operator needs.

Every case copies the Vagrant lab inventory, breaks one thing, runs ansible/validate.yml and asserts
the failure and its message. validate.yml only asserts on the controller, so no host is contacted.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from ansible_helpers import (
    EXAMPLE_SECRETS,
    INVENTORIES,
    OPERATOR_SECRETS,
    OPERATOR_SECTIONS,
    ROLES_DIR,
    SCHEDULING,
    run_playbook,
)


class Inventory:
    """A writable copy of an inventory with small YAML editing helpers."""

    def __init__(self, root: Path):
        self.root = root

    def load(self, relative: str) -> dict:
        path = self.root / relative
        return yaml.safe_load(path.read_text()) if path.exists() else {}

    def save(self, relative: str, data: dict) -> None:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data, sort_keys=False))

    def edit(self, relative: str, change: Callable[[dict], None]) -> None:
        data = self.load(relative)
        change(data)
        self.save(relative, data)

    def edit_groups(self, change: Callable[[dict], None]) -> None:
        self.edit("hosts.yml", lambda data: change(data["all"]["children"]))

    def set(self, relative: str, key: str, value) -> None:
        self.edit(relative, lambda data: data.__setitem__(key, value))


@pytest.fixture
def lab(tmp_path) -> Inventory:
    root = tmp_path / "inventory"
    shutil.copytree(INVENTORIES["vagrant"], root)
    return Inventory(root)


def _validate(inventory: Inventory, tmp_path: Path, playbook: str = "validate.yml", extra_vars=None):
    return run_playbook(playbook, inventory.root, extra_vars=extra_vars, tmp_path=tmp_path)


def _pool_with_missing_ost(inv: Inventory) -> None:
    inv.edit("group_vars/all/lustre.yml", lambda d: d["lustre_pools"].append({"name": "ghost", "osts": [1, 7]}))


def _duplicate_ost_index(inv: Inventory) -> None:
    inv.edit_groups(lambda g: g["lustre_oss"]["hosts"].update({"worker1": None}))
    inv.set("host_vars/worker1.yml", "lustre_osts", [{"index": 1, "device": "/dev/vdb"}])
    inv.edit("host_vars/worker1.yml", lambda d: d.update(dlts_node_sku="lab-cpu"))


def _set_vc(inv: Inventory, index: int, **values) -> None:
    inv.edit("group_vars/all/dlts.yml", lambda d: d["dlts_vcs"][index].update(values))


def _set_dlts(inv: Inventory, key: str, value) -> None:
    inv.set("group_vars/all/dlts.yml", key, value)


def _set_kubernetes(inv: Inventory, **values) -> None:
    inv.edit("group_vars/all/dlts.yml", lambda d: d.setdefault("dlts_kubernetes", {}).update(values))


def _set_nfs(inv: Inventory, key: str, value) -> None:
    inv.set("group_vars/all/nfs.yml", key, value)


def _ganesha_export(inv: Inventory, index: int, **values) -> None:
    _set_nfs(inv, "nfs_server_implementation", "ganesha")
    inv.edit("group_vars/all/nfs.yml", lambda d: d["nfs_exports"][index].update(values))


def _quota_above_capacity(inv: Inventory) -> None:
    # two 2-GPU workers of SKU lab-gpu: 4 GPUs, and the product VC asks 5
    for worker in ("worker1", "worker2"):
        inv.edit(f"host_vars/{worker}.yml", lambda d: d.update(dlts_node_sku="lab-gpu", dlts_node_gpu_count=2))
    _set_vc(inv, 1, quota={"lab-gpu": 5})


CASES = {
    "no managers group": (
        lambda inv: inv.edit_groups(lambda g: g.pop("dlts_managers")),
        "The inventory has no hosts in group 'dlts_managers'",
    ),
    "two managers hosts with the local backend": (
        lambda inv: (inv.edit_groups(lambda g: g["dlts_managers"]["hosts"].update({"worker1": None})),
                     _set_dlts(inv, "dlts_backend", "local")),
        "Group 'dlts_managers' holds 2 hosts (control, worker1) but dlts_backend is \"local\"",
    ),
    "a lease shorter than a second": (
        lambda inv: _set_dlts(inv, "dlts_lease_s", 0),
        "dlts_lease_s, when set, must be an integer between 1 and 600 (found 0)",
    ),
    "lustre enabled without object storage servers": (
        lambda inv: inv.edit_groups(lambda g: g.pop("lustre_oss")),
        "no hosts in group 'lustre_oss', which dlts_deploy_lustre: true needs",
    ),
    "feature toggle that is not a boolean": (
        lambda inv: inv.set("group_vars/all/cluster.yml", "dlts_deploy_nfs", "sometimes"),
        'dlts_deploy_nfs must be set to true or false in group_vars/all/cluster.yml (found "sometimes")',
    ),
    "NFS server implementation that does not exist": (
        lambda inv: _set_nfs(inv, "nfs_server_implementation", "nfs-ganesha"),
        "nfs_server_implementation must be 'kernel' (nfs-kernel-server) or 'ganesha' (NFS-Ganesha, NFSv4 only), "
        'found "nfs-ganesha" for control',
    ),
    "NFS-Ganesha export without an export id": (
        lambda inv: (_ganesha_export(inv, 1), inv.edit("group_vars/all/nfs.yml", lambda d: d["nfs_exports"][1].pop("export_id"))),
        "nfs_exports on control: with NFS-Ganesha every export needs an export_id from 1 to 65535 that no other "
        'export of the host has (found {"/srv/nfs/home": 1, "/srv/nfs/data": "missing"})',
    ),
    "NFS-Ganesha exports sharing an export id": (
        lambda inv: _ganesha_export(inv, 1, export_id=1),
        'export of the host has (found {"/srv/nfs/home": 1, "/srv/nfs/data": 1})',
    ),
    "NFS-Ganesha export with a back end without a name": (
        lambda inv: _ganesha_export(inv, 1, ganesha_fsal={"Filesystem": "cephfs"}),
        'and ganesha_fsal values [{"Filesystem": "cephfs"}] that are no mapping with Name',
    ),
    "NFS-Ganesha export with an option it cannot express": (
        lambda inv: _ganesha_export(inv, 0, clients="192.168.56.0/24(rw,fsid=0,crossmnt) 10.9.0.1(ro)"),
        'found clients [] that are not host(options), options ["crossmnt", "fsid"] that Ganesha cannot express, '
        "and ganesha_fsal values [] that are no mapping with Name",
    ),
    "database password missing from the vault": (
        lambda inv: inv.edit("group_vars/all/vault.yml", lambda d: d.pop("vault_dlts_db_password")),
        "dlts_db_password must be a secret string of at least 16 characters",
    ),
    "secret key too short": (
        lambda inv: inv.set("group_vars/all/vault.yml", "vault_dlts_secret_key", "short"),
        "of length 5",
    ),
    "listen port that is not an integer": (
        lambda inv: inv.set("group_vars/all/dlts.yml", "dlts_listen_port", "5000x"),
        'dlts_listen_port must be an integer between 1 and 65535 (found "5000x")',
    ),
    "unknown backend": (
        lambda inv: inv.set("group_vars/all/dlts.yml", "dlts_backend", "slurm"),
        "dlts_backend must be 'kubernetes' or 'local' (found \"slurm\")",
    ),
    "endpoint firewall switch written as a string": (
        lambda inv: inv.set("group_vars/all/dlts.yml", "dlts_endpoint_firewall", "no way"),
        'dlts_endpoint_firewall must be true or false (found "no way")',
    ),
    "endpoint networks given as one string": (
        lambda inv: inv.set("group_vars/all/dlts.yml", "dlts_endpoint_allow_cidrs", "10.8.0.0/16"),
        'dlts_endpoint_allow_cidrs a list of CIDR strings like ["10.8.0.0/16"] (found "10.8.0.0/16")',
    ),
    "version written as a YAML number": (
        lambda inv: inv.set("group_vars/all/dlts.yml", "dlts_version", 0.1),
        "dlts_version must be a quoted version string",
    ),
    "even number of control-plane hosts": (
        lambda inv: inv.edit_groups(lambda g: g["kube_control_plane"]["hosts"].update({"mds1": None})),
        "Group 'kube_control_plane' has 2 hosts; etcd needs an odd number",
    ),
    "worker without a SKU label": (
        lambda inv: inv.edit("host_vars/worker1.yml", lambda d: d.pop("dlts_node_sku")),
        "Worker worker1 needs dlts_node_sku",
    ),
    "worker hard-assigned to an unknown virtual cluster": (
        lambda inv: inv.set("host_vars/worker2.yml", "dlts_node_vc", "nope"),
        'Worker worker2 is assigned to virtual cluster "nope", which dlts_vcs does not define (known: research, product)',
    ),
    "OST pool naming an OST index no OSS provides": (
        _pool_with_missing_ost,
        'OST pool "ghost" names OST indices [7] that no OSS provides (provided: [0, 1])',
    ),
    "OST index provided twice": (
        _duplicate_ost_index,
        "OST indices must be unique across the OSS hosts; found [0, 1, 1] (duplicated: [1])",
    ),
    "MDT indices without MDT 0": (
        lambda inv: inv.set("host_vars/mds1.yml", "lustre_mdts", [{"index": 1, "device": "/dev/vdb"}]),
        "MDT indices must be unique across the MDS hosts and include 0",
    ),
    "virtual cluster on an MDT that does not exist": (
        lambda inv: inv.edit("group_vars/all/dlts.yml", lambda d: d["dlts_vcs"][1].update(lustre_mdt=5)),
        "Virtual cluster product uses pool \"product\" and MDT 5",
    ),
    "virtual cluster striping subdirectories over more MDTs than exist": (
        lambda inv: inv.edit("group_vars/all/dlts.yml",
                             lambda d: d["dlts_vcs"][1].update(lustre_default_dir_stripe_count=3)),
        "lustre_default_dir_stripe_count is -1 (all MDTs) or 1 to the number of MDTs",
    ),
    "file system name longer than Lustre allows": (
        lambda inv: inv.set("group_vars/all/lustre.yml", "lustre_fsname", "muchtoolongname"),
        'lustre_fsname must be 1 to 8 letters, digits or underscores (mkfs.lustre\'s limit), found "muchtoolongname"',
    ),
    "virtual cluster with a negative quota": (
        lambda inv: _set_vc(inv, 0, quota={"lab-cpu": -1}),
        ('Virtual cluster "research" needs a lowercase name (letters, digits, dashes; at most 40) and a quota '
         'mapping of SKU to a non-negative GPU count, such as quota: {a100-80g: 64} (found {"lab-cpu": -1})'),
    ),
    "virtual cluster quota that is not a whole number": (
        lambda inv: _set_vc(inv, 0, quota={"lab-cpu": "2"}),
        'a non-negative GPU count, such as quota: {a100-80g: 64} (found {"lab-cpu": "2"})',
    ),
    "virtual cluster quota keyed by something that is not a SKU name": (
        lambda inv: _set_vc(inv, 0, quota={"A100 80G": 0}),
        ('Virtual cluster research: quota keys are SKU names, written as node label values (letters, digits, '
         "'-', '_', '.'; such as a100-80g), found [\"A100 80G\"]"),
    ),
    "virtual cluster with an unknown policy": (
        lambda inv: _set_vc(inv, 1, policy="LIFO"),
        'policy, when set, must be RF, FIFO or backfill (found "LIFO")',
    ),
    "virtual cluster quota on a SKU no worker has": (
        lambda inv: _set_vc(inv, 0, quota={"a100-80g": 8}),
        ('Virtual cluster research asks for {"a100-80g": 8}, which the workers in kube_node cannot give: each '
         "quota key must be the dlts_node_sku of some worker, and each count at most the GPUs those workers "
         'have (GPUs per worker SKU: {"lab-cpu": 0})'),
    ),
    "virtual cluster quota above the GPUs of its SKU": (
        _quota_above_capacity,
        'Virtual cluster product asks for {"lab-gpu": 5}, which the workers in kube_node cannot give',
    ),
    "kubernetes settings that are not a mapping": (
        lambda inv: _set_dlts(inv, "dlts_kubernetes", "watch"),
        'dlts_kubernetes must be a mapping of keys of DLTS\'s kubernetes: section, such as {watch: true, '
        'storage_cidrs: ["10.20.0.0/24"]} (found "watch")',
    ),
    "kubernetes setting that has a variable of its own": (
        lambda inv: _set_kubernetes(inv, namespace="jobs"),
        "dlts_kubernetes.namespace is set by the variable dlts_namespace (the cluster roles read it too)",
    ),
    "kubernetes setting that does not exist": (
        lambda inv: _set_kubernetes(inv, page_size=100),
        "dlts_kubernetes.page_size is not a key of DLTS's kubernetes: section (known: backoff_initial_s,",
    ),
    "kubernetes watch switch written as a string": (
        lambda inv: _set_kubernetes(inv, watch="yes"),
        'dlts_kubernetes.watch must be true or false (found "yes")',
    ),
    "kubernetes page size below the least": (
        lambda inv: _set_kubernetes(inv, list_page_size=5),
        "dlts_kubernetes.list_page_size must be an integer of at least 10 and at most 10000 (found 5)",
    ),
    "kubernetes request timeout of zero": (
        lambda inv: _set_kubernetes(inv, request_timeout_s=0),
        "dlts_kubernetes.request_timeout_s must be a number above 0 and at most 300 (found 0)",
    ),
    "kubernetes storage networks given as one string": (
        lambda inv: _set_kubernetes(inv, storage_cidrs="10.20.0.0/24"),
        'dlts_kubernetes.storage_cidrs must be a list of CIDR strings such as ["10.20.0.0/24"] (found "10.20.0.0/24")',
    ),
    "kubernetes privilege policy with an unknown feature": (
        lambda inv: _set_kubernetes(inv, privileged_policy={"research": ["fly"]}),
        ('dlts_kubernetes.privileged_policy must be a mapping of VC name (or "*") to a list of features (features: '
         'privileged, host_network, host_ipc, host_pid, host_path, run_as_root, cached_private_images) (found {"research": ["fly"]})'),
    ),
    "kubernetes init image with a space": (
        lambda inv: _set_kubernetes(inv, init_image="busy box"),
        'dlts_kubernetes.init_image must be an image reference such as docker.io/library/busybox:1.36.1 (found "busy box")',
    ),
    "namespace that is not a Kubernetes name": (
        lambda inv: _set_dlts(inv, "dlts_namespace", "DLTS_jobs"),
        'dlts_namespace must be a namespace name (lowercase letters, digits, \'-\'; found "DLTS_jobs")',
    ),
    "one priority class for normal and preemptible jobs": (
        lambda inv: _set_dlts(inv, "dlts_preemptible_priority_class", "dlts-default"),
        'two different PriorityClass names (found ["dlts-default", "dlts-default"])',
    ),
    "log cap below the least": (
        lambda inv: _set_dlts(inv, "dlts_log_max_bytes", 1000),
        "dlts_log_max_bytes, when set, must be an integer between 65536 and 1099511627776 (found 1000)",
    ),
    "virtual cluster storage with a relative mount path": (
        lambda inv: _set_vc(inv, 0, storage={"host": [{"path": "/srv/scratch", "mount_path": "scratch"}]}),
        "Virtual cluster research: storage takes nfs (a list of {server, path, mount_path, read_only?})",
    ),
    "virtual cluster NFS storage without a server": (
        lambda inv: _set_vc(inv, 0, storage={"nfs": [{"path": "/srv/nfs/data", "mount_path": "/data"}]}),
        'Found {"nfs": [{"path": "/srv/nfs/data", "mount_path": "/data"}]}',
    ),
    "virtual cluster Lustre settings inside its storage": (
        lambda inv: _set_vc(inv, 1, storage={"lustre": {"pool": "product"}}),
        "Lustre has its own keys (lustre_pool, ...). Found {\"lustre\": {\"pool\": \"product\"}}",
    ),
    "virtual cluster with group id 0": (
        lambda inv: _set_vc(inv, 1, gid=0),
        "Virtual cluster product: gid, when set, is the Unix group of the VC's shared storage",
    ),
    "notify section with an unknown key": (
        lambda inv: _set_dlts(inv, "dlts_notify", {"smtp_host": "mx.lab", "smtp_server": "mx.lab"}),
        "dlts_notify.smtp_server is not a key of the notify: section (known: batch_size,",
    ),
    "notify section that is not a mapping": (
        lambda inv: _set_dlts(inv, "dlts_notify", "mx.lab"),
        'dlts_notify must be a mapping of keys of DLTS\'s notify: section (docs/configuration.md), found "mx.lab"',
    ),
    "SMTP password given as a file name": (
        lambda inv: _set_dlts(inv, "dlts_notify", {"smtp_host": "mx.lab", "password_file": "/etc/pw"}),
        "dlts_notify.password_file is set by the role from the secret variable dlts_notify_smtp_password",
    ),
    "SMTP user without a password": (
        lambda inv: _set_dlts(inv, "dlts_notify", {"smtp_host": "mx.lab", "username": "dlts"}),
        "dlts_notify.username is set, so the notifier authenticates: set dlts_notify_smtp_password",
    ),
    "directory bind account without a password": (
        lambda inv: _set_dlts(inv, "dlts_directory", {"url": "ldaps://ldap.lab", "bind_dn": "cn=dlts,dc=lab"}),
        "dlts_directory.bind_dn is set, so the directory sync binds as that account",
    ),
    "repair section with an unknown key": (
        lambda inv: _set_dlts(inv, "dlts_repair", {"max_nodes_in_repairs": 2}),
        "dlts_repair.max_nodes_in_repairs is not a key of the repair: section",
    ),
    "disk pressure section with an unknown key": (
        lambda inv: _set_dlts(inv, "dlts_disk_pressure", {"hard_free_gib": 2}),
        "dlts_disk_pressure.hard_free_gib is not a key of the disk_pressure: section (known: enabled, hard_free_bytes,",
    ),
    "scheduler settings with an unknown key": (
        lambda inv: _set_dlts(inv, "dlts_scheduling", {"fair_share": True, "fairshare_max_wait_s": 60}),
        "dlts_scheduling.fairshare_max_wait_s is not a scheduler setting of dlts.yaml (known: cpu_job_default_cpu,",
    ),
    "scheduler settings that are not a mapping": (
        lambda inv: _set_dlts(inv, "dlts_scheduling", ["fair_share"]),
        "dlts_scheduling must be a mapping of DLTS's scheduler settings (docs/configuration.md)",
    ),
    "user quota with an unknown key": (
        lambda inv: inv.edit("group_vars/all/lustre.yml", lambda d: d["lustre_user_quota"]["default"].update(blocks=5)),
        "lustre_user_quota.default takes block_soft and block_hard",
    ),
}


@pytest.fixture(scope="module")
def broken_results(tmp_path_factory):
    """Run every broken case once, in parallel (each is one ansible-playbook process)."""

    # Directories are made here, not in the threads: tmp_path_factory is not thread-safe.
    tmp_dirs = {case: tmp_path_factory.mktemp(case.replace(" ", "-")) for case in CASES}

    def run(case: str):
        tmp = tmp_dirs[case]
        inventory = Inventory(tmp / "inventory")
        shutil.copytree(INVENTORIES["vagrant"], inventory.root)
        CASES[case][0](inventory)
        return case, _validate(inventory, tmp)

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return dict(pool.map(run, CASES))


@pytest.mark.parametrize("case", list(CASES), ids=[c.replace(" ", "-") for c in CASES])
def test_broken_inventory_fails_with_a_clear_message(case, broken_results):
    result = broken_results[case]
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0, output[-3000:]
    assert CASES[case][1] in output, output[-3000:]


def test_lab_inventory_passes(lab, tmp_path):
    result = _validate(lab, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]


def test_a_quota_within_the_workers_gpus_passes(lab, tmp_path):
    for worker in ("worker1", "worker2"):
        lab.edit(f"host_vars/{worker}.yml", lambda d: d.update(dlts_node_sku="lab-gpu", dlts_node_gpu_count=2))
    lab.edit("group_vars/all/dlts.yml", lambda d: d["dlts_vcs"][1].update(quota={"lab-gpu": 4}))
    result = _validate(lab, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]


def test_the_local_backend_does_not_check_quotas_against_kubernetes_workers(lab, tmp_path):
    lab.set("group_vars/all/dlts.yml", "dlts_backend", "local")
    lab.edit("group_vars/all/dlts.yml", lambda d: d["dlts_vcs"][0].update(quota={"cpu": 1}))
    result = _validate(lab, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]


def test_switching_lustre_off_drops_its_groups_from_the_requirements(lab, tmp_path):
    lab.edit_groups(lambda g: [g.pop(name) for name in ("lustre_mgs", "lustre_mds", "lustre_oss")])
    lab.set("group_vars/all/cluster.yml", "dlts_deploy_lustre", False)
    result = _validate(lab, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]


def test_example_inventory_refuses_its_placeholder_secrets(tmp_path):
    result = run_playbook("validate.yml", INVENTORIES["example"], tmp_path=tmp_path)
    output = " ".join(result.stdout.split())
    assert result.returncode != 0
    assert "dlts_db_password must be a secret string of at least 16 characters (it still holds the example value" in output


def test_example_inventory_passes_once_the_vault_is_filled(tmp_path):
    result = run_playbook("validate.yml", INVENTORIES["example"], extra_vars=EXAMPLE_SECRETS, tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]


@pytest.mark.parametrize("case", ["no database group", "unknown NFS server implementation"])
def test_site_playbook_touches_no_host_when_the_inventory_is_broken(lab, tmp_path, case):
    if case == "no database group":
        lab.edit_groups(lambda g: g.pop("mariadb"))
        message = "The inventory has no hosts in group 'mariadb'"
    else:
        _set_nfs(lab, "nfs_server_implementation", "userspace")
        message = "nfs_server_implementation must be 'kernel' (nfs-kernel-server) or 'ganesha'"
    result = _validate(lab, tmp_path, playbook="site.yml")
    assert result.returncode != 0
    assert message in " ".join(result.stdout.split())
    # The lab's addresses are unreachable from here: any attempt to touch a host would show up.
    assert "PLAY [Prepare every host]" not in result.stdout
    assert "UNREACHABLE" not in result.stdout


def test_nfs_ganesha_with_per_vc_exports_passes(lab, tmp_path):
    # each VC's directory exported to its own nodes only, every option Ganesha can express in use
    _set_nfs(lab, "nfs_server_implementation", "ganesha")
    lab.edit("group_vars/all/nfs.yml", lambda d: d["nfs_exports"].extend([
        {"path": "/srv/nfs/vc/research", "export_id": 10, "group": "4000", "mode": "2770",
         "clients": "192.168.56.11(rw,sync,no_subtree_check,root_squash,sec=sys:krb5p) 192.168.56.0/24(ro,insecure)"},
        {"path": "/srv/nfs/vc/product", "export_id": 11, "ganesha_fsal": {"Name": "VFS"},
         "clients": "192.168.56.12(rw,async,all_squash,anonuid=4001,anongid=4001,wdelay,no_wdelay,subtree_check,"
                    "no_all_squash,no_root_squash,secure)"},
    ]))
    result = _validate(lab, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]


def test_the_inventory_check_knows_the_export_options_nfs_ganesha_can_express():
    defaults = yaml.safe_load((ROLES_DIR / "validate_inventory" / "defaults" / "main.yml").read_text())
    role = yaml.safe_load((ROLES_DIR / "nfs_server" / "vars" / "main.yml").read_text())
    expressed = (set(role["nfs_server_ganesha_flag_options"]) | set(role["nfs_server_ganesha_all_squash_options"])
                 | set(role["nfs_server_ganesha_valued_options"]))
    assert set(defaults["validate_inventory_ganesha_export_options"]) == expressed
    assert defaults["validate_inventory_nfs_implementations"] == ["kernel", "ganesha"]


def test_an_inventory_without_a_kubernetes_section_passes(lab, tmp_path):
    # dlts_kubernetes is optional: every key keeps DLTS's default (the converge inventory has none)
    lab.edit("group_vars/all/dlts.yml", lambda d: d.pop("dlts_kubernetes", None))
    result = _validate(lab, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]


def test_a_full_kubernetes_section_and_vc_storage_pass(lab, tmp_path):
    lab.edit("group_vars/all/dlts.yml", lambda d: d.update(
        dlts_kubernetes={"watch": False, "list_page_size": 100, "request_timeout_s": 2.5, "network_policy": True,
                         "storage_cidrs": ["10.20.0.0/24", "fd00::/64"], "privileged_policy": {"*": ["host_ipc"]},
                         "init_image": "registry.example.com/busybox@sha256:" + "a" * 64},
        dlts_log_max_bytes=1048576, dlts_node_lost_after_s=120))
    _set_vc(lab, 1, gid=4000, storage={
        "host": [{"name": "scratch", "path": "/srv/scratch", "mount_path": "/scratch", "read_only": False}],
        "home": {"kind": "host", "path": "/srv/home", "mount_path": "/home"}})
    result = _validate(lab, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]


def test_the_inventory_check_knows_every_key_of_the_kubernetes_section_with_its_bounds():
    """validate_inventory's table of dlts_kubernetes keys is the code's KubernetesSettings: same keys
    (or a variable of their own), same bounds, so an inventory it passes is one DLTS accepts."""
    import annotated_types

    from dlts.backends.k8s_settings import KubernetesSettings, PrivilegedFeature

    defaults = yaml.safe_load((ROLES_DIR / "validate_inventory" / "defaults" / "main.yml").read_text())
    table = defaults["validate_inventory_kubernetes_settings"]
    own = defaults["validate_inventory_kubernetes_own_variables"]
    assert set(table) | set(own) == set(KubernetesSettings.model_fields) and not set(table) & set(own)
    assert defaults["validate_inventory_privileged_features"] == [f.value for f in PrivilegedFeature]
    for name, spec in table.items():
        if spec["type"] not in ("integer", "number"):
            continue
        metadata = KubernetesSettings.model_fields[name].metadata
        gt = [m.gt for m in metadata if isinstance(m, annotated_types.Gt)]
        ge = [m.ge for m in metadata if isinstance(m, annotated_types.Ge)]
        le = [m.le for m in metadata if isinstance(m, annotated_types.Le)]
        expected = ((gt or ge)[0], bool(gt), le[0] if le else None)
        assert (spec["min"], spec.get("exclusive_min", False), spec.get("max")) == expected, name


def test_the_inventory_check_knows_every_key_of_the_operator_sections():
    """validate_inventory's key lists of dlts_notify, dlts_repair, dlts_storage, dlts_insight,
    dlts_directory and dlts_disk_pressure are the code's sections; the password-file keys are the role's, from the vault."""
    from dlts.config import Settings

    defaults = yaml.safe_load((ROLES_DIR / "validate_inventory" / "defaults" / "main.yml").read_text())
    sections = defaults["validate_inventory_operator_sections"]
    secret_keys = defaults["validate_inventory_operator_secret_keys"]
    assert set(sections) == {"notify", "repair", "storage", "insight", "directory", "disk_pressure"}
    for section, keys in sections.items():
        model = Settings.model_fields[section].annotation
        assert set(keys) | set(secret_keys.get(section, {})) == set(model.model_fields), section
        assert not set(keys) & set(secret_keys.get(section, {})), section


def test_the_inventory_check_knows_the_scheduler_settings():
    """validate_inventory's keys of dlts_scheduling are settings of dlts.yaml that the dlts_control
    template does not render from a variable of their own."""
    from dlts.config import Settings

    defaults = yaml.safe_load((ROLES_DIR / "validate_inventory" / "defaults" / "main.yml").read_text())
    keys = set(defaults["validate_inventory_scheduling_keys"])
    assert keys <= set(Settings.model_fields)
    template = (ROLES_DIR / "dlts_control" / "templates" / "dlts.yaml.j2").read_text()
    assert not [k for k in keys if f"\n{k}:" in template]
    assert {"fair_share", "fair_share_max_wait_s", "limit_weight", "vc_scheduling", "min_runtime_s"} <= keys


def test_full_operator_sections_pass(lab, tmp_path):
    lab.edit("group_vars/all/dlts.yml", lambda d: d.update({**OPERATOR_SECTIONS, "dlts_scheduling": SCHEDULING}))
    result = _validate(lab, tmp_path, extra_vars=OPERATOR_SECRETS)
    assert result.returncode == 0, result.stdout[-3000:]


def test_a_database_replica_that_is_also_the_primary_is_refused(lab, tmp_path):
    lab.edit_groups(lambda g: g.__setitem__("dlts_db_replica", {"hosts": {"control": None}}))
    result = _validate(lab, tmp_path)
    assert result.returncode != 0
    assert ("control is in both 'mariadb' (the primary) and 'dlts_db_replica' (its replicas)"
            in " ".join(result.stdout.split())), result.stdout[-3000:]
