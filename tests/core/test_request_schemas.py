"""The submit schema builds the use-case's request (``post_load``): the API, the portal's form and
``dlts render`` all load a body through ``dlts.schemas.JobSubmitSchema`` and get a ``JobRequest``.

A field added to the schema and not to ``JobRequest`` (or the other way round) fails here, not as a
500 (``JobRequest(**data)`` refusing an unknown keyword) on the first submit that sends it."""

from __future__ import annotations

import dataclasses

import pytest
from marshmallow import ValidationError

from dlts.models import JobType
from dlts.schemas import JobSubmitSchema
from dlts.services.jobs import JobRequest

RENAMED = {"memory": "memory_bytes"}  # the body's name -> the request's


def test_every_schema_field_is_a_request_field_and_back():
    schema_fields = {RENAMED.get(name, name) for name in JobSubmitSchema().load_fields}
    request_fields = {f.name for f in dataclasses.fields(JobRequest)}
    assert schema_fields == request_fields


def test_a_body_with_every_field_loads_into_the_request():
    body = {"name": "train", "vc": "vision", "image": "pytorch/pytorch:2.3", "command": "python train.py",
            "type": "inference", "gpus": 2, "sku": "a100", "cpu": 4.5, "memory": "16Gi", "nodes": 0,
            "preemptible": True, "max_retries": 2, "max_time_s": 3600, "priority": 200, "env": {"SEED": "1"},
            "ports": [8080], "ssh": True, "ib_domain": "any", "min_replicas": 1, "max_replicas": 3,
            "ephemeral_storage_bytes": "20Gi", "run_as_root": True, "tags": ["Exp", "exp", "v2"]}
    assert set(body) == set(JobSubmitSchema().load_fields)  # the body above says every field
    req = JobSubmitSchema().load(body)
    assert isinstance(req, JobRequest)
    assert req == JobRequest(
        vc="vision", image="pytorch/pytorch:2.3", command="python train.py", name="train", type=JobType.INFERENCE,
        gpus=2, sku="a100", cpu=4.5, memory_bytes=16 * 2**30, nodes=0, preemptible=True, max_retries=2,
        max_time_s=3600, priority=200, env={"SEED": "1"}, ports=(8080,), ssh=True, ib_domain="any", min_replicas=1,
        max_replicas=3, ephemeral_storage_bytes=20 * 2**30, run_as_root=True, tags=("exp", "v2"))


def test_the_least_body_takes_the_request_defaults():
    req = JobSubmitSchema().load({"vc": "vision", "image": "debian:12", "command": "true"})
    assert req == JobRequest(vc="vision", image="debian:12", command="true")


def test_an_unknown_field_is_refused_by_the_schema_not_the_request():
    with pytest.raises(ValidationError) as caught:
        JobSubmitSchema().load({"vc": "vision", "image": "debian:12", "command": "true", "gpu": 1})
    assert "gpu" in caught.value.messages
