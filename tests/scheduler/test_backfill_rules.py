"""Backfill, one readable case per rule: reservations, what may start in front of them, and
estimated start times (docs/scheduling.md, "Backfill")."""

from __future__ import annotations

import math
from dataclasses import replace

from dlts.scheduler import JobType, Policy, decide

from .builders import job, node, nodes, running, snap, summary, vc

NOW = 1000.0
BF = dict(policy=Policy.BACKFILL)


def waits(d):
    return {w.job_id: w for w in d.waits}


def busy(j, name, idx, started_at=0.0):
    return running(j, (name, idx), started_at=started_at)


def test_a_small_job_that_ends_before_the_reservation_starts_in_front_of_the_big_one() -> None:
    # n1: 6 GPUs held until t=5000 (limit 5000, started at 0); job 2 needs the whole node.
    s = snap([node("n1")], vc(**BF), [
        busy(job(1, 6, max_time_s=5000), "n1", tuple(range(6))),
        job(2, 8), job(3, 2, max_time_s=4000),
    ])
    d = decide(s, NOW)
    assert summary(d)["starts"] == {3: [("n1", (6, 7))]}  # ends at 5000, exactly when job 2 may start
    w = waits(d)[2]
    assert w.reason_code == "capacity" and w.estimated_start == 5000.0
    (r,) = d.reservations
    assert (r.job_id, r.start, r.end, [p.node for p in r.placements]) == (2, 5000.0, math.inf, ["n1"])


def test_a_job_that_would_run_past_the_reservation_waits_for_it() -> None:
    s = snap([node("n1")], vc(**BF), [
        busy(job(1, 6, max_time_s=5000), "n1", tuple(range(6))),
        job(2, 8, max_time_s=1000), job(3, 2, max_time_s=4001),
    ])
    d = decide(s, NOW)
    assert summary(d)["starts"] == {}
    w = waits(d)[3]
    assert w.reason_code == "reservation:2"
    assert "job 2" in w.detail and "4001" in w.detail
    # job 3 is within the reservation depth: it gets its own reservation after job 2's
    assert w.estimated_start == 6000.0


def test_a_job_without_any_limit_runs_past_every_reservation() -> None:
    s = snap([node("n1")], vc(**BF), [busy(job(1, 6, max_time_s=5000), "n1", tuple(range(6))), job(2, 8), job(3, 1)])
    d = decide(s, NOW)
    assert summary(d)["waits"] == {2: "capacity", 3: "reservation:2"}
    assert waits(d)[3].estimated_start is None  # job 2 never ends by the model: unknown


def test_a_long_job_on_resources_the_reservation_does_not_use_starts() -> None:
    s = snap([node("n1"), node("n2")], vc(**BF), [
        busy(job(1, 6, max_time_s=5000), "n1", tuple(range(6))),
        busy(job(4, 8, max_time_s=9000), "n2", tuple(range(8))),
        job(2, 8), job(3, 2),  # job 3 has no limit, but n1's free GPUs 6-7 are not reserved
    ])
    d = decide(s, NOW)
    # job 2 reserves n1 (free first, at 5000); the two free GPUs there are part of it...
    assert waits(d)[2].estimated_start == 5000.0
    assert summary(d)["waits"][3] == "reservation:2"
    # ...but an 8-GPU reservation on n2 leaves n1's 2 free GPUs alone
    s2 = snap([node("n1"), node("n2")], vc(**BF), [
        busy(job(1, 6, max_time_s=9000), "n1", tuple(range(6))),
        busy(job(4, 8, max_time_s=5000), "n2", tuple(range(8))),
        job(2, 8), job(3, 2),
    ])
    d2 = decide(s2, NOW)
    assert summary(d2)["starts"] == {3: [("n1", (6, 7))]}
    assert [p.node for p in d2.reservations[0].placements] == ["n2"]


def test_the_estimate_uses_the_vc_limit_then_the_default_estimate() -> None:
    cluster = [node("n1")]
    base = [busy(job(1, 8), "n1", tuple(range(8)), started_at=100.0), job(2, 8)]
    d = decide(snap(cluster, vc(max_job_time_s=3000, **BF), base), NOW)
    assert waits(d)[2].estimated_start == 3100.0
    d = decide(snap(cluster, vc(default_runtime_estimate_s=7200, **BF), base), NOW)
    assert waits(d)[2].estimated_start == 7300.0
    d = decide(snap(cluster, vc(**BF), base), NOW)  # no limit and no estimate: unknown
    assert waits(d)[2].estimated_start is None and d.reservations == ()


def test_reservation_depth_limits_how_many_waiting_jobs_get_one() -> None:
    jobs = [busy(job(1, 8, max_time_s=2000), "n1", tuple(range(8)))] + [job(i, 8, max_time_s=1000) for i in (2, 3, 4)]
    s = snap([node("n1")], vc(**BF), jobs)
    d = decide(s, NOW)
    assert [w.estimated_start for w in sorted(d.waits, key=lambda w: w.job_id)] == [2000.0, 3000.0, 4000.0]
    assert not any("no estimated start" in w.detail for w in d.waits)
    d = decide(replace(s, reservation_depth=1), NOW)
    assert [w.estimated_start for w in sorted(d.waits, key=lambda w: w.job_id)] == [2000.0, None, None]
    assert summary(d)["waits"] == {2: "capacity", 3: "capacity", 4: "capacity"}  # no GPU is free at all
    # a job left without one says why it has no estimate
    assert "no estimated start" not in waits(d)[2].detail
    for jid in (3, 4):
        assert waits(d)[jid].detail.endswith(
            "; no estimated start: this pass's reservations (reservation_depth 1) went to jobs ahead of it")
    d = decide(replace(s, reservation_depth=0), NOW)  # depth 0: plain RF
    assert d.reservations == () and summary(d)["waits"] == {2: "capacity", 3: "capacity", 4: "capacity"}
    assert all(w.detail.endswith("; no estimated start: reservation_depth is 0") for w in d.waits)
    # where no reservation could be given anyway, nothing is added: an RF VC, a preemptible job
    d = decide(replace(s, reservation_depth=1, vcs={"v": vc(policy=Policy.RF)}), NOW)
    assert not any("no estimated start" in w.detail for w in d.waits)
    d = decide(replace(s, reservation_depth=1, jobs=s.jobs[:2] + tuple(replace(j, preemptible=True) for j in s.jobs[2:])), NOW)
    assert not any("no estimated start" in w.detail for w in d.waits)


def test_a_gang_reservation_waits_for_nodes_in_one_ib_domain() -> None:
    # pod a: a1 frees at 2000, a2 at 6000; pod b: b1 frees at 3000. A 2-node gang needs a1+a2.
    s = snap([node("a1", domain="a"), node("a2", domain="a"), node("b1", domain="b")], vc(**BF), [
        busy(job(1, 8, max_time_s=2000), "a1", tuple(range(8))),
        busy(job(2, 8, max_time_s=6000), "a2", tuple(range(8))),
        busy(job(3, 8, max_time_s=3000), "b1", tuple(range(8))),
        job(4, 8, type=JobType.DISTRIBUTED, nodes=2, max_time_s=1000),
    ])
    d = decide(s, NOW)
    (r,) = d.reservations
    assert r.start == 6000.0 and sorted(p.node for p in r.placements) == ["a1", "a2"]


def test_an_earlier_reservation_consumes_what_a_later_one_cannot_count() -> None:
    s = snap([node("n1"), node("n2")], vc(**BF), [
        busy(job(1, 8, max_time_s=2000), "n1", tuple(range(8))),
        busy(job(2, 8, max_time_s=4000), "n2", tuple(range(8))),
        job(3, 8, max_time_s=10000), job(4, 8, max_time_s=100),
    ])
    d = decide(s, NOW)
    assert {r.job_id: (r.start, r.placements[0].node) for r in d.reservations} == {3: (2000.0, "n1"), 4: (4000.0, "n2")}


def test_quota_is_a_reserved_resource() -> None:
    # VC quota 8: job 1 (non-preemptible, 4 GPUs) runs until 2000; job 2 needs all 8 -> vc_quota,
    # reserved at 2000. Job 3 (2 GPUs, n2 free) fits the quota now but would hold it past 2000.
    s = snap([node("n1"), node("n2")], vc(quota={"a100": 8}, **BF), [
        busy(job(1, 4, max_time_s=2000), "n1", (0, 1, 2, 3)),
        job(2, 8, max_time_s=1000), job(3, 2, max_time_s=5000), job(5, 2, max_time_s=500),
    ])
    d = decide(s, NOW)
    assert waits(d)[2].reason_code == "vc_quota" and waits(d)[2].estimated_start == 2000.0
    assert waits(d)[3].reason_code == "reservation:2"
    assert 5 in summary(d)["starts"]  # ends at 1500, before the reservation


def test_other_vcs_and_preemptible_jobs_respect_a_reservation() -> None:
    s = snap([node("n1")], [vc("bf", **BF), vc("rf")], [
        busy(job(1, 6, vc="bf", max_time_s=5000), "n1", tuple(range(6))),
        job(2, 8, vc="bf"), job(3, 2, vc="rf"), job(4, 2, vc="rf", preemptible=True, max_time_s=100),
    ])
    d = decide(s, NOW)
    assert summary(d)["waits"] == {2: "capacity", 3: "reservation:2"}
    assert summary(d)["starts"] == {4: [("n1", (6, 7))]}


def test_protected_preemptible_work_counts_as_reclaimable_from_the_end_of_its_budget() -> None:
    # n1 is held by preemptible job 1 of a VC with min_runtime_s 3000, started at 500: it may be
    # preempted from 3500 on, so job 2's estimate is 3500 (the model used to hold it forever)
    world = [busy(job(1, 8, vc="other", preemptible=True), "n1", tuple(range(8)), started_at=500.0), job(2, 8, vc="bf")]
    d = decide(snap([node("n1")], [vc("bf", **BF), vc("other", min_runtime_s=3000.0)], world), NOW)
    assert summary(d)["stops"] == {}
    assert waits(d)[2].estimated_start == 3500.0
    d = decide(snap([node("n1")], [vc("bf", **BF), vc("other", min_runtime_s=3000.0)], world), 3500.0)
    assert summary(d)["stops"] == {1: "preempted"}


def test_jobs_of_backfill_vcs_are_placed_first_fit_in_node_order() -> None:
    s = snap([node("n1"), node("n2")], vc(**BF), [busy(job(1, 6), "n2", tuple(range(6))), job(2, 2)])
    assert summary(decide(s, NOW))["starts"] == {2: [("n1", (0, 1))]}
    s = snap([node("n1"), node("n2")], vc(), [busy(job(1, 6), "n2", tuple(range(6))), job(2, 2)])
    assert summary(decide(s, NOW))["starts"] == {2: [("n2", (6, 7))]}  # RF keeps best fit


def test_room_made_by_preemption_is_held_from_now() -> None:
    s = snap(nodes("n", 2), vc(**BF), [
        busy(job(1, 8, preemptible=True, vc="v"), "n0", tuple(range(8))),
        busy(job(4, 8, max_time_s=5000), "n1", tuple(range(8))),
        job(2, 8, max_time_s=1000), job(3, 1, max_time_s=10),
    ])
    d = decide(s, NOW)
    assert summary(d)["stops"] == {1: "preempted"}
    # the room is job 2's from now on (it starts once job 1 has exited, after the grace period)
    assert [(r.job_id, r.start, r.placements[0].node) for r in d.reservations][0] == (2, NOW, "n0")
    # estimated from now, so the job keeps its reservation (and its place) while job 1 exits
    assert waits(d)[2].estimated_start == NOW
    assert summary(d)["waits"][3] == "capacity"  # no GPU is free now; the room is held for job 2
    # ...also when no new reservation is left to give (depth 0 here): it used to get no estimate
    # then, and so lost its hold on the room at the next pass
    d = decide(replace(s, reservation_depth=0), NOW)
    assert summary(d)["stops"] == {1: "preempted"}
    assert waits(d)[2].estimated_start == NOW and "no estimated start" not in waits(d)[2].detail


def test_free_room_is_taken_before_anything_is_preempted() -> None:
    s = snap(nodes("n", 2), vc(**BF), [busy(job(1, 8, preemptible=True, vc="v"), "n0", tuple(range(8))), job(2, 8)])
    d = decide(s, NOW)
    assert summary(d) == {"starts": {2: [("n1", tuple(range(8)))]}, "stops": {}, "waits": {}}


def _bound(reserved: bool, policy: Policy = Policy.BACKFILL, limit: int = 7200):
    """ann's 16-GPU job 1 (queue time 1) against bob's later 8-GPU job 2: bob has no recent use, so
    fair share ranks job 2 first; ann's running job 9 holds n1 until t=4600 (its limit)."""
    return snap([node("n1"), node("n2")], [vc(quota={"a100": 16}, policy=policy)], [
        busy(job(9, 8, user="ann", max_time_s=3600), "n1", tuple(range(8)), started_at=NOW),
        replace(job(1, 16, user="ann", type=JobType.DISTRIBUTED, nodes=2, queue_time=1.0, max_time_s=3600),
                reserved=reserved),
        job(2, 8, user="bob", queue_time=5.0, max_time_s=limit),
    ], fair_share_usage={("v", "ann"): 36_000.0})


def test_a_reservation_binds_a_lighter_colleagues_later_job() -> None:
    # job 1 held a reservation at the previous pass: bob's job 2, submitted after it, is not put
    # ahead of it by fair share, so it may start only if it ends before job 1's start (4600)
    d = decide(_bound(reserved=True), NOW)
    w = waits(d)
    assert summary(d)["starts"] == {}
    assert w[1].estimated_start == NOW + 3600 and w[1].queue_position == 1
    assert w[2].reason_code == "reservation:1" and w[2].queue_position == 2
    d = decide(_bound(reserved=True, limit=3600), NOW)  # ends by 4600: it backfills next to job 1
    assert set(summary(d)["starts"]) == {2} and waits(d)[1].estimated_start == NOW + 3600


def test_before_its_first_reservation_fair_share_orders_the_job() -> None:
    # no reservation yet: bob's job goes first, and job 1 then gets one behind it
    d = decide(_bound(reserved=False), NOW)
    w = waits(d)
    assert set(summary(d)["starts"]) == {2}
    assert w[1].reason_code == "fair_share" and w[1].estimated_start == NOW + 7200


def test_a_reservation_flag_changes_nothing_outside_backfill() -> None:
    for reserved in (False, True):
        d = decide(_bound(reserved=reserved, policy=Policy.RF), NOW)
        assert set(summary(d)["starts"]) == {2} and waits(d)[1].reason_code == "fair_share"


def test_a_held_reservation_does_not_pass_older_work() -> None:
    # ann's job 3 is older than the held job 1: binding moves job 1 only ahead of later jobs, so
    # the order is 3, 1, 2 (fair share alone gives 2, 3, 1), and job 3 (600 s) backfills
    s = _bound(reserved=True)
    s = replace(s, jobs=s.jobs + (job(3, 8, user="ann", queue_time=0.0, max_time_s=600),))
    d = decide(s, NOW)
    assert summary(d)["starts"] == {3: [("n2", tuple(range(8)))]}
    w = waits(d)
    assert (w[1].queue_position, w[2].queue_position) == (2, 3)
    assert w[1].estimated_start == NOW + 3600 and w[2].reason_code == "vc_quota"  # job 3 took the rest


def test_a_kept_reservation_is_not_lost_to_the_depth() -> None:
    # depth 1: job 5 of VC w, older than job 1, now waits too and would take the only slot; job 1
    # keeps its reservation (and estimate) and job 5 gets none until a slot is free
    s = _bound(reserved=True)
    s = replace(s, reservation_depth=1, nodes=s.nodes + (node("n3"),),
                vcs={**s.vcs, "w": vc("w", quota={"a100": 8}, **BF)},
                jobs=s.jobs + (busy(job(6, 8, vc="w", max_time_s=3600), "n3", tuple(range(8)), started_at=NOW),
                               job(5, 8, vc="w", queue_time=0.5)))
    d = decide(s, NOW)
    w = waits(d)
    assert w[1].estimated_start == NOW + 3600 and w[5].estimated_start is None
    assert [r.job_id for r in d.reservations] == [1]
    d = decide(replace(s, jobs=tuple(replace(j, reserved=False) for j in s.jobs)), NOW)
    assert [r.job_id for r in d.reservations] == [5]  # without a kept one, the first in the order


def test_binding_moves_only_later_jobs_behind_each_held_one() -> None:
    from dlts.scheduler.plugins.fairshare import bind_reservations

    def j(i: int, qt: float, held: bool = False):
        return replace(job(i, 1, queue_time=qt), reserved=held)

    # fair-share order a, r2, b, r1, c; r1 (t=2) and r2 (t=3) hold reservations
    a, r2, b, r1, c = j(1, 10.0), j(2, 3.0, True), j(3, 2.5), j(4, 2.0, True), j(5, 1.0)
    got = [x.id for x in bind_reservations([a, r2, b, r1, c])]
    # r1 goes first of the held (oldest); r2 and b (both after r1) follow it, a (after r2) too, in
    # their fair-share order; c, older than both, keeps its place at the end
    assert got == [4, 2, 1, 3, 5]
    assert bind_reservations([a, b, c]) == [a, b, c]
