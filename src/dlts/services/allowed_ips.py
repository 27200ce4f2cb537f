"""Allowed IPs: the addresses a user may reach job endpoints from, each expiring after allow_ip_days.

Entries are IPv4/IPv6 addresses or CIDR networks, validated with ``ipaddress`` and stored in their
canonical form (``10.1.2.3/32``, ``2001:db8::/48``). Adding an entry that exists renews its expiry.
A user manages their own entries; a cluster admin manages anyone's. ``services.allowlist`` turns the
unexpired entries into each node's endpoint firewall; the managers' pass ``allowlist.purge_expired``
(``allowlist.purge_expired_entries``, which calls ``purge_expired`` here) deletes expired ones.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.config import Settings
from dlts.errors import InvalidInput, NotFound, Refused
from dlts.models import AllowedIp, User, iso, utcnow
from dlts.repositories import limits as limits_repo
from dlts.services import policy
from dlts.services.auth import Principal
from dlts.services.transaction import rowcount, step, transactional

MAX_ENTRIES_PER_USER = 64
# wider than these would open endpoints to a large part of the internet
MIN_PREFIX = {4: 8, 6: 32}
# Addresses no client reaches a node's endpoint from, and the reason said to the user. Private
# networks (10/8, 192.168/16, fc00::/7) stay allowed: clusters live on them. Loopback is allowed
# only with the local backend (the demo), where the jobs run on the machine the browser is on.
SPECIAL_NETWORKS = [(ipaddress.ip_network(net), why) for net, why in (
    ("0.0.0.0/8", "is unspecified ('this network'), not an address anyone connects from"),
    ("127.0.0.0/8", "is loopback: only the node itself, never a client, comes from there"),
    ("169.254.0.0/16", "is link-local: it never crosses a router to the cluster"),
    ("224.0.0.0/4", "is multicast, not the address of one client"),
    ("240.0.0.0/4", "is reserved (240.0.0.0/4 and the broadcast address 255.255.255.255) and never a client's"),
    ("::/128", "is unspecified, not an address anyone connects from"),
    ("::1/128", "is loopback: only the node itself, never a client, comes from there"),
    ("::ffff:0:0/96", "is IPv4-mapped: write the IPv4 address itself (e.g. 203.0.113.7)"),
    ("::/96", "is IPv4-compatible (deprecated): write the IPv4 address itself (e.g. 203.0.113.7)"),
    ("fe80::/10", "is link-local: it never crosses a router to the cluster"),
    ("fec0::/10", "is site-local (deprecated), not routed to the cluster"),
    ("ff00::/8", "is multicast, not the address of one client"),
)]


@dataclass(frozen=True)
class AllowedIpView:
    id: int
    user: str
    cidr: str
    created_at: str | None
    expires_at: str | None
    renewed: bool = False


LOOPBACK = [ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")]


def allowed_network(text: str, *, allow_loopback: bool = False) -> str:
    """``text`` (an address or a CIDR network) in canonical CIDR form, once it passes the policy: not
    too wide, not an address nobody connects from; InvalidInput or Refused naming ``ip`` otherwise."""
    if not isinstance(text, str) or not text.strip() or len(text) > 64:
        raise InvalidInput("ip must be an IPv4/IPv6 address or a CIDR network such as 203.0.113.7 or 2001:db8::/48.",
                           details={"field": "ip"})
    if "%" in text:
        raise Refused(f"{text.strip()[:64]!r} has an IPv6 zone id (the part after '%'), which names an interface of "
                      "your own machine; write the address without it, as the cluster sees it.",
                      code="address_not_allowed", details={"field": "ip"})
    try:
        network = ipaddress.ip_network(text.strip(), strict=True)
    except ValueError as exc:
        if "has host bits set" in str(exc):
            suggestion = ipaddress.ip_network(text.strip(), strict=False)
            raise InvalidInput(f"{text.strip()} has host bits set; did you mean {suggestion}?",
                               details={"field": "ip", "suggestion": str(suggestion)}) from None
        raise InvalidInput(f"{text.strip()[:64]!r} is not an IPv4/IPv6 address or CIDR network (e.g. 203.0.113.7, "
                           "198.51.100.0/24, 2001:db8::/48).",
                           details={"field": "ip"}) from None
    if network.prefixlen < MIN_PREFIX[network.version]:
        raise Refused(f"{network} is too wide: allow at most a /{MIN_PREFIX[network.version]} network for IPv{network.version}.",
                      code="network_too_wide", details={"field": "ip", "min_prefix": MIN_PREFIX[network.version]})
    loopback = any(network.version == net.version and network.subnet_of(net) for net in LOOPBACK)  # type: ignore[arg-type]
    for special, why in SPECIAL_NETWORKS if not (allow_loopback and loopback) else ():
        if network.version == special.version and network.overlaps(special):
            raise Refused(f"{network} {why}; allow the public or private address your connections come from.",
                          code="address_not_allowed", details={"field": "ip", "network": str(special)})
    return str(network) if network.num_addresses > 1 else f"{network.network_address}/{network.prefixlen}"


def _user(session: Session, principal: Principal, user_name: str | None, what: str) -> User:
    name = user_name or principal.name
    policy.require_self_or_cluster_admin(principal, name, what)
    user = session.scalar(sa.select(User).where(User.name == name))
    if user is None:
        raise NotFound(f"No user named {name[:64]!r}.", code="user_not_found")
    return user


def list_entries(session: Session, principal: Principal, user_name: str | None = None, *,
                 include_expired: bool = False) -> list[AllowedIpView]:
    user = _user(session, principal, user_name, "read the allowed IPs")
    query = sa.select(AllowedIp).where(AllowedIp.user_id == user.id).order_by(AllowedIp.id)
    if not include_expired:
        query = query.where(AllowedIp.expires_at > utcnow())
    return [AllowedIpView(r.id, user.name, r.cidr, iso(r.created_at), iso(r.expires_at)) for r in session.scalars(query)]


@transactional
def add_entry(session: Session, settings: Settings, principal: Principal, ip: str, user_name: str | None = None) -> AllowedIpView:
    cidr = allowed_network(ip, allow_loopback=settings.backend == "local")
    user = _user(session, principal, user_name, "change the allowed IPs")
    # the cap is counted under the user's row lock: parallel adds count one after the other
    limits_repo.lock(session, User.id, user.id, touch=User.created_at)
    now = utcnow()
    expires = now + dt.timedelta(days=settings.allow_ip_days)
    row = session.scalar(sa.select(AllowedIp).where(AllowedIp.user_id == user.id, AllowedIp.cidr == cidr))
    if row is not None:
        row.expires_at = expires
        return AllowedIpView(row.id, user.name, cidr, iso(row.created_at), iso(expires), renewed=True)
    count = session.execute(sa.select(sa.func.count(AllowedIp.id))
                            .where(AllowedIp.user_id == user.id, AllowedIp.expires_at > now)).scalar_one()
    if count >= MAX_ENTRIES_PER_USER:
        raise Refused(f"{user.name} has {count} allowed IPs, the most allowed is {MAX_ENTRIES_PER_USER}; delete one first.",
                      code="too_many_allowed_ips", details={"max": MAX_ENTRIES_PER_USER})
    row = AllowedIp(user_id=user.id, cidr=cidr, created_at=now, expires_at=expires)
    session.add(row)
    session.flush()  # its id
    return AllowedIpView(row.id, user.name, cidr, iso(row.created_at), iso(row.expires_at))


@transactional
def delete_entry(session: Session, principal: Principal, entry_id: int) -> None:
    row = session.get(AllowedIp, entry_id)
    if row is None or (row.user_id != principal.user_id and not principal.is_cluster_admin):
        raise NotFound(f"No allowed IP with id {entry_id} that you may delete.", code="allowed_ip_not_found")
    session.delete(row)



def purge_expired(session: Session, now: dt.datetime | None = None) -> int:
    with step(session):  # the managers' pass: its own transaction, committed
        result = session.execute(sa.delete(AllowedIp).where(AllowedIp.expires_at <= (now or utcnow())))
    return int(rowcount(result) or 0)
