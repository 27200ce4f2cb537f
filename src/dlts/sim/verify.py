"""Re-check the scheduling rules on a RESULT.json alone.

``check_result(result)`` returns a list of violations (empty when every rule held). It reads only
the document ``dlts sim`` writes: the cluster it echoes, each job's request, attempts and (for
inference) replicas. Checked:

* no node over capacity: GPU indices held at one instant never overlap and exist on the node;
  unschedulable nodes and other VCs' hard-assigned nodes are never used;
* no VC's non-preemptible GPUs above its quota per SKU at any instant;
* a VC's running interactive GPUs never above ``max_interactive_gpus``;
* gangs are whole nodes, the asked number, in one IB domain;
* FIFO: a non-preemptible job never starts while one ahead of it in its FIFO VC's order waits
  (unless that one could never run: reasons ``no_matching_nodes``, ``topology`` or a request above
  the VC's whole quota). The order is priority, then, where the VC orders by fair share, its
  owner's decayed GPU use at that instant (recomputed from the attempts), then queue time;
* only preemptible work is preempted, and a preempted job is requeued (a later attempt, or still
  queued at the end);
* wall time: killed jobs ran at least their limit and at most a tick (plus grace) longer;
  finished jobs never ran more than a tick past it.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any

from dlts.scheduler.model import LIMIT_RANK_CAP_S
from dlts.sim.fairshare import DecayedUse

EPS = 1e-6
# fair-share use computed here and in the replay may differ in the last bits; closer than this
# (relative) the order between two users is not checked
FAIR_SHARE_TOLERANCE = 1e-9


def _holdings(job: dict) -> list[tuple[float, float, str, list[int], bool]]:
    """(start, end, node, gpu indices, counts-as-non-preemptible) of everything a job held."""
    out = []
    if job["type"] == "inference":
        for r in job.get("replicas", []):
            out.append((r["start_s"], r["end_s"], r["node"], r["gpus"], bool(r["core"])))
        return out
    for a in job["attempts"]:
        for node, idx in a["gpus"].items():
            out.append((a["start_s"], a["end_s"], node, idx, not job["preemptible"]))
    return out


def _sweep_max(intervals: list[tuple[float, float, int]]) -> tuple[int, float]:
    """Largest sum of amounts held at one instant (ends before starts at equal times)."""
    events = []
    for s, e, amount in intervals:
        events.append((s, 1, amount))
        events.append((e if e is not None else float("inf"), 0, -amount))
    events.sort()
    cur = best = 0
    at = 0.0
    for t, _, delta in events:
        cur += delta
        if cur > best:
            best, at = cur, t
    return best, at


def check_result(result: dict[str, Any]) -> list[str]:
    out: list[str] = []
    cluster = result["cluster"]
    nodes = {n["name"]: n for n in cluster["nodes"]}
    vcs = cluster["vcs"]
    tick = float(cluster["tick_s"])
    grace = float(cluster.get("preempt_grace_s", 0))
    jobs = result["jobs"]

    per_node: dict[str, list[tuple[float, float, int, list[int]]]] = defaultdict(list)
    quota_use: dict[tuple[str, str], list[tuple[float, float, int]]] = defaultdict(list)
    interactive: dict[str, list[tuple[float, float, int]]] = defaultdict(list)

    for job in jobs:
        jid = job["id"]
        for s, e, node, idx, core in _holdings(job):
            n = nodes.get(node)
            if n is None:
                out.append(f"job {jid} placed on unknown node {node}")
                continue
            if not n["schedulable"]:
                out.append(f"job {jid} placed on unschedulable node {node}")
            if n["vc"] is not None and n["vc"] != job["vc"]:
                out.append(f"job {jid} of VC {job['vc']} placed on node {node} hard-assigned to VC {n['vc']}")
            if any(i < 0 or i >= n["gpus"] for i in idx):
                out.append(f"job {jid} holds GPU indices {idx} that node {node} ({n['gpus']} GPUs) lacks")
            per_node[node].append((s, e, jid, idx))
            if core and job["sku"] and n["gpus"]:
                quota_use[(job["vc"], n["sku"])].append((s, e, len(idx)))
            if job["type"] == "interactive":
                interactive[job["vc"]].append((s, e, len(idx)))
        prev_end = None
        for a in job["attempts"]:
            if a["start_s"] + EPS < job["submit_s"]:
                out.append(f"job {jid} started at {a['start_s']} before its submit at {job['submit_s']}")
            if prev_end is not None and a["start_s"] + EPS < prev_end:
                out.append(f"job {jid} has overlapping attempts")
            prev_end = a["end_s"]
        _check_gang(job, nodes, out)
        _check_preemption(job, out)
        _check_wall_time(job, tick, grace, out)

    for node, held in per_node.items():
        held.sort(key=lambda h: (h[0], h[1] if h[1] is not None else float("inf")))
        active: list[tuple[float, float, int, list[int]]] = []
        for s, e, jid, idx in held:
            active = [h for h in active if h[1] is None or h[1] > s + EPS]
            busy = {i for h in active for i in h[3]}
            clash = busy & set(idx)
            if clash:
                others = sorted({h[2] for h in active if set(h[3]) & clash})
                out.append(f"node {node} over capacity at {s}: job {jid} and job(s) {others} hold GPUs {sorted(clash)}")
            active.append((s, e, jid, idx))

    for (vc, sku), intervals in quota_use.items():
        quota = vcs[vc]["quota"].get(sku, 0)
        peak, at = _sweep_max(intervals)
        if peak > quota:
            out.append(f"VC {vc} held {peak} non-preemptible {sku} GPUs at {at}, above its quota {quota}")
    for vc, intervals in interactive.items():
        cap = vcs[vc]["max_interactive_gpus"]
        if cap is None:
            continue
        peak, at = _sweep_max(intervals)
        if peak > cap:
            out.append(f"VC {vc} held {peak} interactive GPUs at {at}, above its cap {cap}")

    _check_fifo(jobs, vcs, float(cluster.get("fair_share_half_life_h", 0.0)), out)
    return out


def _check_gang(job: dict, nodes: dict, out: list[str]) -> None:
    if job["type"] != "distributed":
        return
    for a in job["attempts"]:
        used = a["nodes"]
        if len(set(used)) != job["nodes"]:
            out.append(f"gang job {job['id']} got {len(set(used))} nodes, asked {job['nodes']}")
        domains = {nodes[n]["ib_domain"] for n in used if n in nodes}
        if len(domains) > 1:
            out.append(f"gang job {job['id']} spans IB domains {sorted(domains)}")
        for n in used:
            if n in nodes and sorted(a["gpus"].get(n, [])) != list(range(nodes[n]["gpus"])):
                out.append(f"gang job {job['id']} holds only part of node {n}")


def _check_preemption(job: dict, out: list[str]) -> None:
    atts = job["attempts"]
    for i, a in enumerate(atts):
        if a["reason"] != "preempted":
            continue
        if not job["preemptible"]:
            out.append(f"non-preemptible job {job['id']} was preempted at {a['end_s']}")
        if i == len(atts) - 1 and job["state"] != "queued":
            out.append(f"job {job['id']} was preempted at {a['end_s']} and never requeued")
    for r in job.get("replicas", []):
        if r["reason"] == "scale_down" and r["core"]:
            out.append(f"inference job {job['id']} lost a min_replicas replica to scale-down")


def _check_wall_time(job: dict, tick: float, grace: float, out: list[str]) -> None:
    limit = job.get("effective_max_time_s")
    for a in job["attempts"]:
        if a["end_s"] is None:
            continue
        ran = a["end_s"] - a["start_s"]
        if a["reason"] == "wall_time":
            if limit is None or ran + EPS < limit:
                out.append(f"job {job['id']} killed for wall time after {ran}s, limit {limit}")
            elif ran > limit + tick + grace + EPS:
                out.append(f"job {job['id']} ran {ran}s, more than a tick past its limit {limit}")
        elif limit is not None and ran > limit + tick + grace + EPS:
            # it may end by itself during the SIGTERM grace that follows its wall-time stop
            out.append(f"job {job['id']} ran {ran}s, more than a tick (plus grace) past its limit {limit}")


def _never_fits(job: dict, vcs: dict) -> bool:
    """Whether nothing but a config change could start the job (then FIFO does not block on it).

    A RESULT does not say whether a ``topology`` or ``no_matching_nodes`` wait was permanent; a job
    that never ran with only those reasons is taken as such. ``vc_quota`` counts only when the job
    asks more than the whole quota."""
    reasons = set(job["wait_reasons"]) - {"blocked_by"}
    if "vc_quota" in reasons:
        per = job["gpus"] * max(1, job["nodes"])
        if job["type"] == "inference":
            per = job["gpus"] * max(1, job.get("min_replicas") or 1)
        if not job["sku"] or (job["gpus"] == 0 and job["type"] != "distributed"):
            # CPU-only: the simulator's jobs ask the default 1 core and 2 GiB each
            v = vcs[job["vc"]]
            if v.get("cpu_quota", 0) >= 1 and v.get("memory_quota_bytes", 0) >= 2 * 1024**3:
                return False
        elif per <= vcs[job["vc"]]["quota"].get(job["sku"], 0):
            return False
    return True


def _check_fifo(jobs: list[dict], vcs: dict, half_life_h: float, out: list[str]) -> None:
    """No non-preemptible job of a FIFO VC starts while one ahead of it in the VC's order waits.

    The order is priority, then (where the VC orders by fair share) the owner's decayed GPU use at
    that instant, recomputed from the RESULT's attempts (none for a job that has waited the VC's
    ``fair_share_max_wait_s``), then queue time (plus the VC's ``limit_weight`` x the job's limit)."""
    # FIFO blocks per resource pool: the job's GPU SKU, or "cpu" for CPU-only jobs
    by_vc: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for j in jobs:
        if vcs[j["vc"]]["policy"] == "FIFO" and not j["preemptible"]:
            pool = j["sku"] if j["sku"] and (j["gpus"] > 0 or j["type"] == "distributed") else "cpu"
            by_vc[(j["vc"], pool)].append(j)
    fair_vcs = {vc for vc, _ in by_vc if half_life_h > 0 and vcs[vc].get("fair_share", False)}
    starts = {j["start_s"] for (vc, _), js in by_vc.items() if vc in fair_vcs for j in js if j["start_s"] is not None}
    use = _use_at_times(jobs, half_life_h, starts) if starts else {}
    never = {"no_matching_nodes", "topology", "vc_quota"}
    for (vc, _pool), js in by_vc.items():
        fair = vc in fair_vcs
        cap = vcs[vc].get("fair_share_max_wait_s")
        weight = vcs[vc].get("limit_weight") or 0.0
        js.sort(key=lambda j: (j["submit_s"], j["id"]))
        # the jobs that block when they wait: every one but those that could never run
        blocking = [
            e for e in js
            if not (e["start_s"] is None and (own := set(e["wait_reasons"]) - {"blocked_by"})
                    and own <= never and _never_fits(e, vcs))
        ]
        submits = [e["submit_s"] for e in blocking]
        for j in js:
            t = j["start_s"]
            if t is None:
                continue
            at = use.get(t, {})
            for e in blocking[: bisect.bisect_right(submits, t + EPS)]:
                if e is j or (e["start_s"] is not None and e["start_s"] <= t + EPS):
                    continue
                if _ahead(e, j, vc, at if fair else None, t, cap, weight):
                    out.append(f"FIFO VC {vc}: job {j['id']} started at {t} while job {e['id']}, ahead of it in the VC's order, waited")
                    break


def _ahead(e: dict, j: dict, vc: str, use: dict[tuple[str, str], float] | None, t: float = 0.0,
           cap: float | None = None, weight: float = 0.0) -> bool:
    """Whether ``e`` comes before ``j`` in its VC's order at time ``t`` (``use``: the fair-share use
    then, or None; ``cap``: the VC's ``fair_share_max_wait_s``, past which a job's owner counts no use;
    ``weight``: the VC's ``limit_weight``)."""
    if e["priority"] != j["priority"]:
        return bool(e["priority"] > j["priority"])
    if use is not None and e["user"] != j["user"]:
        ue, uj = (0.0 if cap is not None and _waited(x, t, cap) else use.get((vc, x["user"]), 0.0) for x in (e, j))
        if cap is not None and any(abs(t - x["submit_s"] - cap) <= EPS for x in (e, j)):
            return False  # on the bound itself: too close to tell which side the scheduler saw
        if abs(ue - uj) > FAIR_SHARE_TOLERANCE * max(1.0, ue, uj):
            return ue < uj
        if ue != uj:
            return False  # too close to tell which the scheduler saw as lower: not a violation
    if weight:
        re, rj = (_rank_time(x, weight) for x in (e, j))
        # (too close to tell which the scheduler saw first: not a violation)
        return bool(re < rj - EPS)
    return bool((e["submit_s"], e["id"]) < (j["submit_s"], j["id"]))  # a trace's ids are all numbers or all strings


def _rank_time(job: dict, weight: float) -> float:
    """The time ``job`` ranks by in a VC with ``limit_weight`` ``weight`` (plugins/fairshare.py)."""
    limit = job.get("effective_max_time_s")
    return float(job["submit_s"]) + weight * min(limit if limit else LIMIT_RANK_CAP_S, LIMIT_RANK_CAP_S)


def _waited(job: dict, t: float, cap: float) -> bool:
    """Whether ``job`` (queued at its submit time; a requeue keeps it) had waited ``cap`` seconds at ``t``."""
    return bool(t - job["submit_s"] >= cap)


def _use_at_times(jobs: list[dict], half_life_h: float, times: set[float]) -> dict[float, dict[tuple[str, str], float]]:
    """Every (vc, user)'s decayed GPU-seconds at each of ``times``, from what the jobs held."""
    changes: list[tuple[float, str, str, int]] = []
    for job in jobs:
        for s, e, _node, idx, _core in _holdings(job):
            if idx:
                changes.append((s, job["vc"], job["user"], len(idx)))
                if e is not None:
                    changes.append((e, job["vc"], job["user"], -len(idx)))
    changes.sort(key=lambda c: c[0])
    use = DecayedUse(half_life_h * 3600)
    out: dict[float, dict[tuple[str, str], float]] = {}
    i = 0
    for t in sorted(times):
        while i < len(changes) and changes[i][0] <= t:
            at, vc, user, gpus = changes[i]
            use.hold((vc, user), gpus, at)
            i += 1
        out[t] = use.at_time(t)
    return out
