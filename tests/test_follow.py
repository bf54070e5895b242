"""Many processes: a read-only store opened beside a running writer (follow
mode) sees what the writer dispatches afterwards — new units, queues, and
CommitLog / ConsumeQueue / index files — never a half-written record or unit,
and forgets files the writer's clean-up deleted. Also the ``tail`` and
``clean`` commands."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import pytest

from conftest import no_hang
from rmqstore import GetMessageStatus, Message, MessageStore, StoreConfig
from rmqstore.cli import main as cli_main

REPO = pathlib.Path(__file__).resolve().parent.parent
TOPIC = "FollowTopic"
CFG = StoreConfig(
    mapped_file_size_commit_log=8192,
    mapped_file_size_consume_queue=200,
    max_hash_slot_num=64,
    max_index_num=40,
    clean_service_enable=False,
    delete_commit_log_files_interval=0,
    delete_consume_queue_files_interval=0,
)


def body_of(i: int) -> bytes:
    return (f"follow-{i:06d}|".encode() * 10)[: 60 + i % 97]


def put(w, i, topic=TOPIC, queues=3):
    return w.put_message(Message(topic, body_of(i), queue_id=i % queues, keys=f"k{i}"))


def drain(ro, topic, queue_id, offset=0):
    out = []
    while True:
        r = ro.get_messages(topic, queue_id, offset, 64)
        if not r.messages:
            return out, r
        out.extend(r.messages)
        offset = r.next_begin_offset


def child_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_reader_sees_new_units_queues_and_files(tmp_path):
    with MessageStore.open(tmp_path, config=CFG) as w:
        put(w, 0)
        with MessageStore.open(tmp_path, read_only=True) as ro:
            assert ro.get_max_offset_in_queue(TOPIC, 0) == 1
            r = ro.get_messages(TOPIC, 1, 0, 10)
            assert r.status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE  # not created yet
            for i in range(1, 400):  # many CommitLog, ConsumeQueue and index files
                put(w, i)
            assert len(os.listdir(tmp_path / "commitlog")) > 5
            for q in range(3):
                got, last = drain(ro, TOPIC, q)
                assert [m.body for m in got] == [body_of(i) for i in range(q, 400, 3)]
                assert last.status is GetMessageStatus.OFFSET_OVERFLOW_ONE
                assert ro.get_max_offset_in_queue(TOPIC, q) == w.get_max_offset_in_queue(TOPIC, q)
            # a queue of a topic created after the reader opened
            put(w, 0, topic="LaterTopic", queues=1)
            assert ro.get_messages("LaterTopic", 0, 0, 5).messages[0].body == body_of(0)
            # index files created after the reader opened: picked up by refresh()
            ro.refresh()
            assert ro.max_physical_offset == w.max_physical_offset
            assert [m.body for m in ro.query_messages(TOPIC, "k399")] == [body_of(399)]
            assert len(ro.index.files) == len(w.index.files)


def test_reader_never_sees_a_half_written_record_or_unit(tmp_path):
    """The writer stores a record's TOTALSIZE/magic and a unit's size last:
    until then a reader must not take them in. Simulated by hiding those
    bytes of a just-written message from the reader, then restoring them."""
    with MessageStore.open(tmp_path, config=CFG) as w:
        put(w, 0)
        with MessageStore.open(tmp_path, read_only=True) as ro:
            assert ro.get_max_offset_in_queue(TOPIC, 0) == 1
            for hide in ("record header", "unit size"):
                r = put(w, 3 if hide == "record header" else 6)
                if hide == "record header":
                    mf = w.commitlog.queue.last
                    span = slice(r.wrote_offset - mf.file_from_offset, r.wrote_offset - mf.file_from_offset + 8)
                else:
                    mf = w.consume_queue(TOPIC, 0).queue.last
                    p = r.queue_offset * 20 - mf.file_from_offset
                    span = slice(p + 8, p + 12)
                saved = bytes(mf.mm[span])
                mf.mm[span] = bytes(len(saved))
                assert ro.get_max_offset_in_queue(TOPIC, 0) == r.queue_offset, hide
                got = ro.get_messages(TOPIC, 0, r.queue_offset, 5)
                assert got.messages == [] and got.status is GetMessageStatus.OFFSET_OVERFLOW_ONE, hide
                mf.mm[span] = saved  # the writer's last store
                assert ro.get_max_offset_in_queue(TOPIC, 0) == r.queue_offset + 1, hide
                assert [m.body for m in ro.get_messages(TOPIC, 0, r.queue_offset, 5).messages] == [
                    body_of(3 if hide == "record header" else 6)
                ]


@pytest.mark.parametrize("ended", ["crashed", "closed"])
def test_read_only_store_and_a_corrupt_record(tmp_path, ended):
    """Where a crash tears (nothing flushed yet) recovery cuts at a corrupt
    record, and the reader does not follow past it; in flushed data (a
    closed store) it is the disk's damage, which the reader reads around."""
    w = MessageStore.open(tmp_path, config=CFG)
    rs = [put(w, i) for i in range(9)]
    if ended == "crashed":
        w._crash()
        with open(tmp_path / "checkpoint", "r+b") as fh:  # the crash came before any complete flush
            fh.seek(32)
            fh.write(bytes(8))
    else:
        w.close()
    # flip a body byte of message 4 (queue 1, offset 1)
    bad = rs[4]
    path = tmp_path / "commitlog" / f"{bad.wrote_offset - bad.wrote_offset % 8192:020d}"
    with open(path, "r+b") as fh:
        fh.seek(bad.wrote_offset % 8192 + 88 + 5)  # the body starts after 84 + 4 bytes (IPv4 hosts)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0xFF]))
    with MessageStore.open(tmp_path, read_only=True) as ro:
        if ended == "crashed":
            assert ro.max_physical_offset == bad.wrote_offset
            assert ro.get_max_offset_in_queue(TOPIC, 1) == 1  # later units stay out
            assert ro.refresh() is False
            assert [m.body for m in ro.get_messages(TOPIC, 1, 0, 10).messages] == [body_of(1)]
        else:
            assert [d["physical_offset"] for d in ro.recovery_report["damage"]] == [bad.wrote_offset]
            assert ro.max_physical_offset == rs[-1].wrote_offset + rs[-1].wrote_bytes
            assert ro.get_message(bad.wrote_offset) is None
            assert [m.physical_offset for m in ro.iter_messages()] == [r.wrote_offset for r in rs if r is not bad]
            assert ro.refresh() is False


def test_reader_forgets_files_the_writer_deleted(tmp_path):
    with MessageStore.open(tmp_path, config=CFG) as w:
        for i in range(300):
            put(w, i)
        with MessageStore.open(tmp_path, read_only=True) as ro:
            n_files = len(ro.commitlog.queue.files)
            rep = w.delete_expired(force=True)
            assert rep.deleted >= 5
            # until it looks, the reader still reads its mapped (unlinked) copies
            assert ro.get_messages(TOPIC, 0, 0, 1).messages[0].body == body_of(0)
            ro.refresh()
            assert len(ro.commitlog.queue.files) == n_files - rep.deleted
            assert ro.min_physical_offset == w.min_physical_offset
            for q in range(3):
                mn = w.get_min_offset_in_queue(TOPIC, q)
                assert ro.get_min_offset_in_queue(TOPIC, q) == mn > 0
                r = ro.get_messages(TOPIC, q, 0, 5)
                assert r.status is GetMessageStatus.OFFSET_TOO_SMALL and r.next_begin_offset == mn
                got, _ = drain(ro, TOPIC, q, mn)
                assert got[0].body == body_of(mn * 3 + q)
            assert len(ro.index.files) == len(w.index.files)


def test_long_polling_in_a_read_only_store_polls(tmp_path):
    with MessageStore.open(tmp_path, config=CFG) as w:
        put(w, 0)
        with MessageStore.open(tmp_path, read_only=True) as ro:
            t = time.monotonic()
            r = ro.get_messages(TOPIC, 0, 1, 10, wait_ms=150)
            assert r.messages == [] and time.monotonic() - t >= 0.15
            timer = threading.Timer(0.2, put, args=(w, 3))
            timer.start()
            try:
                with no_hang(20):
                    r = ro.get_messages(TOPIC, 0, 1, 10, wait_ms=10_000)
            finally:
                timer.join()
            assert [m.body for m in r.messages] == [body_of(3)]


WRITER = r"""
import sys, time
from rmqstore import Message, MessageStore, StoreConfig
cfg = StoreConfig(mapped_file_size_commit_log=8192, mapped_file_size_consume_queue=200,
                  max_hash_slot_num=64, max_index_num=40, clean_service_enable=False)
root, n = sys.argv[1], int(sys.argv[2])
with MessageStore.open(root, config=cfg) as w:
    print("ready", flush=True)
    sys.stdin.readline()
    for i in range(n):
        body = (f"follow-{i:06d}|".encode() * 10)[: 60 + i % 97]
        w.put_message(Message("FollowTopic", body, queue_id=i % 3, keys=f"k{i}"))
        if i % 50 == 0:
            time.sleep(0.01)
print("done", flush=True)
"""


def test_reader_follows_a_writer_process(tmp_path):
    n = 1500
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(n)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert p.stdout.readline().strip() == "ready"
        got: dict = {0: [], 1: [], 2: []}
        offs = {0: 0, 1: 0, 2: 0}
        with MessageStore.open(tmp_path, read_only=True) as ro:
            p.stdin.write("go\n")
            p.stdin.flush()
            with no_hang(120):
                while sum(len(v) for v in got.values()) < n:
                    for q in range(3):
                        r = ro.get_messages(TOPIC, q, offs[q], 32, wait_ms=20)
                        got[q].extend(m.body for m in r.messages)
                        if r.messages:
                            offs[q] = r.next_begin_offset
        for q in range(3):
            assert got[q] == [body_of(i) for i in range(q, n, 3)]
        assert p.wait(60) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_cli_tail_prints_new_messages(tmp_path, capsys, monkeypatch):
    import types

    import rmqstore.cli as cli

    # the tail's first pause says it has taken its start positions: the new
    # messages are put after that, however slow its open is on a busy machine
    started = threading.Event()

    def sleep(seconds):
        started.set()
        time.sleep(seconds)

    monkeypatch.setattr(cli, "time", types.SimpleNamespace(monotonic=time.monotonic, time=time.time, sleep=sleep))
    with MessageStore.open(tmp_path, config=CFG) as w:
        for i in range(5):
            put(w, i)
        producer = threading.Thread(target=lambda: started.wait(30) and [put(w, i) for i in range(5, 12)])
        producer.start()
        try:
            with no_hang(30):
                rc = cli_main(["tail", str(tmp_path), "--topic", TOPIC, "--max", "7", "--timeout", "20",
                               "--interval", "10"])
        finally:
            producer.join()
    assert rc == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    # only messages stored after tail started, in per-queue order
    assert sorted(x["body"] for x in lines) == sorted(body_of(i).decode() for i in range(5, 12))


def test_cli_tail_from_beginning_one_queue_and_timeout(tmp_path, capsys):
    with MessageStore.open(tmp_path, config=CFG) as w:
        for i in range(9):
            put(w, i)
        rc = cli_main(["tail", str(tmp_path), "--topic", TOPIC, "--queue", "1", "--from-beginning",
                       "--timeout", "0.3", "--interval", "10"])
    assert rc == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["body"] for x in lines] == [body_of(i).decode() for i in (1, 4, 7)]


def test_cli_tail_ctrl_c_exits_cleanly(tmp_path):
    with MessageStore.open(tmp_path, config=CFG) as w:
        put(w, 0)
    import signal

    p = subprocess.Popen([sys.executable, "-m", "rmqstore", "tail", str(tmp_path), "--topic", TOPIC,
                          "--from-beginning"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=child_env())
    try:
        line = p.stdout.readline()
        assert json.loads(line)["body"] == body_of(0).decode()
        p.send_signal(signal.SIGINT)
        _out, err = p.communicate(timeout=30)
        assert p.returncode == 0 and "Traceback" not in err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_cli_clean(tmp_path, capsys):
    with MessageStore.open(tmp_path, config=CFG) as w:
        for i in range(700):
            put(w, i)
        assert cli_main(["clean", str(tmp_path), "--force"]) == 2  # the writer holds the lock
    names = sorted(os.listdir(tmp_path / "commitlog"))  # (after the close: without the segment made ahead)
    assert len(names) > 12
    assert cli_main(["clean", str(tmp_path)]) == 0  # nothing is 72 h old
    assert sorted(os.listdir(tmp_path / "commitlog")) == names
    capsys.readouterr()
    assert cli_main(["clean", str(tmp_path), "--force", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["deleted"] == min(10, len(names) - 1)
    assert [os.path.basename(p) for p in rep["commit_log_files"]] == names[: rep["deleted"]]
    assert rep["consume_queue_files"] and rep["index_files"]
    assert cli_main(["clean", str(tmp_path), "--reserved-hours", "0"]) == 0
    out = capsys.readouterr().out
    assert "deleted CommitLog" in out
    assert sorted(os.listdir(tmp_path / "commitlog")) == names[-1:]
    with MessageStore.open(tmp_path, read_only=True) as ro:
        assert ro.min_physical_offset == int(names[-1])
