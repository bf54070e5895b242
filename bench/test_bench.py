"""Append, consume, key lookup and time lookup: Cython core vs pure Python.

Run with ``python -m pytest bench/ --benchmark-enable``. Each benchmark sets
``extra_info["ops"]`` (operations per round) so the summary prints rates.
"""

import random

import pytest

from benchdata import CONFIG, QUEUES, TOPIC, N, make_messages
from rmqstore import MessageStore

ROUNDS = 3


def _stores(tmp_path):
    """A factory of fresh stores (opened in setup, outside the timing) and the
    list of them, closed by the test after timing."""
    opened = []

    def setup():
        opened.append(MessageStore.open(tmp_path / f"s{len(opened)}", config=CONFIG))
        return (opened[-1],), {}

    return setup, opened


def test_append(benchmark, impl, tmp_path):
    benchmark.group = "append"
    benchmark.extra_info["ops"] = N
    msgs = make_messages()

    setup, opened = _stores(tmp_path)

    def run(store):
        for m in msgs:
            store.put_message(m)

    benchmark.pedantic(run, setup=setup, rounds=ROUNDS)
    for s in opened:
        s.close()


def test_append_batch(benchmark, impl, tmp_path):
    benchmark.group = "append-batch"
    benchmark.extra_info["ops"] = N
    msgs = make_messages()

    setup, opened = _stores(tmp_path)

    def run(store):
        for i in range(0, N, 1000):
            store.put_messages(msgs[i : i + 1000])

    benchmark.pedantic(run, setup=setup, rounds=ROUNDS)
    for s in opened:
        s.close()


def test_append_columns(benchmark, impl, tmp_path):
    """put_message_columns, 1000 rows per call: the same messages as columns."""
    benchmark.group = "append-columns"
    benchmark.extra_info["ops"] = N
    msgs = make_messages()
    cols = [
        tuple(list(c) for c in zip(*[(m.body, m.queue_id, m.tags, m.keys, m.unique_key) for m in msgs[i : i + 1000]]))
        for i in range(0, N, 1000)
    ]

    setup, opened = _stores(tmp_path)

    def run(store):
        for bodies, qids, tags, keys, uniq in cols:
            store.put_message_columns(TOPIC, bodies, qids, tags=tags, keys=keys, unique_keys=uniq)

    benchmark.pedantic(run, setup=setup, rounds=ROUNDS)
    assert [opened[0].get_max_offset_in_queue(TOPIC, q) for q in range(QUEUES)] == [N // QUEUES] * QUEUES
    for s in opened:
        s.close()


def _consume_all(pull) -> int:
    """Messages taken from every queue, from offset 0 to the end, where
    ``pull(queue_id, offset)`` returns ``(count, next_begin_offset)``."""
    n = 0
    for q in range(QUEUES):
        off = 0
        while True:
            got, off = pull(q, off)
            if not got:
                break
            n += got
    return n


def test_consume(benchmark, impl, filled_store):
    benchmark.group = "consume"
    benchmark.extra_info["ops"] = N
    path, _ = filled_store
    with MessageStore.open(path, read_only=True) as s:

        def pull(q, off):
            r = s.get_messages(TOPIC, q, off, 32)
            return len(r.messages), r.next_begin_offset

        def run():
            assert _consume_all(pull) == N

        benchmark.pedantic(run, rounds=ROUNDS)


def test_consumer(benchmark, impl, filled_store):
    """``store.consumer()`` iterated to the end, deferred commits (``sync=False``):
    a pull per 32 messages, a commit per message."""
    benchmark.group = "consumer"
    benchmark.extra_info["ops"] = N
    path, _ = filled_store
    groups = iter(range(1_000_000))
    with MessageStore.open(path, config=CONFIG) as s:  # (writable: a consumer commits)

        def setup():  # a new group each round: from the first message
            return (s.consumer(f"G-{impl}-{next(groups)}", TOPIC, sync=False),), {}

        def run(c):
            with c:
                assert sum(1 for _ in c) == N

        benchmark.pedantic(run, setup=setup, rounds=ROUNDS)


@pytest.mark.parametrize("tags", ["Tag0", "Tag0 || Tag1"])
def test_consume_tags(benchmark, impl, filled_store, tags):
    """get_messages with a tag filter (benchdata tags each message Tag0..Tag3
    in turn: a quarter or a half is kept); ops are the messages kept."""
    kept = N // 4 * tags.count("Tag")
    benchmark.group = f"consume-tags-{tags.count('Tag')}-of-4"
    benchmark.extra_info["ops"] = kept
    path, _ = filled_store
    with MessageStore.open(path, read_only=True) as s:

        def run():
            n = 0
            for q in range(QUEUES):
                off = 0
                while True:
                    r = s.get_messages(TOPIC, q, off, 32, tags)
                    n += len(r.messages)
                    if r.next_begin_offset == off or r.status.name == "OFFSET_OVERFLOW_ONE":
                        break
                    off = r.next_begin_offset
            assert n == kept

        benchmark.pedantic(run, rounds=ROUNDS)


_BULK_PULLS = {  # kind: (store method, messages in its result)
    "columns": ("get_message_columns", lambda r: len(r.columns["queue_id"])),  # bodies included
    "views": ("get_message_views", lambda r: len(r.units)),  # zero-copy: positions in the mapped segment
}


@pytest.mark.parametrize("batch", [32, 1024])
@pytest.mark.parametrize("kind", sorted(_BULK_PULLS))
def test_consume_bulk(benchmark, impl, filled_store, kind, batch):
    """The bulk pulls, *batch* messages per call."""
    benchmark.group = f"consume-{kind}-{batch}"
    benchmark.extra_info["ops"] = N
    path, _ = filled_store
    method, count = _BULK_PULLS[kind]
    with MessageStore.open(path, read_only=True) as s:
        fetch = getattr(s, method)

        def pull(q, off):
            r = fetch(TOPIC, q, off, batch)
            return count(r), r.next_begin_offset

        def run():
            assert _consume_all(pull) == N

        benchmark.pedantic(run, rounds=ROUNDS)


def test_key_lookup(benchmark, impl, filled_store):
    benchmark.group = "key-lookup"
    path, _ = filled_store
    keys = [f"key-{i}" for i in random.Random(7).sample(range(N), min(N, 5000))]
    benchmark.extra_info["ops"] = len(keys)
    with MessageStore.open(path, read_only=True) as s:

        def run():
            for key in keys:
                assert len(s.query_messages(TOPIC, key)) == 1

        benchmark.pedantic(run, rounds=ROUNDS)


def test_time_lookup(benchmark, impl, filled_store):
    benchmark.group = "time-lookup"
    path, results = filled_store
    # message i went to queue i % QUEUES; store times are unique (1 ms apart)
    picks = [(i % QUEUES, results[i]) for i in random.Random(9).sample(range(N), min(N, 5000))]
    benchmark.extra_info["ops"] = len(picks)
    with MessageStore.open(path, read_only=True) as s:

        def run():
            for qid, r in picks:
                assert s.get_offset_in_queue_by_time(TOPIC, qid, r.store_timestamp) == r.queue_offset

        benchmark.pedantic(run, rounds=ROUNDS)


def test_msg_id_lookup(benchmark, impl, filled_store):
    """``look_message_by_msg_id`` (RocketMQ ``viewMessage``): one
    ``get_message`` by the id's physical offset, its store host compared."""
    benchmark.group = "msgid-lookup"
    path, results = filled_store
    picks = [results[i] for i in random.Random(11).sample(range(N), min(N, 5000))]
    benchmark.extra_info["ops"] = len(picks)
    with MessageStore.open(path, read_only=True) as s:

        def run():
            for r in picks:
                assert s.look_message_by_msg_id(r.msg_id).physical_offset == r.wrote_offset

        benchmark.pedantic(run, rounds=ROUNDS)
