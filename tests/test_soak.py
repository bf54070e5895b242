"""Bounded concurrency soak: a writer thread, reader threads, a reader
*process* in read-only follow mode and the clean-up all run together for
``RMQSTORE_SOAK_SECONDS`` (default 30) seconds; every message anyone reads is
byte-equal to what was written, queue offsets only move forward, and nobody
sees an error. Then file handles and mappings must not grow over 2,000 store
open/close cycles."""

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
from soak_reader import body_of

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
SOAK_SECONDS = float(os.environ.get("RMQSTORE_SOAK_SECONDS", "30"))
TOPIC = "SoakTopic"
QUEUES = 4
MAX_LIVE_FILES = 200  # CommitLog files (each with ~4 queue files): far below the open-files limit

CFG = StoreConfig(
    mapped_file_size_commit_log=64 * 1024,
    mapped_file_size_consume_queue=20 * 50,
    max_hash_slot_num=128,
    max_index_num=200,
    clean_service_enable=True,  # the background service, with a fake full-ish disk below
    clean_resource_initial_delay=0,
    clean_resource_interval=50,
    delete_commit_log_files_interval=5,
    delete_consume_queue_files_interval=0,
    disk_check_interval=50,
)


class HalfFullDisk:
    """87 % used: above the clean-forcibly level, below the refusal level, so
    the service deletes every non-current CommitLog file each round."""

    def __call__(self, path) -> float:
        return 0.87


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.slow
def test_soak_writer_readers_reader_process_and_cleanup(tmp_path):
    stop = threading.Event()
    errors: list = []
    counts = {"written": 0, "read": 0, "polls": 0}
    store = MessageStore.open(tmp_path, config=CFG, disk_usage=HalfFullDisk())
    argv = [sys.executable, str(HERE / "soak_reader.py"), str(tmp_path), str(SOAK_SECONDS), str(QUEUES)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())

    def writer():
        i = 0
        try:
            while not stop.is_set():
                # the clean-up deletes at most delete_file_batch_max files a round: a
                # writer that outruns it would grow the files (and handles) without bound
                if len(store.commitlog.queue.files) > MAX_LIVE_FILES:
                    time.sleep(0.005)
                    continue
                batch = [Message(TOPIC, body_of(j), queue_id=j % QUEUES, keys=str(j)) for j in range(i, i + 8)]
                if i % 16:
                    store.put_messages(batch)
                else:
                    for m in batch:
                        store.put_message(m)
                i += 8
                counts["written"] = i
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(("writer", repr(e)))

    def reader(q):
        off = 0
        try:
            while not stop.is_set():
                r = store.get_messages(TOPIC, q, off, 32, wait_ms=20)
                counts["polls"] += 1
                for m in r.messages:
                    i = int(m.keys)
                    if m.body != body_of(i) or i % QUEUES != q or m.queue_offset < off:
                        errors.append(("reader", q, i, m.queue_offset, off))
                        return
                    counts["read"] += 1
                if r.messages or r.status is GetMessageStatus.OFFSET_TOO_SMALL:
                    assert r.next_begin_offset >= off
                    off = r.next_begin_offset
                # keys and times while files go away under us
                for m in store.query_messages(TOPIC, str(off * QUEUES + q)):
                    if m.body != body_of(off * QUEUES + q):
                        errors.append(("key", q, off))
                store.get_offset_in_queue_by_time(TOPIC, q, int(time.time() * 1000) - 50)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(("reader", q, repr(e)))

    try:
        assert proc.stdout.readline().strip() == "ready"
        threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(q,)) for q in range(2)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        deleted_seen = 0
        with no_hang(SOAK_SECONDS + 120):
            while time.monotonic() - t0 < SOAK_SECONDS and not errors:
                time.sleep(0.2)
                names = os.listdir(tmp_path / "commitlog")
                deleted_seen = max(deleted_seen, min(int(n) for n in names) // CFG.mapped_file_size_commit_log)
            stop.set()
            for t in threads:
                t.join()
            out, err = proc.communicate(timeout=SOAK_SECONDS + 60)
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        store.close()
    assert errors == []
    assert proc.returncode == 0, err
    child = json.loads(out.strip().splitlines()[-1])
    assert child["bad"] == 0 and child["n_errors"] == 0, child
    assert child["seen"] > 0 and counts["read"] > 0
    assert deleted_seen > 0, "the clean-up service never deleted a CommitLog file"
    print(f"\nsoak {elapsed:.1f} s: wrote {counts['written']} ({counts['written'] / elapsed:.0f}/s), "
          f"threads read {counts['read']}, process read {child['seen']}, "
          f"{deleted_seen} CommitLog file(s) cleaned")
    # what is left is consistent
    with MessageStore.open(tmp_path, read_only=True) as ro:
        for q in range(QUEUES):
            mn, mx = ro.get_min_offset_in_queue(TOPIC, q), ro.get_max_offset_in_queue(TOPIC, q)
            r = ro.get_messages(TOPIC, q, mn, 10_000)
            assert all(m.body == body_of(int(m.keys)) for m in r.messages)
            assert mx == (counts["written"] - q + QUEUES - 1) // QUEUES


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _maps() -> int:
    with open("/proc/self/maps") as fh:
        return sum(1 for _ in fh)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc (Linux)")
def test_a_mapped_file_holds_one_descriptor_where_python_allows(tmp_path):
    """A store maps a file per queue, so descriptors count against ulimit -n:
    one per mapped file, as RocketMQ's FileChannel, on Python 3.13+ (mmap's
    trackfd=False); before 3.13 mmap keeps a copy of its own."""
    from rmqstore.storage.mapped_file import MappedFile

    before = _fds()
    files = [MappedFile(tmp_path / f"{i * 4096:020d}", 4096, create=True) for i in range(10)]
    try:
        per_file = (_fds() - before) / len(files)
        files[0].mm[:4] = b"abcd"
        files[0].wrote_position = 4
        assert files[0].flush()  # fdatasync on the one descriptor
    finally:
        for f in files:
            f.close()
    assert per_file == (1 if sys.version_info >= (3, 13) else 2)
    assert _fds() == before
    with open(tmp_path / f"{0:020d}", "rb") as fh:
        assert fh.read(4) == b"abcd"


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc (Linux)")
def test_handles_and_mappings_do_not_grow_over_2000_open_close_cycles(tmp_path):
    cfg = CFG.replace(clean_service_enable=True, clean_resource_initial_delay=60_000)
    with MessageStore.open(tmp_path, config=cfg) as s:
        for i in range(400):  # several files of every kind
            s.put_message(Message(TOPIC, body_of(i), queue_id=i % QUEUES, keys=str(i)))

    def cycle(n):
        if n % 2:
            with MessageStore.open(tmp_path, read_only=True) as ro:
                ro.get_messages(TOPIC, n % QUEUES, 0, 4)
                ro.refresh()
        else:
            with MessageStore.open(tmp_path, config=cfg) as w:
                w.put_message(Message(TOPIC, body_of(400 + n), queue_id=n % QUEUES, keys=str(400 + n)))
                w.get_messages(TOPIC, n % QUEUES, 0, 4)
                if n % 200 == 0:
                    w.delete_expired(force=True)

    for n in range(50):  # warm-up: caches, lazily created objects
        cycle(n)
    fds, maps = _fds(), _maps()
    with no_hang(900):
        for n in range(50, 2050):
            cycle(n)
    assert _fds() - fds <= 2, (fds, _fds())
    assert _maps() - maps <= 4, (maps, _maps())
