"""The log store (dlts.logstore): the cap keeps the head and the newest tail and says what was
dropped, offsets stay positions in the whole output while parts rotate, a writer re-opened appends,
and a read never follows a link or leaves the job's directory. The attempt's log key names its
files (an attempt from before keys keeps the old names); what the store holds is listed by attempt
and key for the orphan report, and an orphan's removal follows no link."""

from __future__ import annotations

import os
import socket

import pytest

from dlts import logstore
from dlts.logstore import AttemptLogWriter, CuttingLog, UnsafeLog, iter_log, read_log

CAP = 64 * 1024  # the smallest cap: a 32 KiB head, 16 KiB tail parts
KEY = "0123456789abcdef"  # the attempt's log key (job_attempts.log_key)
HEAD = f"attempt-1-{KEY}.log"


def _lines(start: int, count: int) -> bytes:
    return b"".join(f"line {i:06d}\n".encode() for i in range(start, start + count))  # 12 bytes a line


def _write(tmp_path, data: bytes, *, job: int = 7, attempt: int = 1, cap: int = CAP, piece: int = 1000,
           key: str | None = KEY) -> None:
    writer = AttemptLogWriter(tmp_path, job, attempt, cap, key=key)
    for i in range(0, len(data), piece):
        writer.write(data[i:i + piece])
    writer.close()


def _stored_bytes(tmp_path, job: int = 7) -> int:
    return sum(p.stat().st_size for p in (tmp_path / str(job)).iterdir() if ".lock" not in p.name)


def test_a_log_under_the_cap_is_stored_and_read_whole(tmp_path):
    data = _lines(0, 100)
    _write(tmp_path, data)
    piece = read_log(tmp_path, 7, 1, key=KEY)
    assert (piece.data, piece.size, piece.dropped, piece.next_offset) == (data, len(data), 0, len(data))
    assert sorted(p.name for p in (tmp_path / "7").iterdir()) == [HEAD]


def test_rotation_keeps_the_head_and_the_newest_tail_within_the_cap(tmp_path):
    data = _lines(0, 50_000)  # 600 KB through a 64 KiB cap
    _write(tmp_path, data)
    stored = _stored_bytes(tmp_path)
    assert stored <= CAP + 16 * 1024  # the cap plus at most one part being filled
    whole = b"".join(iter_log(tmp_path, 7, 1, key=KEY))
    head = data[:CAP // 2]
    assert whole.startswith(head)
    assert whole.endswith(data[-16 * 1024:])  # the newest output is all there
    piece = read_log(tmp_path, 7, 1, 0, 1 << 30, key=KEY)
    assert piece.size == len(data) and piece.dropped == len(data) - stored


def test_the_dropped_middle_is_one_line_saying_how_much(tmp_path):
    data = _lines(0, 50_000)
    _write(tmp_path, data)
    whole = b"".join(iter_log(tmp_path, 7, 1, key=KEY))
    dropped = read_log(tmp_path, 7, 1, key=KEY).dropped
    line = (f"\n[dlts: {dropped} bytes of this log were dropped here to keep it within log_max_bytes; "
            "the head and the newest output are kept]\n").encode()
    assert whole.count(b"[dlts: ") == 1
    assert whole == data[:CAP // 2] + line + data[CAP // 2 + dropped:]


def test_offsets_are_positions_in_the_whole_output_while_parts_rotate(tmp_path):
    """A follower reading as the job writes gets every stored byte once, in order: what it missed
    while it was rotated away is the one dropped-line, never a repeat."""
    writer = AttemptLogWriter(tmp_path, 7, 1, CAP, key=KEY)
    data = _lines(0, 40_000)
    offset, seen = 0, bytearray()
    for i in range(0, len(data), 4000):
        writer.write(data[i:i + 4000])
        piece = read_log(tmp_path, 7, 1, offset, 2000, key=KEY)  # a slow reader: 2 KB per 4 KB written
        seen += piece.data
        assert piece.next_offset >= offset
        offset = piece.next_offset
    writer.close()
    while (piece := read_log(tmp_path, 7, 1, offset, 1 << 20, key=KEY)).data:
        seen += piece.data
        offset = piece.next_offset
    assert offset == len(data)
    text = bytes(seen)
    assert text.startswith(data[:CAP // 2]) and text.endswith(data[-16 * 1024:])
    # every line outside the dropped notes is whole and in order, each once
    kept = [line for line in text.split(b"\n") if line.startswith(b"line ")]
    numbers = [int(line.split()[1]) for line in kept if len(line) == 11]
    assert numbers == sorted(set(numbers))


def test_an_offset_past_the_end_returns_nothing_and_stays_at_the_end(tmp_path):
    _write(tmp_path, b"abc\n")
    piece = read_log(tmp_path, 7, 1, 100, key=KEY)
    assert (piece.data, piece.next_offset) == (b"", 4)


def test_a_reopened_writer_appends_where_the_files_end(tmp_path):
    first, second = _lines(0, 10_000), _lines(10_000, 10_000)
    _write(tmp_path, first)
    _write(tmp_path, second)  # a restarted init or log copier
    whole = b"".join(iter_log(tmp_path, 7, 1, key=KEY))
    assert read_log(tmp_path, 7, 1, key=KEY).size == len(first) + len(second)
    assert whole.endswith(second[-16 * 1024:]) and whole.startswith(first[:CAP // 2])


def test_writers_sharing_an_attempt_log_keep_one_consistent_cap(tmp_path):
    """Replicas of a local inference attempt: each init writes under the lock."""
    writers = [AttemptLogWriter(tmp_path, 7, 1, CAP, key=KEY, shared=True) for _ in range(3)]
    total = 0
    for i in range(3000):
        chunk = f"replica {i % 3} line {i:06d}\n".encode()
        writers[i % 3].write(chunk)
        total += len(chunk)
    for writer in writers:
        writer.close()
    piece = read_log(tmp_path, 7, 1, key=KEY)
    assert piece.size == total
    assert _stored_bytes(tmp_path) <= CAP + 16 * 1024
    whole = b"".join(iter_log(tmp_path, 7, 1, key=KEY))
    assert whole.startswith(b"replica 0 line 000000\nreplica 1 line 000001\n")
    assert whole.endswith(b"replica 2 line 002999\n")


def test_no_log_yet_is_none(tmp_path):
    assert read_log(tmp_path, 7, 1, key=KEY) is None
    (tmp_path / "7").mkdir()
    assert read_log(tmp_path, 7, 1, key=KEY) is None
    assert list(iter_log(tmp_path, 7, 1, key=KEY)) == []


def test_a_log_replaced_by_a_symlink_is_refused(tmp_path):
    _write(tmp_path, b"mine\n")
    head = tmp_path / "7" / HEAD
    head.unlink()
    head.symlink_to("/etc/passwd")
    with pytest.raises(UnsafeLog):
        read_log(tmp_path, 7, 1, key=KEY)
    with pytest.raises(UnsafeLog):
        list(iter_log(tmp_path, 7, 1, key=KEY))


def test_a_tail_part_replaced_by_a_symlink_is_refused(tmp_path):
    _write(tmp_path, _lines(0, 10_000))
    part = next(p for p in (tmp_path / "7").iterdir() if p.name.startswith(HEAD + "."))
    part.unlink()
    part.symlink_to(tmp_path / "7" / HEAD)
    with pytest.raises(UnsafeLog):
        read_log(tmp_path, 7, 1, key=KEY)


def test_a_log_replaced_by_a_hard_link_to_another_file_is_refused(tmp_path):
    _write(tmp_path, b"mine\n")
    secret = tmp_path / "elsewhere"
    secret.write_bytes(b"another tenant's output\n")
    head = tmp_path / "7" / HEAD
    head.unlink()
    os.link(secret, head)  # O_NOFOLLOW does not see it: the same inode, two names
    with pytest.raises(UnsafeLog, match="2 hard links"):
        read_log(tmp_path, 7, 1, key=KEY)
    with pytest.raises(UnsafeLog):
        list(iter_log(tmp_path, 7, 1, key=KEY))
    secret.unlink()  # one link left: a plain file of the store again
    assert read_log(tmp_path, 7, 1, key=KEY).data == b"another tenant's output\n"


def test_a_log_that_is_not_a_regular_file_is_refused(tmp_path):
    (tmp_path / "7").mkdir()
    os.mkfifo(tmp_path / "7" / HEAD)  # a read would block forever
    with pytest.raises(UnsafeLog):
        read_log(tmp_path, 7, 1, key=KEY)
    os.unlink(tmp_path / "7" / HEAD)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "7" / HEAD))
        with pytest.raises(UnsafeLog):
            read_log(tmp_path, 7, 1, key=KEY)
    os.unlink(tmp_path / "7" / HEAD)
    (tmp_path / "7" / HEAD).mkdir()
    with pytest.raises(UnsafeLog):
        read_log(tmp_path, 7, 1, key=KEY)


def test_a_job_directory_that_leads_outside_the_store_is_refused(tmp_path):
    """The job's directory replaced by a link to another job's (or anywhere): nothing is read through it."""
    store, elsewhere = tmp_path / "logs", tmp_path / "elsewhere"
    _write(elsewhere, b"secret\n", job=8)
    store.mkdir()
    (store / "7").symlink_to(elsewhere / "8")
    with pytest.raises(UnsafeLog):
        read_log(store, 7, 1, key=KEY)
    with pytest.raises(UnsafeLog):
        AttemptLogWriter(store, 7, 1, CAP, key=KEY)  # nor is anything written through it


def test_the_writer_does_not_write_through_a_symlinked_log(tmp_path):
    (tmp_path / "7").mkdir()
    target = tmp_path / "target"
    target.write_bytes(b"")
    (tmp_path / "7" / HEAD).symlink_to(target)
    writer = AttemptLogWriter(tmp_path, 7, 1, CAP, key=KEY)
    with pytest.raises(OSError):
        writer.write(b"x")
    writer.close()
    assert target.read_bytes() == b""


def test_a_cap_below_the_smallest_is_refused(tmp_path):
    with pytest.raises(ValueError, match="at least"):
        AttemptLogWriter(tmp_path, 7, 1, logstore.MIN_MAX_BYTES - 1, key=KEY)


OTHER = "fedcba9876543210"


def test_the_log_key_names_the_files_and_each_key_reads_only_its_own_log(tmp_path):
    """The same job id and attempt number with another key (an id given out again after a restore)
    or none (an attempt from before keys): three logs, each read only with its own key."""
    _write(tmp_path, b"the discarded job\n", key=OTHER)
    _write(tmp_path, b"from before keys\n", key=None)
    _write(tmp_path, b"the new job\n")
    assert {p.name for p in (tmp_path / "7").iterdir()} == {"attempt-1.log", HEAD, f"attempt-1-{OTHER}.log"}
    assert b"".join(iter_log(tmp_path, 7, 1, key=KEY)) == b"the new job\n"
    assert b"".join(iter_log(tmp_path, 7, 1, key=OTHER)) == b"the discarded job\n"
    assert b"".join(iter_log(tmp_path, 7, 1, key=None)) == b"from before keys\n"
    assert read_log(tmp_path, 7, 1, key="0000000000000000") is None
    assert logstore.head_path(tmp_path, 7, 1, key=KEY) == tmp_path / "7" / HEAD


def test_the_tail_parts_of_one_key_are_not_taken_for_another_keys(tmp_path):
    _write(tmp_path, _lines(0, 20_000), key=OTHER)  # rotated: a head and tail parts
    _write(tmp_path, b"short\n")
    piece = read_log(tmp_path, 7, 1, key=KEY)
    assert (piece.data, piece.size, piece.dropped) == (b"short\n", 6, 0)


@pytest.mark.parametrize("key", ["../../etc", "0123456789ABCDEF", "0123456789abcde", "0123456789abcdef0", ""])
def test_a_key_that_is_not_16_lowercase_hex_digits_names_no_file(tmp_path, key):
    with pytest.raises(ValueError, match="16 lowercase hex digits"):
        AttemptLogWriter(tmp_path, 7, 1, CAP, key=key)
    with pytest.raises(ValueError, match="16 lowercase hex digits"):
        read_log(tmp_path, 7, 1, key=key)
    assert not (tmp_path / "7").exists()


def test_new_keys_are_16_hex_digits_and_differ():
    keys = {logstore.new_key() for _ in range(100)}
    assert len(keys) == 100 and all(logstore.attempt_stem(1, k) == f"attempt-1-{k}" for k in keys)


def test_the_store_is_listed_by_job_attempt_and_key_and_other_files_are_left_out(tmp_path):
    writer = AttemptLogWriter(tmp_path, 7, 2, CAP, key=KEY, shared=True)  # with its lock file
    writer.write(b"x" * 100)
    writer.close()
    _write(tmp_path, b"old\n", key=None)
    (tmp_path / "7" / "notes.txt").write_text("an operator's")
    (tmp_path / "7" / f"attempt-1-{OTHER}.k8s-cursor").write_text("{}")
    (tmp_path / "007").mkdir()  # not a job's directory name
    (tmp_path / "lost+found").mkdir()
    (tmp_path / "9").write_text("a file, not a directory")
    (tmp_path / "10").symlink_to(tmp_path / "7")  # a link is not a job's directory
    assert logstore.stored_job_ids(tmp_path) == [7]
    assert logstore.stored_job_ids(tmp_path / "missing") == []
    found = {(a.attempt, a.key): a for a in logstore.stored_attempts(tmp_path, 7)}
    assert set(found) == {(1, None), (1, OTHER), (2, KEY)}
    assert found[(2, KEY)].names == (f"attempt-2-{KEY}.log", f"attempt-2-{KEY}.log.lock")
    assert found[(2, KEY)].size_bytes == 100 and found[(1, None)].names == ("attempt-1.log",)
    assert logstore.stored_attempts(tmp_path, 8) == []


def test_removing_an_orphan_takes_only_its_files_and_follows_no_link(tmp_path):
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep me\n")
    store = tmp_path / "logs"
    _write(store, _lines(0, 20_000), key=OTHER)
    part = next(p for p in (store / "7").iterdir() if p.name.startswith(f"attempt-1-{OTHER}.log."))
    part.unlink()
    part.symlink_to(outside)  # removed as the link it is
    _write(store, b"kept\n")
    [orphan] = [a for a in logstore.stored_attempts(store, 7) if a.key == OTHER]
    logstore.remove_attempt(store, orphan, remove_empty_dir=True)
    assert sorted(p.name for p in (store / "7").iterdir()) == [HEAD]  # the directory stays: not empty
    assert outside.read_bytes() == b"keep me\n"
    [kept] = logstore.stored_attempts(store, 7)
    logstore.remove_attempt(store, kept, remove_empty_dir=True)
    assert not (store / "7").exists()


def test_a_writer_whose_directory_went_while_it_had_written_nothing_makes_it_again(tmp_path):
    """The janitor removes the emptied directory of a job id whose old logs were orphans; a new
    attempt of that id may have opened its writer already."""
    writer = AttemptLogWriter(tmp_path, 7, 1, CAP, key=KEY)
    (tmp_path / "7").rmdir()
    writer.write(b"still here\n")
    writer.close()
    assert b"".join(iter_log(tmp_path, 7, 1, key=KEY)) == b"still here\n"


def test_a_full_volume_drops_output_counts_it_and_says_where_it_was_cut_once_there_is_room(tmp_path):
    from full_volume import fill, tmpfs

    with tmpfs(tmp_path / "vol", "1m") as vol:
        said: list[str] = []
        log = CuttingLog(lambda: AttemptLogWriter(vol, 7, 1, CAP, key=KEY), said.append)
        log.write(b"before\n")
        filler = fill(vol)
        log.write(b"x" * 100_000)  # what fits the head's last page is stored, the rest dropped
        log.write(b"y" * 5000)
        stored = read_log(vol, 7, 1, key=KEY)
        assert log.cut and log.dropped_bytes == 100_000 + 5000 - (stored.size - len(b"before\n"))
        assert stored.size == _stored_bytes(vol)  # offsets are what reached the files, after a short write too
        dropped = log.dropped_bytes
        filler.unlink()
        log.write(b"after\n")
        log.close()
        whole = b"".join(iter_log(vol, 7, 1, key=KEY))
    assert whole.startswith(b"before\nxxx")
    assert whole.endswith(f"x\n[dlts] {dropped} bytes of output were not stored here: No space left on device\n"
                          "after\n".encode())
    assert not log.cut and log.dropped_bytes == dropped
    assert said == ["cannot store the job's output (No space left on device): dropping it until the log volume has room",
                    f"storing the job's output again; {dropped} bytes of it were not stored (No space left on device)"]


def test_output_dropped_to_the_end_is_counted_for_the_exit_record(tmp_path):
    from full_volume import fill, tmpfs

    with tmpfs(tmp_path / "vol", "1m") as vol:
        log = CuttingLog(lambda: AttemptLogWriter(vol, 7, 1, CAP, key=KEY))
        log.write(b"before\n")
        fill(vol)
        log.write(b"z" * 50_000)
        log.close()  # no room for the line either: the count is all there is
        assert log.cut and log.dropped_bytes > 40_000 and log.reason == "No space left on device"
        assert b"[dlts]" not in b"".join(iter_log(vol, 7, 1, key=KEY))
