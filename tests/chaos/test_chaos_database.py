"""The database killed -9 and restarted under a submission load: a throwaway mariadbd on a port of
its own (never the shared one on 3306), the real API over HTTP taking jobs, a real ``dlts managers``
running them. While the database is away the API answers 503 with the error envelope, nothing
else; every job it accepted (201) is still there afterwards and runs once; the figures are the
outage the clients saw and the time from the restart to the first accepted job
(docs/reliability.md)."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from chaos_kit import (
    ApiServer,
    Cluster,
    Submitter,
    assert_once_per_attempt,
    figures,
    lease_row,
    ledger_command,
    wait_all_ended,
    wait_for_holder,
    wait_for_node,
    write_config,
)

from dlts import db_migrate
from dlts.app import create_app
from dlts.config import Settings
from dlts.db import engine_of, session_factory
from dlts.models import Job
from dlts.services import admin

pytestmark = [pytest.mark.chaos, pytest.mark.db, pytest.mark.timeout(180),
              pytest.mark.skipif(not (shutil.which("mariadbd") or os.path.exists("/usr/sbin/mariadbd"))
                                 or not shutil.which("mariadb-install-db"), reason="MariaDB is not installed")]
SEED = int(os.environ.get("DLTS_CHAOS_SEED", "1616"))
MARIADBD = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
DOWN_S = 3.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ThrowawayMariaDB:
    """mariadbd on its own data directory and port (tools-here.md section 1), started, killed -9
    and started again by the test. Grant tables are skipped: nothing but this test reaches it."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="dlts-chaos-mdb-"))
        os.chmod(self.root, 0o755)
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        user = ["--user=mysql"] if os.geteuid() == 0 else []
        if user:
            shutil.chown(self.root, "mysql")
        self.user = user
        subprocess.run(["mariadb-install-db", *user, f"--datadir={self.root / 'data'}", "--skip-test-db",
                        "--auth-root-authentication-method=normal"], check=True, capture_output=True, timeout=120)

    @property
    def url(self) -> str:
        return f"mysql+pymysql://root@127.0.0.1:{self.port}/dlts?charset=utf8mb4"

    def start(self, timeout_s: float = 60) -> float:
        """Start it; seconds until it answers."""
        began = time.monotonic()
        self.proc = subprocess.Popen(
            [MARIADBD, "--no-defaults", *self.user, f"--datadir={self.root / 'data'}", f"--port={self.port}",
             "--bind-address=127.0.0.1", f"--socket={self.root / 'mdb.sock'}", f"--pid-file={self.root / 'mdb.pid'}",
             f"--log-error={self.root / 'mdb.err'}", "--skip-grant-tables", "--innodb-buffer-pool-size=32M",
             "--lock-wait-timeout=10", "--max-connections=200"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    engine = sa.create_engine(self.url.replace("/dlts?", "/?"))
                    with engine.connect() as conn:
                        conn.execute(sa.text("SELECT 1"))
                    engine.dispose()
                    return time.monotonic() - began
            except (OSError, sa.exc.OperationalError):
                assert self.proc.poll() is None, (self.root / "mdb.err").read_text()[-2000:]
                assert time.monotonic() - began < timeout_s, "mariadbd did not answer"
                time.sleep(0.1)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def mariadb():
    server = ThrowawayMariaDB()
    server.start()
    engine = sa.create_engine(server.url.replace("/dlts?", "/?"))
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE DATABASE dlts CHARACTER SET utf8mb4"))
    engine.dispose()
    yield server
    server.close()


def test_the_database_killed_and_restarted_under_load_keeps_every_accepted_job_and_answers_only_503(mariadb, tmp_path):
    rng = random.Random(SEED)
    settings = Settings(home=tmp_path / "home", database_url=mariadb.url, secret_key="test-secret-key-0123456789",
                        tick_s=0.2, demo_gpus=4, demo_sku="demo-gpu")
    settings.home.mkdir()
    app = create_app(settings)
    engine = engine_of(app)
    db_migrate.upgrade(engine)
    sessions = session_factory(app)
    with sessions() as s:
        admin.add_vc(s, "vision", {"demo-gpu": 4}, cpu_quota=64, memory_quota_bytes=256 * 2**30)
        admin.add_user(s, "alice")
        admin.add_member(s, "vision", "alice")
        token = admin.new_token(s, "alice", "chaos")
    ledger = tmp_path / "ledger"
    cluster = Cluster(write_config(tmp_path / "dlts.yaml", settings, lease_s=3.0), tmp_path)
    try:
        with ApiServer(app) as api:
            cluster.start("ctl-a")
            wait_for_holder(sessions, "ctl-a", 60)
            wait_for_node(sessions, 30)  # jobs name a GPU SKU: its node must be known before they are accepted
            submitter = Submitter(api.url, token, ledger_command(ledger, 0.2), count=70, every_s=0.1).start()
            while len(submitter.accepted) < 10 + rng.randrange(10):
                assert not submitter.done
                time.sleep(0.05)
            killed_at = time.monotonic()
            mariadb.kill()
            time.sleep(DOWN_S)
            restarted_at = time.monotonic()
            start_s = mariadb.start()
            submitter.join(120)
            # a submission whose answer was a 503 may still have been stored: the database can commit
            # and die before the API reads the job back (the client cannot tell; it is reported below)
            with sessions() as s:
                stored = list(s.scalars(sa.select(Job.id)))
            ended_s = wait_all_ended(sessions, stored, 120)
        answers = dict(submitter.answers)
        assert set(answers) <= {201, 503}, answers  # no 500, no dropped connection
        assert answers.get(503, 0) >= 1, answers  # the outage was seen
        first_ok = next(t for t, status in submitter.log if status == 201 and t > killed_at)
        last_503 = max(t for t, status in submitter.log if status == 503)
        assert set(submitter.accepted) <= set(stored)  # every accepted job kept
        counts = assert_once_per_attempt(sessions, stored, ledger)
        counts["stored_though_answered_503"] = len(set(stored) - set(submitter.accepted))
        assert lease_row(sessions)[0] == "ctl-a"  # the one managers process went on after the restart
        figures("database_restart", {"seed": SEED, "down_s": DOWN_S, "answers": answers,
                                     "mariadbd_start_s": round(start_s, 2),
                                     "outage_seen_by_clients_s": round(first_ok - killed_at, 2),
                                     "recovery_after_restart_s": round(first_ok - restarted_at, 2),
                                     "last_503_after_restart_s": round(last_503 - restarted_at, 2),
                                     "drain_s": round(ended_s, 1), **counts})
    finally:
        cluster.close()
        engine.dispose()
