"""/api/v1/cluster/status, /api/v1/storage/usage and /storage/snapshots: cluster-wide reads for any signed-in user,
each scoped to what the reader may see."""

from __future__ import annotations

from dataclasses import asdict

from flask import Response

from dlts.api.auth import authenticate, principal
from dlts.api.blueprint import CSV, Blueprint
from dlts.api.schemas import (
    ClusterStatusSchema,
    StorageArgs,
    StorageSnapshotArgs,
    StorageSnapshotListSchema,
    StorageUsageSchema,
)
from dlts.extensions import db
from dlts.services import cluster as cluster_service
from dlts.services import storage as storage_service

blp = Blueprint("cluster", __name__, description="Cluster status and storage usage")
blp.before_request(authenticate)
SECURITY: list[dict[str, list[str]]] = [{"bearer": []}]


@blp.route("/cluster/status")
@blp.response(200, ClusterStatusSchema)
@blp.doc(security=SECURITY)
def cluster_status():
    """Capacity and use per SKU, and per VC for the VCs you belong to (cluster admins: all); per SKU,
    how many nodes have 0..N GPUs free."""
    return asdict(cluster_service.status(db.session(), principal()))


@blp.route("/storage/usage")
@blp.arguments(StorageArgs, location="query")
@blp.response(200, StorageUsageSchema, content_type="application/json")
@blp.alt_response(200, schema=CSV, content_type="text/csv", success=True,
                  description="JSON; with ?format=csv the same rows as CSV (an attachment)")
@blp.doc(security=SECURITY)
def storage_usage(args):
    """The last storage scan: bytes and files by mount, VC and user (?format=csv for a spreadsheet). Cluster
    admins see every row, VC admins their VCs' rows, members their VCs' totals and their own rows."""
    report = storage_service.last_scan(db.session(), principal(), mount=args.get("mount"), vc=args.get("vc"),
                                       user=args.get("user"))
    if args["format"] == "csv":
        return Response(storage_service.to_csv(report), mimetype="text/csv",
                        headers={"Content-Disposition": 'attachment; filename="storage-usage.csv"'})
    return report


@blp.route("/storage/snapshots")
@blp.arguments(StorageSnapshotArgs, location="query")
@blp.response(200, StorageSnapshotListSchema)
@blp.doc(security=SECURITY)
def storage_snapshots(args):
    """The storage manager's scans, newest first: per root when, how long, how it ended (complete,
    hung, timeout, failed), totals, the file system's fill, the biggest directories, the oldest files (the
    paths and the message: cluster admins only)."""
    return {"items": storage_service.list_snapshots(db.session(), principal(), root=args.get("root"), limit=args["limit"])}
