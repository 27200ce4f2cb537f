"""A Python client generated from the served OpenAPI document with openapi-python-client (the usual
way teams script a service) submits a job over real HTTP, follows it while the real job manager runs
it on the local backend, reads its log, kills a second job and gets the error envelope as a typed
model. A document whose types disagree with the server's answers fails here: the generated models
parse every answer strictly."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = "dlts_generated_client"


@pytest.fixture
def generated(client, tmp_path):
    document = tmp_path / "openapi.json"
    document.write_text(json.dumps(client.get("/api/v1/openapi.json").get_json()))
    config = tmp_path / "generator.yaml"
    # no post hooks: the generated code is not formatted by a ruff the test environment may lack
    config.write_text(f"post_hooks: []\npackage_name_override: {PACKAGE}\nproject_name_override: {PACKAGE}\n")
    generator = Path(sys.executable).parent / "openapi-python-client"
    result = subprocess.run([str(generator), "generate", "--path", str(document), "--output-path",
                             str(tmp_path / PACKAGE), "--meta", "none", "--config", str(config)],
                            capture_output=True, text=True, timeout=300)
    # every schema and operation of the document made it into the client: a warning means the
    # generator dropped something (a duplicate model name, a response it could not parse)
    assert result.returncode == 0 and "Warning" not in result.stdout + result.stderr, result.stdout + result.stderr
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def test_a_generated_client_submits_follows_reads_the_log_of_and_kills_jobs(generated, live, world):
    class Jobs:  # the generated operations of the jobs tag, one module each
        def __getattr__(self, name):
            return importlib.import_module(f"{PACKAGE}.api.jobs.{name}")

    jobs = Jobs()
    models = importlib.import_module(f"{PACKAGE}.models")
    api = generated.AuthenticatedClient(base_url=live.url, token=world.tokens["alice"],
                                        raise_on_unexpected_status=True)
    submit = jobs.post_api_v1_jobs
    done = submit.sync(client=api, body=models.JobSubmit(vc="vision", image="debian:12", max_retries=0,
                                                          command="echo generated client says hello"))
    assert isinstance(done, models.Job), done
    assert done.status == "queued" and done.user == "alice"

    def finished():
        job = jobs.get_api_v1_jobs_job_id.sync(done.id, client=api)
        return job if job.status == "finished" else None

    job = live.until(finished, f"job {done.id} finished")
    assert job.exit_code == 0
    log = jobs.get_api_v1_jobs_job_id_log.sync(done.id, client=api)
    assert isinstance(log, models.Log) and "generated client says hello" in log.data and log.complete

    running = submit.sync(client=api, body=models.JobSubmit(vc="vision", image="debian:12", command="sleep 600"))
    live.until(lambda: jobs.get_api_v1_jobs_job_id.sync(running.id, client=api).status == "running",
          f"job {running.id} running")
    killed = jobs.post_api_v1_jobs_job_id_kill.sync(running.id, client=api)
    assert killed.status in ("killing", "killed")
    live.until(lambda: jobs.get_api_v1_jobs_job_id.sync(running.id, client=api).status == "killed",
          f"job {running.id} killed")

    # an error answer is the envelope, typed: the code a program branches on, the message for people
    refused = jobs.get_api_v1_jobs_job_id.sync_detailed(2**40, client=generated.AuthenticatedClient(
        base_url=live.url, token=world.tokens["alice"]))
    assert refused.status_code == 404
    assert isinstance(refused.parsed, models.ErrorEnvelope), refused.parsed
    assert refused.parsed.error.code == "job_not_found" and refused.parsed.error.message
    again = jobs.post_api_v1_jobs_job_id_kill.sync_detailed(done.id, client=api)
    assert again.status_code == 409 and again.parsed.error.code == "job_already_ended", again.content
