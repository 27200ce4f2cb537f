"""Expiry on real files: mtime vs ctime (and atime), keep lists and .dlts-keep, symlinks, mount points,
directories, the rate limit, the re-check before each unlink, and the dry run listing exactly what goes.

A file's ctime cannot be set back (os.utime itself changes it), so the tests move the expiry's "now"
forward instead: a file made now is N days old at now + N days."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from dlts.storage.expire import expire_root, matching_paths
from dlts.storage.settings import StorageRoot

DAY = 86400.0


def write(path: Path, text: str = "x" * 100) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def old(path: Path, days: float, now: float) -> Path:
    os.utime(path, (now - days * DAY, now - days * DAY), follow_symlinks=False)
    return path


@pytest.fixture
def scratch(tmp_path) -> Path:
    root = tmp_path / "nfs"
    write(root / "scratch" / "alice" / "run1" / "ckpt.bin")
    write(root / "scratch" / "alice" / "run1" / "deep" / "er" / "log.txt")
    write(root / "scratch" / "bob" / "notes.txt")
    write(root / "home" / "alice" / "thesis.tex")  # not under expire_paths
    for user, uid in (("alice", 2001), ("bob", 2002)):
        for path in [root / "scratch" / user, *(root / "scratch" / user).rglob("*")]:
            os.lchown(path, uid, -1)
    return root


def root_for(path: Path, **kw) -> StorageRoot:
    return StorageRoot(path=path, uid_owners={2001: "alice", 2002: "bob"}, expire_after_days=30, warn_days=5,
                       expire_paths=("scratch/*",), **kw)


def test_files_older_than_the_limit_go_deepest_first_and_empty_directories_with_them(scratch):
    gone = []
    report = expire_root(root_for(scratch), now=time.time() + 31 * DAY, on_item=lambda p, k, b, o: gone.append((p, k)))
    rel = [(os.path.relpath(p, scratch), k) for p, k in gone]
    assert rel == [("scratch/alice/run1/deep/er/log.txt", "file"), ("scratch/alice/run1/deep/er", "dir"),
                   ("scratch/alice/run1/deep", "dir"), ("scratch/alice/run1/ckpt.bin", "file"),
                   ("scratch/alice/run1", "dir"), ("scratch/alice", "dir"), ("scratch/bob/notes.txt", "file"),
                   ("scratch/bob", "dir")]
    assert not (scratch / "scratch" / "alice").exists() and (scratch / "scratch").is_dir()
    assert (scratch / "home" / "alice" / "thesis.tex").exists()
    assert report.deleted["alice"].files == 2 and report.deleted["alice"].dirs == 4 and report.deleted["bob"].files == 1
    assert report.deleted["bob"].dirs == 1 and report.deleted["alice"].bytes > 0


def test_the_newest_of_mtime_and_ctime_counts_and_atime_only_when_asked(scratch):
    now = time.time()
    ckpt = old(scratch / "scratch" / "alice" / "run1" / "ckpt.bin", 300, now)  # mtime old, ctime now
    # 10 days on: ckpt's mtime is 310 days old but its ctime 10: it stays
    report = expire_root(root_for(scratch), now=now + 10 * DAY)
    assert ckpt.exists() and not report.deleted
    os.chmod(ckpt, 0o600)  # ctime is now again
    assert expire_root(root_for(scratch), now=now + 29 * DAY).deleted == {}
    # atime: a file read recently stays only with use_atime
    log = scratch / "scratch" / "alice" / "run1" / "deep" / "er" / "log.txt"
    os.utime(log, (now + 40 * DAY, now - 10 * DAY))
    kept = expire_root(root_for(scratch, use_atime=True), now=now + 40 * DAY, dry_run=True)
    assert str(log) not in kept.to_dict()["warnings"].get("alice", {}).get("paths", []) and log.exists()
    gone = []
    expire_root(root_for(scratch, use_atime=True), now=now + 40 * DAY, dry_run=True,
                on_item=lambda p, k, b, o: gone.append(p))
    assert str(log) not in gone and str(ckpt) in gone
    gone.clear()
    expire_root(root_for(scratch), now=now + 40 * DAY, dry_run=True, on_item=lambda p, k, b, o: gone.append(p))
    assert str(log) in gone


def test_keep_globs_and_dlts_keep_files_protect_everything_under_them(scratch):
    write(scratch / "scratch" / "bob" / ".dlts-keep", "")
    root = root_for(scratch, keep=("scratch/alice/run1/deep",))
    report = expire_root(root, now=time.time() + 60 * DAY)
    assert (scratch / "scratch" / "bob" / "notes.txt").exists()
    assert (scratch / "scratch" / "alice" / "run1" / "deep" / "er" / "log.txt").exists()
    assert not (scratch / "scratch" / "alice" / "run1" / "ckpt.bin").exists()
    assert (scratch / "scratch" / "alice" / "run1").is_dir()  # not everything under it expired
    assert report.kept == 2 and "bob" not in report.deleted


def test_a_dlts_keep_above_the_matched_paths_keeps_them_all(scratch):
    write(scratch / "scratch" / ".dlts-keep", "")
    report = expire_root(root_for(scratch), now=time.time() + 60 * DAY)
    assert not report.deleted and report.kept == 2
    assert (scratch / "scratch" / "bob" / "notes.txt").exists()


def test_a_symlink_is_removed_never_its_target_and_never_followed(scratch, tmp_path):
    outside = write(tmp_path / "precious" / "data.bin")
    os.symlink(outside, scratch / "scratch" / "bob" / "to-file")
    os.symlink(outside.parent, scratch / "scratch" / "bob" / "to-dir")
    os.symlink(outside.parent, scratch / "scratch" / "carol")  # an expire_paths match that is a link
    expire_root(root_for(scratch), now=time.time() + 31 * DAY)
    assert outside.exists() and outside.parent.is_dir()
    assert not os.path.lexists(scratch / "scratch" / "bob" / "to-file")
    assert not os.path.lexists(scratch / "scratch" / "carol")


def test_expiry_stops_at_a_mount_point(scratch):
    mount_point = scratch / "scratch" / "bob" / "mnt"
    mount_point.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "dlts-test", str(mount_point)],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)")
    try:
        inside = write(mount_point / "other.bin")
        report = expire_root(root_for(scratch), now=time.time() + 31 * DAY)
        assert inside.exists() and report.other_fs == 1
        assert not (scratch / "scratch" / "bob" / "notes.txt").exists() and (scratch / "scratch" / "bob").is_dir()
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def test_deletions_keep_to_delete_ops_per_s(tmp_path):
    root = tmp_path / "r"
    for i in range(12):
        write(root / "tmp" / f"f{i}")
    started = time.monotonic()
    report = expire_root(StorageRoot(path=root, expire_after_days=1, warn_days=0, expire_paths=("tmp/*",),
                                     delete_ops_per_s=20), now=time.time() + 2 * DAY)
    took = time.monotonic() - started
    assert sum(t.files for t in report.deleted.values()) == 12
    assert took >= 11 / 20 * 0.95, took  # 12 unlinks at 20 a second: 11 gaps of 50 ms


def test_a_file_changed_just_before_its_unlink_stays(scratch):
    ckpt = scratch / "scratch" / "alice" / "run1" / "ckpt.bin"
    now = time.time() + 31 * DAY
    pauses, clock = [], [0.0]

    def sleep(seconds):  # the rate limiter's pause before an op: the owner writes the file meanwhile
        pauses.append(seconds)
        clock[0] += seconds
        if len(pauses) == 3:  # ops: unlink log.txt (no pause), rmdir er, rmdir deep, unlink ckpt.bin
            os.utime(ckpt, (now, now))

    report = expire_root(root_for(scratch), now=now, sleep=sleep, clock=lambda: clock[0])
    # the deepest file went first; the checkpoint, seen expired, was written before its turn
    assert ckpt.exists() and report.changed == 1
    assert not (scratch / "scratch" / "alice" / "run1" / "deep").exists()


def test_dry_run_lists_exactly_what_a_real_run_deletes(scratch):
    now = time.time() + 31 * DAY
    write(scratch / "scratch" / "alice" / "fresh.txt")
    os.utime(scratch / "scratch" / "alice" / "fresh.txt", (now, now))
    listed: list[str] = []
    dry = expire_root(root_for(scratch), now=now, dry_run=True, on_item=lambda p, k, b, o: listed.append(p))
    before = {str(p) for p in scratch.rglob("*")}
    assert all(os.path.lexists(p) for p in listed) and dry.dry_run
    deleted: list[str] = []
    expire_root(root_for(scratch), now=now, on_item=lambda p, k, b, o: deleted.append(p))
    assert deleted == listed
    assert before - {str(p) for p in scratch.rglob("*")} == set(listed)
    assert (scratch / "scratch" / "alice" / "fresh.txt").exists()


def test_owners_are_warned_of_what_goes_within_warn_days_and_held_until_may_delete(scratch):
    now = time.time() + 27 * DAY  # 27 days old: inside the 5 warning days before 30
    report = expire_root(root_for(scratch), now=now)
    assert not report.deleted and set(report.warnings) == {"alice", "bob"}
    assert report.warnings["alice"].files == 2 and len(report.warnings["alice"].paths) == 2
    held = expire_root(root_for(scratch), now=now + 4 * DAY, may_delete=lambda owner: owner == "bob")
    assert set(held.deleted) == {"bob"} and held.held["alice"].files == 2
    assert (scratch / "scratch" / "alice" / "run1" / "ckpt.bin").exists()


def test_expire_paths_globs_do_not_follow_links_or_match_hidden_names(scratch, tmp_path):
    os.symlink(tmp_path, scratch / "linked")
    write(scratch / "scratch" / ".hidden" / "x")
    root = StorageRoot(path=scratch, expire_after_days=1, expire_paths=("scratch/*", "linked/*", "*/alice"), warn_days=0)
    assert matching_paths(root) == ["home/alice", "scratch/alice", "scratch/bob"]
