"""Kubernetes backend: start latency and API calls per tick for N jobs starting at once.

Runs the real ``KubernetesBackend`` and the official client against the fake API server
(tests/fakes/kube_apiserver.py) over loopback HTTP; no real cluster is involved, so absolute times
measure our code + the client + a Python HTTP server, not etcd or a real apiserver. The fake runs
in a process of its own, as an API server does (``--api-in-process`` puts it in the bench's process,
where its request handling takes CPU and the interpreter lock from the launches being measured).

Two parts:

1. backend: N 1-GPU LaunchSpecs handed to ``launch`` as the job manager does after one scheduling
   pass decided to start them all: ``jobmanager.manager.launch_all``, at most the backend's
   ``launch_parallelism`` (``kubernetes.launch_parallelism``, ``--parallelism`` overrides) at once.
   For each job: seconds from the decision (all decided at t0) to its launch returning (its pod's
   create answered 201), and the launch call's own duration; the CPU both processes spent on the
   burst, per launch (this one: DLTS and the client; the API server's), and the TCP connections the
   API server accepted during it. Then API calls (and seconds) for one tick's ``nodes()`` +
   ``observe()`` at 0 and N running jobs.
2. jobmanager: N jobs submitted through the job service, then ``JobManager.tick()``s until every
   job has a pod: each tick's duration and API calls, and decision -> pod created for every job
   (from the start of the tick that decided it to its launch returning), with SQLite.

    .venv/bin/python bench/k8s_launch.py [--jobs 1000] [--repeat 3] [--parallelism N] [--skip-jobmanager]
                                         [--api-in-process]

The backend part runs twice: pods listed every tick (the default) and kept by a watch
(``KubernetesSettings.watch``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dlts.backends.base import LaunchSpec
from dlts.backends.k8s_settings import KubernetesSettings
from dlts.backends.kubernetes import KubernetesBackend
from dlts.jobmanager.manager import launch_all
from dlts.scheduler.model import Placement
from tests.fakes.kube_apiserver import FakeClock, FakeKubeApiServer

GIB = 1024**3


def _serve(conn, nodes: int) -> None:
    """The fake API server in a process of its own, answering the bench's few questions on ``conn``."""
    api = _in_process_cluster(nodes)
    store = api.store
    answers = {
        "kubeconfig": lambda path: str(api.write_kubeconfig(Path(path))),
        "created_pods": lambda: store.created["pods"],
        "kubelet_tick": lambda: api.kubelet.tick(),
        "pods": lambda: len(api.pods()),
        "reset_counts": lambda: api.reset_counts(),
        "total_requests": lambda: api.total_requests(),
        "pods_version": lambda: _pods_version(store),
        "cpu_s": lambda: time.process_time(),
        "connections": lambda: api.connections,
    }
    while True:
        name, args = conn.recv()
        if name == "stop":
            api.stop()
            conn.send(None)
            return
        conn.send(answers[name](*args))


def _pods_version(store) -> int:
    with store.lock:
        return max((e[0] for e in store.history if e[2] == "pods"), default=0)


class RemoteCluster:
    """The fake API server in another process, as a real API server is: its CPU is not the
    bench's. The same few methods the bench uses on an in-process ``FakeKubeApiServer``."""

    clock = staticmethod(time.time)  # the backend and job manager keep the wall clock

    def __init__(self, nodes: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, nodes), daemon=True)
        self._proc.start()

    def _ask(self, name: str, *args):
        self._conn.send((name, args))
        return self._conn.recv()

    def write_kubeconfig(self, path: Path) -> Path:
        return Path(self._ask("kubeconfig", str(path)))

    def created_pods(self) -> int:
        return self._ask("created_pods")

    def kubelet_tick(self) -> None:
        self._ask("kubelet_tick")

    def pod_count(self) -> int:
        return self._ask("pods")

    def reset_counts(self) -> None:
        self._ask("reset_counts")

    def total_requests(self) -> int:
        return self._ask("total_requests")

    def pods_version(self) -> int:
        return self._ask("pods_version")

    def cpu_s(self) -> float:
        """CPU seconds the API server's process has used (all its threads)."""
        return self._ask("cpu_s")

    def connections(self) -> int:
        """TCP connections the API server has accepted."""
        return self._ask("connections")

    def stop(self) -> None:
        self._ask("stop")
        self._proc.join(10)


class LocalCluster:
    """The fake API server in the bench's own process (``--api-in-process``): its request handling
    shares the bench's CPU and interpreter lock, so launches look slower than they are."""

    def __init__(self, nodes: int) -> None:
        self.api = _in_process_cluster(nodes)
        self.clock = self.api.clock

    def write_kubeconfig(self, path: Path) -> Path:
        return self.api.write_kubeconfig(path)

    def created_pods(self) -> int:
        return self.api.store.created["pods"]

    def kubelet_tick(self) -> None:
        self.api.kubelet.tick()

    def pod_count(self) -> int:
        return len(self.api.pods())

    def reset_counts(self) -> None:
        self.api.reset_counts()

    def total_requests(self) -> int:
        return self.api.total_requests()

    def pods_version(self) -> int:
        return _pods_version(self.api.store)

    def cpu_s(self) -> float:  # the bench's own process: counted there already
        return 0.0

    def connections(self) -> int:
        return self.api.connections

    def stop(self) -> None:
        self.api.stop()


def _in_process_cluster(nodes: int) -> FakeKubeApiServer:
    api = FakeKubeApiServer(FakeClock()).start()
    for i in range(nodes):
        api.add_node(f"g{i:04d}", gpus=8, labels={"dlts.io/sku": "a100", "dlts.io/ib-domain": f"pod{i // 32}"})
    return api


API_IN_PROCESS = False  # --api-in-process


def _cluster(nodes: int):
    return LocalCluster(nodes) if API_IN_PROCESS else RemoteCluster(nodes)


PARALLELISM: int | None = None  # --parallelism: instead of KubernetesSettings' default


def _backend(api, tmp: Path, watch: bool = False) -> KubernetesBackend:
    kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
    extra = {} if PARALLELISM is None else {"launch_parallelism": PARALLELISM}
    settings = KubernetesSettings(kubeconfig=str(kubeconfig), namespace="default", watch=watch, **extra)
    return KubernetesBackend(settings, log_dir=tmp / "logs", log_max_bytes=64 * 1024**2, clock=api.clock)


class _Timed:
    """The backend with each launch's completion time recorded (what the job manager sees)."""

    def __init__(self, backend: KubernetesBackend) -> None:
        self._backend = backend
        self.launch_parallelism = getattr(backend, "launch_parallelism", 1)
        self.done: dict[int, float] = {}
        self.took: dict[int, float] = {}

    def launch(self, spec: LaunchSpec) -> None:
        t = time.perf_counter()
        self._backend.launch(spec)
        done = time.perf_counter()
        self.done[spec.job_id], self.took[spec.job_id] = done, done - t

    def __getattr__(self, name: str):
        return getattr(self._backend, name)


def _caught_up(api, backend: KubernetesBackend) -> None:
    """With a watch: wait until it has applied every pod event (not charged to any measurement)."""
    if backend._watch is None:
        return
    target = api.pods_version()
    while backend._watch.snapshot() is None or int(backend._watch.resource_version or 0) < target:
        time.sleep(0.005)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _tick_cost(api, backend: KubernetesBackend) -> tuple[int, float]:
    _caught_up(api, backend)
    api.reset_counts()
    t = time.perf_counter()
    backend.nodes()
    observed = backend.observe()
    seconds = time.perf_counter() - t
    assert all(o.phase.value in ("pending", "running") for o in observed)
    return api.total_requests(), seconds


def bench_backend(jobs: int, watch: bool = False) -> dict:
    nodes = (jobs + 7) // 8
    api = _cluster(nodes)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            backend = _backend(api, Path(tmp), watch)
            specs = [LaunchSpec(job_id=j, attempt=1, user="alice", vc="vision", type="batch",
                                image="pytorch/pytorch:2.3", command="sleep infinity", uid=1000, gid=1000,
                                placements=(Placement(f"g{(j - 1) // 8:04d}", ((j - 1) % 8,), 8.0, 64 * GIB),))
                     for j in range(1, jobs + 1)]
            calls: dict[int, tuple[int, float]] = {0: _tick_cost(api, backend)}
            api.reset_counts()
            timed = _Timed(backend)
            server_cpu, connections = api.cpu_s(), api.connections()
            decided, cpu = time.perf_counter(), time.process_time()
            results = launch_all(timed, specs)
            cpu = time.process_time() - cpu
            server_cpu, connections = api.cpu_s() - server_cpu, api.connections() - connections
            assert all(exc is None for _, exc in results), [exc for _, exc in results if exc][:3]
            latency = sorted(t - decided for t in timed.done.values())
            launch_s = list(timed.took.values())
            create_calls = api.created_pods()
            api.kubelet_tick()
            calls[jobs] = _tick_cost(api, backend)
            assert api.pod_count() == jobs and create_calls == jobs
            backend.close()
            return {
                "jobs": jobs, "nodes": nodes, "launch_parallelism": timed.launch_parallelism,
                "launch_median_ms": statistics.median(launch_s) * 1e3,
                "launch_p95_ms": _pct(launch_s, 0.95) * 1e3,
                "decision_to_pod_median_s": statistics.median(latency),
                "decision_to_pod_p95_s": _pct(latency, 0.95),
                "decision_to_last_pod_s": latency[-1],
                # CPU per launch while the burst ran: this process (DLTS and the client) and the
                # API server's (0 with --api-in-process: its CPU is in the first number)
                "dlts_cpu_ms_per_launch": cpu / jobs * 1e3,
                "apiserver_cpu_ms_per_launch": server_cpu / jobs * 1e3,
                "connections_opened": connections,
                "calls_per_tick": {str(k): v[0] for k, v in sorted(calls.items())},
                "tick_ms": {str(k): round(v[1] * 1e3, 1) for k, v in sorted(calls.items())},
            }
    finally:
        api.stop()


def bench_jobmanager(jobs: int) -> dict:
    import sqlalchemy as sa

    from dlts import db_migrate
    from dlts.app import create_app
    from dlts.config import Settings
    from dlts.db import engine_of, session_factory
    from dlts.jobmanager import JobManager
    from dlts.models import Job, JobStatus, User
    from dlts.services import admin
    from dlts.services import jobs as job_service
    from dlts.services.auth import principal_for

    nodes = (jobs + 7) // 8
    api = _cluster(nodes)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            settings = Settings(home=Path(tmp) / "home", database_url=f"sqlite:///{tmp}/dlts.db",
                                secret_key="bench-secret-key-0123456789",
                                max_submissions_per_minute=0, max_queued_jobs_per_user=0)  # one user, a burst
            settings.home.mkdir()
            app = create_app(settings)
            db_migrate.upgrade(engine_of(app))
            sessions = session_factory(app)
            backend = _backend(api, Path(tmp))
            timed = _Timed(backend)
            manager = JobManager(sessions, timed, settings, clock=api.clock)
            with sessions() as s:
                admin.add_vc(s, "vision", {"a100": nodes * 8})
                admin.add_user(s, "alice", uid=1000, gid=1000)
                admin.add_member(s, "vision", "alice")
                manager.sync_nodes(s)
                principal = principal_for(s, s.scalar(sa.select(User).where(User.name == "alice")))
                for _ in range(jobs):
                    job_service.submit(s, settings, principal, job_service.JobRequest(
                        vc="vision", image="pytorch/pytorch:2.3", command="sleep infinity", gpus=1))
            ticks, decided_at = [], {}
            while api.pod_count() < jobs and len(ticks) < 10:
                api.reset_counts()
                t = time.perf_counter()
                launched = set(timed.done)
                manager.tick()
                decided_at.update({j: t for j in timed.done if j not in launched})
                ticks.append({"seconds": round(time.perf_counter() - t, 3), "calls": api.total_requests(),
                              "pods": api.pod_count()})
            to_pod = sorted(timed.done[j] - decided_at[j] for j in decided_at)
            api.kubelet_tick()
            for _ in range(2):  # steady state: everything running
                api.reset_counts()
                t = time.perf_counter()
                manager.tick()
                ticks.append({"seconds": round(time.perf_counter() - t, 3), "calls": api.total_requests(),
                              "pods": api.pod_count()})
            with sessions() as s:
                running = s.scalar(sa.select(sa.func.count()).select_from(Job).where(Job.status == JobStatus.RUNNING))
            backend.close()
            engine_of(app).dispose()
            return {"jobs": jobs, "launch_parallelism": timed.launch_parallelism, "ticks": ticks,
                    "running_at_end": running,
                    "tick_start_to_pod_median_s": round(statistics.median(to_pod), 3),
                    "tick_start_to_pod_p95_s": round(_pct(to_pod, 0.95), 3),
                    "tick_start_to_last_pod_s": round(to_pod[-1], 3)}
    finally:
        api.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--parallelism", type=int, help="kubernetes.launch_parallelism (default: the setting's)")
    parser.add_argument("--skip-jobmanager", action="store_true")
    parser.add_argument("--api-in-process", action="store_true",
                        help="run the fake API server in this process (its CPU then counts against DLTS's)")
    args = parser.parse_args()
    global PARALLELISM, API_IN_PROCESS
    PARALLELISM = args.parallelism
    API_IN_PROCESS = args.api_in_process
    runs = [bench_backend(args.jobs) for _ in range(args.repeat)]
    watch_runs = [bench_backend(args.jobs, watch=True) for _ in range(args.repeat)]
    keys = ("launch_median_ms", "launch_p95_ms", "decision_to_pod_median_s", "decision_to_pod_p95_s",
            "decision_to_last_pod_s", "dlts_cpu_ms_per_launch", "apiserver_cpu_ms_per_launch", "connections_opened")
    summary = {k: round(statistics.median(r[k] for r in runs), 3) for k in keys}
    summary["calls_per_tick"] = runs[-1]["calls_per_tick"]
    summary["tick_ms_median"] = {n: statistics.median(r["tick_ms"][n] for r in runs) for n in runs[-1]["tick_ms"]}
    watched = {k: round(statistics.median(r[k] for r in watch_runs), 3) for k in keys}
    watched["calls_per_tick"] = watch_runs[-1]["calls_per_tick"]
    watched["tick_ms_median"] = {n: statistics.median(r["tick_ms"][n] for r in watch_runs)
                                 for n in watch_runs[-1]["tick_ms"]}
    out = {"backend": summary, "backend_with_watch": watched, "backend_runs": runs, "watch_runs": watch_runs}
    if not args.skip_jobmanager:
        out["jobmanager"] = bench_jobmanager(args.jobs)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
