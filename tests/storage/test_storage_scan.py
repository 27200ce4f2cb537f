"""The scanner on real files in temporary directories: hard links, symlinks, unreadable directories,
mount points, a hung directory (at the list_dir seam), bounded parallelism, and `dlts storage scan --json`."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
import walk_hooks
from click.testing import CliRunner

from dlts.storage import scan as scan_module
from dlts.storage.scan import scan_path, scan_root
from dlts.storage.scan_result import COMPLETE, HUNG, TIMEOUT, still_hung
from dlts.storage.settings import StorageRoot, StorageSettings


def write(path: Path, size: int, uid: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    if uid is not None:
        os.lchown(path, uid, -1)
    return path


def allocated(path: Path) -> int:
    return os.lstat(path).st_blocks * 512


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "nfs"
    write(root / "alice" / "data" / "a.bin", 200_000, uid=2001)
    write(root / "alice" / "b.bin", 10_000, uid=2001)
    write(root / "bob" / "c.bin", 50_000, uid=2002)
    write(root / "loose.txt", 3, uid=2002)
    return root


def test_usage_per_user_vc_and_directory_with_allocated_and_apparent_bytes(tree):
    root = StorageRoot(path=tree, uid_owners={2002: "bob"}, vc_dirs={"alice": "vision"})
    result = scan_root(root, StorageSettings(), uid_names={2001: "alice"})
    assert result.status == COMPLETE and result.errors == 0
    doc = result.to_dict()
    assert doc["files"] == 4 and doc["dirs"] == 4
    assert doc["apparent_bytes"] == 260_003
    assert doc["allocated_bytes"] == sum(allocated(p) for p in tree.rglob("*") if p.is_file())
    users = {(u["vc"], u["user"]): u for u in doc["by_user"]}
    assert set(users) == {("vision", "alice"), (None, "bob")}
    assert users[("vision", "alice")]["apparent_bytes"] == 210_000 and users[(None, "bob")]["files"] == 2
    dirs = {d["directory"]: d for d in doc["by_directory"]}
    assert dirs["alice"]["files"] == 2 and dirs["alice"]["vc"] == "vision" and dirs["."]["apparent_bytes"] == 3
    assert doc["top_dirs"][0]["path"] == str(tree / "alice") and doc["top_dirs"][0]["apparent_bytes"] == 210_000
    assert str(tree / "alice" / "data") in [d["path"] for d in doc["top_dirs"]]
    assert len(doc["oldest_files"]) == 4
    assert doc["filesystem"]["total_bytes"] > 0 and 0 < doc["filesystem"]["used_percent"] <= 100


def test_owner_by_top_level_directory_and_dir_owners_mapping(tree):
    write(tree / "shared" / "x.bin", 1000, uid=2001)
    root = StorageRoot(path=tree, owner_by="directory", dir_owners={"shared": "carol"})
    users = {u["user"]: u for u in scan_root(root, StorageSettings()).to_dict()["by_user"]}
    assert users["alice"]["files"] == 2 and users["bob"]["files"] == 1 and users["carol"]["files"] == 1
    assert users["uid:2002"]["files"] == 1  # loose.txt is in no top-level directory: by its uid


def test_hard_links_count_once_and_old_data_is_the_oldest_mtime(tree):
    first = tree / "alice" / "data" / "a.bin"
    os.link(first, tree / "bob" / "a-link.bin")
    os.link(first, tree / "a-link-too.bin")
    os.utime(tree / "bob" / "c.bin", (1_000_000_000, 1_000_000_000))
    doc = scan_root(StorageRoot(path=tree), StorageSettings()).to_dict()
    assert doc["files"] == 4 and doc["apparent_bytes"] == 260_003 and doc["hardlinks_seen_again"] == 2
    assert doc["oldest_files"][0] == {"path": str(tree / "bob" / "c.bin"), "mtime": 1_000_000_000.0}
    assert doc["oldest_mtime"] == 1_000_000_000.0


def test_symlinks_are_never_followed_out_of_the_root(tree, tmp_path):
    outside = tmp_path / "outside"
    write(outside / "huge.bin", 1_000_000)
    os.symlink(outside, tree / "bob" / "escape")
    os.symlink(outside / "huge.bin", tree / "alice" / "huge-link")
    os.symlink(tree, tree / "alice" / "loop")
    doc = scan_root(StorageRoot(path=tree), StorageSettings()).to_dict()
    assert doc["files"] == 7  # the three links count as the small files they are
    assert doc["apparent_bytes"] == 260_003 + len(str(outside)) + len(str(outside / "huge.bin")) + len(str(tree))
    assert doc["dirs"] == 4


def test_unreadable_directories_are_skipped_and_counted(tmp_path):
    # root reads everything: the scan runs in a forked child that dropped to nobody
    base = Path(tempfile.mkdtemp(prefix="dlts-scan-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        write(base / "open" / "a.bin", 1000)
        write(base / "closed" / "secret.bin", 5000)
        for p in base.rglob("*"):
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        os.chmod(base / "closed", 0o000)
        if os.geteuid() != 0:
            pytest.skip("needs root to drop to another uid")
        read, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: become nobody, scan, send the document, exit
            try:
                os.close(read)
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
                doc = scan_root(StorageRoot(path=base), StorageSettings(threads_per_root=2)).to_dict()
                os.write(write_fd, json.dumps(doc).encode())
            finally:
                os._exit(0)
        os.close(write_fd)
        data = b""
        while chunk := os.read(read, 65536):
            data += chunk
        os.waitpid(pid, 0)
        doc = json.loads(data)
        assert doc["status"] == COMPLETE and doc["errors"] == 1
        assert doc["unreadable"] == [f"{base / 'closed'}: Permission denied"]
        assert doc["files"] == 1 and doc["apparent_bytes"] == 1000
    finally:
        os.chmod(base / "closed", 0o755)
        subprocess.run(["rm", "-rf", str(base)], check=True)


def test_another_file_system_below_the_root_is_not_entered(tree):
    mount_point = tree / "bob" / "mnt"
    mount_point.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "dlts-test", str(mount_point)],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)")
    try:
        write(mount_point / "other-fs.bin", 100_000)
        doc = scan_root(StorageRoot(path=tree), StorageSettings()).to_dict()
        assert doc["other_filesystems"] == 1 and doc["other_filesystem_paths"] == [str(mount_point)]
        assert doc["files"] == 4 and doc["apparent_bytes"] == 260_003
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def test_a_hung_directory_times_out_reports_the_mount_and_blocks_nobody(tree):
    release = threading.Event()
    hung = str(tree / "bob")

    def list_dir(path):
        if path == hung:
            release.wait(30)  # a stat on a dead NFS server: stuck in the kernel
        return scan_module._list_dir(path)

    settings = StorageSettings(dir_timeout_s=0.3, threads_per_root=2)
    started = time.monotonic()
    result = scan_root(StorageRoot(path=tree), settings, list_dir=list_dir)
    assert time.monotonic() - started < 3
    assert result.status == HUNG and hung in result.message and f"mount {tree} hung" in result.message
    # while the worker is still stuck, the next scan says so at once and starts no new threads
    before = threading.active_count()
    again = scan_root(StorageRoot(path=tree), settings, list_dir=list_dir)
    assert again.status == HUNG and "still stuck" in again.message and threading.active_count() == before
    release.set()
    deadline = time.monotonic() + 5
    while still_hung(str(tree)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scan_root(StorageRoot(path=tree), settings, list_dir=list_dir).status == COMPLETE


def test_a_hung_statvfs_of_the_root_is_a_hung_mount_too(tree):
    release = threading.Event()

    def statvfs(path):
        release.wait(30)
        return scan_module._statvfs(path)

    try:
        result = scan_root(StorageRoot(path=tree), StorageSettings(dir_timeout_s=0.2), statvfs=statvfs)
        assert result.status == HUNG and result.fs_total_bytes is None
    finally:
        release.set()


def test_the_whole_scan_stops_at_scan_timeout(tree):
    clock = iter(range(0, 10_000, 5)).__next__  # every call: 5 s later
    # the worker processes' directories answer slowly, so the scan is still walking when the clock passes
    result = scan_root(StorageRoot(path=tree), StorageSettings(scan_timeout_s=12, dir_timeout_s=3600),
                       clock=lambda: float(clock()), before_dir=walk_hooks.slow)
    assert result.status == TIMEOUT and "scan_timeout_s" in result.message
    threaded = iter(range(0, 10_000, 5)).__next__
    result = scan_root(StorageRoot(path=tree), StorageSettings(scan_timeout_s=12, dir_timeout_s=3600,
                                                               processes_per_root=1), clock=lambda: float(threaded()))
    assert result.status == TIMEOUT and "scan_timeout_s" in result.message


def test_parallelism_is_bounded_by_threads_per_root(tmp_path):
    root = tmp_path / "wide"
    for i in range(24):
        write(root / f"d{i}" / "f", 10)
    lock, running, peak = threading.Lock(), [0], [0]

    def list_dir(path):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.02)
        try:
            return scan_module._list_dir(path)
        finally:
            with lock:
                running[0] -= 1

    result = scan_root(StorageRoot(path=root), StorageSettings(threads_per_root=3), list_dir=list_dir)
    assert result.status == COMPLETE and result.total.files == 24 and peak[0] == 3


def test_a_file_removed_while_scanning_is_not_an_error(tree):
    def list_dir(path):
        if path.endswith("/bob"):
            raise FileNotFoundError(2, "No such file or directory")
        return scan_module._list_dir(path)

    result = scan_root(StorageRoot(path=tree), StorageSettings(), list_dir=list_dir)
    assert result.status == COMPLETE and result.errors == 0 and result.vanished == 1


def test_dlts_storage_scan_json_prints_the_same_aggregation(tree, tmp_path, monkeypatch):
    from dlts.cli import main

    monkeypatch.setenv("DLTS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DLTS_CONFIG", raising=False)
    out = CliRunner().invoke(main, ["storage", "scan", "--json", str(tree)])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    expected = scan_path(str(tree)).to_dict()
    for key in ("files", "dirs", "allocated_bytes", "apparent_bytes", "by_user", "by_directory", "top_dirs", "status"):
        assert doc[key] == expected[key], key
    human = CliRunner().invoke(main, ["storage", "scan", str(tree)])
    assert human.exit_code == 0 and f"{tree}: complete, 4 files in 4 dirs" in human.output
    missing = CliRunner().invoke(main, ["storage", "scan", str(tmp_path / "nope")])
    assert missing.exit_code == 1 and "failed" in missing.output


def test_sparse_files_count_their_blocks_and_names_that_are_not_utf8_are_scanned(tree):
    sparse = tree / "bob" / "sparse.img"
    with open(sparse, "wb") as f:  # 64 MiB apparent, one 4 KiB block written at the end
        f.truncate(64 << 20)
        f.seek((64 << 20) - 4096)
        f.write(b"x" * 4096)
    assert allocated(sparse) < 1 << 20  # the file system really keeps it sparse
    odd = os.path.join(os.fsencode(tree), b"caf\xe9")  # Latin-1, not UTF-8: a name no UTF-8 decoder reads
    os.mkdir(odd)
    with open(os.path.join(odd, b"r\xe9sum\xe9.bin"), "wb") as f:
        f.write(b"y" * 7000)
    doc = scan_root(StorageRoot(path=tree), StorageSettings()).to_dict()
    assert doc["status"] == COMPLETE and doc["errors"] == 0
    assert doc["files"] == 6 and doc["dirs"] == 5
    assert doc["apparent_bytes"] == 260_003 + (64 << 20) + 7000
    files = [p for p in tree.rglob("*") if p.is_file()]
    assert doc["allocated_bytes"] == sum(allocated(p) for p in files) < 260_003 + (2 << 20)
    dirs = {d["directory"]: d for d in doc["by_directory"]}
    assert dirs["caf\\xe9"]["apparent_bytes"] == 7000  # the bytes as `ls -b` writes them
    json.dumps(doc)  # the document (names included) is printable as --json prints it
