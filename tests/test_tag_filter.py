"""``get_messages`` with a tag filter in one kernel call.

A filtered pull reads only units whose tags code is one of the filter's
(RocketMQ's ConsumeQueue filter) and keeps only messages whose TAGS really
is one of its names (the client's check: ``Aa`` and ``BB`` share a Java
hash). The kernel must answer what the careful path (``_pull_held``,
under a reader reference) answers: statuses, offsets, the same messages,
and the same ``next_begin_offset`` when it gives up after visiting its
share of units (a ConsumeQueue file's units are read ``max_count`` at a
time there). The core must make what the twin makes, and leave to the
careful path a filter that is not sets of exact ints and strs.
"""

from __future__ import annotations

import pytest

from conftest import ListClock, java_hash
from rmqstore import CorruptedFileError, GetMessageStatus, Message, MessageStore, _pure
from rmqstore.message import MessageExt
from rmqstore.store.pull import _tag_filter
from test_kernels import _need_core
from test_pull_messages import (
    _careful,
    assert_core_pulls_as_twin,
    assert_pulls_as_careful,
)
from test_views import T0, TINY

N = 90
#: each message's tags: three plain ones, a Java hash collision, none (tags code 0)
TAGS = ("t0", "t1", "t2", "Aa", "BB", None)
FILTERS = ("t0", "t1 || t2", " t2 ||t0 ", "Aa", "BB", "Aa || t0", "\x00", ["t0", "BB"], ("t1",), "||", "*", "nope",
           "t0 || nope")


def test_the_collision_is_one():
    assert java_hash("Aa") == java_hash("BB") and java_hash("\x00") == 0


@pytest.fixture
def store(tmp_path):
    with MessageStore.open(tmp_path, TINY, clock=ListClock(range(T0, T0 + 10 * N))) as s:
        for i in range(N):
            s.put_message(Message("V", b"f%03d" % i + bytes(i * 7 % 200), queue_id=i % 2, tags=TAGS[i % len(TAGS)]))
        yield s


@pytest.mark.parametrize("max_count", [1, 3, 7, 32, 1000])
@pytest.mark.parametrize("cleaned", [False, True], ids=["whole", "cleaned"])
def test_filtered_pulls_read_what_the_careful_path_reads(store, max_count, cleaned):
    s = store
    if cleaned:
        s.delete_expired(force=True)
    for tags in FILTERS:
        assert_pulls_as_careful(s, max_count, N // 2, tags)
    if not cleaned:  # what a filter keeps, whole
        kept = s.get_messages("V", 0, 0, 1000, "Aa || t0").messages
        assert [m.tags for m in kept] == [TAGS[i % 6] for i in range(0, N, 2) if TAGS[i % 6] in ("Aa", "t0")]
        assert s.get_messages("V", 0, 0, 1000, "\x00").status is GetMessageStatus.NO_MATCHED_MESSAGE  # code 0, no TAGS


@pytest.mark.parametrize("max_count", [7, 30, 32, 1000])
def test_a_rare_tag_ends_the_pull_where_the_careful_path_does(tmp_path, max_count):
    """After its share of units (800, or max_count when more) a filtered pull
    gives up; the careful path reads whole batches of max_count units (cut
    at file ends), so next_begin_offset is the end of the batch that passed
    the share."""
    cfg = TINY.replace(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 100)
    with MessageStore.open(tmp_path, cfg, clock=ListClock(range(T0, T0 + 3000))) as s:
        # "rare" at 20 and 2000: a pull from before 20 finds one, and its later batches are still max_count
        s.put_messages([Message("V", b"x%d" % i, tags="rare" if i in (20, 2000) else "common") for i in range(2001)])
        for offset in (0, 13, 150):
            got, want = s.get_messages("V", 0, offset, max_count, "rare"), _careful(s, 0, offset, max_count, "rare")
            assert tuple(got) == tuple(want), offset
            assert [m.body for m in got.messages] == ([b"x20"] if offset < 20 else [])
            if max_count > 1:
                assert got.next_begin_offset - offset >= max(800, max_count)
        r = s.get_messages("V", 0, 1990, max_count, "rare")
        assert [m.body for m in r.messages] == [b"x2000"] and r.next_begin_offset == 2001


@pytest.mark.parametrize("max_count", [1, 3, 32, 1000])
def test_core_filtered_pulls_make_what_the_twin_makes(store, max_count):
    for tags in FILTERS:
        assert_core_pulls_as_twin(store, max_count, N // 2, _tag_filter(tags))


def test_the_core_leaves_other_filters_to_the_careful_path(store):
    core = _need_core()
    s = store
    cq = s._cqs[("V", 0)]

    class Name(str):
        pass

    for odd in (([2112], ["Aa"]), ({2112}, ["Aa"]), (frozenset({2112}), frozenset({Name("Aa")})), ({2**64}, {"Aa"}),
                ({2112.0}, {"Aa"}), [{2112}, {"Aa"}], ({2112}, {"Aa"}, None)):
        out: list = []
        assert core.pull_messages(cq, s.commitlog, 0, 32, 800, MessageExt, out, odd, None)[0] is None
        assert out == []
    out = []  # queue 0 holds BB, not Aa: the same code, told apart by name
    assert core.pull_messages(cq, s.commitlog, 0, 32, 800, MessageExt, out, (frozenset({2112}), frozenset({"BB"})),
                              None)[0] is GetMessageStatus.FOUND
    assert {m.tags for m in out} == {"BB"}
    assert core.pull_messages(cq, s.commitlog, 0, 32, 800, MessageExt, [], (frozenset({2112}), frozenset({"Aa"})),
                              None)[0] is GetMessageStatus.NO_MATCHED_MESSAGE


def test_tags_that_do_not_parse_take_the_careful_path(store):
    s = store

    class Unprintable:
        def __str__(self):
            raise RuntimeError("no name")

    assert s.get_messages("V", 0, 10**6, 32, [Unprintable()]).status is GetMessageStatus.OFFSET_OVERFLOW_BADLY
    with pytest.raises(RuntimeError, match="no name"):
        s.get_messages("V", 0, 0, 32, [Unprintable()])


@pytest.mark.parametrize("kernels", ["pure", "core"])
def test_a_matching_unit_that_is_not_its_record_stops_the_pull(store, kernels):
    k = _pure if kernels == "pure" else _need_core()
    s = store
    cq = s._cqs[("V", 0)]
    phy, size, code = cq.get_unit(4)  # message 8: "t2"
    assert code == java_hash("t2")
    cq.queue.files[0].mm[4 * 20 : 4 * 20 + 12] = (phy + 1).to_bytes(8, "big") + size.to_bytes(4, "big")
    for tags in ("t0", "BB"):  # units of other codes are never read: the pull goes past it
        assert s.get_messages("V", 0, 0, 32, tags).status is GetMessageStatus.FOUND
    out: list = []
    assert k.pull_messages(cq, s.commitlog, 0, 32, 800, MessageExt, out, _tag_filter("t2"), None)[0] is None
    with pytest.raises(CorruptedFileError):  # the careful path reads the pull again
        s.get_messages("V", 0, 0, 32, "t2")


def test_names_are_matched_as_message_tags_reads_them(tmp_path):
    """The kernel matches the TAGS bytes against the names' UTF-8, unless a
    name holds U+FFFD (then it decodes, as MessageExt.tags does): stored
    bytes that are not UTF-8, a second TAGS entry (the last one counts),
    names beyond ASCII and names with lone surrogates must all answer as
    the careful path does, in both kernels."""
    with MessageStore.open(tmp_path, TINY, clock=ListClock(range(T0, T0 + 100))) as s:
        specs = [("ab", {}), ("ab", {}), ("标签", {}), ("ab", {"XXXX": "zz"}), ("zz", {}), ("ab", {})]
        for tags, props in specs:
            s.put_message(Message("V", b"n", tags=tags, properties=props or None))
        mm = s.commitlog.queue.files[0].mm
        # message 1: TAGS "ab" -> b"\xff\xfe" (decodes to two U+FFFD); message 3: a later entry named TAGS
        at = [i for i in range(len(mm) - 8) if mm[i : i + 8] == b"TAGS\x01ab\x02"][1]
        mm[at + 5 : at + 7] = b"\xff\xfe"
        at = mm.find(b"XXXX\x01zz")
        mm[at : at + 4] = b"TAGS"
        got_tags = [m.tags for m in s.get_messages("V", 0, 0, 32).messages]
        # (message 3's own TAGS "ab" comes after the renamed entry: the later one counts)
        assert got_tags == ["ab", "\ufffd\ufffd", "标签", "ab", "zz", "ab"]
        assert [m.tags for m in s.get_messages("V", 0, 0, 32, "zz").messages] == ["zz"]
        for tags in (["ab"], ["ab", "\ufffd\ufffd"], ["\ufffd\ufffd"], ["标签"], ["zz"], ["ab", "zz"],
                     ["ab", "a\udcff"],
                     ["zz", "\ufffd"], "ab || 标签 || zz"):
            got, want = s.get_messages("V", 0, 0, 32, tags), _careful(s, 0, 0, 32, tags)
            assert tuple(got) == tuple(want), tags
            wanted = _tag_filter(tags)
            for k in (_pure, _need_core()):
                out: list = []
                k.pull_messages(s._cqs[("V", 0)], s.commitlog, 0, 32, 800, MessageExt, out, wanted, None)
                assert [m.tags for m in out] == [m.tags for m in want.messages], (tags, k.__name__)
        # the stored bytes, not the code, decide: message 1 is kept for U+FFFD names only
        assert [m.queue_offset for m in s.get_messages("V", 0, 0, 32, ["ab", "\ufffd\ufffd"]).messages] == [0, 1, 3, 5]
        assert [m.queue_offset for m in s.get_messages("V", 0, 0, 32, ["ab"]).messages] == [0, 3, 5]
