"""``dlts sim --compare``: the same trace under several policies, a side-by-side table and an
SVG chart (queue length and GPU utilisation over time), written by hand: no plotting library."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from html import escape

from dlts.scheduler.model import Policy
from dlts.sim.inputs import Cluster

HOUR = 3600.0


def with_policy(cluster: Cluster, policy: Policy) -> Cluster:
    """The cluster with every VC on ``policy`` (``--policy`` and each run of ``--compare``)."""
    return replace(cluster, vcs={k: replace(v, policy=policy) for k, v in cluster.vcs.items()})


def parse_policies(text: str) -> list[Policy]:
    """``RF,FIFO`` -> policies; raises ValueError naming the bad one."""
    out: list[Policy] = []
    by_lower = {p.value.lower(): p for p in Policy}
    for part in text.split(","):
        name = part.strip()
        if not name:
            continue
        p = by_lower.get(name.lower())
        if p is None:
            raise ValueError(f"unknown policy {name!r}; expected one of {', '.join(x.value for x in Policy)}")
        if p not in out:
            out.append(p)
    if not out:
        raise ValueError("names no policy; expected e.g. RF,FIFO")
    return out


ROWS = (
    ("avg wait", "avg_wait_s", "h"),
    ("p50 wait", "p50_wait_s", "h"),
    ("p95 wait", "p95_wait_s", "h"),
    ("max wait", "max_wait_s", "h"),
    ("avg JCT", "avg_jct_s", "h"),
    ("GPU utilisation", "gpu_utilization", "%"),
    ("preemptions", "preemptions", "n"),
    ("big-job (>=16 GPUs) avg wait", "big_job_avg_wait_s", "h"),
    ("big-job (>=16 GPUs) max wait", "big_job_max_wait_s", "h"),
    ("... non-preemptible only", "big_job_max_wait_guaranteed_s", "h"),
    ("never finished", "never_finished", "n"),
    ("jobs given an estimated start", "estimated_jobs", "n"),
    ("... started by their first estimate", "started_by_estimate", "n"),
    ("makespan", "makespan_s", "h"),
)
# with --forecast-every: how close each job's first forecast came (summary.forecast)
FORECAST_ROWS = (
    ("jobs a forecast reached first", "jobs", "n"),
    ("... first forecast off by, p50", "abs_error_h_p50", "hours"),
    ("... first forecast off by, p90", "abs_error_h_p90", "hours"),
    ("... off by, share of the lead time, p50", "rel_error_p50", "%"),
)


def table(results: dict[str, dict]) -> str:
    """A plain-text (and Markdown) table: one column per policy, one row per metric."""
    names = list(results)
    head = ["metric"] + names
    lines = [head]
    rows = [(label, key, unit, False) for label, key, unit in ROWS]
    if all("forecast" in results[n]["summary"] for n in names):
        rows += [(label, key, unit, True) for label, key, unit in FORECAST_ROWS]
    for label, key, unit, forecast in rows:
        row = [label]
        for n in names:
            summary = results[n]["summary"]
            v = (summary["forecast"] if forecast else summary).get(key, 0)
            if unit == "h":
                row.append(f"{v / HOUR:.2f} h")
            elif unit == "hours":
                row.append(f"{v:.2f} h")
            elif unit == "%":
                row.append(f"{v:.1%}")
            else:
                row.append(str(v))
        lines.append(row)
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    out = []
    for k, r in enumerate(lines):
        out.append("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
        if k == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def series(result: dict, points: int = 300) -> tuple[list[float], list[int], list[float]]:
    """(times, queued jobs, GPU utilisation) sampled at ``points`` instants over the makespan.

    A job is queued from submit to its first start and from each preemption to its next start."""
    total = sum(n["gpus"] for n in result["cluster"]["nodes"]) or 1
    end = max(result["summary"]["makespan_s"], max((j["submit_s"] for j in result["jobs"]), default=0.0), 1.0)
    q_ev: list[tuple[float, int]] = []
    g_ev: list[tuple[float, int]] = []
    for j in result["jobs"]:
        t_queue = j["submit_s"]
        for a in j["attempts"]:
            q_ev += [(t_queue, 1), (a["start_s"], -1)]
            t_queue = a["end_s"] if a["reason"] == "preempted" else None
            if j["type"] != "inference":
                g = sum(len(v) for v in a["gpus"].values())
                g_ev += [(a["start_s"], g), (a["end_s"] if a["end_s"] is not None else end, -g)]
            if t_queue is None:
                break
        if t_queue is not None:
            q_ev += [(t_queue, 1), (end, -1)]
        for r in j.get("replicas", []):
            g = len(r["gpus"])
            g_ev += [(r["start_s"], g), (r["end_s"] if r["end_s"] is not None else end, -g)]
    times = [end * k / (points - 1) for k in range(points)]
    return times, _sample(q_ev, times), [g / total for g in _sample(g_ev, times)]


def _sample(events: list[tuple[float, int]], times: list[float]) -> list[int]:
    events.sort()
    out, cur, i = [], 0, 0
    for t in times:
        while i < len(events) and events[i][0] <= t:
            cur += events[i][1]
            i += 1
        out.append(cur)
    return out


COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def svg_chart(results: dict[str, dict], title: str = "") -> str:
    """Two stacked panels (queued jobs; GPU utilisation), one line per policy."""
    w, h, left, right, top, gap, panel = 900, 560, 70, 20, 40, 50, 210
    data = {name: series(r) for name, r in results.items()}
    t_max = max((s[0][-1] for s in data.values()), default=1.0) or 1.0
    q_max = max((max(s[1]) for s in data.values() if s[1]), default=1) or 1
    pw = w - left - right
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{left}" y="20" font-size="14">{escape(title or "dlts sim --compare")}</text>',
    ]

    def panel_at(y0: float, label: str, y_max: float, fmt) -> None:
        parts.append(f'<rect x="{left}" y="{y0}" width="{pw}" height="{panel}" fill="none" stroke="#999"/>')
        parts.append(f'<text x="{left}" y="{y0 - 6}">{escape(label)}</text>')
        for k in range(5):
            v = y_max * k / 4
            y = y0 + panel - panel * k / 4
            parts.append(f'<line x1="{left - 4}" y1="{y:.1f}" x2="{left}" y2="{y:.1f}" stroke="#999"/>')
            parts.append(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">{fmt(v)}</text>')
        for k in range(6):
            x = left + pw * k / 5
            parts.append(f'<text x="{x:.1f}" y="{y0 + panel + 14}" text-anchor="middle">{t_max * k / 5 / HOUR:.0f} h</text>')

    def line(y0: float, xs: Sequence[float], ys: Sequence[float], y_max: float, colour: str) -> None:
        pts = " ".join(
            f"{left + pw * x / t_max:.1f},{y0 + panel - panel * min(y, y_max) / y_max:.1f}" for x, y in zip(xs, ys)
        )
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{pts}"/>')

    y1, y2 = top + 10, top + 10 + panel + gap
    panel_at(y1, "queued jobs", q_max, lambda v: f"{v:.0f}")
    panel_at(y2, "GPU utilisation", 1.0, lambda v: f"{v:.0%}")
    for k, (name, (ts, qs, us)) in enumerate(data.items()):
        colour = COLOURS[k % len(COLOURS)]
        line(y1, ts, qs, q_max, colour)
        line(y2, ts, us, 1.0, colour)
        lx = left + 10 + 130 * k
        parts.append(f'<rect x="{lx}" y="{h - 22}" width="14" height="4" fill="{colour}"/>')
        parts.append(f'<text x="{lx + 20}" y="{h - 16}">{escape(name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
