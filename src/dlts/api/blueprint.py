"""The API's Blueprint: flask-smorest's, with request bodies parsed by ``dlts.strict.loads_json``.

webargs reads JSON with plain ``json.loads``, which takes ``NaN``, ``Infinity``, ``1e400`` (as
infinity), lone surrogates and any depth; MariaDB's ``json_valid`` CHECK refuses those later (a
503), SQLite stores them. Here they are a 400 ``invalid_json`` naming the field, before any schema
or service sees the body.
"""

from __future__ import annotations

import typing

import flask
import flask_smorest
from webargs import core
from webargs.flaskparser import FlaskParser, is_json_request

from dlts.strict import loads_json


class StrictJsonParser(FlaskParser):
    def _raw_load_json(self, req: flask.Request) -> typing.Any:
        if not is_json_request(req):
            return core.missing
        return loads_json(req.get_data(cache=True))


class Blueprint(flask_smorest.Blueprint):
    ARGUMENTS_PARSER = StrictJsonParser()
