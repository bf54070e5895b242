"""``get_messages`` without a filter in one kernel call: ``pull_messages``.

It must answer what the careful path (``_pull_held``, under a reader
reference) answers: statuses, offsets and the same messages, across
CommitLog segments and cleaned heads; the core must make what the twin
makes, decline (None, nothing read) while a clean-up holds the
references, and stop (status None) at any unit that is not its record,
so that the careful path raises for it.
"""

from __future__ import annotations

import pytest

from conftest import ListClock
from rmqstore import ArgumentError, CorruptedFileError, GetMessageStatus, MessageStore, MessageTypeError, _pure
from rmqstore.message import MessageExt
from rmqstore.storage.mapped_file import ReferenceResource
from test_kernels import _need_core
from test_views import T0, TINY, N, _fill, cleaned_queues


@pytest.fixture
def store(tmp_path):
    with MessageStore.open(tmp_path, TINY, clock=ListClock(range(T0, T0 + 10 * N))) as s:
        _fill(s)
        yield s


def _careful(s, qid, offset, max_count, tags=None):
    """get_messages' careful path, under a reader reference."""
    s._refs.hold()
    try:
        return s._pull_held("V", qid, offset, max_count, tags)
    finally:
        s._refs.release()


@pytest.mark.parametrize("max_count", [1, 3, 32, 1000])
@pytest.mark.parametrize("cleaned", [False, True], ids=["whole", "cleaned"])
def test_get_messages_reads_what_the_careful_path_reads(store, max_count, cleaned):
    s = store
    if cleaned:
        s.delete_expired(force=True)
    assert_pulls_as_careful(s, max_count, N // 2)
    if not cleaned:
        assert s.get_messages("V", 0, 0, 1000).messages[-1].queue_offset == N // 2 - 1  # across segments


def assert_pulls_as_careful(s, max_count, queue_len, tags=None):
    """get_messages against the careful path on queues 0, 1 and one that
    does not exist, from every offset around [0, queue_len]."""
    for qid in (0, 1, 7):
        for q in range(-1, queue_len + 2):
            got, want = s.get_messages("V", qid, q, max_count, tags), _careful(s, qid, q, max_count, tags)
            assert tuple(got) == tuple(want), (tags, qid, q)
            assert type(got) is type(want) and got.status is want.status


def assert_core_pulls_as_twin(s, max_count, queue_len, tags=None):
    """core.pull_messages against the twin's on each of *s*'s queues as
    cleaned_queues leaves them, from every offset around [0, queue_len],
    with and without a ReferenceResource."""
    core = _need_core()
    for qid, cq, low in cleaned_queues(s):
        for q in range(-1, queue_len + 2):
            want_out: list = []
            want = _pure.pull_messages(cq, s.commitlog, q, max_count, 800, MessageExt, want_out, tags, None)
            for refs in (None, ReferenceResource()):
                out: list = []
                got = core.pull_messages(cq, s.commitlog, q, max_count, 800, MessageExt, out, tags, refs)
                assert got == want and out == want_out, (tags, qid, low, q)


@pytest.mark.parametrize("max_count", [1, 3, 32, 1000])
def test_core_pull_messages_makes_what_the_twin_makes(store, max_count):
    assert_core_pulls_as_twin(store, max_count, N // 2)


def test_core_pull_messages_declines_while_clean_up_holds_the_references(store):
    core = _need_core()
    refs, out = ReferenceResource(), []
    assert refs.acquire_exclusive(0)
    assert core.pull_messages(store._cqs[("V", 0)], store.commitlog, 0, 32, 800, MessageExt, out, None, refs) is None
    assert out == []
    refs.release_exclusive()
    got = core.pull_messages(store._cqs[("V", 0)], store.commitlog, 0, 32, 800, MessageExt, out, None, refs)
    assert got[0] is GetMessageStatus.FOUND
    assert len(out) == N // 2


@pytest.mark.parametrize("kernels", ["pure", "core"])
def test_a_unit_that_is_not_its_record_stops_the_pull(store, kernels):
    k = _pure if kernels == "pure" else _need_core()
    s = store
    cq = s._cqs[("V", 0)]
    other = s._cqs[("V", 1)].get_unit(3)
    mm = cq.queue.files[0].mm
    mm[2 * 20 : 2 * 20 + 20] = other[0].to_bytes(8, "big") + other[1].to_bytes(4, "big") + bytes(8)
    out: list = []
    assert k.pull_messages(cq, s.commitlog, 0, 32, 800, MessageExt, out, None, None) == (None, 2, 0, N // 2)
    assert [m.queue_offset for m in s.get_messages("V", 0, 0, 2).messages] == [0, 1]
    with pytest.raises(CorruptedFileError):  # the careful path reads the pull again
        s.get_messages("V", 0, 0, 32)


def test_odd_arguments_are_refused_and_the_ends_of_a_long_answered(store):
    s = store
    for offset, max_count in [(2**63 - 1, 32), (-(2**63), 32), (0, 2**31 - 1)]:
        got, want = s.get_messages("V", 0, offset, max_count), _careful(s, 0, offset, max_count)
        assert tuple(got) == tuple(want), (offset, max_count)
    assert s.get_messages("V", 0, 0, 2**31 - 1).status is GetMessageStatus.FOUND
    for offset, status in [(2**63 - 1, GetMessageStatus.OFFSET_OVERFLOW_BADLY),
                           (-(2**63), GetMessageStatus.OFFSET_TOO_SMALL)]:
        assert s.get_message_views("V", 0, offset).status is status
    for offset, max_count, error in [(2**70, 32, ArgumentError), (-(2**70), 32, ArgumentError),
                                     (0, 2**70, ArgumentError), (0, 0, ArgumentError), (True, 32, MessageTypeError),
                                     (0, 32.0, MessageTypeError)]:
        for pull in (s.get_messages, s.get_message_views):
            with pytest.raises(error):
                pull("V", 0, offset, max_count)
