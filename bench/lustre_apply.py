"""Benchmark dlts_lustre: parser speed, per-command runner overhead, and apply cost against the fake tools.

Run:  .venv/bin/python bench/lustre_apply.py [--vcs 20] [--repeat 5]

Measures (medians over --repeat runs):
1. parse `lfs quota -v` and `lfs df` for a 1,024-OST filesystem (pure parsers, no processes);
2. one `lfs --version` through the Runner (sh + kill Timer) versus sh's own `_timeout`, and versus
   a bare subprocess.run: the floor set by process start-up;
3. `dlts-lustre apply` of a policy with --vcs VCs on the fake from tests/lustre/fakebin: the first
   (converging) run, then the second run, which does nothing: wall time and number of lfs/lctl calls.
Lustre cannot be installed here, so (2) and (3) time the fake tools: a Python process per call.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sh

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "lustre"))

from conftest import base_state

from dlts_lustre.client import LustreClient
from dlts_lustre.parsers import parse_df_single, parse_quota
from dlts_lustre.plan import apply_plan, build_plan
from dlts_lustre.policy import policy_from_vcs
from dlts_lustre.runner import Runner


def median_s(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def big_outputs(n_osts: int) -> tuple[str, str]:
    quota = ["Disk quotas for usr bob (uid 1001):",
             "     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace",
             "/mnt/lustre-scratch01", "                6291460* 6291456 8388608 6d23h59m58s    1024       0       0       -"]
    df = ["UUID                   1K-blocks        Used   Available Use% Mounted on"]
    for i in range(n_osts):
        quota += [f"fs-OST{i:04x}_UUID", "                 524288       -  1048576       -       -       -       -       -"]
        df.append(f"fs-OST{i:04x}_UUID    3771392000    17024000  3528448000   1% /mnt/fs[OST:{i}]")
    df += ["", "filesystem_summary:   15085568000  3787265024 11046463976  26% /mnt/fs"]
    return "\n".join(quota) + "\n", "\n".join(df) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vcs", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    results: dict[str, object] = {}

    quota_text, df_text = big_outputs(1024)
    results["parse_quota_v_1024_osts_ms"] = 1000 * median_s(lambda: parse_quota(quota_text), args.repeat * 4)
    results["parse_df_1024_osts_ms"] = 1000 * median_s(lambda: parse_df_single(df_text), args.repeat * 4)

    with tempfile.TemporaryDirectory() as tmp:
        state_dir = Path(tmp) / "fake"
        state_dir.mkdir()
        mount = Path(tmp) / "mnt" / "dltsfs-scratch"
        mount.mkdir(parents=True)
        state = base_state(mount)
        state["osts"] = [{**state["osts"][0], "index": i} for i in range(2 * args.vcs)]
        (state_dir / "state.json").write_text(json.dumps(state))
        os.environ.update(DLTS_FAKE_LUSTRE_DIR=str(state_dir), DLTS_FAKE_LUSTRE_PYTHON=sys.executable,
                          PATH=f"{ROOT / 'tests' / 'lustre' / 'fakebin'}{os.pathsep}{os.environ['PATH']}")
        lfs = shutil.which("lfs")
        runner = Runner()
        calls = args.repeat * 4
        results["runner_call_ms"] = 1000 * median_s(lambda: runner.run(("lfs", "--version")), calls)
        results["sh_builtin_timeout_call_ms"] = 1000 * median_s(
            lambda: sh.Command(lfs)("--version", _timeout=60, _in="", _tty_out=False), calls)
        results["subprocess_call_ms"] = 1000 * median_s(
            lambda: subprocess.run([lfs, "--version"], capture_output=True, check=True), calls)

        vcs = [{"name": f"vc{i}", "pool": f"vc_{i}", "osts": [2 * i, 2 * i + 1], "mdt": i % 2 if i % 3 else "spread",
                "project_id": 1000 + i, "project_quota": {"block_soft": "10T", "block_hard": "12T"}}
               for i in range(args.vcs)]
        defaults = {"filesystem": {"name": "dltsfs", "mount": str(mount)}, "vc_root": "vcs",
                    "user_quota": {"default": {"block_soft": "500G", "block_hard": "600G"},
                                   "grace": {"block": "1w", "inode": "1w"}}}
        policy = policy_from_vcs(vcs, defaults)

        def apply_once() -> tuple[float, int, int]:
            client = LustreClient(Runner())
            start = time.perf_counter()
            result = apply_plan(build_plan(policy, client), client)
            return time.perf_counter() - start, client.runner.call_count, len(result.executed)

        first_s, first_calls, first_actions = apply_once()
        seconds = []
        for _ in range(args.repeat):
            s, second_calls, second_actions = apply_once()
            seconds.append(s)
        results.update(vcs=args.vcs, first_apply_s=first_s, first_apply_calls=first_calls,
                       first_apply_actions=first_actions, noop_apply_s=statistics.median(seconds),
                       noop_apply_calls=second_calls, noop_apply_actions=second_actions)
    results["sh_timeout_over_runner_ratio"] = results["sh_builtin_timeout_call_ms"] / results["runner_call_ms"]
    results["runner_over_subprocess_ratio"] = results["runner_call_ms"] / results["subprocess_call_ms"]
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in results.items()}, indent=2))


if __name__ == "__main__":
    main()
