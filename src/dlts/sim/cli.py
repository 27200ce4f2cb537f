"""The ``dlts sim`` command (registered in the ``dlts`` group by ``dlts.cli``)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from dlts.sim.engine import Simulation
from dlts.sim.inputs import SimInputError, load_cluster, load_trace


@click.command("sim")
@click.option("--cluster", "cluster_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="CLUSTER.yaml: SKUs, nodes, VCs, tick_s.")
@click.option("--trace", "trace_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="TRACE.csv: one job a row.")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False, writable=True, path_type=Path),
              help="Where to write RESULT.json.")
def sim_command(cluster_path: Path, trace_path: Path, out_path: Path) -> None:
    """Replay TRACE.csv on CLUSTER.yaml through the real scheduler core in simulated time and
    write RESULT.json (per-job attempts and wait reasons, summary metrics)."""
    try:
        cluster = load_cluster(cluster_path)
        trace = load_trace(trace_path, cluster)
    except SimInputError as exc:
        raise click.UsageError(str(exc)) from None
    t0 = time.perf_counter()
    sim = Simulation(cluster, trace)
    if sys.stdout.isatty():
        with click.progressbar(length=len(trace), label="simulating", show_pos=True) as bar:
            result = sim.run(progress=bar.update)
            # Jobs that never start (permanent reasons) are done too once the replay ends.
            bar.update(len(trace) - bar.pos)
    else:
        result = sim.run()
    wall_s = time.perf_counter() - t0
    try:
        out_path.write_text(json.dumps(result, indent=1) + "\n")
    except OSError as exc:
        raise click.ClickException(f"cannot write {out_path}: {exc.strerror}") from None
    s = result["summary"]
    click.echo(
        f"{s['jobs']} jobs, {s['finished']} finished, {s['killed']} killed for wall time, "
        f"{s['never_finished']} never finished; makespan {s['makespan_s']:.0f}s, "
        f"avg wait {s['avg_wait_s']:.0f}s, GPU utilization {s['gpu_utilization']:.1%}, "
        f"{s['preemptions']} preemptions; {s['passes']} passes in {wall_s:.1f}s -> {out_path}"
    )


def main() -> None:
    sim_command(prog_name="python -m dlts.sim")
