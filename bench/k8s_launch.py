"""Kubernetes backend: start latency and API calls per tick for N jobs starting at once.

Runs the real ``KubernetesBackend`` and the official client against the fake API server
(tests/fakes/kube_apiserver.py) over loopback HTTP; no real cluster is involved, so absolute times
measure our code + the client + a Python HTTP server, not etcd or a real apiserver.

Two parts:

1. backend: N 1-GPU LaunchSpecs handed to ``launch`` as the job manager does after one scheduling
   pass decided to start them all: ``jobmanager.manager.launch_all``, at most the backend's
   ``launch_parallelism`` (``kubernetes.launch_parallelism``, ``--parallelism`` overrides) at once.
   For each job: seconds from the decision (all decided at t0) to its launch returning (its pod's
   create answered 201), and the launch call's own duration. Then API calls (and seconds) for one
   tick's ``nodes()`` + ``observe()`` at 0 and N running jobs.
2. jobmanager: N jobs submitted through the job service, then ``JobManager.tick()``s until every
   job has a pod: each tick's duration and API calls, and decision -> pod created for every job
   (from the start of the tick that decided it to its launch returning), with SQLite.

    .venv/bin/python bench/k8s_launch.py [--jobs 1000] [--repeat 3] [--parallelism N] [--skip-jobmanager]

The backend part runs twice: pods listed every tick (the default) and kept by a watch
(``KubernetesSettings.watch``).
"""

from __future__ import annotations

import argparse
import json
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


def _cluster(nodes: int) -> FakeKubeApiServer:
    api = FakeKubeApiServer(FakeClock()).start()
    for i in range(nodes):
        api.add_node(f"g{i:04d}", gpus=8, labels={"dlts.io/sku": "a100", "dlts.io/ib-domain": f"pod{i // 32}"})
    return api


PARALLELISM: int | None = None  # --parallelism: instead of KubernetesSettings' default


def _backend(api: FakeKubeApiServer, tmp: Path, watch: bool = False) -> KubernetesBackend:
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


def _caught_up(api: FakeKubeApiServer, backend: KubernetesBackend) -> None:
    """With a watch: wait until it has applied every pod event (not charged to any measurement)."""
    if backend._watch is None:
        return
    with api.store.lock:
        target = max((e[0] for e in api.store.history if e[2] == "pods"), default=0)
    while backend._watch.snapshot() is None or int(backend._watch.resource_version or 0) < target:
        time.sleep(0.005)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _tick_cost(api: FakeKubeApiServer, backend: KubernetesBackend) -> tuple[int, float]:
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
            decided = time.perf_counter()
            results = launch_all(timed, specs)
            assert all(exc is None for _, exc in results), [exc for _, exc in results if exc][:3]
            latency = sorted(t - decided for t in timed.done.values())
            launch_s = list(timed.took.values())
            create_calls = api.store.created["pods"]
            api.kubelet.tick()
            calls[jobs] = _tick_cost(api, backend)
            assert len(api.pods()) == jobs and create_calls == jobs
            backend.close()
            return {
                "jobs": jobs, "nodes": nodes, "launch_parallelism": timed.launch_parallelism,
                "launch_median_ms": statistics.median(launch_s) * 1e3,
                "launch_p95_ms": _pct(launch_s, 0.95) * 1e3,
                "decision_to_pod_median_s": statistics.median(latency),
                "decision_to_pod_p95_s": _pct(latency, 0.95),
                "decision_to_last_pod_s": latency[-1],
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
                                secret_key="bench-secret-key-0123456789")
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
            while len(api.pods()) < jobs and len(ticks) < 10:
                api.reset_counts()
                t = time.perf_counter()
                launched = set(timed.done)
                manager.tick()
                decided_at.update({j: t for j in timed.done if j not in launched})
                ticks.append({"seconds": round(time.perf_counter() - t, 3), "calls": api.total_requests(),
                              "pods": len(api.pods())})
            to_pod = sorted(timed.done[j] - decided_at[j] for j in decided_at)
            api.kubelet.tick()
            for _ in range(2):  # steady state: everything running
                api.reset_counts()
                t = time.perf_counter()
                manager.tick()
                ticks.append({"seconds": round(time.perf_counter() - t, 3), "calls": api.total_requests(),
                              "pods": len(api.pods())})
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
    args = parser.parse_args()
    global PARALLELISM
    PARALLELISM = args.parallelism
    runs = [bench_backend(args.jobs) for _ in range(args.repeat)]
    watch_runs = [bench_backend(args.jobs, watch=True) for _ in range(args.repeat)]
    keys = ("launch_median_ms", "launch_p95_ms", "decision_to_pod_median_s", "decision_to_pod_p95_s",
            "decision_to_last_pod_s")
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
