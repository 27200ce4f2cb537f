"""The local backend: each attempt is a real process tree on this machine (the demo's executor).

An attempt lives in ``<run_dir>/<job>-<attempt>/``. Most attempts run one process there; an
inference attempt runs one process per replica, and a distributed attempt one per placement (as
one pod per node), each in ``replicas/<index>/`` (the replica index of its placement) with its own
``CUDA_VISIBLE_DEVICES``. Each process directory (a *unit*) holds ``spec.json`` (the init's run
spec: log, working directory, identity, and ``job_env``: the labels and GPUs the node agent attributes
the unit's processes by), ``pid`` (pid, start time and start ticks since boot, written by the DLTS init
itself before it starts the job, so a reused pid is never mistaken for the job and no job runs
without a record), ``exit`` (written by the init when the command ends and its output is in the
log: the code, and how much output a full log volume cost; on a full run volume the record is
written into ``exit.reserved``, a block the init keeps from its start), ``kill_at`` (the SIGKILL
deadline after a SIGTERM; kept in memory when the volume is full), ``stopped`` (the demo shut down under it),
``work/`` (the job's working directory) and, for a replica, ``removed`` (scale-down: it is on its
way out and its ending does not end the attempt; the directory goes once it exited). Because the
state is on disk and the job runs in its own session, a restarted job manager adopts running
attempts instead of losing them, and ``launch`` twice never starts a unit twice.

A crash of the job manager in the middle of ``launch`` leaves a unit without a ``pid`` record:
nothing of the job runs there (the init records itself before it starts the job). Once such a
*half-made* unit is older than ``LAUNCH_GRACE_S`` (time for an init to start) ``observe`` no longer
reports it, so the job manager launches the attempt again (``launch`` clears the unit and starts it
afresh) or, when the job is being killed, ends it.

The job's output goes through the init to the log store (``dlts.logstore``, capped at
``log_max_bytes``); the job's working directory is its unit's ``work/``, never the log directory.
A full volume never blocks a job: the init drops the output the log store cannot take and says so
(``Observed.log_cut``); a unit that cannot be made on a full run volume is cleared and the launch
raises ``VolumeFull``: the job waits in ``scheduling`` with the reason until the volume has room or
its start timeout ends the attempt.
Distributed attempts get the rendezvous variables the Kubernetes backend sets (``MASTER_ADDR`` is
this machine, ``MASTER_PORT`` a free port chosen once per attempt). Identity: when DLTS runs as
root and the spec has a uid, the job runs as that uid/gid with its supplementary groups; when DLTS
is not root, every job runs as the DLTS service user, and a job whose owner has another uid is
told so in its log and by a note ``launch`` returns (the job manager records it as an event).

Endpoints (``expose``): a port endpoint is the job's own port on this machine. It becomes ready only
when a process of the attempt (a descendant of one of its DLTS inits, which are child subreapers,
so even a daemonised server stays below them) listens on that TCP port and no other process does,
on any address, IPv4 or IPv6 (the listeners of /proc/net/tcp and tcp6 matched by socket inode to
the attempt's /proc/PID/fd). Every job shares this machine's network, so a job could otherwise
claim another tenant's listening port and have the endpoint firewall admit its own allowed
addresses to it. Until then it is pending, with the reason. The
servers of ssh / jupyter / vscode endpoints run under the DLTS init of unit 0 (the attempt's
directory, or replica 0's): ``expose`` writes the wanted set to ``endpoints.json`` there, the init's
supervisor starts and stops the servers and reports them in ``endpoints.state.json``, which
``expose`` reads back.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TypedDict

import psutil

from dlts.backends.base import (
    EndpointSpec,
    EndpointState,
    LaunchSpec,
    NodeInfo,
    Observed,
    RunPhase,
    VolumeFull,
)
from dlts.backends.phases import MemberState, attempt_state

log = logging.getLogger(__name__)
INIT_SCRIPT = Path(__file__).with_name("dlts_init.py")
INIT_KILL_AFTER_S = 5.0  # after the SIGKILL deadline, how long the init gets to record the exit
REPLICAS = "replicas"  # an inference attempt's per-replica directories live here
ENDPOINTS_FILE = "endpoints.json"  # in unit 0: what expose wants (read by the init's supervisor)
ENDPOINTS_STATE_FILE = "endpoints.state.json"  # in unit 0: what the supervisor reports
SERVED = ("ssh", "jupyter", "vscode")  # endpoint kinds whose server the init starts
LAUNCH_GRACE_S = 10.0  # a unit without a pid record this old was left half-made by a crash
RENDEZVOUS_FILE = "rendezvous"  # in the attempt's directory: the distributed attempt's MASTER_PORT
LOG_STATE_FILE = "log_state"  # in each unit: "cut REASON" while the init drops output the log store cannot take
DEFAULT_LOG_MAX_BYTES = 256 * 1024**2  # Settings.log_max_bytes' default
VOLUME_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO})  # the run volume is full or failing


def _volume_error(exc: OSError) -> bool:
    return exc.errno in VOLUME_ERRNOS


def _mark(path: Path) -> bool:
    """An empty marker file (``stopped``, ``removed``): an inode, no data block, so it is made even on
    a volume whose blocks are all used. False when it cannot be made."""
    try:
        path.touch()
    except OSError as exc:
        log.warning("cannot mark %s: %s", path, exc.strerror)
        return False
    return True


def read_exit(unit: Path) -> tuple[int, str] | None:
    """The unit's exit record (the init's ``exit`` file, or the reserved block it was written into on
    a full volume): (code, what a full log volume cost, "" when nothing); None while it runs."""
    for name in ("exit", "exit.reserved"):
        try:
            text = (unit / name).read_text(errors="replace")
        except FileNotFoundError:
            continue
        except OSError:
            return None
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if not lines:
            continue  # the reserved block, still unused
        try:
            code = int(lines[0])
        except ValueError:
            code = 1
        cut = ""
        for line in lines[1:]:
            word, _, rest = line.partition(" ")
            dropped, _, why = rest.partition(" ")
            if word == "log_cut" and dropped.isdigit():
                cut = f"{int(dropped)} bytes of output were not stored: {why or 'the log volume failed'}"
        return code, cut
    return None


class _Replicas(TypedDict):
    """What every ``Observed`` of an inference attempt carries about its replicas."""

    started_at: float | None
    replicas: frozenset[int]
    retiring: frozenset[int]


def detect_gpus() -> tuple[str, int] | None:
    """(SKU, count) from NVML when this machine has NVIDIA GPUs, else None."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            return None
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        name = name.decode() if isinstance(name, bytes) else name
        sku = "".join(c if c.isalnum() else "-" for c in name.lower().replace("nvidia", "").strip()).strip("-")
        return sku or "gpu", count
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def _start_ticks(pid: int) -> int:
    """A process's start in clock ticks since boot (field 22 of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        stat = fh.read()
    return int(stat[stat.rfind(b")") + 2:].split()[19])


def tcp_listeners(proc_net: str = "/proc/net") -> dict[int, set[int]]:
    """Port -> socket inodes of every TCP socket listening on this machine (IPv4 and IPv6, any
    address), whoever owns it (/proc/net/tcp and tcp6)."""
    found: dict[int, set[int]] = {}
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc_net, name), encoding="ascii", errors="replace") as fh:
                next(fh, None)  # the header
                for line in fh:
                    fields = line.split()
                    if len(fields) < 10 or fields[3] != "0A":  # 0A: TCP_LISTEN
                        continue
                    try:
                        port, inode = int(fields[1].rsplit(":", 1)[1], 16), int(fields[9])
                    except (IndexError, ValueError):
                        continue
                    found.setdefault(port, set()).add(inode)
        except OSError:
            continue
    return found


def socket_inodes(pids: Iterable[int], proc_root: str = "/proc") -> set[int]:
    """The inodes of the sockets the processes hold open (their /proc/PID/fd links)."""
    inodes: set[int] = set()
    for pid in pids:
        fd_dir = os.path.join(proc_root, str(pid), "fd")
        try:
            names = os.listdir(fd_dir)
        except OSError:  # exited meanwhile, or not ours to inspect
            continue
        for name in names:
            try:
                target = os.readlink(os.path.join(fd_dir, name))
            except OSError:
                continue
            if target.startswith("socket:[") and target.endswith("]"):
                inodes.add(int(target[8:-1]))
    return inodes


class LocalBackend:
    name = "local"

    launch_parallelism = 1  # launches are a fork each: the job manager makes them one after another

    def __init__(self, run_dir: Path, *, node_name: str | None = None, demo_gpus: int = 0,
                 demo_sku: str = "demo-gpu", endpoint_host: str = "127.0.0.1",
                 log_max_bytes: int = DEFAULT_LOG_MAX_BYTES, clock=time.time):
        self.run_dir = Path(run_dir)
        self.log_max_bytes = log_max_bytes
        self.endpoint_host = endpoint_host  # the address users reach this machine's endpoints at
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.node_name = node_name or socket.gethostname().split(".")[0] or "localhost"
        self.clock = clock
        detected = detect_gpus()
        if detected:
            self.sku, self.gpus = detected
        elif demo_gpus:
            self.sku, self.gpus = demo_sku, demo_gpus
        else:
            self.sku, self.gpus = "cpu", 0
        self._children: dict[Path, subprocess.Popen] = {}  # unit directory -> the init we started
        self._deadlines: dict[Path, float] = {}  # SIGKILL deadlines a full volume kept out of kill_at

    # -- paths ----------------------------------------------------------------------------------
    def _dir(self, job_id: int, attempt: int) -> Path:
        return self.run_dir / f"{job_id}-{attempt}"

    @staticmethod
    def _parse(name: str) -> tuple[int, int] | None:
        job, sep, attempt = name.partition("-")
        return (int(job), int(attempt)) if sep and job.isdigit() and attempt.isdigit() else None

    @staticmethod
    def _replica_units(run: Path) -> list[tuple[int, Path]] | None:
        """(index, directory) of an inference attempt's replicas; None for a one-process attempt."""
        root = run / REPLICAS
        if not root.is_dir():
            return None
        return sorted((int(d.name), d) for d in root.iterdir() if d.name.isdigit() and d.is_dir())

    def _units(self, run: Path) -> list[Path]:
        replicas = self._replica_units(run)
        return [run] if replicas is None else [d for _, d in replicas]

    # -- protocol ---------------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> str | None:
        """Start the attempt's units that have not started (a half-made one is started afresh).
        Returns a note for the job's events when the job cannot run as its owner's uid. A full run
        volume raises ``VolumeFull`` (the units it could not make are cleared)."""
        run = self._dir(spec.job_id, spec.attempt)
        identity, note = self._identity(spec)
        if spec.type != "inference" and not (spec.type == "distributed" and len(spec.placements) > 1):
            self._launch_unit(run, spec, spec.placements, {}, identity, note, endpoints=True)
            return note
        try:
            (run / REPLICAS).mkdir(parents=True, exist_ok=True)
            rendezvous = self._rendezvous(run, spec) if spec.type == "distributed" else {}
        except OSError as exc:
            if not _volume_error(exc):
                raise
            raise self._volume_full(run, spec, exc) from None
        for index, placement in spec.indexed():
            env = {"DLTS_REPLICA": str(index)} if spec.type == "inference" else rendezvous[index]
            self._launch_unit(run / REPLICAS / str(index), spec, (placement,), env, identity, note,
                              endpoints=index == 0, shared_log=True)
        return note

    def _identity(self, spec: LaunchSpec) -> tuple[dict, str | None]:
        """(run spec identity, note): the owner's uid/gid where DLTS can switch to it."""
        if spec.uid is None:
            return {}, None  # no uid (the demo's users): the service user, as DLTS runs
        if os.geteuid() == 0:
            gid = spec.uid if spec.gid is None else spec.gid
            return {"uid": spec.uid, "gid": gid, "groups": list(spec.supplemental_groups)}, None
        if spec.uid == os.geteuid():
            return {}, None
        note = (f"runs as the DLTS service user (uid {os.geteuid()}), not as {spec.user} (uid {spec.uid}): "
                "DLTS is not running as root, so it cannot switch users; run the managers as root to run "
                "jobs as their owners")
        log.warning("job %s attempt %s %s", spec.job_id, spec.attempt, note)
        return {}, note

    def _rendezvous(self, run: Path, spec: LaunchSpec) -> dict[int, dict[str, str]]:
        """Per replica index: the rendezvous variables of a distributed attempt (k8s_render's meaning:
        one node per placement; RANK is the node's first global rank). The port is chosen once and
        kept in the attempt's directory, so units started later (after a crash) meet at the same one."""
        path = run / RENDEZVOUS_FILE
        try:
            port = int(path.read_text())
        except (FileNotFoundError, ValueError):
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            tmp = run / (RENDEZVOUS_FILE + ".tmp")
            tmp.write_text(str(port))
            tmp.replace(path)
        indexed = spec.indexed()
        nodes = len(indexed)
        out = {}
        for rank, (index, placement) in enumerate(indexed):
            local = max(len(placement.gpu_indices), 1)
            out[index] = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NNODES": str(nodes),
                          "NODE_RANK": str(rank), "LOCAL_WORLD_SIZE": str(local), "WORLD_SIZE": str(nodes * local),
                          "RANK": str(rank * local)}
        return out

    def _half_made(self, unit: Path, now: float) -> bool:
        """A unit a crash left without a pid record, too old for an init still starting."""
        if (unit / "pid").exists() or read_exit(unit) is not None:
            return False
        child = self._children.get(unit)
        if child is not None and child.poll() is None:
            return False  # our init, still starting
        try:
            return now - unit.stat().st_mtime > LAUNCH_GRACE_S
        except FileNotFoundError:
            return False

    def _why_not_started(self, unit: Path) -> tuple[str, str]:
        """(reason, message) of a unit with no pid record whose init has exited: it failed before it
        could start the job (reason ``init_failed``, its last words from ``init.log``); both empty while
        it is starting."""
        child = self._children.get(unit)
        if child is not None and child.poll() is None:
            return "", ""
        try:
            with open(unit / "init.log", "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 4096))
                lines = [line.strip() for line in fh.read().decode("utf-8", "replace").splitlines() if line.strip()]
        except FileNotFoundError:
            lines = []
        if child is None and not lines:
            return "", ""  # started by another job manager: nothing known yet
        code = "" if child is None else f" with code {child.returncode}"
        said = f": {lines[-1]}" if lines else ""
        return "init_failed", f"the DLTS init exited{code} before starting the job{said}"[:1024]

    def _launch_unit(self, unit: Path, spec: LaunchSpec, placements, extra_env: dict[str, str], identity: dict,
                     note: str | None, endpoints: bool = False, shared_log: bool = False) -> None:
        if unit.exists():
            if not self._half_made(unit, self.clock()):
                return  # started before (perhaps by a job manager that crashed), or still starting
            log.warning("job %s attempt %s: %s was left half-made (no pid record); starting it again",
                        spec.job_id, spec.attempt, unit)
            shutil.rmtree(unit, ignore_errors=True)
        try:
            unit.mkdir(parents=True)
        except FileExistsError:
            return
        except OSError as exc:
            if not _volume_error(exc):
                raise
            raise self._volume_full(unit, spec, exc) from None
        try:
            self._start(unit, spec, placements, extra_env, identity, note, endpoints, shared_log)
        except OSError as exc:
            if not _volume_error(exc):
                raise
            shutil.rmtree(unit, ignore_errors=True)  # nothing of it runs: the next launch starts afresh
            raise self._volume_full(unit, spec, exc) from None

    def _volume_full(self, unit: Path, spec: LaunchSpec, exc: OSError) -> VolumeFull:
        return VolumeFull(f"cannot make the run directory {unit} of job {spec.job_id} attempt {spec.attempt} on "
                          f"{self.node_name}: {exc.strerror}; the job starts when the volume has room")

    def _start(self, unit: Path, spec: LaunchSpec, placements, extra_env: dict[str, str], identity: dict,
               note: str | None, endpoints: bool, shared_log: bool) -> None:
        """Start one unit's DLTS init; ``endpoints``: unit 0, whose init supervises the endpoint servers."""
        gpu_indices = [i for p in placements for i in p.gpu_indices]
        work = unit / "work"
        work.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DLTS_")}
        env.update(spec.env)
        env.update({
            "DLTS_JOB_ID": str(spec.job_id), "DLTS_USER": spec.user, "DLTS_VC": spec.vc,
            "DLTS_NUM_GPUS": str(len(gpu_indices)), "DLTS_ATTEMPT": str(spec.attempt),
            "DLTS_PREEMPTIBLE": "1" if spec.preemptible else "0",
            # which local backend runs it: the demo's agent does not count another backend's job processes
            # as unattributed claims (it attributes by the run directory's units, never by this)
            "DLTS_RUN_DIR": str(self.run_dir.resolve()),
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpu_indices)),
            # CUDA's default order is fastest-first; NVML's (what the agent reports) is PCI bus order
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        })
        if spec.type == "distributed" and unit == self._dir(spec.job_id, spec.attempt):  # one node, one unit
            extra_env = self._rendezvous(unit, spec)[spec.indexed()[0][0]]
        env.update(extra_env)
        if identity:
            os.chown(work, identity["uid"], identity["gid"])
            env.update({"HOME": str(work), "USER": spec.user, "LOGNAME": spec.user})
        log_path = Path(spec.log_path)
        # the unit's labels and GPUs as the backend set them, for the node agent: it attributes a process
        # to the job by descent from the unit's init, never by the process's own (writable) environment
        job_env = {k: env[k] for k in ("DLTS_JOB_ID", "DLTS_USER", "DLTS_VC", "DLTS_ATTEMPT", "DLTS_PREEMPTIBLE",
                                       "CUDA_VISIBLE_DEVICES")}
        run_spec = {"command": spec.command, "cwd": str(work), "note": note, **identity, "job_env": job_env,
                    "log": {"dir": str(log_path.parent.parent), "job_id": spec.job_id, "attempt": spec.attempt,
                            "key": spec.log_key, "max_bytes": self.log_max_bytes, "shared": shared_log,
                            "state": str(unit / LOG_STATE_FILE)}}
        (unit / "spec.json").write_text(json.dumps(run_spec))
        # the init's own complaints (it cannot start, the log store fails) go to init.log in the unit
        with open(unit / "init.log", "ab") as init_log:
            child = subprocess.Popen(
                # -I -S: the init needs only the standard library and must install its signal
                # handlers within milliseconds, before anyone can send it SIGTERM
                [sys.executable, "-I", "-S", str(INIT_SCRIPT), "--run-spec", str(unit / "spec.json"),
                 "--pid-file", str(unit / "pid"), "--exit-file", str(unit / "exit"),
                 *(["--endpoints-dir", str(unit)] if endpoints else []), "--", "/bin/sh", "-c", spec.command],
                stdin=subprocess.DEVNULL, stdout=init_log, stderr=subprocess.STDOUT, env=env,
                cwd=str(work), start_new_session=True, close_fds=True,
            )
        self._children[unit] = child

    def sync_logs(self, attempts: Iterable[tuple[int, int]]) -> None:
        """Nothing to copy: each job's init writes its output to the log store itself."""

    def _process(self, unit: Path) -> tuple[psutil.Process | None, float | None]:
        proc, started, _ = self._identify(unit)
        return proc, started

    @staticmethod
    def _identify(unit: Path) -> tuple[psutil.Process | None, float | None, str]:
        """The unit's init from its ``pid`` record (pid, start time and, from current inits, start
        ticks), its start time, and why not when it is not running."""
        try:
            fields = (unit / "pid").read_text().split()
            pid, started = int(fields[0]), float(fields[1])
            ticks = int(fields[2]) if len(fields) > 2 else None
        except (FileNotFoundError, ValueError, IndexError):
            return None, None, "not started"  # its init records itself before it starts the job
        try:
            proc = psutil.Process(pid)
            if ticks is not None:
                # exact: the ticks since boot never change, the wall clock (and so the boot time
                # psutil adds to them) can be stepped while a job runs
                if _start_ticks(pid) != ticks:
                    return None, started, f"pid {pid} now belongs to another process"
            elif abs(proc.create_time() - started) > 1:
                return None, started, f"pid {pid} now belongs to another process"
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None, started, f"its init (pid {pid}) exited without recording an exit code"
            return proc, started, ""
        except (psutil.Error, OSError, ValueError, IndexError):
            return None, started, f"no process with pid {pid}"

    def _reap(self) -> None:
        for key, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[key]

    def observe(self) -> Sequence[Observed]:
        self._reap()
        now = self.clock()
        seen = []
        for run in sorted(self.run_dir.iterdir()):
            key = self._parse(run.name)
            if key is None or not run.is_dir():
                continue
            replicas = self._replica_units(run)
            if replicas is None:
                if not self._half_made(run, now):  # unreported: the job manager launches or ends it
                    seen.append(self._observe_unit(key, run, now))
                continue
            replicas = [(index, unit) for index, unit in replicas if not self._half_made(unit, now)]
            if replicas or (run / REPLICAS).stat().st_mtime + LAUNCH_GRACE_S >= now:
                seen.append(self._observe_replicas(key, replicas, now))
        return seen

    def _observe_unit(self, key: tuple[int, int], unit: Path, now: float) -> Observed:
        """One process: its phase from the run records (and the SIGKILL deadline enforced)."""
        job_id, attempt = key
        proc, started = self._process(unit)
        record = read_exit(unit)
        if record is not None:
            code, cut = record
            ended = self._mtime(unit)
            if (unit / "stopped").exists():
                return Observed(job_id, attempt, RunPhase.GONE, code, started, ended,
                                "stopped when the demo shut down", node_lost=True, log_cut=cut)
            phase = RunPhase.SUCCEEDED if code == 0 else RunPhase.FAILED
            return Observed(job_id, attempt, phase, code, started, ended, log_cut=cut)
        if proc is not None:
            self._enforce_deadline(unit, proc, now)
            return Observed(job_id, attempt, RunPhase.RUNNING, None, started, log_cut=self._cutting(unit))
        if (unit / "pid").exists():
            # the process vanished without its init writing an exit code (SIGKILLed init, reboot)
            _, _, why = self._identify(unit)
            return Observed(job_id, attempt, RunPhase.GONE, None, started, now, f"the job's process vanished ({why})")
        reason, message = self._why_not_started(unit)
        return Observed(job_id, attempt, RunPhase.PENDING, message=message, reason=reason)

    @staticmethod
    def _cutting(unit: Path) -> str:
        """What the unit's init says while it drops output (``log_state``): "" while all is stored."""
        try:
            text = (unit / LOG_STATE_FILE).read_text(errors="replace").strip()
        except OSError:
            return ""
        word, _, why = text.partition(" ")
        return f"its output is being dropped: {why or 'the log volume failed'}" if word == "cut" else ""

    @staticmethod
    def _mtime(unit: Path) -> float | None:
        """When the exit record was written."""
        for name in ("exit", "exit.reserved"):
            try:
                return (unit / name).stat().st_mtime
            except OSError:
                continue
        return None

    def _stopping(self, unit: Path) -> bool:
        """terminate() or remove_replicas() set the unit's SIGKILL deadline."""
        return unit in self._deadlines or (unit / "kill_at").exists()

    def _observe_replicas(self, key: tuple[int, int], replicas: list[tuple[int, Path]], now: float) -> Observed:
        """An inference attempt as a whole: RUNNING while any replica runs; removed replicas do
        not count, and their directories go once they have exited."""
        job_id, attempt = key
        present: set[int] = set()
        retiring: set[int] = set()
        states: list[tuple[int, Observed]] = []
        for index, unit in replicas:
            state = self._observe_unit(key, unit, now)
            if (unit / "removed").exists():
                if state.phase is not RunPhase.RUNNING:
                    shutil.rmtree(unit, ignore_errors=True)  # exited: its resources are free
                    self._children.pop(unit, None)
                    continue
                retiring.add(index)
            else:
                states.append((index, state))
            present.add(index)
        starts = [o.started_at for _, o in states if o.started_at is not None]
        common = _Replicas(started_at=min(starts) if starts else None, replicas=frozenset(present),
                           retiring=frozenset(retiring))
        phases = [o.phase for _, o in states]
        if RunPhase.RUNNING in phases and any(self._stopping(unit) for index, unit in replicas
                                              if index not in retiring and unit.exists()):
            # terminate() is under way: the attempt ends when every replica has (each has its deadline)
            return Observed(job_id, attempt, RunPhase.RUNNING, message="stopping", **common)
        if not states and retiring:  # only replicas on their way out: the attempt itself runs on
            return Observed(job_id, attempt, RunPhase.RUNNING, **common)
        verdict = attempt_state([MemberState(index, o.phase, o.exit_code, o.started_at, o.finished_at, o.message,
                                             node_lost=o.node_lost) for index, o in states], all_must_run=False)
        cut = "; ".join(f"replica {index}: {o.log_cut}" for index, o in states if o.log_cut)[:1024]
        cause = verdict.cause
        if verdict.phase is RunPhase.FAILED and cause is not None:
            return Observed(job_id, attempt, RunPhase.FAILED, cause.exit_code, finished_at=verdict.finished_at,
                            message=f"replica {cause.index} exited with code {cause.exit_code}", log_cut=cut, **common)
        if verdict.phase is RunPhase.GONE and cause is not None:
            return Observed(job_id, attempt, RunPhase.GONE, cause.exit_code, finished_at=verdict.finished_at,
                            message=f"replica {cause.index}: {cause.message}", node_lost=cause.node_lost, log_cut=cut,
                            **common)
        if verdict.phase is RunPhase.SUCCEEDED:
            return Observed(job_id, attempt, RunPhase.SUCCEEDED, 0, finished_at=verdict.finished_at, log_cut=cut, **common)
        return Observed(job_id, attempt, verdict.phase, **common)

    def _enforce_deadline(self, unit: Path, proc: psutil.Process, now: float) -> None:
        try:
            deadline = float((unit / "kill_at").read_text())
        except (FileNotFoundError, ValueError):
            if unit not in self._deadlines:
                return
            deadline = self._deadlines[unit]
        if now >= deadline:
            self._kill_tree(proc, include_init=now >= deadline + INIT_KILL_AFTER_S)

    @staticmethod
    def _kill_tree(proc: psutil.Process, include_init: bool) -> None:
        """SIGKILL the job's processes; the init then reaps them and records 137. The init itself
        only when it did not finish by then (it should never need it)."""
        try:
            victims = proc.children(recursive=True) + ([proc] if include_init else [])
        except psutil.Error:
            return
        for victim in victims:
            try:
                victim.kill()
            except psutil.Error:
                pass

    @staticmethod
    def _signal_group(pid: int, sig: int) -> None:
        for target in (lambda: os.killpg(pid, sig), lambda: os.kill(pid, sig)):
            try:
                target()
            except (ProcessLookupError, PermissionError):
                continue

    def _stop_unit(self, unit: Path, grace_s: float) -> None:
        if read_exit(unit) is not None:
            return
        proc, _ = self._process(unit)
        if proc is None:
            return
        if not self._stopping(unit):
            deadline = self.clock() + grace_s
            try:
                (unit / "kill_at").write_text(str(deadline))
            except OSError as exc:  # a full volume: this process keeps the deadline (a restart gives a new one)
                log.warning("%s: SIGKILL deadline kept in memory, not in kill_at: %s", unit, exc.strerror)
                (unit / "kill_at").unlink(missing_ok=True)
                self._deadlines[unit] = deadline
        if grace_s <= 0:
            self._kill_tree(proc, include_init=False)
        else:
            # the init forwards SIGTERM to the job's process group
            self._signal_group(proc.pid, signal.SIGTERM)

    def _attempt_pids(self, run: Path) -> list[int] | None:
        """The pids of the attempt's processes: its inits and everything below them (the inits are
        child subreapers, so a daemonised server stays below); None while none of its units runs."""
        inits = [proc for proc in (self._process(unit)[0] for unit in self._units(run)) if proc is not None]
        if not inits:
            return None
        pids = []
        for init in inits:
            try:
                pids += [init.pid, *(child.pid for child in init.children(recursive=True))]
            except psutil.Error:
                continue
        return pids

    def _port_state(self, job_id: int, spec: EndpointSpec, pids: list[int] | None,
                    listeners: dict[int, set[int]], ours: set[int]) -> EndpointState:
        """Ready only when the port's listening sockets (every address and family) all belong to the
        attempt: one held by anyone else (another tenant's server) keeps it pending, so the
        firewall never admits this job's allowed addresses to somebody else's port."""
        if pids is None:
            return EndpointState(spec.id, "pending", message="waiting for the job's process to start")
        held = listeners.get(spec.port, set())
        if held and held <= ours:
            return EndpointState(spec.id, "ready", self.endpoint_host, spec.port)
        if held - ours:
            return EndpointState(spec.id, "pending", message=(
                f"port {spec.port} is held by a process that is not part of job {job_id} (another job or a "
                f"service of this machine); the endpoint stays closed while it is: listen on a free port and "
                f"open an endpoint for that one"))
        return EndpointState(spec.id, "pending", message=f"no process of job {job_id} listens on port {spec.port} yet")

    def expose(self, job_id: int, attempt: int, endpoints: Sequence[EndpointSpec],
               ssh_public_keys: tuple[str, ...] = ()) -> Sequence[EndpointState]:
        """Port endpoints are the job's own ports here: ready while a process of the attempt listens
        on the port, pending (with the reason) otherwise. The others are started by unit 0's init
        from ``endpoints.json`` (written here, atomically) and reported in its
        ``endpoints.state.json``: pending until then, and while unit 0 has not started."""
        run = self._dir(job_id, attempt)
        unit = run / REPLICAS / "0" if (run / REPLICAS).is_dir() else run
        served = [e for e in endpoints if e.kind in SERVED]
        reported: dict = {}
        ended = read_exit(unit) is not None
        running = (unit / "pid").exists() and not ended
        if running and (served or (unit / ENDPOINTS_FILE).exists()):
            # the whole wanted set: the supervisor stops the servers of endpoints no longer listed
            wanted = {"endpoints": [{"id": e.id, "kind": e.kind, "secret_hash": e.secret_hash} for e in served],
                      "ssh_public_keys": list(ssh_public_keys)}
            tmp = unit / (ENDPOINTS_FILE + ".tmp")
            try:
                tmp.write_text(json.dumps(wanted, sort_keys=True))
                tmp.replace(unit / ENDPOINTS_FILE)
            except OSError as exc:  # a full volume: the states read back stay as they were; the next tick writes
                if not _volume_error(exc):
                    raise
                tmp.unlink(missing_ok=True)
            reported = self._endpoint_states(unit)
        pids: list[int] | None = None
        listeners: dict[int, set[int]] = {}
        ours: set[int] = set()
        if any(e.kind not in SERVED for e in endpoints):
            pids = self._attempt_pids(run)
            if pids is not None:
                listeners, ours = tcp_listeners(), socket_inodes(pids)
        states = []
        for e in endpoints:
            if e.kind not in SERVED:
                states.append(self._port_state(job_id, e, pids, listeners, ours))
                continue
            seen = reported.get(str(e.id))
            if not running:
                why = "the job's process has ended" if ended else "waiting for the job's process to start"
                states.append(EndpointState(e.id, "pending", message=why))
            elif not isinstance(seen, dict) or seen.get("status") not in ("pending", "ready", "failed"):
                states.append(EndpointState(e.id, "pending", message=f"starting {e.kind}"))
            elif seen["status"] == "ready" and isinstance(seen.get("host_port"), int):
                states.append(EndpointState(e.id, "ready", self.endpoint_host, seen["host_port"]))
            elif seen["status"] == "failed":
                states.append(EndpointState(e.id, "failed", message=str(seen.get("message") or f"{e.kind} failed")))
            else:
                states.append(EndpointState(e.id, "pending", message=f"starting {e.kind}"))
        return states

    @staticmethod
    def _endpoint_states(unit: Path) -> dict:
        try:
            data = json.loads((unit / ENDPOINTS_STATE_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return {}  # not written yet (it is replaced atomically, so never half-written)
        return data if isinstance(data, dict) else {}

    def terminate(self, job_id: int, attempt: int, grace_s: float) -> None:
        run = self._dir(job_id, attempt)
        if not run.exists():
            return
        for unit in self._units(run):
            self._stop_unit(unit, grace_s)
        self._reap()

    def remove_replicas(self, job_id: int, attempt: int, replicas: Iterable[int], grace_s: float) -> None:
        root = self._dir(job_id, attempt) / REPLICAS
        for index in replicas:
            unit = root / str(int(index))
            if not unit.is_dir():
                continue  # gone already (or never started)
            if not (unit / "removed").exists():
                _mark(unit / "removed")
            self._stop_unit(unit, grace_s)
        self._reap()

    def forget(self, job_id: int, attempt: int) -> None:
        run = self._dir(job_id, attempt)
        if run.is_dir():
            # An ended inference attempt may still have replicas running (one failed, the others
            # did not): they go with it, as pods do on Kubernetes.
            for unit in self._units(run):
                proc, _ = self._process(unit)
                if proc is not None:
                    self._kill_tree(proc, include_init=True)
        shutil.rmtree(run, ignore_errors=True)
        for unit in [u for u in self._children if u == run or run in u.parents]:
            self._children.pop(unit, None)
        for unit in [u for u in self._deadlines if u == run or run in u.parents]:
            self._deadlines.pop(unit, None)

    def collect_garbage(self, live: Iterable[tuple[int, int]]) -> Sequence[tuple[int, int]]:
        """Stop and remove run records of attempts the database no longer owns."""
        keep = set(live)
        removed = []
        for run in list(self.run_dir.iterdir()):
            key = self._parse(run.name)
            if key is None or key in keep:
                continue
            self.forget(*key)  # kills what still runs
            removed.append(key)
        return removed

    def nodes(self) -> Sequence[NodeInfo]:
        return [NodeInfo(name=self.node_name, sku=self.sku, gpus=self.gpus, cpu=float(psutil.cpu_count() or 1),
                         memory_bytes=int(psutil.virtual_memory().total), ib_domain="local")]

    def shutdown_running(self, grace_s: float) -> int:
        """Stop every running attempt because the demo stops; they are requeued at the next start."""
        stopped = 0
        units = [u for run in self.run_dir.iterdir() if self._parse(run.name) is not None for u in self._units(run)]
        for unit in units:
            if read_exit(unit) is not None:
                continue
            proc, _ = self._process(unit)
            if proc is None:
                continue
            # empty: made even on a full volume; without it the job's exit reads as a failure (a retry spent)
            _mark(unit / "stopped")
            self._signal_group(proc.pid, signal.SIGTERM)
            stopped += 1
        marked = [u for u in units if (u / "stopped").exists()]
        deadline = time.monotonic() + grace_s
        while stopped and time.monotonic() < deadline and any(self._process(u)[0] is not None for u in marked):
            time.sleep(0.1)
        for unit in marked:
            proc, _ = self._process(unit)
            if proc is not None:
                self._kill_tree(proc, include_init=False)
        self._reap()
        return stopped

    def close(self) -> None:
        self._reap()
