"""The mariadb role's backup and restore scripts, run for real against throwaway MariaDB servers.

The role's templates (dlts-db-backup, dlts-db-restore, dlts-db-replica-setup, 60-dlts.cnf) are
rendered by Ansible with the vagrant inventory, the paths pointed into a scratch directory and the
server's stop/start commands pointed at a throwaway mariadbd (started from the rendered
60-dlts.cnf, so binary logs are on exactly as the role turns them on). The backup account is made
with the role's own privilege list and credentials file. Then: a backup, rows written after it, a
destroyed datadir, a point-in-time restore that brings back exactly the rows written before the
chosen time; retention; the lock; the refusal of a non-empty datadir; failures that exit non-zero;
and a replica seeded from a primary that follows it by GTID. And DLTS itself on such a server (its
schema made by its migrations), jobs run through the job manager and the local backend, restored to
a point in time: the jobs given the discarded job's id show only their own logs.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jinja2
import pytest
import yaml
from ansible_helpers import ROLES_DIR, render_templates

from tests.conftest import make_settings
from tests.core.log_restore_helpers import (
    attempt_key,
    cluster,  # noqa: F401 (the fixture)
    download,
    job_log,
    orphan_report,
    run_to_end,
    status,
    submit,
)

pytestmark = pytest.mark.slow

MARIADB_ROLE = ROLES_DIR / "mariadb"
MARIADBD = "/usr/sbin/mariadbd"
KEEP, KEEP_DAYS = 3, 7


def _require_tools() -> None:
    if os.geteuid() != 0:
        message = "the backup tests run mariadbd as the mysql user and restore as root; run them as root"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    for name, package in (("mariadb-backup", "mariadb-backup"), ("mariadb-install-db", "mariadb-server"),
                          ("mariadb-binlog", "mariadb-client"), ("flock", "util-linux")):
        if shutil.which(name) is None:
            pytest.fail(f"{name} is required (apt-get install -y {package})")
    if not Path(MARIADBD).exists():
        pytest.fail("mariadbd is required (apt-get install -y mariadb-server)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Instance:
    """Paths of one throwaway server; the rendered scripts have these paths baked in."""

    def __init__(self, root: Path, name: str):
        self.root = root / name
        self.data = self.root / "data"
        self.binlog = self.root / "binlog"
        self.backups = self.root / "backups"
        self.run = self.root / "run"
        self.etc = self.root / "etc"
        self.socket = self.run / "mysqld.sock"
        self.pid = self.run / "mysqld.pid"
        self.port = _free_port()
        self.out = self.root / "render"
        self.cnf = self.out / "rendered" / "mariadb" / "60-dlts.cnf"
        self.defaults_file = self.etc / "dlts-backup.cnf"
        self.password_file = self.etc / "dlts-replication.password"

    @property
    def start_command(self) -> str:
        return (
            f"start-stop-daemon --start --quiet --background --pidfile {self.pid} --exec {MARIADBD} -- "
            f"--defaults-file={self.cnf} --user=mysql --datadir={self.data} --socket={self.socket} "
            f"--pid-file={self.pid} --log-error={self.run}/error.log --skip-name-resolve"
        )

    @property
    def stop_command(self) -> str:
        return f"start-stop-daemon --stop --quiet --oknodo --pidfile {self.pid} --exec {MARIADBD} --retry TERM/60/KILL/5"

    def overrides(self) -> dict:
        return {
            "mariadb_datadir": str(self.data),
            "mariadb_binlog_dir": str(self.binlog),
            "mariadb_backup_dir": str(self.backups),
            "mariadb_backup_defaults_file": str(self.defaults_file),
            "mariadb_login_unix_socket": str(self.socket),
            "mariadb_backup_script": str(self.script("dlts-db-backup")),
            "mariadb_server_stop_command": self.stop_command,
            "mariadb_server_start_command": self.start_command,
            "mariadb_server_start_timeout_s": 120,
            "mariadb_bind_address": "127.0.0.1",
            "mariadb_port": self.port,
            "mariadb_innodb_buffer_pool_bytes": 134217728,
            "mariadb_backup_keep": KEEP,
            "mariadb_backup_keep_days": KEEP_DAYS,
            "mariadb_replication_password_file": str(self.password_file),
            "mariadb_replica_start_timeout_s": 120,
        }

    def script(self, name: str) -> Path:
        return self.out / "rendered" / "mariadb" / name

    def sql(self, statement: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(
            ["mariadb", "--no-defaults", f"--socket={self.socket}", "--batch", "--skip-column-names",
             "--init-command=SET SESSION lock_wait_timeout=10", "-e", statement],
            capture_output=True, text=True, timeout=60, check=False)
        if check:
            assert result.returncode == 0, f"{statement}: {result.stderr}"
        return result

    def rows(self) -> list[int]:
        return [int(v) for v in self.sql("SELECT id FROM dlts.jobs ORDER BY id").stdout.split()]

    def up(self) -> bool:
        return subprocess.run(
            ["mariadb-admin", "--no-defaults", f"--socket={self.socket}", "ping"],
            capture_output=True, timeout=30, check=False,
        ).returncode == 0

    def start(self) -> None:
        subprocess.run(["sh", "-c", self.start_command], check=True, timeout=60)
        _wait(self.up, 60, f"mariadbd did not answer on {self.socket}: {self._error_log()}")

    def stop(self) -> None:
        subprocess.run(["sh", "-c", self.stop_command], check=True, timeout=120)

    def _error_log(self) -> str:
        log = self.run / "error.log"
        return log.read_text()[-3000:] if log.exists() else "(no error log)"

    def fresh(self) -> None:
        """An empty server: wipe the data, the binlogs and the backups, initialise, start."""
        assert not self.up(), f"a server still answers on {self.socket}"
        failures = []
        for _attempt in range(2):
            for path in (self.data, self.binlog, self.backups, self.run):
                if path.exists():
                    shutil.rmtree(path)
            for path, mode in ((self.binlog, 0o750), (self.backups, 0o700), (self.run, 0o755)):
                path.mkdir(parents=True)
                path.chmod(mode)
                shutil.chown(path, "mysql", "mysql")
            installed = subprocess.run(
                ["mariadb-install-db", "--no-defaults", "--user=mysql", f"--datadir={self.data}",
                 "--auth-root-authentication-method=socket", "--skip-test-db"],
                capture_output=True, text=True, timeout=120, check=False,
            )
            if installed.returncode == 0:
                break
            # the bootstrap server failed once in CI with two test streams running, its output lost:
            # kept now, and tried once more on a wiped directory (this sets up the test; it is not
            # what the test checks)
            failures.append(f"exit {installed.returncode}\n{installed.stdout[-3000:]}\n{installed.stderr[-3000:]}")
            print(f"mariadb-install-db failed, trying again: {failures[-1]}", file=sys.stderr)
        else:
            raise AssertionError("mariadb-install-db failed twice:\n" + "\n---\n".join(failures))
        self.start()


def _wait(condition, timeout_s: float, message: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(message)
        time.sleep(0.1)


def _role_defaults() -> dict:
    return yaml.safe_load((MARIADB_ROLE / "defaults" / "main.yml").read_text())


def _role_task(file: str, name: str) -> dict:
    for task in yaml.safe_load((MARIADB_ROLE / "tasks" / file).read_text()):
        if task["name"] == name:
            return task
    raise AssertionError(f"no task {name!r} in tasks/{file}")


def _grant(privileges: str, account: str) -> str:
    """GRANT statements for a community.mysql priv string ("db.tbl:PRIV,PRIV/db2.*:PRIV")."""
    statements = []
    for part in privileges.split("/"):
        target, privs = part.strip().rsplit(":", 1)
        db, table = target.split(".", 1)
        quoted = "*" if db == "*" else f"`{db}`"
        statements.append(f"GRANT {privs} ON {quoted}.{table} TO {account}")
    return "; ".join(statements)


def _make_backup_account(instance: Instance) -> None:
    """The account and credentials file exactly as tasks/backup.yml makes them."""
    defaults = _role_defaults()
    password = "bk-" + base64.b16encode(os.urandom(12)).decode().lower()
    user = defaults["mariadb_backup_user"]
    instance.sql(f"CREATE USER IF NOT EXISTS '{user}'@'localhost' IDENTIFIED BY '{password}'; "
                 + _grant(defaults["mariadb_backup_privileges"], f"'{user}'@'localhost'"))
    task = _role_task("backup.yml", "Write the credentials file mariadb-backup reads")
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["b64decode"] = lambda value: base64.b64decode(value).decode()  # Ansible's filter
    content = env.from_string(task["ansible.builtin.copy"]["content"]).render(
        mariadb_backup_user=user,
        mariadb_backup_password_read={"content": base64.b64encode(password.encode() + b"\n").decode()},
        mariadb_login_unix_socket=str(instance.socket),
    )
    instance.etc.mkdir(parents=True, exist_ok=True)
    instance.defaults_file.write_text(content)
    instance.defaults_file.chmod(0o600)
    shutil.chown(instance.defaults_file, "mysql", "mysql")


def _render(instance: Instance, extra: dict | None = None) -> None:
    render_templates("vagrant", instance.out, {**instance.overrides(), **(extra or {})}, roles_only=("mariadb",))
    for name in ("dlts-db-backup", "dlts-db-restore", "dlts-db-replica-setup"):
        instance.script(name).chmod(0o755)


@pytest.fixture(scope="module")
def scratch():
    _require_tools()
    # mariadbd runs as mysql: every directory above its files must be traversable (not pytest's 0700).
    root = Path(tempfile.mkdtemp(prefix="dlts-db-backup-", dir="/tmp"))
    root.chmod(0o755)
    instances: list[Instance] = []
    yield root, instances
    for instance in instances:
        try:
            instance.stop()
        except (subprocess.SubprocessError, OSError):  # never leave a server behind: kill it by its pid file
            with contextlib.suppress(Exception):
                os.kill(int(instance.pid.read_text().strip()), 9)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def rendered(scratch):
    root, instances = scratch
    instance = Instance(root, "primary")
    _render(instance)
    instances.append(instance)
    return instance


@pytest.fixture
def db(rendered):
    """A fresh server with the backup account and a small jobs table."""
    rendered.fresh()
    _make_backup_account(rendered)
    rendered.sql("CREATE DATABASE dlts CHARACTER SET utf8mb4; "
                 "CREATE TABLE dlts.jobs (id INT PRIMARY KEY, name VARCHAR(40)) ENGINE=InnoDB")
    yield rendered
    rendered.stop()


def _insert(instance: Instance, *ids: int) -> None:
    instance.sql("; ".join(f"INSERT INTO dlts.jobs VALUES ({i}, 'job-{i}')" for i in ids))


def _backup(instance: Instance, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        ["runuser", "-u", "mysql", "--", str(instance.script("dlts-db-backup"))],
        capture_output=True, text=True, timeout=300, check=False)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def _restore(instance: Instance, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(instance.script("dlts-db-restore")), *args], capture_output=True, text=True, timeout=600, check=False)


def _backups(instance: Instance) -> list[str]:
    return sorted(p.name for p in instance.backups.iterdir() if p.is_dir())


def _manifest(instance: Instance, name: str) -> dict[str, str]:
    lines = (instance.backups / name / "dlts-backup.manifest").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines)


def _next_second() -> int:
    """Wait for the wall clock to enter a new second and return it (binlog times have 1 s resolution)."""
    start = int(time.time())
    _wait(lambda: int(time.time()) > start, 5, "the clock did not move")
    return int(time.time())


def test_point_in_time_restore_brings_back_exactly_the_rows_before_the_chosen_time(db):
    _insert(db, 1, 2, 3)
    backup = _backup(db)
    assert "done:" in backup.stderr
    [name] = _backups(db)
    manifest = _manifest(db, name)
    # The manifest's position is where the server's binlog stood when the backup was taken.
    master = db.sql("SHOW MASTER STATUS").stdout.split()
    assert (manifest["binlog_file"], manifest["binlog_pos"]) == (master[0], master[1])
    assert (db.binlog / manifest["binlog_file"]).exists()
    assert oct((db.backups).stat().st_mode & 0o777) == "0o700"

    _insert(db, 4, 5)
    until_epoch = _next_second()
    until = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(until_epoch))
    _insert(db, 6, 7)
    db.sql("DELETE FROM dlts.jobs WHERE id = 1")
    assert db.rows() == [2, 3, 4, 5, 6, 7]

    # The disk holding the datadir is lost; the binlogs (another directory) and the backup survive.
    db.stop()
    shutil.rmtree(db.data)
    restored = _restore(db, "--until", until)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert db.up()
    assert db.rows() == [1, 2, 3, 4, 5]
    assert "rolled forward to " + until in restored.stderr
    # The restored server writes a binlog of its own and accepts writes.
    _insert(db, 8)
    assert db.rows() == [1, 2, 3, 4, 5, 8]
    assert list(db.binlog.glob("pre-restore-*/mysql-bin.000001"))
    # Backups after the restore belong to the new binlog timeline (whose files start at .000001 again).
    _backup(db)
    newer = _backups(db)[-1]
    assert _manifest(db, newer)["binlog_timeline"].startswith("restored-")
    assert _manifest(db, name)["binlog_timeline"] == "initial"
    _insert(db, 9)
    until_later = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(_next_second()))

    # The old backup can still be rolled forward: with the old timeline's binlogs (moved aside),
    # not the new ones of the same names.
    again = _restore(db, "--backup", name, "--until", until, "--force")
    assert again.returncode == 0, again.stdout + again.stderr
    assert db.rows() == [1, 2, 3, 4, 5]
    # ... and the newer backup with the new timeline's binlogs (row 9 came after it).
    forward = _restore(db, "--backup", newer, "--until", until_later, "--force")
    assert forward.returncode == 0, forward.stdout + forward.stderr
    assert db.rows() == [1, 2, 3, 4, 5, 8, 9]

    # A whole restore (no --until) of the same backup over the running server needs --force and
    # gives back the backup's rows exactly; the old datadir is moved aside, not deleted.
    whole = _restore(db, "--backup", name, "--force")
    assert whole.returncode == 0, whole.stdout + whole.stderr
    assert db.rows() == [1, 2, 3]
    aside = list(db.root.glob("data.pre-restore-*"))
    assert len(aside) == 3 and all((d / "dlts").is_dir() for d in aside)


@pytest.fixture
def dlts_db(rendered):
    """A fresh server with the backup account and DLTS's database, its schema made by DLTS's own
    migrations (as `dlts db upgrade` makes it); DLTS connects as root over the socket."""
    import sqlalchemy as sa

    from dlts import db_migrate

    rendered.fresh()
    _make_backup_account(rendered)
    rendered.sql("CREATE DATABASE dlts CHARACTER SET utf8mb4")
    url = f"mysql+pymysql://root@localhost/dlts?unix_socket={rendered.socket}&charset=utf8mb4"
    engine = sa.create_engine(url)
    db_migrate.upgrade(engine)
    engine.dispose()
    yield rendered, url
    rendered.stop()


@pytest.fixture
def settings(tmp_path, dlts_db):
    """The tests' settings on the throwaway server (tests/conftest.py's settings use the test database)."""
    return make_settings(tmp_path, dlts_db[1])


@pytest.mark.timeout(600)  # three waits for jobs (each bounded at 180 s), a backup, a restore, two more jobs
def test_after_a_point_in_time_restore_new_jobs_show_only_their_own_logs_and_the_discarded_log_is_an_orphan(
        dlts_db, app, client, settings, sessions, world, cluster, monkeypatch):  # noqa: F811
    from dlts.db import engine_of

    server, _url = dlts_db
    manager, _backend = cluster
    kept = submit(client, world, "echo kept before the backup")
    run_to_end(client, world, manager, settings, kept)
    _backup(server)
    replayed = submit(client, world, "echo after the backup")  # comes back from the binary logs
    run_to_end(client, world, manager, settings, replayed)
    point = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(_next_second()))
    discarded = submit(client, world, "echo after the chosen time")
    run_to_end(client, world, manager, settings, discarded)
    assert [job_log(client, world, j) for j in (kept, replayed, discarded)] == \
        ["kept before the backup\n", "after the backup\n", "after the chosen time\n"]
    keys = {j: attempt_key(sessions, j) for j in (kept, replayed, discarded)}

    # The disk holding the datadir is lost (DLTS's connections closed first, as the runbook stops the
    # services); the binlogs and the backup survive, the log store is left as it is.
    engine_of(app).dispose()
    server.stop()
    shutil.rmtree(server.data)
    restored = _restore(server, "--until", point)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert "rolled forward to " + point in restored.stderr

    assert [status(client, world, j) for j in (kept, replayed)] == ["finished", "finished"]
    assert client.get(f"/api/v1/jobs/{discarded}", headers=world.auth("alice")).status_code == 404
    assert {j: attempt_key(sessions, j) for j in (kept, replayed)} == {j: keys[j] for j in (kept, replayed)}
    assert [job_log(client, world, j) for j in (kept, replayed)] == ["kept before the backup\n", "after the backup\n"]

    new = [submit(client, world, "echo new 1"), submit(client, world, "echo new 2")]
    assert new == [discarded, discarded + 1]  # the discarded job's id is handed out again
    assert job_log(client, world, new[0]) == "" and download(client, world, new[0])[0] == 400  # not run yet: no log
    for job_id in new:
        run_to_end(client, world, manager, settings, job_id)
    assert [job_log(client, world, j) for j in new] == ["new 1\n", "new 2\n"]
    assert download(client, world, new[0]) == (200, "new 1\n")

    # Exactly the discarded attempt's log is an orphan (its job id now names the new job), untouched.
    orphans = orphan_report(settings, monkeypatch)
    assert [(o["job_id"], o["attempt"], o["log_key"], o["job_exists"]) for o in orphans] == \
        [(discarded, 1, keys[discarded], True)]
    assert orphans[0]["files"] == [f"attempt-1-{keys[discarded]}.log"]
    assert attempt_key(sessions, new[0]) != keys[discarded]
    assert (settings.effective_log_dir / str(discarded) / orphans[0]["files"][0]).read_text() == \
        "after the chosen time\n"


def test_restore_refuses_a_non_empty_datadir_without_force_and_leaves_the_server_running(db):
    _insert(db, 1)
    _backup(db)
    _insert(db, 2)
    refused = _restore(db)
    assert refused.returncode == 2
    assert "is not empty" in refused.stderr and "--force" in refused.stderr
    assert db.up() and db.rows() == [1, 2]  # nothing was touched

    too_early = _restore(db, "--until", "2000-01-01 00:00:00", "--force")
    assert too_early.returncode == 2 and "no backup" in too_early.stderr and "finished before" in too_early.stderr
    bad_time = _restore(db, "--until", "yesterday")
    assert bad_time.returncode == 2 and "YYYY-MM-DD HH:MM:SS" in bad_time.stderr
    unknown = _restore(db, "--backup", "20000101T000000Z")
    assert unknown.returncode == 2 and "no backup" in unknown.stderr
    assert db.up() and db.rows() == [1, 2]


def test_retention_keeps_the_newest_backups_and_drops_old_ones(db):
    _insert(db, 1)
    for _ in range(KEEP):
        _backup(db)
    names = _backups(db)
    assert len(names) == KEEP
    # The middle backup ages past the retention (as if KEEP_DAYS + 1 days had passed), and an
    # interrupted run left an incomplete directory behind.
    manifest = db.backups / names[1] / "dlts-backup.manifest"
    old = int(time.time()) - (KEEP_DAYS + 1) * 86400
    manifest.write_text("".join(
        f"finished_epoch={old}\n" if line.startswith("finished_epoch=") else line + "\n"
        for line in manifest.read_text().splitlines()))
    partial = db.backups / "20000101T000000Z.partial"
    partial.mkdir()
    result = _backup(db)
    remaining = _backups(db)
    # The oldest goes (more than KEEP), the aged one goes (older than KEEP_DAYS), the partial goes.
    assert remaining == [names[2], remaining[-1]] and remaining[-1] > names[2], (names, remaining)
    assert f"removing {db.backups / names[0]} (more than {KEEP} backups)" in result.stderr
    assert f"removing {db.backups / names[1]} (older than {KEEP_DAYS} days)" in result.stderr
    assert not partial.exists()
    listed = subprocess.run([str(db.script("dlts-db-restore")), "--list"], capture_output=True, text=True, check=False)
    assert [line.split()[0] for line in listed.stdout.splitlines()] == remaining


def test_a_backup_or_restore_never_runs_while_another_holds_the_lock(db):
    _insert(db, 1)
    _backup(db)
    before = _backups(db)
    with open(db.backups / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        second = _backup(db, check=False)
        restore = _restore(db, "--force")
        fcntl.flock(lock, fcntl.LOCK_UN)
    assert second.returncode == 75 and "another backup or a restore is running" in second.stderr
    assert restore.returncode == 75 and "a backup is running" in restore.stderr
    assert _backups(db) == before
    assert db.up() and db.rows() == [1]  # the refused restore did not stop the server


def test_a_failed_backup_exits_non_zero_and_leaves_nothing_behind(db):
    _insert(db, 1)
    db.stop()
    failed = _backup(db, check=False)
    assert failed.returncode == 1
    assert "FAILED: mariadb-backup --backup" in failed.stderr
    assert _backups(db) == []
    db.start()


def test_the_backup_account_cannot_read_the_data(db):
    _insert(db, 1)
    user = _role_defaults()["mariadb_backup_user"]
    grants = db.sql(f"SHOW GRANTS FOR '{user}'@'localhost'").stdout
    assert "ALL PRIVILEGES" not in grants and "SELECT" not in grants and "SUPER" not in grants, grants
    password = next(line.split("=", 1)[1] for line in db.defaults_file.read_text().splitlines()
                    if line.startswith("password="))
    denied = subprocess.run(
        ["mariadb", "--no-defaults", f"--socket={db.socket}", f"--user={user}", "-e", "SELECT * FROM dlts.jobs"],
        env={**os.environ, "MYSQL_PWD": password}, capture_output=True, text=True, timeout=30, check=False)
    assert denied.returncode != 0 and "denied" in denied.stderr


def test_a_replica_seeds_from_the_primary_and_follows_it_by_gtid(db, scratch):
    """Two servers on loopback: the replica's setup script seeds it and it replicates read-only."""
    root, instances = scratch
    primary = db
    defaults = _role_defaults()
    _insert(primary, 1, 2)
    password = base64.b16encode(os.urandom(12)).decode().lower()
    repl_user = defaults["mariadb_replication_user"]
    privileges = jinja2.Template(defaults["mariadb_replication_privileges"]).render(dlts_db_name="dlts")
    primary.sql(f"CREATE USER '{repl_user}'@'127.0.0.1' IDENTIFIED BY '{password}'; "
                + _grant(privileges, f"'{repl_user}'@'127.0.0.1'"))

    replica = Instance(root, "replica")
    instances.append(replica)
    replica.etc.mkdir(parents=True)
    replica.password_file.write_text(password + "\n")
    # Rendered for a host of dlts_db_replica: server_id 101, read_only, the DLTS database only.
    _render(replica, {
        "mariadb_replication_primary_host": "127.0.0.1",
        "mariadb_replication_primary_port": primary.port,
        "mariadb_server_id": 101,
        "mariadb_replica": True,
    })
    cnf = replica.cnf.read_text()
    assert "read_only = ON" in cnf and "server_id = 101" in cnf
    replica.fresh()
    setup = subprocess.run([str(replica.script("dlts-db-replica-setup"))], capture_output=True, text=True, timeout=300, check=False)
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert "seeded dlts" in setup.stdout
    assert replica.rows() == [1, 2]

    _insert(primary, 3)
    primary.sql("CREATE USER 'someone'@'localhost' IDENTIFIED BY 'x'")  # not replicated: not the DLTS db
    _wait(lambda: replica.rows() == [1, 2, 3], 60, f"the replica did not follow: {replica.rows()}")
    status = subprocess.run(["mariadb", "--no-defaults", f"--socket={replica.socket}", "-e", "SHOW SLAVE STATUS\\G"],
                            capture_output=True, text=True, timeout=30, check=False).stdout
    assert "Using_Gtid: Slave_Pos" in status and "Slave_SQL_Running: Yes" in status, status
    assert replica.sql("SELECT @@read_only").stdout.strip() == "1"
    assert replica.sql("SELECT COUNT(*) FROM mysql.user WHERE user = 'someone'").stdout.strip() == "0"

    again = subprocess.run([str(replica.script("dlts-db-replica-setup"))], capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode == 0 and again.stdout.startswith("already a replica"), again.stdout + again.stderr
    replica.stop()
