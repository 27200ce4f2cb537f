"""The storage manager: the NFS/local roots' scans, alerts and expiry, and the Lustre pass.

``StorageManager`` (the ``storage:`` section, docs/storage.md) scans every root in a bounded worker
(``dlts.storage.scan``: a hung mount costs ``dir_timeout_s``, never the process), records each scan as
a snapshot, tells the cluster admins and the owners of the biggest paths when a file system crosses
its ``alert_percent`` (once per crossing), and expires old data under ``expire_paths``: owners are
warned, and their files go only ``warn_days`` after that warning. ``periodic_entries`` is the factory
``dlts managers`` registers them through.

The Lustre pass: each VC's ``storage["lustre"]`` settings become its OST pool, its directory on its
MDT, its default layout and its project quota, through ``dlts_lustre``. It reads the current state,
applies only what changes (a second pass does nothing) and never runs an unsafe plan (shrinking a
quota below usage, destroying a non-empty pool): those are logged for an operator to run
``dlts-lustre apply --force`` by hand.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
import yaml
from sqlalchemy.orm import Session

from dlts.models import StorageExpiryLog, User, VirtualCluster
from dlts.services import transaction
from dlts.storage.expire import ExpireReport, expire_root
from dlts.storage.scan import scan_root
from dlts.storage.scan_result import COMPLETE, ScanResult
from dlts.storage.settings import StorageRoot, StorageSettings

if TYPE_CHECKING:
    from dlts.config import Settings
    from dlts.managers import Periodic

log = logging.getLogger(__name__)
DAY_S = 86400.0


def human_bytes(value: int | None) -> str:
    if value is None:
        return "?"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024 or unit == "PiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{value} B"


class StorageManager:
    """Scans, alerts and expiry of the configured roots (``storage.roots``)."""

    def __init__(self, session_factory: Callable[[], Session], settings: Settings, *,
                 scan: Callable[..., ScanResult] = scan_root, expire: Callable[..., ExpireReport] = expire_root,
                 now: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep):
        self.session_factory = session_factory
        self.settings = settings
        self.storage: StorageSettings = settings.storage
        self.scan, self.expire, self.now, self.sleep = scan, expire, now, sleep

    @staticmethod
    def uid_names(session: Session) -> dict[int, str]:
        rows = session.execute(sa.select(User.uid, User.name).where(User.uid.is_not(None))).all()
        return {uid: name for uid, name in rows if uid is not None}

    # -- scans -----------------------------------------------------------------------------------
    def scan_once(self) -> list[ScanResult]:
        """Scan every root, one after the other; each scan is one snapshot."""
        results = []
        for root in self.storage.roots:
            results.append(self.scan_and_record(root))
        return results

    def scan_and_record(self, root: StorageRoot) -> ScanResult:
        from dlts.services import storage as storage_service

        with self.session_factory() as session:
            names = self.uid_names(session)
        result = self.scan(root, self.storage, uid_names=names)
        if result.status == COMPLETE:
            log.info("storage: scanned %s in %.1f s: %d files, %s allocated, %d unreadable", result.root,
                     result.duration_s, result.total.files, human_bytes(result.total.allocated_bytes), result.errors)
        else:
            log.error("storage: scan of %s %s: %s", result.root, result.status, result.message)
        with self.session_factory() as session, transaction.step(session):
            recorded = storage_service.record_scan(session, result, root, self.storage)
            if recorded.crossed_alert:
                self.alert(session, root, result, recorded.snapshot.id)
        return result

    def alert(self, session: Session, root: StorageRoot, result: ScanResult, snapshot_id: int) -> int | None:
        from dlts.services import notify

        top = result.top_dirs[: self.storage.mail_paths]
        owners = sorted({d["owner"] for d in top if d.get("owner")})
        paths = [f"{d['path']}  {human_bytes(d['allocated_bytes'])}  {d.get('owner') or '?'}" for d in top]
        log.warning("storage: %s is %.1f%% full (alert_percent %g); telling the cluster admins and %s",
                    result.root, result.fs_used_percent or 0, root.alert_percent, ", ".join(owners) or "no owner")
        return notify.enqueue(
            session, template="storage_alert",
            to=notify.cluster_admin_emails(session) + notify.user_emails(session, owners),
            context={"root": result.root, "used_percent": result.fs_used_percent, "alert_percent": root.alert_percent,
                     "used": human_bytes(result.fs_used_bytes), "total": human_bytes(result.fs_total_bytes),
                     "paths": paths, "owners": owners},
            dedup_key=f"storage_alert:{result.root}:{snapshot_id}")

    # -- expiry ----------------------------------------------------------------------------------
    def expire_once(self) -> list[ExpireReport]:
        return [self.expire_and_record(root) for root in self.storage.roots if root.expire_after_days is not None]

    def expire_and_record(self, root: StorageRoot, *, older_than_days: float | None = None, dry_run: bool = False,
                          on_item: Callable[[str, str, int, str], None] | None = None) -> ExpireReport:
        """One expiry pass of a root: warn owners, delete what they were warned about long enough ago,
        record both (a dry run records and mails nothing)."""
        days = older_than_days if older_than_days is not None else root.expire_after_days
        if days is None:
            raise ValueError(f"{root.path}: no expire_after_days configured; give --older-than-days")
        now = self.now()
        warn_s = min(root.warn_days, days) * DAY_S
        at = dt.datetime.fromtimestamp(now, dt.UTC).replace(tzinfo=None)
        with self.session_factory() as session:
            names = self.uid_names(session)
            # an owner's files go only once a warning is warn_days old (and younger than the expiry
            # period: a warning from long ago does not cover today's files)
            warned = {owner: first for owner, first in session.execute(
                sa.select(StorageExpiryLog.owner, sa.func.min(StorageExpiryLog.at))
                .where(StorageExpiryLog.root == str(root.path), StorageExpiryLog.action == "warned",
                       StorageExpiryLog.at >= at - dt.timedelta(days=days))
                .group_by(StorageExpiryLog.owner))}
        ready = {owner for owner, first in warned.items() if first <= at - dt.timedelta(seconds=warn_s)}

        def may_delete(owner: str) -> bool:
            return warn_s == 0 or owner in ready

        report = self.expire(root, older_than_days=days, dry_run=dry_run, uid_names=names, may_delete=may_delete,
                             now=now, sleep=self.sleep, on_item=on_item, max_warn_paths=self.storage.mail_paths)
        if dry_run:
            return report
        with self.session_factory() as session, transaction.step(session):
            for owner, totals in report.deleted.items():
                session.add(StorageExpiryLog(root=str(root.path), owner=owner[:64], action="deleted", at=at,
                                             files=totals.files, dirs=totals.dirs, bytes=totals.bytes, paths=[]))
                log.info("storage: expired %d file(s), %d dir(s), %s of %s under %s", totals.files, totals.dirs,
                         human_bytes(totals.bytes), owner, root.path)
            for owner, warning in report.warnings.items():
                # one warning per owner and warn_days: it starts their clock; later passes only delete
                last = session.scalar(sa.select(sa.func.max(StorageExpiryLog.at)).where(
                    StorageExpiryLog.root == str(root.path), StorageExpiryLog.owner == owner[:64],
                    StorageExpiryLog.action == "warned"))
                if last is not None and last > at - dt.timedelta(seconds=max(warn_s, 1)):
                    continue
                session.add(StorageExpiryLog(root=str(root.path), owner=owner[:64], action="warned", at=at,
                                             files=warning.files, dirs=0, bytes=warning.bytes, paths=warning.paths))
                self.warn(session, root, days, owner, warning, now + warn_s)
        return report

    def warn(self, session: Session, root: StorageRoot, days: float, owner: str, warning, delete_after: float) -> None:
        from dlts.services import notify

        due = max(delete_after, warning.first_due or delete_after)
        notify.enqueue(session, template="storage_expiry_warning", to=notify.user_emails(session, [owner]),
                       context={"root": str(root.path), "owner": owner, "files": warning.files,
                                "size": human_bytes(warning.bytes), "paths": warning.paths,
                                "expire_after_days": f"{days:g}",
                                "delete_after": dt.datetime.fromtimestamp(due, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")},
                       dedup_key=f"storage_expiry_warning:{root.path}:{owner}:{int(delete_after // DAY_S)}")


def periodic_entries(settings: Settings, sessions: Callable[[], Session]) -> list[Periodic]:
    """The storage manager's entries for ``dlts managers``: the scans and the expiry of the
    ``storage.roots`` (none without roots), and the Lustre pass with ``lustre_defaults_file``."""
    from dlts.managers import Periodic

    entries = []
    if settings.storage.roots:
        manager = StorageManager(sessions, settings)
        entries.append(Periodic("storage.scan", settings.storage.scan_interval_s, manager.scan_once))
        if any(r.expire_after_days is not None for r in settings.storage.roots):
            entries.append(Periodic("storage.expire", settings.storage.expire_interval_s, manager.expire_once))
    if settings.lustre_defaults_file is not None:
        lustre = LustreStorageManager(sessions, settings.lustre_defaults_file,
                                      mgs_command=tuple(settings.lustre_mgs_command), storage=settings.storage)
        lustre.check()  # a bad defaults file stops start-up, naming the key
        entries.append(Periodic("storage.lustre_apply", settings.storage_interval_s, lustre.run))
        entries.append(Periodic("storage.lustre_usage", settings.lustre_usage_interval_s, lustre.usage_once))
    return entries


class StorageConfigError(ValueError):
    """The cluster defaults or a VC's Lustre settings are invalid (the message names the key)."""


class LustreStorageManager:
    """The Lustre pass (each VC's storage["lustre"] applied through dlts_lustre) and the Lustre usage
    reading (``lfs quota`` per user and VC into a storage snapshot). Pool changes run on the MGS:
    ``mgs_command`` is the argv prefix that reaches it (``lustre_mgs_command``)."""

    def __init__(self, session_factory: Callable[[], Session], defaults_file: Path, client_factory=None, *,
                 mgs_command: tuple[str, ...] | None = None, storage: StorageSettings | None = None):
        self.session_factory = session_factory
        self.defaults_file = Path(defaults_file)
        self.mgs_command = None if mgs_command is None else tuple(mgs_command)  # None: $DLTS_LUSTRE_MGS_COMMAND
        self.client_factory = client_factory or self._client
        self.storage = storage or StorageSettings.model_validate({})

    def _client(self):
        from dlts_lustre.client import LustreClient
        from dlts_lustre.runner import Runner

        return LustreClient(Runner() if self.mgs_command is None else Runner(mgs_command=self.mgs_command))

    def _defaults(self) -> dict[str, Any]:
        try:
            data = yaml.safe_load(self.defaults_file.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise StorageConfigError(f"lustre_defaults_file {self.defaults_file}: {exc}") from None
        if not isinstance(data, dict):
            raise StorageConfigError(f"lustre_defaults_file {self.defaults_file} must be a mapping")
        return data

    def policy(self):
        from dlts_lustre.errors import PolicyError
        from dlts_lustre.policy import policy_from_vcs

        with self.session_factory() as session:
            vcs = [{"name": vc.name, **(vc.storage or {})["lustre"]}
                   for vc in session.scalars(sa.select(VirtualCluster).order_by(VirtualCluster.name))
                   if (vc.storage or {}).get("lustre")]
        try:
            return policy_from_vcs(vcs, self._defaults())
        except PolicyError as exc:
            raise StorageConfigError(str(exc)) from None

    def check(self) -> None:
        self.policy()

    def run(self):
        """One pass: plan, refuse unsafe plans, apply the rest. Returns the ApplyResult (or None)."""
        from dlts_lustre.plan import apply_plan, build_plan

        client = self.client_factory()
        plan = build_plan(self.policy(), client)
        for warning in plan.warnings:
            log.warning("lustre: %s", warning)
        if plan.unsafe:
            log.error("lustre: %d unsafe change(s) not applied; review and run `dlts-lustre apply --force`: %s",
                      len(plan.unsafe), "; ".join(a.unsafe_reason or "" for a in plan.unsafe))
            return None
        if not plan.actions:
            return None
        result = apply_plan(plan, client)
        log.info("lustre: applied %d change(s)", len(plan.actions))
        return result

    def usage_once(self) -> ScanResult:
        """Read usage per user (uid in the database) and per VC (its project ID, else its gid) with
        ``lfs quota`` and record it as one snapshot of the mount (kind ``lustre``)."""
        from dlts.services import storage as storage_service
        from dlts.storage.lustre_usage import VcQuotaId, lustre_usage

        policy = self.policy()
        mount = policy.filesystem.mount
        directories = {vc.name: vc.directory for vc in policy.vcs}
        projects = {vc.name: vc.project_id for vc in policy.vcs}
        with self.session_factory() as session:
            users = StorageManager.uid_names(session)
            vcs = [VcQuotaId(vc.name, projects.get(vc.name), vc.gid, directories.get(vc.name))
                   for vc in session.scalars(sa.select(VirtualCluster).order_by(VirtualCluster.name))]
        result = lustre_usage(self.client_factory(), mount, users=users, vcs=vcs)
        if result.status == COMPLETE:
            log.info("lustre: usage of %s: %d user(s), %d VC(s), %d unreadable", mount, len(result.by_owner),
                     len(result.vc_totals or {}), result.errors)
        else:
            log.error("lustre: usage of %s %s: %s", mount, result.status, result.message)
        root = StorageRoot.model_validate({"path": mount, "kind": "local"})
        with self.session_factory() as session, transaction.step(session):
            storage_service.record_scan(session, result, root, self.storage)
        return result
