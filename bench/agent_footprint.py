"""Node agent footprint next to Debian's prometheus-node-exporter.

Both exporters run side by side on loopback and are scraped every ``--interval-s`` (5 s) for
``--duration-s`` (300 s). The agent's collection interval equals the scrape interval, so both do
one round of work per scrape. We measure, per exporter:
- CPU seconds per scrape: user+system CPU of the process over the measured window, divided by the
  scrapes in it. For the agent this includes its own collection loop, not only serving.
- RSS (median and maximum over the run).
- Scrape duration (median and p99) as the scraper sees it.

Goal (issue 6): agent CPU <= 1.0x node_exporter's, RSS <= 1.5x.

    .venv/bin/python bench/agent_footprint.py --duration-s 300
    .venv/bin/python bench/agent_footprint.py --duration-s 30 --json out.json   # quick look

The agent runs the fake NVML scenario ``healthy-8xa100`` by default, so it does the work of an
8-GPU node on this GPU-less machine (``--agent-nvml real`` uses the real library).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import yaml


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Target:
    name: str
    proc: subprocess.Popen
    url: str
    durations_s: list[float] = field(default_factory=list)
    rss_bytes: list[int] = field(default_factory=list)
    lines: int = 0
    failures: int = 0
    cpu_start_s: float = 0.0
    cpu_end_s: float = 0.0

    def cpu_s(self) -> float:
        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def scrape(self) -> None:
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(self.url, timeout=10) as r:
                body = r.read()
        except OSError:
            self.failures += 1
            return
        self.durations_s.append(time.perf_counter() - start)
        self.lines = body.count(b"\n")
        self.rss_bytes.append(psutil.Process(self.proc.pid).memory_info().rss)


def wait_ready(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                r.read()
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not answer within {timeout_s:g} s")


def p99(values: list[float]) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration-s", type=float, default=300.0, help="measured run length (default 300)")
    ap.add_argument("--interval-s", type=float, default=5.0, help="scrape interval (default 5)")
    ap.add_argument("--warmup-scrapes", type=int, default=2, help="scrapes before measuring (default 2)")
    ap.add_argument("--agent-nvml", default="healthy-8xa100", help="fake NVML scenario, or 'real'")
    ap.add_argument("--node-exporter", default=shutil.which("prometheus-node-exporter") or "prometheus-node-exporter")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if not shutil.which(args.node_exporter):
        print("prometheus-node-exporter not found: apt-get install prometheus-node-exporter", file=sys.stderr)
        return 2

    tmp = Path(tempfile.mkdtemp(prefix="agent-bench-"))
    textfile_dir = tmp / "textfile"
    textfile_dir.mkdir()
    ne_port, agent_port = free_port(), free_port()
    cfg = {
        "node_name": "bench",
        "interval_s": args.interval_s,
        "expected_gpu_count": 8 if args.agent_nvml != "real" else 0,
        "state_dir": str(tmp / "state"),
        "exporter": {"listen_address": "127.0.0.1", "port": agent_port},
    }
    (tmp / "agent.yaml").write_text(yaml.safe_dump(cfg))
    agent_cmd = [str(Path(sys.executable).parent / "dlts-agent"), "--config", str(tmp / "agent.yaml")]
    if args.agent_nvml != "real":
        agent_cmd += ["--fake-nvml", args.agent_nvml]
    ne_cmd = [
        args.node_exporter,
        f"--web.listen-address=127.0.0.1:{ne_port}",
        "--no-collector.systemd",
        f"--collector.textfile.directory={textfile_dir}",
    ]
    log = open(tmp / "exporters.log", "wb")  # noqa: SIM115 - the exporters write to it until they stop
    procs = [
        subprocess.Popen(ne_cmd, stdout=log, stderr=subprocess.STDOUT),
        subprocess.Popen(agent_cmd, stdout=log, stderr=subprocess.STDOUT),
    ]
    targets = [
        Target("node_exporter", procs[0], f"http://127.0.0.1:{ne_port}/metrics"),
        Target("dlts-agent", procs[1], f"http://127.0.0.1:{agent_port}/metrics"),
    ]
    try:
        for t in targets:
            wait_ready(t.url)
        for _ in range(args.warmup_scrapes):
            for t in targets:
                t.scrape()
            time.sleep(args.interval_s)
        for t in targets:
            t.durations_s.clear()
            t.rss_bytes.clear()
            t.cpu_start_s = t.cpu_s()
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < args.duration_s:
            tick = start + n * args.interval_s
            time.sleep(max(0.0, tick - time.monotonic()))
            for t in targets:
                t.scrape()
            n += 1
        for t in targets:
            t.cpu_end_s = t.cpu_s()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()

    results = {}
    for t in targets:
        scrapes = len(t.durations_s)
        results[t.name] = {
            "scrapes": scrapes,
            "failures": t.failures,
            "lines_per_scrape": t.lines,
            "cpu_s_per_scrape": (t.cpu_end_s - t.cpu_start_s) / scrapes if scrapes else float("nan"),
            "rss_median_mib": statistics.median(t.rss_bytes) / 2**20,
            "rss_max_mib": max(t.rss_bytes) / 2**20,
            "scrape_median_ms": statistics.median(t.durations_s) * 1e3,
            "scrape_p99_ms": p99(t.durations_s) * 1e3,
        }
    a, ne = results["dlts-agent"], results["node_exporter"]
    ratios = {
        "cpu_per_scrape": a["cpu_s_per_scrape"] / ne["cpu_s_per_scrape"],
        "rss_median": a["rss_median_mib"] / ne["rss_median_mib"],
        "rss_max": a["rss_max_mib"] / ne["rss_max_mib"],
        "scrape_p99": a["scrape_p99_ms"] / ne["scrape_p99_ms"],
    }
    out = {
        "duration_s": args.duration_s,
        "interval_s": args.interval_s,
        "agent_nvml": args.agent_nvml,
        "cpu_count": os.cpu_count(),
        "results": results,
        "ratios_agent_over_node_exporter": ratios,
        "goal_met": {"cpu": ratios["cpu_per_scrape"] <= 1.0, "rss": ratios["rss_max"] <= 1.5},
    }
    print(
        f"{'':14} {'scrapes':>7} {'lines':>6} {'CPU ms/scrape':>13} {'RSS med MiB':>11} {'RSS max MiB':>11} "
        f"{'scrape med ms':>13} {'scrape p99 ms':>13}"
    )
    for name, r in results.items():
        print(
            f"{name:14} {r['scrapes']:7d} {r['lines_per_scrape']:6d} {r['cpu_s_per_scrape'] * 1e3:13.2f} "
            f"{r['rss_median_mib']:11.1f} {r['rss_max_mib']:11.1f} {r['scrape_median_ms']:13.2f} "
            f"{r['scrape_p99_ms']:13.2f}"
        )
    print("agent / node_exporter: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    print(f"goal (CPU <= 1.0x, RSS <= 1.5x): {out['goal_met']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
