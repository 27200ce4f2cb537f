"""The REST API under /api/v1: flask-smorest blueprints, bearer auth, the error envelope.

The OpenAPI document at /api/v1/openapi.json is generated from the marshmallow schemas that also
validate the requests, so the two cannot drift.
"""

from __future__ import annotations

from flask import Flask
from flask_smorest import Api

from dlts.api import access, cluster, errors, groups, health, jobs, me, nodes, openapi, usage, users, vcs


class DltsApi(Api):
    # the document describes every error answer as the envelope the server sends (dlts.api.errors)
    ERROR_SCHEMA = errors.ErrorEnvelopeSchema


def init_api(app: Flask) -> Api:
    app.config.update(
        API_TITLE="DLTS",
        API_VERSION="v1",
        OPENAPI_VERSION="3.0.3",
        OPENAPI_URL_PREFIX="/api/v1",
        OPENAPI_JSON_PATH="openapi.json",
    )
    api = DltsApi(app, spec_kwargs={"info": {"description": "Deep Learning Training Service REST API"},
                                    "extra_plugins": [openapi.SchemaExtras()]})
    openapi.install(api.ma_plugin)
    api.spec.components.security_scheme("bearer", {"type": "http", "scheme": "bearer"})
    for blueprint in (jobs.blp, me.blp, access.blp, vcs.blp, nodes.blp, nodes.agent_blp, cluster.blp, users.blp, groups.blp, usage.blp):
        api.register_blueprint(blueprint, url_prefix="/api/v1")
    app.register_blueprint(health.bp)
    errors.register(app)  # after Api(): our envelope replaces flask-smorest's error format
    return api
