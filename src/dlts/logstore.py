"""The log store: each attempt's output, capped in size, read without following links.

Layout, per job, in ``<log_dir>/<job id>/``, each attempt's files named from its *stem*,
``attempt-<n>-<log key>`` (``job_attempts.log_key``, 16 random hex digits made with the attempt row):

* ``<stem>.log``: the head of the output, its first ``max_bytes // 2`` bytes;
* ``<stem>.log.<offset>``: the tail, in parts; ``<offset>`` is where the part starts in the
  whole output. When the parts pass the other half of ``max_bytes`` the oldest one is deleted,
  so an attempt keeps at most ``max_bytes`` (plus one part) however much it prints: its head and
  its newest tail. What was dropped is the gap between the head and the first part.

The key is what a database restored from a backup brings back with the attempt: a job id handed
out again after a restore (auto-increment ids count from the backup's) makes attempts with new
keys, so it never finds the log of the job the restore discarded; that log is an *orphan*, a stem
no attempt row names (``stored_attempts`` lists a job's stems; services/log_orphans.py compares them
with the rows). Attempts made before revision 0022 have no key: their stem is ``attempt-<n>``, as
it was, so an upgrade loses no log.

Offsets are positions in the whole output as the job wrote it, so a reader following the log with
``next_offset`` never sees a byte twice or skips one that is still stored, even while parts
rotate. One writer per attempt (the Kubernetes backend's log copy), or several that each pass
``shared=True`` (the local backend's inits of an inference attempt's replicas): they take an
``flock`` on ``<stem>.log.lock`` for each write and re-read the files' sizes under it.

Every read opens the job directory and then each file relative to it with ``O_NOFOLLOW``: a job
that replaced its log with a symlink (to ``/etc/passwd``, to another job's log) gets nothing read
through it; nor through a hard link (a file of the store has one link: a log file with more is
refused); ``UnsafeLog`` says so and the API answers ``no_log``.

A full volume (``ENOSPC``, ``EDQUOT``, ``EIO``) never stops a job: ``CuttingLog`` (the local init's
writer) stores what fits, drops the rest and counts it, and once a write goes through again puts a
line in the log where the output was cut (``cut_line``: ``[dlts] N bytes of output were not stored
here: <reason>``). It is output like any other (offsets count it), so readers need nothing new; what
could not be said in the log by the end is in ``CuttingLog.dropped_bytes`` for the init's exit record.
"""

from __future__ import annotations

import errno
import fcntl
import io
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

CHUNK_MIN = 16 * 1024  # the smallest tail part
MIN_MAX_BYTES = 64 * 1024  # the smallest cap (Settings.log_max_bytes' lower bound)
_KEY = re.compile(r"^[0-9a-f]{16}$")
# every file an attempt has in its job's directory: the head, tail parts, the shared writers' lock,
# the Kubernetes log copy's cursor (and the cursor's temporary file while it is replaced)
_FILE = re.compile(r"^attempt-(\d+)(?:-([0-9a-f]{16}))?\.(?:log|log\.\d+|log\.lock|k8s-cursor|k8s-cursor\.tmp)$")
# a write that fails with one of these lost its bytes to a full or failing volume: the job goes on
VOLUME_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO})


class UnsafeLog(OSError):
    """The attempt's log is a symlink, not a regular file, or lies outside the log store."""


def new_key() -> str:
    """A new attempt's log key (``job_attempts.log_key``)."""
    return secrets.token_hex(8)


def attempt_stem(attempt: int, key: str | None) -> str:
    """The name every file of the attempt starts with; ``key`` None: an attempt from before keys."""
    if key is None:
        return f"attempt-{int(attempt)}"
    if not _KEY.match(key):
        raise ValueError(f"a log key is 16 lowercase hex digits, not {key!r}")
    return f"attempt-{int(attempt)}-{key}"


def job_dir(log_dir: Path, job_id: int) -> Path:
    return Path(log_dir) / str(int(job_id))


def head_path(log_dir: Path, job_id: int, attempt: int, *, key: str | None) -> Path:
    return job_dir(log_dir, job_id) / f"{attempt_stem(attempt, key)}.log"


def _limits(max_bytes: int) -> tuple[int, int, int]:
    """(head bytes, tail budget, part size) for a cap."""
    head = max_bytes // 2
    tail = max_bytes - head
    return head, tail, max(CHUNK_MIN, tail // 4)


def _parts(names: list[str], stem: str) -> list[int]:
    """Start offsets of the attempt's tail parts, oldest first."""
    prefix = f"{stem}.log."
    return sorted(int(name[len(prefix):]) for name in names
                  if name.startswith(prefix) and name[len(prefix):].isdigit() and name[len(prefix):].isascii())


class AttemptLogWriter:
    """Appends an attempt's output to the store, keeping the head and the newest tail.

    Re-opening continues where the files end (a restarted copier or init appends, never rewrites).
    """

    def __init__(self, log_dir: Path, job_id: int, attempt: int, max_bytes: int, *, key: str | None,
                 shared: bool = False) -> None:
        if max_bytes < MIN_MAX_BYTES:
            raise ValueError(f"log_max_bytes must be at least {MIN_MAX_BYTES}")
        self.stem = attempt_stem(attempt, key)
        self.dir = job_dir(log_dir, job_id)
        self._make_dir()
        self.attempt = int(attempt)
        self.head_bytes, self.tail_bytes, self.part_bytes = _limits(max_bytes)
        self._head = self.dir / f"{self.stem}.log"
        self._fh: io.FileIO | None = None
        self._fh_start: int | None = None
        self._lock_fd: int | None = None
        if shared:
            self._lock_fd = os.open(self.dir / f"{self.stem}.log.lock",
                                    os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
        self._refresh()

    def _make_dir(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.dir.is_symlink() or not self.dir.is_dir():
            raise UnsafeLog(f"log directory {self.dir} is not a plain directory")

    def _refresh(self) -> None:
        """Sizes from the files (what other writers of a shared log wrote meanwhile)."""
        try:
            head_size = os.lstat(self._head).st_size
        except FileNotFoundError:
            head_size = 0
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:  # removed while empty (remove_attempt): made again at the first write
            names = []
        parts = {}
        for start in _parts(names, self.stem):
            try:
                parts[start] = os.lstat(self.dir / f"{self.stem}.log.{start}").st_size
            except FileNotFoundError:
                continue  # rotated away by another writer
        self._parts = parts
        if parts:
            last = max(parts)
            self.size = last + parts[last]
        else:
            self.size = head_size
        if self._fh_start is not None and self._fh_start not in parts:
            self._close_fh()

    def _target(self) -> tuple[int | None, int]:
        """(part start or None for the head, room left there)."""
        if not self._parts and self.size < self.head_bytes:
            return None, self.head_bytes - self.size
        if self._parts:
            last = max(self._parts)
            room = self.part_bytes - self._parts[last]
            if room > 0:
                return last, room
        return self.size, self.part_bytes  # a new part starting here

    def _close_fh(self) -> None:
        if self._fh is not None:
            self._fh.close()
        self._fh, self._fh_start = None, None

    def _open(self, start: int | None) -> None:
        if self._fh is not None and self._fh_start == start:
            return
        self._close_fh()
        path = self._head if start is None else self.dir / f"{self.stem}.log.{start}"
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
        try:
            fd = os.open(path, flags, 0o640)
        except FileNotFoundError:
            # the job's directory went while this writer had written nothing: the janitor removes the
            # emptied directory of a job id whose old logs were orphans (remove_attempt)
            self._make_dir()
            fd = os.open(path, flags, 0o640)
        self._fh = os.fdopen(fd, "ab", buffering=0)
        self._fh_start = start
        if start is not None:
            self._parts.setdefault(start, 0)

    def write(self, data: bytes) -> None:
        if self._lock_fd is None:
            self._write(data)
            return
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            self._refresh()
            self._write(data)
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                start, room = self._target()
                self._open(start)
                assert self._fh is not None
                written = self._fh.write(view[:room]) or 0  # short on a volume that is filling up
                self.size += written
                if start is not None:
                    self._parts[start] += written
                view = view[written:]
                self._drop_old()
        except OSError:
            # what reached the files is what counts: sizes (and so offsets) from them again
            self._close_fh()
            self._refresh()
            raise

    def _drop_old(self) -> None:
        while len(self._parts) > 1 and sum(self._parts.values()) > self.tail_bytes + self.part_bytes:
            oldest = min(self._parts)
            try:
                os.unlink(self.dir / f"{self.stem}.log.{oldest}")
            except FileNotFoundError:
                pass
            del self._parts[oldest]

    def close(self) -> None:
        self._close_fh()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def volume_error(exc: BaseException) -> bool:
    """An error of the volume under the log (full, over quota, failing), not of the log itself."""
    return isinstance(exc, OSError) and not isinstance(exc, UnsafeLog) and exc.errno in VOLUME_ERRNOS


def cut_line(dropped_bytes: int, reason: str) -> bytes:
    """The line a ``CuttingLog`` puts where output was dropped."""
    return f"\n[dlts] {dropped_bytes} bytes of output were not stored here: {reason}\n".encode()


class CuttingLog:
    """A job's output into the store, never refusing it: while the volume is full (``VOLUME_ERRNOS``)
    what does not fit is dropped and counted, and the first write that goes through again is
    preceded by ``cut_line``. ``say`` is told (once) each time storing stops and starts again: the
    caller's complaint must not go to the full volume only.

    ``open_writer`` makes the ``AttemptLogWriter``; a volume error there (the job's directory cannot
    be made) is a cut like any other, and it is tried again at the next write. Anything else it
    raises (``UnsafeLog``) is the caller's."""

    def __init__(self, open_writer: Callable[[], AttemptLogWriter], say: Callable[[str], None] = lambda _text: None) -> None:
        self._open_writer = open_writer
        self._say = say
        self.writer: AttemptLogWriter | None = None
        self.dropped_bytes = 0  # all the attempt's output that was not stored
        self.unmarked_bytes = 0  # of which no cut_line in the log says so yet
        self.reason = ""
        self._try_open()

    @property
    def cut(self) -> bool:
        return self.unmarked_bytes > 0

    def _try_open(self) -> bool:
        if self.writer is not None:
            return True
        try:
            self.writer = self._open_writer()
        except OSError as exc:
            if not volume_error(exc):
                raise
            self._failed(exc)
            return False
        return True

    def _failed(self, exc: OSError) -> None:
        if not self.cut:
            self.reason = exc.strerror or str(exc)
            self._say(f"cannot store the job's output ({self.reason}): dropping it until the log volume has room")

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._try_open():
            self._drop(len(data))
            return
        assert self.writer is not None
        if self.cut and not self._mark():
            self._drop(len(data))
            return
        before = self.writer.size
        try:
            self.writer.write(data)
        except OSError as exc:
            if not volume_error(exc):
                raise
            self._failed(exc)
            self._drop(len(data) - max(0, self.writer.size - before))

    def _drop(self, count: int) -> None:
        self.dropped_bytes += count
        self.unmarked_bytes += count

    def _mark(self) -> bool:
        """The cut line for what was dropped so far; False while it does not fit either."""
        assert self.writer is not None
        line = cut_line(self.unmarked_bytes, self.reason)
        try:
            self.writer.write(line)
        except OSError as exc:  # a piece of it may be in: the next try writes the whole line after it
            if not volume_error(exc):
                raise
            return False
        self._say(f"storing the job's output again; {self.unmarked_bytes} bytes of it were not stored ({self.reason})")
        self.unmarked_bytes = 0
        return True

    def close(self) -> None:
        """Say in the log what was dropped at the end, if it fits now; then close."""
        if self.cut and self._try_open():
            self._mark()
        if self.writer is not None:
            self.writer.close()


@dataclass(frozen=True)
class LogSlice:
    data: bytes
    next_offset: int  # where to read next
    size: int  # bytes the attempt has written so far (stored or dropped)
    dropped: int  # bytes between the head and the first stored tail part


def _open_dir(log_dir: Path, job_id: int) -> int | None:
    root = os.path.realpath(log_dir)
    try:
        fd = os.open(os.path.join(root, str(int(job_id))), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnsafeLog(f"log directory of job {job_id} is not a plain directory: {exc.strerror}") from None
    return fd


def _open_file(dir_fd: int, name: str) -> int | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symlink
        raise UnsafeLog(f"{name} is not a regular file ({exc.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafeLog(f"{name} is not a regular file")
    if st.st_nlink != 1:  # O_NOFOLLOW stops symlinks, not a hard link to a file outside the store
        os.close(fd)
        raise UnsafeLog(f"{name} has {st.st_nlink} hard links (the store writes files with one)")
    return fd


class _Stored:
    """The attempt's stored pieces: [(start offset, length, file name)], head first."""

    def __init__(self, dir_fd: int, stem: str) -> None:
        self.dir_fd = dir_fd
        self.pieces: list[tuple[int, int, str]] = []
        head = f"{stem}.log"
        fd = _open_file(dir_fd, head)
        if fd is not None:
            self.pieces.append((0, os.fstat(fd).st_size, head))
            os.close(fd)
        for start in _parts(os.listdir(dir_fd), stem):
            name = f"{head}.{start}"
            fd = _open_file(dir_fd, name)
            if fd is not None:
                self.pieces.append((start, os.fstat(fd).st_size, name))
                os.close(fd)

    @property
    def size(self) -> int:
        return max((s + n for s, n, _ in self.pieces), default=0)

    @property
    def dropped(self) -> int:
        if len(self.pieces) < 2:
            return 0
        head_end = self.pieces[0][0] + self.pieces[0][1]
        return max(0, self.pieces[1][0] - head_end)

    def read(self, start: int, offset: int, length: int, name: str) -> bytes:
        fd = _open_file(self.dir_fd, name)
        if fd is None:  # rotated away between listing and reading
            return b""
        try:
            return os.pread(fd, length, offset - start)
        finally:
            os.close(fd)


def read_log(log_dir: Path, job_id: int, attempt: int, offset: int = 0, limit: int = 1 << 20, *,
             key: str | None) -> LogSlice | None:
    """Up to ``limit`` bytes from ``offset`` (a position in the whole output) of the attempt's log
    with this ``key``; None: no log yet.

    An offset inside the dropped middle continues at the first stored byte after it, prefixed by a
    line saying how much was dropped.
    """
    stem = attempt_stem(attempt, key)
    dir_fd = _open_dir(log_dir, job_id)
    if dir_fd is None:
        return None
    try:
        stored = _Stored(dir_fd, stem)
        if not stored.pieces:
            return None
        size, out = stored.size, bytearray()
        pos = min(max(0, offset), size)  # past the end: at the end (a follower waits there)
        for start, length, name in stored.pieces:
            if len(out) >= limit:
                break
            end = start + length
            if pos >= end:
                continue
            if pos < start:  # in a gap: the dropped middle
                out += _gap_line(start - pos)
                pos = start
            take = min(end - pos, limit - len(out))
            out += stored.read(start, pos, take, name)
            pos += take
        return LogSlice(bytes(out), pos, size, stored.dropped)
    finally:
        os.close(dir_fd)


def iter_log(log_dir: Path, job_id: int, attempt: int, chunk: int = 1 << 20, *, key: str | None) -> Iterator[bytes]:
    """The whole stored log in order (head, a line for the dropped middle, the tail parts)."""
    offset = 0
    while True:
        piece = read_log(log_dir, job_id, attempt, offset, chunk, key=key)
        if piece is None or not piece.data:
            return
        yield piece.data
        offset = piece.next_offset


def _gap_line(dropped: int) -> bytes:
    return (f"\n[dlts: {dropped} bytes of this log were dropped here to keep it within log_max_bytes; "
            "the head and the newest output are kept]\n").encode()


# -- what the store holds, for the orphan report and purge (services/log_orphans.py) -----------------

@dataclass(frozen=True)
class StoredAttempt:
    """One attempt's files in its job's directory, as found there."""

    job_id: int
    attempt: int
    key: str | None  # None: the layout from before log keys
    names: tuple[str, ...]
    size_bytes: int
    modified: float  # the newest file's mtime, seconds since the epoch


def stored_job_ids(log_dir: Path) -> list[int]:
    """The job ids with a directory in the store (a plain directory named by the id), in order."""
    try:
        entries = list(os.scandir(log_dir))
    except FileNotFoundError:
        return []
    ids = []
    for entry in entries:
        name = entry.name
        if name.isascii() and name.isdigit() and str(int(name)) == name and entry.is_dir(follow_symlinks=False):
            ids.append(int(name))
    return sorted(ids)


def stored_attempts(log_dir: Path, job_id: int) -> list[StoredAttempt]:
    """The attempts with files in the job's directory, by (attempt, key); files of other names are
    not DLTS's and are left out. The directory is opened without following a link (``UnsafeLog``)."""
    dir_fd = _open_dir(log_dir, job_id)
    if dir_fd is None:
        return []
    groups: dict[tuple[int, str | None], list[tuple[str, os.stat_result]]] = {}
    try:
        for name in os.listdir(dir_fd):
            m = _FILE.match(name)
            if m is None:
                continue
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # rotated away meanwhile
            groups.setdefault((int(m.group(1)), m.group(2)), []).append((name, st))
    finally:
        os.close(dir_fd)
    return [StoredAttempt(job_id, attempt, key, tuple(sorted(n for n, _ in files)),
                          sum(st.st_size for _, st in files), max(st.st_mtime for _, st in files))
            for (attempt, key), files in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))]


def remove_attempt(log_dir: Path, stored: StoredAttempt, *, remove_empty_dir: bool) -> None:
    """Delete the attempt's files found by ``stored_attempts`` (a link is removed, never followed),
    and with ``remove_empty_dir`` the job's directory when nothing else is left in it."""
    dir_fd = _open_dir(log_dir, stored.job_id)
    if dir_fd is None:
        return
    try:
        for name in stored.names:
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            except IsADirectoryError:  # a directory where a log file belongs: not followed either
                shutil.rmtree(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    if remove_empty_dir:
        try:
            os.rmdir(job_dir(log_dir, stored.job_id))
        except OSError:  # not empty: another attempt's files, or files that are not DLTS's
            pass
