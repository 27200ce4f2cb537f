"""Sort plugin ``fair_share``: priority, then the owner's recent use, then queue time.

Among pending jobs of one VC with equal priority, a job whose owner has used less than an equal
share of the VC's recent GPU time goes first. The use is an input: ``Snapshot.fair_share_usage``
maps (vc, user) to decayed GPU-seconds (every GPU-second counts 1/2 after a half-life; the job
manager computes it from the accounting rollup, so running work adds to it as it runs). A user's
*ratio* is their use divided by the equal share (the VC's total use / the number of users with use
or waiting jobs there); a new user has ratio 0.

The order across VCs is not changed: jobs are first sorted by ``priority_queue_time``, then inside
each (VC, priority) group the jobs are re-ranked by (ratio, queue time, id) into the positions the
group held. So queue positions (numbered per VC) show the fair-share order, and a VC's place in
the competition for shared capacity stays what queue time gives it. With no use recorded, or with
``Vc.fair_share`` off, or a single user, and no ``Vc.limit_weight``, the order is exactly
``priority_queue_time``.

Fair share holds a job back for at most its VC's ``fair_share_max_wait_s`` (when set): a job that
has waited that long since its queue time is ranked as if its owner had no recent use, i.e. ahead of
newer work of users who have used something, and by queue time among the jobs so ranked. Without the
bound a heavy user's gang waited behind every lighter colleague's job for as long as they kept
submitting (a 48-GPU job 230 h on ``bench/traces/production_28d.csv`` under RF).

In a backfill VC no job submitted after a job that holds a reservation (``Job.reserved``) is ranked
ahead of it (``bind_reservations``; with ``limit_weight``, no job ranked after it): a reservation is
kept until its job starts, whatever fair share says of its owner by then.

Shorter limits first, where a VC sets ``limit_weight`` (w > 0): inside each (VC, priority) group,
jobs rank by *rank time* where the above says queue time: the queue time plus w x the effective
limit (``max_time_s``, else the VC's ``max_job_time_s``; counted up to ``LIMIT_RANK_CAP_S``, which a
job without a limit counts too); a reservation binds the jobs ranked after it
(``bind_reservations``), so a job with a shorter limit submitted after it may still go first, but
only for w x the reserved job's limit after that job's queue time (rank times do not change).
With w = 0.25 a 1-hour job ranks as if queued 15 minutes later and a 7-day job 42 hours later: the short
job goes first unless the long one has waited about that much longer. This is Slurm's incentive for
honest limits, and it serves a VC's quota to its short gangs before the long work that drains it for
days (docs/benchmarks.md). The bound ``fair_share_max_wait_s`` still counts from the queue time.

``revise_waits`` runs after the pass: a job that waits while a later-submitted job of another user
of its VC and priority, moved ahead of it by fair share, started in this pass gets reason
``fair_share`` with both users' ratios in the detail, if by queue time it would have been among
the group's first k jobs (k = the group's starts in this pass), i.e. it would likely have had the
room. Other waiting jobs keep the reason placement gave them.
"""

from __future__ import annotations

import bisect
import heapq
from collections import defaultdict
from collections.abc import Callable
from operator import attrgetter

from dlts.scheduler.model import LIMIT_RANK_CAP_S, Job, Policy, Vc, Wait, WaitReason
from dlts.scheduler.plugins.ordering import PriorityQueueTime
from dlts.scheduler.plugins.walltime import effective_limit_s
from dlts.scheduler.state import PassState

RankKey = Callable[[Job], tuple[float, int]]


def _queue_key(j: Job) -> tuple[float, int]:
    return (j.queue_time, j.id)


def rank_time(job: Job, vc: Vc | None) -> float:
    """The time ``job`` ranks by inside its VC's order: its queue time, plus the VC's
    ``limit_weight`` x its effective limit (at most ``LIMIT_RANK_CAP_S``; no limit counts that)."""
    weight = vc.limit_weight if vc is not None else 0.0
    if not weight:
        return job.queue_time
    limit = effective_limit_s(job, vc)
    return job.queue_time + weight * min(limit if limit is not None else LIMIT_RANK_CAP_S, LIMIT_RANK_CAP_S)


def rank_key(vc: Vc | None) -> RankKey:
    """(rank time, id) for the jobs of ``vc``: ``_queue_key`` where the VC sets no weight."""
    if vc is None or not vc.limit_weight:
        return _queue_key
    return lambda j: (rank_time(j, vc), j.id)


def bind_reservations(ranked: list[Job], key: RankKey = _queue_key) -> list[Job]:
    """``ranked`` (one VC and priority, in fair-share order) with every job after a job that holds a
    reservation (``Job.reserved``) by ``key`` (queue time; rank time where the VC weighs limits)
    moved behind that job: a reservation, once given, binds all later work whatever its owner's use.
    Without it every new job of a colleague who used less was ranked ahead of a heavy user's
    reserved gang, started on the quota the reservation counted on, and moved its estimate out, pass
    after pass. Older jobs keep the fair-share order (a requeued job goes back to the head); a job
    held back follows the last reserved job it waited for, and the held-back jobs keep their
    fair-share order among themselves."""
    held = sorted((j for j in ranked if j.reserved), key=key)
    if not held:
        return ranked
    held_keys = [key(j) for j in held]
    # A job may be placed once every held job older than it is (its gate). Held jobs are placed
    # oldest first, so that is when ``placed_held`` reaches the number of them older than it.
    waiting: dict[int, list[tuple[int, Job]]] = defaultdict(list)  # gate -> (rank, job) held back
    ready: list[tuple[int, Job]] = []  # held back and now free, by fair-share rank
    out: list[Job] = []
    placed_held = 0

    def place(j: Job) -> None:
        nonlocal placed_held
        out.append(j)
        if j.reserved:
            placed_held += 1
            for item in waiting.pop(placed_held, ()):
                heapq.heappush(ready, item)

    for rank, j in enumerate(ranked):
        gate = bisect.bisect_left(held_keys, key(j))
        if gate > placed_held:
            waiting[gate].append((rank, j))
            continue
        place(j)
        while ready:
            place(heapq.heappop(ready)[1])
    return out


_USER, _RESERVED = attrgetter("user"), attrgetter("reserved")


class FairShare(PriorityQueueTime):
    name = "fair_share"

    def __init__(self) -> None:
        self._ratio: dict[tuple[str, str], float] = {}
        self._ratio_of: object = None  # the snapshot ``_ratio`` was computed for
        self._by_vc: dict[str, dict[str, float]] = {}  # ``_ratio`` as vc -> user -> ratio
        # job id -> (group key, rank by queue time, rank by fair share), for reordered groups only
        self._ranks: dict[int, tuple[tuple[str, int, int], int, int]] = {}

    def ratios(self, state: PassState, jobs: list[Job]) -> dict[tuple[str, str], float]:
        usage = state.snapshot.fair_share_usage
        users: dict[str, set[str]] = defaultdict(set)
        for j in jobs:
            users[j.vc].add(j.user)
        for vc, user in usage:
            users[vc].add(user)
        total: dict[str, float] = defaultdict(float)
        for (vc, _), used in usage.items():
            total[vc] += max(used, 0.0)
        out: dict[tuple[str, str], float] = {}
        for vc, names in users.items():
            share = total[vc] / len(names) if names else 0.0
            for u in names:
                out[(vc, u)] = (max(usage.get((vc, u), 0.0), 0.0) / share) if share > 0 else 0.0
        return out

    def order(self, state: PassState, jobs: list[Job], phase: int = 0) -> list[Job]:
        base = self.sorted_jobs(jobs)
        usage = state.snapshot.fair_share_usage
        # the (VC, priority) groups of backfill VCs with a job holding a reservation (preemptible work
        # never holds one): without fair share, the only groups whose order can change
        held: set[tuple[str, int]] = set()
        if phase == 0:
            vcs = state.vcs
            for j in filter(_RESERVED, base):
                its_vc = vcs.get(j.vc)
                if its_vc is not None and its_vc.policy is Policy.BACKFILL:
                    held.add((j.vc, j.priority))
        weighted = {name for name, v in state.vcs.items() if v.limit_weight}  # shorter limits first
        if not usage and not held and not weighted:
            return base
        # one table per pass, over every waiting job (the core orders non-preemptible and
        # preemptible work in two calls; each alone would count a different set of users)
        if usage and self._ratio_of is not state.snapshot:
            self._ratio = self.ratios(state, [j for j in state.snapshot.jobs if not j.running])
            self._ratio_of = state.snapshot
            self._by_vc = defaultdict(dict)
            for (v, u), r in self._ratio.items():
                self._by_vc[v][u] = r
        groups: dict[tuple[str, int], list[int]] = defaultdict(list)
        # without use, only the held groups and the weighted VCs' groups can change
        some_vcs = None if usage else {vc for vc, _ in held} | weighted
        for i, j in enumerate(base):
            if some_vcs is None or (j.vc in some_vcs and (j.vc in weighted or (j.vc, j.priority) in held)):
                groups[(j.vc, j.priority)].append(i)
        out = list(base)
        for (vc_name, prio), idx in groups.items():
            if len(idx) < 2:
                continue
            vc = state.vcs.get(vc_name)
            queued = [base[i] for i in idx]  # by queue time
            by_rank = rank_key(vc)
            members = queued if by_rank is _queue_key else sorted(queued, key=by_rank)  # by rank time
            ranked = members
            if usage and (vc is None or vc.fair_share):
                # ``members`` is in rank-time order, so a stable sort by the owners' ratios alone
                # gives (ratio, rank time, id)
                of_user = self._by_vc.get(vc_name, {})
                keys = [of_user.get(u, 0.0) for u in map(_USER, members)]
                cap = vc.fair_share_max_wait_s if vc is not None else None
                if cap is not None:
                    now = state.now
                    keys = [0.0 if now - m.queue_time >= cap else k for k, m in zip(keys, members)]
                if min(keys) != max(keys):
                    ranked = [members[p] for p in sorted(range(len(members)), key=keys.__getitem__)]
            if (vc_name, prio) in held:
                ranked = bind_reservations(ranked, by_rank)
            if all(a is b for a, b in zip(ranked, queued)):
                continue
            key = (vc_name, prio, phase)
            by_queue = {j.id: k for k, j in enumerate(members)}
            for k, (i, j) in enumerate(zip(idx, ranked)):
                out[i] = j
                self._ranks[j.id] = (key, by_queue[j.id], k)
        return out

    def revise_waits(self, state: PassState, waits: list[Wait], started: set[int],
                     making_room: set[int]) -> list[Wait]:
        if not self._ranks:
            return waits
        jobs = {j.id: j for j in state.snapshot.jobs if j.id in self._ranks}
        # per group: the started jobs' (queue rank, fair-share rank, id)
        started_by_group: dict[tuple[str, int, int], list[tuple[int, int, int]]] = defaultdict(list)
        for jid in started:
            got = self._ranks.get(jid)
            if got is not None:
                started_by_group[got[0]].append((got[1], got[2], jid))
        if not started_by_group:
            return waits
        # what the jobs moved ahead took: nodes, or the VC's quota (a colleague's job that fair share
        # put first used it)
        revisable = {WaitReason.CAPACITY, WaitReason.FRAGMENTATION, WaitReason.CPU, WaitReason.MEMORY,
                     WaitReason.TOPOLOGY, WaitReason.VC_QUOTA}
        out = []
        for w in waits:
            got = self._ranks.get(w.job_id)
            # a job this pass made room for (preempting or scaling down) waits for the room, not
            # for the colleagues fair share put ahead
            if got is None or w.reason not in revisable or w.permanent or w.job_id in making_room:
                out.append(w)
                continue
            key, q, f = got
            me = jobs[w.job_id]
            group_starts = started_by_group.get(key, ())
            # By queue time roughly the first len(group_starts) jobs of the group would have had the
            # room; a job past those would have waited anyway and keeps its own reason.
            if q >= len(group_starts):
                out.append(w)
                continue
            # (a job that went first holding its reservation passed by that, not by fair share)
            ahead = [jid for sq, sf, jid in group_starts
                     if sq > q and sf < f and jobs[jid].user != me.user and not jobs[jid].reserved]
            if not ahead:
                out.append(w)
                continue
            other = jobs[min(ahead)]
            mine, theirs = self._ratio.get((me.vc, me.user), 0.0), self._ratio.get((other.vc, other.user), 0.0)
            detail = (f"user {me.user} used {mine:.2f}x an equal share of VC {me.vc}'s recent GPU time; "
                      f"job {other.id} of {other.user} ({theirs:.2f}x), submitted later, went first ({w.detail})")
            vc = state.vcs.get(me.vc)
            if vc is not None and vc.fair_share_max_wait_s is not None:
                left = vc.fair_share_max_wait_s - (state.now - me.queue_time)
                detail += (f"; fair share holds it back for at most {left:.0f} s more (the VC's "
                           f"fair_share_max_wait_s)")
            out.append(Wait(w.job_id, WaitReason.FAIR_SHARE, detail, None, w.queue_position, False,
                            w.estimated_start))  # backfill's reservation stays
        return out
