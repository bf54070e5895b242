"""Zero-copy pulls: ``MessageStore.get_message_views`` and its kernel
``pull_views``. The messages must be get_messages' messages (same statuses,
offsets, bodies, store times, tags codes), the views must be read-only, and a
view must stay readable after clean-up deletes its file or the store closes."""

from __future__ import annotations

import gc
import os

import pytest

from conftest import ListClock
from rmqstore import CorruptedFileError, GetMessageStatus, Message, MessageStore, StoreConfig, _pure
from rmqstore.storage.mapped_file import ReferenceResource
from test_kernels import _need_core

T0 = 1_700_000_000_000
TINY = StoreConfig(
    mapped_file_size_commit_log=4096, mapped_file_size_consume_queue=200, max_hash_slot_num=16, max_index_num=32,
    clean_service_enable=False,
)
N = 60


def _fill(s, n=N):
    """Bodies of varied sizes on queues 0 and 1 (4 KiB segments: a roll every ~10)."""
    for i in range(n):
        s.put_message(Message("V", b"v%03d-" % i + bytes(range(256))[: (i * 37) % 300], queue_id=i % 2,
                              tags=f"t{i % 3}"))


@pytest.fixture
def store(tmp_path):
    with MessageStore.open(tmp_path, TINY, clock=ListClock(range(T0, T0 + 10 * N))) as s:
        _fill(s)
        yield s


def _as_messages(r):
    return [(int(u["queue_offset"]), int(u["physical_offset"]), int(u["store_timestamp"]), int(u["tags_code"]),
             bytes(body), int(u["store_size"])) for u, body in zip(r.units, r.bodies())]


def _expected(s, qid, offset, max_count):
    r = s.get_messages("V", qid, offset, max_count)
    return r, [(m.queue_offset, m.physical_offset, m.store_timestamp, s._cqs[("V", qid)].get_unit(m.queue_offset)[2],
                m.body, m.store_size) for m in r.messages]


@pytest.mark.parametrize("max_count", [1, 4, 32])
def test_views_walk_a_queue_as_get_messages_does(store, max_count):
    s = store
    for qid in (0, 1):
        offset, seen = 0, []
        while True:
            r = s.get_message_views("V", qid, offset, max_count)
            if r.status is not GetMessageStatus.FOUND:
                assert r.status is GetMessageStatus.OFFSET_OVERFLOW_ONE and r.units.size == 0 and r.buffer is None
                break
            got = _as_messages(r)
            ref, want = _expected(s, qid, offset, max_count)
            assert got == want[: len(got)] and got  # a pull may end early at a segment's end
            assert len(got) == len(want) or len({m.physical_offset // 4096 for m in ref.messages}) > 1
            assert (r.min_offset, r.max_offset) == (ref.min_offset, ref.max_offset)
            assert r.next_begin_offset == got[-1][0] + 1
            seen += got
            offset = r.next_begin_offset
        assert [m[0] for m in seen] == list(range(N // 2))


def test_views_answer_every_status_get_messages_answers(store):
    s = store
    for args in [("V", 0, 0), ("V", 0, N // 2), ("V", 0, N), ("V", 7, 0), ("W", 0, 0), ("V", 0, -1)]:
        r, ref = s.get_message_views(*args), s.get_messages(*args)
        assert (r.status, r.min_offset, r.max_offset) == (ref.status, ref.min_offset, ref.max_offset), args
        if r.status is GetMessageStatus.FOUND:  # ends at the first segment's end
            assert r.next_begin_offset == int(r.units["queue_offset"][-1]) + 1 <= ref.next_begin_offset
        else:
            assert r.next_begin_offset == ref.next_begin_offset and r.units.size == 0, args


def test_views_are_read_only_and_pin_the_mapping(store):
    s = store
    r = s.get_message_views("V", 0, 0, 4)
    first = _as_messages(r)
    with pytest.raises(TypeError):
        r.buffer[0] = 1
    report = s.delete_expired(force=True)  # deletes every segment but the last, the viewed one too
    assert report.deleted > 0 and s.get_messages("V", 0, 0).status is GetMessageStatus.OFFSET_TOO_SMALL
    assert not os.path.exists(os.path.join(s.root_dir, "commitlog", "0" * 20))
    assert _as_messages(r) == first  # still mapped: the view pinned it
    s.close()
    assert _as_messages(r) == first
    bodies = r.bodies()
    del r
    gc.collect()
    assert [bytes(b) for b in bodies] == [m[4] for m in first]


def test_views_follow_cleaned_heads(store):
    s = store
    s.delete_expired(force=True)
    mn = s.get_min_offset_in_queue("V", 1)
    r, ref = s.get_message_views("V", 1, 0), s.get_messages("V", 1, 0)
    assert r.status is ref.status is GetMessageStatus.OFFSET_TOO_SMALL and r.next_begin_offset == mn
    r = s.get_message_views("V", 1, mn, 64)
    assert _as_messages(r) == _expected(s, 1, mn, 64)[1][: r.units.size] and r.units.size


def test_a_unit_that_is_not_its_record_raises(store):
    s = store
    cq = s._cqs[("V", 0)]
    other = s._cqs[("V", 1)].get_unit(3)
    mm = cq.queue.files[0].mm
    mm[2 * 20 : 2 * 20 + 20] = other[0].to_bytes(8, "big") + other[1].to_bytes(4, "big") + bytes(8)
    r = s.get_message_views("V", 0, 0, 32)
    assert [u["queue_offset"] for u in r.units] == [0, 1] and r.next_begin_offset == 2
    with pytest.raises(CorruptedFileError):
        s.get_message_views("V", 0, 2, 32)


def cleaned_queues(s):
    """Clean-up run on *s*, then each of its queues with the minimum it left
    (units cleaned up ahead of it too), and at 0 (behind cleaned records:
    MESSAGE_WAS_REMOVING); the minimum is restored after each."""
    s.delete_expired(force=True)
    for qid in (0, 1):
        cq = s._cqs[("V", qid)]
        kept = cq.min_logic_offset
        for low in (kept, 0):
            cq.min_logic_offset = low
            try:
                yield qid, cq, low
            finally:
                cq.min_logic_offset = kept


@pytest.mark.parametrize("max_count", [1, 3, 32, 1000])
def test_core_pull_views_packs_what_the_twin_packs(store, max_count):
    core = _need_core()
    s = store
    for qid, cq, low in cleaned_queues(s):
        for q in range(-1, N // 2 + 2):
            want = _pure.pull_views(cq, s.commitlog, q, max_count, max(800, max_count), None)
            for refs in (None, ReferenceResource()):
                got = core.pull_views(cq, s.commitlog, q, max_count, max(800, max_count), refs)
                assert got == want, (qid, low, q)


def test_core_pull_views_declines_while_clean_up_holds_the_references(store):
    core = _need_core()
    refs = ReferenceResource()
    assert refs.acquire_exclusive(0)
    assert core.pull_views(store._cqs[("V", 0)], store.commitlog, 0, 32, 800, refs) is None
    refs.release_exclusive()
    assert core.pull_views(store._cqs[("V", 0)], store.commitlog, 0, 32, 800, refs)[0] is GetMessageStatus.FOUND


def test_views_of_a_read_only_store(tmp_path):
    """A read-only store (follow mode) serves the same views as the writer."""
    with MessageStore.open(tmp_path, TINY, clock=ListClock(range(T0, T0 + 10 * N))) as s:
        _fill(s)
        want = _as_messages(s.get_message_views("V", 1, 3, 5))
        with MessageStore.open(tmp_path, read_only=True) as ro:
            assert _as_messages(ro.get_message_views("V", 1, 3, 5)) == want
            _fill(s, 4)  # the writer goes on: the reader follows
            r = ro.get_message_views("V", 1, N // 2, 32)
            assert r.status is GetMessageStatus.FOUND and [int(q) for q in r.units["queue_offset"]] == [30, 31]
