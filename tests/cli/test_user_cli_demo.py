"""The user CLI as a user runs it: a real `dlts demo` (API over HTTP, job manager, local jobs) in one
process, every `dlts` command in another, from a config directory of their own (a laptop)."""

from __future__ import annotations

import getpass
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
import requests
from demo_kit import DLTS, Demo, base_env, free_port


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-demo")
    d = Demo(root / "home", free_port(), root / "demo.log")
    d.banners = [d.start()]
    d.stop()
    d.banners.append(d.start())  # a second start: the banner must still say how to sign in
    yield d
    d.stop()


@pytest.fixture
def user(tmp_path, demo):
    """A user's machine: its own config directory; nothing of the demo's environment."""
    return User(tmp_path / "config", demo)


class User:
    def __init__(self, config: Path, demo: Demo):
        self.config, self.demo = config, demo

    def env(self, **extra) -> dict:
        return base_env() | {"XDG_CONFIG_HOME": str(self.config), "DLTS_POLL_S": "0.2"} | extra

    def run(self, *args: str, timeout: float = 120, **extra) -> subprocess.CompletedProcess:
        result = subprocess.run(DLTS + list(args), env=self.env(**extra), capture_output=True, text=True, timeout=timeout,
                                check=False)
        assert "Traceback" not in result.stderr, result.stderr
        return result

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(DLTS + list(args), env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def login(self, token_file: str = "alice-token", *more: str) -> subprocess.CompletedProcess:
        result = self.run("login", self.demo.url, "--token-file", str(self.demo.home / token_file), *more)
        assert result.returncode == 0, result.stderr
        return result


def api(demo: Demo, token_name: str = "alice-token"):
    token = (demo.home / token_name).read_text().strip()
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    return session


def wait_job(demo: Demo, job_id: int, statuses: set[str], timeout_s: float = 60) -> dict:
    session = api(demo)
    deadline = time.monotonic() + timeout_s
    while True:
        job = session.get(f"{demo.url}/api/v1/jobs/{job_id}", timeout=10).json()
        if job["status"] in statuses:
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.2)


def test_the_demo_says_where_the_portal_is_and_how_alice_and_admin_sign_in_on_every_start(demo):
    first, second = demo.banners
    credentials = demo.home / "demo-credentials"
    for banner in (first, second):
        assert f"portal: {demo.url}/" in banner
        assert "sign in as alice" in banner and "admin" in banner
        assert f"their passwords are in {credentials}" in banner
        assert f"dlts login {demo.url} --token-file {demo.home / 'alice-token'}" in banner
    # the passwords themselves are printed once, at the first start only
    passwords = dict(line.split(":", 1) for line in credentials.read_text().split())
    assert passwords["alice"] in first and passwords["alice"] not in second
    assert "demo created" in first and "demo resumed" in second


def test_the_banners_cli_example_runs_as_printed(user, demo):
    """A newcomer copies the banner's two commands; both work (the submit once lacked --image,
    which the CLI requires)."""
    line = next(x for x in demo.banners[0].splitlines() if x.strip().startswith("CLI:"))
    login, submit = (shlex.split(part.strip()) for part in line.split("CLI:", 1)[1].split("then:"))
    assert login[0] == submit[0] == "dlts"
    assert user.run(*login[1:]).returncode == 0
    done = user.run(*submit[1:])
    assert done.returncode == 0, done.stderr


def test_login_stores_a_private_profile_and_whoami_reads_it(user, demo):
    result = user.login()
    assert "as alice" in result.stdout
    path = user.config / "dlts" / "profiles.yaml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    me = user.run("whoami", "--json")
    assert me.returncode == 0, me.stderr
    parsed = json.loads(me.stdout)
    assert parsed["name"] == "alice" and parsed["url"] == demo.url and parsed["vcs"][0]["name"] == "default"
    # a second profile, and the environment over the stored one
    user.login("demo-token", "--profile", "ops")
    assert json.loads(user.run("whoami", "--json", "--profile", "ops").stdout)["name"] == "admin"
    admin_token = (demo.home / "demo-token").read_text().strip()
    assert json.loads(user.run("whoami", "--json", DLTS_TOKEN=admin_token).stdout)["name"] == "admin"
    assert json.loads(user.run("whoami", "--json", DLTS_PROFILE="ops").stdout)["name"] == "admin"
    out = user.run("logout", "--profile", "ops")
    assert out.returncode == 0 and "removed" in out.stdout
    gone = user.run("whoami", "--profile", "ops")
    assert gone.returncode == 3 and "dlts login" in gone.stderr


def test_login_refuses_a_bad_token_and_a_server_that_is_not_there(user, demo, tmp_path):
    bad = tmp_path / "bad-token"
    bad.write_text("dlts_not-a-real-token\n")
    result = user.run("login", demo.url, "--token-file", str(bad))
    assert result.returncode == 3 and "refused this token" in result.stderr
    assert not (user.config / "dlts" / "profiles.yaml").exists()
    nowhere = user.run("login", f"http://127.0.0.1:{free_port()}", "--token-file", str(demo.home / "alice-token"))
    assert nowhere.returncode == 4 and "cannot reach" in nowhere.stderr
    # the token from standard input (the prompt reads it there when no terminal is attached)
    piped = subprocess.run(DLTS + ["login", demo.url], input=(demo.home / "alice-token").read_text(), env=user.env(),
                           capture_output=True, text=True, timeout=60, check=False)
    assert piped.returncode == 0 and "as alice" in piped.stdout, piped.stderr


def test_not_logged_in_says_how_to_log_in(user):
    result = user.run("jobs")
    assert result.returncode == 3 and "dlts login URL" in result.stderr


def test_submit_wait_exits_with_the_jobs_exit_code(user, demo):
    user.login()
    ok = user.run("submit", "--image", "any", "--wait", "--", "sh", "-c", "echo done")
    assert ok.returncode == 0, ok.stderr
    job_id = int(ok.stdout.strip())
    assert f"job {job_id}: queued" in ok.stderr and f"job {job_id}: finished exit code 0" in ok.stderr
    failed = user.run("submit", "--image", "any", "--max-retries", "0", "--wait", "--", "exit 7")
    assert failed.returncode == 7, failed.stderr
    assert "failed" in failed.stderr and "exit code 7" in failed.stderr
    job = wait_job(demo, int(failed.stdout.strip()), {"failed"})
    assert job["exit_code"] == 7 and job["command"] == "exit 7"


def test_submit_from_a_spec_file_and_from_another_job(user, demo, tmp_path):
    user.login()
    spec = tmp_path / "job.yaml"
    spec.write_text("image: any\ncommand: echo from-the-file\nname: from-file\nenv: {GREETING: hi}\n")
    result = user.run("submit", "-f", str(spec), "--env", "OTHER=2", "--max-time", "1h30m", "--json")
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["name"] == "from-file" and job["env"] == {"GREETING": "hi", "OTHER": "2"}
    assert job["max_time_s"] == 5400 and job["vc"] == "default"
    clone = user.run("submit", "--from", str(job["id"]), "--name", "clone", "--json")
    assert clone.returncode == 0, clone.stderr
    copy = json.loads(clone.stdout)
    assert copy["id"] != job["id"] and copy["name"] == "clone" and copy["command"] == "echo from-the-file"
    assert copy["env"] == job["env"] and copy["max_time_s"] == 5400
    bad = tmp_path / "bad.yaml"
    bad.write_text("image: any\ncommand: echo\nwrong_field: 1\n")
    refused = user.run("submit", "-f", str(bad))
    assert refused.returncode == 1 and "wrong_field" in refused.stderr and "HTTP 400" in refused.stderr
    spec.write_text("image: any\ncommand: 'true'\ngpus: 64\n")
    from_file = user.run("submit", "-f", str(spec))
    assert from_file.returncode == 1 and "gpus" in from_file.stderr and "--gpus" not in from_file.stderr
    not_yaml = tmp_path / "not.yaml"
    not_yaml.write_text("image: [unclosed\n")
    assert user.run("submit", "-f", str(not_yaml)).returncode == 2


def test_a_refused_submission_names_the_flag(user):
    user.login()
    too_many = user.run("submit", "--image", "any", "--gpus", "64", "--", "true")
    assert too_many.returncode == 1 and "--gpus" in too_many.stderr and "HTTP 422" in too_many.stderr
    env = user.run("submit", "--image", "any", "--env", "DLTS_X=1", "--", "true")
    assert env.returncode == 1 and "--env" in env.stderr and "DLTS_X" in env.stderr
    duration = user.run("submit", "--image", "any", "--max-time", "soon", "--", "true")
    assert duration.returncode == 2 and "--max-time" in duration.stderr
    vc = user.run("submit", "--image", "any", "--vc", "nope", "--", "true")
    assert vc.returncode == 1 and "nope" in vc.stderr


def test_logs_follow_a_running_job_to_its_end(user, demo, tmp_path):
    user.login()
    flag = tmp_path / "go-on"
    command = f"echo first; while [ ! -e {flag} ]; do sleep 0.1; done; echo second; echo third"
    job_id = int(user.run("submit", "--image", "any", "--", command).stdout.strip())
    follower = user.popen("logs", "-f", str(job_id))
    try:
        assert follower.stdout.readline() == "first\n"  # printed while the job still runs
        assert wait_job(demo, job_id, {"running"})["status"] == "running"
        flag.touch()
        out, err = follower.communicate(timeout=90)
    finally:
        follower.kill()
    assert follower.returncode == 0, err
    assert out == "second\nthird\n"
    assert wait_job(demo, job_id, {"finished"})["exit_code"] == 0
    # the whole log, and a download of it
    assert user.run("logs", str(job_id)).stdout == "first\nsecond\nthird\n"
    target = tmp_path / "job.log"
    saved = user.run("logs", str(job_id), "--download", str(target))
    assert saved.returncode == 0 and target.read_text() == "first\nsecond\nthird\n"
    # a job killed before it ran: -f says so and ends (the demo's 2 GPUs are held by another job)
    blocker = int(user.run("submit", "--image", "any", "--gpus", "2", "--", "sleep 600").stdout.strip())
    try:
        wait_job(demo, blocker, {"running"})
        held = int(user.run("submit", "--image", "any", "--gpus", "2", "--", "true").stdout.strip())
        assert wait_job(demo, held, {"queued"})["attempt"] == 0
        assert user.run("kill", str(held)).returncode == 0
        assert wait_job(demo, held, {"killed"})["attempt"] == 0
        never = user.run("logs", "-f", str(held), timeout=60)
        assert never.returncode == 0 and "without running" in never.stderr
    finally:
        user.run("kill", str(blocker))
    missing = user.run("logs", "987654")
    assert missing.returncode == 1 and "job_not_found" in missing.stderr


def test_batch_kill_with_one_bad_id_and_wait_on_a_killed_job(user, demo):
    user.login()
    waiter = user.popen("submit", "--image", "any", "--wait", "--", "sleep 600")
    try:
        job_id = int(waiter.stdout.readline())
        wait_job(demo, job_id, {"running"})
        killed = user.run("kill", str(job_id), "987654")
        assert killed.returncode == 1
        lines = killed.stdout.splitlines()
        assert lines[0].startswith(f"job {job_id}: kill") or lines[0] == f"job {job_id}: killed", lines
        assert "job 987654: failed" in lines[1] and "job_not_found" in lines[1]
        assert "1 of 2 failed" in killed.stderr
        _, err = waiter.communicate(timeout=90)
    finally:
        waiter.kill()
    assert waiter.returncode == 143, err
    assert wait_job(demo, job_id, {"killed"})["status"] == "killed"
    again = user.run("kill", str(job_id), "--json")
    assert again.returncode == 1 and json.loads(again.stdout)["results"][0]["code"] == "job_already_ended"


def test_jobs_lists_like_squeue_and_as_json(user, demo):
    user.login()
    job_id = int(user.run("submit", "--image", "any", "--name", "listed", "--", "sleep 600").stdout.strip())
    try:
        wait_job(demo, job_id, {"running"})
        table = user.run("jobs")
        assert table.returncode == 0, table.stderr
        header = table.stdout.splitlines()[0].split()
        assert header == ["ID", "NAME", "USER", "VC", "STATUS", "REASON", "GPUS", "POS", "START", "TIME-LEFT"]
        row = next(line.split() for line in table.stdout.splitlines()[1:] if line.split()[0] == str(job_id))
        assert row[1:5] == ["listed", "alice", "default", "running"]
        listed = json.loads(user.run("jobs", "--json", "--mine").stdout)
        assert job_id in [j["id"] for j in listed] and all(j["user"] == "alice" for j in listed)
        assert all(j["status"] not in ("finished", "failed", "killed", "error") for j in listed)
        ended = json.loads(user.run("jobs", "--json", "--status", "finished").stdout)
        assert all(j["status"] == "finished" for j in ended)
        shown = json.loads(user.run("show", str(job_id), "--json").stdout)
        assert shown["id"] == job_id and shown["status"] == "running" and shown["attempts"][0]["number"] == 1
        human = user.run("show", str(job_id))
        assert f"job {job_id} listed: running" in human.stdout and "attempts:" in human.stdout
        watcher = user.popen("jobs", "--watch", "--interval", "0.3")
        try:
            seen = []
            while sum(1 for line in seen if line.startswith(demo.url)) < 2 and len(seen) < 500:
                seen.append(watcher.stdout.readline())
        finally:
            watcher.send_signal(signal.SIGINT)
            watcher.communicate(timeout=30)
        assert sum(1 for line in seen if line.startswith(demo.url)) >= 2, seen  # redrawn
        assert any(line.split()[:2] == [str(job_id), "listed"] for line in seen), seen
        assert watcher.returncode in (0, 130)  # Ctrl-C while it sleeps, or while it asks
        bad = user.run("jobs", "--status", "sleeping")
        assert bad.returncode == 1 and "status" in bad.stderr and "HTTP 400" in bad.stderr
    finally:
        user.run("kill", str(job_id))


def test_a_waiting_job_shows_its_forecast_start(user, demo):
    """The demo's forecast manager (every second here) gives a job waiting behind a job with a limit
    a start: `dlts show` says when and that it is a forecast, `dlts jobs` marks it with a ~."""
    user.login()
    blocker = int(user.run("submit", "--image", "any", "--gpus", "2", "--max-time", "2h", "--", "sleep 600").stdout.strip())
    try:
        wait_job(demo, blocker, {"running"})
        held = int(user.run("submit", "--image", "any", "--gpus", "2", "--", "true").stdout.strip())
        deadline = time.monotonic() + 60
        while (job := wait_job(demo, held, {"queued"}))["estimated_start_source"] != "forecast":
            assert time.monotonic() < deadline, job
            time.sleep(0.3)
        shown = user.run("show", str(held))
        line = next(x for x in shown.stdout.splitlines() if "estimated start" in x)
        assert "in 1h59m" in line or "in 2h" in line, line  # the blocker's 2-hour limit
        assert line.rstrip().endswith("(forecast)"), line
        row = next(x.split() for x in user.run("jobs").stdout.splitlines()[1:] if x.split()[0] == str(held))
        assert row[-2].endswith("~"), row  # START
    finally:
        user.run("kill", str(blocker))


def test_a_waiting_job_says_why_its_estimate_moved_later(user, demo):
    """In a backfill VC that weighs limits, a job waiting with a reservation is passed by a later job
    with a shorter limit: the job manager's estimate_moved message is the job's estimate_note, which
    `dlts jobs` prints under the table, `dlts show` on its own line and --json as the field."""
    deadline = time.monotonic() + 60
    # the earlier tests' jobs gone first: one without a limit still waiting would rank ahead of the
    # waiting job here (the same weighed limit, queued earlier) and leave it without a reservation
    while busy := api(demo).get(f"{demo.url}/api/v1/jobs", params={"status": "unapproved,queued,scheduling,running,"
                                                                   "pausing,killing"}, timeout=10).json()["items"]:
        assert time.monotonic() < deadline, busy
        time.sleep(0.3)
    user.login("demo-token")
    tuned = user.run("vc", "tune", "default", "--policy", "backfill", "--limit-weight", "0.25")
    assert tuned.returncode == 0, tuned.stderr
    user.login()
    started: list[int] = []
    try:
        for _ in range(2):
            started.append(int(user.run("submit", "--image", "any", "--gpus", "1", "--max-time", "1h", "--",
                                        "sleep 600").stdout.strip()))
        for job_id in started:
            wait_job(demo, job_id, {"running"})
        waiting = int(user.run("submit", "--image", "any", "--gpus", "1", "--", "true").stdout.strip())
        started.append(waiting)
        deadline = time.monotonic() + 90
        while (job := wait_job(demo, waiting, {"queued"}))["estimated_start_source"] != "reservation":
            assert time.monotonic() < deadline, job
            time.sleep(0.3)
        assert job["estimate_note"] is None and "estimate moved" not in user.run("show", str(waiting)).stdout
        ahead = int(user.run("submit", "--image", "any", "--gpus", "2", "--max-time", "10m", "--", "true").stdout.strip())
        started.append(ahead)
        while not (job := wait_job(demo, waiting, {"queued"}))["estimate_note"]:
            assert time.monotonic() < deadline, job
            time.sleep(0.3)
        note = job["estimate_note"]
        assert note.startswith("estimated start moved ") and f"job {ahead} (shorter limit) ranked ahead of it" in note, note
        events = api(demo).get(f"{demo.url}/api/v1/jobs/{waiting}/events", timeout=10).json()["items"]
        assert note in [e.get("message") for e in events if e.get("reason") == "estimate_moved"], events

        listed = user.run("jobs")
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
        assert lines[0].split()[0] == "ID" and f"job {waiting}: {note}" in lines, listed.stdout
        table_end = next(i for i, line in enumerate(lines) if line.startswith("job "))
        assert all(line.startswith("job ") for line in lines[table_end:]), listed.stdout  # under the table
        assert not any(line.startswith(f"job {ahead}:") for line in lines), listed.stdout  # its estimate did not move
        as_json = {j["id"]: j for j in json.loads(user.run("jobs", "--json").stdout)}
        assert as_json[waiting]["estimate_note"] == note and as_json[ahead]["estimate_note"] is None
        shown = user.run("show", str(waiting)).stdout
        line = next(x for x in shown.splitlines() if x.strip().startswith("estimate moved:"))
        assert line.split(":", 1)[1].strip() == note, shown
    finally:
        for job_id in started:
            user.run("kill", str(job_id))
        user.login("demo-token")
        reset = user.run("vc", "tune", "default", "--policy", "RF", "--limit-weight", "none")
        assert reset.returncode == 0, reset.stderr


def test_a_revoked_token_says_to_log_in_again(user, demo):
    made = subprocess.run(DLTS + ["user", "token", "alice", "--label", "laptop"], env=demo.env(), capture_output=True,
                          text=True, timeout=60, check=False)
    assert made.returncode == 0, made.stderr
    token_file = user.config.parent / "laptop-token"
    token_file.write_text(made.stdout.strip())
    assert user.run("login", demo.url, "--token-file", str(token_file)).returncode == 0
    assert user.run("jobs").returncode == 0
    session = api(demo)
    tokens = session.get(f"{demo.url}/api/v1/me/tokens", timeout=10).json()["items"]
    laptop = next(t for t in tokens if t["name"] == "laptop")
    assert session.delete(f"{demo.url}/api/v1/me/tokens/{laptop['id']}", timeout=10).status_code in (200, 202, 204)
    stale = user.run("jobs")
    assert stale.returncode == 3
    assert "dlts login" in stale.stderr and "revoked" in stale.stderr and "HTTP 401" in stale.stderr


def test_endpoints_keys_ips_vc_and_usage(user, demo, tmp_path):
    user.login()
    job_id = int(user.run("submit", "--image", "any", "--port", "18800", "--", "sleep 600").stdout.strip())
    try:
        eps = json.loads(user.run("endpoints", str(job_id), "--json").stdout)
        assert [e["kind"] for e in eps] == ["port"] and eps[0]["port"] == 18800
        opened = user.run("endpoints", str(job_id), "open", "port", "--port", "18801", "--name", "tb")
        assert opened.returncode == 0 and "port tb" in opened.stdout, opened.stderr
        twice = user.run("endpoints", str(job_id), "open", "port", "--port", "18801")
        assert twice.returncode == 1 and "endpoint_exists" in twice.stderr
        eid = next(e["id"] for e in json.loads(user.run("endpoints", str(job_id), "--json").stdout) if e["name"] == "tb")
        closed = user.run("endpoints", str(job_id), "close", str(eid))
        assert closed.returncode == 0 and "closing" in closed.stdout
        no_ssh = user.run("ssh", str(job_id))
        assert no_ssh.returncode == 1 and f"dlts endpoints {job_id} open ssh" in no_ssh.stderr
    finally:
        user.run("kill", str(job_id))
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "me@laptop", "-f", str(tmp_path / "key")],
                   check=True, capture_output=True)
    added = user.run("keys", "add", str(tmp_path / "key.pub"))
    assert added.returncode == 0 and "SHA256:" in added.stdout, added.stderr
    keys = json.loads(user.run("keys", "--json").stdout)
    assert any(k["name"] == "me@laptop" for k in keys)
    dup = user.run("keys", "add", str(tmp_path / "key.pub"))
    assert dup.returncode == 1 and "duplicate_ssh_key" in dup.stderr
    assert user.run("keys", "delete", str(keys[-1]["id"])).returncode == 0
    ip = user.run("ips", "add", "203.0.113.9")
    assert ip.returncode == 0 and "203.0.113.9/32" in ip.stdout, ip.stderr
    wide = user.run("ips", "add", "10.0.0.0/4")
    assert wide.returncode == 1 and "ip" in wide.stderr
    assert "203.0.113.9/32" in user.run("ips").stdout
    vc = json.loads(user.run("vc", "show", "default", "--json").stdout)
    assert vc["name"] == "default" and "alice" in vc["members"]
    assert "demo-gpu" in user.run("vc", "show", "default").stdout
    hidden = user.run("vc", "show", "elsewhere")
    assert hidden.returncode == 1 and "vc_not_found" in hidden.stderr
    usage = json.loads(user.run("usage", "--json", "--group-by", "user,vc").stdout)
    assert usage["group_by"] == ["user", "vc"]
    assert user.run("usage").returncode == 0
    assert user.run("usage", "--group-by", "planet").returncode == 1


@pytest.mark.skipif((shutil.which("sshd") is None and not os.access("/usr/sbin/sshd", os.X_OK)) or shutil.which("ssh") is None,
                    reason="sshd or ssh is not installed (apt-get install openssh-server openssh-client)")
def test_ssh_runs_ssh_through_the_jobs_ready_endpoint(user, demo, tmp_path):
    user.login()
    key = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, capture_output=True)
    assert user.run("keys", "add", str(key) + ".pub").returncode == 0
    job_id = int(user.run("submit", "--image", "any", "--ssh", "--", "sleep 600").stdout.strip())
    try:
        deadline = time.monotonic() + 90
        while (ep := json.loads(user.run("endpoints", str(job_id), "--json").stdout)[0])["status"] != "ready":
            assert ep["status"] in ("pending",) and time.monotonic() < deadline, ep
            time.sleep(0.3)
        me = getpass.getuser()
        printed = user.run("ssh", "--print", "--login", me, str(job_id), "-i", str(key), "--", "echo", "hi").stdout
        assert printed.strip() == f"ssh -p {ep['host_port']} -i {key} {me}@{ep['host']} echo hi"
        done = user.run("ssh", "--login", me, str(job_id), "-i", str(key), "-o", "StrictHostKeyChecking=no",
                        "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                        "-o", "ConnectTimeout=10", "--", "echo hello from the job", timeout=60)
        assert done.returncode == 0 and done.stdout == "hello from the job\n", done.stderr
        owner = user.run("ssh", "--print", str(job_id)).stdout.strip()
        assert owner == f"ssh -p {ep['host_port']} alice@{ep['host']}"  # the endpoint's user by default
    finally:
        user.run("kill", str(job_id))


def test_the_client_follows_cursors_through_every_page(demo):
    from dlts.client.api import Client

    client = Client(demo.url, (demo.home / "alice-token").read_text().strip())
    for _ in range(5):
        client.post("/jobs", {"vc": "default", "image": "any", "command": "true"})
    everything = client.get("/jobs", limit=500)["items"]
    assert len(everything) >= 5
    paged = list(client.pages("/jobs", page_size=2))
    assert [j["id"] for j in paged] == [j["id"] for j in everything]
    assert [j["id"] for j in client.pages("/jobs", limit=3, page_size=2)] == [j["id"] for j in everything[:3]]


def test_tags_stars_archive_and_delete_from_the_cli(user, demo):
    user.login()
    done = user.run("submit", "--image", "any", "--tag", "sweep-7", "--tag", "lr", "--wait", "--", "true")
    assert done.returncode == 0, done.stderr
    job_id = int(done.stdout.strip())
    assert user.run("tag", str(job_id)).stdout.split() == ["lr", "sweep-7"]
    tagged = user.run("tag", str(job_id), "keep", "Sweep-7")
    assert tagged.returncode == 0 and tagged.stdout.strip() == f"job {job_id}: keep sweep-7", tagged.stdout
    bad = user.run("tag", str(job_id), "no spaces")
    assert bad.returncode == 1 and "tags" in bad.stderr, bad.stderr

    def listed(*flags):
        out = user.run("jobs", "--all", "--json", *flags)
        assert out.returncode == 0, out.stderr
        return [j["id"] for j in json.loads(out.stdout)]

    assert job_id in listed("--tag", "keep") and job_id not in listed("--tag", "lr")
    assert user.run("star", str(job_id)).stdout.strip() == f"job {job_id}: starred"
    assert listed("--starred") == [job_id]
    archived = user.run("archive", str(job_id), "987654")
    assert archived.returncode == 1 and f"job {job_id}: archived" in archived.stdout
    assert "job 987654: failed" in archived.stdout and "1 of 2 failed" in archived.stderr
    assert job_id not in listed() and job_id in listed("--archived", "true")
    assert user.run("unarchive", str(job_id)).returncode == 0 and job_id in listed()
    running = user.run("submit", "--image", "any", "--", "sleep 600")
    other = int(running.stdout.strip())
    refused = user.run("delete", str(other))
    assert refused.returncode == 1 and "job_not_ended" in refused.stdout, refused.stdout
    assert user.run("kill", str(other)).returncode == 0
    assert user.run("delete", str(job_id)).stdout.strip() == f"job {job_id}: deleted"
    assert user.run("show", str(job_id)).returncode == 1


def test_a_vc_admin_tunes_the_vc_limits_and_idle_policy_from_the_cli(user, demo):
    user.login("alice-token")
    refused = user.run("vc", "tune", "default", "--idle-warn-min", "30")
    assert refused.returncode == 1 and "HTTP 403" in refused.stderr, refused.stderr  # alice is a member, not its admin
    user.login("demo-token")
    tuned = user.run("vc", "tune", "default", "--max-job-time", "2d", "--idle-warn-min", "30", "--idle-action", "pause",
                     "--idle-action-min", "10", "--idle-exempt", "interactive", "--notice", "maintenance friday")
    assert tuned.returncode == 0, tuned.stderr
    assert "max job time:" in tuned.stdout and "2d" in tuned.stdout and "maintenance friday" in tuned.stdout
    assert "warn after 30 idle min, pause 10 min later (not interactive jobs)" in tuned.stdout, tuned.stdout
    vc = json.loads(user.run("vc", "show", "default", "--json").stdout)
    assert vc["max_job_time_s"] == 2 * 86400 and vc["notice"] == "maintenance friday"
    assert vc["idle_policy"] == {"idle_warn_min": 30, "idle_action_min": 10, "idle_action": "pause",
                                 "exempt_types": ["interactive"]}
    merged = json.loads(user.run("vc", "tune", "default", "--idle-action", "kill", "--json").stdout)
    assert merged["idle_policy"]["idle_action"] == "kill" and merged["idle_policy"]["idle_warn_min"] == 30
    negative = user.run("vc", "tune", "default", "--idle-warn-min", "-5")
    assert negative.returncode == 1 and negative.stderr.startswith("Error: --idle-warn-min:"), negative.stderr
    bad_time = user.run("vc", "tune", "default", "--max-job-time", "5 fortnights")
    assert bad_time.returncode == 2 and "--max-job-time" in bad_time.stderr
    assert user.run("vc", "tune", "default").returncode == 2  # nothing to change
    reset = user.run("vc", "tune", "default", "--max-job-time", "none", "--no-idle-policy", "--notice", "none", "--json")
    assert reset.returncode == 0, reset.stderr
    back = json.loads(reset.stdout)
    assert back["max_job_time_s"] is None and back["idle_policy"] is None and back["notice"] is None


def test_a_vc_admin_tunes_fair_share_and_the_preemption_budget_from_the_cli(user, demo):
    user.login("alice-token")
    refused = user.run("vc", "tune", "default", "--no-fair-share")
    assert refused.returncode == 1 and "HTTP 403" in refused.stderr, refused.stderr  # a member, not its admin
    user.login("demo-token")
    tuned = user.run("vc", "tune", "default", "--no-fair-share", "--min-runtime-s", "600", "--max-reclaim-delay-s", "0",
                     "--max-preemptions", "3", "--fair-share-max-wait-s", "7200", "--limit-weight", "0.25")
    assert tuned.returncode == 0, tuned.stderr
    for line in ("fair share:", "off (vc)"), ("fair share bound:", "7200 s (2h00m) (vc)"), ("limit weight:", "0.25 (vc)"), \
                ("min runtime:", "600 s (10m00s) (vc)"), \
                ("max reclaim delay:", "0 s (vc)"), ("max preemptions:", "3 (vc)"):
        assert any(line[0] in row and row.rstrip().endswith(line[1]) for row in tuned.stdout.splitlines()), tuned.stdout
    vc = json.loads(user.run("vc", "show", "default", "--json").stdout)
    assert (vc["fair_share"], vc["min_runtime_s"], vc["max_reclaim_delay_s"], vc["max_preemptions"]) == (False, 600, 0, 3)
    assert (vc["fair_share_max_wait_s"], vc["fair_share_max_wait_s_source"]) == (7200, "vc")
    assert (vc["limit_weight"], vc["limit_weight_source"]) == (0.25, "vc")
    shown = user.run("vc", "show", "default").stdout
    assert "max preemptions:" in shown and "3 (vc)" in shown, shown

    too_many = user.run("vc", "tune", "default", "--max-preemptions", "1001")
    assert too_many.returncode == 1 and too_many.stderr.startswith("Error: --max-preemptions:"), too_many.stderr
    too_long = user.run("vc", "tune", "default", "--max-reclaim-delay-s", str(30 * 86400 + 1))
    assert too_long.returncode == 1 and too_long.stderr.startswith("Error: --max-reclaim-delay-s:"), too_long.stderr
    too_long = user.run("vc", "tune", "default", "--fair-share-max-wait-s", str(30 * 86400 + 1))
    assert too_long.returncode == 1 and too_long.stderr.startswith("Error: --fair-share-max-wait-s:"), too_long.stderr
    not_a_number = user.run("vc", "tune", "default", "--fair-share-max-wait-s", "1h")
    assert not_a_number.returncode == 2 and "--fair-share-max-wait-s" in not_a_number.stderr, not_a_number.stderr
    too_heavy = user.run("vc", "tune", "default", "--limit-weight", "11")
    assert too_heavy.returncode == 1 and too_heavy.stderr.startswith("Error: --limit-weight:"), too_heavy.stderr
    for text in ("a quarter", "nan"):
        not_a_number = user.run("vc", "tune", "default", "--limit-weight", text)
        assert not_a_number.returncode == 2 and "--limit-weight" in not_a_number.stderr, not_a_number.stderr
    not_a_number = user.run("vc", "tune", "default", "--min-runtime-s", "10m")
    assert not_a_number.returncode == 2 and "--min-runtime-s" in not_a_number.stderr, not_a_number.stderr
    both = user.run("vc", "tune", "default", "--fair-share", "--fair-share-default")
    assert both.returncode == 2 and "--fair-share-default" in both.stderr, both.stderr

    reset = user.run("vc", "tune", "default", "--fair-share-default", "--min-runtime-s", "none", "--max-reclaim-delay-s",
                     "none", "--max-preemptions", "none", "--fair-share-max-wait-s", "none", "--limit-weight", "none",
                     "--json")
    assert reset.returncode == 0, reset.stderr
    back = json.loads(reset.stdout)
    keys = ("fair_share", "fair_share_max_wait_s", "min_runtime_s", "max_reclaim_delay_s", "max_preemptions",
            "limit_weight")
    assert {k: back[f"{k}_source"] for k in keys} == dict.fromkeys(keys, "default")
    assert tuple(back[k] for k in keys) == (True, None, 0, None, 0, 0)  # the demo's dlts.yaml sets none of them
    rows = {row.split(":")[0].strip(): row.split(":", 1)[1].strip()
            for row in user.run("vc", "show", "default").stdout.splitlines() if row.startswith("  ") and ":" in row}
    assert (rows["fair share"], rows["min runtime"], rows["max reclaim delay"], rows["max preemptions"]) == \
        ("on (default)", "0 s (default)", "never (default)", "no limit (default)")
    assert (rows["fair share bound"], rows["limit weight"]) == ("none (default)", "0 (default)")
