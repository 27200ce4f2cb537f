"""The walk of one part of a root in a worker process (``dlts.storage.scan`` starts and merges them).

A worker process takes directories from the scanning process over its pipe, walks each subtree depth
first with ``os.listdir`` on the directory's descriptor and ``os.lstat(name, dir_fd=...)`` (symlinks
never followed, the name resolved relative to the open directory, so one lookup per entry), and sums
what it finds without keeping anything per file:

- per (the directory's first ``depth`` path parts, uid): files, allocated bytes, apparent bytes, the
  oldest mtime;
- the uid of every directory down to ``depth`` (the directory's owner), the ``keep_oldest`` oldest
  files, counts of directories, vanished entries, unreadable entries and other file systems;
- a file with more than one hard link is not summed here: the first time this worker meets its
  ``(st_dev, st_ino)`` it is sent to the scanning process as a candidate, which counts each inode once
  across all workers (so a link whose other names are in another worker's part still counts once).

While the scanning process has an idle worker and nothing queued (``hungry``), a worker hands back the
shallower half of the directories it still has to walk. Before listing a directory it writes the
time and the path into its slot of shared memory, so the scanning process sees a directory that does
not answer within ``dir_timeout_s`` (a hung mount) without any message from the stuck worker.

Only the standard library is imported here: a worker process starts in a few tens of milliseconds.
"""

from __future__ import annotations

import gc
import heapq
import os
import resource
import signal
import stat
import time
from collections.abc import Callable
from typing import Any

PATH_SLOT = 4096  # bytes of shared memory per worker for the path being listed
LINK_BATCH = 4096  # hard-link candidates sent at once
MAX_LISTED = 50  # paths kept per kind of problem (all are counted)

_OPEN_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


_S_IFMT, _S_IFDIR = stat.S_IFMT(0o177777), stat.S_IFDIR
_INF = float("inf")


def _add_run(by_uid: dict[int, list], uid: int, files: int, blocks: int, apparent: int, oldest: float) -> None:
    """Adds a run of one uid's files (in one directory) to that directory's sums by uid."""
    acc = by_uid.get(uid)
    if acc is None:
        by_uid[uid] = [files, blocks, apparent, oldest]
    else:
        acc[0] += files
        acc[1] += blocks
        acc[2] += apparent
        if oldest < acc[3]:
            acc[3] = oldest


class Walk:
    """What one worker found, summed; ``payload()`` is what it sends back at the end."""

    def __init__(self, root_dev: int, depth: int, keep_oldest: int, forked: bool = False):
        self.root_dev, self.depth, self.keep_oldest, self.forked = root_dev, depth, keep_oldest, forked
        self.sums: dict[tuple[tuple[str, ...], int], list] = {}  # (prefix, uid) -> [files, alloc, apparent, oldest]
        self.dir_uids: dict[tuple[str, ...], int] = {}  # directories down to depth -> their uid
        self.oldest: list[tuple[float, str]] = []  # max-heap on mtime (negated) of the oldest files
        self.seen: set[tuple[int, int]] = set()  # hard-linked inodes this worker already sent
        self.links: list[tuple] = []  # candidates not sent yet
        self.seen_again = self.dirs = self.vanished = 0
        self.unreadable: list[str] = []
        self.unreadable_count = 0
        self.other_fs: list[str] = []
        self.other_fs_count = 0

    def problem(self, path: str, why: str) -> None:
        self.unreadable_count += 1
        if len(self.unreadable) < MAX_LISTED:
            self.unreadable.append(f"{path}: {why}" if why else path)

    def directory(self, path: str, parts: tuple[str, ...], stack: list) -> None:
        """Lists one directory: its files summed, its subdirectories pushed on ``stack``."""
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except FileNotFoundError:
            self.vanished += 1
            return
        except OSError as exc:
            self.problem(path, exc.strerror or str(exc))
            return
        try:
            try:
                names = os.listdir(fd)
            except OSError as exc:
                self.problem(path, exc.strerror or str(exc))
                return
            self.dirs += 1
            depth, root_dev, lstat = self.depth, self.root_dev, os.lstat
            prefix = parts if len(parts) <= depth else parts[:depth]
            deep_enough = len(parts) >= depth  # its subdirectories are below depth: no owner kept
            by_uid: dict[int, list] = {}  # uid -> [files, 512-byte blocks, apparent bytes, oldest mtime]
            # the run of files of one uid being summed, in locals (a directory's files mostly share a uid)
            uid_now = -1  # no uid is -1: the first file starts a run
            files = blocks = apparent = 0
            run_oldest = _INF
            oldest, keep = self.oldest, self.keep_oldest
            # a file newer than this cannot get among the oldest: the heap's newest once it is full
            newest_kept = (-oldest[0][0] if len(oldest) >= keep else _INF) if keep else -_INF
            for name in names:
                try:
                    st = lstat(name, dir_fd=fd)
                except FileNotFoundError:
                    continue  # removed while we looked
                except OSError as exc:
                    self.problem(f"{path}/{name}", exc.strerror or str(exc))
                    continue
                if st.st_mode & _S_IFMT == _S_IFDIR:
                    child = f"{path}/{name}"
                    if st.st_dev != root_dev:
                        self.other_fs_count += 1
                        if len(self.other_fs) < MAX_LISTED:
                            self.other_fs.append(child)
                        continue
                    child_parts = parts + (name,)
                    if not deep_enough:
                        self.dir_uids[child_parts] = st.st_uid
                    stack.append((child, child_parts))
                    continue
                if st.st_nlink > 1:
                    key = (st.st_dev, st.st_ino)
                    if key in self.seen:
                        self.seen_again += 1
                    else:
                        self.seen.add(key)
                        self.links.append((key, st.st_uid, st.st_blocks * 512, st.st_size, st.st_mtime, prefix,
                                           f"{path}/{name}"))
                    continue
                if st.st_uid != uid_now:
                    if files:
                        _add_run(by_uid, uid_now, files, blocks, apparent, run_oldest)
                    uid_now = st.st_uid
                    files = blocks = apparent = 0
                    run_oldest = _INF
                files += 1
                blocks += st.st_blocks
                apparent += st.st_size
                mtime = st.st_mtime
                if mtime < run_oldest:
                    run_oldest = mtime
                if mtime <= newest_kept:
                    item = (-mtime, f"{path}/{name}")
                    if len(oldest) < keep:
                        heapq.heappush(oldest, item)
                    elif item > oldest[0]:
                        heapq.heapreplace(oldest, item)
                    if len(oldest) >= keep:
                        newest_kept = -oldest[0][0]
            if files:
                _add_run(by_uid, uid_now, files, blocks, apparent, run_oldest)
        finally:
            os.close(fd)
        sums = self.sums
        for uid, (files, blocks, apparent, mtime) in by_uid.items():
            allocated = blocks * 512
            total = sums.get((prefix, uid))
            if total is None:
                sums[(prefix, uid)] = [files, allocated, apparent, mtime]
            else:
                total[0] += files
                total[1] += allocated
                total[2] += apparent
                if mtime < total[3]:
                    total[3] = mtime

    def take_links(self) -> list[tuple]:
        links, self.links = self.links, []
        return links

    def payload(self) -> dict[str, Any]:
        return {"sums": self.sums, "dir_uids": self.dir_uids, "oldest": self.oldest, "links": self.take_links(),
                "seen_again": self.seen_again, "dirs": self.dirs, "vanished": self.vanished,
                "unreadable": self.unreadable, "unreadable_count": self.unreadable_count,
                "other_fs": self.other_fs, "other_fs_count": self.other_fs_count,
                "peak_rss_kib": private_kib() if self.forked else peak_rss_kib(), "cpu_s": sum(os.times()[:2])}


def peak_rss_kib() -> int:
    """This process's own peak resident size (VmHWM: ru_maxrss would include the parent's size from
    before the exec of a spawned process)."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def private_kib() -> int:
    """A forked worker's own memory: the pages it does not share with the scanning process (those it
    allocated or wrote to), at the end of its walk, when it holds the most (its sums and hard-link set
    only grow). Its VmHWM would count again the scanning process's pages it maps, shared and
    untouched."""
    try:
        with open("/proc/self/smaps_rollup", "rb") as rollup:
            return sum(int(line.split()[1]) for line in rollup
                       if line.startswith((b"Private_Clean:", b"Private_Dirty:", b"Swap:")))
    except (OSError, ValueError, IndexError):
        return peak_rss_kib()


def work(conn: Any, slot: int, started: Any, paths: Any, hungry: Any, root_dev: int, depth: int, keep_oldest: int,
         before_dir: Callable[[str], None] | None = None, inherited: tuple[int, ...] | None = None) -> None:
    """A worker process's loop: it says ("ready", pid); then ("walk", [(path, parts), ...]) walks those subtrees, then says ("idle",
    candidates); ("end",) sends ("result", payload) and returns. ``before_dir`` (tests: a directory
    that hangs or fails) is called with each directory's path before it is listed. ``inherited``: the
    process is a fork of the scanning process; these are its copies of that process's ends of the
    workers' pipes, closed here (its memory is then reported as what it does not share)."""
    # Ctrl-C on a terminal reaches the whole process group: the scanning process handles it (and
    # stops the workers); a worker says nothing of it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # the objects there are now (a forked worker's: all of the scanning process's) are never collected
    # here: the collector would write to each one's header, copying every page of them into the worker
    gc.freeze()
    for fd in inherited or ():
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        _serve(conn, slot, started, paths, hungry, Walk(root_dev, depth, keep_oldest, inherited is not None), before_dir)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the scanning process is gone: nobody to report to


def _serve(conn: Any, slot: int, started: Any, paths: Any, hungry: Any, walk: Walk,
           before_dir: Callable[[str], None] | None) -> None:
    offset = slot * PATH_SLOT
    conn.send(("ready", os.getpid()))
    clock = time.monotonic
    while True:
        message = conn.recv()
        if message[0] == "end":
            conn.send(("result", walk.payload()))
            return
        stack: list[tuple[str, tuple[str, ...]]] = list(message[1])
        while stack:
            path, parts = stack.pop()
            raw = os.fsencode(path)[: PATH_SLOT - 1] + b"\0"
            paths[offset:offset + len(raw)] = raw
            started[slot] = clock()
            if before_dir is not None:
                try:
                    before_dir(path)
                except OSError as exc:
                    started[slot] = 0.0
                    if isinstance(exc, FileNotFoundError):
                        walk.vanished += 1
                    else:
                        walk.problem(path, exc.strerror or str(exc))
                    continue
            walk.directory(path, parts, stack)
            started[slot] = 0.0
            if len(walk.links) >= LINK_BATCH:
                conn.send(("links", walk.take_links()))
            if hungry.value and len(stack) > 1:  # an idle worker waits: hand back the shallower half
                hungry.value = 0
                half = len(stack) // 2
                conn.send(("more", stack[:half]))
                del stack[:half]
        conn.send(("idle", walk.take_links()))


def slot_path(paths: Any, slot: int) -> str:
    raw = bytes(paths[slot * PATH_SLOT:(slot + 1) * PATH_SLOT])
    return os.fsdecode(raw.split(b"\0", 1)[0])
