"""An open that fails changes nothing; recovery never cuts what validates.

A writable open reads every file and decides what recovery will do before
it writes anything (``abort`` included). An open that raises up to there
leaves the directory byte-identical, so trying again sees exactly what the
first try saw. Damage a crash cannot have caused — in data the checkpoint
counts as flushed, or in a segment before the ones being written, with
records that validate behind it — is refused with CorruptedFileError naming
the file and offset and pointing to ``rmqstore salvage``; a read-only open
reads around it and reports it.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rmqstore import ConfigError, CorruptedFileError, Message, MessageStore, StoreConfig, StoreLockedError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FS = 8192
CFG = StoreConfig(mapped_file_size_commit_log=FS, mapped_file_size_consume_queue=400, max_hash_slot_num=16,
                  max_index_num=64, clean_service_enable=False)
QUEUES = 3


def build(root, n=200) -> list:
    """A closed store of several segments: ``[(physical offset, queue id,
    queue offset, key, body)]`` of its messages."""
    out = []
    with MessageStore.open(root, CFG) as s:
        for i in range(n):
            body = b"m%04d-" % i + bytes(range(i % 97)) * 2
            r = s.put_message(Message("T", body, queue_id=i % QUEUES, keys=f"k{i}"))
            out.append((r.wrote_offset, i % QUEUES, r.queue_offset, f"k{i}", body))
    assert len(os.listdir(root / "commitlog")) >= n // 40
    return out


def files_of(root) -> dict:
    """Every entry under *root* (directories too): its bytes, or a marker."""
    out = {}
    for d, dirs, names in os.walk(root):
        for n in dirs:
            out[os.path.relpath(os.path.join(d, n), root)] = "dir"
        for n in names:
            p = os.path.join(d, n)
            out[os.path.relpath(p, root)] = ("link", os.readlink(p)) if os.path.islink(p) else Path(p).read_bytes()
    return out


def flip_body_byte(root, phy) -> None:
    path = root / "commitlog" / f"{phy - phy % FS:020d}"
    pos = phy % FS + 100  # inside the body (header 88 bytes + a few)
    data = bytearray(path.read_bytes())
    data[pos] ^= 0x40
    path.write_bytes(bytes(data))


def every_valid_message_is_there(root, msgs, bad) -> None:
    with MessageStore.open(root, read_only=True) as ro:
        for phy, qid, qoff, key, body in msgs:
            m = ro.get_message(phy)
            if phy == bad:
                assert m is None
                continue
            assert m is not None and m.body == body and m.keys == key
            assert [x.body for x in ro.get_messages("T", qid, qoff, 1).messages] == [body]


def refused_twice(root, match) -> CorruptedFileError:
    before = files_of(root)
    errors = []
    for _ in range(2):
        with pytest.raises(CorruptedFileError, match=match) as ei:
            MessageStore.open(root, CFG)
        errors.append(ei.value)
        assert files_of(root) == before  # no abort, no index file, not a byte
    assert (errors[0].path, errors[0].offset) == (errors[1].path, errors[1].offset)
    assert "rmqstore salvage" in str(errors[0])
    return errors[0]


def test_a_flipped_byte_in_an_old_segment_with_the_index_deleted(tmp_path):
    """The index must be rebuilt from the CommitLog, and a record it must be
    rebuilt from does not validate: two writable opens refuse, changing
    nothing (before, the first wrote abort and half an index, and the
    second, a crash recovery, cut the CommitLog there); a read-only open
    has every other message."""
    root = tmp_path / "s"
    msgs = build(root)
    bad = next(m for m in msgs if m[0] // FS == 1)[0]  # segment 1 of 5 or more
    flip_body_byte(root, bad)
    shutil.rmtree(root / "index")
    e = refused_twice(root, "index lacks")
    assert e.path.endswith(f"{FS:020d}") and e.offset == bad % FS
    assert not (root / "index").exists() and not (root / "abort").exists()
    every_valid_message_is_there(root, msgs, bad)


@pytest.mark.parametrize("where", ["last", "middle"])
def test_flushed_data_with_records_behind_the_damage(tmp_path, where):
    """A closed store: everything is flushed (the checkpoint says where), so a
    damaged record recovery scans is the disk's damage wherever it lies."""
    root = tmp_path / "s"
    msgs = build(root)
    segments = sorted({m[0] // FS for m in msgs})
    seg = {"last": segments[-1], "middle": segments[-2]}[where]
    bad = [m for m in msgs if m[0] // FS == seg][1][0]
    flip_body_byte(root, bad)
    refused_twice(root, "records that validate follow")
    every_valid_message_is_there(root, msgs, bad)
    with MessageStore.open(root, read_only=True) as ro:
        assert [d["physical_offset"] for d in ro.recovery_report["damage"]] == [bad]
        assert [m.physical_offset for m in ro.iter_messages()] == [m[0] for m in msgs if m[0] != bad]


def test_damage_recovery_does_not_scan_is_left_alone(tmp_path):
    """Recovery scans the last three segments (RocketMQ's normal recovery):
    damage in an older one is not cut, nor is anything else; the store
    opens for writing and only that record is unreadable."""
    root = tmp_path / "s"
    msgs = build(root)
    bad = next(m for m in msgs if m[0] // FS == 1)[0]
    flip_body_byte(root, bad)
    with MessageStore.open(root, CFG) as s:
        assert s.recovery_report["truncated_bytes"] == 0
        s.put_message(Message("T", b"after", queue_id=0))
    every_valid_message_is_there(root, msgs, bad)


def test_a_torn_end_after_a_crash_is_still_cut(tmp_path):
    """Where a crash tears (past the last complete flush, in the last
    segment, nothing valid behind): recovery cuts, as RocketMQ does."""
    root = tmp_path / "s"
    s = MessageStore.open(root, CFG)
    for i in range(30):
        s.put_message(Message("T", b"x%d" % i, queue_id=0))
    s.flush()
    last = [s.put_message(Message("T", b"y%d" % i, queue_id=0)) for i in range(3)]
    s._crash()
    path = root / "commitlog" / f"{last[1].wrote_offset - last[1].wrote_offset % FS:020d}"
    data = bytearray(path.read_bytes())
    pos = last[1].wrote_offset % FS
    data[pos:] = bytes(len(data) - pos)  # the last two records never reached the disk
    path.write_bytes(bytes(data))
    with MessageStore.open(root, CFG) as s:
        assert s.max_physical_offset == last[1].wrote_offset
        assert [m.body for m in s.get_messages("T", 0, 30, 10).messages] == [b"y0"]


def test_failures_before_the_first_write_change_nothing(tmp_path):
    """Other ways an open fails while reading: each leaves the directory
    byte-identical, leftovers a crash made (an empty segment, a half-made
    index file) included."""
    root = tmp_path / "s"
    build(root, n=60)
    (root / "commitlog" / f"{10 * FS:020d}").write_bytes(b"")  # a creation a crash interrupted
    (root / "index" / "20990101000000000.tmp").write_bytes(b"half")
    before = files_of(root)
    with pytest.raises(ConfigError):  # a config that disagrees with the files
        MessageStore.open(root, StoreConfig(mapped_file_size_commit_log=2 * FS))
    assert files_of(root) == before
    seg = root / "commitlog" / f"{FS:020d}"
    whole = seg.read_bytes()
    seg.write_bytes(whole[: FS // 2])  # a segment of the wrong size
    before = files_of(root)
    with pytest.raises(CorruptedFileError):
        MessageStore.open(root, CFG)
    assert files_of(root) == before
    seg.write_bytes(whole)
    # a writer in another process, with no files made ahead: its own service
    # thread would change the directory while the refused open is checked
    cfg = dict(mapped_file_size_commit_log=FS, mapped_file_size_consume_queue=400, max_hash_slot_num=16,
               max_index_num=64, clean_service_enable=False, make_files_ahead=False)
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from rmqstore import MessageStore, StoreConfig
            s = MessageStore.open({str(root)!r}, StoreConfig(**{cfg!r}))
            print("open", flush=True)
            sys.stdin.read()
            s.close()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")),
    )
    try:
        assert child.stdout.readline().strip() == "open"
        before = files_of(root)
        with pytest.raises(StoreLockedError):
            MessageStore.open(root, CFG)
        assert files_of(root) == before
    finally:
        child.stdin.close()
        child.wait(30)


def test_a_file_where_the_queues_directory_goes_is_refused_before_any_write(tmp_path):
    """The open makes ``consumequeue/`` (after its first write): a file in
    its place is refused while the open still only reads."""
    root = tmp_path / "s"
    root.mkdir()
    (root / "consumequeue").write_bytes(b"not a directory")
    with pytest.raises(CorruptedFileError, match="ConsumeQueue directory"):
        MessageStore.open(root, CFG)
    assert not (root / "abort").exists() and not (root / "commitlog").exists()
    assert (root / "consumequeue").read_bytes() == b"not a directory"
    (root / "consumequeue").unlink()
    with MessageStore.open(root, CFG):
        assert (root / "consumequeue").is_dir()  # (made at open, before any put)


def test_out_of_descriptors_while_mapping_changes_nothing(tmp_path):
    root = tmp_path / "s"
    build(root, n=60)
    before = files_of(root)
    code = textwrap.dedent(f"""
        import json, os, resource
        from rmqstore import MessageStore, StoreConfig
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        top = max(int(n) for n in os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (top + 4, hard))
        try:
            MessageStore.open({str(root)!r}, StoreConfig(mapped_file_size_commit_log={FS},
                mapped_file_size_consume_queue=400, max_hash_slot_num=16, max_index_num=64))
            print(json.dumps(None))
        except OSError as e:
            print(json.dumps(e.errno))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == errno.EMFILE
    assert files_of(root) == before


def test_a_failure_after_the_first_write_is_a_crash_the_next_open_recovers(tmp_path, monkeypatch):
    """The index cannot be rebuilt (no room for an index file): the open
    fails after it began writing, so abort stays, and the next open, once
    there is room, recovers everything."""
    import rmqstore.storage.index as index_mod
    from rmqstore import DiskFullError

    root = tmp_path / "s"
    msgs = build(root)
    shutil.rmtree(root / "index")

    def no_room(fd, size, path):
        raise DiskFullError(errno.ENOSPC, "simulated: no space left on device", path)

    with monkeypatch.context() as mp:
        mp.setattr(index_mod, "allocate_file", no_room)
        with pytest.raises(DiskFullError):
            MessageStore.open(root, CFG)
    assert (root / "abort").exists()
    with MessageStore.open(root, CFG) as s:
        assert not s.last_exit_ok and s.recovery_report["truncated_bytes"] == 0
        for _phy, _qid, _qoff, key, body in msgs:
            assert [m.body for m in s.query_messages("T", key)] == [body]
