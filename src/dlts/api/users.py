"""/api/v1/users/{name}: a user's POSIX identity (uid, gid), set by cluster admins."""

from __future__ import annotations

from dlts.api.auth import authenticate, principal
from dlts.api.blueprint import Blueprint
from dlts.api.schemas import UserPatchSchema, UserSchema
from dlts.extensions import db
from dlts.services import admin

blp = Blueprint("users", __name__, description="Users (cluster admins)")
blp.before_request(authenticate)


@blp.route("/users/<string:user_name>", methods=["PATCH"])
@blp.arguments(UserPatchSchema)
@blp.response(200, UserSchema)
@blp.doc(security=[{"bearer": []}])
def patch_user(body, user_name: str):
    """Set the uid and gid the user's jobs run as (cluster admin); both set or both null. Applies to attempts
    launched from now on."""
    return admin.update_user(db.session, principal(), user_name, body)
