"""The endpoint allowlist: which sources may reach which job endpoint ports, as the node agents enforce it.

A READY endpoint of a RUNNING job (row status ready and row.attempt == job.attempt) is reachable at
``host_port`` on every node (a Kubernetes NodePort is open on all of them). ``desired_state`` lists,
for each such port inside ``endpoint_port_range``, the job owner's active allowed IPs plus the
cluster-wide ``endpoint_allow_cidrs``. The agents drop TCP to the guarded range unless the pair
(source, port) is listed (docs/agent.md, "Endpoint firewall"), so a port nobody may reach is simply
absent. The structure is stable (sorted, networks collapsed so that no two overlap, which nftables'
interval sets refuse) and carries the SHA-256 of its content as ``version``: agents re-apply only
when it changes. The node report response delivers it (services/nodes.py).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.config import Settings
from dlts.models import AllowedIp, EndpointStatus, Job, JobEndpoint, JobStatus, utcnow
from dlts.services import allowed_ips

log = logging.getLogger(__name__)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def collapse(networks: Iterable[Network]) -> list[str]:
    """IPv4 then IPv6, each collapsed (contained and adjacent networks merged) and sorted."""
    out: list[str] = []
    networks = list(networks)
    v4 = [n for n in networks if isinstance(n, ipaddress.IPv4Network)]
    v6 = [n for n in networks if isinstance(n, ipaddress.IPv6Network)]
    out.extend(str(n) for n in ipaddress.collapse_addresses(v4))
    out.extend(str(n) for n in ipaddress.collapse_addresses(v6))
    return out


def desired_state(session: Session, settings: Settings, now: Any = None) -> dict[str, Any]:
    """``{"version", "port_range": [lo, hi], "rules": [{"port", "cidrs"}]}`` in one query."""
    low, high = settings.endpoint_port_range
    query = (
        sa.select(JobEndpoint.host_port, AllowedIp.cidr)
        .join(Job, sa.and_(Job.id == JobEndpoint.job_id, Job.attempt == JobEndpoint.attempt))
        .outerjoin(AllowedIp, sa.and_(AllowedIp.user_id == Job.user_id, AllowedIp.expires_at > (now or utcnow())))
        .where(JobEndpoint.status == EndpointStatus.READY, Job.status == JobStatus.RUNNING,
               JobEndpoint.host_port.between(low, high))
    )
    cluster = [ipaddress.ip_network(c) for c in settings.endpoint_allow_cidrs]
    ports: dict[int, list[Network]] = {}
    for port, cidr in session.execute(query):
        assert port is not None  # the range condition leaves out endpoints without a host port
        sources = ports.setdefault(int(port), list(cluster))
        if cidr is not None:
            try:
                sources.append(ipaddress.ip_network(cidr, strict=False))
            except ValueError:  # rows are validated on the way in; a hand-edited one must not stop every node
                log.warning("allowed_ips holds %r, which is not a network; it is left out of the endpoint firewall", cidr)
    rules = [{"port": port, "cidrs": cidrs} for port, cidrs in
             ((port, collapse(sources)) for port, sources in sorted(ports.items())) if cidrs]
    content = {"port_range": [low, high], "rules": rules}
    version = hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return {"version": version, **content}


def purge_expired_entries(sessions: Callable[[], Session]) -> int:
    """The managers' ``allowlist.purge_expired`` pass: delete allowed IPs past their expiry.

    Expired entries already leave the firewall at once (``desired_state`` reads only active ones);
    this keeps the table small.
    """
    with sessions() as session:
        purged = allowed_ips.purge_expired(session)
    if purged:
        log.info("purged %d expired allowed IP(s)", purged)
    return purged
