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
    # testnode: 4 demo-gpu GPUs, 8 cores, 32 GiB. By default every core is kept for the free GPUs.
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
