"""Cluster-wide reads: SKU shapes derived from the nodes table, VCs by name."""

from __future__ import annotations

from collections import Counter

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.models import Node, VirtualCluster
from dlts.scheduler.model import CPU_SKU, SkuShape


def sku_shapes(session: Session) -> dict[str, SkuShape]:
    """The usual shape of a node of each SKU (the most common gpus/cpu/memory among its nodes)."""
    counts: dict[str, Counter] = {}
    for sku, gpus, cpu, memory in session.execute(sa.select(Node.sku, Node.gpus, Node.cpu, Node.memory_bytes)):
        counts.setdefault(sku, Counter())[(gpus, cpu, memory)] += 1
    shapes = {}
    for sku, counter in counts.items():
        (gpus, cpu, memory), _ = counter.most_common(1)[0]
        shapes[sku] = SkuShape(sku, 0 if sku == CPU_SKU else gpus, cpu, memory)
    return shapes


def vc_by_name(session: Session, name: str) -> VirtualCluster | None:
    return session.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == name))
