"""The endpoint supervisor (templates/kubernetes/endpoint-supervisor.sh) run for real with /bin/sh in a
temporary directory standing for the mounted ConfigMap (the entrypoint that starts it:
test_k8s_pod_scripts.py).

sshd is the real one (/usr/sbin/sshd) with a real ssh client, run as the job's owner the way a pod
runs it: as root, the test gives the supervisor a private mount namespace whose /etc/passwd and
/etc/group are the files the pod's dlts-identity init container writes (the script run for real)
and drops to the owner's uid, gid and groups with no capabilities; as any other user it runs as
that user. Jupyter is the real jupyter-server when one is installed (or DLTS_TEST_JUPYTER_BIN names
the directory holding ``jupyter``); the arguments given to jupyter and code-server are also checked
with stand-ins that record them.
"""

from __future__ import annotations

import getpass
import hashlib
import http.cookiejar
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from dlts.backends.k8s_render import DEFAULT_TEMPLATES_DIR, IDENTITY_SCRIPT

SCRIPT = DEFAULT_TEMPLATES_DIR / "endpoint-supervisor.sh"
TOKEN = "tok-" + "x" * 28
TOKEN_HASH = hashlib.sha256(TOKEN.encode()).hexdigest()
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Supervisor:
    """The supervisor as a process, its endpoint directory and what it printed."""

    def __init__(self, tmp_path: Path, *, bin_dir: Path | None = None, env: dict[str, str] | None = None,
                 argv: list[str] | None = None) -> None:
        self.dir = tmp_path / "endpoints"
        self.dir.mkdir()
        self.state = tmp_path / "state"
        self.write("endpoints", "")
        self.write("authorized_keys", "")
        self.bin = bin_dir or tmp_path / "bin"
        self.bin.mkdir(exist_ok=True)
        full_env = {"PATH": f"{self.bin}:{SYSTEM_PATH}", "HOME": str(tmp_path), "DLTS_ENDPOINTS_DIR": str(self.dir),
                    "DLTS_ENDPOINTS_STATE": str(self.state), "DLTS_ENDPOINTS_POLL_S": "0.2", **(env or {})}
        self.proc = subprocess.Popen(argv or ["/bin/sh", str(SCRIPT)], env=full_env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def write(self, name: str, text: str) -> None:
        """Replace a file at once, as the kubelet swaps a ConfigMap volume's contents."""
        tmp = self.dir / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.dir / name)

    def said(self, text: str) -> list[str]:
        return [line for line in self.lines if line.startswith("dlts-endpoints:") and text in line]

    def wait_for(self, text: str, timeout_s: float = 15.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.said(text)
            if found:
                return found[0]
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no line with {text!r}; output:\n" + "\n".join(self.lines))

    def pid_of(self, endpoint_id: int) -> int:
        return int((self.state / f"{endpoint_id}.pid").read_text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # its trap stops the servers it started
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        for pid_file in self.state.glob("*.pid"):  # never leave a server behind, whatever happened
            try:
                pid = int(pid_file.read_text())
                # only a server of this supervisor: a recorded pid whose server is gone may be
                # another test's process by now (pids wrap within minutes on a busy machine)
                if f"DLTS_ENDPOINTS_STATE={self.state}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    os.killpg(pid, signal.SIGKILL)
            except (ValueError, OSError):
                pass


@pytest.fixture
def supervisors():
    started: list[Supervisor] = []

    def start(*args, **kw) -> Supervisor:
        sup = Supervisor(*args, **kw)
        started.append(sup)
        return sup

    yield start
    for sup in started:
        sup.stop()


def gone(pid: int, timeout_s: float = 10.0) -> bool:
    """True once ``pid`` has exited (and been reaped by its parent, the supervisor)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def stand_in(bin_dir: Path, name: str, body: str = 'exec sleep 1000') -> Path:
    """A program called ``name`` that records its arguments, umask and HASHED_PASSWORD, then runs ``body``."""
    path = bin_dir / name
    path.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >"$0.args"\necho "UMASK=$(umask)" >>"$0.args"\n'
                    f'echo "HASHED_PASSWORD=${{HASHED_PASSWORD:-}}" >>"$0.args"\n{body}\n')
    path.chmod(0o755)
    return path


def no_program(*names: str) -> None:
    for name in names:
        if shutil.which(name, path=SYSTEM_PATH):
            pytest.skip(f"{name} is installed on this machine; the 'missing program' case needs it absent")


# -- without real servers ----------------------------------------------------------------------------


def test_a_port_needs_no_server_and_a_missing_program_is_named_once_then_picked_up(tmp_path, supervisors):
    no_program("jupyter", "code-server")
    sup = supervisors(tmp_path)
    sup.write("endpoints", f"3 port 6006\n4 jupyter 18888 {TOKEN_HASH}\n5 vscode 18080 {TOKEN_HASH}\n")
    assert sup.wait_for("port 6006") == (
        "dlts-endpoints: port 6006: nothing to start; the job's own server must listen on 0.0.0.0:6006")
    line = sup.wait_for("jupyter (port 18888)")
    assert "jupyter is not installed where the job runs; pip install jupyter-server" in line
    assert "code-server is not installed where the job runs" in sup.wait_for("vscode (port 18080)")
    time.sleep(1.0)  # five more polls
    assert len(sup.said("jupyter is not installed")) == 1 and len(sup.said("port 6006")) == 1
    stand_in(sup.bin, "jupyter")  # installed while the job runs: started at the next poll
    sup.wait_for("jupyter: started jupyter server on port 18888")


@pytest.mark.parametrize("shell", ["dash", "bash", "busybox"])
def test_jupyter_and_code_server_get_the_tokens_hash_as_password_and_stop_when_closed(tmp_path, supervisors, shell):
    """Also: the script is POSIX sh, run by the shells job images have as /bin/sh."""
    if not shutil.which(shell):
        pytest.skip(f"{shell} is not installed here")
    argv = [shutil.which(shell), *(["sh"] if shell == "busybox" else ["--posix"] if shell == "bash" else []), str(SCRIPT)]
    sup = supervisors(tmp_path, argv=argv)
    jupyter, code = stand_in(sup.bin, "jupyter"), stand_in(sup.bin, "code-server")
    sup.write("endpoints", f"4 jupyter 18888 {TOKEN_HASH}\n5 vscode 18080 {TOKEN_HASH}\n")
    sup.wait_for("jupyter: started")
    sup.wait_for("vscode: started")
    deadline = time.monotonic() + 5
    def written(path: Path) -> bool:  # the stand-in writes its last line last
        return path.exists() and "HASHED_PASSWORD=" in path.read_text()

    while not (written(Path(f"{jupyter}.args")) and written(Path(f"{code}.args"))) and time.monotonic() < deadline:
        time.sleep(0.05)
    args = Path(f"{jupyter}.args").read_text().splitlines()
    assert args[:2] == ["server", "--no-browser"]
    assert {"--ip=0.0.0.0", "--port=18888", "--IdentityProvider.token=",
            f"--PasswordIdentityProvider.hashed_password=sha256::{TOKEN_HASH}"} <= set(args)
    umask = os.umask(0o022)
    os.umask(umask)
    assert f"UMASK={umask:04o}" in args  # the job's umask, not the supervisor's private one
    args = Path(f"{code}.args").read_text().splitlines()
    assert args[:4] == ["--bind-addr", "0.0.0.0:18080", "--auth", "password"]
    assert args[-1] == f"HASHED_PASSWORD={TOKEN_HASH}"
    jupyter_pid, code_pid = sup.pid_of(4), sup.pid_of(5)
    sup.write("endpoints", f"5 vscode 18080 {TOKEN_HASH}\n")  # the Jupyter endpoint is closed
    assert sup.wait_for("stopped") == "dlts-endpoints: jupyter: stopped the server on port 18888 (endpoint closed)"
    assert gone(jupyter_pid)
    os.kill(code_pid, 0)  # the other one keeps running
    sup.stop()
    assert gone(code_pid)  # stopping the supervisor stops its servers
    assert sup.said("vscode: stopped the server on port 18080 (the supervisor is stopping)")


def test_a_server_that_keeps_exiting_is_started_five_times_then_left_alone(tmp_path, supervisors):
    sup = supervisors(tmp_path)
    stand_in(sup.bin, "jupyter", body="exit 1")
    sup.write("endpoints", f"4 jupyter 18888 {TOKEN_HASH}\n")
    line = sup.wait_for("not starting it again")
    assert line.startswith("dlts-endpoints: jupyter (port 18888) exited 5 times")
    assert len(sup.said("jupyter: started")) == 5 and len(sup.said("exited; starting it again")) == 4
    time.sleep(0.6)
    assert len(sup.said("jupyter: started")) == 5


def test_malformed_lines_are_named_and_skipped(tmp_path, supervisors):
    sup = supervisors(tmp_path)
    sup.write("endpoints", "# a comment\nx1 ssh 22\n7 port\n8 port 9000\n")
    sup.wait_for("port 9000: nothing to start")
    assert sup.said("ignoring a malformed line in") and len(sup.said("malformed")) >= 2


# -- real servers -------------------------------------------------------------------------------------


def ssh_run(port: int, key: Path, user: str, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-F", "/dev/null", "-p", str(port), "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5",
         "-o", "LogLevel=ERROR", f"{user}@127.0.0.1", command],
        capture_output=True, text=True, timeout=30, check=False)


def new_key(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


OWNER_UID, OWNER_GID, VC_GID = 4242, 4242, 5001
JOB_ENV = {
    "DLTS_USER": "alice", "DLTS_JOB_ID": "77", "CUDA_VISIBLE_DEVICES": "0,1", "NVIDIA_VISIBLE_DEVICES": "GPU-1,GPU-2",
    "MASTER_ADDR": "dlts-77-1-0.dlts-77-1.dlts.svc", "MASTER_PORT": "29500", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "WEIRD": 'a "quoted" \\back\\slash $HOME #not-a-comment  two  spaces',
    # a value with a newline cannot go into sshd's config; it must not smuggle a variable in either
    "MULTI": "first\nLD_PRELOAD=/tmp/evil.so",
}
SESSION = ('id -u; id -un; id -G; echo "$DLTS_JOB_ID|$CUDA_VISIBLE_DEVICES|$NVIDIA_VISIBLE_DEVICES|$MASTER_ADDR|'
           '$MASTER_PORT|$CUDA_DEVICE_ORDER"; printf "%s\\n" "$WEIRD"; echo "${LD_PRELOAD:-no preload}|${MULTI:-no multi}"; '
           'echo "$PATH"; echo "$HOME"')


def owners_sandbox(tmp_path: Path) -> tuple[Path, list[str], str]:
    """As root: the identity files of a pod (written by IDENTITY_SCRIPT as the owner) and the
    supervisor's argv running it as the owner, with them as /etc/passwd and /etc/group."""
    busybox = shutil.which("busybox")
    if busybox is None or subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False).returncode != 0 \
            or not shutil.which("setpriv"):
        pytest.skip("as root this test needs busybox, setpriv and unshare -m (a private mount namespace) to run "
                    "sshd as the job's owner without touching this machine's /etc/passwd")
    base = Path(tempfile.mkdtemp(prefix="dlts-sshd-"))  # traversable by the owner (tmp_path is root's only)
    os.chmod(base, 0o755)
    runtime, home = base / "runtime", base / "home"
    for d in (runtime, home):
        d.mkdir()
    shutil.copy(busybox, runtime / "busybox")
    for d in (base, runtime, home):
        os.chown(d, OWNER_UID, OWNER_GID)
    drop = ["setpriv", f"--reuid={OWNER_UID}", f"--regid={OWNER_GID}", "--inh-caps=-all", "--bounding-set=-all",
            "--no-new-privs"]
    made = subprocess.run([*drop, "--clear-groups", str(runtime / "busybox"), "sh", "-c", IDENTITY_SCRIPT],
                          env={"PATH": SYSTEM_PATH, "DLTS_RUNTIME_DIR": str(runtime), "DLTS_LOGIN": "alice",
                               "DLTS_UID": str(OWNER_UID), "DLTS_GID": str(OWNER_GID), "DLTS_GROUPS": str(VC_GID),
                               "HOME": str(home)}, capture_output=True, text=True, timeout=30, check=False)
    assert made.returncode == 0, made.stderr
    argv = ["unshare", "-m", "/bin/sh", "-c",
            'mount --bind "$1" /etc/passwd && mount --bind "$2" /etc/group && shift 2 && exec "$@"', "sh",
            str(runtime / "passwd"), str(runtime / "group"), *drop, f"--groups={VC_GID}",
            str(runtime / "busybox"), "sh", str(SCRIPT)]
    return base, argv, str(home)


def test_sshd_logs_the_owner_in_as_themselves_with_the_jobs_environment(tmp_path, supervisors):
    if not Path("/usr/sbin/sshd").exists() or not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        pytest.skip("needs OpenSSH: /usr/sbin/sshd, ssh and ssh-keygen (apt-get install openssh-server openssh-client)")
    key, stranger = new_key(tmp_path / "id"), new_key(tmp_path / "stranger")
    port = free_port()
    base = None
    try:
        if os.geteuid() == 0:
            base, argv, home = owners_sandbox(tmp_path)
            passwd = (base / "runtime" / "passwd").read_text().splitlines()
            assert f"alice:x:{OWNER_UID}:{OWNER_GID}:DLTS job owner:{home}:/bin/bash" in passwd
            image_root = [line for line in Path("/etc/passwd").read_text().splitlines() if line.split(":")[2] == "0"]
            assert [line for line in passwd if line.split(":")[2] == "0"] == image_root  # no second uid 0
            user, uid, groups = "alice", OWNER_UID, {OWNER_GID, VC_GID}
            sup = supervisors(base, env={**JOB_ENV, "HOME": home}, argv=argv)
        else:  # a non-root runner is already the owner of its sshd
            user, uid, groups, home = getpass.getuser(), os.getuid(), set(os.getgroups()), str(tmp_path)
            sup = supervisors(tmp_path, env={**JOB_ENV, "DLTS_USER": user})
        sup.write("authorized_keys", Path(f"{key}.pub").read_text())
        sup.write("endpoints", f"5 ssh {port}\n")
        sup.wait_for(f"ssh: started sshd on port {port} for {user}")
        deadline = time.monotonic() + 15
        while True:
            result = ssh_run(port, key, user, SESSION)
            if result.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # sshd is still starting
        assert result.returncode == 0, result.stderr + "\n".join(sup.lines)
        out = result.stdout.splitlines()
        assert out[0] == str(uid) and out[1] == user and groups <= {int(g) for g in out[2].split()}
        assert out[3] == "77|0,1|GPU-1,GPU-2|dlts-77-1-0.dlts-77-1.dlts.svc|29500|PCI_BUS_ID"
        assert out[4] == JOB_ENV["WEIRD"]
        assert out[5] == "no preload|no multi"
        assert out[6].split(":")[0] == str(sup.bin)  # the job's PATH, not sshd's default
        assert out[7] == home
        refused = ssh_run(port, stranger, user, "true")
        assert refused.returncode == 255 and "Permission denied" in refused.stderr
        if os.geteuid() == 0:
            assert ssh_run(port, key, "root", "true").returncode == 255  # sshd runs as alice: only alice
        pid = sup.pid_of(5)
        sup.write("endpoints", "")
        sup.wait_for(f"ssh: stopped the server on port {port} (endpoint closed)")
        assert gone(pid)
        closed = ssh_run(port, key, user, "true")
        assert closed.returncode == 255 and "refused" in closed.stderr
    finally:
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)


def test_ssh_says_why_not_when_the_uid_has_no_login(tmp_path, supervisors):
    """A container whose uid is not in /etc/passwd (no dlts-identity): sshd could not log anyone in."""
    if os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("busybox"):
        pytest.skip("needs root and setpriv to run the supervisor as a uid this machine does not know")
    base = Path(tempfile.mkdtemp(prefix="dlts-sshd-"))
    os.chmod(base, 0o755)
    os.chown(base, OWNER_UID, OWNER_GID)
    try:
        bin_dir = base / "bin"
        bin_dir.mkdir()
        for name in ("sshd", "ssh-keygen"):  # present, so that the login is what is missing
            stand_in(bin_dir, name, body="exit 0")
        sup = supervisors(base, bin_dir=bin_dir, argv=["setpriv", f"--reuid={OWNER_UID}", f"--regid={OWNER_GID}",
                                                       "--clear-groups", shutil.which("busybox"), "sh", str(SCRIPT)])
        sup.write("endpoints", f"5 ssh {free_port()}\n")
        assert sup.wait_for("has no name") == (
            f"dlts-endpoints: ssh: uid {OWNER_UID} has no name in this container's /etc/passwd, so sshd cannot log "
            "anyone in")
        time.sleep(0.6)
        assert len(sup.said("has no name")) == 1 and not sup.said("started sshd")
    finally:
        shutil.rmtree(base, ignore_errors=True)

def jupyter_dir() -> str | None:
    given = os.environ.get("DLTS_TEST_JUPYTER_BIN")
    if given:
        return given
    found = shutil.which("jupyter-server")
    return str(Path(found).parent) if found else None


def test_jupyter_server_takes_the_endpoints_token_as_its_password(tmp_path, supervisors):
    where = jupyter_dir()
    if where is None:
        pytest.skip("jupyter-server is not installed (pip install jupyter-server, or set DLTS_TEST_JUPYTER_BIN "
                    "to the directory holding its jupyter command)")
    port = free_port()
    sup = supervisors(tmp_path, bin_dir=Path(where))
    sup.write("endpoints", f"4 jupyter {port} {TOKEN_HASH}\n")
    sup.wait_for(f"jupyter: started jupyter server on port {port}")
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status", timeout=5)
            raise AssertionError("jupyter answered without a password")
        except urllib.error.HTTPError as exc:
            assert exc.code == 403
            break
        except urllib.error.URLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)  # still starting

    def login(password: str) -> int:
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        opener.open(f"{base}/login", timeout=10).read()
        xsrf = next(c.value for c in jar if c.name == "_xsrf")
        form = urllib.parse.urlencode({"_xsrf": xsrf, "password": password}).encode()
        try:
            opener.open(f"{base}/login", data=form, timeout=10).read()
        except urllib.error.HTTPError as exc:
            assert exc.code == 401  # a wrong password
        try:
            return opener.open(f"{base}/api/status", timeout=10).status
        except urllib.error.HTTPError as exc:
            return exc.code

    assert login("wrong") == 403
    assert login(TOKEN) == 200
