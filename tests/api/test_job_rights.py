"""services.jobs.detail says what its reader may do (``actions`` and ``rights``); the portal shows a
control only where the use-case behind it accepts. Each right is checked against the use-case."""

from __future__ import annotations

import pytest

from dlts.errors import DltsError
from dlts.models import JobStatus
from dlts.services import endpoints as endpoint_service
from dlts.services import job_keeping
from dlts.services import jobs as job_service

from .helpers import make_job, principal


def _rights(sessions, user: str, job_id: int) -> job_service.JobRights:
    with sessions() as s:
        return job_service.detail(s, principal(s, user), job_id).rights


def _accepted(sessions, settings, user: str, job_id: int, use) -> bool:
    with sessions() as s:
        try:
            use(s, settings, principal(s, user), job_id)
        except DltsError:
            return False
        return True


USE_CASES = {
    "patch": lambda s, _settings, who, j: job_service.patch(s, who, j, {"priority": 90}),
    "tag": lambda s, _settings, who, j: job_keeping.set_tags(s, who, j, ["x"]),
    "clone": lambda s, _settings, who, j: job_keeping.spec(s, who, j),
    "archive": lambda s, _settings, who, j: job_keeping.set_archived(s, who, j, True),
    "delete": lambda s, settings, who, j: job_keeping.delete(s, settings, who, j),
    "open_endpoint": lambda s, _settings, who, j: endpoint_service.open_endpoint(s, who, j, "port", 8080),
}


@pytest.mark.parametrize("status", [JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.FINISHED])
@pytest.mark.parametrize("user", ["alice", "vcadmin", "bob"])
def test_each_right_is_what_its_use_case_accepts(world, sessions, settings, user, status):
    for right, use in USE_CASES.items():
        job_id = make_job(sessions, settings, user="alice", status=status)  # a fresh job: a use-case may change it
        shown = getattr(_rights(sessions, user, job_id), right)
        assert shown == _accepted(sessions, settings, user, job_id, use), (right, user, status)


def test_the_owner_of_an_ended_job_may_archive_and_delete_it_and_nobody_may_change_it(world, sessions, settings):
    job_id = make_job(sessions, settings, user="alice", status=JobStatus.FINISHED)
    assert _rights(sessions, "alice", job_id) == job_service.JobRights(tag=True, clone=True, archive=True, delete=True)
    assert _rights(sessions, "vcadmin", job_id) == job_service.JobRights(tag=True, clone=True)
    assert _rights(sessions, "bob", job_id) == job_service.JobRights()  # another member sees the public fields only
