"""Cluster-wide reads: SKU shapes derived from the nodes table, VCs by name."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.models import Node, User, VirtualCluster
from dlts.scheduler.model import CPU_SKU, SkuShape


def sku_shapes(session: Session) -> dict[str, SkuShape]:
    """The usual shape of a node of each SKU (the most common gpus/cpu/memory among its nodes)."""
    counts: dict[str, Counter] = {}
    shape = (Node.sku, Node.gpus, Node.cpu, Node.memory_bytes)
    # one row per distinct shape, not per node: a submission reads a handful of rows at any cluster size
    for sku, gpus, cpu, memory, n in session.execute(sa.select(*shape, sa.func.count()).group_by(*shape)):
        counts.setdefault(sku, Counter())[(gpus, cpu, memory)] += n
    shapes = {}
    for sku, counter in counts.items():
        (gpus, cpu, memory), _ = counter.most_common(1)[0]
        shapes[sku] = SkuShape(sku, 0 if sku == CPU_SKU else gpus, cpu, memory)
    return shapes


def vc_by_name(session: Session, name: str) -> VirtualCluster | None:
    return session.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == name))


def vc_and_user(session: Session, vc_name: str, user_id: int) -> tuple[VirtualCluster | None, User | None]:
    """A VC by name and a user by id in one round trip (a submission needs both)."""
    row = session.execute(
        sa.select(VirtualCluster, User).select_from(User)
        .outerjoin(VirtualCluster, VirtualCluster.name == vc_name).where(User.id == user_id)
    ).first()
    return (row[0], row[1]) if row else (None, None)


def vc_id_named(session: Session, name: str) -> int | None:
    return session.scalar(sa.select(VirtualCluster.id).where(VirtualCluster.name == name))


def user_id_named(session: Session, name: str) -> int | None:
    return session.scalar(sa.select(User.id).where(User.name == name))


def all_vc_names(session: Session) -> list[str]:
    return list(session.scalars(sa.select(VirtualCluster.name).order_by(VirtualCluster.name)))


def vcs_named(session: Session, names: Sequence[str]) -> list[VirtualCluster]:
    """These VCs, by name."""
    if not names:
        return []
    return list(session.scalars(sa.select(VirtualCluster).where(VirtualCluster.name.in_(list(names)))
                                .order_by(VirtualCluster.name)))


def vc_notices(session: Session, names: Sequence[str]) -> list[tuple[str, str]]:
    """(VC name, notice) of these VCs that have a notice set."""
    return [(name, text or "") for name, text in session.execute(
        sa.select(VirtualCluster.name, VirtualCluster.notice)
        .where(VirtualCluster.name.in_(list(names)), VirtualCluster.notice.is_not(None), VirtualCluster.notice != ""))]


def user_ids_of(session: Session, user_id: int) -> tuple[int | None, int | None]:
    """(uid, gid) of a user."""
    uid, gid = session.execute(sa.select(User.uid, User.gid).where(User.id == user_id)).one()
    return uid, gid
