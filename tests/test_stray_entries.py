"""Entries of a store directory that are no store file are skipped.

Names of any alphabet (other scripts' digits, superscripts, a queue id with
leading zeros, names that are not UTF-8), files where directories belong
and directories where files belong never stop an open, ``rmqstore info`` or
``rmqstore verify``: each is skipped with a warning, and the store reads and
writes as before.
"""

from __future__ import annotations

import logging
import os

import pytest

from rmqstore import Message, MessageStore, StoreConfig
from rmqstore.cli import main
from rmqstore.tools import verify_store

CFG = StoreConfig(mapped_file_size_commit_log=16 * 1024, mapped_file_size_consume_queue=400,
                  max_hash_slot_num=16, max_index_num=64, clean_service_enable=False)

STRAY = {
    # (directory under the store, name, kind)
    "arabic digits segment": ("commitlog", "١٢٣", "file"),
    "superscript segment": ("commitlog", "²", "file"),
    "fullwidth digits segment": ("commitlog", "００００", "file"),
    "digits directory in commitlog": ("commitlog", "99999999999999999999", "dir"),
    "backup of a segment": ("commitlog", "00000000000000000000.bak", "file"),
    "fifo in commitlog": ("commitlog", "12345", "fifo"),
    "arabic digits index": ("index", "٢٠٢٤٠١٠١", "file"),
    "superscript index": ("index", "³", "file"),
    "queue id with leading zeros": ("consumequeue/T", "007", "dir"),
    "queue id of other digits": ("consumequeue/T", "٣", "dir"),
    "queue id past int32": ("consumequeue/T", "99999999999", "dir"),
    "file for a queue": ("consumequeue/T", "5", "file"),
    "file for a topic": ("consumequeue", "NotADir", "file"),
    "topic not UTF-8": ("consumequeue", b"\xff\xfe", "dir"),
    "queue file of other digits": ("consumequeue/T/0", "١", "file"),
    "empty name-like dotfile": ("consumequeue", ".hidden", "dir"),
}


def plant(root, where, name, kind) -> None:
    d = os.path.join(os.fsencode(str(root)), where.encode())
    path = os.path.join(d, name if isinstance(name, bytes) else name.encode())
    if kind == "file":
        with open(path, "wb") as fh:
            fh.write(b"not a store file" * 100)
    elif kind == "dir":
        os.mkdir(path)
        with open(os.path.join(path, b"00000000000000000000"), "wb") as fh:
            fh.write(b"\x01" * 400)
    else:
        os.mkfifo(path)


@pytest.mark.parametrize("case", sorted(STRAY))
def test_a_stray_entry_never_stops_an_open_info_or_verify(tmp_path, case, caplog, capsys):
    root = tmp_path / "s"
    with MessageStore.open(root, CFG) as s:
        for i in range(20):
            s.put_message(Message("T", b"m%d" % i, keys=f"k{i}"))
    plant(root, *STRAY[case])
    caplog.set_level(logging.WARNING)
    with MessageStore.open(root, read_only=True) as ro:
        assert [m.body for m in ro.iter_messages()] == [b"m%d" % i for i in range(20)]
        assert ro.queues() == [("T", 0)]
    with MessageStore.open(root, CFG) as s:
        assert s.queues() == [("T", 0)]
        r = s.put_message(Message("T", b"after", keys="ka"))
        assert r.queue_offset == 20
        assert [m.body for m in s.query_messages("T", "k7")] == [b"m7"]
    assert any("skipping" in r.getMessage() or "ignoring" in r.getMessage() for r in caplog.records), case
    assert main(["info", str(root)]) == 0
    capsys.readouterr()
    assert [p for p in verify_store(root) if p.severity == "error"] == []
