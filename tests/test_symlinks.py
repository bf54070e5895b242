"""Nothing is written outside the store.

No file the store creates, truncates or replaces (``abort``, ``lock``,
``checkpoint``, ``config/*.json``, their temporaries, segments, index files)
and no directory it writes into is reached through a symbolic link: a link
planted in a store directory makes a writable open (or the write that would
follow it) refuse with CorruptedFileError, and its target is left as it was.
"""

from __future__ import annotations

import os

import pytest

from rmqstore import CorruptedFileError, Message, MessageStore, StoreConfig

CFG = StoreConfig(mapped_file_size_commit_log=16 * 1024, mapped_file_size_consume_queue=400,
                  max_hash_slot_num=16, max_index_num=64, clean_service_enable=False)


def make_store(root) -> None:
    with MessageStore.open(root, CFG) as s:
        for i in range(10):
            s.put_message(Message("T", b"m%d" % i, keys=f"k{i}"))
        s.commit_offset("g", "T", 0, 3)


@pytest.fixture
def victim(tmp_path):
    """A file and a directory outside the store that must never change."""
    f = tmp_path / "victim-file"
    f.write_bytes(b"precious" * 4096)
    d = tmp_path / "victim-dir"
    d.mkdir()
    (d / "keep").write_bytes(b"keep")
    return f, d


def untouched(victim) -> None:
    f, d = victim
    assert f.read_bytes() == b"precious" * 4096
    assert sorted(os.listdir(d)) == ["keep"] and (d / "keep").read_bytes() == b"keep"


def plant(path, target) -> None:
    if path.is_dir() and not path.is_symlink():
        import shutil

        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    os.symlink(target, path)


@pytest.mark.parametrize("name", ["abort", "lock", "checkpoint"])
def test_a_link_in_place_of_a_store_file_refuses_the_open(tmp_path, victim, name):
    root = tmp_path / "s"
    make_store(root)
    plant(root / name, victim[0])
    with pytest.raises(CorruptedFileError, match="symbolic link") as ei:
        MessageStore.open(root, CFG)
    assert ei.value.path.endswith(name)
    untouched(victim)
    with MessageStore.open(root, read_only=True) as ro:  # reading never writes: a read-only open is fine
        assert len(list(ro.iter_messages())) == 10


@pytest.mark.parametrize("name", ["commitlog", "consumequeue", "index", "config"])
def test_a_link_in_place_of_a_store_directory_refuses_the_open(tmp_path, victim, name):
    root = tmp_path / "s"
    make_store(root)
    plant(root / name, victim[1])
    with pytest.raises(CorruptedFileError, match="symbolic link"):
        MessageStore.open(root, CFG)
    untouched(victim)


def test_a_link_in_place_of_a_segment_or_an_index_file(tmp_path, victim):
    root = tmp_path / "s"
    make_store(root)
    seg = sorted((root / "commitlog").iterdir())[0]
    victim[0].write_bytes(seg.read_bytes())
    plant(seg, victim[0])
    before = victim[0].read_bytes()
    with pytest.raises(CorruptedFileError, match="symbolic link"):
        MessageStore.open(root, CFG)
    assert victim[0].read_bytes() == before
    os.unlink(seg)
    os.rename(victim[0], seg)
    index = sorted((root / "index").iterdir())[0]
    copy = tmp_path / "index-copy"
    copy.write_bytes(index.read_bytes())
    plant(index, copy)
    before = copy.read_bytes()
    with pytest.raises(CorruptedFileError, match="symbolic link"):
        MessageStore.open(root, CFG)
    assert copy.read_bytes() == before


def test_a_link_in_place_of_a_topic_or_queue_directory(tmp_path, victim):
    """A linked topic directory is skipped when the store loads (with a
    warning), and a put to that topic refuses before it writes."""
    root = tmp_path / "s"
    make_store(root)
    os.symlink(victim[1], root / "consumequeue" / "Linked")
    os.makedirs(root / "consumequeue" / "Half")
    os.symlink(victim[1], root / "consumequeue" / "Half" / "0")
    with MessageStore.open(root, CFG) as s:
        assert s.queues() == [("T", 0)]
        end = s.max_physical_offset
        for topic in ("Linked", "Half"):
            with pytest.raises(CorruptedFileError, match="symbolic link"):
                s.put_message(Message(topic, b"x"))
            assert s.max_physical_offset == end
        s.put_message(Message("T", b"goes on"))
    untouched(victim)


@pytest.mark.parametrize("name", ["consumerOffset.json", "consumerOffset.json.bak", "consumerOffset.json.tmp"])
def test_a_link_in_place_of_the_consumer_offsets(tmp_path, victim, name):
    """A commit either refuses (CorruptedFileError) or replaces the link by a
    file of the store's own; it never writes through it."""
    root = tmp_path / "s"
    make_store(root)
    plant(root / "config" / name, victim[0])
    with MessageStore.open(root, CFG) as s:
        try:
            s.commit_offset("g", "T", 0, 5)
        except CorruptedFileError:
            pass
    untouched(victim)
