"""The user CLI without a server: --help's sections, a description for every command, profiles and
their file modes, durations and exit codes, the error line, shell completion."""

from __future__ import annotations

import stat

import click
import pytest
import yaml
from click.testing import CliRunner

from dlts.cli import main
from dlts.client import output, profiles
from dlts.client.api import ApiError, Client
from dlts.client.commands import exit_code_of

USER_COMMANDS = {"login", "logout", "whoami", "submit", "jobs", "show", "logs", "kill", "pause", "resume", "approve",
                 "tag", "star", "unstar", "archive", "unarchive", "delete", "endpoints", "ssh", "keys", "ips", "usage",
                 "vc show", "vc tune"}
SERVER_COMMANDS = {"api", "managers", "demo", "db", "user", "vc", "node", "repair", "storage", "config", "sim", "render",
                   "directory"}


def _walk(group: click.Group, ctx: click.Context, prefix: str = ""):
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        yield prefix + name, command
        if isinstance(command, click.Group):
            yield from _walk(command, ctx, prefix + name + " ")


def test_help_lists_user_commands_apart_from_server_commands():
    result = CliRunner().invoke(main, ["--help"], prog_name="dlts")
    assert result.exit_code == 0, result.output
    text = result.output
    user_part = text[text.index("User commands ("):text.index("Server commands (")]
    server_part = text[text.index("Server commands ("):]
    listed_user = {line[2:].split("  ")[0] for line in user_part.splitlines()[1:] if line.startswith("  ")
                   and not line.startswith("   ")}
    listed_server = {line.split()[0] for line in server_part.splitlines()[1:] if line.startswith("  ")
                     and not line.startswith("   ")}
    assert listed_user == USER_COMMANDS
    assert listed_server == SERVER_COMMANDS


def test_every_command_has_a_one_line_description():
    ctx = click.Context(main, info_name="dlts")
    seen = set()
    for name, command in _walk(main, ctx):
        seen.add(name)
        assert command.get_short_help_str(150).strip(), f"dlts {name} has no description"
    assert {"vc show", "keys add", "ips delete", "vc member", "user add", "node list"} <= seen


def test_login_options_and_shell_completion():
    runner = CliRunner()
    script = runner.invoke(main, [], prog_name="dlts", env={"_DLTS_COMPLETE": "bash_source"})
    assert script.exit_code == 0 and "_dlts_completion" in script.output
    zsh = runner.invoke(main, [], prog_name="dlts", env={"_DLTS_COMPLETE": "zsh_source"})
    assert zsh.exit_code == 0 and "compdef" in zsh.output
    words = runner.invoke(main, [], prog_name="dlts",
                          env={"_DLTS_COMPLETE": "bash_complete", "COMP_WORDS": "dlts sub", "COMP_CWORD": "1"})
    assert "submit" in words.output
    flags = runner.invoke(main, [], prog_name="dlts",
                          env={"_DLTS_COMPLETE": "bash_complete", "COMP_WORDS": "dlts logs 3 --fo", "COMP_CWORD": "3"})
    assert "--follow" in flags.output


def test_profiles_are_private_and_the_environment_overrides_them(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    path = profiles.save("default", "http://a:5000", "tok-a", env)
    profiles.save("lab", "http://b:5000", "tok-b", env)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert yaml.safe_load(path.read_text())["profiles"]["lab"] == {"url": "http://b:5000", "token": "tok-b"}
    assert (profiles.resolve(None, env).url, profiles.resolve(None, env).token) == ("http://a:5000", "tok-a")
    assert profiles.resolve("lab", env).token == "tok-b"
    assert profiles.resolve(None, env | {"DLTS_PROFILE": "lab"}).url == "http://b:5000"
    over = profiles.resolve("lab", env | {"DLTS_URL": "http://c", "DLTS_TOKEN": "tok-c"})
    assert (over.url, over.token) == ("http://c", "tok-c") and "DLTS_TOKEN" in over.source
    assert profiles.resolve("nope", env).url is None
    assert profiles.remove("lab", env) and not profiles.remove("lab", env)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("profiles: [1, 2")
    with pytest.raises(profiles.ProfileError, match="not valid YAML"):
        profiles.resolve(None, env)


def test_not_logged_in_and_a_broken_profile_file_exit_3_without_a_traceback(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg"), "DLTS_URL": "", "DLTS_TOKEN": "", "DLTS_PROFILE": ""}
    result = CliRunner().invoke(main, ["jobs"], env=env)
    assert result.exit_code == 3 and "dlts login URL" in result.output
    (tmp_path / "cfg" / "dlts").mkdir(parents=True)
    (tmp_path / "cfg" / "dlts" / "profiles.yaml").write_text("just text")
    broken = CliRunner().invoke(main, ["whoami"], env=env)
    assert broken.exit_code == 3 and "profiles" in broken.output and broken.exception.__class__ is SystemExit


def test_bad_flags_are_usage_errors_naming_the_flag(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path), "DLTS_URL": "http://127.0.0.1:9", "DLTS_TOKEN": "x"}
    runner = CliRunner()
    assert runner.invoke(main, ["submit", "--gpus", "lots", "--", "true"], env=env).exit_code == 2
    bad_env = runner.invoke(main, ["submit", "--image", "i", "--vc", "v", "--env", "NOVALUE", "--", "true"], env=env)
    assert bad_env.exit_code == 2 and "--env" in bad_env.output
    no_command = runner.invoke(main, ["submit", "--image", "i", "--vc", "v"], env=env)
    assert no_command.exit_code == 2 and "no command" in no_command.output
    login = runner.invoke(main, ["login", "example.org"], env=env)
    assert login.exit_code == 2 and "http://" in login.output
    # the server is not there: exit 4, one line
    down = runner.invoke(main, ["submit", "--image", "i", "--vc", "v", "--", "true"], env=env)
    assert down.exit_code == 4 and "cannot reach http://127.0.0.1:9" in down.output


def test_the_error_line_names_the_field_and_says_to_log_in_on_401():
    assert ApiError(
        422, "gpus_exceed_node", "too many", {"field": "gpus"}).describe("--gpus") == "--gpus: too many (gpus_exceed_node, HTTP 422)"
    assert ApiError(400, "invalid_input", "env: bad name", {"fields": {"env": ["x"]}}).describe("--env") == \
        "--env: bad name (invalid_input, HTTP 400)"
    assert str(ApiError(400, "invalid_input", "oops", {"fields": {"image": ["Missing"]}})) == \
        "image: oops (invalid_input, HTTP 400)"
    assert "dlts login" in str(ApiError(401, "unauthenticated", "This token is not valid."))
    assert Client("http://h:1/api/v1/", None).url("/jobs", {"a": None, "b": True, "c": 2}) == "http://h:1/api/v1/jobs?b=1&c=2"


@pytest.mark.parametrize("job, code", [
    ({"status": "finished", "exit_code": 0}, 0), ({"status": "failed", "exit_code": 7}, 7),
    ({"status": "failed", "exit_code": None}, 1), ({"status": "failed", "exit_code": -9}, 1),
    ({"status": "killed", "exit_code": None}, 143), ({"status": "error", "exit_code": None}, 125)])
def test_wait_exit_codes(job, code):
    assert exit_code_of(job) == code


def test_durations_tables_and_sizes():
    assert [output.parse_duration(t) for t in ("90", "90s", "45m", "2h", "1d", "1h30m")] == [90, 90, 2700, 7200, 86400, 5400]
    for bad in ("", "2x", "h", "١٢", "-5"):
        with pytest.raises(ValueError):
            output.parse_duration(bad)
    assert output.duration(3725) == "1h02m" and output.duration(59) == "59s" and output.duration(None) == "-"
    assert output.table(["ID", "NAME"], [["7", "a"], ["12", "longer"]], right={0}).splitlines() == [
        "ID  NAME", " 7  a", "12  longer"]
    assert output.size(2 * 2**30) == "2.0 GiB" and output.size(512) == "512 B"
    assert output.relative(None) == "-"
    assert output.status_text("running", colour=False) == "running"


def test_submit_sends_an_idempotency_key_and_retries_a_lost_answer_with_the_same_key():
    """A 503 on the first try: the second try carries the same key (the API answers the job the
    first stored, if it did, instead of making another)."""
    import http.server
    import threading

    from dlts.client.api import Client

    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(self.headers.get("Idempotency-Key", ""))
            status, body = (503, b'{"error": {"code": "database_unavailable", "message": "retry"}}') if len(seen) == 1 \
                else (201, b'{"id": 42}')
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        job = Client(f"http://127.0.0.1:{server.server_port}", "t").submit({"vc": "x"}, pause_s=0.01)
    finally:
        server.shutdown()
    assert job == {"id": 42}
    assert len(seen) == 2 and seen[0] == seen[1] and len(seen[0]) == 32
