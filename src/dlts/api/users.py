"""/api/v1/users: user administration (cluster admins): list, create, read, change (uid, gid, e-mail,
cluster admin), disable, enable, reset the portal password."""

from __future__ import annotations

from flask.views import MethodView

from dlts.api import pagination
from dlts.api.auth import authenticate, principal
from dlts.api.blueprint import Blueprint
from dlts.api.schemas import (
    PasswordResetSchema,
    PasswordResultSchema,
    UserCreatedSchema,
    UserCreateSchema,
    UserDisabledSchema,
    UserDisableSchema,
    UserEnabledSchema,
    UserListArgs,
    UserPageSchema,
    UserPatchSchema,
    UserSchema,
)
from dlts.extensions import db
from dlts.services import users

blp = Blueprint("users", __name__, description="Users (cluster admins)")
blp.before_request(authenticate)
SECURITY: list[dict[str, list[str]]] = [{"bearer": []}]


@blp.route("/users")
class Users(MethodView):
    @blp.arguments(UserListArgs, location="query")
    @blp.response(200, UserPageSchema)
    @blp.doc(security=SECURITY)
    def get(self, args):
        """Every user by name (cluster admin); `q` filters by part of the name, `disabled` by state."""
        after = pagination.decode("u", args.get("cursor"))
        items = users.list_users(db.session(), principal(), after_name=after, limit=args["limit"] + 1,
                                 query=args.get("q"), disabled=args.get("disabled"))
        page = items[: args["limit"]]
        return {"items": page, "next_cursor": pagination.encode("u", page[-1].name) if len(items) > args["limit"] else None}

    @blp.arguments(UserCreateSchema)
    @blp.response(201, UserCreatedSchema)
    @blp.doc(security=SECURITY)
    def post(self, body):
        """Create a user (cluster admin); `generate_password: true` answers a portal password once."""
        view, shown = users.create(db.session(), principal(), body["name"], email=body.get("email"), uid=body.get("uid"),
                                   gid=body.get("gid"), cluster_admin=body["cluster_admin"],
                                   password=body.get("password"), generate_password=body["generate_password"])
        return {**view.__dict__, "password": shown}


@blp.route("/users/<string:user_name>")
class OneUser(MethodView):
    @blp.response(200, UserSchema)
    @blp.doc(security=SECURITY)
    def get(self, user_name: str):
        """One user: identity, roles, groups, state (cluster admin)."""
        return users.get(db.session(), principal(), user_name)

    @blp.arguments(UserPatchSchema)
    @blp.response(200, UserSchema)
    @blp.doc(security=SECURITY)
    def patch(self, body, user_name: str):
        """Set the uid and gid the user's jobs run as (both set or both null; attempts launched from now on),
        the e-mail, or the cluster admin role (cluster admin)."""
        return users.update(db.session(), principal(), user_name, body)


@blp.route("/users/<string:user_name>/disable", methods=["POST"])
@blp.arguments(UserDisableSchema, required=False)
@blp.response(200, UserDisabledSchema)
@blp.doc(security=SECURITY)
def disable_user(body, user_name: str):
    """Disable the user (cluster admin): tokens revoked, portal sessions ended, waiting jobs held; running
    jobs run on."""
    return users.disable(db.session(), principal(), user_name, body.get("reason"))


@blp.route("/users/<string:user_name>/enable", methods=["POST"])
@blp.response(200, UserEnabledSchema)
@blp.doc(security=SECURITY)
def enable_user(user_name: str):
    """Enable the user again (cluster admin); jobs held by the disable go back to the queue."""
    return users.enable(db.session(), principal(), user_name)


@blp.route("/users/<string:user_name>/password", methods=["POST"])
@blp.arguments(PasswordResetSchema, required=False)
@blp.response(200, PasswordResultSchema)
@blp.doc(security=SECURITY)
def reset_password(body, user_name: str):
    """Set the user's portal password, or (without `password`) generate one answered this once (cluster admin).
    Every portal session of the user ends."""
    return users.reset_password(db.session(), principal(), user_name, body.get("password"))
