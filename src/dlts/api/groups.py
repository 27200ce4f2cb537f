"""/api/v1/groups: groups of users and the VC roles they carry (cluster admins)."""

from __future__ import annotations

from flask.views import MethodView

from dlts.api import pagination
from dlts.api.auth import authenticate, principal
from dlts.api.blueprint import Blueprint
from dlts.api.schemas import (
    GroupCreateSchema,
    GroupPageSchema,
    GroupSchema,
    PageArgs,
    RoleSchema,
)
from dlts.extensions import db
from dlts.services import groups

blp = Blueprint("groups", __name__, description="Groups and their VC roles (cluster admins)")
blp.before_request(authenticate)
SECURITY: list[dict[str, list[str]]] = [{"bearer": []}]


@blp.route("/groups")
class Groups(MethodView):
    @blp.arguments(PageArgs, location="query")
    @blp.response(200, GroupPageSchema)
    @blp.doc(security=SECURITY)
    def get(self, args):
        """Every group by name, with its members and VC roles (cluster admin)."""
        after = pagination.decode("g", args.get("cursor"))
        items = groups.list_groups(db.session(), principal(), after_name=after, limit=args["limit"] + 1)
        page = items[: args["limit"]]
        return {"items": page, "next_cursor": pagination.encode("g", page[-1].name) if len(items) > args["limit"] else None}

    @blp.arguments(GroupCreateSchema)
    @blp.response(201, GroupSchema)
    @blp.doc(security=SECURITY)
    def post(self, body):
        """Create an empty group (cluster admin)."""
        return groups.create(db.session(), principal(), body["name"])


@blp.route("/groups/<string:group_name>")
class OneGroup(MethodView):
    @blp.response(200, GroupSchema)
    @blp.doc(security=SECURITY)
    def get(self, group_name: str):
        """One group: members and VC roles (cluster admin)."""
        return groups.get(db.session(), principal(), group_name)

    @blp.response(204)
    @blp.doc(security=SECURITY)
    def delete(self, group_name: str):
        """Delete the group; its users lose what they held only through it (cluster admin)."""
        groups.delete(db.session(), principal(), group_name)


@blp.route("/groups/<string:group_name>/members/<string:user_name>")
class GroupMember(MethodView):
    @blp.response(200, GroupSchema)
    @blp.doc(security=SECURITY)
    def put(self, group_name: str, user_name: str):
        """Add the user to the group; idempotent (cluster admin). 409 for a group from the directory."""
        return groups.add_user(db.session(), principal(), group_name, user_name)[0]

    @blp.response(200, GroupSchema)
    @blp.doc(security=SECURITY)
    def delete(self, group_name: str, user_name: str):
        """Remove the user from the group (cluster admin)."""
        return groups.remove_user(db.session(), principal(), group_name, user_name)


@blp.route("/groups/<string:group_name>/vcs/<string:vc_name>")
class GroupVcRole(MethodView):
    @blp.arguments(RoleSchema)
    @blp.response(200, GroupSchema)
    @blp.doc(security=SECURITY)
    def put(self, body, group_name: str, vc_name: str):
        """Make every user of the group a `member` or an `admin` of the VC for as long as they are in it
        (cluster admin)."""
        return groups.put_vc_role(db.session(), principal(), group_name, vc_name, body["role"])[0]

    @blp.response(200, GroupSchema)
    @blp.doc(security=SECURITY)
    def delete(self, group_name: str, vc_name: str):
        """Take the group's role on the VC away (cluster admin)."""
        return groups.delete_vc_role(db.session(), principal(), group_name, vc_name)
