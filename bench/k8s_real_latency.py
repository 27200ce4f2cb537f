"""Jobs on a real Kubernetes: decision -> pod created, and pod running -> job shown running.

Starts the real cluster of the tests with one node (tests/k8s/real/cluster.py: etcd, kube-apiserver, controller
manager, scheduler, containerd, one kubelet; the binaries from ``kube_cache.py``), sets it up as the
Ansible role does (namespace, RBAC, PriorityClasses, the managers' token kubeconfig), and runs DLTS
as deployed: a dlts.yaml, ``load_settings``, ``make_backend`` and the job manager ticking every
``tick_s`` in a thread, on SQLite. Then N jobs (``sleep S``, tiny CPU requests so that many fit on the
one node) are submitted at once through the job service and the bench waits until every one has
ended, with a bounded wait.

What it measures, per job, on one wall clock:

* decision -> pod created: from the attempt row's ``created_at`` (written by the tick that decided to
  start the job, before the launch) to the moment a watch of the bench's own (not DLTS's) sees the
  pod ADDED;
* pod running -> job shown running: from the moment that watch sees the pod Running to the job's
  ``started_at`` (written by the tick that observed it running);
* lost: jobs that did not end ``finished`` within the bound (none may be).

It prints the median, p95 and max of each, the run's length, and how many tick errors the job
manager logged. Needs root and the build cache (``python tests/k8s/real/kube_cache.py build``).

    .venv/bin/python bench/k8s_real_latency.py [--jobs 200] [--sleep 2] [--watch | --no-watch] [--json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

import sqlalchemy as sa
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch

from dlts import db_migrate
from dlts.app import create_app
from dlts.backend_factory import make_backend
from dlts.config import load_settings
from dlts.db import session_factory
from dlts.jobmanager import JobManager
from dlts.models import Job, JobAttempt, User
from dlts.services import admin
from dlts.services import jobs as job_service
from dlts.services.auth import principal_for
from tests.k8s.real import kube_cache
from tests.k8s.real.cluster import RealCluster
from tests.k8s.real.conftest import GPUS, NAMESPACE, SKU, UID, set_up_for_dlts, write_config


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {"n": len(values), "median_s": round(statistics.median(values), 3), "p95_s": round(percentile(values, 0.95), 3),
            "max_s": round(max(values), 3)}


class PodWatch(threading.Thread):
    """The bench's own watch on the namespace: when each pod was first seen, and first seen Running."""

    def __init__(self, kubeconfig: Path) -> None:
        super().__init__(daemon=True)
        self.api = k8s.CoreV1Api(k8s_config.new_client_from_config(str(kubeconfig)))
        self.added: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        version = self.api.list_namespaced_pod(NAMESPACE).metadata.resource_version
        while not self.stop.is_set():
            w = k8s_watch.Watch()
            for event in w.stream(self.api.list_namespaced_pod, NAMESPACE, resource_version=version, timeout_seconds=5):
                now = time.time()
                pod = event["object"]
                version = pod.metadata.resource_version
                name = pod.metadata.name
                self.added.setdefault(name, now)
                if pod.status.phase == "Running" and name not in self.running:
                    self.running[name] = now
                if self.stop.is_set():
                    w.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--sleep", type=float, default=2.0, help="seconds each job runs")
    parser.add_argument("--watch", action=argparse.BooleanOptionalAction, default=True,
                        help="kubernetes.watch (pods kept by a watch; --no-watch lists them every tick)")
    parser.add_argument("--timeout", type=float, default=900, help="bound on the whole run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.jobs < 1 or args.sleep < 0:
        parser.error("--jobs must be at least 1 and --sleep not negative")
    cache = kube_cache.find()
    if cache is None:
        raise SystemExit("no Kubernetes build cache: run `python tests/k8s/real/kube_cache.py build` (as root)")
    errors: list[str] = []

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "tick skipped" in record.getMessage():
                errors.append(record.getMessage())

    logging.getLogger("dlts.jobmanager.manager").addHandler(Count())
    with tempfile.TemporaryDirectory(prefix="dlts-bench-k8s.") as tmp, RealCluster(cache, gpus=GPUS, sku=SKU, nodes=1) as cluster:
        work = Path(tmp)
        kubeconfig = set_up_for_dlts(cluster)
        database_url = f"sqlite:///{work / 'dlts.db'}"
        engine = sa.create_engine(database_url)
        db_migrate.upgrade(engine)
        engine.dispose()
        path = write_config(work, database_url, kubeconfig, cluster.images["init"])
        doc = yaml.safe_load(path.read_text())
        doc["kubernetes"]["watch"] = args.watch
        path.write_text(yaml.safe_dump(doc))
        settings = load_settings(path, environ={})
        settings.home.mkdir(parents=True, exist_ok=True)
        sessions = session_factory(create_app(settings))  # as `dlts managers` makes them
        with sessions() as s:
            admin.add_vc(s, "vision", {SKU: GPUS}, cpu_quota=1000, memory_quota_bytes=1 << 40)
            admin.add_user(s, "alice", uid=UID, gid=UID)
            admin.add_member(s, "vision", "alice")
        backend = make_backend(settings)
        manager = JobManager(sessions, backend, settings)
        manager.tick()  # node sync
        watch = PodWatch(cluster.admin_kubeconfig)
        watch.start()
        stop = threading.Event()

        def ticker() -> None:
            while not stop.is_set():
                started = time.monotonic()
                manager.tick()
                stop.wait(max(0.0, settings.tick_s - (time.monotonic() - started)))

        with sessions() as s:
            principal = principal_for(s, s.scalar(sa.select(User).where(User.name == "alice")))
            ids = [job_service.submit(s, settings, principal, job_service.JobRequest(
                vc="vision", image=cluster.images["shell"], command=f"sleep {args.sleep:g}", cpu=0.02,
                memory_bytes=16 << 20, ephemeral_storage_bytes=64 << 20)).id for _ in range(args.jobs)]
        t0 = time.monotonic()
        thread = threading.Thread(target=ticker, daemon=True)
        thread.start()
        deadline = t0 + args.timeout
        while time.monotonic() < deadline:
            with sessions() as s:
                left = s.scalar(sa.select(sa.func.count()).select_from(Job).where(
                    Job.id.in_(ids), Job.status.notin_(["finished", "failed", "killed", "error"])))
            if not left:
                break
            time.sleep(0.5)
        elapsed = time.monotonic() - t0
        stop.set()
        thread.join(30)
        watch.stop.set()
        with sessions() as s:
            rows = s.execute(sa.select(Job.id, Job.status, Job.started_at, JobAttempt.created_at, Job.finished_at)
                             .join(JobAttempt, sa.and_(JobAttempt.job_id == Job.id, JobAttempt.number == 1))
                             .where(Job.id.in_(ids))).all()
        backend.close()

    def epoch(moment: dt.datetime | None) -> float | None:
        return None if moment is None else moment.replace(tzinfo=dt.UTC).timestamp()

    created, shown, lost = [], [], []
    timelines = []
    for job_id, status, started_at, attempt_created, finished_at in rows:
        pod = f"dlts-{job_id}-1-0"
        if status.value != "finished":
            lost.append(job_id)
        decided = epoch(attempt_created)
        if pod in watch.added and decided is not None:
            created.append(watch.added[pod] - decided)
        started = epoch(started_at)
        if pod in watch.running and started is not None:
            shown.append(started - watch.running[pod])
            timelines.append((round(started - watch.running[pod], 3), job_id, {
                "decided": decided, "pod_added": watch.added.get(pod), "pod_running": watch.running[pod],
                "job_started": started, "job_finished": epoch(finished_at)}))
    lost += [j for j in ids if j not in {r[0] for r in rows}]
    first_added = min(watch.added.values(), default=0.0)
    spread = sorted(round(t - first_added, 1) for t in watch.added.values())
    result = {"jobs": args.jobs, "sleep_s": args.sleep, "watch": args.watch, "run_s": round(elapsed, 1),
              "decision_to_pod_created": summary(created), "pod_running_to_job_running": summary(shown),
              "not_finished": sorted(lost), "ticks_skipped": len(errors),
              "slowest_shown_running": sorted(timelines, key=lambda t: -t[0])[:3],
              "pods_created_s_after_the_first": {"median": spread[len(spread) // 2] if spread else None,
                                                 "last": spread[-1] if spread else None}}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    if lost:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
