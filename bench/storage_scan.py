"""The NFS storage scanner against ``du -s`` on a generated tree (docs/benchmarks.md, docs/storage.md).

    .venv/bin/python bench/storage_scan.py [--files 1000000] [--repeat 3] [--tree DIR] [--keep]
                                           [--no-small] [--out result.json]

1. Generates (seeded, once; ``--tree DIR`` reuses one, its manifest says how it was made) a tree of
   ``--files`` files: 10 top-level directories, leaf directories of ~1000 files two levels below them;
   sizes mostly empty (90 %), some of 1-3000 bytes (9 %), a few of 4-64 KiB (1 %); 1 % of the files
   are hard links (half in their target's directory, half in another top-level directory) and a few
   are symlinks. Without ``--tree`` it lives under /tmp and is removed unless ``--keep``.
2. Compiles the dlts sources' bytecode (as an install does), warms the cache with one ``du -s`` pass.
3. ``--repeat`` rounds, alternately: ``du -s TREE``, ``dlts storage scan TREE --json`` (each a
   subprocess, as an operator runs them, under ``/usr/bin/time -v`` for peak RSS when present),
   and ``gdu``/``ncdu`` when installed. Medians, files/s, the scanner/du ratio, peak RSS (for the
   scanner: its own plus each worker process's), CPU seconds (user + system, workers included) and
   their ratio to du's, and for the scanner a model of its time on an idle machine (its own CPU,
   then its busiest worker's, at least all its CPU spread over the cores) against du's CPU time.
4. Checks the totals agree: ``du -s -B1`` minus the directories' own blocks equals the scanner's
   allocated bytes, and ``du -s --inodes`` equals its files + directories (hard links once in both).
5. Unless ``--no-small``, the same at ``--files / 10`` in a second tree, to show the scanner's peak
   RSS does not grow with the file count (beyond the hard-link set, 1 % of the files here).
Prints a table and a JSON summary; --out writes the JSON too.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PER_DIR = 1000
TOPS = 10
TIME_BIN = "/usr/bin/time"


def generate(tree: Path, files: int, seed: int) -> dict:
    """The tree, made once: a manifest records what it holds so a reused tree is checked, not rebuilt."""
    manifest = tree / ".bench-manifest.json"
    if manifest.exists():
        made = json.loads(manifest.read_text())
        if made.get("files") == files and made.get("seed") == seed:
            return made
        raise SystemExit(f"{tree} holds a tree of {made.get('files')} files (seed {made.get('seed')}); "
                         f"give another --tree or remove it")
    rng = random.Random(seed)
    tree.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    leaves = max(1, -(-files // PER_DIR))
    payload = b"x" * 65536
    links = symlinks = 0
    leaf_dirs: list[Path] = []
    per_top = -(-leaves // TOPS)
    for i in range(leaves):
        top, rest = divmod(i, per_top)
        leaf = tree / f"u{top:02d}" / f"g{rest // 32:03d}" / f"d{rest % 32:02d}"
        leaf.mkdir(parents=True, exist_ok=True)
        leaf_dirs.append(leaf)
    recent: list[Path] = []  # link targets, a few per directory
    for i in range(files):
        leaf = leaf_dirs[i // PER_DIR]
        path = leaf / f"f{i % PER_DIR:04d}"
        r = rng.random()
        if recent and r < 0.01:  # a hard link: to a file in this directory or in another top-level one
            target = recent[-1] if r < 0.005 else recent[rng.randrange(len(recent))]
            os.link(target, path)
            links += 1
        elif r < 0.0102 and recent:
            os.symlink(recent[-1].name if recent[-1].parent == leaf else str(recent[-1]), path)
            symlinks += 1
        else:
            r2 = rng.random()
            size = 0 if r2 < 0.90 else rng.randrange(1, 3000) if r2 < 0.99 else rng.randrange(4096, 65536)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            if size:
                os.write(fd, payload[:size])
            os.close(fd)
            if i % 97 == 0:
                recent.append(path)
                if len(recent) > 200:
                    recent.pop(0)
        if (i + 1) % 100000 == 0:
            print(f"  made {i + 1} files, {(i + 1) / (time.monotonic() - started):.0f}/s", flush=True)
    made = {"files": files, "seed": seed, "dirs": len(leaf_dirs), "hard_links": links, "symlinks": symlinks,
            "seconds": round(time.monotonic() - started, 1)}
    manifest.write_text(json.dumps(made))  # the manifest is a file too: du and the scanner both count it
    return made


def timed(cmd: list[str], env: dict | None = None) -> dict:
    """Runs cmd once: wall seconds, peak RSS (KiB) and stdout."""
    wrap = [TIME_BIN, "-v"] + cmd if os.access(TIME_BIN, os.X_OK) else cmd
    started = time.monotonic()
    p = subprocess.run(wrap, capture_output=True, text=True, env=env)
    seconds = time.monotonic() - started
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}")
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    rss = int(m.group(1)) if m else None
    # CPU seconds (user + system) of the command and the children it waited for (the scan's workers)
    cpu = [re.search(rf"{kind} time \(seconds\): ([\d.]+)", p.stderr) for kind in ("User", "System")]
    cpu_s = sum(float(c.group(1)) for c in cpu) if all(cpu) else None
    return {"seconds": seconds, "rss_kib": rss, "cpu_s": cpu_s, "stdout": p.stdout}


def tools(tree: Path) -> dict[str, list[str]]:
    scanner_env_cmd = [sys.executable, "-m", "dlts", "storage", "scan", str(tree), "--json"]
    out = {"du -s": ["du", "-s", str(tree)], "dlts storage scan --json": scanner_env_cmd}
    if shutil.which("gdu"):
        out["gdu"] = ["gdu", "-n", "-p", "-s", str(tree)]  # non-interactive, summary only
    if shutil.which("ncdu"):
        out["ncdu -0 -x -o /dev/null"] = ["ncdu", "-0", "-x", "-o", "/dev/null", str(tree)]
    return out


def dir_blocks(tree: Path) -> int:
    """The directories' own allocated bytes (du counts them; the scanner counts files only)."""
    p = subprocess.run(["find", str(tree), "-type", "d", "-printf", "%b\n"], capture_output=True, text=True, check=True)
    return sum(int(x) for x in p.stdout.split()) * 512


def measure(tree: Path, repeat: int, env: dict) -> dict:
    subprocess.run(["du", "-s", str(tree)], capture_output=True, check=True)  # warm the cache
    cmds = tools(tree)
    runs: dict[str, list[dict]] = {name: [] for name in cmds}
    scan_doc = None
    for _ in range(repeat):
        for name, cmd in cmds.items():
            r = timed(cmd, env)
            runs[name].append(r)
            if name.startswith("dlts"):
                scan_doc = json.loads(r.pop("stdout"))
                # /usr/bin/time reports the largest single process; the workers are processes of their own
                if r["rss_kib"] is not None:
                    r["rss_kib"] += sum(scan_doc.get("worker_peak_rss_kib") or [])
                workers = scan_doc.get("worker_cpu_s") or []
                if r["cpu_s"] is not None:
                    # a model of the same run with the machine to itself (os.cpu_count() cores): the
                    # scanning process's own CPU (start-up, merge) then the busiest worker, and never
                    # less than all the CPU spread over the cores
                    r["idle_estimate_s"] = max(r["cpu_s"] / (os.cpu_count() or 1),
                                               r["cpu_s"] - sum(workers) + max(workers, default=0.0))
            else:
                r.pop("stdout")
    du_bytes = int(subprocess.run(["du", "-s", "-B1", str(tree)], capture_output=True, text=True,
                                  check=True).stdout.split()[0])
    du_inodes = int(subprocess.run(["du", "-s", "--inodes", str(tree)], capture_output=True, text=True,
                                   check=True).stdout.split()[0])
    dirs_bytes = dir_blocks(tree)
    assert scan_doc is not None and scan_doc["status"] == "complete", scan_doc and scan_doc["status"]
    check = {
        "du_bytes": du_bytes, "dir_bytes": dirs_bytes, "du_file_bytes": du_bytes - dirs_bytes,
        "scanner_allocated_bytes": scan_doc["allocated_bytes"], "du_inodes": du_inodes,
        "scanner_files_plus_dirs": scan_doc["files"] + scan_doc["dirs"], "scanner_files": scan_doc["files"],
        "scanner_dirs": scan_doc["dirs"], "hardlinks_seen_again": scan_doc["hardlinks_seen_again"],
        "errors": scan_doc["errors"],
    }
    check["bytes_agree"] = check["du_file_bytes"] == check["scanner_allocated_bytes"]
    check["inodes_agree"] = check["du_inodes"] == check["scanner_files_plus_dirs"]
    summary = {}
    for name, rs in runs.items():
        secs = statistics.median(r["seconds"] for r in rs)
        rss = [r["rss_kib"] for r in rs if r["rss_kib"] is not None]
        cpu = [r["cpu_s"] for r in rs if r["cpu_s"] is not None]
        summary[name] = {"median_s": round(secs, 3), "runs_s": [round(r["seconds"], 3) for r in rs],
                         "entries_per_s": round(du_inodes / secs), "peak_rss_mib": round(max(rss) / 1024, 1) if rss else None,
                         "median_cpu_s": round(statistics.median(cpu), 3) if cpu else None}
    for name, rs in runs.items():
        idle = [r["idle_estimate_s"] for r in rs if r.get("idle_estimate_s") is not None]
        if idle:
            summary[name]["idle_estimate_s"] = round(statistics.median(idle), 3)
    du_s, du_cpu = summary["du -s"]["median_s"], summary["du -s"]["median_cpu_s"]
    if du_cpu:  # du is one process: on an idle machine with a warm cache it takes about its CPU time
        for s in summary.values():
            if "idle_estimate_s" in s:
                s["idle_estimate_rate_vs_du"] = round(du_cpu / s["idle_estimate_s"], 2)
    for s in summary.values():
        s["rate_vs_du"] = round(du_s / s["median_s"], 2)
        # the CPU work against du's: with the machine to itself and enough cores, a tool of W
        # processes runs in about cpu_s / W; this ratio is what a loaded machine cannot hide
        s["cpu_vs_du"] = round(s["median_cpu_s"] / du_cpu, 2) if du_cpu and s["median_cpu_s"] else None
    return {"tools": summary, "check": check}


def table(files: int, res: dict) -> str:
    lines = [f"{files:,} files ({res['check']['du_inodes']:,} inodes):",
             f"  {'tool':28} {'median s':>9} {'entries/s':>11} {'rate vs du':>10} {'peak RSS MiB':>13} {'CPU s':>7} {'CPU vs du':>9}"]
    for name, s in res["tools"].items():
        rss = f"{s['peak_rss_mib']:.1f}" if s["peak_rss_mib"] is not None else "-"
        cpu = f"{s['median_cpu_s']:.2f}" if s["median_cpu_s"] is not None else "-"
        cpu_ratio = f"{s['cpu_vs_du']:.2f}x" if s["cpu_vs_du"] is not None else "-"
        lines.append(f"  {name:28} {s['median_s']:>9.2f} {s['entries_per_s']:>11,} {s['rate_vs_du']:>9.2f}x {rss:>13}"
                     f" {cpu:>7} {cpu_ratio:>9}")
    for name, s in res["tools"].items():
        if "idle_estimate_rate_vs_du" in s:
            lines.append(f"  {name}: on an idle machine of {os.cpu_count()} cores (a model from CPU times) about "
                         f"{s['idle_estimate_s']:.2f} s against du's {res['tools']['du -s']['median_cpu_s']:.2f} s: "
                         f"{s['idle_estimate_rate_vs_du']:.2f}x")
    c = res["check"]
    lines.append(f"  totals: du -B1 {c['du_bytes']:,} - dirs {c['dir_bytes']:,} = {c['du_file_bytes']:,}; scanner "
                 f"{c['scanner_allocated_bytes']:,} ({'agree' if c['bytes_agree'] else 'DIFFER'}); du --inodes "
                 f"{c['du_inodes']:,}, scanner files+dirs {c['scanner_files_plus_dirs']:,} "
                 f"({'agree' if c['inodes_agree'] else 'DIFFER'}); hard links seen again {c['hardlinks_seen_again']:,}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tree", type=Path, help="the tree's directory (made once, reused); default: a new one under /tmp")
    ap.add_argument("--keep", action="store_true", help="keep the generated tree(s)")
    ap.add_argument("--no-small", action="store_true", help="skip the --files/10 run")
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    # an installed dlts runs from the bytecode pip compiled at install; from a source checkout with
    # PYTHONDONTWRITEBYTECODE set, every start would compile each dlts module again (~0.1 s of CPU)
    compileall.compile_dir(str(ROOT / "src" / "dlts"), quiet=1)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    base = args.tree or Path(tempfile.mkdtemp(prefix="dlts-scanbench-"))
    made_base = args.tree is None
    sizes = [args.files] + ([] if args.no_small or args.files < 20 else [args.files // 10])
    out: dict = {"load_average": os.getloadavg(), "cpus": os.cpu_count(), "runs": {}}
    try:
        for n in sizes:
            tree = base if n == args.files else Path(f"{base}-small")
            made = generate(tree, n, args.seed)
            print(f"tree {tree}: {made}", flush=True)
            res = measure(tree, args.repeat, env)
            res["tree"] = made
            res["path"] = str(tree)
            out["runs"][n] = res
            print(table(n, res), flush=True)
        if len(sizes) == 2:
            big, small = (out["runs"][n]["tools"]["dlts storage scan --json"]["peak_rss_mib"] for n in sizes)
            out["scanner_rss_ratio_n_vs_n10"] = round(big / small, 2) if big and small else None
            print(f"scanner peak RSS at {sizes[0]:,} files {big} MiB, at {sizes[1]:,} files {small} MiB", flush=True)
        out["load_average_after"] = os.getloadavg()
        print(f"load average before {out['load_average']}, after {out['load_average_after']}; {out['cpus']} CPUs")
    finally:
        if not args.keep:
            if made_base:
                shutil.rmtree(base, ignore_errors=True)
            shutil.rmtree(f"{base}-small", ignore_errors=True)
    text = json.dumps(out, indent=2, default=str)
    if args.out:
        args.out.write_text(text)
    print(text)
    ok = all(r["check"]["bytes_agree"] and r["check"]["inodes_agree"] for r in out["runs"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
