"""/api/v1/me: who am I (name, uid, gid), my roles, my VCs and my GPU use in each."""

from __future__ import annotations

import sqlalchemy as sa

from dlts.api.auth import authenticate, principal
from dlts.api.blueprint import Blueprint
from dlts.api.schemas import MeSchema
from dlts.extensions import db
from dlts.models import User, VirtualCluster
from dlts.services.jobs import user_gpus_in_vc

blp = Blueprint("me", __name__, description="The calling user")
blp.before_request(authenticate)


@blp.route("/me")
@blp.response(200, MeSchema)
@blp.doc(security=[{"bearer": []}])
def me():
    who = principal()
    vcs = db.session.scalars(sa.select(VirtualCluster).where(VirtualCluster.name.in_(who.vcs))
                             .order_by(VirtualCluster.name)) if who.vcs else []
    uid, gid = db.session.execute(sa.select(User.uid, User.gid).where(User.id == who.user_id)).one()
    return {
        "name": who.name,
        "uid": uid,
        "gid": gid,
        "cluster_admin": who.is_cluster_admin,
        "vcs": [{"name": vc.name, "roles": sorted(r.value for r in who.vc_roles[vc.name]), "quota": vc.quota,
                 "user_gpu_quota": vc.user_gpu_quota, "gpus_used": user_gpus_in_vc(db.session, who.user_id, vc.id)}
                for vc in vcs],
    }
