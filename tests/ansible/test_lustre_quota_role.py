"""The lustre_server role's quota step against the stateful fake lctl (tests/lustre/fakebin): it reads
the servers' quota_slave*.enabled, runs `lctl conf_param FS.quota.{mdt,ost}=ugp` on the MGS only for
the kinds that differ (the fake refuses conf_param anywhere else, as lctl does), checks afterwards,
and a second run changes nothing. Three inventory hosts, all local, each with its own lctl."""

from __future__ import annotations

import json
import re
import sys

import pytest
from ansible_helpers import REPO, ROLES_DIR, ansible_env, tool

pytestmark = pytest.mark.slow
FAKEBIN = REPO / "tests" / "lustre" / "fakebin"
GIB = 1024 * 1024


@pytest.fixture
def lab(tmp_path):
    state_dir = tmp_path / "fake-lustre"
    state_dir.mkdir()
    state = {"version": "2.15.4", "fsname": "labfs", "mount": str(tmp_path / "mnt"),
             "mdts": [{"index": i, "kib_total": 100 * GIB, "kib_used": GIB, "inodes_total": 1000, "inodes_used": 10,
                       "node": "mds1"} for i in range(2)],
             "osts": [{"index": i, "kib_total": 1000 * GIB, "kib_used": GIB, "inodes_total": 1000, "inodes_used": 10,
                       "node": "oss1"} for i in range(2)],
             "mgs_node": "mgs1", "pools": {}, "users": {}, "groups": {}, "quotas": {"u": {}, "g": {}, "p": {}},
             "defaults": {}, "grace": {}, "dirs": {}}
    (state_dir / "state.json").write_text(json.dumps(state))
    hosts = {}
    for host in ("mgs1", "mds1", "oss1"):
        wrapper = tmp_path / f"lctl-{host}"
        wrapper.write_text(f"#!/bin/sh\nDLTS_FAKE_LUSTRE_NODE={host} exec {FAKEBIN / 'lctl'} \"$@\"\n")
        wrapper.chmod(0o755)
        hosts[host] = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                       "lustre_server_lctl": str(wrapper)}
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"hosts": hosts, "children": {
        "lustre_mgs": {"hosts": {"mgs1": None}}, "lustre_mds": {"hosts": {"mds1": None}},
        "lustre_oss": {"hosts": {"oss1": None}}}}}))
    playbook = tmp_path / "quota.yml"
    playbook.write_text(json.dumps([{
        "name": "Enforce Lustre quotas", "hosts": "lustre_mgs", "gather_facts": False,
        "vars": {"lustre_fsname": "labfs", "lustre_server_quota_check_delay_s": 0, "ansible_become": False},
        "tasks": [{"name": "Quota step", "ansible.builtin.include_role": {"name": "lustre_server", "tasks_from": "quota"}}],
    }]))
    env = ansible_env(tmp_path)
    env.update(ANSIBLE_ROLES_PATH=str(ROLES_DIR), DLTS_FAKE_LUSTRE_DIR=str(state_dir),
               DLTS_FAKE_LUSTRE_PYTHON=sys.executable)

    def run() -> tuple[int, list[list[str]]]:
        import subprocess

        log = state_dir / "calls.log"
        log.unlink(missing_ok=True)
        result = subprocess.run([tool("ansible-playbook"), "-i", str(inventory), str(playbook)], env=env,
                                capture_output=True, text=True, timeout=300, cwd=REPO / "ansible", check=False)
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
        changed = int(re.search(r"mgs1\s*:.*changed=(\d+)", result.stdout)[1])
        return changed, [json.loads(line) for line in log.read_text().splitlines()]

    def state() -> dict:
        return json.loads((state_dir / "state.json").read_text())

    def set_state(update: dict) -> None:
        (state_dir / "state.json").write_text(json.dumps({**state(), **update}))

    return run, state, set_state


def test_quota_enforcement_is_switched_on_from_the_mgs_checked_and_left_alone_after(lab):
    run, state, set_state = lab
    changed, calls = run()
    conf = [c for c in calls if c[:2] == ["lctl", "conf_param"]]
    assert conf == [["lctl", "conf_param", "labfs.quota.mdt=ugp"], ["lctl", "conf_param", "labfs.quota.ost=ugp"]]
    assert changed == 1 and state()["quota_enforced"] == {"mdt": "ugp", "ost": "ugp"}
    # the check read every server again after the change
    reads = [c for c in calls if c[:2] == ["lctl", "get_param"]]
    assert len(reads) == 4

    changed, calls = run()
    assert changed == 0 and not [c for c in calls if c[1] == "conf_param"]

    set_state({"quota_enforced": {"mdt": "ugp", "ost": "ug"}})  # someone dropped project quotas on the OSTs
    changed, calls = run()
    assert [c for c in calls if c[1] == "conf_param"] == [["lctl", "conf_param", "labfs.quota.ost=ugp"]]
    assert changed == 1 and state()["quota_enforced"]["ost"] == "ugp"
