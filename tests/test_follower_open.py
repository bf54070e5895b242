"""Read-only opens beside a writer process that is busy writing keys.

The newest index file is live: its header counts, slots and entries change
while a follower opens the store (the writer puts the entry, then the slot,
then the header fields). Every open must succeed, infer the right index
geometry, and find a key written before it opened — with RocketMQ's default
index geometry (a 420 MB sparse file) and with a small one that rolls files
all the time.

``RMQSTORE_FOLLOWER_OPENS`` sets the number of opens of each case (default
500 with the compiled core, ~30 s a case; 60 in pure Python, whose opens
are ten times slower); every open is checked, and all run while the
writer writes.
"""

from __future__ import annotations

import mmap
import os
import pathlib
import struct
import subprocess
import sys

import pytest

from conftest import env_pure_python, no_hang
from rmqstore import Message, MessageStore, StoreConfig

REPO = pathlib.Path(__file__).resolve().parent.parent
# a read-only open scans the CommitLog's last segments, ~0.5 s each in pure Python
OPENS = int(os.environ.get("RMQSTORE_FOLLOWER_OPENS", "60" if env_pure_python() else "500"))
TOPIC = "FollowerTopic"

# the writer: keyed messages as fast as it asks (batches of 32, two keys
# each besides the unique key) until told to stop. It prints the physical
# offset of its first key once that is in the index, and after each batch
# writes the number of messages stored so far into the file "progress".
WRITER = r"""
import os, sys, time
from rmqstore import Message, MessageStore, StoreConfig
root, slots, entries, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
cfg = StoreConfig(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=300_000,
                  max_hash_slot_num=slots, max_index_num=entries, clean_service_enable=False)
progress = os.open(os.path.join(root, "progress"), os.O_RDWR | os.O_CREAT, 0o644)
with MessageStore.open(root, config=cfg) as w:
    r = w.put_message(Message("FollowerTopic", b"first", keys="first-key"))
    print(r.wrote_offset, flush=True)
    i = 0
    while not os.path.exists(os.path.join(root, "stop")):
        w.put_messages([Message("FollowerTopic", b"m%d" % j, queue_id=j % 4, keys=f"a{j} b{j % 977}")
                        for j in range(i, i + 32)])
        i += 32
        os.pwrite(progress, b"%12d" % i, 0)
        if pause:
            time.sleep(pause)
print(i, flush=True)
"""

# (slots, entries, writer's pause after each batch of 32 messages)
GEOMETRIES = {
    # RocketMQ's: one 420 MB sparse file whose header counts never stop changing
    "default": (5_000_000, 20_000_000, 0.002),
    # ~6700 records per file: files appear, fill up and go quiet; slots fill slowly
    "small": (4096, 20000, 0.001),
}


def _child_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_follower_opens_beside_a_busy_keyed_writer(tmp_path, geometry):
    slots, entries, pause = GEOMETRIES[geometry]
    root = tmp_path / "s"
    root.mkdir()
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(slots), str(entries), str(pause)],
                         stdout=subprocess.PIPE, text=True, env=_child_env())
    failures = []
    opened = 0
    try:
        with no_hang(60):
            first = int(p.stdout.readline())
        with no_hang(max(120.0, OPENS * 0.5)):
            while opened < OPENS:
                assert p.poll() is None, "the writer stopped before the opens were done"
                done = int((root / "progress").read_bytes() or b"0")  # messages stored before this open
                try:
                    with MessageStore.open(root, read_only=True) as ro:
                        assert (ro.index.hash_slot_num, ro.index.index_num) == (slots, entries)
                        assert ro.query_offsets(TOPIC, "first-key") == [first]
                        if done:
                            got = ro.query_messages(TOPIC, f"a{done - 1}")
                            assert [m.body for m in got] == [b"m%d" % (done - 1)], (done, got)
                except Exception as e:  # noqa: BLE001 - every failure counts; the first few are shown
                    failures.append(f"open {opened}: {type(e).__name__}: {e}")
                opened += 1
        (root / "stop").touch()
        with no_hang(60):
            written = int(p.stdout.readline())
        assert p.wait(60) == 0
    finally:
        (root / "stop").touch()
        if p.poll() is None:
            p.kill()
        p.wait()
    assert not failures, f"{len(failures)} of {opened} opens failed:\n" + "\n".join(failures[:5])
    assert written > 0  # the writer was writing keys throughout


# --- a put seen half done -------------------------------------------------------------------

# what a put writes, in the writer's order (a slot count only when the slot was free)
PUT_STEPS = ("entry", "slot", "slot_count", "index_count", "end_offset", "end_time")


def _half_done_put(old: bytes, new: bytes, s: int, count: int, key_hash: int, steps: int) -> bytes:
    """*old* with the first *steps* writes of the put that made *new* (``index_put``
    writes the entry, the slot, the slot count when the slot was free, the
    entry count, the end offset, the end time)."""
    entry = 40 + 4 * s + 20 * count
    slot = 40 + 4 * (key_hash % s)
    spans = {"entry": (entry, 20), "slot": (slot, 4), "slot_count": (32, 4), "index_count": (36, 4),
             "end_offset": (24, 8), "end_time": (8, 8)}
    out = bytearray(old)
    for name in PUT_STEPS[:steps]:
        at, size = spans[name]
        out[at : at + size] = new[at : at + size]
    return bytes(out)


@pytest.mark.parametrize("slot", ["free-slot", "used-slot"])
@pytest.mark.parametrize("steps", range(1, len(PUT_STEPS)), ids=[f"after-{n}" for n in PUT_STEPS[:-1]])
def test_follower_opens_beside_a_put_half_done(tmp_path, steps, slot):
    """A writer stopped inside a put, at each point between its writes: the
    newest index file's slots and header counts disagree for a moment (a slot
    naming an entry the count does not cover yet, one used slot more than
    the slot count). A read-only open infers the geometry all the same and
    finds the keys."""
    from rmqstore import _kernels as k
    from rmqstore.format.layout import INDEX_HEADER_SIZE

    s, n = 64, 100
    cfg = StoreConfig(mapped_file_size_commit_log=1 << 20, max_hash_slot_num=s, max_index_num=n)
    with MessageStore.open(tmp_path, cfg) as w:
        for i in range(12):
            w.put_message(Message(TOPIC, b"x%d" % i, keys=f"k{i}"))
        end = w.max_physical_offset
    (path,) = sorted((tmp_path / "index").iterdir())
    old = path.read_bytes()
    slot_count, count = struct.unpack_from(">ii", old, 32)
    slots = struct.unpack_from(f">{s}i", old, INDEX_HEADER_SIZE)
    # a key whose slot is free, or one whose slot is in use
    key = next(f"{TOPIC}#late{j}" for j in range(10_000)
               if (slots[k.index_key_hash(f"{TOPIC}#late{j}") % s] == 0) == (slot == "free-slot"))
    new = bytearray(old)
    assert k.index_put(new, s, n, key, end, 1_800_000_000_000)
    assert struct.unpack_from(">ii", new, 32) == (slot_count + (slot == "free-slot"), count + 1)
    path.write_bytes(_half_done_put(old, bytes(new), s, count, k.index_key_hash(key), steps))
    with MessageStore.open(tmp_path, read_only=True) as ro:
        assert (ro.index.hash_slot_num, ro.index.index_num) == (s, n)
        for i in range(12):
            assert [m.body for m in ro.query_messages(TOPIC, f"k{i}")] == [b"x%d" % i]


def test_a_live_index_file_is_read_again_before_it_counts_as_damaged(monkeypatch):
    """A live file (the newest, read-only) that fails the geometry check is
    read again before the check says no: a writer may move between two reads
    of one check. A file that fails every read, or a settled one, fails."""
    import rmqstore.storage.index_checks as checks

    answers = []
    monkeypatch.setattr(checks, "_LIVE_PAUSE", 0)
    monkeypatch.setattr(checks, "_fits_once", lambda path, s, n, live=False: answers.pop(0))
    answers[:] = [False, True]
    assert checks._geometry_fits("f", 8, 8, live=True) and answers == []
    answers[:] = [False, True]
    assert not checks._geometry_fits("f", 8, 8, live=False) and answers == [True]
    answers[:] = [False] * checks._LIVE_READS
    assert not checks._geometry_fits("f", 8, 8, live=True) and answers == []


# --- a lookup while another process puts keys ---------------------------------------------

# the writer: one slot, so every put moves the slot every lookup starts from;
# entry i is key k<i> at physical offset i, i seconds after the first; a put
# every ~10 us until the file is full
SLOT_WRITER = r"""
import mmap, sys, time
from rmqstore import _kernels as k
path, n = sys.argv[1], int(sys.argv[2])
with open(path, "r+b") as f:
    mm = mmap.mmap(f.fileno(), 0)
    print("ready", flush=True)
    for i in range(1, n):
        k.index_put(mm, 1, n, f"T#k{i}", i, 1_700_000_000_000 + 1000 * i)
        until = time.perf_counter() + 1e-5
        while time.perf_counter() < until:
            pass
"""


def test_a_lookup_finds_what_the_count_covers_while_another_process_puts(tmp_path):
    """A lookup reads the key's slot before the header's count (a put stores
    the count after the slot), so however many puts the writer finishes
    between the two reads, the slot is one the count covers and the key of
    the newest entry the lookup saw counted is found. Read the other way
    round, a put that lands between the two reads leaves a slot past the
    count and the lookup ends with nothing; a slot or count stored a byte at
    a time (struct's pack_into) is read half-written: both made pure Python
    lookups miss, a few to dozens in a run of this test."""
    from rmqstore import _kernels as k
    from rmqstore.format.layout import INDEX_ENTRY_SIZE, INDEX_HASH_SLOT_SIZE, INDEX_HEADER_SIZE

    n = 300_000
    path = tmp_path / "index"
    path.write_bytes(bytes(INDEX_HEADER_SIZE + INDEX_HASH_SLOT_SIZE + n * INDEX_ENTRY_SIZE))
    p = subprocess.Popen([sys.executable, "-c", SLOT_WRITER, str(path), str(n)], stdout=subprocess.PIPE,
                         text=True, env=_child_env())
    missed, lookups = [], 0
    try:
        with no_hang(60):
            assert p.stdout.readline().strip() == "ready"
        with open(path, "rb") as f, no_hang(120):
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            try:
                while p.poll() is None or lookups == 0:
                    count = struct.unpack_from(">i", mm, 36)[0]  # entries 1..count-1 are written
                    if count < 2:
                        continue
                    i = count - 1
                    out: list = []
                    t = 1_700_000_000_000 + 1000 * i
                    k.index_select(mm, 1, n, f"T#k{i}", 1, t, t, out)
                    lookups += 1
                    if out != [i]:
                        missed.append((i, out))
            finally:
                mm.close()
        assert p.wait(60) == 0
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
    assert lookups > 100, lookups  # the lookups overlapped the writer's puts
    assert not missed, f"{len(missed)} of {lookups} lookups missed their key, e.g. {missed[:3]}"
