"""Directory sync: users (name, uid, gid, e-mail) and groups from LDAP, and the VC roles the settings map
groups to. ``dlts directory sync [--dry-run]`` runs it once; ``dlts managers`` every
``directory.interval_s`` when ``directory.url`` is set (docs/administration.md).

One sync is one transaction, planned and written together (a dry run rolls it back, so it reports
exactly what a real run would do):

- Users in the directory that DLTS lacks are created (``source: directory``); users DLTS has under the
  same name are adopted. Their uid, gid and e-mail follow the directory (a uid another DLTS user holds,
  a system id below 1000 or an entry with a name DLTS cannot use is skipped and reported).
- Users missing from the directory are **disabled, never deleted** (``services.users.hold_user``:
  tokens revoked, portal sessions ended, waiting jobs held), reason ``missing from the directory``;
  which users count is ``disable_missing`` (those the sync manages, or all but ``keep_users``). A user
  who comes back is enabled again, only if the sync disabled them.
- If the disables would be more than ``max_disable_percent`` of the enabled users in scope, the sync
  stops before writing anything and reports (an outage or a wrong filter must not lock everybody out).
- Directory groups become groups (``source: directory``) whose members are the directory's; groups the
  sync made that left the directory are deleted. ``vc_roles`` binds groups to VC roles; bindings the
  sync made that are no longer listed are removed. Roles change for everybody's next request in this
  process and within ``auth_cache_s`` elsewhere.

The bind password is read from ``bind_password_file`` at each sync. TLS: ``ldaps://`` or StartTLS, the
server's certificate verified against ``ca_file`` (or the system's CAs) and its name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.directory_settings import DirectorySettings
from dlts.errors import DltsError, InvalidInput
from dlts.models import Group, GroupMember, RoleBinding, User, VirtualCluster
from dlts.repositories import identity as identity_repo
from dlts.services import admin, transaction
from dlts.services import groups as group_service
from dlts.services import users as user_service
from dlts.services.auth import forget_principals
from dlts.strict import is_whole_number

log = logging.getLogger(__name__)
SOURCE = "directory"
MISSING = "missing from the directory"
ACTOR = "directory-sync"


class DirectoryError(DltsError):
    """The directory could not be read (connection, TLS, bind, search): nothing was changed."""

    code = "directory_unavailable"
    http_status = 503


@dataclass(frozen=True)
class DirectoryUser:
    name: str
    dn: str
    uid: int | None
    gid: int | None
    email: str | None


@dataclass(frozen=True)
class DirectoryGroup:
    name: str
    members: frozenset[str]  # user names


@dataclass
class Snapshot:
    users: dict[str, DirectoryUser]
    groups: dict[str, DirectoryGroup]
    skipped: list[str] = field(default_factory=list)


@dataclass
class SyncReport:
    dry_run: bool
    directory_users: int = 0
    directory_groups: int = 0
    created: list[str] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)  # "alice: uid None -> 5001"
    enabled: list[str] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)
    held_jobs: list[int] = field(default_factory=list)
    groups_created: list[str] = field(default_factory=list)
    groups_deleted: list[str] = field(default_factory=list)
    members_added: list[str] = field(default_factory=list)  # "group: user"
    members_removed: list[str] = field(default_factory=list)
    bindings_added: list[str] = field(default_factory=list)  # "group -> vc: role"
    bindings_removed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    stopped: str | None = None  # why nothing was written

    @property
    def changes(self) -> int:
        return sum(len(getattr(self, k)) for k in ("created", "adopted", "updated", "enabled", "disabled", "groups_created",
                                                      "groups_deleted", "members_added", "members_removed",
                                                      "bindings_added", "bindings_removed"))

    def as_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "changes": self.changes}

    def lines(self) -> list[str]:
        head = "dry run: " if self.dry_run else ""
        out = [f"{head}directory: {self.directory_users} users, {self.directory_groups} groups"]
        if self.stopped:
            out.append(f"STOPPED, nothing written: {self.stopped}")
        for key in ("created", "adopted", "updated", "enabled", "disabled", "groups_created", "groups_deleted",
                    "members_added", "members_removed", "bindings_added", "bindings_removed", "skipped"):
            values = getattr(self, key)
            if values:
                out.append(f"{key.replace('_', ' ')} ({len(values)}): {', '.join(str(v) for v in values)}")
        if not self.stopped:
            out.append(f"{'would make' if self.dry_run else 'made'} {self.changes} changes")
        return out


# -- reading the directory ------------------------------------------------------------------------------

def _first(attributes: dict, name: str) -> str | None:
    value = attributes.get(name)
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    if value is None or value == []:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value).strip() or None


def _all(attributes: dict, name: str) -> list[str]:
    value = attributes.get(name) or []
    if not isinstance(value, (list, tuple)):
        value = [value]
    return [(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)).strip() for v in value if v]


def _password(cfg: DirectorySettings) -> str | None:
    if cfg.bind_password_file is None:
        return None
    try:
        return cfg.bind_password_file.read_text().strip("\r\n")
    except OSError as exc:
        raise DirectoryError(f"directory.bind_password_file: cannot read {cfg.bind_password_file}: {exc.strerror}") from None


def connect(cfg: DirectorySettings):
    """An ldap3 connection, TLS as configured, bound as ``bind_dn`` (or anonymously)."""
    import ldap3
    from ldap3.core.exceptions import LDAPException

    parts = urlsplit(cfg.url)
    use_ssl = parts.scheme == "ldaps"
    if cfg.ca_file is not None and not cfg.ca_file.is_file():
        raise DirectoryError(f"directory.ca_file: {cfg.ca_file} is not a readable file")
    # version None: ssl.create_default_context (TLS 1.2+, the CA file or the system's CAs); ldap3 then checks
    # that the certificate names the host
    tls = ldap3.Tls(validate=ssl.CERT_REQUIRED, ca_certs_file=str(cfg.ca_file) if cfg.ca_file else None)
    timeout = max(1, int(cfg.timeout_s))  # ldap3 packs it into a socket option: whole seconds
    server = ldap3.Server(parts.hostname, port=parts.port or (636 if use_ssl else 389), use_ssl=use_ssl, tls=tls,
                          connect_timeout=timeout, get_info=ldap3.NONE)
    password = _password(cfg)
    try:
        conn = ldap3.Connection(server, user=cfg.bind_dn, password=password, read_only=True, raise_exceptions=True,
                                receive_timeout=timeout, auto_bind=ldap3.AUTO_BIND_NONE)
        conn.open()
        if cfg.start_tls:
            conn.start_tls()
        conn.bind()
    except LDAPException as exc:
        raise DirectoryError(f"directory {cfg.url}: {_ldap_message(exc)}") from None
    except (OSError, ssl.SSLError) as exc:
        raise DirectoryError(f"directory {cfg.url}: {exc}") from None
    return conn


def _ldap_message(exc: Exception) -> str:
    text = str(exc) or exc.__class__.__name__
    if "invalidCredentials" in text or exc.__class__.__name__ == "LDAPInvalidCredentialsResult":
        return "the bind was refused (invalid credentials): check bind_dn and bind_password_file"
    if "certificate" in text.lower() or "ssl" in text.lower() or "tls" in text.lower():
        return f"TLS failed ({text[:300]}); check ca_file and that the server's certificate names the host"
    return text[:500]


def _paged(conn, base: str, search_filter: str, attributes: list[str], page_size: int) -> Iterable[tuple[str, dict]]:
    import ldap3

    for entry in conn.extend.standard.paged_search(search_base=base, search_filter=search_filter,
                                                   search_scope=ldap3.SUBTREE, attributes=attributes,
                                                   paged_size=page_size, generator=True):
        if entry.get("type") == "searchResEntry":
            yield entry["dn"], entry.get("attributes") or {}


def read_directory(cfg: DirectorySettings, conn_factory: Callable[[DirectorySettings], Any] = connect) -> Snapshot:
    """Users and groups as the directory has them now (paged searches)."""
    from ldap3.core.exceptions import LDAPException

    conn = conn_factory(cfg)
    snapshot = Snapshot({}, {})
    try:
        by_dn: dict[str, str] = {}
        user_attrs = [cfg.user_name_attribute, cfg.uid_attribute, cfg.gid_attribute, cfg.email_attribute]
        for dn, attrs in _paged(conn, cfg.user_base, cfg.user_filter, user_attrs, cfg.page_size):
            name = _first(attrs, cfg.user_name_attribute)
            if name is None or not admin.NAME_RE.match(name):
                snapshot.skipped.append(f"user {dn}: name {name!r} is not one DLTS can use (a-z, 0-9, '.', '_', '-')")
                continue
            if name in snapshot.users:
                snapshot.skipped.append(f"user {dn}: name {name} appears twice in the directory; the first is used")
                continue
            uid, gid = (_first(attrs, a) for a in (cfg.uid_attribute, cfg.gid_attribute))
            snapshot.users[name] = DirectoryUser(name, dn, int(uid) if uid is not None and is_whole_number(uid) else None,
                                                 int(gid) if gid is not None and is_whole_number(gid) else None,
                                                 _first(attrs, cfg.email_attribute))
            by_dn[dn.lower()] = name
        if cfg.group_base:
            for dn, attrs in _paged(conn, cfg.group_base, cfg.group_filter,
                                    [cfg.group_name_attribute, cfg.group_member_attribute], cfg.page_size):
                name = _first(attrs, cfg.group_name_attribute)
                if name is None or not admin.NAME_RE.match(name):
                    snapshot.skipped.append(f"group {dn}: name {name!r} is not one DLTS can use")
                    continue
                members = set()
                for value in _all(attrs, cfg.group_member_attribute):
                    member = by_dn.get(value.lower()) if "=" in value else value
                    if member in snapshot.users:
                        members.add(member)
                snapshot.groups[name] = DirectoryGroup(name, frozenset(members))
    except LDAPException as exc:
        raise DirectoryError(f"directory {cfg.url}: search failed: {_ldap_message(exc)}") from None
    finally:
        with contextlib.suppress(LDAPException, OSError):  # the connection is going anyway
            conn.unbind()
    return snapshot


# -- applying it -------------------------------------------------------------------------------------------

def _identity(session: Session, entry: DirectoryUser, user_id: int | None, report: SyncReport) -> tuple[int | None, int | None] | None:
    """The (uid, gid) to store, or None to leave the user's as they are (reported)."""
    if entry.uid is None and entry.gid is None:
        return None, None
    try:
        admin.check_id("uid", entry.uid)
        admin.check_id("gid", entry.gid)
        if (entry.uid is None) != (entry.gid is None):
            raise InvalidInput("the directory gives only one of uid and gid")
    except InvalidInput as exc:
        report.skipped.append(f"user {entry.name}: uid/gid {entry.uid}/{entry.gid} not used: {exc.message}")
        return None
    holder = session.scalar(sa.select(User.name).where(User.uid == entry.uid, User.id != (user_id or 0)))
    if holder is not None:
        report.skipped.append(f"user {entry.name}: uid {entry.uid} already belongs to DLTS user {holder}; not changed")
        return None
    return entry.uid, entry.gid


def _email(entry: DirectoryUser, report: SyncReport) -> tuple[bool, str | None]:
    try:
        return True, user_service.check_email(entry.email)
    except InvalidInput:
        report.skipped.append(f"user {entry.name}: e-mail {(entry.email or '')[:80]!r} is not an address; not changed")
        return False, None


def apply(session: Session, cfg: DirectorySettings, snapshot: Snapshot, *, dry_run: bool = False) -> SyncReport:
    """Bring the database to ``snapshot`` (see the module's docstring); one transaction."""
    report = SyncReport(dry_run=dry_run, directory_users=len(snapshot.users), directory_groups=len(snapshot.groups),
                        skipped=list(snapshot.skipped))
    users = {u.name: u for u in session.scalars(sa.select(User))}
    keep = set(cfg.keep_users)

    # what would be disabled: decided before anything is written
    def managed(user: User) -> bool:
        return cfg.disable_missing == "all_users" or user.source == SOURCE or user.name in snapshot.users

    in_scope = [u for u in users.values() if u.disabled_at is None and managed(u) and u.name not in keep]
    to_disable = sorted(u.name for u in in_scope if u.name not in snapshot.users)
    admins = identity_repo.enabled_cluster_admins(session)
    if admins and admins <= {users[n].id for n in to_disable}:  # never the last cluster admins
        for name in [n for n in to_disable if users[n].id in admins]:
            to_disable.remove(name)
            report.skipped.append(f"user {name}: missing from the directory but one of the last enabled cluster admins; "
                                  "not disabled (add them to keep_users, or make another cluster admin)")
    # the share is of the enabled users the sync manages after this run: those there and those it creates
    managed_total = len(in_scope) + sum(1 for name in snapshot.users if name not in users)
    if to_disable:
        share = 100.0 * len(to_disable) / managed_total
        if share > cfg.max_disable_percent:
            report.disabled = to_disable
            report.stopped = (f"{len(to_disable)} of {managed_total} enabled users ({share:.0f}%) are missing from the "
                              f"directory, more than max_disable_percent ({cfg.max_disable_percent:g}%); check the "
                              "directory and the filters, or raise the limit for one run")
            return report
    with transaction.step(session):  # committed, or (a dry run, an error) rolled back
        for name, entry in sorted(snapshot.users.items()):
            user = users.get(name)
            ok_email, email = _email(entry, report)
            ids = _identity(session, entry, user.id if user else None, report)
            if user is None:
                user = User(name=name, email=email if ok_email else None, preferences={}, source=SOURCE,
                            uid=ids[0] if ids else None, gid=ids[1] if ids else None)
                session.add(user)
                session.flush()
                users[name] = user
                report.created.append(name)
                continue
            if user.source != SOURCE:
                user.source = SOURCE
                report.adopted.append(name)
            said = []
            if ids is not None and (user.uid, user.gid) != ids:
                said.append(f"uid/gid {user.uid}/{user.gid} -> {ids[0]}/{ids[1]}")
                user.uid, user.gid = ids
            if ok_email and user.email != email:
                said.append(f"email {user.email} -> {email}")
                user.email = email
            if said:
                report.updated.append(f"{name}: {', '.join(said)}")
            if user.disabled_at is not None and user.disabled_reason == MISSING:
                report.enabled.append(name)
                user_service.release_user(session, user, ACTOR)
            session.flush()
        for name in to_disable:
            _, _, held, _ = user_service.hold_user(session, users[name], ACTOR, MISSING)
            report.disabled.append(name)
            report.held_jobs.extend(held)
        _sync_groups(session, cfg, snapshot, users, report)
        session.flush()
        if dry_run:
            transaction.discard(session)
    if not dry_run:
        forget_principals()
    return report


def _sync_groups(session: Session, cfg: DirectorySettings, snapshot: Snapshot, users: dict[str, User],
                 report: SyncReport) -> None:
    existing = {g.name: g for g in session.scalars(sa.select(Group))}
    for name, entry in sorted(snapshot.groups.items()):
        group = existing.get(name)
        if group is None:
            group = Group(name=name, source=SOURCE)
            session.add(group)
            session.flush()
            existing[name] = group
            report.groups_created.append(name)
        elif group.source != SOURCE:
            group.source = SOURCE
            report.adopted.append(f"group {name}")
        have = set(session.scalars(sa.select(User.name).join(GroupMember, GroupMember.user_id == User.id)
                                   .where(GroupMember.group_id == group.id)))
        for member in sorted(entry.members - have):
            session.add(GroupMember(group_id=group.id, user_id=users[member].id))
            report.members_added.append(f"{name}: {member}")
        for member in sorted(have - entry.members):
            session.execute(sa.delete(GroupMember).where(GroupMember.group_id == group.id,
                                                         GroupMember.user_id == users[member].id))
            report.members_removed.append(f"{name}: {member}")
    for name, group in sorted(existing.items()):
        if group.source == SOURCE and name not in snapshot.groups:
            session.execute(sa.delete(RoleBinding).where(RoleBinding.group_id == group.id))
            session.execute(sa.delete(GroupMember).where(GroupMember.group_id == group.id))
            session.delete(group)
            report.groups_deleted.append(name)
    session.flush()
    vcs = {v.name: v for v in session.scalars(sa.select(VirtualCluster))}
    wanted: set[tuple[int, int]] = set()
    for mapping in cfg.vc_roles:
        group, vc = existing.get(mapping.group), vcs.get(mapping.vc)
        if group is None or mapping.group in report.groups_deleted:
            report.skipped.append(f"vc_roles: group {mapping.group} is not in the directory")
            continue
        if vc is None:
            report.skipped.append(f"vc_roles: VC {mapping.vc} does not exist; create it first")
            continue
        wanted.add((group.id, vc.id))
        if group_service.bind(session, group, vc, mapping.role, ACTOR, source=SOURCE):
            report.bindings_added.append(f"{mapping.group} -> {mapping.vc}: {mapping.role}")
    stale = session.execute(sa.select(RoleBinding.group_id, RoleBinding.vc_id, Group.name, VirtualCluster.name)
                            .join(Group, Group.id == RoleBinding.group_id).join(VirtualCluster, VirtualCluster.id == RoleBinding.vc_id)
                            .where(RoleBinding.source == SOURCE).distinct()).all()
    for group_id, vc_id, group_name, vc_name in stale:
        if (group_id, vc_id) not in wanted:
            group_service.unbind(session, existing[group_name], vcs[vc_name], ACTOR)
            report.bindings_removed.append(f"{group_name} -> {vc_name}")


class DirectorySync:
    """One sync: read the directory, apply it. ``run_once`` is the periodic entry of ``dlts managers``."""

    def __init__(self, sessions, cfg: DirectorySettings, conn_factory: Callable[[DirectorySettings], Any] = connect):
        self.sessions = sessions
        self.cfg = cfg
        self.conn_factory = conn_factory

    def sync(self, *, dry_run: bool = False) -> SyncReport:
        snapshot = read_directory(self.cfg, self.conn_factory)
        with self.sessions() as session:
            return apply(session, self.cfg, snapshot, dry_run=dry_run)

    def run_once(self) -> SyncReport | None:
        try:
            report = self.sync()
        except DirectoryError as exc:
            log.warning("directory sync: %s", exc.message)
            return None
        for line in report.lines():
            (log.warning if report.stopped else log.info)("directory sync: %s", line)
        return report


def periodic_entries(settings, sessions) -> list:
    from dlts.managers import Periodic

    if not settings.directory.enabled:
        return []
    return [Periodic("directory.sync", settings.directory.interval_s, DirectorySync(sessions, settings.directory).run_once)]
