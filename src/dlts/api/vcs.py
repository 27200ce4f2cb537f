"""/api/v1/vcs: virtual clusters (quota, usage per SKU, per-user use, policy, limits, storage), their
registry credentials and their history."""

from __future__ import annotations

from flask import current_app
from flask.views import MethodView

from dlts.api import pagination
from dlts.api.auth import authenticate, principal
from dlts.api.blueprint import Blueprint
from dlts.api.schemas import (
    MemberListSchema,
    MemberRemovalSchema,
    MemberRemoveArgs,
    MemberSchema,
    PageArgs,
    RegistryCredentialCreateSchema,
    RegistryCredentialListSchema,
    RegistryCredentialSchema,
    RoleSchema,
    VcCreateSchema,
    VcEventPageSchema,
    VcPageSchema,
    VcPatchSchema,
    VcSchema,
    VcStorageSchema,
)
from dlts.extensions import db, settings_of
from dlts.services import members, registry_credentials
from dlts.services import vcs as vc_service

blp = Blueprint("vcs", __name__, description="Virtual clusters")
blp.before_request(authenticate)
SECURITY: list[dict[str, list[str]]] = [{"bearer": []}]


@blp.route("/vcs")
class Vcs(MethodView):
    @blp.arguments(PageArgs, location="query")
    @blp.response(200, VcPageSchema)
    @blp.doc(security=SECURITY)
    def get(self, args):
        """The VCs you belong to (all of them for a cluster admin), by name."""
        after = pagination.decode("v", args.get("cursor"))
        items = vc_service.list_vcs(db.session(), settings_of(current_app), principal(), after_name=after, limit=args["limit"] + 1)
        page = items[: args["limit"]]
        return {"items": page, "next_cursor": pagination.encode("v", page[-1].name) if len(items) > args["limit"] else None}

    @blp.arguments(VcCreateSchema)
    @blp.response(201, VcSchema)
    @blp.doc(security=SECURITY)
    def post(self, body):
        """Create a VC (cluster admin)."""
        return vc_service.create_vc(db.session(), settings_of(current_app), principal(), vc_service.VcSpec(**body))


@blp.route("/vcs/<string:name>")
class Vc(MethodView):
    @blp.response(200, VcSchema)
    @blp.doc(security=SECURITY)
    def get(self, name: str):
        """One VC: quota and use per SKU, per-user use, policy and limits (members)."""
        return vc_service.get_vc(db.session(), settings_of(current_app), principal(), name)

    @blp.arguments(VcPatchSchema)
    @blp.response(200, VcSchema)
    @blp.doc(security=SECURITY)
    def patch(self, body, name: str):
        """Change settings (VC admin: policy, limits, fair share and preemption budget; cluster admin: quota); null
        clears a setting back to its default. Applies at the next tick."""
        return vc_service.update_vc(db.session(), settings_of(current_app), principal(), name, body)

    @blp.response(204)
    @blp.doc(security=SECURITY)
    def delete(self, name: str):
        """Delete a VC with no unfinished jobs (cluster admin)."""
        vc_service.delete_vc(db.session(), principal(), name)


@blp.route("/vcs/<string:name>/events")
@blp.arguments(PageArgs, location="query")
@blp.response(200, VcEventPageSchema)
@blp.doc(security=SECURITY)
def vc_events(args, name: str):
    """Who changed which setting of the VC, newest first."""
    before = pagination.decode_int("ve", args.get("cursor"))
    items = vc_service.events(db.session(), principal(), name, before_id=before, limit=args["limit"] + 1)
    page = items[: args["limit"]]
    return {"items": page, "next_cursor": pagination.encode("ve", page[-1].id) if len(items) > args["limit"] else None}


@blp.route("/vcs/<string:name>/members")
@blp.response(200, MemberListSchema)
@blp.doc(security=SECURITY)
def vc_members(name: str):
    """The VC's members and admins (members of the VC), each with their direct role and their groups'."""
    return {"items": members.list_members(db.session(), principal(), name), "next_cursor": None}


@blp.route("/vcs/<string:name>/members/<string:user_name>")
class VcMember(MethodView):
    @blp.arguments(RoleSchema)
    @blp.response(200, MemberSchema)
    @blp.doc(security=SECURITY)
    def put(self, body, name: str, user_name: str):
        """Make the user a `member` or an `admin` of the VC; idempotent (VC admin). A VC event records it."""
        return members.put_member(db.session(), principal(), name, user_name, body["role"])[0]

    @blp.arguments(MemberRemoveArgs, location="query")
    @blp.response(200, MemberRemovalSchema)
    @blp.doc(security=SECURITY)
    def delete(self, args, name: str, user_name: str):
        """Remove the user's membership (VC admin): running jobs finish, waiting jobs are kept or killed
        (`?queued=keep|kill`, default keep); the answer lists them."""
        return members.remove_member(db.session(), principal(), name, user_name, args["queued"])


@blp.route("/vcs/<string:name>/storage", methods=["PUT"])
@blp.arguments(VcStorageSchema)
@blp.response(200, VcSchema)
@blp.doc(security=SECURITY)
def put_vc_storage(body, name: str):
    """Replace the VC's whole storage document: NFS exports, host directories, users' homes, Lustre (cluster
    admin). Attempts launched from now on mount it."""
    return vc_service.set_storage(db.session(), settings_of(current_app), principal(), name, body)


@blp.route("/vcs/<string:name>/registry-credentials")
class VcRegistryCredentials(MethodView):
    @blp.response(200, RegistryCredentialListSchema)
    @blp.doc(security=SECURITY)
    def get(self, name: str):
        """The VC's registry credentials (VC admins); never the passwords."""
        return {"items": registry_credentials.list_vc(db.session(), principal(), name), "next_cursor": None}

    @blp.arguments(RegistryCredentialCreateSchema)
    @blp.response(201, RegistryCredentialSchema)
    @blp.doc(security=SECURITY)
    def post(self, body, name: str):
        """Add a registry login every job of the VC pulls its image with (VC admins); the password is stored
        encrypted and never returned."""
        return registry_credentials.add_vc(db.session(), settings_of(current_app).secret_key, principal(), name,
                                           body["server"], body["username"], body["password"])


@blp.route("/vcs/<string:name>/registry-credentials/<int(max=4611686018427387904):credential_id>", methods=["DELETE"])
@blp.response(204)
@blp.doc(security=SECURITY)
def delete_vc_registry_credential(name: str, credential_id: int):
    """Remove one of the VC's registry credentials (VC admins)."""
    registry_credentials.delete_vc(db.session(), principal(), name, credential_id)
