"""The commands of a job pod run for real (``k8s_render.scripts``): the init container's copy of
busybox, the dlts-identity script that gives the owner a login, and the job container's entrypoint
(signals forwarded to the job's process group, the job's exit status, the endpoint supervisor, the
image's /bin/sh or busybox's when the image has none).

They run with a real busybox (Debian's busybox-static stands for the init image's /bin/busybox) in
a temporary directory standing for the pod's /dlts-runtime emptyDir.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dlts.backends.k8s_render import (
    DEFAULT_TEMPLATES_DIR,
    ENTRYPOINT,
    IDENTITY_SCRIPT,
    INIT_COMMAND,
    RUNTIME_DIR,
)

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SUPERVISOR = DEFAULT_TEMPLATES_DIR / "endpoint-supervisor.sh"

pytestmark = pytest.mark.skipif(not Path(INIT_COMMAND[0]).exists() or shutil.which("busybox") is None,
                                reason=f"needs a static busybox at {INIT_COMMAND[0]} (apt-get install busybox-static)")


@pytest.fixture
def runtime(tmp_path) -> Path:
    """/dlts-runtime after the dlts-init container: its own command, with the emptyDir's path."""
    rt = tmp_path / "runtime"
    rt.mkdir()
    argv = [a.replace(RUNTIME_DIR, str(rt)) for a in INIT_COMMAND]
    subprocess.run(argv, check=True, timeout=30)
    return rt


def test_the_init_command_copies_an_executable_busybox(runtime):
    copied = runtime / "busybox"
    assert os.access(copied, os.X_OK)
    out = subprocess.run([str(copied), "sh", "-c", "echo $((6 * 7))"], capture_output=True, text=True, timeout=10,
                         check=False)
    assert out.stdout == "42\n"


def entrypoint(runtime: Path, command: str, **env: str) -> subprocess.Popen:
    full = {"PATH": SYSTEM_PATH, "DLTS_RUNTIME_DIR": str(runtime), "DLTS_COMMAND": command, **env}
    return subprocess.Popen([str(runtime / "busybox"), "sh", "-c", ENTRYPOINT], env=full, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_the_job_exits_with_its_commands_status_and_its_output_is_the_containers(runtime):
    proc = entrypoint(runtime, "echo out; echo err >&2; exit 3")
    out, _ = proc.communicate(timeout=20)
    assert (proc.returncode, sorted(out.splitlines())) == (3, ["err", "out"])


def test_sigterm_reaches_the_whole_job_and_the_entrypoint_exits_with_the_jobs_status(runtime, tmp_path):
    """The kubelet signals only the container's main process; the job and what it started get it."""
    marks = tmp_path / "marks"
    command = (f'(trap "echo child >>{marks}; exit 0" TERM; sleep 30 & wait) & '
               f'trap "echo job >>{marks}; wait; exit 7" TERM; echo started; sleep 30 & wait')
    proc = entrypoint(runtime, command)
    assert proc.stdout.readline() == "started\n"
    time.sleep(0.3)  # the subshell sets its trap
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 7
    assert sorted(marks.read_text().split()) == ["child", "job"]


def test_a_command_killed_by_a_signal_exits_128_plus_it(runtime):
    proc = entrypoint(runtime, "echo started; exec sleep 30")
    assert proc.stdout.readline() == "started\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 128 + signal.SIGTERM


def test_sigint_reaches_a_job_that_handles_it(runtime):
    """POSIX shells start background commands with SIGINT ignored when job control is off (no tty),
    so INT reaches programs that install their own handler (Python's signal.signal, torchrun), not
    a plain sleep; Kubernetes itself only ever sends TERM."""
    python = shutil.which("python3")
    if python is None:
        pytest.skip("needs python3 for a program that handles SIGINT")
    proc = entrypoint(runtime, f"exec {python} -c 'import signal, sys; signal.signal(signal.SIGINT, lambda *a: "
                               "sys.exit(5)); print(\"ready\", flush=True); signal.pause()'")
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(20) == 5


def test_a_signal_before_the_command_starts_is_not_lost(runtime, tmp_path):
    """TERM while the entrypoint is still starting (the supervisor is up, the command may not be)
    still stops the job."""
    slow = tmp_path / "slow-endpoints"
    slow.mkdir()
    up = tmp_path / "supervisor-up"
    (slow / "supervisor.sh").write_text(f"echo >{up}; sleep 30\n")
    for _ in range(5):
        up.unlink(missing_ok=True)
        proc = entrypoint(runtime, "sleep 30", DLTS_ENDPOINTS_DIR=str(slow))
        deadline = time.monotonic() + 10
        while not up.exists() and time.monotonic() < deadline:
            time.sleep(0.001)
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert proc.wait(20) == 128 + signal.SIGTERM and time.monotonic() - started < 10


def test_the_entrypoint_starts_the_supervisor_then_stops_it_with_the_job(runtime, tmp_path):
    endpoints = tmp_path / "dlts-endpoints"
    endpoints.mkdir()
    shutil.copy(SUPERVISOR, endpoints / "supervisor.sh")
    (endpoints / "endpoints").write_text("3 port 6006\n")
    proc = entrypoint(runtime, "sleep 1; echo job ran; exit 4", DLTS_ENDPOINTS_DIR=str(endpoints),
                      DLTS_ENDPOINTS_STATE=str(tmp_path / "state"), DLTS_ENDPOINTS_POLL_S="0.2")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 4
    assert "job ran" in out and "dlts-endpoints: port 6006: nothing to start" in out


def test_the_supervisor_starts_when_its_configmap_arrives_after_the_job(runtime, tmp_path):
    """A job that is not distributed gets its endpoint ConfigMap with its first endpoint, after the
    pod started: the entrypoint starts the supervisor once the kubelet has filled the directory."""
    endpoints = tmp_path / "dlts-endpoints"
    endpoints.mkdir()
    proc = entrypoint(runtime, "sleep 3; echo job ran", DLTS_ENDPOINTS_DIR=str(endpoints),
                      DLTS_ENDPOINTS_STATE=str(tmp_path / "state"), DLTS_ENDPOINTS_POLL_S="0.2")
    time.sleep(0.6)
    (endpoints / "endpoints").write_text("3 port 6006\n")
    staged = tmp_path / "supervisor.sh"  # the kubelet swaps the files in at once
    shutil.copy(SUPERVISOR, staged)
    staged.rename(endpoints / "supervisor.sh")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "job ran" in out and "dlts-endpoints: port 6006: nothing to start" in out


def test_a_job_whose_endpoints_never_come_ends_with_its_own_status(runtime, tmp_path):
    endpoints = tmp_path / "dlts-endpoints"
    endpoints.mkdir()
    started = time.monotonic()
    # the supervisor polls every 120 s: the job's end must not wait for its next poll (the bound is
    # half that, so a loaded machine's slow start does not count against it)
    proc = entrypoint(runtime, "echo plain; exit 3", DLTS_ENDPOINTS_DIR=str(endpoints), DLTS_ENDPOINTS_POLL_S="120")
    out, _ = proc.communicate(timeout=90)
    assert (proc.returncode, out) == (3, "plain\n") and time.monotonic() - started < 60


def test_without_endpoints_dir_no_supervisor_runs(runtime):
    proc = entrypoint(runtime, "echo plain")
    out, _ = proc.communicate(timeout=20)
    assert (proc.returncode, out) == (0, "plain\n")


def test_home_is_made_when_the_image_lacks_it(runtime, tmp_path):
    home = tmp_path / "tmp" / "alice"
    proc = entrypoint(runtime, 'cd && pwd && touch ok', HOME=str(home))
    out, _ = proc.communicate(timeout=20)
    assert out == f"{home}\n" and (home / "ok").exists()


def test_the_command_runs_with_the_images_sh_or_busybox_when_it_has_none(runtime):
    proc = entrypoint(runtime, "readlink /proc/$$/exe")
    out, _ = proc.communicate(timeout=20)
    assert out.strip() == os.path.realpath("/bin/sh")
    if os.geteuid() != 0 or subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False).returncode != 0:
        pytest.skip("hiding /bin/sh (an image without a shell) needs root and unshare -m")
    # An image without /bin/sh: /dev/null bound over it in a private mount namespace.
    out = subprocess.run(["unshare", "-m", "/bin/sh", "-c", 'mount --bind /dev/null /bin/sh && exec "$@"', "sh",
                          str(runtime / "busybox"), "sh", "-c", ENTRYPOINT],
                         env={"PATH": SYSTEM_PATH, "DLTS_RUNTIME_DIR": str(runtime),
                              "DLTS_COMMAND": "readlink /proc/$$/exe; echo $((1 + 1))"},
                         capture_output=True, text=True, timeout=20, check=False)
    assert out.stdout.splitlines() == [str(runtime / "busybox"), "2"], out.stderr


# -- dlts-identity ----------------------------------------------------------------------------------


def identity(runtime: Path, passwd: str, group: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """IDENTITY_SCRIPT with ``passwd``/``group`` standing for the image's files (its /etc is
    read through a private mount namespace when root, else the script reads the copies)."""
    image_etc = tmp_path / "image-etc"
    image_etc.mkdir(exist_ok=True)
    (image_etc / "passwd").write_text(passwd)
    (image_etc / "group").write_text(group)
    script = IDENTITY_SCRIPT.replace("passwd=/etc/passwd", f"passwd={image_etc}/passwd").replace(
        "group=/etc/group", f"group={image_etc}/group")
    assert script != IDENTITY_SCRIPT
    full = {"PATH": SYSTEM_PATH, "DLTS_RUNTIME_DIR": str(runtime), "DLTS_LOGIN": "alice", "DLTS_UID": "4242",
            "DLTS_GID": "4242", "DLTS_GROUPS": "5001 100", "HOME": "/home/alice", **env}
    return subprocess.run([str(runtime / "busybox"), "sh", "-c", script], env=full, capture_output=True, text=True,
                          timeout=20, check=False)


IMAGE_PASSWD = ("root:x:0:0:root:/root:/bin/bash\n"
                "ubuntu:x:1000:1000:Ubuntu:/home/ubuntu:/bin/bash\n"
                "alice:x:1001:1001:someone else called alice:/home/alice:/bin/sh\n"
                "svc:x:4242:4242:a service user with the owner's uid:/:/usr/sbin/nologin\n")
IMAGE_GROUP = "root:x:0:\nusers:x:100:ubuntu\nalice:x:1001:\n"


def test_the_owner_gets_a_login_with_their_uid_and_groups_and_the_images_users_stay(runtime, tmp_path):
    out = identity(runtime, IMAGE_PASSWD, IMAGE_GROUP, tmp_path)
    assert out.returncode == 0, out.stderr
    shell = "/bin/bash" if os.access("/bin/bash", os.X_OK) else "/bin/sh"
    assert (runtime / "passwd").read_text().splitlines() == [
        "root:x:0:0:root:/root:/bin/bash",
        "ubuntu:x:1000:1000:Ubuntu:/home/ubuntu:/bin/bash",
        f"alice:x:4242:4242:DLTS job owner:/home/alice:{shell}"]
    groups = (runtime / "group").read_text().splitlines()
    assert groups[:3] == ["root:x:0:", "users:x:100:ubuntu,alice", "alice:x:1001:"]
    # gid 4242 is new, and the name alice is taken by gid 1001
    assert sorted(groups[3:]) == ["dlts-4242:x:4242:", "dlts-5001:x:5001:alice"]
    assert not list(runtime.glob("*.new"))


def test_an_image_without_etc_files_gets_just_the_owner(runtime, tmp_path):
    script_env = {"DLTS_GROUPS": ""}
    rt_script = IDENTITY_SCRIPT.replace("passwd=/etc/passwd", "passwd=/nonexistent/passwd").replace(
        "group=/etc/group", "group=/nonexistent/group")
    out = subprocess.run([str(runtime / "busybox"), "sh", "-c", rt_script],
                         env={"PATH": SYSTEM_PATH, "DLTS_RUNTIME_DIR": str(runtime), "DLTS_LOGIN": "alice",
                              "DLTS_UID": "4242", "DLTS_GID": "4242", "HOME": "/tmp/alice", **script_env},
                         capture_output=True, text=True, timeout=20, check=False)
    assert out.returncode == 0, out.stderr
    assert (runtime / "passwd").read_text().startswith("alice:x:4242:4242:DLTS job owner:/tmp/alice:")
    assert (runtime / "group").read_text() == "alice:x:4242:\n"


def test_a_failing_identity_script_fails_the_init_container(runtime, tmp_path):
    """Any step failing ends the script non-zero (the pod shows Init:Error), leaving no half file."""
    (runtime / "group.new").mkdir()  # the group file cannot be written, even by root
    out = identity(runtime, IMAGE_PASSWD, IMAGE_GROUP, tmp_path)
    assert out.returncode != 0 and "group.new" in out.stderr
    assert not (runtime / "passwd").exists() and not (runtime / "group").exists()
