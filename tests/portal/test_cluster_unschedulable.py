"""The cluster page's Unschedulable column on a cordoned, partly used node (the v1.5 bug counted
that node's used GPUs once under Used and again under Unschedulable)."""

from __future__ import annotations

import html
import re

import sqlalchemy as sa

from dlts.models import JobAttempt, JobStatus, User
from dlts.repositories import jobs as job_repo
from dlts.services import cluster as cluster_service
from dlts.services import jobs as job_service
from dlts.services.auth import principal_for


def _run_two_gpus_then_cordon(sessions, settings) -> None:
    with sessions() as s:
        alice = principal_for(s, s.scalar(sa.select(User).where(User.name == "alice")))
        job = job_service.submit(s, settings, alice, job_service.JobRequest(vc="vision", image="debian:12",
                                                                         command="true", gpus=2))
        s.add(JobAttempt(job_id=job.id, number=1, placements=[
            {"node": "testnode", "gpu_indices": [0, 1], "cpu": 4.0, "memory_bytes": 16 * 2**30}]))
        assert job_repo.set_status(s, job.id, JobStatus.QUEUED, JobStatus.SCHEDULING, actor="test", values={"attempt": 1})
        s.commit()


def test_cluster_status_counts_used_gpus_on_a_cordoned_node_once(world, sessions, settings, client):
    _run_two_gpus_then_cordon(sessions, settings)
    with sessions() as s:
        before = cluster_service.status(s).skus[0]
    assert (before.gpus, before.gpus_used, before.gpus_free, before.gpus_unschedulable) == (4, 2, 2, 0)
    assert client.post("/api/v1/nodes/testnode/cordon", headers=world.auth("admin")).status_code == 200
    with sessions() as s:
        sku = cluster_service.status(s).skus[0]
    # testnode: 4 GPUs, 2 running a job, cordoned: 2 used, 0 free, 2 idle that cannot take work
    assert (sku.gpus, sku.gpus_used, sku.gpus_free, sku.gpus_unschedulable) == (4, 2, 0, 2)
    assert sku.gpus_used + sku.gpus_free + sku.gpus_unschedulable == sku.gpus


def test_cluster_page_unschedulable_column_on_a_cordoned_partly_used_node(as_user, sessions, settings):
    _run_two_gpus_then_cordon(sessions, settings)
    admin = as_user("admin")
    admin.get("/cluster")
    admin.post("/nodes/testnode/cordon")
    page = html.unescape(admin.get("/cluster").get_data(as_text=True))
    row = re.search(r'<tr><th scope="row">demo-gpu</th>(.*?)</tr>', page, re.S)
    assert row, page[:3000]
    cells = re.findall(r'<td class="num">([^<]*)</td>', row.group(1))
    # Nodes (schedulable / all), GPUs, Used, Free, Unschedulable
    assert cells[:5] == ["0 / 1", "4", "2", "0", "2"], cells
