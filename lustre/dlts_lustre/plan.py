"""Compute and apply the difference between a Policy and the filesystem's current state.

``build_plan`` only reads (through ``LustreClient``) and returns a ``Plan`` of actions, each with the
exact argv it will run, why, and, when it is unsafe, the reason to refuse it without ``--force``.
``apply_plan`` runs the actions in order (pools before directories pinned to them, pool removals last).
A second ``apply`` of the same policy finds nothing to do.
"""
from __future__ import annotations

import enum
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath

from dlts_lustre import client as c
from dlts_lustre.errors import LustreCommandError, PolicyError, UnsafePlanError
from dlts_lustre.model import DfReport, QuotaKind, QuotaLimits, QuotaReport
from dlts_lustre.policy import SPREAD, Grace, Policy, VcStorage
from dlts_lustre.units import format_grace_s, format_size_kib


class ActionKind(enum.Enum):
    POOL_NEW = "pool_new"
    POOL_ADD = "pool_add"
    MKDIR = "mkdir"
    SET_DIR_DEFAULT = "set_dir_default"
    SET_STRIPE = "set_stripe"
    SET_PROJECT = "set_project"
    SET_DEFAULT_QUOTA = "set_default_quota"
    SET_GRACE = "set_grace"
    SET_QUOTA = "set_quota"
    USE_DEFAULT_QUOTA = "use_default_quota"
    POOL_REMOVE = "pool_remove"
    POOL_DESTROY = "pool_destroy"


# Execution order: a pool must have OSTs before a directory is pinned to it (creating files in an
# empty pool fails with EINVAL), and pools are emptied/destroyed only after directories moved away.
_ORDER = {kind: i for i, kind in enumerate(ActionKind)}


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    argv: tuple[str, ...]
    description: str
    unsafe_reason: str | None = None

    @property
    def command(self) -> str:
        return " ".join(self.argv)


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    warnings: tuple[str, ...] = ()

    @property
    def unsafe(self) -> tuple[Action, ...]:
        return tuple(a for a in self.actions if a.unsafe_reason)

    @property
    def empty(self) -> bool:
        return not self.actions


@dataclass(frozen=True)
class ApplyResult:
    plan: Plan
    executed: tuple[Action, ...]
    dry_run: bool


def _fmt_limits(limits: QuotaLimits) -> str:
    def size(kib: int) -> str:
        return format_size_kib(kib) if kib else "unlimited"

    def count(n: int) -> str:
        return str(n) if n else "unlimited"

    return (f"blocks soft {size(limits.block_soft_kib)} hard {size(limits.block_hard_kib)}, "
            f"inodes soft {count(limits.inode_soft)} hard {count(limits.inode_hard)}")


def shrink_reason(report: QuotaReport, new: QuotaLimits, who: str) -> str | None:
    """Why setting ``new`` on ``report``'s ID is unsafe: a limit drops below current usage."""
    used_kib = report.total.block_used_kib or 0
    used_inodes = report.total.inode_used or 0
    old = report.total.limits
    problems = []
    for label, limit, previous, used, fmt in (
            ("block soft", new.block_soft_kib, old.block_soft_kib, used_kib, format_size_kib),
            ("block hard", new.block_hard_kib, old.block_hard_kib, used_kib, format_size_kib),
            ("inode soft", new.inode_soft, old.inode_soft, used_inodes, str),
            ("inode hard", new.inode_hard, old.inode_hard, used_inodes, str)):
        shrinking = previous == 0 or limit < previous
        if limit and limit < used and shrinking:
            problems.append(f"{label} limit {fmt(limit)} is below current usage {fmt(used)}")
    if not problems:
        return None
    return f"{who}: " + "; ".join(problems) + " (writes would fail at once)"


class Planner:
    """Reads current state for one policy and produces the Plan."""

    def __init__(self, policy: Policy, client: c.LustreClient,
                 dir_exists: Callable[[str], bool] = os.path.isdir) -> None:
        self.policy = policy
        self.client = client
        self.dir_exists = dir_exists
        self.actions: list[Action] = []
        self.warnings: list[str] = []
        self.fs = policy.filesystem.name
        self.mount = policy.filesystem.mount

    def add(self, kind: ActionKind, argv: tuple[str, ...], description: str, unsafe: str | None = None) -> None:
        self.actions.append(Action(kind, argv, description, unsafe))

    def build(self) -> Plan:
        if not self.dir_exists(self.mount):
            raise PolicyError(f"filesystem.mount: {self.mount} does not exist on this host; "
                              "run apply on a node with the filesystem mounted")
        df = self.client.df(self.mount)
        self._check_targets(df)
        self._plan_pools()
        for vc in self.policy.vcs:
            self._plan_vc_directory(vc)
        self._plan_user_quotas()
        for vc in self.policy.vcs:
            self._plan_project_quota(vc)
        ordered = sorted(enumerate(self.actions), key=lambda pair: (_ORDER[pair[1].kind], pair[0]))
        return Plan(actions=tuple(a for _, a in ordered), warnings=tuple(self.warnings))

    def _check_targets(self, df: DfReport) -> None:
        osts = {t.index for t in df.osts()}
        mdts = {t.index for t in df.mdts()}
        for i, vc in enumerate(self.policy.vcs):
            missing = sorted(set(vc.osts) - osts)
            if missing:
                raise PolicyError(f"vcs[{i}].osts: OST index {', '.join(map(str, missing))} does not exist in "
                                  f"{self.fs} (OSTs: {', '.join(map(str, sorted(osts)))})")
            if isinstance(vc.mdt, int) and vc.mdt not in mdts:
                raise PolicyError(f"vcs[{i}].mdt: MDT {vc.mdt} does not exist in {self.fs} "
                                  f"(MDTs: {', '.join(map(str, sorted(mdts)))})")
            if vc.dir_stripe_count and vc.dir_stripe_count > len(mdts):
                raise PolicyError(f"vcs[{i}].dir_stripe_count: {vc.dir_stripe_count} exceeds the "
                                  f"{len(mdts)} MDTs of {self.fs}")
            if vc.default_dir_stripe_count and vc.default_dir_stripe_count > len(mdts):
                raise PolicyError(f"vcs[{i}].default_dir_stripe_count: {vc.default_dir_stripe_count} exceeds the "
                                  f"{len(mdts)} MDTs of {self.fs}")

    # pools --------------------------------------------------------------------------------------------
    def _plan_pools(self) -> None:
        current = {name: self.client.pool(self.fs, name).ost_indices for name in self.client.pools(self.fs)}
        desired = {vc.pool: (vc.name, set(vc.osts)) for vc in self.policy.vcs}
        for pool, (vc_name, osts) in desired.items():
            have = set(current.get(pool, ()))
            if pool not in current:
                self.add(ActionKind.POOL_NEW, c.cmd_pool_new(self.fs, pool), f"create pool {pool} for VC {vc_name}")
            add = sorted(osts - have)
            remove = sorted(have - osts)
            if add:
                self.add(ActionKind.POOL_ADD, c.cmd_pool_add(self.fs, pool, add),
                         f"add OST {_ranges(add)} to pool {pool}")
            if remove:
                self.add(ActionKind.POOL_REMOVE, c.cmd_pool_remove(self.fs, pool, remove),
                         f"remove OST {_ranges(remove)} from pool {pool} (existing files stay where they are)")
        if not self.policy.prune_pools:
            return
        for pool in sorted(set(current) - set(desired)):
            members = current[pool]
            unsafe = None
            if members:
                unsafe = (f"pool {pool} is not in the policy but still has OST {_ranges(members)}; directories "
                          "pinned to it would fail to create files once it is destroyed")
                self.add(ActionKind.POOL_REMOVE, c.cmd_pool_remove(self.fs, pool, members),
                         f"empty pool {pool} (not in the policy)", unsafe)
            self.add(ActionKind.POOL_DESTROY, c.cmd_pool_destroy(self.fs, pool),
                     f"destroy pool {pool} (not in the policy)", unsafe)

    # directories ----------------------------------------------------------------------------------------
    def _plan_vc_directory(self, vc: VcStorage) -> None:
        path = self.policy.vc_path(vc)
        if not self.dir_exists(path):
            self._plan_new_directory(vc, path)
            return
        if isinstance(vc.mdt, int):
            actual = self.client.dir_mdt(path)
            if actual != vc.mdt:
                self.warnings.append(
                    f"VC {vc.name}: {path} is on MDT {actual}, the policy says MDT {vc.mdt}; apply does not move "
                    f"existing directories (run `lfs migrate -m {vc.mdt} {path}` in a maintenance window)")
        wanted = vc.wanted_dir_default
        if wanted is not None:
            default = self.client.getdirstripe(path, default=True)
            if not (default.stripe_count == wanted and default.stripe_offset == -1):
                self._add_dir_default(path, wanted)
        layout = self.client.getstripe(path)
        if layout.pool != vc.pool or (vc.stripe_count is not None and layout.stripe_count != vc.stripe_count):
            self.add(ActionKind.SET_STRIPE, c.cmd_setstripe(path, pool=vc.pool, stripe_count=vc.stripe_count),
                     f"pin new files in {path} to pool {vc.pool} (was {layout.pool or 'no pool'})")
        if vc.project_id is not None:
            project = self.client.project(path)
            if project.project_id != vc.project_id or not project.inherit:
                unsafe = None
                if project.project_id not in (0, vc.project_id):
                    unsafe = (f"{path} belongs to project {project.project_id}; setting project {vc.project_id} "
                              "moves its usage to another project's quota")
                self.add(ActionKind.SET_PROJECT, c.cmd_set_project(path, vc.project_id),
                         f"set project {vc.project_id} (inherited) on {path}", unsafe)

    def _add_dir_default(self, path: str, count: int) -> None:
        what = ("spread new subdirectories of {p} across MDTs (one MDT each, round-robin)" if count == 1 else
                "stripe new subdirectories of {p} over " + ("every MDT" if count == -1 else f"{count} MDTs"))
        self.add(ActionKind.SET_DIR_DEFAULT, c.cmd_setdirstripe_default(path, stripe_count=count),
                 what.format(p=path))

    def _plan_new_directory(self, vc: VcStorage, path: str) -> None:
        mount = PurePosixPath(self.mount)
        missing_parents = []
        parent = PurePosixPath(path).parent
        while parent != mount and mount in parent.parents and not self.dir_exists(str(parent)):
            missing_parents.append(str(parent))
            parent = parent.parent
        for parent_path in reversed(missing_parents):
            if not any(a.kind is ActionKind.MKDIR and a.argv[-1] == parent_path for a in self.actions):
                self.add(ActionKind.MKDIR, c.cmd_mkdir(parent_path), f"create parent directory {parent_path}")
        if vc.mdt == SPREAD:
            self.add(ActionKind.MKDIR, c.cmd_mkdir(path, mdt_index=-1, stripe_count=vc.dir_stripe_count),
                     f"create {path} for VC {vc.name} on an MDT chosen by the MDS")
        else:
            self.add(ActionKind.MKDIR, c.cmd_mkdir(path, mdt_index=int(vc.mdt), stripe_count=vc.dir_stripe_count),
                     f"create {path} for VC {vc.name} on MDT {vc.mdt}")
        if vc.wanted_dir_default is not None:
            self._add_dir_default(path, vc.wanted_dir_default)
        self.add(ActionKind.SET_STRIPE, c.cmd_setstripe(path, pool=vc.pool, stripe_count=vc.stripe_count),
                 f"pin new files in {path} to pool {vc.pool}")
        if vc.project_id is not None:
            self.add(ActionKind.SET_PROJECT, c.cmd_set_project(path, vc.project_id),
                     f"set project {vc.project_id} (inherited) on {path}")

    # quotas --------------------------------------------------------------------------------------------
    def _plan_user_quotas(self) -> None:
        uq = self.policy.user_quota
        default_limits = QuotaLimits()
        if uq.default is not None:
            current = self.client.default_quota(QuotaKind.USER, self.mount)
            default_limits = uq.default.to_limits()
            if current.limits != default_limits:
                self.add(ActionKind.SET_DEFAULT_QUOTA,
                         c.cmd_set_default_quota(QuotaKind.USER, self.mount, default_limits),
                         f"default user quota: {_fmt_limits(default_limits)} (was {_fmt_limits(current.limits)})")
        elif uq.reset_to_default:
            default_limits = self.client.default_quota(QuotaKind.USER, self.mount).limits
        self._plan_grace(QuotaKind.USER, uq.grace)
        self._plan_grace(QuotaKind.PROJECT, self.policy.project_grace)
        for user, limits_model in sorted(uq.overrides.items()):
            limits = limits_model.to_limits()
            report = self.client.quota(QuotaKind.USER, user, self.mount)
            if report.uses_default_block or report.uses_default_file or report.total.limits != limits:
                self.add(ActionKind.SET_QUOTA, c.cmd_setquota(QuotaKind.USER, user, self.mount, limits),
                         f"user {user}: {_fmt_limits(limits)}",
                         shrink_reason(report, limits, f"user {user}"))
        for user in sorted(uq.reset_to_default):
            report = self.client.quota(QuotaKind.USER, user, self.mount)
            follows = report.uses_default_block or report.uses_default_file
            # An ID with no limits of its own has no quota record, so it follows the defaults already.
            unset = report.total.limits == QuotaLimits()
            if not follows and not unset and report.total.limits != default_limits:
                self.add(ActionKind.USE_DEFAULT_QUOTA, c.cmd_use_default_quota(QuotaKind.USER, user, self.mount),
                         f"user {user}: follow the default quota again",
                         shrink_reason(report, default_limits, f"user {user}"))

    def _plan_grace(self, kind: QuotaKind, grace: Grace | None) -> None:
        if grace is None:
            return
        current = self.client.grace_times(kind, self.mount)
        if (current.block_grace_s, current.inode_grace_s) != (grace.block, grace.inode):
            self.add(ActionKind.SET_GRACE, c.cmd_set_grace(kind, self.mount, grace.block, grace.inode),
                     f"{kind.name.lower()} grace: blocks {_grace(grace.block)}, inodes {_grace(grace.inode)}")

    def _plan_project_quota(self, vc: VcStorage) -> None:
        if vc.project_quota is None or vc.project_id is None:
            return
        limits = vc.project_quota.to_limits()
        report = self.client.quota(QuotaKind.PROJECT, vc.project_id, self.mount)
        if report.total.limits != limits:
            self.add(ActionKind.SET_QUOTA, c.cmd_setquota(QuotaKind.PROJECT, str(vc.project_id), self.mount, limits),
                     f"VC {vc.name} project {vc.project_id}: {_fmt_limits(limits)}",
                     shrink_reason(report, limits, f"VC {vc.name} (project {vc.project_id})"))


def _grace(seconds: int) -> str:
    return "notify" if seconds < 0 else format_grace_s(seconds)


def _ranges(indices: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` for messages."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def build_plan(policy: Policy, client: c.LustreClient,
               dir_exists: Callable[[str], bool] = os.path.isdir) -> Plan:
    return Planner(policy, client, dir_exists).build()


def apply_plan(plan: Plan, client: c.LustreClient, *, force: bool = False) -> ApplyResult:
    """Run the plan. Refuses unsafe actions unless ``force``; stops at the first failing command."""
    if plan.unsafe and not force:
        raise UnsafePlanError([a.unsafe_reason or "" for a in plan.unsafe])
    executed: list[Action] = []
    for action in plan.actions:
        try:
            client.execute(action.argv)
        except LustreCommandError as exc:
            exc.args = ((f"{exc} (action {len(executed) + 1} of {len(plan.actions)}: {action.description}; "
                        f"{len(executed)} earlier action(s) were applied, re-run apply after fixing)"),)
            raise
        executed.append(action)
    return ApplyResult(plan=plan, executed=tuple(executed), dry_run=client.runner.dry_run)
