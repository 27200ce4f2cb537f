"""The user commands of ``dlts``: they talk only to the REST API (a URL and a token from ``dlts login``
or ``DLTS_URL``/``DLTS_TOKEN``), so they work from a laptop. docs/cli.md lists them and their exit codes.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import yaml

from dlts.client import output, profiles
from dlts.client.api import ApiError, Client

# exit codes (docs/cli.md); `submit --wait` exits with the job's own code
EXIT_FAILED = 1        # the API refused, or some ids of a batch failed
EXIT_USAGE = 2         # bad flags or spec file (click's own usage errors are 2 too)
EXIT_AUTH = 3          # not logged in, or the token was refused: run dlts login
EXIT_UNREACHABLE = 4   # the server could not be reached or did not answer in time
EXIT_JOB_KILLED = 143  # submit --wait: the job was killed (128 + SIGTERM)
EXIT_JOB_ERROR = 125   # submit --wait: DLTS could not run the job (status error)
EXIT_INTERRUPTED = 130  # Ctrl-C while waiting or following; the job goes on

LIVE_STATUSES = ("unapproved", "queued", "scheduling", "running", "pausing", "paused", "killing")
ENDED_STATUSES = ("killed", "finished", "failed", "error")
JOB_TYPES = ("batch", "interactive", "distributed", "inference")
# the job fields a spec file, --from and the flags may give (POST /api/v1/jobs, JobSubmitSchema)
SPEC_FIELDS = ("name", "vc", "image", "command", "type", "gpus", "sku", "cpu", "memory", "nodes", "preemptible",
               "max_retries", "max_time_s", "priority", "env", "ports", "ssh", "ib_domain", "min_replicas",
               "max_replicas", "ephemeral_storage_bytes", "run_as_root")
FLAG_OF = {"vc": "--vc", "gpus": "--gpus", "sku": "--sku", "nodes": "--nodes", "type": "--type", "image": "--image",
           "env": "--env", "max_time_s": "--max-time", "preemptible": "--preemptible", "priority": "--priority",
           "ssh": "--ssh", "ports": "--port", "name": "--name", "command": "the command after --", "cpu": "--cpu",
           "memory": "--memory", "max_retries": "--max-retries"}

IDLE_FLAG_OF = {"idle_warn_min": "--idle-warn-min", "idle_action_min": "--idle-action-min",
                "idle_action": "--idle-action", "exempt_types": "--idle-exempt"}


class CliError(click.ClickException):
    """One line on stderr (``Error: ...``) and an exit code of docs/cli.md; never a traceback."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED):
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]


def _from_api(exc: ApiError, label: str | None = None) -> CliError:
    code = EXIT_AUTH if exc.status == 401 else EXIT_UNREACHABLE if exc.status == 0 else EXIT_FAILED
    return CliError(exc.describe(label), code)


def poll_s() -> float:
    """How often --wait, logs -f and jobs --watch ask (DLTS_POLL_S, default 1 s)."""
    try:
        return max(0.05, float(os.environ.get("DLTS_POLL_S", "1")))
    except ValueError:
        return 1.0


def timeout_s() -> float:
    try:
        return max(1.0, float(os.environ.get("DLTS_TIMEOUT", "30")))
    except ValueError:
        return 30.0


def _complete_profiles(ctx, param, incomplete):
    try:
        return [name for name in profiles.read_all() if name.startswith(incomplete)]
    except profiles.ProfileError:
        return []


profile_option = click.option("--profile", "profile_name", metavar="NAME", envvar="DLTS_PROFILE",
                              shell_complete=_complete_profiles,
                              help="The stored profile to use (default: 'default'; env DLTS_PROFILE).")


def connect(profile_name: str | None) -> Client:
    try:
        profile = profiles.resolve(profile_name)
    except profiles.ProfileError as exc:
        raise CliError(str(exc), EXIT_AUTH) from None
    if not profile.url or not profile.token:
        missing = "URL" if not profile.url else "token"
        raise CliError(f"not logged in (no {missing} for profile {profile.name!r}): run `dlts login URL`"
                       f"{' --profile ' + profile.name if profile.name != profiles.DEFAULT_PROFILE else ''}, "
                       "or set DLTS_URL and DLTS_TOKEN", EXIT_AUTH)
    return Client(profile.url, profile.token, timeout_s())


def mark_user(command: click.Command) -> click.Command:
    """List the command under "User commands" in ``dlts --help`` (dlts.cli.SectionedGroup)."""
    setattr(command, "dlts_section", "user")  # noqa: B010 - an attribute click does not declare
    return command


def user_command(group, name: str | None = None, **kwargs):
    """A user command: ``--profile``, a Client as the first argument, API errors as one line."""

    def decorate(fn):
        @functools.wraps(fn)
        def run(profile_name, **params):
            try:
                return fn(connect(profile_name), **params)
            except ApiError as exc:
                raise _from_api(exc) from None
            except KeyboardInterrupt:
                _echo_err("interrupted")
                sys.exit(EXIT_INTERRUPTED)

        return mark_user(group.command(name, **kwargs)(profile_option(run)))

    return decorate


def _echo_err(text: str) -> None:
    click.echo(text, err=True)


# -- login, whoami, logout -----------------------------------------------------------------------

def register(main: click.Group, vc_group: click.Group) -> None:
    """Add the user commands to ``dlts`` (and ``show`` to the server's ``dlts vc``)."""

    @main.command()
    @click.argument("url")
    @click.option("--token-file", type=click.File("r"), help="Read the API token from this file ('-': standard input) "
                                                             "instead of asking for it.")
    @profile_option
    def login(url: str, token_file, profile_name: str | None) -> None:
        """Check a URL and API token, and store them as a profile."""
        if not url.startswith(("http://", "https://")):
            raise click.BadParameter("must start with http:// or https:// (e.g. http://127.0.0.1:5000)", param_hint="URL")
        if token_file is not None:
            token = token_file.read().strip()
        else:
            token = click.prompt("API token (the portal's Tokens page, or `dlts user token NAME`)", hide_input=True,
                                 err=True).strip()
        if not token:
            raise click.BadParameter("the token is empty", param_hint="--token-file" if token_file else "token")
        client = Client(url, token, timeout_s())
        try:
            me = client.get("/me")
        except ApiError as exc:
            if exc.status == 401:
                raise CliError(f"{url} refused this token: {exc.message} Get a new one from the portal's Tokens page.",
                               EXIT_AUTH) from None
            raise _from_api(exc) from None
        name = profile_name or profiles.DEFAULT_PROFILE
        try:
            path = profiles.save(name, client.base, token)
        except (profiles.ProfileError, OSError) as exc:
            raise CliError(f"cannot store the profile: {exc}") from None
        click.echo(f"logged in to {client.base} as {me['name']} (profile {name!r}, stored in {path})")

    mark_user(login)

    @main.command()
    @profile_option
    def logout(profile_name: str | None) -> None:
        """Forget a stored profile (the token stays valid until revoked)."""
        name = profile_name or profiles.DEFAULT_PROFILE
        try:
            removed = profiles.remove(name)
        except (profiles.ProfileError, OSError) as exc:
            raise CliError(str(exc)) from None
        click.echo(f"profile {name!r} removed" if removed else f"no profile {name!r}; nothing to do")

    mark_user(logout)

    @user_command(main)
    @click.option("--json", "as_json", is_flag=True, help="Print GET /api/v1/me as JSON.")
    def whoami(client: Client, as_json: bool) -> None:
        """Who your token signs in as: roles, VCs, GPUs in use."""
        me = client.get("/me")
        if as_json:
            output.echo_json(me | {"url": client.base})
            return
        roles = "cluster admin" if me.get("cluster_admin") else "user"
        ident = f", uid {me['uid']} gid {me['gid']}" if me.get("uid") is not None else ""
        click.echo(f"{me['name']} at {client.base} ({roles}{ident})")
        rows = [[v["name"], ",".join(v.get("roles", [])), str(v.get("gpus_used", 0)),
                 ", ".join(f"{k}={n}" for k, n in sorted((v.get("quota") or {}).items())) or "-"] for v in me.get("vcs", [])]
        if rows:
            click.echo(output.table(["VC", "ROLES", "GPUS-USED", "QUOTA"], rows, right={2}))
        else:
            click.echo("member of no VC yet: ask a VC admin to add you")

    # -- submit -------------------------------------------------------------------------------------

    @user_command(main, context_settings={"allow_interspersed_args": False})
    @click.option("-f", "--file", "spec_file", type=click.File("r"), help="A job spec in YAML or JSON with the fields "
                  "of POST /api/v1/jobs ('-': standard input); flags override it.")
    @click.option("--from", "from_id", type=click.IntRange(1), metavar="ID", help="Start from job ID's spec (a clone); "
                  "flags override it.")
    @click.option("--vc", help="The VC to run in (default: your only VC).")
    @click.option("--name", help="The job's name (default: <type>-<id>).")
    @click.option("--image", help="Container image.")
    @click.option("--type", "job_type", type=click.Choice(JOB_TYPES), help="Job type (default: batch).")
    @click.option("--gpus", type=click.IntRange(0, 1024), help="GPUs (per node for distributed jobs).")
    @click.option("--sku", help="GPU type, e.g. a100 (default: any with quota).")
    @click.option("--nodes", type=click.IntRange(0, 1024), help="Nodes (distributed jobs).")
    @click.option("--cpu", type=click.FloatRange(0.001, 4096), help="CPU cores.")
    @click.option("--memory", help="Memory, bytes or a size like 16Gi.")
    @click.option("--env", "env", multiple=True, metavar="K=V", help="An environment variable; repeat for more.")
    @click.option("--max-time", metavar="DURATION", help="Time limit: 90s, 45m, 2h, 1d, 1h30m.")
    @click.option("--preemptible/--no-preemptible", default=None, help="Run on idle quota of other VCs; may be preempted.")
    @click.option("--priority", type=click.IntRange(1, 1000), help="Priority in your VC's queue (default 100; "
                  "above 100 only for VC admins).")
    @click.option("--max-retries", type=click.IntRange(0, 100), help="Retries after a failure of the node or the job.")
    @click.option("--ssh", is_flag=True, default=None, help="Open an ssh endpoint (needs a key: dlts keys add).")
    @click.option("--port", "ports", multiple=True, type=click.IntRange(1024, 65535), metavar="N",
                  help="A port the job listens on, exposed as an endpoint; repeat for more.")
    @click.option("--tag", "tags", multiple=True, metavar="TAG", help="A tag to find the job by later; repeat for more.")
    @click.option("--wait", is_flag=True, help="Show the job's state changes until it ends; exit with its exit code.")
    @click.option("--json", "as_json", is_flag=True, help="Print the new job as JSON instead of its id.")
    @click.argument("command", nargs=-1, type=click.UNPROCESSED)
    def submit(client: Client, spec_file, from_id, vc, name, image, job_type, gpus, sku, nodes, cpu, memory, env,
               max_time, preemptible, priority, max_retries, ssh, ports, tags, wait, as_json, command) -> None:
        """Submit a job like sbatch (flags, -f FILE, --from ID, -- CMD); print its id."""
        spec: dict = {}
        if from_id is not None:
            spec.update(_clone_spec(client, from_id))
        if spec_file is not None:
            spec.update(_read_spec(spec_file))
        flags = {"vc": vc, "name": name, "image": image, "type": job_type, "gpus": gpus, "sku": sku, "nodes": nodes,
                 "cpu": cpu, "memory": memory, "preemptible": preemptible, "priority": priority,
                 "max_retries": max_retries, "ssh": ssh}
        given = {k: v for k, v in flags.items() if v is not None}
        spec.update(given)
        from_flags = set(given) | ({"max_time_s"} if max_time is not None else set()) | ({"env"} if env else set()) \
            | ({"ports"} if ports else set()) | ({"command"} if command else set()) | ({"tags"} if tags else set())
        if max_time is not None:
            try:
                spec["max_time_s"] = output.parse_duration(max_time)
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint="--max-time") from None
        if env:
            merged = dict(spec.get("env") or {})
            for item in env:
                key, sep, value = item.partition("=")
                if not sep or not key:
                    raise click.BadParameter(f"{item!r} is not K=V", param_hint="--env")
                merged[key] = value
            spec["env"] = merged
        if ports:
            spec["ports"] = list(ports)
        if tags:
            spec["tags"] = list(tags)
        if command:
            spec["command"] = command[0] if len(command) == 1 else shlex.join(command)
        if not spec.get("vc"):
            spec["vc"] = _only_vc(client)
        if not spec.get("command"):
            raise click.UsageError("no command: give it after -- (dlts submit --gpus 1 -- python train.py), "
                                   "or as 'command' in the -f file")
        spec.setdefault("image", os.environ.get("DLTS_IMAGE") or "")
        if not spec["image"]:
            raise click.BadParameter("give the container image (or 'image' in the -f file, or DLTS_IMAGE)",
                                     param_hint="--image")
        try:
            job = client.submit(spec)
        except ApiError as exc:
            field = (exc.field or "").split(".")[0]
            flag = FLAG_OF.get(field) if field in from_flags else None  # else the field, as in the -f file
            raise _from_api(exc, flag if flag and flag.startswith("--") else None) from None
        if as_json:
            output.echo_json(job)
        else:
            click.echo(job["id"])
        if wait:
            sys.exit(wait_for(client, job["id"]))

    # -- jobs, show ------------------------------------------------------------------------------

    @user_command(main)
    @click.option("--vc", help="Only this VC's jobs.")
    @click.option("--user", help="Only this user's jobs.")
    @click.option("--mine", is_flag=True, help="Only your jobs.")
    @click.option("--status", metavar="S[,S...]", help=f"Only these statuses ({', '.join(LIVE_STATUSES + ENDED_STATUSES)}).")
    @click.option("--all", "show_all", is_flag=True, help="Ended jobs too (default: only jobs that have not ended).")
    @click.option("--type", "job_type", type=click.Choice(JOB_TYPES), help="Only jobs of this type.")
    @click.option("--tag", help="Only jobs with this tag.")
    @click.option("--starred", is_flag=True, help="Only the jobs you starred (dlts star).")
    @click.option("--archived", type=click.Choice(["false", "true", "all"]), default="false", show_default=True,
                  help="Archived jobs: hidden, only them, or both.")
    @click.option("--limit", type=click.IntRange(1, 100000), default=200, show_default=True, help="At most this many jobs.")
    @click.option("--json", "as_json", is_flag=True, help="Print the jobs as a JSON list.")
    @click.option("--watch", is_flag=True, help="Redraw every --interval seconds until Ctrl-C.")
    @click.option("--interval", type=click.FloatRange(0.2, 3600), default=2.0, show_default=True, help="Seconds between redraws.")
    def jobs(client: Client, vc, user, mine, status, show_all, job_type, tag, starred, archived, limit, as_json, watch,
             interval) -> None:
        """List jobs like squeue: status, reason, queue position, start, time left."""
        if mine:
            if user:
                raise click.UsageError("give --mine or --user, not both")
            user = client.get("/me")["name"]
        statuses = status or (None if show_all else ",".join(LIVE_STATUSES))
        if archived != "false" and not status:
            statuses = None  # archived jobs have ended
        params = {"vc": vc, "user": user, "status": statuses, "type": job_type, "tag": tag,
                  "favourite": "true" if starred else None, "archived": archived}
        while True:
            items = list(client.pages("/jobs", limit=limit, **params))
            if as_json:
                click.echo(json.dumps(items, indent=2, sort_keys=True))
            else:
                if watch and output.colour_on():
                    click.clear()
                if watch:
                    click.echo(f"{client.base}  {time.strftime('%H:%M:%S')}  ({len(items)} jobs; Ctrl-C stops)")
                click.echo(_jobs_table(items) if items else "no jobs" + ("" if show_all or status else
                                                                         " that have not ended (--all shows the rest)"))
                for line in _estimate_notes(items):
                    click.echo(line)
            if not watch:
                return
            sys.stdout.flush()
            try:
                time.sleep(interval)
            except KeyboardInterrupt:
                return

    @user_command(main)
    @click.argument("job_id", type=click.IntRange(1), metavar="ID")
    @click.option("--json", "as_json", is_flag=True, help="Print GET /api/v1/jobs/ID as JSON.")
    def show(client: Client, job_id: int, as_json: bool) -> None:
        """Show one job: spec, status and reason, attempts, endpoints, events."""
        job = client.get(f"/jobs/{job_id}")
        if as_json:
            output.echo_json(job)
            return
        click.echo(_job_details(client, job, output.colour_on()))

    # -- logs ------------------------------------------------------------------------------------

    @user_command(main)
    @click.argument("job_id", type=click.IntRange(1), metavar="ID")
    @click.option("-f", "--follow", is_flag=True, help="Keep printing as the job writes, until it ends.")
    @click.option("--attempt", type=click.IntRange(1, 10000), help="This attempt's log (default: the current one).")
    @click.option("--download", "download", type=click.Path(dir_okay=False, allow_dash=True), metavar="FILE",
                  help="Save the attempt's whole log to FILE ('-': standard output).")
    def logs(client: Client, job_id: int, follow: bool, attempt: int | None, download: str | None) -> None:
        """Print a job's log; -f follows it until the job ends."""
        if download is not None:
            if follow:
                raise click.UsageError("--download saves the log as it is now; leave out -f")
            _download(client, job_id, attempt, download)
            return
        try:
            follow_log(client, job_id, attempt, follow)
        except KeyboardInterrupt:
            sys.exit(EXIT_INTERRUPTED)

    # -- actions ---------------------------------------------------------------------------------

    for action, doc in (("kill", "Kill jobs (a result per id; exit 1 if any failed)."),
                        ("pause", "Pause jobs; they keep their place (a result per id)."),
                        ("resume", "Resume paused jobs (a result per id)."),
                        ("approve", "Approve jobs waiting for a VC admin (a result per id).")):
        _batch_command(main, action, doc)

    # -- jobs people keep: tags, stars, archive, delete ---------------------------------------------

    @user_command(main)
    @click.argument("job_id", type=click.IntRange(1), metavar="ID")
    @click.argument("tags", nargs=-1, metavar="TAG...")
    @click.option("--clear", is_flag=True, help="Remove every tag.")
    def tag(client: Client, job_id: int, tags, clear: bool) -> None:
        """Set a job's tags (they replace the old ones); without TAG, print them."""
        if clear and tags:
            raise click.UsageError("give TAG... or --clear, not both")
        if not tags and not clear:
            click.echo(" ".join(client.get(f"/jobs/{job_id}").get("tags") or []) or "no tags")
            return
        answer = client.put(f"/jobs/{job_id}/tags", {"tags": list(tags)})
        click.echo(f"job {job_id}: " + (" ".join(answer["tags"]) or "no tags"))

    for verb, path, method, doc in (
            ("star", "favourite", "PUT", "Star jobs for yourself (dlts jobs --starred lists them)."),
            ("unstar", "favourite", "DELETE", "Unstar jobs."),
            ("archive", "archive", "POST", "Archive ended jobs of yours: hidden from lists, still in usage."),
            ("unarchive", "unarchive", "POST", "Bring archived jobs back into the lists."),
            ("delete", "", "DELETE", "Delete ended jobs of yours with their logs (usage keeps their GPU time).")):
        _each_command(main, verb, path, method, doc)

    # -- endpoints, ssh ---------------------------------------------------------------------------

    @user_command(main)
    @click.argument("job_id", type=click.IntRange(1), metavar="ID")
    @click.argument("action", type=click.Choice(["list", "open", "close"]), required=False, default="list")
    @click.argument("target", required=False, metavar="[KIND|EID]")
    @click.option("--port", type=click.IntRange(1024, 65535), help="open port: the port the job listens on.")
    @click.option("--name", help="open: the endpoint's name (default: the kind, port-N for a port).")
    @click.option("--json", "as_json", is_flag=True, help="Print the API's answer as JSON.")
    @click.option("--wait", "wait_s", type=click.FloatRange(0, 86400), is_flag=False, flag_value=300.0, default=None,
                  metavar="[SECONDS]", help="list: first wait until every endpoint is ready (at most SECONDS, "
                                            "default 300); exit 1 if one failed or time ran out.")
    def endpoints(client: Client, job_id: int, action: str, target: str | None, port, name, as_json, wait_s) -> None:
        """List a job's endpoints, open one (ssh, jupyter, vscode, port) or close one."""
        if wait_s is not None and action != "list":
            raise click.UsageError("--wait goes with list: dlts endpoints ID --wait")
        if action == "list":
            if target is not None:
                raise click.UsageError("list takes no argument")
            items = client.get(f"/jobs/{job_id}/endpoints")["items"]
            if wait_s is not None:
                items = _wait_ready(client, job_id, items, wait_s)
            if as_json:
                output.echo_json(items)
            else:
                click.echo(_endpoints_table(items, output.colour_on()) if items else
                           f"job {job_id} has no endpoints (open one: dlts endpoints {job_id} open ssh|jupyter|vscode|port)")
            if wait_s is not None and any(e["status"] != "ready" for e in items):
                sys.exit(EXIT_FAILED)
            return
        if action == "open":
            kinds = ("ssh", "jupyter", "vscode", "port")
            if target not in kinds:
                raise click.BadParameter(f"open what? one of {', '.join(kinds)}", param_hint="KIND")
            body = {"kind": target} | ({"port": port} if port is not None else {}) | ({"name": name} if name else {})
            made = client.post(f"/jobs/{job_id}/endpoints", body)
            if as_json:
                output.echo_json(made)
                return
            click.echo(f"endpoint {made['id']} ({made['kind']} {made['name']}) of job {job_id}: {made['status']}"
                       + (f" {made['url']}" if made.get("url") else ""))
            if made.get("token"):
                click.echo(f"token (its password; shown this once): {made['token']}")
            return
        if target is None or not (target.isascii() and target.isdigit()):
            raise click.BadParameter("close needs the endpoint's id (from dlts endpoints ID)", param_hint="EID")
        closed = client.delete(f"/jobs/{job_id}/endpoints/{int(target)}")
        if as_json:
            output.echo_json(closed)
        else:
            click.echo(f"endpoint {target} of job {job_id}: {(closed or {}).get('status', 'closing')}")

    @user_command(main, context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
    @click.argument("job_id", type=click.IntRange(1), metavar="ID")
    @click.option("--print", "print_only", is_flag=True, help="Print the ssh command instead of running it.")
    @click.option("--login", metavar="NAME", help="The user to log in as (default: the job's owner, as the endpoint "
                                                  "says; the demo's jobs run as your local user).")
    @click.argument("ssh_args", nargs=-1, type=click.UNPROCESSED, metavar="[SSH-OPTION...] [-- COMMAND...]")
    def ssh(client: Client, job_id: int, print_only: bool, login: str | None, ssh_args) -> None:
        """Run ssh into a job through its ssh endpoint (extra arguments go to ssh)."""
        options, remote = list(ssh_args), []
        if "--" in options:
            cut = options.index("--")
            options, remote = options[:cut], options[cut + 1:]
        items = client.get(f"/jobs/{job_id}/endpoints")["items"]
        ssh_eps = [e for e in items if e["kind"] == "ssh"]
        ready = next((e for e in ssh_eps if e["status"] == "ready" and e.get("host") and e.get("host_port")), None)
        if ready is None:
            if not ssh_eps:
                raise CliError(f"job {job_id} has no ssh endpoint: open one with `dlts endpoints {job_id} open ssh` "
                               "(it needs an SSH key: `dlts keys add ~/.ssh/id_ed25519.pub`)")
            e = ssh_eps[0]
            raise CliError(f"the ssh endpoint of job {job_id} is {e['status']}"
                           + (f": {e['message']}" if e.get("message") else "")
                           + " (it is ready once the job runs; see `dlts endpoints " + str(job_id) + "`)")
        user = login
        url = ready.get("url") or ""
        if not user and url.startswith("ssh://") and "@" in url:
            user = url[len("ssh://"):].split("@", 1)[0]
        if not user:
            user = client.get(f"/jobs/{job_id}")["user"]
        argv = ["ssh", "-p", str(ready["host_port"]), *options, f"{user}@{ready['host']}", *remote]
        if print_only:
            click.echo(shlex.join(argv))
            return
        try:
            os.execvp("ssh", argv)
        except OSError as exc:
            raise CliError(f"cannot run ssh: {exc.strerror}; the command is: {shlex.join(argv)}") from None

    # -- keys, ips ---------------------------------------------------------------------------------

    @main.group(invoke_without_command=True)
    @profile_option
    @click.option("--json", "as_json", is_flag=True, help="Print the keys as JSON.")
    @click.pass_context
    def keys(ctx, profile_name, as_json) -> None:
        """List, add or delete your SSH public keys (for ssh into your jobs)."""
        if ctx.invoked_subcommand is not None:
            return
        try:
            _list_keys(connect(profile_name), as_json)
        except ApiError as exc:
            raise _from_api(exc) from None

    mark_user(keys)

    @user_command(keys, "list")
    @click.option("--json", "as_json", is_flag=True, help="Print the keys as JSON.")
    def keys_list(client: Client, as_json) -> None:
        """List your SSH public keys (the same as plain `dlts keys`)."""
        _list_keys(client, as_json)

    @user_command(keys, "add")
    @click.argument("key_file", type=click.File("r"), metavar="FILE")
    @click.option("--name", help="A name for the key (default: its comment).")
    def keys_add(client: Client, key_file, name) -> None:
        """Add the OpenSSH public key in FILE ('-': standard input)."""
        line = key_file.read().strip()
        body = {"public_key": line} | ({"name": name} if name else {})
        made = client.post("/me/ssh-keys", body)
        click.echo(f"key {made['id']} added: {made['key_type']} {made['fingerprint']}")

    @user_command(keys, "delete")
    @click.argument("key_id", type=click.IntRange(1), metavar="ID")
    def keys_delete(client: Client, key_id: int) -> None:
        """Delete SSH key ID."""
        client.delete(f"/me/ssh-keys/{key_id}")
        click.echo(f"key {key_id} deleted")

    @main.group(invoke_without_command=True)
    @profile_option
    @click.option("--user", help="Cluster admins: another user's list.")
    @click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON.")
    @click.pass_context
    def ips(ctx, profile_name, user, as_json) -> None:
        """List, add or delete the addresses allowed to reach your jobs' endpoints."""
        if ctx.invoked_subcommand is not None:
            return
        try:
            items = connect(profile_name).get("/me/allowed-ips", user=user)["items"]
        except ApiError as exc:
            raise _from_api(exc) from None
        if as_json:
            output.echo_json(items)
            return
        click.echo(output.table(["ID", "USER", "ADDRESS", "ADDED", "EXPIRES"],
                                [[e["id"], e.get("user"), e["cidr"], output.relative(e.get("created_at")),
                                  output.relative(e.get("expires_at"))] for e in items], right={0})
                   if items else "no allowed IPs (add the address you connect from: dlts ips add ADDRESS)")

    mark_user(ips)

    @user_command(ips, "add")
    @click.argument("address", metavar="ADDRESS")
    @click.option("--user", help="Cluster admins: for another user.")
    def ips_add(client: Client, address: str, user: str | None) -> None:
        """Allow an IPv4/IPv6 address or CIDR (adding it again renews it)."""
        made = client.post("/me/allowed-ips", {"ip": address} | ({"user": user} if user else {}))
        click.echo(f"{made['cidr']} {'renewed' if made.get('renewed') else 'allowed'} (id {made['id']}), "
                   f"expires {output.relative(made.get('expires_at'))}")

    @user_command(ips, "delete")
    @click.argument("entry_id", type=click.IntRange(1), metavar="ID")
    def ips_delete(client: Client, entry_id: int) -> None:
        """Delete allowed IP entry ID."""
        client.delete(f"/me/allowed-ips/{entry_id}")
        click.echo(f"entry {entry_id} deleted")

    # -- vc show, usage ------------------------------------------------------------------------------

    @user_command(vc_group, "show")
    @click.argument("name")
    @click.option("--json", "as_json", is_flag=True, help="Print GET /api/v1/vcs/NAME as JSON.")
    def vc_show(client: Client, name: str, as_json: bool) -> None:
        """Show a VC (via the API): quota and use per SKU, users, limits, members."""
        vc = client.get(f"/vcs/{name}")
        if as_json:
            output.echo_json(vc)
            return
        click.echo(_vc_details(vc))

    @user_command(vc_group, "tune")
    @click.argument("name")
    @click.option("--policy", type=click.Choice(["RF", "FIFO", "backfill"]), help="The VC's scheduling policy.")
    @click.option("--max-job-time", metavar="DURATION|none", help="Longest a job may run (e.g. 3d, 12h); none: no limit.")
    @click.option("--runtime-estimate", metavar="DURATION|none",
                  help="backfill: how long a job without a limit is assumed to run; none: the cluster default.")
    @click.option("--user-gpu-quota", metavar="N|none", help="GPUs one user may hold in the VC; none: no per-user limit.")
    @click.option("--max-interactive-gpus", metavar="N|none", help="GPUs one interactive job may ask; none: no limit.")
    @click.option("--max-queued-jobs-per-user", metavar="N|none",
                  help="Jobs one user may have waiting; 0: no limit; none: the cluster default.")
    @click.option("--max-submissions-per-minute", metavar="N|none",
                  help="Submissions one user may make per minute; 0: no limit; none: the cluster default.")
    @click.option("--notice", metavar="TEXT|none", help="A notice shown to (and mailed to) the VC's members; none: clear it.")
    @click.option("--idle-warn-min", type=float, metavar="MIN",
                  help="Idle-job policy: minutes of idle GPUs before the owner is warned.")
    @click.option("--idle-action-min", type=float, metavar="MIN",
                  help="Idle-job policy: minutes after the warning, still idle, before the action.")
    @click.option("--idle-action", type=click.Choice(["pause", "kill", "none"]), help="Idle-job policy: what is done then.")
    @click.option("--idle-exempt", "idle_exempt", multiple=True, type=click.Choice(JOB_TYPES), metavar="TYPE",
                  help="Idle-job policy: a job type it leaves alone; repeat for more.")
    @click.option("--no-idle-policy", is_flag=True, help="Turn the idle-job policy off.")
    @click.option("--fair-share/--no-fair-share", "fair_share", default=None,
                  help="Order the VC's waiting jobs by their users' recent GPU use (or not).")
    @click.option("--fair-share-default", is_flag=True,
                  help="Clear --fair-share/--no-fair-share: the default (dlts.yaml) applies again.")
    @click.option("--fair-share-max-wait-s", metavar="N|none",
                  help="Seconds after which fair share stops holding a job behind newer work of lighter users; "
                       "none: the default (dlts.yaml).")
    @click.option("--limit-weight", metavar="W|none",
                  help="Shorter limits first: among jobs of equal priority each ranks as if queued W times its limit "
                       "later (e.g. 0.25: a 7-day job 42 h later, a 1-hour job 15 min); 0: by queue time; "
                       "none: the default (dlts.yaml).")
    @click.option("--min-runtime-s", metavar="N|none",
                  help="Seconds a preemptible job runs before reclaim may preempt it; none: the default (dlts.yaml).")
    @click.option("--max-reclaim-delay-s", metavar="N|none",
                  help="Seconds a job may wait for reclaim before --min-runtime-s stops protecting the jobs it would "
                       "preempt; none: the default (dlts.yaml).")
    @click.option("--max-preemptions", metavar="N|none",
                  help="Preemptions after which a job is protected for --min-runtime-s of every later run; 0: no limit; "
                       "none: the default (dlts.yaml).")
    @click.option("--json", "as_json", is_flag=True, help="Print the VC as the API answers it (GET /api/v1/vcs/NAME).")
    def vc_tune(client: Client, name: str, policy: str | None, max_job_time: str | None, runtime_estimate: str | None,
                user_gpu_quota: str | None, max_interactive_gpus: str | None, max_queued_jobs_per_user: str | None,
                max_submissions_per_minute: str | None, notice: str | None, idle_warn_min: float | None,
                idle_action_min: float | None, idle_action: str | None, idle_exempt: tuple[str, ...],
                no_idle_policy: bool, fair_share: bool | None, fair_share_default: bool,
                fair_share_max_wait_s: str | None, limit_weight: str | None, min_runtime_s: str | None, max_reclaim_delay_s: str | None,
                max_preemptions: str | None, as_json: bool) -> None:
        """Tune a VC you administer (via the API): policy, limits, notice, idle-job policy, fair share, the weight
        of limits in the order and the preemption budget."""
        body: dict[str, Any] = {}
        flags: dict[str, str] = {}

        def put(field: str, flag: str, value: Any) -> None:
            body[field], flags[field] = value, flag

        if policy is not None:
            put("policy", "--policy", policy)
        for field, flag, text in (("max_job_time_s", "--max-job-time", max_job_time),
                                  ("default_runtime_estimate_s", "--runtime-estimate", runtime_estimate)):
            if text is not None:
                put(field, flag, _none_or(text, flag, output.parse_duration))
        for field, flag, text in (("user_gpu_quota", "--user-gpu-quota", user_gpu_quota),
                                  ("max_interactive_gpus", "--max-interactive-gpus", max_interactive_gpus),
                                  ("max_queued_jobs_per_user", "--max-queued-jobs-per-user", max_queued_jobs_per_user),
                                  ("max_submissions_per_minute", "--max-submissions-per-minute",
                                   max_submissions_per_minute),
                                  ("fair_share_max_wait_s", "--fair-share-max-wait-s", fair_share_max_wait_s),
                                  ("min_runtime_s", "--min-runtime-s", min_runtime_s),
                                  ("max_reclaim_delay_s", "--max-reclaim-delay-s", max_reclaim_delay_s),
                                  ("max_preemptions", "--max-preemptions", max_preemptions)):
            if text is not None:
                put(field, flag, _none_or(text, flag, _whole_number))
        if limit_weight is not None:
            put("limit_weight", "--limit-weight", _none_or(limit_weight, "--limit-weight", _weight))
        if notice is not None:
            put("notice", "--notice", None if notice.lower() == "none" else notice)
        if fair_share_default and fair_share is not None:
            raise click.UsageError("--fair-share-default clears the VC's fair-share setting: give it without "
                                   "--fair-share/--no-fair-share")
        if fair_share_default or fair_share is not None:
            put("fair_share", "--fair-share-default" if fair_share_default else
                "--fair-share" if fair_share else "--no-fair-share", fair_share)
        idle: dict[str, Any] = {k: v for k, v in (("idle_warn_min", idle_warn_min), ("idle_action_min", idle_action_min),
                                                  ("idle_action", idle_action)) if v is not None}
        if idle_exempt:
            idle["exempt_types"] = list(idle_exempt)
        if no_idle_policy and idle:
            raise click.UsageError("--no-idle-policy turns the policy off: give it without the other --idle-* options")
        if no_idle_policy or idle:
            put("idle_policy", "--no-idle-policy" if no_idle_policy else "--idle-warn-min", None if no_idle_policy else idle)
        if not body:
            raise click.UsageError("nothing to change: give at least one option (dlts vc tune --help)")
        try:
            vc = client.patch(f"/vcs/{name}", body)
        except ApiError as exc:
            parts = (exc.field or "").split(".")
            label = IDLE_FLAG_OF.get(parts[1]) if parts[0] == "idle_policy" and len(parts) > 1 else flags.get(parts[0])
            raise _from_api(exc, label) from None
        if as_json:
            output.echo_json(vc)
        else:
            click.echo(_vc_details(vc))

    @user_command(main)
    @click.option("--group-by", default="user", show_default=True,
                  help="Comma list of user, vc, sku, preemptible, month, day, job.")
    @click.option("--from", "from_", metavar="DATE", help="First day (YYYY-MM-DD) or month (YYYY-MM); default: this month.")
    @click.option("--to", metavar="DATE", help="Last day or month, inclusive; default: today.")
    @click.option("--vc", help="Only this VC.")
    @click.option("--user", help="Only this user.")
    @click.option("--csv", "as_csv", is_flag=True, help="Print the API's CSV.")
    @click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")
    def usage(client: Client, group_by, from_, to, vc, user, as_csv, as_json) -> None:
        """GPU hours booked, busy and idle, by user, VC, SKU, month, day or job."""
        params = {"group_by": group_by, "from": from_, "to": to, "vc": vc, "user": user}
        if as_csv:
            click.echo(client.text("/usage", **params, format="csv"), nl=False)
            return
        report = client.get("/usage", **params)
        if as_json:
            output.echo_json(report)
            return
        keys_ = [k if k != "job" else "job_id" for k in report["group_by"]]
        rows = [[str(r.get(k, "-")) for k in keys_] + [f"{r['gpu_hours']:.2f}", f"{r['busy_gpu_hours']:.2f}",
                                                      f"{r['idle_gpu_hours']:.2f}", f"{r['preemptible_share']:.0%}"]
                for r in report["items"]]
        click.echo(f"GPU hours {report['from']} to {report['to']}" + (" (truncated)" if report.get("truncated") else ""))
        n = len(keys_)
        click.echo(output.table([k.upper() for k in keys_] + ["GPU-H", "BUSY-H", "IDLE-H", "PREEMPTIBLE"], rows,
                                right=set(range(n, n + 4))) if rows else "no GPU time booked in this range")


def _batch_command(main: click.Group, action: str, doc: str) -> None:
    @user_command(main, action, help=doc)
    @click.argument("ids", nargs=-1, required=True, type=click.IntRange(1), metavar="ID...")
    @click.option("--json", "as_json", is_flag=True, help="Print the API's per-id results as JSON.")
    def run(client: Client, ids, as_json: bool) -> None:
        results, failed = [], 0
        for start in range(0, len(ids), 500):
            answer = client.post("/jobs:batch", {"action": action, "ids": list(ids[start:start + 500])})
            results.extend(answer["results"])
            failed += answer["failed"]
        if as_json:
            output.echo_json({"action": action, "results": results, "failed": failed,
                              "succeeded": len(results) - failed})
        else:
            colour = output.colour_on()
            for r in results:
                if r["ok"]:
                    click.echo(f"job {r['id']}: {output.status_text(r.get('status'), colour)}")
                else:
                    click.echo(f"job {r['id']}: failed: {r.get('message') or ''} ({r.get('code')}, HTTP {r.get('http_status')})")
            if failed:
                _echo_err(f"{action}: {failed} of {len(results)} failed")
        if failed:
            sys.exit(EXIT_FAILED)


DONE = {"star": "starred", "unstar": "unstarred", "archive": "archived", "unarchive": "unarchived", "delete": "deleted"}


def _each_command(main: click.Group, verb: str, path: str, method: str, doc: str) -> None:
    """A command that sends one request per job id and reports each (exit 1 if any failed)."""
    @user_command(main, verb, help=doc)
    @click.argument("ids", nargs=-1, required=True, type=click.IntRange(1), metavar="ID...")
    def run(client: Client, ids) -> None:
        failed = 0
        for job_id in ids:
            try:
                client.request(method, f"/jobs/{job_id}" + (f"/{path}" if path else ""), None,
                               {} if method != "DELETE" else None)
                click.echo(f"job {job_id}: {DONE[verb]}")
            except ApiError as exc:
                failed += 1
                click.echo(f"job {job_id}: failed: {exc.describe()}")
        if failed:
            _echo_err(f"{verb}: {failed} of {len(ids)} failed")
            sys.exit(EXIT_FAILED)


# -- helpers -----------------------------------------------------------------------------------------

def _read_spec(stream) -> dict:
    name = getattr(stream, "name", "-")
    try:
        spec = yaml.safe_load(stream.read())  # JSON is YAML
    except yaml.YAMLError as exc:
        raise click.BadParameter(f"{name} is not YAML or JSON: {exc}", param_hint="--file") from None
    if not isinstance(spec, dict):
        raise click.BadParameter(f"{name}: expected a mapping of job fields ({', '.join(SPEC_FIELDS[:6])}, ...)",
                                 param_hint="--file")
    return spec  # the API checks the fields (an unknown one is refused, named), so the CLI never lags behind it


def _clone_spec(client: Client, job_id: int) -> dict:
    job = client.get(f"/jobs/{job_id}")
    if job.get("visibility") != "full" or "command" not in job:
        raise CliError(f"--from {job_id}: only its owner and the VC's admins see that job's spec", EXIT_FAILED)
    spec = {k: job[k] for k in SPEC_FIELDS + ("tags",) if k in job and job[k] is not None}
    if job.get("memory_bytes"):
        spec["memory"] = job["memory_bytes"]
    if job.get("name", "").startswith(f"{job.get('type')}-{job_id}"):
        spec.pop("name", None)  # the default name of the old job, not a name someone chose
    if not spec.get("run_as_root"):
        spec.pop("run_as_root", None)
    return spec


def _only_vc(client: Client) -> str:
    vcs = [v["name"] for v in client.get("/me").get("vcs", [])]
    if len(vcs) == 1:
        return vcs[0]
    if not vcs:
        raise CliError("you are a member of no VC: ask a VC admin to add you", EXIT_FAILED)
    raise click.BadParameter(f"which VC? you are in {', '.join(vcs)}", param_hint="--vc")


def exit_code_of(job: dict) -> int:
    """``submit --wait``: the job's exit code (docs/cli.md)."""
    status = job["status"]
    if status == "finished":
        return 0
    if status == "failed":
        code = job.get("exit_code")
        return code if isinstance(code, int) and 0 < code < 256 else EXIT_FAILED
    if status == "killed":
        return EXIT_JOB_KILLED
    return EXIT_JOB_ERROR


def _state_line(job: dict) -> str:
    parts = [f"job {job['id']}: {job['status']}"]
    if job.get("reason"):
        parts.append(f"({job['reason']}" + (f": {job['reason_detail']}" if job.get("reason_detail") else "") + ")")
    if job["status"] in ("queued", "unapproved") and job.get("queue_position"):
        parts.append(f"position {job['queue_position']}")
    if job.get("estimated_start") and job["status"] in ("queued", "unapproved"):
        parts.append(f"estimated start {_estimate(job)}")
    if job.get("estimate_note") and job["status"] == "queued":
        parts.append(f"({job['estimate_note']})")
    if (job.get("attempt") or 0) > 1:
        parts.append(f"attempt {job['attempt']}")
    if job["status"] in ENDED_STATUSES:
        parts.append(f"exit code {job.get('exit_code') if job.get('exit_code') is not None else '-'}")
    return " ".join(parts)


def _list_keys(client: Client, as_json: bool) -> None:
    items = client.get("/me/ssh-keys")["items"]
    if as_json:
        output.echo_json(items)
        return
    click.echo(output.table(["ID", "NAME", "TYPE", "FINGERPRINT", "ADDED"],
                            [[k["id"], k.get("name"), f"{k['key_type']}" + (f" {k['bits']}" if k.get("bits") else ""),
                              k["fingerprint"], output.relative(k.get("created_at"))] for k in items], right={0})
               if items else "no SSH keys (add one: dlts keys add ~/.ssh/id_ed25519.pub)")


def _wait_ready(client: Client, job_id: int, items: list[dict], wait_s: float) -> list[dict]:
    """The job's endpoints once every one is ready, one failed, or ``wait_s`` went by (the last read)."""
    deadline = time.monotonic() + wait_s
    while items and any(e["status"] == "pending" for e in items) and time.monotonic() < deadline:
        time.sleep(poll_s())
        items = client.get(f"/jobs/{job_id}/endpoints")["items"]
    return items


def wait_for(client: Client, job_id: int) -> int:
    """Print the job's state changes on stderr until it ends; the exit code for ``--wait``."""
    last = None
    misses = 0
    try:
        while True:
            try:
                job = client.get(f"/jobs/{job_id}")
                misses = 0
            except ApiError as exc:
                if exc.status != 0 or misses >= 10:
                    raise
                misses += 1  # a blip of the network or a restarting API: ask again
                time.sleep(poll_s())
                continue
            state = (job["status"], job.get("reason"), job.get("queue_position"), job.get("attempt"))
            if state != last:
                _echo_err(f"{time.strftime('%H:%M:%S')} {_state_line(job)}")
                last = state
            if job["status"] in ENDED_STATUSES:
                return exit_code_of(job)
            time.sleep(poll_s())
    except KeyboardInterrupt:
        _echo_err(f"stopped waiting; job {job_id} goes on (dlts jobs, dlts kill {job_id})")
        return EXIT_INTERRUPTED


def follow_log(client: Client, job_id: int, attempt: int | None, follow: bool) -> None:
    """Print the log from its start; with ``follow`` until the job has ended and its last attempt is read."""
    chunk = 1 << 20
    number = attempt  # None: the current attempt, whichever that is at the first read
    offset = 0
    out = sys.stdout
    while True:
        piece = client.get(f"/jobs/{job_id}/log", attempt=number, offset=offset, limit=chunk)
        if piece["attempt"] == 0:  # not started yet
            if not follow:
                _echo_err(f"job {job_id} has not run yet: no log (dlts logs -f {job_id} waits for it)")
                return
            job = client.get(f"/jobs/{job_id}")
            if job["status"] in ENDED_STATUSES and not job.get("attempt"):
                _echo_err(f"job {job_id} ended ({job['status']}) without running: no log")
                return
            time.sleep(poll_s())
            continue
        if number is None:
            number = piece["attempt"]
        if piece["data"]:
            out.write(piece["data"])
            out.flush()
        offset = piece["next_offset"]
        if piece.get("complete"):
            return
        if offset < piece["size"]:
            continue  # more is there already
        if not follow:
            return
        if attempt is None:
            # the job may have gone on to a new attempt (a retry, a preemption): follow that one
            job = client.get(f"/jobs/{job_id}")
            if job.get("attempt", 0) > number:
                number += 1
                offset = 0
                _echo_err(f"--- job {job_id}: attempt {number} ---")
                continue
            if job["status"] in ENDED_STATUSES and job.get("attempt") == number:
                continue  # read once more: the API says complete once the end is read
        else:
            job = client.get(f"/jobs/{job_id}")
            if job["status"] in ENDED_STATUSES or job.get("attempt", 0) > number:
                return  # an attempt that has ended has all it will ever have
        time.sleep(poll_s())


def _download(client: Client, job_id: int, attempt: int | None, target: str) -> None:
    written = 0
    if target == "-":
        out = sys.stdout.buffer
        for piece in client.stream(f"/jobs/{job_id}/log", attempt=attempt, download=True):
            out.write(piece)
            written += len(piece)
        out.flush()
        return
    path = Path(target)
    tmp = path.with_name(f".{path.name}.part")
    try:
        with open(tmp, "wb") as f:
            for piece in client.stream(f"/jobs/{job_id}/log", attempt=attempt, download=True):
                f.write(piece)
                written += len(piece)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CliError(f"--download: cannot write {target}: {exc.strerror}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _echo_err(f"wrote {written} bytes to {target}")


def _gpus(job: dict) -> str:
    gpus, nodes = job.get("gpus", 0), job.get("nodes") or 0
    return f"{nodes}x{gpus}" if nodes > 1 else str(gpus)


def _start(job: dict) -> str:
    if job.get("started_at") and job["status"] not in ("queued", "unapproved"):
        return output.relative(job["started_at"])
    if job.get("estimated_start"):
        return output.relative(job["estimated_start"]) + ("~" if job.get("estimated_start_source") == "forecast" else "")
    return "-"


def _estimate(job: dict) -> str:
    """A queued job's estimated start, and whether it is reserved or a forecast."""
    source = job.get("estimated_start_source")
    return output.relative(job["estimated_start"]) + (f" ({source})" if source else "")


def _jobs_table(items: list[dict]) -> str:
    colour = output.colour_on()
    rows = [[str(j["id"]), j.get("name") or "", j.get("user", ""), j.get("vc", ""),
             output.status_text(j.get("status"), colour), j.get("reason") or "", _gpus(j),
             str(j["queue_position"]) if j.get("queue_position") else "-", _start(j),
             output.duration(j.get("time_left_s")) if j.get("time_left_s") is not None else "-"] for j in items]
    return output.table(["ID", "NAME", "USER", "VC", "STATUS", "REASON", "GPUS", "POS", "START", "TIME-LEFT"],
                        rows, right={0, 6, 7})


def _estimate_notes(items: list[dict]) -> list[str]:
    """Under the jobs table: why each listed queued job's estimated start last moved later."""
    return [f"job {j['id']}: {j['estimate_note']}" for j in items if j.get("status") == "queued" and j.get("estimate_note")]


def _endpoints_table(items: list[dict], colour: bool) -> str:
    return output.table(["EID", "KIND", "NAME", "PORT", "STATUS", "URL", "MESSAGE"],
                        [[str(e["id"]), e["kind"], e["name"], str(e.get("port") or "-"),
                          output.status_text(e["status"], colour), e.get("url") or "-", e.get("message") or ""]
                         for e in items], right={0, 3})


def _job_details(client: Client, job: dict, colour: bool) -> str:
    lines = [f"job {job['id']} {job.get('name', '')}: {output.status_text(job['status'], colour)}"
             + (f" ({job['reason']}" + (f": {job['reason_detail']}" if job.get("reason_detail") else "") + ")"
                if job.get("reason") else "")]
    fields = [("user", job.get("user")), ("vc", job.get("vc")), ("type", job.get("type")),
              ("gpus", _gpus(job) + (f" {job['sku']}" if job.get("sku") else "")), ("cpu", job.get("cpu")),
              ("memory", output.size(job["memory_bytes"]) if job.get("memory_bytes") else None), ("preemptible", job.get("preemptible")),
              ("priority", job.get("priority")), ("queue position", job.get("queue_position")),
              ("estimated start", _estimate(job) if job.get("estimated_start") else
               ("unknown" if job.get("status") == "queued" else None)),
              ("estimate moved", job.get("estimate_note") if job.get("status") == "queued" else None),
              ("image", job.get("image")), ("command", job.get("command")),
              ("submitted", output.relative(job.get("submitted_at"))),
              ("started", output.relative(job.get("started_at")) if job.get("started_at") else None),
              ("finished", output.relative(job.get("finished_at")) if job.get("finished_at") else None),
              ("time left", output.duration(job["time_left_s"]) if job.get("time_left_s") is not None else None),
              ("exit code", job.get("exit_code")),
              ("attempt", f"{job.get('attempt')} (retries used {job.get('retries_used')} of "
                          f"{job.get('max_retries') if job.get('max_retries') is not None else 'default'})"
               if job.get("attempt") is not None else None),
              ("env", " ".join(f"{k}={v}" for k, v in sorted((job.get("env") or {}).items())) or None),
              ("tags", ", ".join(job["tags"]) if job.get("tags") else None)]
    lines += [f"  {k + ':':<16} {v}" for k, v in fields if v not in (None, "", "-")]
    if job.get("visibility") == "public":
        lines.append("  (public fields only: the owner and the VC's admins see the rest)")
    if job.get("attempts"):
        lines.append("attempts:")
        lines.append(_indent(output.table(
            ["N", "NODES", "STARTED", "ENDED", "EXIT", "END-REASON"],
            [[str(a["number"]), ",".join(sorted({p.get("node", "?") for p in a.get("placements") or []})) or "-",
              output.relative(a.get("started_at")), output.relative(a.get("ended_at")),
              str(a["exit_code"]) if a.get("exit_code") is not None else "-", a.get("end_reason") or "-"]
             for a in job["attempts"]], right={0, 4})))
    if job.get("endpoints"):
        lines.append("endpoints:")
        lines.append(_indent(_endpoints_table(job["endpoints"], colour)))
    try:
        events = client.get(f"/jobs/{job['id']}/events", limit=10)["items"]
    except ApiError:
        events = []
    if events:
        lines.append("recent events:")
        for e in reversed(events):
            move = f"{e.get('from_status') or ''} -> {e['to_status']}" if e.get("to_status") else e.get("kind", "")
            lines.append(f"  {output.relative(e.get('at')):>10}  {move}"
                         + (f" ({e['reason']})" if e.get("reason") else "")
                         + (f": {e['message']}" if e.get("message") else ""))
    return "\n".join(lines)


def _vc_details(vc: dict) -> str:
    lines = [f"VC {vc['name']}: policy {vc.get('policy')}" + (f"; notice: {vc['notice']}" if vc.get("notice") else "")]
    if vc.get("skus"):
        lines.append(_indent(output.table(
            ["SKU", "QUOTA", "USED", "PREEMPTIBLE", "QUEUED"],
            [[s["sku"], str(s["gpus"]), str(s["gpus_used"]), str(s["preemptible_gpus_used"]), str(s["gpus_queued"])]
             for s in vc["skus"]], right={1, 2, 3, 4})))
    limits = [("cpu quota", f"{vc.get('cpu_quota')} ({vc.get('cpu_quota_source')})"),
              ("memory quota", f"{output.size(vc.get('memory_quota_bytes'))} ({vc.get('memory_quota_source')})"),
              ("max job time", output.duration(vc["max_job_time_s"]) if vc.get("max_job_time_s") else None),
              ("max interactive GPUs", vc.get("max_interactive_gpus")), ("GPUs per user", vc.get("user_gpu_quota")),
              ("queued jobs per user", vc.get("max_queued_jobs_per_user")),
              ("submissions/min", vc.get("max_submissions_per_minute")), ("gid", vc.get("gid")),
              ("idle-job policy", _idle_policy_text(vc.get("idle_policy"))),
              *_scheduling_lines(vc),
              ("admins", ", ".join(vc.get("admins") or []) or None),
              ("members", ", ".join(vc.get("members") or []) or None)]
    lines += [f"  {k + ':':<22} {v}" for k, v in limits if v is not None]
    if vc.get("users"):
        lines.append("in use by:")
        lines.append(_indent(output.table(["USER", "JOBS", "GPUS", "PREEMPTIBLE"],
                                          [[u["user"], str(u["jobs"]), str(u["gpus"]), str(u["preemptible_gpus"])]
                                           for u in vc["users"]], right={1, 2, 3})))
    return "\n".join(lines)


def _scheduling_lines(vc: dict) -> list[tuple[str, str]]:
    """Fair share (and its bound on a job's wait) and the preemption budget in effect, each with where it
    comes from (vc, config, default)."""
    if "fair_share" not in vc:
        return []  # an API from before these settings

    def seconds(value: float | None, none: str) -> str:
        return none if value is None else f"{value:g} s" + (f" ({output.duration(value)})" if value >= 60 else "")

    bound = [("fair share bound", f"{seconds(vc.get('fair_share_max_wait_s'), 'none')} "
                                  f"({vc.get('fair_share_max_wait_s_source')})")] \
        if "fair_share_max_wait_s_source" in vc else []  # an API from before this setting: no line
    weight = [("limit weight", f"{vc['limit_weight']:g} ({vc.get('limit_weight_source')})")] \
        if "limit_weight_source" in vc else []  # an API from before this setting: no line
    return [("fair share", f"{'on' if vc['fair_share'] else 'off'} ({vc.get('fair_share_source')})"), *bound, *weight,
            ("min runtime", f"{seconds(vc.get('min_runtime_s'), '0 s')} ({vc.get('min_runtime_s_source')})"),
            ("max reclaim delay", f"{seconds(vc.get('max_reclaim_delay_s'), 'never')} "
                                  f"({vc.get('max_reclaim_delay_s_source')})"),
            ("max preemptions", f"{vc.get('max_preemptions') or 'no limit'} ({vc.get('max_preemptions_source')})")]


def _idle_policy_text(policy: dict | None) -> str | None:
    if not policy:
        return None
    text = f"warn after {policy.get('idle_warn_min', 0):g} idle min"
    if policy.get("idle_action") in ("pause", "kill"):
        text += f", {policy['idle_action']} {policy.get('idle_action_min', 0):g} min later"
    return text + (f" (not {', '.join(policy['exempt_types'])} jobs)" if policy.get("exempt_types") else "")


N = TypeVar("N", int, float)


def _none_or(text: str, flag: str, parse: Callable[[str], N]) -> N | None:
    if text.lower() == "none":
        return None
    try:
        return parse(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=flag) from None


def _weight(text: str) -> float:
    from dlts.strict import decimal  # ASCII digits only ("nan", "inf" and "1e400" are refused)

    try:
        return decimal(text)  # the API checks the range (and names the flag's field)
    except ValueError:
        raise ValueError(f"{text!r} is not a number or 'none'") from None


def _whole_number(text: str) -> int:
    from dlts.strict import is_whole_number  # ASCII digits only ("²" and "7_0" are refused)

    if not is_whole_number(text):
        raise ValueError(f"{text!r} is not a whole number or 'none'")
    return int(text)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
