"""/api/v1/me: who am I (name, uid, gid), my roles, my VCs and my GPU use in each."""

from __future__ import annotations

from dlts.api.auth import authenticate, principal
from dlts.api.blueprint import Blueprint
from dlts.api.schemas import MeSchema
from dlts.extensions import db
from dlts.services import users as user_service

blp = Blueprint("me", __name__, description="The calling user")
blp.before_request(authenticate)


@blp.route("/me")
@blp.response(200, MeSchema)
@blp.doc(security=[{"bearer": []}])
def me():
    return user_service.me(db.session(), principal())
