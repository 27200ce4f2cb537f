"""The scheduler settings of issue 19 on the production path: dlts.yaml -> load_settings ->
load_snapshot (the job manager's snapshot code) -> decide."""

from __future__ import annotations

from dataclasses import replace

from dlts.config import load_settings
from dlts.jobmanager.snapshot import load_snapshot
from dlts.scheduler import Job, JobType, decide

GIB = 2**30


def _settings(tmp_path, settings, text: str):
    path = tmp_path / "dlts.yaml"
    path.write_text(f"database_url: {settings.database_url}\nsecret_key: {settings.secret_key}\n" + text)
    return load_settings(path, environ={})


def _cpu_job(cores: float) -> Job:
    return Job(id=10_000, vc="vision", user="alice", type=JobType.BATCH, sku=None, gpus=0, cpu=cores,
               memory_bytes=1 * GIB, queue_time=0.0)


def test_sku_reserve_from_the_config_file_opens_gpu_node_cores_to_cpu_jobs(tmp_path, world, sessions, settings):
    # testnode: 4 demo-gpu GPUs, 8 cores, 32 GiB. By default every core is kept for the free GPUs
    # (the shared test settings open them, as the demo does: here the default is restored).
    settings = settings.model_copy(update={"sku_reserve": {}})
    with sessions() as s:
        default = load_snapshot(s, settings)
    assert default.skus["demo-gpu"].cpu_per_gpu is None
    wait = decide(replace(default, jobs=(_cpu_job(4.0),)), 0.0)
    assert not wait.starts and wait.waits[0].reason.value == "capacity"
    assert "kept for their free GPUs" in wait.waits[0].detail

    lean = _settings(tmp_path, settings, "sku_reserve:\n  demo-gpu: {cpu_per_gpu: 1, memory_per_gpu_bytes: 4294967296}\n")
    with sessions() as s:
        snap = load_snapshot(s, lean)
    assert (snap.skus["demo-gpu"].cpu_per_gpu, snap.skus["demo-gpu"].memory_per_gpu_bytes) == (1.0, 4 * GIB)
    d = decide(replace(snap, jobs=(_cpu_job(4.0),)), 0.0)
    assert [(s.job_id, s.placements[0].node) for s in d.starts] == [(10_000, "testnode")]
    d = decide(replace(snap, jobs=(_cpu_job(5.0),)), 0.0)  # 8 cores - 4 kept for 4 free GPUs = 4
    assert not d.starts


def test_sku_reserve_from_the_environment_is_json(tmp_path, settings):
    s = load_settings(None, environ={"DLTS_SKU_RESERVE": '{"a100": {"cpu_per_gpu": 10}}',
                                     "DLTS_DATABASE_URL": settings.database_url})
    assert s.sku_reserve["a100"].cpu_per_gpu == 10.0


def _user_id(s, name: str) -> int:
    import sqlalchemy as sa

    from dlts.models import User

    return s.scalar(sa.select(User.id).where(User.name == name))


def _submit(s, settings, user: str, gpus: int, **kw) -> int:
    import sqlalchemy as sa

    from dlts.models import User
    from dlts.services import jobs as job_service
    from dlts.services.auth import principal_for

    who = principal_for(s, s.scalar(sa.select(User).where(User.name == user)))
    return job_service.submit(s, settings, who, job_service.JobRequest(vc="vision", image="debian:12",
                                                                     command="true", gpus=gpus, **kw)).id


def test_fair_share_from_the_accounting_rollup_puts_the_lighter_user_first(tmp_path, world, sessions, settings):
    import datetime as dt

    import sqlalchemy as sa

    from dlts.models import VirtualCluster, utcnow
    from dlts.models.accounting import UsageTotal

    cfg = _settings(tmp_path, settings, "fair_share_half_life_h: 24\nvc_scheduling:\n  nlp: {fair_share: false}\n")
    now = utcnow()
    with sessions() as s:
        vision = s.scalar(sa.select(VirtualCluster.id).where(VirtualCluster.name == "vision"))
        alice = _user_id(s, "alice")
        for day, hours in ((now.date(), 4), (now.date() - dt.timedelta(days=3), 100)):
            s.add(UsageTotal(period="day", start=day, user_id=alice, vc_id=vision, sku="demo-gpu", preemptible=False,
                             gpu_ms=hours * 3600 * 1000, busy_gpu_ms=0, sampled_gpu_ms=0))
        # preemptible, so the VC quota (4) does not decide: the one node's 4 GPUs do
        first = _submit(s, settings, "alice", 4, preemptible=True)  # submitted first
        second = _submit(s, settings, "bob", 4, preemptible=True)
        s.commit()
    with sessions() as s:
        snap = load_snapshot(s, cfg)
    assert (snap.vcs["vision"].fair_share, snap.vcs["nlp"].fair_share) == (True, False)
    got = snap.fair_share_usage[("vision", "alice")]
    t = now.replace(tzinfo=None)

    def weight(day):
        age_h = max(0.0, (t - dt.datetime.combine(day, dt.time(12))).total_seconds() / 3600)
        return 0.5 ** (age_h / 24)

    want = 4 * 3600 * weight(now.date()) + 100 * 3600 * weight(now.date() - dt.timedelta(days=3))
    assert abs(got - want) / want < 0.01, (got, want)
    d = decide(snap, t.timestamp())
    assert [x.job_id for x in d.starts] == [second]
    wait = next(w for w in d.waits if w.job_id == first)
    assert wait.reason.value == "fair_share" and wait.queue_position == 2 and "user alice used 2.00x" in wait.detail
    # the default half-life is on too; 0 switches fair share off: queue time decides
    off = _settings(tmp_path, settings, "fair_share_half_life_h: 0\n")
    with sessions() as s:
        snap = load_snapshot(s, off)
    assert snap.fair_share_usage == {} and not snap.vcs["vision"].fair_share
    assert [x.job_id for x in decide(snap, t.timestamp()).starts] == [first]


def test_preemption_budget_from_the_config_file_and_the_attempts(tmp_path, world, sessions, settings):
    from dlts.models import JobAttempt, utcnow

    cfg = _settings(tmp_path, settings, "min_runtime_s: 600\nmax_reclaim_delay_s: 1800\nmax_preemptions: 3\n"
                                        "vc_scheduling:\n  nlp: {min_runtime_s: 60, max_preemptions: 1}\n")
    with sessions() as s:
        job_id = _submit(s, settings, "alice", 1, preemptible=True)
        for n in (1, 2):
            s.add(JobAttempt(job_id=job_id, number=n, placements=[], ended_at=utcnow(), end_reason="preempted"))
        s.add(JobAttempt(job_id=job_id, number=3, placements=[], ended_at=utcnow(), end_reason="failed"))
        s.commit()
    with sessions() as s:
        snap = load_snapshot(s, cfg)
    vision, nlp = snap.vcs["vision"], snap.vcs["nlp"]
    assert (vision.min_runtime_s, vision.max_reclaim_delay_s, vision.max_preemptions) == (600.0, 1800.0, 3)
    assert (nlp.min_runtime_s, nlp.max_reclaim_delay_s, nlp.max_preemptions) == (60.0, 1800.0, 1)
    assert next(j for j in snap.jobs if j.id == job_id).preemptions == 2
    with sessions() as s:  # the defaults: no budget, and the count is not even read
        snap = load_snapshot(s, settings)
    assert snap.vcs["vision"].min_runtime_s == 0 and next(j for j in snap.jobs if j.id == job_id).preemptions == 0


def test_fair_share_max_wait_from_the_config_file_then_the_vc_row(tmp_path, world, sessions, settings):
    """The cluster's ``fair_share_max_wait_s``, then dlts.yaml's ``vc_scheduling`` entry, then the VC's own
    value (set at runtime) reach ``core.Vc`` and bound how long fair share holds the heavy user's job."""
    import datetime as dt

    import sqlalchemy as sa

    from dlts.models import VirtualCluster, utcnow
    from dlts.models.accounting import UsageTotal
    from dlts.services import vcs as vc_service
    from tests.api.helpers import principal

    cfg = _settings(tmp_path, settings, "fair_share_half_life_h: 24\nfair_share_max_wait_s: 86400\n"
                                        "vc_scheduling:\n  nlp: {fair_share_max_wait_s: 60}\n")
    with sessions() as s:
        vision = s.scalar(sa.select(VirtualCluster.id).where(VirtualCluster.name == "vision"))
        s.add(UsageTotal(period="day", start=utcnow().date() - dt.timedelta(days=1), user_id=_user_id(s, "alice"),
                         vc_id=vision, sku="demo-gpu", preemptible=False, gpu_ms=50 * 3600 * 1000, busy_gpu_ms=0,
                         sampled_gpu_ms=0))
        first = _submit(s, settings, "alice", 4, preemptible=True)  # the heavy user's, submitted first
        second = _submit(s, settings, "bob", 4, preemptible=True)
        s.commit()
    with sessions() as s:
        snap = load_snapshot(s, cfg)
    assert (snap.vcs["vision"].fair_share_max_wait_s, snap.vcs["nlp"].fair_share_max_wait_s) == (86400.0, 60.0)
    queued = max(j.queue_time for j in snap.jobs)
    # waited an hour, not a day: fair share still holds alice's job behind bob's
    assert [x.job_id for x in decide(snap, queued + 3700).starts] == [second]
    with sessions() as s:
        assert [x.job_id for x in decide(load_snapshot(s, settings), queued + 30 * 86400).starts] == [second]  # no bound

    with sessions() as s:  # the VC's own value wins over the cluster's, and over nlp's vc_scheduling entry
        vc_service.update_vc(s, cfg, principal(s, "vcadmin"), "vision", {"fair_share_max_wait_s": 3600})
        vc_service.update_vc(s, cfg, principal(s, "admin"), "nlp", {"fair_share_max_wait_s": 0})
    with sessions() as s:
        snap = load_snapshot(s, cfg)
    assert (snap.vcs["vision"].fair_share_max_wait_s, snap.vcs["nlp"].fair_share_max_wait_s) == (3600.0, 0.0)
    assert [x.job_id for x in decide(snap, queued + 10).starts] == [second]
    assert [x.job_id for x in decide(snap, queued + 3700).starts] == [first]  # waited longer than the bound

    with sessions() as s:  # cleared: dlts.yaml's values again
        vc_service.update_vc(s, cfg, principal(s, "admin"), "vision", {"fair_share_max_wait_s": None})
        vc_service.update_vc(s, cfg, principal(s, "admin"), "nlp", {"fair_share_max_wait_s": None})
    with sessions() as s:
        snap = load_snapshot(s, cfg)
    assert (snap.vcs["vision"].fair_share_max_wait_s, snap.vcs["nlp"].fair_share_max_wait_s) == (86400.0, 60.0)


def test_sku_reserve_star_applies_to_every_gpu_sku_not_named(tmp_path, world, sessions, settings):
    cfg = _settings(tmp_path, settings, "sku_reserve:\n  '*': {cpu_per_gpu: 0.5, memory_per_gpu_bytes: 0}\n  other: {cpu_per_gpu: 3}\n")
    with sessions() as s:
        snap = load_snapshot(s, cfg)
    assert snap.skus["demo-gpu"].cpu_per_gpu == 0.5
    d = decide(replace(snap, jobs=(_cpu_job(6.0),)), 0.0)  # 8 cores - 0.5 x 4 free GPUs
    assert [s.job_id for s in d.starts] == [10_000]


def test_limit_weight_from_the_config_file_then_the_vc_row(tmp_path, world, sessions, settings):
    """The cluster's ``limit_weight``, dlts.yaml's ``vc_scheduling`` entry, then the VC's own value (set at
    runtime) reach ``core.Vc`` and put the short job ahead of the long one submitted before it."""
    from dlts.services import vcs as vc_service
    from tests.api.helpers import principal

    cfg = _settings(tmp_path, settings, "fair_share_half_life_h: 0\nlimit_weight: 0.25\n"
                                        "vc_scheduling:\n  nlp: {limit_weight: 1.5}\n")
    with sessions() as s:
        long = _submit(s, settings, "alice", 4, preemptible=True, max_time_s=2 * 86400)  # submitted first
        short = _submit(s, settings, "bob", 4, preemptible=True, max_time_s=3600)
        s.commit()
    with sessions() as s:
        snap = load_snapshot(s, cfg)
    assert (snap.vcs["vision"].limit_weight, snap.vcs["nlp"].limit_weight) == (0.25, 1.5)
    queued = max(j.queue_time for j in snap.jobs)
    # the 2-day job ranks 12 h later, the 1-hour job 15 min: the short one goes first
    assert [x.job_id for x in decide(snap, queued + 10).starts] == [short]
    with sessions() as s:  # the default (no weight): submission order
        assert [x.job_id for x in decide(load_snapshot(s, settings), queued + 10).starts] == [long]

    with sessions() as s:  # the VC's own value wins over the cluster's, and over nlp's vc_scheduling entry
        vc_service.update_vc(s, cfg, principal(s, "vcadmin"), "vision", {"limit_weight": 0})
        vc_service.update_vc(s, cfg, principal(s, "admin"), "nlp", {"limit_weight": 0.5})
    with sessions() as s:
        snap = load_snapshot(s, cfg)
    assert (snap.vcs["vision"].limit_weight, snap.vcs["nlp"].limit_weight) == (0.0, 0.5)
    assert [x.job_id for x in decide(snap, queued + 10).starts] == [long]

    with sessions() as s:  # cleared: dlts.yaml's values again
        vc_service.update_vc(s, cfg, principal(s, "admin"), "vision", {"limit_weight": None})
        vc_service.update_vc(s, cfg, principal(s, "admin"), "nlp", {"limit_weight": None})
    with sessions() as s:
        snap = load_snapshot(s, cfg)
    assert (snap.vcs["vision"].limit_weight, snap.vcs["nlp"].limit_weight) == (0.25, 1.5)
    assert [x.job_id for x in decide(snap, queued + 10).starts] == [short]
