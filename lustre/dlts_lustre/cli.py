"""``dlts-lustre``: apply a policy, show status, show one quota. Text by default, ``--json`` for tools.

Exit codes: 0 ok, 1 a Lustre command failed or printed something unparseable, 2 bad policy or usage,
3 apply refused an unsafe plan (re-run with ``--force``).
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import json
import pwd
import sys
from collections.abc import Callable
from typing import Any

import click

from dlts_lustre.client import LustreClient
from dlts_lustre.errors import LustreError, PolicyError, UnsafePlanError
from dlts_lustre.model import GraceState, GraceStatus, QuotaEntry, QuotaKind, QuotaReport
from dlts_lustre.plan import Plan, apply_plan, build_plan
from dlts_lustre.policy import load_policy
from dlts_lustre.runner import DEFAULT_TIMEOUT_S, Runner
from dlts_lustre.units import format_grace_s, human_kib

EXIT_COMMAND, EXIT_POLICY, EXIT_UNSAFE = 1, 2, 3


def to_jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        for name in ("healthy",):
            if hasattr(type(value), name) and isinstance(getattr(type(value), name), property):
                out[name] = getattr(value, name)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, frozenset, set)):
        items = [to_jsonable(v) for v in value]
        return sorted(items) if isinstance(value, (frozenset, set)) else items
    return value


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(to_jsonable(data), indent=2, sort_keys=True))


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn our typed errors into one readable message and an exit code, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UnsafePlanError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_UNSAFE)
        except PolicyError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_POLICY)
        except LustreError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_COMMAND)

    return wrapper


@click.group(help="Manage the DLTS Lustre filesystem: quotas, OST pools, VC directories.")
@click.option("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, show_default=True,
              help="Timeout for each lfs/lctl command.")
@click.pass_context
def main(ctx: click.Context, timeout_s: float) -> None:
    ctx.obj = {"timeout_s": timeout_s}


def _client(ctx: click.Context, dry_run: bool = False) -> LustreClient:
    return LustreClient(Runner(timeout_s=ctx.obj["timeout_s"], dry_run=dry_run))


# ---------------------------------------------------------------------------------------------- apply

def _plan_text(plan: Plan, *, dry_run: bool, force: bool) -> list[str]:
    lines = []
    for warning in plan.warnings:
        lines.append(f"warning: {warning}")
    if plan.empty:
        lines.append("nothing to do: the filesystem already matches the policy")
        return lines
    lines.append(("plan" if dry_run else "applying") + f" ({len(plan.actions)} action(s)):")
    for action in plan.actions:
        mark = ""
        if action.unsafe_reason:
            mark = " [UNSAFE, forced]" if force else " [UNSAFE: needs --force]"
        lines.append(f"  - {action.description}{mark}")
        lines.append(f"      $ {action.command}")
    return lines


@main.command(help="Make the filesystem match POLICY (YAML). Runs only what changes.")
@click.argument("policy_path", metavar="POLICY.yaml", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@click.option("--force", is_flag=True, help="Also run actions the plan marks unsafe.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@handle_errors
def apply(ctx: click.Context, policy_path: str, dry_run: bool, force: bool, as_json: bool) -> None:
    policy = load_policy(policy_path)
    client = _client(ctx, dry_run=dry_run)
    plan = build_plan(policy, client)
    if dry_run:
        if as_json:
            _emit_json({"dry_run": True, "changed": False, "actions": plan.actions, "warnings": plan.warnings,
                        "unsafe": [a.unsafe_reason for a in plan.unsafe]})
        else:
            for line in _plan_text(plan, dry_run=True, force=force):
                click.echo(line)
        return
    if plan.unsafe and not force:
        if not as_json:
            for line in _plan_text(plan, dry_run=True, force=False):
                click.echo(line)
        raise UnsafePlanError([a.unsafe_reason or "" for a in plan.unsafe])
    if not as_json:
        for line in _plan_text(plan, dry_run=False, force=force):
            click.echo(line)
    result = apply_plan(plan, client, force=force)
    if as_json:
        _emit_json({"dry_run": False, "changed": bool(result.executed), "actions": result.executed,
                    "warnings": plan.warnings})
    elif result.executed:
        click.echo(f"done: {len(result.executed)} action(s) applied")


# ---------------------------------------------------------------------------------------------- quota

def _grace_text(entry_grace: GraceStatus) -> str:
    if entry_grace.state is GraceState.NOT_STARTED:
        return "-"
    if entry_grace.state is GraceState.EXPIRED:
        return "expired"
    return format_grace_s(entry_grace.remaining_s or 0)


def _limit(value: int | None, size: bool) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "unlimited"
    return human_kib(value) if size else str(value)


def _entry_row(name: str, e: QuotaEntry, *, target: bool = False) -> list[str]:
    used = _limit(e.block_used_kib, True) if e.block_used_kib else ("0" if e.block_used_kib == 0 else "-")

    def limit(value: int | None, size: bool) -> str:
        # On a target row the limit column is the share granted to that target: 0 means none granted.
        if target and value == 0:
            return "0"
        return _limit(value, size)

    return [name, used + ("*" if e.block_over_limit else ""), limit(e.block_soft_kib, True),
            limit(e.block_hard_kib, True), _grace_text(e.block_grace),
            ("-" if e.inode_used is None else str(e.inode_used)) + ("*" if e.inode_over_limit else ""),
            limit(e.inode_soft, False), limit(e.inode_hard, False), _grace_text(e.inode_grace)]


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths)))
            .rstrip() for r in rows]


def quota_text(report: QuotaReport) -> list[str]:
    who = f"{report.kind.name.lower()} {report.name}" + (
        f" (id {report.numeric_id})" if report.numeric_id is not None and str(report.numeric_id) != report.name else "")
    lines = [f"Quota for {who} on {report.mount}" + (f", pool {report.pool}" if report.pool else "")]
    rows = [["target", "used", "soft", "hard", "grace", "files", "soft", "hard", "grace"],
            _entry_row(report.mount, report.total)]
    for t in report.targets:
        rows.append([t.uuid, "inactive", "", "", "", "", "", "", ""] if t.entry is None
                    else _entry_row(t.uuid, t.entry, target=True))
    lines += _table(rows)
    if report.uses_default_block or report.uses_default_file:
        parts = [p for p, on in (("block", report.uses_default_block), ("file", report.uses_default_file)) if on]
        lines.append(f"follows the default {' and '.join(parts)} quota")
    if report.inaccurate:
        lines.append("warning: some targets did not answer; values marked inaccurate are lower bounds")
    for err in report.errors:
        lines.append(f"warning: {err}")
    return lines


@main.command(help="Show the quota of one user, group or project on MOUNT.")
@click.option("--user", "kind", flag_value=QuotaKind.USER.value, help="ID is a user name or uid.")
@click.option("--group", "kind", flag_value=QuotaKind.GROUP.value, help="ID is a group name or gid.")
@click.option("--project", "kind", flag_value=QuotaKind.PROJECT.value, help="ID is a project id.")
@click.argument("ident", metavar="ID")
@click.argument("mount", metavar="MOUNT")
@click.option("--verbose", "-v", is_flag=True, help="Per-target rows.")
@click.option("--pool", default=None, help="Quota within one OST pool.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@handle_errors
def quota(ctx: click.Context, kind: str | None, ident: str, mount: str, verbose: bool, pool: str | None,
          as_json: bool) -> None:
    if kind is None:
        raise click.UsageError("choose one of --user, --group or --project")
    client = _client(ctx)
    version = client.version()  # says which output generation the numbers came from
    report = client.quota(QuotaKind(kind), ident, mount, verbose=verbose, pool=pool)
    if as_json:
        _emit_json({**to_jsonable(report), "lustre_version": str(version)})
    else:
        for line in quota_text(report):
            click.echo(line)
        click.echo(f"(Lustre {version})")


# ---------------------------------------------------------------------------------------------- status

def _passwd_users(min_uid: int = 1000) -> list[str]:
    return sorted({str(p.pw_uid) for p in pwd.getpwall() if min_uid <= p.pw_uid < 65534})


def collect_status(client: LustreClient, mount: str, *, users: list[str], top: int) -> dict[str, Any]:
    from dlts_lustre.metrics import fsname_from_df  # local import: metrics pulls in prometheus_client

    version = client.version()
    try:
        health: Any = client.health()
    except LustreError as exc:
        health = {"state": "unknown", "error": str(exc)}
    df_blocks = client.df(mount)
    df_inodes = client.df(mount, inodes=True)
    fsname = fsname_from_df(df_blocks)
    pools = []
    for name in client.pools(fsname):
        members = client.pool(fsname, name).ost_indices
        entry: dict[str, Any] = {"name": name, "ost_indices": list(members), "total_kib": 0, "free_kib": 0}
        if members:
            pool_df = client.df(mount, pool=name, fsname=fsname)
            entry["total_kib"] = sum(t.total for t in pool_df.osts() if t.active)
            entry["free_kib"] = sum(t.available for t in pool_df.osts() if t.active)
        pools.append(entry)
    usage: list[dict[str, Any]] = []
    delimited = version.new_quota_header  # cheaper, headerless form where the tool has it
    for ident in dict.fromkeys(users):
        report = client.quota(QuotaKind.USER, ident, mount, delimited=delimited)
        usage.append({"user": report.name or ident, "used_kib": report.total.block_used_kib or 0,
                      "files": report.total.inode_used or 0, "block_hard_kib": report.total.block_hard_kib or 0,
                      "over_limit": report.total.block_over_limit or report.total.inode_over_limit})
    usage.sort(key=lambda u: (-u["used_kib"], u["user"]))
    return {"fsname": fsname, "mount": mount, "version": str(version), "health": health,
            "targets": df_blocks.targets, "inodes": df_inodes.targets, "summary": df_blocks.summary,
            "pools": pools, "top_users": usage[:top]}


def status_text(status: dict[str, Any]) -> list[str]:
    health = status["health"]
    state = health.state.value if hasattr(health, "state") else health["state"]
    lines = [f"{status['fsname']} on {status['mount']} (Lustre {status['version']}): {state}"]
    if hasattr(health, "unhealthy_devices") and health.unhealthy_devices:
        lines.append("  unhealthy: " + ", ".join(health.unhealthy_devices))
    summary = status["summary"]
    if summary:
        lines.append(f"capacity {human_kib(summary.total)}, free {human_kib(summary.available)}")
    rows = [["target", "size", "used", "free", "use%", "flags"]]
    for t in status["targets"]:
        if not t.active:
            rows.append([t.uuid, "", "", "", "", "inactive"])
            continue
        pct = f"{100 * t.used // t.total}%" if t.total else "-"
        rows.append([t.uuid, human_kib(t.total), human_kib(t.used), human_kib(t.available), pct,
                     "".join(sorted(f.value for f in t.flags))])
    lines += _table(rows)
    if status["pools"]:
        lines.append("pools:")
        rows = [["pool", "osts", "size", "free"]]
        for p in status["pools"]:
            rows.append([p["name"], ",".join(map(str, p["ost_indices"])) or "(empty)", human_kib(p["total_kib"]),
                         human_kib(p["free_kib"])])
        lines += _table(rows)
    if status["top_users"]:
        lines.append("top users:")
        rows = [["user", "used", "files", "hard limit"]]
        for u in status["top_users"]:
            rows.append([u["user"] + (" *" if u["over_limit"] else ""), human_kib(u["used_kib"]), str(u["files"]),
                         human_kib(u["block_hard_kib"]) if u["block_hard_kib"] else "unlimited"])
        lines += _table(rows)
    return lines


@main.command(help="Health, space by target and pool, and the top users of MOUNT (or the policy's mount).")
@click.argument("mount", required=False)
@click.option("--policy", "policy_path", type=click.Path(dir_okay=False), default=None,
              help="Take the mount from this policy and include its override users.")
@click.option("--user", "users", multiple=True, help="Include this user in the top-users table (repeatable).")
@click.option("--passwd", "scan_passwd", is_flag=True, help="Include every local account with uid >= 1000.")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1), help="Rows of top users.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@handle_errors
def status(ctx: click.Context, mount: str | None, policy_path: str | None, users: tuple[str, ...],
           scan_passwd: bool, top: int, as_json: bool) -> None:
    candidates = list(users)
    if policy_path:
        policy = load_policy(policy_path)
        mount = mount or policy.filesystem.mount
        candidates += sorted(policy.user_quota.overrides)
    if mount is None:
        raise click.UsageError("give MOUNT or --policy")
    if scan_passwd:
        candidates += _passwd_users()
    data = collect_status(_client(ctx), mount, users=candidates, top=top)
    if as_json:
        _emit_json(data)
    else:
        for line in status_text(data):
            click.echo(line)


# ---------------------------------------------------------------------------------------------- serve-metrics

@main.command("serve-metrics")
@click.argument("mount")
@click.option("--listen", default="127.0.0.1:9446", show_default=True,
              help="HOST:PORT of the Prometheus endpoint (/metrics).")
@click.option("--section", "sections", multiple=True, type=click.Choice(("health", "df", "pools", "ost_stats", "mdt_stats")),
              help="Collect only these sections (repeatable; default all).")
@click.pass_context
def serve_metrics(ctx: click.Context, mount: str, listen: str, sections: tuple[str, ...]) -> None:
    """Serve the dlts_lustre_* metrics of the filesystem mounted at MOUNT (docs/lustre.md,
    docs/monitoring.md): run it on one client; every scrape runs lfs/lctl."""
    import signal
    import threading

    from prometheus_client import CollectorRegistry, start_http_server

    from dlts_lustre.metrics import SECTIONS, LustreCollector

    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise click.BadParameter("must be HOST:PORT, e.g. 0.0.0.0:9446", param_hint="--listen")
    registry = CollectorRegistry()
    registry.register(LustreCollector(mount, client=_client(ctx), sections=tuple(sections) or SECTIONS))
    try:
        server, _thread = start_http_server(int(port), addr=host.strip("[]"), registry=registry)
    except OSError as exc:
        raise click.ClickException(f"--listen: cannot listen on {listen}: {exc.strerror}") from None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    click.echo(f"serving dlts_lustre_* metrics of {mount} on http://{listen}/metrics")
    while not stop.wait(1.0):
        pass
    server.shutdown()


if __name__ == "__main__":  # pragma: no cover
    main()
