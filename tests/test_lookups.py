"""The whole-lookup kernels: ``time_lookup`` (``get_offset_in_queue_by_time``),
``query_keyed`` (``query_messages``) and ``read_ext`` (``get_message``) in
one call each.

The twin defines them by the step-by-step path (``ConsumeQueue.offset_by_time``
over ``segment_view``; ``query_keyed`` by its contract, docs/recovery.md#lookups-by-key:
the first records of the index walk that really carry the key and were
stored in the window); the core must give the same answers on real stores of
several CommitLog, ConsumeQueue and index files, with heads cleaned up, and
must decline (None, nothing read) while a clean-up holds the reader
references.
"""

from __future__ import annotations

import itertools
import os
import threading
from types import SimpleNamespace

import pytest

import rmqstore
from conftest import ListClock, StepClock, java_hash
from rmqstore import Message, MessageStore, StoreConfig, _pure
from rmqstore.format.layout import MESSAGE_MAGIC_CODE_V2
from rmqstore.message import MessageExt
from rmqstore.storage.mapped_file import ReferenceResource
from test_kernels import _need_core

T0 = 1_700_000_000_000
TINY = StoreConfig(  # 4 KiB CommitLog files, 10 units per ConsumeQueue file, 32-entry index files
    mapped_file_size_commit_log=4096,
    mapped_file_size_consume_queue=200,
    max_hash_slot_num=16,
    max_index_num=32,
    clean_service_enable=False,
)
GROUPS = [1, 3, 1, 1, 4, 2, 1, 1, 5, 1, 2, 1, 1, 3, 1, 1, 2, 1, 6, 1, 1, 2, 1, 1, 3]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Store times in groups (equal times within one), 5 ms apart, on queue 0;
    keys repeat every 7 messages, so every key spans several index files."""
    times = [T0 + 5 * g for g, n in enumerate(GROUPS) for _ in range(n)]
    root = tmp_path_factory.mktemp("lookups")
    with MessageStore.open(root, TINY, clock=ListClock(times)) as s:
        for i in range(len(times)):
            s.put_message(Message("T", b"body-%03d" % i + bytes(300), keys=f"k{i % 7} all", tags="x"))
        assert len(s.commitlog.queue.files) > 3 and len(s._cqs[("T", 0)].queue.files) > 3
        assert len(s.index.files) > 3
        yield s, times


def _timestamps(times):
    return sorted({t + d for t in times for d in (-1, 0, 1)} | {0, -5, 2**62, T0 - 10**6})


@pytest.mark.parametrize("upper", [False, True], ids=["lower", "upper"])
@pytest.mark.parametrize("min_unit", [0, 7, 10, 23, 10**6], ids=lambda u: f"min{u}")
def test_time_lookup_answers_as_offset_by_time(store, upper, min_unit):
    core = _need_core()
    s, times = store
    cq = s._cqs[("T", 0)]
    kept = cq.min_logic_offset
    cq.min_logic_offset = min_unit * 20  # as clean-up leaves it; past the end too
    try:
        for ts in _timestamps(times):
            want = cq.offset_by_time(ts, upper, s.commitlog.segment_view())
            assert _pure.time_lookup(cq, s.commitlog, ts, upper, None) == want, ts
            assert core.time_lookup(cq, s.commitlog, ts, upper, None) == want, ts
            assert core.time_lookup(cq, s.commitlog, ts, upper, ReferenceResource()) == want, ts
    finally:
        cq.min_logic_offset = kept


def test_time_lookup_compares_odd_timestamps_as_the_twin(store):
    """Timestamps the core cannot compare in C (past int64, floats) are
    compared as Python objects, under the reference the lookup holds,
    exactly as the twin compares them."""
    core = _need_core()
    s, times = store
    cq = s._cqs[("T", 0)]
    refs = ReferenceResource()
    for ts in (2**64, -(2**64), float(times[5]), times[5] + 0.5):
        for upper in (False, True):
            want = _pure.time_lookup(cq, s.commitlog, ts, upper, None)
            assert core.time_lookup(cq, s.commitlog, ts, upper, refs) == want, ts
            assert core.time_lookup(cq, s.commitlog, ts, upper, None) == want, ts
            assert refs.ref_count == 0


def test_the_boundary_is_lower_or_upper_in_any_case(store):
    """get_offset_in_queue_by_time takes "lower" and "upper" as RocketMQ's
    BoundaryType names them, in any case; anything else is a ValueError."""
    s, times = store
    ts = times[1]  # the second group: three messages at one time
    lower, upper = (s.get_offset_in_queue_by_time("T", 0, ts, b) for b in ("lower", "upper"))
    assert (lower, upper) == (1, 3)
    for b, want in (("LOWER", lower), ("Upper", upper), ("uPPER", upper)):
        assert s.get_offset_in_queue_by_time("T", 0, ts, b) == want, b
    for bad in ("middle", "", None, 1, b"lower"):
        with pytest.raises(ValueError, match="boundary"):
            s.get_offset_in_queue_by_time("T", 0, ts, bad)


def test_time_lookup_on_an_empty_queue_and_an_emptied_commitlog(tmp_path):
    core = _need_core()
    with MessageStore.open(tmp_path, TINY, clock=ListClock([T0, T0 + 1])) as s:
        s.put_message(Message("T", b"a"))
        cq = s._cqs[("T", 0)]
        for k in (_pure, core):
            assert k.time_lookup(cq, s.commitlog, T0, False, None) == 0
            assert k.time_lookup(cq, s.commitlog, T0 + 1, False, None) == 1
        files, s.commitlog.queue.files = s.commitlog.queue.files, []  # every probe misses
        try:
            for upper in (False, True):
                want = _pure.time_lookup(cq, s.commitlog, T0, upper, None)
                assert core.time_lookup(cq, s.commitlog, T0, upper, None) == want
        finally:
            s.commitlog.queue.files = files


def _offsets(messages):
    return [m.physical_offset for m in messages]


def _kernels():
    """The twin, and the core when this run loads it (both answer alike)."""
    return [_pure] if rmqstore.IMPLEMENTATION != "cython" else [_pure, _need_core()]


def _carries(m, topic, key):
    props = m.properties
    return m.topic == topic and (props.get("UNIQ_KEY") == key or key in (props.get("KEYS") or "").split(" "))


def _wanted(s, topic, key, max_count, begin, end):
    """query_messages' answer by its definition (docs/recovery.md#lookups-by-key),
    from the CommitLog alone: the offsets of the records of *topic* carrying
    *key* stored in [begin, end], newest first (the index walk's order on a
    store written in time order), at most *max_count*."""
    found = []
    for off, _size in s.commitlog.iter_offsets(s.commitlog.min_offset()):
        m = s.get_message(off)
        if m is not None and begin <= m.store_timestamp <= end and _carries(m, topic, key):
            found.append(off)
    return found[::-1][: max(max_count, 0)]


def _keyed_both(s, topic, key, max_num, begin=0, end=2**63 - 1):
    """query_keyed's answer (offsets), the same from every kernel, with and
    without a reference to take, and from the store's query_messages."""
    answers = []
    for k in _kernels():
        for refs in (None, ReferenceResource()):
            out: list = []
            assert k.query_keyed(s.index, s.commitlog, topic, key, max_num, begin, end, MessageExt, out, refs) is out
            answers.append(_offsets(out))
    if max_num >= 1:
        answers.append(_offsets(s.query_messages(topic, key, max_num, begin, end)))
    assert all(a == answers[0] for a in answers), (key, max_num, begin, end)
    return answers[0]


@pytest.mark.parametrize("key", ["k0", "k3", "k6", "all", "k7", "", "\ufffd"])
@pytest.mark.parametrize("window", ["all", "middle", "late", "empty", "group", "ms", "before"])
@pytest.mark.parametrize("max_num", [64, 5, 1, 0])
def test_query_keyed_answers_the_records_carrying_the_key_newest_first(store, key, window, max_num):
    """The first *max_num* records of topic T carrying the key whose own
    store time is in the window, newest first: with store times 5 ms apart,
    windows of one group's time ("group", "ms": a millisecond either side)
    find that group's records though the index times them to the second."""
    s, times = store
    begin, end = {
        "all": (0, 2**63 - 1), "middle": (times[10], times[35]), "late": (times[-10], 2**63 - 1),
        "empty": (times[-1] + 10**7, 2**63 - 1), "group": (times[7], times[7]),
        "ms": (times[7] - 1, times[7] + 1), "before": (-(2**63), times[0]),
    }[window]
    want = _wanted(s, "T", key, max_num, begin, end)
    assert _keyed_both(s, "T", key, max_num, begin, end) == want
    if key.startswith("k") and key != "k7" and window == "all" and max_num == 64:
        assert len(want) == len([t for i, t in enumerate(times) if f"k{i % 7}" == key])  # every file was walked
    if key == "all" and max_num == 64 and window in ("group", "ms"):
        assert len(want) == times.count(times[7]) == 4


def test_query_keyed_is_not_capped_by_the_index_batch(store):
    """``max_msgs_num_batch`` caps ``query_offsets`` (RocketMQ's raw answer),
    not ``query_keyed``: that takes *max_num* records; another topic finds
    nothing, and a key or topic that is not a str is a TypeError."""
    s, times = store
    kept, s.index.max_msgs_num_batch = s.index.max_msgs_num_batch, 5  # the store's cap (config maxMsgsNumBatch)
    try:
        assert len(s.query_offsets("T", "all", 1000)) == 5
        for k in _kernels():
            out: list = []
            k.query_keyed(s.index, s.commitlog, "T", "all", 10**6, 0, 2**63 - 1, MessageExt, out, None)
            assert [m.queue_offset for m in out] == list(range(len(times) - 1, -1, -1))
            out = []
            k.query_keyed(s.index, s.commitlog, "T", "all", 7, 0, 2**63 - 1, MessageExt, out, None)
            assert [m.queue_offset for m in out] == list(range(len(times) - 1, len(times) - 8, -1))
    finally:
        s.index.max_msgs_num_batch = kept
    for k in _kernels():
        assert k.query_keyed(s.index, s.commitlog, "U", "all", 64, 0, 2**63 - 1, MessageExt, [], None) == []
        with pytest.raises(TypeError):
            k.query_keyed(s.index, s.commitlog, "T", b"all", 64, 0, 2**63 - 1, MessageExt, [], None)


def _same_hash_keys(blocks):
    """Every key of *blocks* two-character blocks "Aa" or "BB": ``2**blocks``
    keys of one Java hash, after any prefix (a topic and "#") too."""
    return ["".join(p) for p in itertools.product(("Aa", "BB"), repeat=blocks)]


@pytest.mark.parametrize("slots", [1, 2])
def test_query_messages_walks_past_hash_collisions(tmp_path, slots):
    """A key whose whole 32-bit hash collides with 15 others', 200 messages
    of those and 100 of the key, in index files of one or two slots (every
    key in a chain or two): query_messages answers the first max_count real
    matches, newest first, past max_msgs_num_batch (64) too, where the raw
    answer's 64 places hold the collisions as well (docs/recovery.md#lookups-by-key)."""
    keys = _same_hash_keys(4)
    key, others = keys[0], keys[1:]
    assert len({java_hash(f"T#{k}") for k in keys}) == 1
    cfg = TINY.replace(max_hash_slot_num=slots, max_index_num=64)
    with MessageStore.open(tmp_path, cfg, clock=StepClock(T0, step=7)) as s:
        real = []
        for i in range(300):
            if i % 3 == 1:
                real.append(s.put_message(Message("T", b"real-%d" % i, keys=key)).wrote_offset)
            else:
                s.put_message(Message("T", b"other-%d" % i, keys=others[i % len(others)]))
        s.put_message(Message("U", b"another topic", keys=key))
        newest = real[::-1]
        assert len(s.index.files) >= 4
        raw = s.query_offsets("T", key, 1000)  # RocketMQ's answer: capped, collisions included
        assert len(raw) == 64 and len([p for p in raw if p in set(real)]) < 30
        for n in (1, 10, 21, 64, 65, 99, 100, 101, 1000, 2**31 - 1):
            assert _keyed_both(s, "T", key, n) == newest[:n], n
        assert _keyed_both(s, "T", others[0], 2**31 - 1) == _wanted(s, "T", others[0], 1000, 0, 2**63 - 1)
        assert _offsets(s.query_messages("U", key, 1000)) == [s.commitlog.max_offset() - s.get_message(
            s.query_offsets("U", key, 1)[0]).store_size]
        # a time window: the real matches stored in it, and only those
        t = [s.get_message(p).store_timestamp for p in real]
        assert _keyed_both(s, "T", key, 1000, t[40], t[59]) == real[40:60][::-1]
        assert _keyed_both(s, "T", key, 7, t[40], t[59]) == real[53:60][::-1]


def test_a_window_of_milliseconds_finds_its_message(tmp_path):
    """The index times an entry in whole seconds after its file's begin time
    (docs/recovery.md#pitfall-index-time-resolution): a message stored
    1.5 s after the first has index time 1 s after. query_messages finds it
    with a window of a millisecond either side of its store time, and not
    with one that ends before or starts after it; query_offsets (RocketMQ's
    raw answer) does not find it in that window."""
    times = [T0, T0 + 1500, T0 + 2999, T0 + 3000, T0 + 3001]
    with MessageStore.open(tmp_path, TINY, clock=ListClock(times)) as s:
        rs = [s.put_message(Message("T", b"m%d" % i, keys="k")) for i in range(len(times))]
        assert [r.store_timestamp for r in rs] == times
        for r in rs:
            t = r.store_timestamp
            assert _keyed_both(s, "T", "k", 64, t - 1, t + 1) == [x.wrote_offset for x in rs
                                                                   if t - 1 <= x.store_timestamp <= t + 1][::-1]
            assert _keyed_both(s, "T", "k", 64, t, t) == [r.wrote_offset]
        t = times[1]
        assert s.query_offsets("T", "k", 64, t - 1, t + 1) == []
        assert _keyed_both(s, "T", "k", 64, t + 1, t + 5) == []
        assert _keyed_both(s, "T", "k", 64, t - 5, t - 1) == []
        assert _keyed_both(s, "T", "k", 64, -(2**63), -(2**63)) == []
        assert _keyed_both(s, "T", "k", 64, -(2**63), T0) == [rs[0].wrote_offset]


def test_records_at_begin_and_at_end_are_in_the_window(tmp_path):
    """[begin, end] is closed at both ends, to the millisecond, across
    index seconds."""
    times = [T0 + 100, T0 + 600, T0 + 1100, T0 + 1600, T0 + 2100]
    with MessageStore.open(tmp_path, TINY, clock=ListClock(times)) as s:
        phys = [s.put_message(Message("T", b"m%d" % i, keys="k")).wrote_offset for i in range(len(times))]
        for i, j in itertools.combinations_with_replacement(range(len(times)), 2):
            assert _keyed_both(s, "T", "k", 64, times[i], times[j]) == phys[i : j + 1][::-1], (i, j)
            if j > i:
                assert _keyed_both(s, "T", "k", 64, times[i] + 1, times[j] - 1) == phys[i + 1 : j][::-1], (i, j)
        assert _keyed_both(s, "T", "k", 2, times[0], times[3]) == [phys[3], phys[2]]


def test_the_first_entry_of_a_later_index_file_is_found_by_its_time(tmp_path):
    """A later index file's first entry decodes late, its time difference
    taken from the previous file's end (docs/recovery.md#pitfall-index-first-entry-time):
    query_offsets misses it in a window at its store time, as RocketMQ
    does; query_messages finds it there."""
    cfg = TINY.replace(max_index_num=3)  # two entries a file: one message (UNIQ_KEY, then its key)
    times = [T0, T0 + 5000, T0 + 5500, T0 + 9000]
    with MessageStore.open(tmp_path, cfg, clock=ListClock(times)) as s:
        rs = [s.put_message(Message("T", b"m%d" % i, keys="k", unique_key=f"U{i}")) for i in range(len(times))]
        assert len(s.index.files) == len(times)
        for i, r in enumerate(rs):
            t, uniq = r.store_timestamp, f"U{i}"
            assert _keyed_both(s, "T", uniq, 64, t, t) == [r.wrote_offset], i
            assert _keyed_both(s, "T", "k", 64, t - 1, t + 1) == [r.wrote_offset], i
            if i == 1:
                assert s.query_offsets("T", uniq, 64, t, t) == []  # (decoded 5 s late)
        assert _keyed_both(s, "T", "k", 64) == [r.wrote_offset for r in rs][::-1]


def test_a_record_indexed_twice_under_the_key_comes_once(tmp_path):
    """A record whose UNIQ_KEY and KEYS (twice) are the key has three index
    entries: query_offsets answers each, query_messages the record once, and
    the repeats take no place of its max_count
    (docs/recovery.md#pitfall-index-duplicate-entries)."""
    with MessageStore.open(tmp_path, TINY, clock=StepClock(T0)) as s:
        old = s.put_message(Message("T", b"old", keys="dup")).wrote_offset
        new = s.put_message(Message("T", b"new", keys="dup dup", unique_key="dup")).wrote_offset
        assert s.query_offsets("T", "dup") == [new, new, new, old]
        assert s.query_offsets("T", "dup", 2) == [new, new]
        assert _keyed_both(s, "T", "dup", 64) == [new, old]
        assert _keyed_both(s, "T", "dup", 2) == [new, old]
        assert _keyed_both(s, "T", "dup", 1) == [new]


@pytest.mark.parametrize("count", [5, 40])
def test_records_indexed_again_come_once(tmp_path, count):
    """Records indexed a second time (as RocketMQ's recovery does): the
    walk meets every record twice, the second time out of its descending
    order; each comes once, a few or many (past the core's short list of
    kept offsets)."""
    cfg = TINY.replace(max_index_num=1000)
    with MessageStore.open(tmp_path, cfg, clock=StepClock(T0)) as s:
        rs = [s.put_message(Message("T", b"m%d" % i, keys="again")) for i in range(count)]
        for r in rs:  # the same keys again, oldest first
            s.index._put(s.index.writable_file(), "T#again", r.wrote_offset, r.store_timestamp)
        newest = [r.wrote_offset for r in rs][::-1]
        assert s.query_offsets("T", "again", 1000) == (newest + newest)[:64]
        assert _keyed_both(s, "T", "again", 1000) == newest
        assert _keyed_both(s, "T", "again", count - 1) == newest[:-1]


@pytest.mark.parametrize("seed", range(8))
def test_query_keyed_on_damaged_index_files_answers_as_the_twin(tmp_path, seed):
    """Index files with bytes overwritten (chain links, times, hashes,
    offsets, header times that lie): the walk stays bounded, keeps only
    records that carry the key and were stored in the window, each once,
    and the core answers as the twin, window by window."""
    import random

    rnd = random.Random(seed)
    cfg = TINY.replace(max_hash_slot_num=2, max_index_num=24)
    with MessageStore.open(tmp_path, cfg, clock=StepClock(T0, step=377)) as s:
        for i in range(120):
            s.put_message(Message("T", b"m%d" % i, keys=f"k{i % 5} {_same_hash_keys(2)[i % 4]}"))
        for f in s.index.files:
            for _ in range(rnd.randrange(1, 6)):
                at = rnd.randrange(len(f.mm) - 8)
                if rnd.random() < 0.2:
                    at = rnd.randrange(16)  # a header time
                f.mm[at : at + 4] = rnd.randbytes(4) if rnd.random() < 0.5 else (rnd.randrange(-3, 40)).to_bytes(
                    4, "big", signed=True)
        t_end = T0 + 377 * 120
        windows = [(0, 2**63 - 1), (T0 + 377 * 30, T0 + 377 * 80), (T0 + 377 * 50 - 1, T0 + 377 * 50 + 1),
                   (-(2**63), T0 + 377 * 10), (t_end - 5000, 2**63 - 1)]
        for key in ["k0", "k3", "Aa" * 2, "BB" * 2, "AaBB", "none"]:
            for begin, end in windows:
                for n in (1, 3, 64, 1000):
                    got = _keyed_both(s, "T", key, n, begin, end)
                    assert len(got) == len(set(got)) <= n
                    for phy in got:
                        m = s.get_message(phy)
                        assert _carries(m, "T", key) and begin <= m.store_timestamp <= end


def test_core_lookups_decline_while_clean_up_holds_the_references(store):
    """With the references held exclusively, the core reads nothing and
    answers None: the caller then waits for a reference (the twin always
    waits in hold(), so it never answers None)."""
    core = _need_core()
    s, times = store
    cq = s._cqs[("T", 0)]
    refs = ReferenceResource()
    assert refs.acquire_exclusive(0)
    out: list = []
    assert core.time_lookup(cq, s.commitlog, times[3], False, refs) is None
    assert core.query_keyed(s.index, s.commitlog, "T", "k1", 64, 0, 2**63 - 1, MessageExt, out, refs) is None
    assert core.read_ext(s.commitlog, 0, MessageExt, out, refs) is None
    assert out == []
    refs.release_exclusive()
    assert core.time_lookup(cq, s.commitlog, times[3], False, refs) == 1  # the first of its group
    assert core.query_keyed(s.index, s.commitlog, "T", "k1", 64, 0, 2**63 - 1, MessageExt, out, refs) is out
    assert out
    assert core.read_ext(s.commitlog, 0, MessageExt, out, refs) is out and out[-1].physical_offset == 0


@pytest.mark.parametrize("lookup", ["time", "key", "offset"])
def test_store_lookups_wait_for_a_clean_up_then_answer(store, lookup):
    """A lookup that meets a clean-up holding the references waits for it to
    end (RocketMQ's reference counting), then answers from the files as
    they are: both implementations."""
    s, times = store
    phy = s.query_messages("T", "k2")[-1].physical_offset

    def look():
        if lookup == "time":
            return s.get_offset_in_queue_by_time("T", 0, times[9])
        if lookup == "key":
            return _offsets(s.query_messages("T", "k2"))
        return s.get_message(phy).physical_offset

    want = look()
    assert s._refs.acquire_exclusive(1.0)
    got: list = []
    worker = threading.Thread(target=lambda: got.append(look()))
    try:
        worker.start()
        worker.join(0.2)
        assert worker.is_alive() and got == []  # still waiting for the clean-up
    finally:
        s._refs.release_exclusive()
    worker.join(10)
    assert got == [want]


@pytest.mark.parametrize("impl", ["core", "pure"])
def test_lookups_hold_a_reference_while_python_code_runs_inside(store, impl):
    """A lookup given the store's references takes one for as long as it
    reads: Python code that runs in the middle of the read (here the
    message type's constructor; a finalizer or another thread in real life)
    finds the reference held, so a clean-up cannot get in and unmap what the
    read is inside; the reference is dropped afterwards, also when the read
    raises. Both implementations."""
    k = _need_core() if impl == "core" else _pure
    s, _ = store
    phy = s.query_messages("T", "k2")[-1].physical_offset
    refs = ReferenceResource()
    seen: list = []

    class message_type(MessageExt):  # (a subclass: made by calling it, Python code)
        def __init__(self, *args):
            seen.append((refs.ref_count, refs.acquire_exclusive(0)))
            super().__init__(*args)

    out: list = []
    assert k.query_keyed(s.index, s.commitlog, "T", "k2", 64, 0, 2**63 - 1, message_type, out, refs) is out
    assert k.read_ext(s.commitlog, phy, message_type, out, refs) is out
    assert len(seen) == len(out) > 2 and set(seen) == {(1, False)}  # held, and clean-up kept out
    assert refs.ref_count == 0 and refs.acquire_exclusive(0)  # dropped: clean-up gets in now
    refs.release_exclusive()

    class failing(MessageExt):
        def __init__(self, *args):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        k.read_ext(s.commitlog, phy, failing, [], refs)
    assert refs.ref_count == 0


def test_core_lookups_take_the_store_references_only(store):
    """The core takes its reference from a ``ReferenceResource`` (its C
    fields, no attribute read): any other object is a TypeError, and
    nothing is held or read."""
    core = _need_core()
    s, times = store
    cq = s._cqs[("T", 0)]
    for other in (SimpleNamespace(exclusive_held=False), object()):
        with pytest.raises(TypeError):
            core.time_lookup(cq, s.commitlog, times[3], False, other)
        with pytest.raises(TypeError):
            core.read_ext(s.commitlog, 0, MessageExt, [], other)
    with pytest.raises(TypeError):
        core.time_lookup(SimpleNamespace(queue=cq.queue), s.commitlog, times[3], False, None)
    with pytest.raises(TypeError):
        core.time_lookup(cq, SimpleNamespace(queue=s.commitlog.queue), times[3], False, None)


def test_key_lookups_past_the_first_buffers(tmp_path):
    """More matches than fit the core's first offset buffer (a batch cap
    raised past 64) and records with more properties than its first pair
    buffer: it grows them and answers as the twin does."""
    core = _need_core()
    cfg = TINY.replace(max_msgs_num_batch=500, mapped_file_size_commit_log=1 << 16)
    with MessageStore.open(tmp_path, cfg, clock=ListClock(range(T0, T0 + 1000))) as s:
        props = {f"p{j}": str(j) * 3 for j in range(40)}
        for i in range(150):
            s.put_message(Message("T", b"m%d" % i, keys=f"same k{i}", properties=props))
        for key, count in (("same", 150), ("k7", 1)):
            want: list = []
            _pure.query_keyed(s.index, s.commitlog, "T", key, 500, 0, 2**63 - 1, MessageExt, want, None)
            got: list = []
            core.query_keyed(s.index, s.commitlog, "T", key, 500, 0, 2**63 - 1, MessageExt, got, None)
            assert got == want and len(got) == count
            assert s.query_messages("T", key, 500) == want


# --- read_ext (get_message) ------------------------------------------------------------------


def _read_ext_both(commitlog, phy):
    """read_ext's answer, the same from the twin and the core, with and
    without a reference to take: the MessageExt at *phy*, or None."""
    kernels = [_pure, _need_core()]
    answers = []
    for k in kernels:
        for refs in (None, ReferenceResource()):
            out: list = []
            assert k.read_ext(commitlog, phy, MessageExt, out, refs) is out
            assert len(out) <= 1
            answers.append(out[0] if out else None)
    assert all(a == answers[0] for a in answers), phy
    return answers[0]


def test_read_ext_reads_what_commitlog_read_reads(store):
    """Every record start of several CommitLog files, and offsets where no
    record starts (inside one, past the end, below the start, past int64):
    read_ext answers ``MessageExt(commitlog.read(phy))``, or None where that
    is None."""
    s, _ = store
    cl = s.commitlog
    starts = [off for off, _size in cl.iter_offsets(0)]
    assert len(starts) == sum(GROUPS)
    odd = {0, 1, 7, starts[5] + 1, starts[5] - 1, cl.max_offset(), cl.max_offset() - 1, cl.max_offset() + 1,
           cl.file_size, cl.file_size - 1, -1, -(2**70), 2**63 - 1, 2**63, 2**70}
    for phy in sorted(set(starts) | odd):
        fields = cl.read(phy) if -(2**63) <= phy < 2**63 else None
        got = _read_ext_both(cl, phy)
        if fields is None:
            assert got is None, phy
        else:
            assert got == MessageExt(fields) and got.physical_offset == phy
    assert s.get_message(starts[3]) == MessageExt(cl.read(starts[3]))
    assert s.get_message(starts[3] + 1) is None


def test_read_ext_skips_files_cleaned_up(store):
    """Records of a CommitLog file no longer in the queue (clean-up deleted
    it) are gone, the rest are read."""
    s, _ = store
    cl = s.commitlog
    first = cl.queue.files[0]
    inside = [off for off, _size in cl.iter_offsets(0) if off < first.file_from_offset + cl.file_size]
    after = first.file_from_offset + cl.file_size
    cl.queue.files.remove(first)
    try:
        for phy in inside:
            assert _read_ext_both(cl, phy) is None
        assert _read_ext_both(cl, after) == MessageExt(cl.read(after))
    finally:
        cl.queue.files.insert(0, first)


def test_read_ext_refuses_what_is_not_an_int(store):
    s, _ = store
    for k in [_pure, _need_core()]:
        for bad in (1.0, "0", None, b"\0"):
            with pytest.raises(TypeError):
                k.read_ext(s.commitlog, bad, MessageExt, [], None)
    with pytest.raises(TypeError):
        s.get_message("0")


def test_read_ext_checks_the_body_and_decodes_the_topic_as_decode_record(tmp_path):
    """A record whose body CRC does not match, or whose physical offset field
    names another offset, is not read; a topic whose bytes are not UTF-8
    (the body CRC does not cover them) reads with U+FFFD, as decode_record
    decodes it; v6 hosts and long (v2) topics read whole."""
    cfg = TINY.replace(auto_message_version_on_topic_len=True, mapped_file_size_commit_log=1 << 16)
    with MessageStore.open(tmp_path, cfg, clock=ListClock(range(T0, T0 + 100))) as s:
        rs = [s.put_message(Message("Tx", b"body-a", keys="a")),
              s.put_message(Message("Ty", b"body-b", keys="b")),
              s.put_message(Message("L" * 200, b"body-c", born_host="[::1]:9876", store_host="[fe80::1]:10911")),
              s.put_message(Message("Tz", b"body-d", keys="d"))]
        s.flush()
        path = s.commitlog.queue.files[0].path
        with open(path, "r+b") as fh:  # (the mapping is shared: the store sees these writes)
            # a record ends: body, topic length (1 byte), topic, properties length (2), properties
            m0 = s.get_message(rs[0].wrote_offset)
            fh.seek(rs[0].wrote_offset + rs[0].wrote_bytes - len(m0.properties_blob) - 2 - 2 - 1 - len(m0.body))
            assert fh.read(1) == b"b"
            fh.seek(-1, os.SEEK_CUR)
            fh.write(b"B")  # the first byte of the body
            props_len = len(s.get_message(rs[1].wrote_offset).properties_blob)
            topic_at = rs[1].wrote_offset + rs[1].wrote_bytes - props_len - 2 - 1
            fh.seek(topic_at)
            assert fh.read(1) == b"y"
            fh.seek(topic_at)
            fh.write(b"\xff")
            fh.seek(rs[3].wrote_offset + 28)  # PHYSICALOFFSET: 8 bytes, not under the CRC
            fh.write((rs[3].wrote_offset + 1).to_bytes(8, "big"))
        assert s.commitlog.read(rs[0].wrote_offset) is None
        assert _read_ext_both(s.commitlog, rs[0].wrote_offset) is None
        m1 = _read_ext_both(s.commitlog, rs[1].wrote_offset)
        assert m1 == MessageExt(s.commitlog.read(rs[1].wrote_offset)) and m1.topic == "T\ufffd"
        m2 = _read_ext_both(s.commitlog, rs[2].wrote_offset)
        assert m2 == MessageExt(s.commitlog.read(rs[2].wrote_offset)) and m2.topic == "L" * 200
        assert m2.magic_code == MESSAGE_MAGIC_CODE_V2 and m2.sys_flag & 0x30 == 0x30  # a v2 record, both hosts v6
        assert s.commitlog.read(rs[3].wrote_offset) is None  # a record that is not where it says it is
        assert _read_ext_both(s.commitlog, rs[3].wrote_offset) is None
