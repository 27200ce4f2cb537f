"""The scan by worker processes (dlts.storage.parallel / dlts.storage.walk) on real trees: hard links
whose names fall in different workers' parts count once, the same totals as the threaded walk, the
tree split across the workers, a hung directory in a worker, an unreadable one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import walk_hooks

from dlts.storage.scan import scan_root
from dlts.storage.scan_result import COMPLETE, HUNG, still_hung
from dlts.storage.settings import StorageRoot, StorageSettings


@pytest.fixture(params=["fork", "spawn"])
def start(request):
    """How the workers start: forked from a process of one thread (`dlts storage scan`), spawned from
    one with other threads (`dlts managers`): here a thread that lives through the test."""
    if request.param == "fork":
        if len(os.listdir("/proc/self/task")) > 1:  # an earlier test's stuck thread still lives
            pytest.skip("this process runs other threads: its workers would be spawned")
        yield "fork"
        return
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="test-other-thread", daemon=True)
    thread.start()
    try:
        yield "spawn"
    finally:
        stop.set()
        thread.join()


def make_tree(base: Path) -> Path:
    """8 top-level directories of 3 subdirectories of 5 files of distinct sizes, and hard links to a
    few of them from other top-level directories (and from the same directory)."""
    root = base / "nfs"
    size = 1
    for t in range(8):
        for s in range(3):
            d = root / f"t{t}" / f"s{s}"
            d.mkdir(parents=True)
            for f in range(5):
                (d / f"f{f}").write_bytes(b"x" * (size * 997))
                size += 1
    (root / "loose.bin").write_bytes(b"y" * 12345)
    (root / "plain.txt").write_bytes(b"p" * 10)
    os.link(root / "t0/s0/f0", root / "t7/s2/link-a")  # across top-level directories
    os.link(root / "t0/s0/f0", root / "t4/s1/link-b")
    os.link(root / "t0/s0/f0", root / "t0/s0/link-c")  # in the same directory
    os.link(root / "t3/s1/f4", root / "t6/s0/link-d")
    os.link(root / "t3/s1/f4", root / "link-e")  # at the root
    os.link(root / "loose.bin", root / "t5/s2/link-f")
    os.symlink("../s0/f1", root / "t2/s1/sym")
    return root


def expected_totals(root: Path) -> dict:
    """Counted independently: every non-directory once per (st_dev, st_ino)."""
    seen: set[tuple[int, int]] = set()
    names = allocated = apparent = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            st = os.lstat(os.path.join(dirpath, name))
            names += 1
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            allocated += st.st_blocks * 512
            apparent += st.st_size
    return {"files": len(seen), "allocated_bytes": allocated, "apparent_bytes": apparent,
            "hardlinks_seen_again": names - len(seen)}


@pytest.mark.parametrize("processes", [2, 3, 5])
def test_hard_links_across_workers_count_once_with_exact_totals(tmp_path, processes, start):
    root = make_tree(tmp_path)
    want = expected_totals(root)
    assert want["hardlinks_seen_again"] == 6 and want["files"] == 8 * 3 * 5 + 3  # + loose.bin, plain.txt and the symlink
    result = scan_root(StorageRoot(path=root), StorageSettings(processes_per_root=processes))
    doc = result.to_dict()
    assert result.status == COMPLETE and result.errors == 0, result.message
    assert doc["worker_start"] == start and len(doc["worker_peak_rss_kib"]) == processes
    assert all(0 < kib < 200 * 1024 for kib in doc["worker_peak_rss_kib"])
    assert {k: doc[k] for k in want} == want
    assert doc["dirs"] == 1 + 8 + 8 * 3
    # every view adds up to the same totals
    for view in ("by_user", "by_directory", "by_vc"):
        assert sum(row["files"] for row in doc[view]) == want["files"], view
        assert sum(row["allocated_bytes"] for row in doc[view]) == want["allocated_bytes"], view
        assert sum(row["apparent_bytes"] for row in doc[view]) == want["apparent_bytes"], view
    dirs = {row["directory"] for row in doc["by_directory"]}
    assert dirs == {f"t{t}" for t in range(8)} | {"."}


def test_processes_and_threads_give_the_same_aggregation(tmp_path):
    root = make_tree(tmp_path)
    for name in ("t1", "t2"):  # no hard links here: their place is the same in both walks
        os.utime(root / name / "s1" / "f3", (1_000_000_000 + int(name[1]), 1_000_000_000 + int(name[1])))
    settings = {"top_dirs": 50, "oldest_files": 3}
    by_processes = scan_root(StorageRoot(path=root), StorageSettings(processes_per_root=2, **settings)).to_dict()
    by_threads = scan_root(StorageRoot(path=root), StorageSettings(processes_per_root=1, **settings)).to_dict()
    for key in ("files", "dirs", "allocated_bytes", "apparent_bytes", "hardlinks_seen_again", "oldest_mtime", "errors",
                "by_user", "by_vc"):
        assert by_processes[key] == by_threads[key], key
    # the directories that hold no hard-linked name: the same sums whichever walk counted the link
    untouched = {f"t{t}" for t in (1, 2)}
    rows = lambda doc: {r["directory"]: r for r in doc["by_directory"] if r["directory"] in untouched}
    assert rows(by_processes) == rows(by_threads)
    assert [f["path"] for f in by_processes["oldest_files"][:2]] == [str(root / "t1/s1/f3"), str(root / "t2/s1/f3")]
    # the third is a hard-linked file: either of its names, whichever the walk met first
    assert [f["mtime"] for f in by_processes["oldest_files"]] == [f["mtime"] for f in by_threads["oldest_files"]]
    assert {d["path"] for d in by_processes["top_dirs"]} == {d["path"] for d in by_threads["top_dirs"]}


def test_the_tree_is_split_across_the_worker_processes(tmp_path, monkeypatch, start):
    root = make_tree(tmp_path)
    log = tmp_path / "log"
    log.mkdir()
    monkeypatch.setenv("DLTS_TEST_WALK_LOG", str(log))
    result = scan_root(StorageRoot(path=root), StorageSettings(processes_per_root=3), before_dir=walk_hooks.log_worker_slowly)
    assert result.status == COMPLETE and result.total.files == 8 * 3 * 5 + 3
    assert result.worker_start == start
    listed = {pid.name: pid.read_text().split() for pid in log.iterdir()}
    assert len(listed) >= 2, listed  # more than one worker listed directories
    everything = sorted(p for paths in listed.values() for p in paths)
    assert len(everything) == len(set(everything)) == 1 + 8 + 8 * 3  # each directory listed once, by one worker
    assert os.getpid() not in map(int, listed)


def test_a_hung_directory_in_a_worker_process_is_reported_and_the_worker_killed(tmp_path, start):
    root = make_tree(tmp_path)
    (root / "t3" / "hang").mkdir()
    settings = StorageSettings(processes_per_root=2, dir_timeout_s=0.5)
    started = time.monotonic()
    result = scan_root(StorageRoot(path=root), settings, before_dir=walk_hooks.hang_in_hang)
    assert time.monotonic() - started < 10
    assert result.status == HUNG, result.message
    assert f"{root / 't3' / 'hang'}: no answer within dir_timeout_s" in result.message
    assert f"mount {root} hung" in result.message
    deadline = time.monotonic() + 5  # a sleeping worker can be killed: nothing is left behind
    while still_hung(str(root)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not still_hung(str(root))
    assert scan_root(StorageRoot(path=root), StorageSettings(processes_per_root=2)).status == COMPLETE


def test_a_directory_a_worker_cannot_read_is_skipped_and_counted(tmp_path, start):
    root = make_tree(tmp_path)
    (root / "t1" / "closed").mkdir()
    (root / "t1" / "closed" / "secret.bin").write_bytes(b"z" * 5000)
    result = scan_root(StorageRoot(path=root), StorageSettings(processes_per_root=2),
                       before_dir=walk_hooks.refuse_closed)
    doc = result.to_dict()
    assert result.status == COMPLETE and doc["errors"] == 1 and doc["worker_start"] == start
    assert doc["unreadable"] == [f"{root / 't1' / 'closed'}: Permission denied"]
    assert doc["files"] == 8 * 3 * 5 + 3  # secret.bin not counted


def test_processes_per_root_zero_means_one_per_cpu_between_two_and_eight():
    assert 2 <= StorageSettings().scan_processes() <= 8
    assert StorageSettings(processes_per_root=3).scan_processes() == 3
    assert StorageSettings(processes_per_root=1).scan_processes() == 1


@pytest.mark.parametrize("start", ["spawn"], indirect=True)
def test_workers_do_not_run_the_script_that_started_the_scan_again(tmp_path, monkeypatch, start):
    """`dlts managers` runs from the `dlts` console script, with threads: a spawned worker would run
    the script again as its __main__ (all of dlts.cli) unless the scan keeps it out."""
    marker = tmp_path / "script-ran"
    script = tmp_path / "console_script.py"
    script.write_text(f"open({str(marker)!r}, 'a').write('ran\\n')\n")
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", main)
    result = scan_root(StorageRoot(path=make_tree(tmp_path)), StorageSettings(processes_per_root=2))
    assert result.status == COMPLETE and len(result.worker_cpu_s) == 2 and result.worker_start == "spawn"
    assert not marker.exists()
    assert sys.modules["__main__"] is main  # put back


def test_workers_are_forked_only_from_a_process_of_one_thread(tmp_path):
    """A fork while another thread holds a lock would leave the worker that lock, held forever: with
    another thread alive the workers are spawned, once it has ended they are forked."""
    root = make_tree(tmp_path)
    settings = StorageSettings(processes_per_root=2)
    if len(os.listdir("/proc/self/task")) > 1:
        pytest.skip("an earlier test's stuck thread still lives in this process")
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        assert scan_root(StorageRoot(path=root), settings).worker_start == "spawn"
    finally:
        stop.set()
        thread.join()
    deadline = time.monotonic() + 5  # the ended thread may take a moment to leave /proc/self/task
    while len(os.listdir("/proc/self/task")) > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    forked = scan_root(StorageRoot(path=root), settings)
    assert forked.status == COMPLETE and forked.worker_start == "fork"
    assert forked.to_dict()["files"] == expected_totals(root)["files"]


def _slow_scan_in_a_subprocess(tmp_path, **popen):
    """A scan by two workers, each taking 0.2 s a directory, in a process of its own; returned once
    both workers are walking, with the folder where each records its directories. The process
    prints how its workers started, or "interrupted" on Ctrl-C."""
    root = make_tree(tmp_path)
    log = tmp_path / "log"
    log.mkdir()
    script = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import walk_hooks\n"
              "from dlts.storage.scan import scan_root\n"
              "from dlts.storage.settings import StorageRoot, StorageSettings\n"
              "try:\n"
              f"    r = scan_root(StorageRoot(path={str(root)!r}), StorageSettings(processes_per_root=2),"
              " before_dir=walk_hooks.log_worker_very_slowly)\n"
              "    print(r.worker_start)\n"
              "except KeyboardInterrupt:\n"
              "    print('interrupted')\n")
    scanner = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "DLTS_TEST_WALK_LOG": str(log)},
                               **popen)
    deadline = time.monotonic() + 30
    while len(list(log.iterdir())) < 2 and time.monotonic() < deadline:  # both workers are walking
        time.sleep(0.05)
    return scanner, log


def test_forked_workers_end_when_the_scanning_process_dies(tmp_path):
    """A forked worker inherits the scanning process's ends of the pipes; it closes them, so that when
    that process is killed its next message fails and it ends, instead of waiting for ever."""
    scanner, log = _slow_scan_in_a_subprocess(tmp_path, stderr=subprocess.PIPE)
    workers = [int(p.name) for p in log.iterdir()]
    assert len(workers) == 2
    scanner.send_signal(signal.SIGKILL)
    scanner.wait()

    def alive(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 20  # what was handed to a worker takes it ~0.2 s a directory
    while any(map(alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in workers if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left
    assert b"Traceback" not in scanner.stderr.read()


def test_ctrl_c_stops_a_scan_without_a_traceback_from_any_worker(tmp_path):
    """Ctrl-C on a terminal signals the whole process group: the scanning process stops its workers
    and exits; the workers print nothing (each used to print its KeyboardInterrupt traceback)."""
    scanner, log = _slow_scan_in_a_subprocess(tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              start_new_session=True)
    assert len(list(log.iterdir())) == 2
    os.killpg(scanner.pid, signal.SIGINT)
    out, err = scanner.communicate(timeout=60)
    assert out.strip() == b"interrupted"
    assert b"Traceback" not in err and b"KeyboardInterrupt" not in err, err.decode()
