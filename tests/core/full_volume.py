"""Real full file systems for the disk-full tests: a small tmpfs mounted for a test (skipped, with
the reason, where this machine does not let the tests mount) and a filler file that takes its room."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """``path`` as a tmpfs of ``size`` (``4m``) while the block runs; unmounted afterwards (lazily
    when something still holds it)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root: these tests fill a real file system")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                          capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.strip() or made.returncode}): these tests fill a "
                    "real file system")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def fill(path: Path, leave_bytes: int = 0) -> Path:
    """A file that takes the volume's room until ``leave_bytes`` are left free (all of it: 0)."""
    filler = path / "filler"
    chunk = b"\0" * 65536
    with open(filler, "wb", buffering=0) as fh:
        while True:
            st = os.statvfs(path)
            room = st.f_bavail * st.f_frsize - leave_bytes
            if room <= 0:
                break
            try:
                fh.write(chunk[:room])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    return filler


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
