"""A database restored from a backup, with the log store as it is: the jobs come back exactly, the
jobs the restore discarded leave their logs behind, and a new job that is given a discarded job's id
(auto-increment counts from the backup's) shows only its own output, because its attempt's log key
is new. The discarded jobs' logs are listed by ``dlts db orphan-logs`` and removed by the janitor
once they are older than ``retention_days``, never before.

Real parts: jobs run through the local backend (the init writes their output to the log store), the
API serves the logs, and the database is backed up and restored with the tools an operator uses:
SQLite's online backup (a consistent copy of the file) and, on MariaDB (DLTS_TEST_DATABASE_URL),
``mariadb-dump`` piped back into ``mariadb``, which brings the tables back with the backup's
AUTO_INCREMENT counters as a ``mariadb-backup`` restore does.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.conftest import IS_MYSQL
from tests.core.log_restore_helpers import (
    TIMEOUT_S,
    attempt_key,
    cluster,  # noqa: F401 (the fixture)
    download,
    job_log,
    orphan_report,
    run_to_end,
    status,
    submit,
    until,
)


class DatabaseBackup:
    """A full backup of the test database, taken and restored with the operator's tools."""

    def __init__(self, url: str, directory: Path) -> None:
        self.url = make_url(url)
        self.file = directory / ("dlts.sql" if IS_MYSQL else "dlts-backup.db")

    def take(self) -> None:
        if IS_MYSQL:
            with open(self.file, "wb") as out:
                self._run("mariadb-dump", "--single-transaction", "--skip-triggers", self.url.database, stdout=out)
        else:
            self._sqlite_copy(self.url.database, str(self.file))

    def restore(self, app) -> None:
        """Every connection of the application is closed first, as the runbook stops the services."""
        from dlts.db import engine_of

        engine_of(app).dispose()
        if IS_MYSQL:
            with open(self.file, "rb") as dump:
                self._run("mariadb", self.url.database, stdin=dump)
        else:
            self._sqlite_copy(str(self.file), self.url.database)

    @staticmethod
    def _sqlite_copy(source: str, target: str) -> None:
        with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
            src.backup(dst)
        src.close()
        dst.close()

    def _run(self, tool: str, *args, stdin=None, stdout=None) -> None:
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is required for the MariaDB restore test (apt-get install -y mariadb-client)")
        url = self.url
        socket = url.query.get("unix_socket")
        where = [f"--socket={socket}"] if socket else \
            ["--protocol=tcp", f"--host={url.host or '127.0.0.1'}", f"--port={url.port or 3306}"]
        env = dict(os.environ, **({"MYSQL_PWD": url.password} if url.password else {}))
        subprocess.run([tool, *where, f"--user={url.username or 'root'}", *args], stdin=stdin, stdout=stdout,
                       env=env, check=True, timeout=TIMEOUT_S)


def test_after_a_restore_a_reused_job_id_shows_only_its_own_log_and_the_discarded_logs_are_orphans(
        app, client, settings, sessions, world, cluster, tmp_path, monkeypatch):  # noqa: F811
    from dlts.managers.janitor import Janitor
    from dlts.models import utcnow
    from dlts.services import log_orphans

    manager, _backend = cluster
    kept = submit(client, world, "echo kept before the backup")
    run_to_end(client, world, manager, settings, kept)
    backup = DatabaseBackup(settings.database_url, tmp_path)
    backup.take()

    discarded = []
    for i in (1, 2):  # one after the other: the restore is what this test is about, not two jobs at once
        discarded.append(submit(client, world, f"echo discarded {i}"))
        run_to_end(client, world, manager, settings, discarded[-1])
    assert [job_log(client, world, j) for j in discarded] == ["discarded 1\n", "discarded 2\n"]

    backup.restore(app)
    assert status(client, world, kept) == "finished"
    assert client.get(f"/api/v1/jobs/{discarded[0]}", headers=world.auth("alice")).status_code == 404
    assert job_log(client, world, kept) == "kept before the backup\n"  # a job the backup has keeps its log

    stop = tmp_path / "stop"
    new = [submit(client, world, f"echo new 1; while [ ! -e {stop} ]; do sleep 0.05; done"),
           submit(client, world, "echo new 2")]
    assert new == discarded  # the ids are handed out again
    assert job_log(client, world, new[0]) == "" and download(client, world, new[0])[0] == 400  # not run yet: no log
    until(manager, lambda: "new 1" in job_log(client, world, new[0]), "the first new job printed")
    run_to_end(client, world, manager, settings, new[1])
    assert [job_log(client, world, j) for j in new] == ["new 1\n", "new 2\n"]
    assert download(client, world, new[1]) == (200, "new 2\n")

    orphans = orphan_report(settings, monkeypatch)
    assert sorted((o["job_id"], o["attempt"], o["job_exists"]) for o in orphans) == [(j, 1, True) for j in discarded]
    assert all(o["files"] == [f"attempt-1-{o['log_key']}.log"] for o in orphans)
    with sessions() as s:
        from dlts.repositories.jobs import log_names

        _, named = log_names(s, discarded)
    assert not {(o["job_id"], o["attempt"], o["log_key"]) for o in orphans} & named

    now = utcnow()
    janitor = Janitor(sessions, retention_days=30, log_dir=settings.effective_log_dir, clock=lambda: now)
    assert janitor.run().orphan_logs == 0  # written just now: kept for retention_days
    assert len(list(log_orphans.find(sessions, settings.effective_log_dir))) == 2

    later = now + dt.timedelta(days=31)  # the first new job still runs, so its row and log stay
    result = Janitor(sessions, retention_days=30, log_dir=settings.effective_log_dir, clock=lambda: later).run()
    assert result.orphan_logs == 1  # the other orphan went with the directory of the ended job that reused its id
    assert result.jobs == 2  # the job kept by the backup and the second new job, ended "31 days ago"
    assert orphan_report(settings, monkeypatch) == []
    assert [p.name for p in (settings.effective_log_dir / str(new[0])).iterdir()] == \
        [f"attempt-1-{attempt_key(sessions, new[0])}.log"]
    assert job_log(client, world, new[0]) == "new 1\n"
    stop.touch()
    run_to_end(client, world, manager, settings, new[0])
    assert job_log(client, world, new[0]) == "new 1\n"

