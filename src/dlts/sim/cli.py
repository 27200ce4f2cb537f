"""The ``dlts sim`` command (registered in the ``dlts`` group by ``dlts.cli``)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from dlts.sim.compare import parse_policies, svg_chart, table, with_policy
from dlts.sim.engine import Simulation
from dlts.sim.inputs import SimInputError, load_cluster, load_trace


@click.command("sim")
@click.option("--cluster", "cluster_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="CLUSTER.yaml: SKUs, nodes, VCs, tick_s.")
@click.option("--trace", "trace_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="TRACE.csv: one job a row.")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False, writable=True, path_type=Path),
              help="Where to write RESULT.json (with --compare: one RESULT per policy, OUT with .POLICY before "
                   "the suffix).")
@click.option("--policy", "policy_name", default=None, metavar="RF|FIFO|backfill",
              help="Override every VC's policy.")
@click.option("--compare", "compare", default=None, metavar="P1,P2,...",
              help="Replay the trace under each policy (every VC) and print a side-by-side table.")
@click.option("--chart", "chart_path", default=None, type=click.Path(dir_okay=False, writable=True, path_type=Path),
              help="With --compare: write an SVG chart of queue length and GPU utilisation over time.")
@click.option("--forecast-every", "forecast_every", default=None, type=click.FloatRange(min=60), metavar="SECONDS",
              help="Also run the forecast manager's forecast every SECONDS of simulated time (at least 60) and "
                   "report how close each job's first forecast came to its start (summary.forecast).")
@click.option("--forecast-history", "forecast_history", default=2, show_default=True, type=click.IntRange(0, 100),
              metavar="N", help="With --forecast-every: predict each job's run time from its owner's last N finished "
                                "runs, as forecast.history_runs does (0: every job runs to its limit).")
def sim_command(cluster_path: Path, trace_path: Path, out_path: Path, policy_name: str | None,
                compare: str | None, chart_path: Path | None, forecast_every: float | None,
                forecast_history: int) -> None:
    """Replay TRACE.csv on CLUSTER.yaml through the real scheduler core in simulated time and
    write RESULT.json (per-job attempts and wait reasons, summary metrics)."""
    if policy_name is not None and compare is not None:
        raise click.UsageError("--policy and --compare exclude each other (--compare sets every VC's policy per run)")
    if chart_path is not None and compare is None:
        raise click.UsageError("--chart needs --compare")
    forecast = {"forecast_every_s": forecast_every, "forecast_history_runs": forecast_history}
    try:
        policies = parse_policies(compare if compare is not None else (policy_name or "RF"))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--compare'" if compare is not None else "'--policy'") from None
    if policy_name is not None and len(policies) != 1:
        raise click.BadParameter("names one policy; use --compare for several", param_hint="'--policy'")
    try:
        cluster = load_cluster(cluster_path)
        trace = load_trace(trace_path, cluster)
    except SimInputError as exc:
        raise click.UsageError(str(exc)) from None
    if compare is None:
        if policy_name is not None:
            cluster = with_policy(cluster, policies[0])
        _run_one(cluster, trace, out_path, forecast=forecast)
        return
    results: dict[str, dict] = {}
    for p in policies:
        out = out_path.with_name(f"{out_path.stem}.{p.value}{out_path.suffix or '.json'}")
        results[p.value] = _run_one(with_policy(cluster, p), trace, out, label=p.value, forecast=forecast)
    click.echo("")
    click.echo(table(results))
    if chart_path is not None:
        try:
            chart_path.write_text(svg_chart(results, f"{trace_path.name} on {cluster_path.name}"))
        except OSError as exc:
            raise click.ClickException(f"cannot write {chart_path}: {exc.strerror}") from None
        click.echo(f"chart -> {chart_path}")


def _run_one(cluster, trace, out_path: Path, label: str = "", forecast: dict | None = None) -> dict:
    t0 = time.perf_counter()
    sim = Simulation(cluster, trace, **(forecast or {}))
    if sys.stdout.isatty():
        with click.progressbar(length=len(trace), label=f"simulating {label}".strip(), show_pos=True) as bar:
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
        (f"{label}: " if label else "")
        + f"{s['jobs']} jobs, {s['finished']} finished, {s['killed']} killed for wall time, "
        f"{s['never_finished']} never finished; makespan {s['makespan_s']:.0f}s, "
        f"avg wait {s['avg_wait_s']:.0f}s, GPU utilization {s['gpu_utilization']:.1%}, "
        f"{s['preemptions']} preemptions; {s['passes']} passes in {wall_s:.1f}s -> {out_path}"
    )
    if "forecast" in s:
        f = s["forecast"]
        runs = f"run times from each user's last {f['history_runs']} runs" if f["history_runs"] else "limits only"
        click.echo(f"  forecast every {f['every_s']:g}s ({f['forecasts']} forecasts, {runs}): {f['jobs']} jobs reached before "
                   f"they started; first forecast off by {f['abs_error_h_p50']:.1f} h (p50), {f['abs_error_h_p90']:.1f} h "
                   f"(p90), {f['rel_error_p50']:.0%} of the lead time (p50); {f['early_share']:.0%} forecast early")
    return result


def main() -> None:
    sim_command(prog_name="python -m dlts.sim")
