"""Run a benchmark against MariaDB configured the way ansible/roles/mariadb deploys it.

The role sets ``innodb_buffer_pool_size`` to a quarter of the machine's memory and the
``READ-COMMITTED`` isolation level (templates/60-dlts.cnf.j2); the server on a development machine
runs Debian's defaults (128 MiB, REPEATABLE-READ). Both settings are dynamic: ``deployed_settings``
sets them for the benchmark, warms the buffer pool with the benchmark's tables (a production
database is warm) and puts the previous values back afterwards.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import sqlalchemy as sa

TABLES = ("jobs", "job_attempts", "job_events")


def role_buffer_pool_bytes() -> int:
    """The mariadb role's default: a quarter of the memory, at least 128 MiB."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(total // 4, 128 * 1024 * 1024)


def _wait_for_resize(conn, deadline_s: float = 120) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        status = conn.execute(sa.text("SHOW STATUS LIKE 'Innodb_buffer_pool_resize_status'")).first()
        if status is None or not status[1] or "complete" in status[1].lower() or "finished" in status[1].lower():
            return
        time.sleep(0.5)


@contextlib.contextmanager
def deployed_settings(url: str, *, warm: bool = True) -> Iterator[dict]:
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        before = {
            "innodb_buffer_pool_size": int(conn.scalar(sa.text("SELECT @@GLOBAL.innodb_buffer_pool_size"))),
            "transaction_isolation": conn.scalar(sa.text("SELECT @@GLOBAL.tx_isolation")),
        }
        wanted = {"innodb_buffer_pool_size": role_buffer_pool_bytes(), "transaction_isolation": "READ-COMMITTED"}
        conn.execute(sa.text(f"SET GLOBAL innodb_buffer_pool_size = {int(wanted['innodb_buffer_pool_size'])}"))
        _wait_for_resize(conn)
        conn.execute(sa.text("SET GLOBAL TRANSACTION ISOLATION LEVEL READ COMMITTED"))
        applied = {
            "innodb_buffer_pool_size": int(conn.scalar(sa.text("SELECT @@GLOBAL.innodb_buffer_pool_size"))),
            "transaction_isolation": conn.scalar(sa.text("SELECT @@GLOBAL.tx_isolation")),
        }
        if warm:
            for table in TABLES:  # every page of the clustered index and the secondary indexes
                conn.execute(sa.text(f"SELECT COUNT(*) FROM {table} FORCE INDEX (PRIMARY)"))
                for (index,) in conn.execute(sa.text(
                        "SELECT DISTINCT index_name FROM information_schema.statistics "
                        "WHERE table_schema = DATABASE() AND table_name = :t AND index_name <> 'PRIMARY'"), {"t": table}):
                    conn.execute(sa.text(f"SELECT COUNT(*) FROM {table} FORCE INDEX (`{index}`)"))
    try:
        yield {"before": before, "applied": applied}
    finally:
        with engine.connect() as conn:
            conn.execute(sa.text(f"SET GLOBAL innodb_buffer_pool_size = {before['innodb_buffer_pool_size']}"))
            _wait_for_resize(conn)
            conn.execute(sa.text(f"SET GLOBAL TRANSACTION ISOLATION LEVEL {before['transaction_isolation'].replace('-', ' ')}"))
        engine.dispose()


def apply_for_this_run(url: str, debian_defaults: bool) -> dict:
    """For a benchmark's main(): the role's settings until the process exits (restored at exit)."""
    if debian_defaults:
        return {"profile": "debian defaults"}
    import atexit

    stack = contextlib.ExitStack()
    info = stack.enter_context(deployed_settings(url))
    atexit.register(stack.close)
    return {"profile": "mariadb role (buffer pool = RAM/4, READ-COMMITTED)", **info}
