"""The request half of the API's contract: a required body is required, JSON types are not coerced,
and a 405 names the methods the resource takes (docs/api.md, "Request bodies")."""

from __future__ import annotations

import pytest

from dlts.services import nodes as node_service

from .helpers import assert_envelope

STORAGE = {"nfs": [{"name": "datasets", "server": "10.0.0.5", "path": "/export/datasets", "mount_path": "/datasets",
                    "read_only": True}]}
JOB = {"vc": "vision", "image": "debian:12", "command": "true"}


@pytest.mark.parametrize("body", [None, b"", b"  \n"], ids=["no-body", "empty", "whitespace"])
def test_a_storage_put_without_a_body_is_refused_and_the_vcs_storage_is_unchanged(client, world, body):
    admin = world.auth("admin")
    assert client.put("/api/v1/vcs/vision/storage", json=STORAGE, headers=admin).status_code == 200
    before = client.get("/api/v1/vcs/vision", headers=admin).get_json()["storage"]
    assert before["nfs"], before  # the document this test must not lose
    headers = {**admin, "Content-Type": "application/json"} if body is not None else admin
    error = assert_envelope(client.put("/api/v1/vcs/vision/storage", data=body, headers=headers), 400, "body_required")
    assert "PUT /api/v1/vcs/vision/storage needs a JSON body" in error["message"]
    assert error["details"]["fields"] == {"body": ["Missing data for required body."]}
    assert client.get("/api/v1/vcs/vision", headers=admin).get_json()["storage"] == before
    # an explicit empty document still replaces it: that is a body, and what was asked
    assert client.put("/api/v1/vcs/vision/storage", json={}, headers=admin).status_code == 200
    assert not client.get("/api/v1/vcs/vision", headers=admin).get_json()["storage"].get("nfs")


def test_a_submit_without_a_body_is_refused_and_queues_nothing(client, world):
    alice = world.auth("alice")
    before = client.get("/api/v1/jobs", headers=alice).get_json()["items"]
    assert_envelope(client.post("/api/v1/jobs", headers=alice), 400, "body_required")
    assert client.get("/api/v1/jobs", headers=alice).get_json()["items"] == before


def test_an_operation_whose_fields_all_have_defaults_takes_no_body(client, world):
    admin = world.auth("admin")
    paused = client.post("/api/v1/repair/pause", headers=admin)
    assert paused.status_code == 200, paused.get_data(as_text=True)
    assert client.post("/api/v1/repair/resume", headers=admin).status_code == 200


def test_the_document_says_which_bodies_are_required(client):
    spec = client.get("/api/v1/openapi.json").get_json()
    assert spec["paths"]["/api/v1/vcs/{name}/storage"]["put"]["requestBody"]["required"] is True
    assert spec["paths"]["/api/v1/jobs"]["post"]["requestBody"]["required"] is True
    assert spec["paths"]["/api/v1/repair/pause"]["post"]["requestBody"]["required"] is False


@pytest.mark.parametrize(("field", "value"), [("preemptible", "true"), ("preemptible", 1), ("ssh", "yes"),
                                              ("gpus", "1"), ("gpus", 1.5), ("gpus", True), ("max_time_s", "600")])
def test_json_types_are_not_coerced(client, world, field, value):
    error = assert_envelope(client.post("/api/v1/jobs", json={**JOB, field: value}, headers=world.auth("alice")), 400,
                            "invalid_input")
    assert field in error["details"]["fields"], error


def test_nested_and_listed_values_are_checked_too(client, world, sessions):
    batch = {"action": "kill", "ids": [1, "2"]}
    error = assert_envelope(client.post("/api/v1/jobs:batch", json=batch, headers=world.auth("alice")), 400)
    assert error["details"]["fields"] == {"ids": {"1": ["Not a valid integer: send a JSON integer, not a string, "
                                                         "a fraction or a boolean."]}}
    with sessions() as s:
        token = node_service.issue_node_token(s, "testnode")
    report = {"schema_version": 1, "node": "testnode", "agent_version": "1.0", "heartbeat_at": "2026-11-29T20:00:00.000Z",
              "boot_id": "b1", "collectors": {"gpu": {"status": "ok", "errors": []}}, "findings": [],
              "metrics": {"gpu_count": 4, "load1": "0.5"}, "order_results": []}
    error = assert_envelope(client.post("/api/v1/nodes/testnode/report", json=report,
                                        headers={"Authorization": f"Bearer {token}"}), 400)
    assert error["details"]["fields"] == {"metrics": {"load1": ["Not a valid number: send a JSON number, not a "
                                                                "string or a boolean."]}}


def test_the_right_types_pass(client, world):
    job = client.post("/api/v1/jobs", json={**JOB, "preemptible": True, "max_time_s": 600}, headers=world.auth("alice"))
    assert job.status_code == 201, job.get_data(as_text=True)
    assert job.get_json()["preemptible"] is True


def test_a_405_names_the_methods_the_resource_takes(client, world):
    response = client.delete("/api/v1/jobs", headers=world.auth("alice"))
    assert_envelope(response, 405, "method_not_allowed")
    allowed = {m.strip() for m in response.headers["Allow"].split(",")}
    assert {"GET", "POST"} <= allowed and "DELETE" not in allowed


DIGITS = {"arabic-indic": "\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669",
          "fullwidth": "\uff10\uff11\uff12\uff13\uff14\uff15\uff16\uff17\uff18\uff19",
          "superscript": "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079"}


@pytest.mark.parametrize("script", sorted(DIGITS))
def test_ids_in_paths_are_ascii_digits(client, world, script):
    alice = world.auth("alice")
    job = client.post("/api/v1/jobs", json=JOB, headers=alice).get_json()["id"]
    other = str(job).translate(str.maketrans("0123456789", DIGITS[script]))  # the same id in other digits
    assert client.get(f"/api/v1/jobs/{job}", headers=alice).status_code == 200
    assert_envelope(client.get(f"/api/v1/jobs/{other}", headers=alice), 404)
    assert_envelope(client.put(f"/api/v1/jobs/{other}/tags", json={"tags": []}, headers=alice), 404)
    # the portal's routes too (signed out, a route that exists sends to the sign-in page)
    assert client.get(f"/jobs/{job}").status_code in (302, 303)
    assert client.get(f"/jobs/{other}").status_code == 404
