"""bench/storage_scan.py stays runnable: a tiny tree, one round, the totals checked against du."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("du") is None, reason="needs GNU du")
def test_storage_scan_bench_runs_and_agrees_with_du(tmp_path):
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "storage_scan.py"), "--files", "2000", "--repeat", "1",
                        "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert set(doc["runs"]) == {"2000", "200"}
    for n, run in doc["runs"].items():
        check = run["check"]
        assert check["bytes_agree"] and check["inodes_agree"], check
        assert check["errors"] == 0
        assert run["tree"]["hard_links"] > 0 and check["hardlinks_seen_again"] == run["tree"]["hard_links"]
        # the tree's files (the manifest is one more) are all counted, hard links once
        assert check["scanner_files"] == int(n) + 1 - run["tree"]["hard_links"]
        scanner = run["tools"]["dlts storage scan --json"]
        assert scanner["median_s"] > 0 and run["tools"]["du -s"]["median_s"] > 0
        assert not Path(run["path"]).exists()  # generated under /tmp and removed without --keep
    assert "du -s" in p.stdout and "dlts storage scan --json" in p.stdout
