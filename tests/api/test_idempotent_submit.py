"""POST /jobs with an Idempotency-Key: a retry answers the job the first request made; the same key
with another body is refused; keys are per user, expire after idempotency_key_ttl_h (then the
janitor deletes them); parallel requests with one key over real HTTP make exactly one job."""

from __future__ import annotations

import datetime as dt
import json
import threading
import urllib.error
import urllib.request

import pytest
import sqlalchemy as sa

from dlts.app import create_app
from dlts.config import load_settings
from dlts.db import engine_of, session_factory
from dlts.managers.janitor import Janitor
from dlts.models import IdempotencyKey, Job, utcnow

from .helpers import assert_envelope, job_count

JOB = {"vc": "vision", "image": "debian:12", "command": "python train.py"}


def post(client, world, body, key=None, user="alice"):
    headers = world.auth(user) | ({"Idempotency-Key": key} if key is not None else {})
    return client.post("/api/v1/jobs", json=body, headers=headers)


def test_a_retry_with_the_same_key_answers_the_same_job_and_makes_none(client, world, sessions):
    first = post(client, world, JOB, "7f0c1f7e-2b7b-4a57-9a49-1d2f0e0c9b11")
    assert first.status_code == 201 and "Idempotent-Replayed" not in first.headers
    before = job_count(sessions)
    again = post(client, world, JOB, "7f0c1f7e-2b7b-4a57-9a49-1d2f0e0c9b11")
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.get_json()["id"] == first.get_json()["id"]
    assert job_count(sessions) == before
    # the same body spelled differently (key order, defaults written out, memory in bytes) is the same request
    spelled = {"command": "python train.py", "image": "debian:12", "vc": "vision", "gpus": 0, "type": "batch",
               "priority": 100, "env": {}, "tags": []}
    assert post(client, world, spelled, "7f0c1f7e-2b7b-4a57-9a49-1d2f0e0c9b11").get_json()["id"] == first.get_json()["id"]
    assert job_count(sessions) == before
    # without a key, or with another key, every request is a new job
    assert post(client, world, JOB).get_json()["id"] != first.get_json()["id"]
    assert post(client, world, JOB, "another-key").get_json()["id"] != first.get_json()["id"]
    assert job_count(sessions) == before + 2


def test_the_same_key_with_another_body_is_refused_and_nothing_is_written(client, world, sessions):
    first = post(client, world, JOB, "k-1").get_json()
    before = job_count(sessions)
    error = assert_envelope(post(client, world, JOB | {"command": "python other.py"}, "k-1"), 422, "idempotency_key_reused")
    assert error["details"]["field"] == "Idempotency-Key" and error["details"]["job_id"] == first["id"]
    assert job_count(sessions) == before


def test_keys_are_per_user(client, world, sessions):
    alice = post(client, world, JOB, "shared-key").get_json()
    bob = post(client, world, JOB, "shared-key", user="bob")
    assert bob.status_code == 201 and "Idempotent-Replayed" not in bob.headers
    assert bob.get_json()["id"] != alice["id"] and bob.get_json()["user"] == "bob"
    # and bob's different body under "his" key is no conflict with alice's
    assert post(client, world, JOB | {"command": "x"}, "bob-only", user="bob").status_code == 201


@pytest.mark.parametrize("key", ["", "a" * 129, "has space", "ключ", "semi;colon", "quote\"d", "new\\line"])
def test_malformed_keys_are_refused_naming_the_header(client, world, sessions, key):
    before = job_count(sessions)
    error = assert_envelope(post(client, world, JOB, key), 400, "invalid_idempotency_key")
    assert error["details"]["field"] == "Idempotency-Key" and "Idempotency-Key" in error["message"]
    assert job_count(sessions) == before


def test_a_refused_submission_stores_no_key_so_the_fixed_retry_goes_through(client, world, sessions):
    assert_envelope(post(client, world, JOB | {"vc": "nope"}, "fix-me"), 404)
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(IdempotencyKey.id))) == 0
    response = post(client, world, JOB, "fix-me")
    assert response.status_code == 201 and "Idempotent-Replayed" not in response.headers


def _age_keys(sessions, hours: float) -> None:
    with sessions() as s:
        s.execute(sa.update(IdempotencyKey).values(created_at=utcnow() - dt.timedelta(hours=hours)))
        s.commit()


def test_a_key_past_its_ttl_no_longer_replays_and_the_janitor_purges_it(client, world, sessions, settings):
    first = post(client, world, JOB, "old-key").get_json()
    post(client, world, JOB, "young-key")
    _age_keys(sessions, 25)  # both past the default 24 h
    with sessions() as s:
        s.execute(sa.update(IdempotencyKey).where(IdempotencyKey.key == "young-key").values(created_at=utcnow()))
        s.commit()
    fresh = post(client, world, JOB, "old-key")
    assert fresh.status_code == 201 and "Idempotent-Replayed" not in fresh.headers and fresh.get_json()["id"] != first["id"]
    _age_keys(sessions, 0)
    with sessions() as s:
        s.execute(sa.update(IdempotencyKey).where(IdempotencyKey.key == "old-key")
                  .values(created_at=utcnow() - dt.timedelta(hours=30)))
        s.commit()
    result = Janitor(sessions, retention_days=30, pause_s=0, idempotency_key_ttl_h=24).run()
    assert result.idempotency_keys == 1
    with sessions() as s:
        assert list(s.scalars(sa.select(IdempotencyKey.key))) == ["young-key"]
        assert s.get(Job, first["id"]) is not None  # the job stays; only its key went


def test_the_ttl_comes_from_the_config_file(tmp_path, database_url, world, sessions):
    """config file -> settings -> app: with idempotency_key_ttl_h: 1, a two-hour-old key makes a new job."""
    config = tmp_path / "dlts.yaml"
    config.write_text(json.dumps({"database_url": database_url, "secret_key": "k" * 32, "home": str(tmp_path / "h"),
                                  "idempotency_key_ttl_h": 1}))
    settings = load_settings(config, environ={})
    assert settings.idempotency_key_ttl_h == 1
    app = create_app(settings)
    client = app.test_client()
    try:
        first = post(client, world, JOB, "ttl-key").get_json()
        _age_keys(session_factory(app), 0.5)
        assert post(client, world, JOB, "ttl-key").get_json()["id"] == first["id"]  # within the hour
        _age_keys(session_factory(app), 2)
        assert post(client, world, JOB, "ttl-key").get_json()["id"] != first["id"]
    finally:
        engine_of(app).dispose()


def _http_post(url: str, token: str, body: dict, key: str) -> tuple[int, dict, dict]:
    request = urllib.request.Request(f"{url}/api/v1/jobs", data=json.dumps(body).encode(), method="POST", headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json", "Idempotency-Key": key})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read() or b"{}")


@pytest.mark.parametrize("round_", range(3))
def test_parallel_requests_with_one_key_make_one_job_over_real_http(live, world, sessions, round_):
    threads_n = 8
    key = f"race-{round_}"
    barrier = threading.Barrier(threads_n)
    answers: list[tuple[int, dict, dict]] = []
    lock = threading.Lock()

    def submit():
        barrier.wait(timeout=60)
        answer = _http_post(live.url, world.tokens["alice"], JOB, key)
        with lock:
            answers.append(answer)

    before = job_count(sessions)
    threads = [threading.Thread(target=submit) for _ in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(answers) == threads_n
    assert {status for status, _, _ in answers} == {201}, [a[2] for a in answers if a[0] != 201]
    assert len({body["id"] for _, _, body in answers}) == 1
    assert sum(1 for _, headers, _ in answers if headers.get("Idempotent-Replayed") != "true") == 1
    assert job_count(sessions) == before + 1
    with sessions() as s:
        assert s.scalar(sa.select(sa.func.count(IdempotencyKey.id)).where(IdempotencyKey.key == key)) == 1


def test_parallel_requests_with_one_key_and_different_bodies_make_one_job(live, world, sessions):
    threads_n = 6
    barrier = threading.Barrier(threads_n)
    answers: list[tuple[int, dict, dict]] = []
    lock = threading.Lock()

    def submit(i):
        barrier.wait(timeout=60)
        answer = _http_post(live.url, world.tokens["alice"], JOB | {"command": f"python train.py --seed {i}"}, "mixed")
        with lock:
            answers.append(answer)

    before = job_count(sessions)
    threads = [threading.Thread(target=submit, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    statuses = sorted(status for status, _, _ in answers)
    assert statuses == [201] + [422] * (threads_n - 1), [a[2] for a in answers]
    assert all(body["error"]["code"] == "idempotency_key_reused" for status, _, body in answers if status == 422)
    assert job_count(sessions) == before + 1
