"""The DLTS init: PID 1 of a job (``python -I -S dlts_init.py [--run-spec F] [--pid-file F] [--exit-file F]
[--endpoints-dir D] -- CMD ...``).

It starts CMD in a process group of its own, forwards SIGTERM/SIGINT/SIGHUP/SIGQUIT to that whole
group, reaps every zombie that lands on it (it makes itself a child subreaper), and exits with the
child's code (128 + N when the child died of signal N). Standard library only: it runs as a script
so that it starts in milliseconds. The code is also written atomically to
``--exit-file`` so the job manager learns it even after a restart of its own: ``CODE`` on the first
line, then ``log_cut BYTES REASON`` when some of the job's output could not be stored (a full log
volume). So that a full volume cannot take the record, the init keeps a block for it from the start
(``<exit file>.reserved``) and writes the record into that block when a new file cannot be made.

``--pid-file``: the init records its own pid and start time there (atomically) before it starts
CMD, so that a job never runs without a record even when the job manager that started the init
died before it could write one.

``--run-spec`` (JSON written by the local backend) says how CMD runs:

* ``log``: ``{"dir", "job_id", "attempt", "key", "max_bytes", "shared", "state"}``: CMD's stdout and stderr go
  through a pipe to the init, which appends them to the log store (``dlts/logstore.py``, loaded by
  path: capped at ``max_bytes``, head and tail kept) under the attempt's log key (absent or null:
  a spec from before log keys). The job never holds its log file open, and
  the exit code is written only once the log has all of CMD's output. The pipe is read to its end
  whatever the store does: on a full log volume the output is dropped and counted
  (``logstore.CuttingLog``), never left in the pipe where it would block the job. ``state`` (a
  path): a block reserved at the start that reads ``cut REASON`` while output is being dropped.
* ``cwd``: CMD's working directory (never the log directory).
* ``uid`` / ``gid`` / ``groups``: CMD (and the jupyter / code-server servers) run as this identity;
  the init stays as it was started (root) to record the exit and reap.

With ``--endpoints-dir`` it also runs the endpoint supervisor of the local backend: about every
0.5 s it reads ``endpoints.json`` there (written by ``LocalBackend.expose``), starts the servers of
the listed ssh / jupyter / vscode endpoints on free ports (``sshd``, ``jupyter server``,
``code-server``), stops those no longer listed, and reports each endpoint in
``endpoints.state.json`` (``{id: {status, host_port, message}}``, written atomically): ``pending``
until the server accepts TCP connections, then ``ready``; ``failed`` with a message when the
program is missing or the server exits. The servers stop when CMD exits and when the init gets
SIGTERM or SIGINT. Their output goes to ``endpoint-<id>.log`` in the same directory.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import threading
import time

# the init imports no more than it uses (it starts with every job): these are for the type checker
TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from types import ModuleType

PR_SET_CHILD_SUBREAPER = 36
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
STOPPING = (signal.SIGTERM, signal.SIGINT)  # these also stop the endpoint servers at once

# endpoint supervisor
ENDPOINTS_FILE = "endpoints.json"
STATE_FILE = "endpoints.state.json"
POLL_S = 0.5  # how often endpoints.json is read
LOOP_S = 0.05  # how often the supervising init reaps children (and so notices the job's exit)
START_TIMEOUT_S = 120.0  # a server that accepts no connection by then has failed
STOP_GRACE_S = 3.0  # SIGTERM to a server and everything it started, SIGKILL after this
TAIL_LINES = 5  # lines of a server's output quoted when it exits
MESSAGE_CHARS = 480  # state messages fit the job manager's 512-character column
PROGRAMS = {"ssh": "sshd", "jupyter": "jupyter", "vscode": "code-server"}  # endpoint kind -> its server
MISSING = {
    "ssh": "sshd is not installed where the job runs (not on PATH, not /usr/sbin/sshd): install "
           "openssh-server in the job's image or machine (apt-get install openssh-server), then "
           "delete this endpoint and ask for it again",
    "ssh-keygen": "ssh-keygen is not installed where the job runs: install openssh-client in the job's "
                  "image or machine (apt-get install openssh-client), then delete this endpoint and ask "
                  "for it again",
    "jupyter": "jupyter is not installed where the job runs (no jupyter on the job's PATH): pip install "
               "jupyter-server in the job's environment, then delete this endpoint and ask for it again",
    "vscode": "code-server is not installed where the job runs (no code-server on the job's PATH): "
              "install it (https://coder.com/docs/code-server/install), then delete this endpoint and "
              "ask for it again",
}


def _become_subreaper() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: orphans go to the real init, which is fine
        pass


RESERVED_BYTES = 4096  # the block kept for the exit record: one page or file system block


def _complain(text: str) -> None:
    """A line on the init's stderr (the unit's init.log), unless that cannot be written either: the
    init never stops over its own complaint."""
    try:
        sys.stderr.write(f"dlts-init: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _reserve(path: str | None, what: str = "the exit record") -> None:
    """Keep a block at ``path`` while the volume has room (``_write_reserved``)."""
    if path:
        try:
            _write_atomic(path, " " * RESERVED_BYTES)
        except OSError as exc:
            _complain(f"cannot reserve room for {what} ({exc.strerror})")


def _write_reserved(path: str, text: str) -> None:
    """``text`` over a block ``_reserve`` kept: its pages are allocated, so this needs no room."""
    with open(path, "r+b") as fh:
        fh.write(text.encode()[:RESERVED_BYTES].ljust(RESERVED_BYTES))


def _write_exit(path: str | None, code: int, cut: tuple[int, str] | None = None) -> None:
    """The record: ``CODE`` and, when output was dropped, ``log_cut BYTES REASON``. A new file
    first; on a full volume into the reserved block, which then takes the record's name."""
    if not path:
        return
    text = f"{code}\n" + (f"log_cut {cut[0]} {cut[1]}\n" if cut else "")
    try:
        _write_atomic(path, text)
    except OSError as exc:
        reserved = f"{path}.reserved"
        try:
            _write_reserved(reserved, text)
            os.replace(reserved, path)
        except OSError as again:
            _complain(f"cannot record the job's exit code {code} ({exc.strerror}; the reserved block: "
                      f"{again.strerror})")
        return
    try:
        os.unlink(f"{path}.reserved")
    except OSError:
        pass


def _code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process (Linux /proc); empty elsewhere."""
    parents: dict[int, int] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return parents
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1:
            parents[int(name)] = int(fields[1])
    return parents


def _tree(root: int) -> set[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def _signal(pids, sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _accepts(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class Server:
    """One endpoint's server process (or the reason it has none)."""

    def __init__(self, endpoint_id: str, kind: str):
        self.id, self.kind = endpoint_id, kind
        self.status, self.message = "pending", ""
        self.host_port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None  # reaped by the init's loop, never by Popen itself
        self.log_path = ""
        self.started = 0.0
        self.stopping: set[int] = set()  # pids that got SIGTERM (the server and what it started)
        self.kill_at = 0.0

    def state(self) -> dict:
        return {"status": self.status, "host_port": self.host_port, "message": self.message}

    def fail(self, message: str) -> None:
        self.status, self.host_port, self.message = "failed", None, message[:MESSAGE_CHARS]

    def tail(self) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 8192))
                lines = fh.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return ""
        return " | ".join(line.strip() for line in lines[-TAIL_LINES:] if line.strip())


class Supervisor:
    """Starts and stops the endpoint servers ``endpoints.json`` asks for; reports them in
    ``endpoints.state.json``. Driven by the init's loop: ``poll`` now and then, ``exited`` for every
    reaped child that is not the job, ``stop_all`` when the job ends or the init is told to stop."""

    def __init__(self, directory: str, identity: Identity | None = None):
        self.dir = os.path.abspath(directory)
        self.identity = identity or Identity(None, None, [])
        self.servers: dict[str, Server] = {}
        self.by_pid: dict[int, Server] = {}
        self.written: dict | None = None
        self.keys_text: str | None = None
        self.stopped: list[Server] = []  # got SIGTERM; SIGKILL for what is left at their kill_at
        self.closed = False

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    # -- the loop's hooks -------------------------------------------------------------------------
    def poll(self) -> None:
        if self.closed:
            return
        wanted = self._read()
        if wanted is not None:
            endpoints, keys = wanted
            if any(e["kind"] == "ssh" for e in endpoints.values()):
                self._write_keys(keys)
            for endpoint_id in [i for i in self.servers if i not in endpoints]:
                self._stop(self.servers.pop(endpoint_id))
            for endpoint_id, endpoint in endpoints.items():
                if endpoint_id not in self.servers:
                    server = Server(endpoint_id, endpoint["kind"])
                    self.servers[endpoint_id] = server
                    self._start(server, endpoint)
        now = time.monotonic()
        for server in self.servers.values():
            # a started server has its port (both are set by _start)
            if server.status != "pending" or server.proc is None or server.host_port is None:
                continue
            if _accepts(server.host_port):
                server.status, server.message = "ready", ""
            elif now - server.started > START_TIMEOUT_S:
                self._stop(server)
                tail = server.tail()
                server.fail(f"{server.kind} did not accept connections on port {server.host_port} within "
                            f"{START_TIMEOUT_S:.0f} s" + (f"; its last output: {tail}" if tail else ""))
        self._write_state()

    def exited(self, pid: int, status: int) -> None:
        server = self.by_pid.pop(pid, None)
        if server is None:
            return  # something a server or the job left behind
        if server.proc is not None:  # always: a server is in by_pid while its process is
            server.proc.returncode = _code(status)
        server.proc = None
        if server.stopping or self.servers.get(server.id) is not server:
            return  # we stopped it
        tail = server.tail()
        server.fail(f"{server.kind} server exited with code {_code(status)}"
                    + (f": {tail}" if tail else " without output"))
        self._write_state()

    def stop_all(self) -> None:
        if self.closed:
            return
        self.closed = True
        for server in self.servers.values():
            self._stop(server)

    def kill_late(self, now: float) -> None:
        """SIGKILL what is left of servers stopped more than STOP_GRACE_S ago."""
        for server in [s for s in self.stopped if now >= s.kill_at]:
            self.stopped.remove(server)
            parents = _parents()
            # only processes still ours: below the server, or orphans of it re-parented to the init
            ours = {os.getpid()} | server.stopping
            _signal([p for p in server.stopping if parents.get(p) in ours], signal.SIGKILL)

    # -- starting and stopping --------------------------------------------------------------------
    def _read(self):
        try:
            with open(self.path(ENDPOINTS_FILE)) as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return None  # written atomically, so this is someone else's mistake: keep what runs
        if not isinstance(data, dict):
            return None
        endpoints = {}
        for item in data.get("endpoints", ()):
            if isinstance(item, dict) and item.get("kind") in PROGRAMS and "id" in item:
                endpoints[str(item["id"])] = item
        keys = [k for k in data.get("ssh_public_keys", ()) if isinstance(k, str)]
        return endpoints, keys

    def _write_keys(self, keys: list[str]) -> None:
        text = "".join(k.strip() + "\n" for k in keys)
        if text != self.keys_text:
            try:
                _write_atomic(self.path("authorized_keys"), text)
                os.chmod(self.path("authorized_keys"), 0o600)
            except OSError as exc:  # a full volume: the next poll tries again; the job runs on
                _complain(f"cannot write the ssh keys: {exc.strerror}")
                return
            self.keys_text = text

    def _write_state(self) -> None:
        state = {i: s.state() for i, s in self.servers.items()}
        if state != self.written:
            try:
                _write_atomic(self.path(STATE_FILE), json.dumps(state, sort_keys=True))
            except OSError:  # a full volume: the next poll tries again; the job runs on
                return
            self.written = state

    def _start(self, server: Server, endpoint: dict) -> None:
        import shutil
        import subprocess

        kind = server.kind
        program = PROGRAMS[kind]
        found = shutil.which(program)
        if found is None and kind == "ssh" and os.access("/usr/sbin/sshd", os.X_OK):
            found = "/usr/sbin/sshd"
        if found is None:
            server.fail(MISSING[kind])
            return
        secret_hash = str(endpoint.get("secret_hash") or "")
        if kind in ("jupyter", "vscode") and len(secret_hash) != 64:
            server.fail(f"the {kind} endpoint has no token hash, so its server would be open to anyone; "
                        "delete this endpoint and ask for it again")
            return
        port = _free_port()
        env = dict(os.environ)
        as_user = {} if kind == "ssh" else self.identity.popen_kwargs()  # sshd needs root to log users in
        if kind == "ssh":
            argv = self._sshd_argv(server, os.path.abspath(found), port)
            if argv is None:
                return
        elif kind == "jupyter":
            argv = [found, "server", "--no-browser", "--ip=0.0.0.0", f"--port={port}", "--ServerApp.port_retries=0",
                    "--IdentityProvider.token=",
                    # jupyter_server's passwd_check: sha256(password + salt) with an empty salt
                    f"--PasswordIdentityProvider.hashed_password=sha256::{secret_hash}"]
            if os.geteuid() == 0 and not as_user:
                argv.append("--allow-root")
        else:
            # code-server takes a HASHED_PASSWORD that is not argon2 as the SHA-256 hex of the password
            argv = [found, "--bind-addr", f"0.0.0.0:{port}", "--auth", "password"]
            env.pop("PASSWORD", None)
            env["HASHED_PASSWORD"] = secret_hash
        server.log_path = self.path(f"endpoint-{server.id}.log")
        try:
            with open(server.log_path, "ab") as out:
                server.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                               env=env, start_new_session=True, close_fds=True, **as_user)
        except OSError as exc:
            server.fail(f"cannot start {program}: {exc.strerror}")
            return
        self.by_pid[server.proc.pid] = server
        server.host_port, server.started = port, time.monotonic()

    def _sshd_argv(self, server: Server, sshd: str, port: int) -> list[str] | None:
        import shutil
        import subprocess

        host_key = self.path("ssh_host_ed25519_key")
        if not os.path.exists(host_key):
            keygen = shutil.which("ssh-keygen")
            if keygen is None:
                server.fail(MISSING["ssh-keygen"])
                return None
            made = subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", host_key],
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
            if made.returncode != 0:
                server.fail(f"ssh-keygen could not make a host key: {made.stderr.strip() or made.returncode}")
                return None
        if os.geteuid() == 0 and not os.path.isdir("/run/sshd"):
            os.makedirs("/run/sshd", 0o755, exist_ok=True)  # sshd's privilege separation directory
        return [sshd, "-D", "-e", "-p", str(port), "-o", "ListenAddress=0.0.0.0", "-h", host_key,
                "-o", f"AuthorizedKeysFile={self.path('authorized_keys')}", "-o", "PasswordAuthentication=no",
                "-o", "KbdInteractiveAuthentication=no", "-o", "UsePAM=no", "-o", "StrictModes=no",
                "-o", "PidFile=none"]

    def _stop(self, server: Server) -> None:
        """SIGTERM to the server and everything below it (sshd's sessions, Jupyter's kernels)."""
        if server.proc is None or server.stopping:
            return
        server.stopping = _tree(server.proc.pid)
        server.kill_at = time.monotonic() + STOP_GRACE_S
        _signal(server.stopping, signal.SIGTERM)
        self.stopped.append(server)


class Identity:
    """Who CMD runs as (None: as the init itself)."""

    def __init__(self, uid: int | None, gid: int | None, groups: list[int]):
        self.uid, self.gid, self.groups = uid, gid, groups

    @classmethod
    def from_spec(cls, spec: dict) -> Identity:
        uid = spec.get("uid")
        if uid is None:
            return cls(None, None, [])
        gid = spec.get("gid")
        return cls(int(uid), int(uid if gid is None else gid), [int(g) for g in spec.get("groups") or ()])

    def drop(self) -> None:
        """In a child, before exec: become the job's user (groups first, the uid last)."""
        uid, gid = self.uid, self.gid
        if uid is None:
            return
        gid = uid if gid is None else gid  # as from_spec: the user's own group
        os.setgroups(sorted({gid, *self.groups}))
        os.setgid(gid)
        os.setuid(uid)

    def popen_kwargs(self) -> dict:
        if self.uid is None:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": sorted({self.gid, *self.groups})}


def _start_record() -> str:
    """``START_TIME TICKS``: this process's start as psutil computes it (boot time + start ticks;
    the attempt's start) and the raw start ticks since boot (field 22 of /proc/self/stat), which
    identify the process exactly: the wall clock and so the boot time can be stepped while a job
    runs, the ticks never change. Just the time where /proc is missing."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            stat = fh.read()
        ticks = int(stat[stat.rfind(b")") + 2:].split()[19])
        with open("/proc/stat", "rb") as fh:
            btime = next(float(line.split()[1]) for line in fh if line.startswith(b"btime"))
        return f"{btime + ticks / os.sysconf('SC_CLK_TCK')} {ticks}"
    except (OSError, ValueError, IndexError, StopIteration):
        return str(time.time())


def _load_logstore() -> ModuleType:
    """``dlts/logstore.py`` by its path: the init runs with -I -S and must not import the dlts package."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "logstore.py")
    loaded = importlib.util.spec_from_file_location("dlts_init_logstore", path)
    if loaded is None or loaded.loader is None:  # a .py path always has a loader
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(loaded)
    sys.modules[loaded.name] = module  # dataclasses look their module up there
    loaded.loader.exec_module(module)
    return module


class LogPump:
    """CMD's stdout+stderr: a pipe the init reads in a thread and appends to the log store. The
    pipe is always read to its end: what the store cannot take (a full volume) is dropped and
    counted, and said in the log once it has room (``logstore.CuttingLog``)."""

    def __init__(self, log: dict):
        logstore = _load_logstore()
        # "cut REASON" while output is being dropped, blank otherwise: a reserved block the job
        # manager reads while the job runs (the init's stderr may be on the full volume itself)
        self.state_path: str | None = log.get("state")
        self.shown_cut = False

        def open_writer():
            return logstore.AttemptLogWriter(log["dir"], int(log["job_id"]), int(log["attempt"]),
                                             int(log["max_bytes"]), key=log.get("key"),
                                             shared=bool(log.get("shared")))

        self.writer = logstore.CuttingLog(open_writer, _complain)
        self.read_fd, self.write_fd = os.pipe()
        self.thread = threading.Thread(target=self._pump, name="log", daemon=True)

    def start(self) -> None:
        os.close(self.write_fd)  # only the job holds the write end: EOF once it and its children are gone
        _reserve(self.state_path, "the log's state")
        self.thread.start()

    def _show_state(self) -> None:
        cut = self.writer.cut
        if cut == self.shown_cut or not self.state_path:
            return
        try:
            _write_reserved(self.state_path, f"cut {self.writer.reason}\n" if cut else "")
        except OSError:
            return  # not reserved (the volume was full from the start): the exit record says it
        self.shown_cut = cut

    def _pump(self) -> None:
        while True:
            try:
                data = os.read(self.read_fd, 65536)
            except InterruptedError:
                continue
            except OSError:
                return
            if not data:
                return
            try:
                self.writer.write(data)
            except Exception as exc:  # noqa: BLE001 - never stop reading: a pipe left unread blocks the job
                self.writer.dropped_bytes += len(data)
                self.writer.reason = self.writer.reason or str(exc)
                _complain(f"cannot write the job's log: {exc}")
            self._show_state()

    def say(self, text: str) -> None:
        try:
            self.writer.write(text.encode())
        except OSError:
            pass

    def finish(self, timeout_s: float = 10.0) -> tuple[int, str] | None:
        """Wait for the job's output to be read; (bytes dropped, why) when some was not stored."""
        self.thread.join(timeout_s)
        try:
            self.writer.close()
        except OSError as exc:
            _complain(f"cannot close the job's log: {exc.strerror}")
        if self.writer.dropped_bytes:
            _complain(f"{self.writer.dropped_bytes} bytes of the job's output were not stored: {self.writer.reason}")
            return self.writer.dropped_bytes, self.writer.reason
        return None


def run(argv: list[str], exit_file: str | None, endpoints_dir: str | None = None, run_spec: dict | None = None,
        pid_file: str | None = None) -> int:
    _become_subreaper()
    spec = run_spec or {}
    identity = Identity.from_spec(spec)
    try:
        pump = LogPump(spec["log"]) if spec.get("log") else None
    except (OSError, ValueError) as exc:
        # no pid record: the job manager reports the attempt as not started (init_failed, this line)
        _complain(f"cannot open the job's log in the log store: {exc}")
        return 1
    if pid_file:
        try:
            _write_atomic(pid_file, f"{os.getpid()} {_start_record()}\n")
        except OSError as exc:  # the job must not run without a record: not started (init_failed)
            _complain(f"cannot record the init's pid in {pid_file}: {exc.strerror}")
            return 1
    _reserve(f"{exit_file}.reserved" if exit_file else None)
    if pump is not None and spec.get("note"):
        pump.say(f"[dlts] {spec['note']}\n")
    child = os.fork()
    if child == 0:  # the job: its own process group, default signal handling
        os.setpgid(0, 0)
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        try:
            if pump is not None:
                os.dup2(pump.write_fd, 1)
                os.dup2(pump.write_fd, 2)
                os.close(pump.write_fd)
                os.close(pump.read_fd)
            if spec.get("cwd"):
                os.chdir(spec["cwd"])
            identity.drop()
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(2, f"dlts-init: cannot run {argv[0]}: {exc.strerror}\n".encode())
            os._exit(127)
    try:
        os.setpgid(child, child)
    except OSError:  # the child already did it (or already exec'd)
        pass
    if pump is not None:
        pump.start()
    told_to_stop: list[int] = []

    def forward(signum, _frame):
        if signum in STOPPING:
            told_to_stop.append(signum)
        try:
            os.killpg(child, signum)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    if endpoints_dir is None:
        code = _wait(child)
    else:
        code = _wait_supervising(child, Supervisor(endpoints_dir, identity), told_to_stop)
    cut = pump.finish() if pump is not None else None
    _write_exit(exit_file, code, cut)
    return code


def _job_ended(child: int, status: int) -> int:
    # the job's leader is gone; take the rest of its group down with it
    try:
        os.killpg(child, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return _code(status)


def _wait(child: int) -> int:
    """Block until every child is gone (the job and whatever it left behind); the job's code."""
    code = 1
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return code
        except InterruptedError:
            continue
        if pid == child:
            code = _job_ended(child, status)


def _wait_supervising(child: int, supervisor: Supervisor, told_to_stop: list[int]) -> int:
    """``_wait`` with the endpoint supervisor: reap without blocking, poll endpoints.json, and stop
    the servers when the job ends or the init is told to stop."""
    code, next_poll = 1, 0.0
    while True:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return code  # nothing left
            if pid == 0:
                break
            if pid == child:
                code = _job_ended(child, status)
                supervisor.stop_all()
            else:
                supervisor.exited(pid, status)
        now = time.monotonic()
        if told_to_stop:
            supervisor.stop_all()
        if now >= next_poll:
            supervisor.poll()
            next_poll = now + POLL_S
        supervisor.kill_late(now)
        time.sleep(LOOP_S)


def main() -> None:
    parser = argparse.ArgumentParser(prog="dlts-init")
    parser.add_argument("--exit-file")
    parser.add_argument("--endpoints-dir", help="run the endpoint supervisor on endpoints.json in this directory")
    parser.add_argument("--run-spec", help="JSON: the job's log, working directory and identity")
    parser.add_argument("--pid-file", help="record the init's pid and start time here before starting the job")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    spec = None
    if args.run_spec:
        with open(args.run_spec) as fh:
            spec = json.load(fh)
    sys.exit(run(command, args.exit_file, args.endpoints_dir, spec, args.pid_file))


if __name__ == "__main__":
    main()
