"""rmqstore beside peer stores on the issue's workload: append (one call per
message), append in batches of 1000, consume every queue (pulls of 32), key
lookups and time lookups, for rmqstore-cython, rmqstore-python, lmdb,
rocksdict and sqlite3 (plus sqlite3 appending in 1000-row transactions).

Two forms of the appends. ``append`` and ``append-batch`` take messages
made before the timing (rmqstore's ``Message``; the others take the row and
encode their record inside the call). ``append-built`` and
``append-batch-built`` time what a caller's loop does: every store starts
from the producer's row, rmqstore making each ``Message`` inside the timing.
``first-put`` times opening a new store and its first put.

Run with ``python -m pytest bench/test_peers.py --benchmark-enable``; the run
ends with a table of medians and the ratio of rmqstore-cython to each store.
Peers that are not installed (``pip install '.[bench]'``) are skipped.

Knobs: RMQSTORE_BENCH_PEERS_N (messages, default 200000),
RMQSTORE_BENCH_PEERS_LOOKUPS (lookups per round, default 20000).
"""

import itertools
import os
import random
import shutil

import pytest

import peers
from benchdata import BODY_SIZE, QUEUES, TOPIC, message_fields

N = int(os.environ.get("RMQSTORE_BENCH_PEERS_N", "200000"))
LOOKUPS = min(N, int(os.environ.get("RMQSTORE_BENCH_PEERS_LOOKUPS", "20000")))
WRITE_ROUNDS = 3
READ_ROUNDS = 5
T0 = 1_700_000_000_000
assert N % QUEUES == 0, "RMQSTORE_BENCH_PEERS_N must be a multiple of 8"
# LMDB's map is fixed when the file is opened (and with writemap the file is
# that big, sparse); about 820 bytes per message are used, so 4 KiB leaves room
peers.Lmdb.MAP_SIZE = max(64 << 20, N * 4096)


def _have_core():
    try:
        from rmqstore import _core  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture
def peer(request):
    """The adapter of one store, inside its context (rmqstore: its kernels)."""
    p = peers.make(request.param)
    if p.name == "rmqstore-cython" and not _have_core():
        pytest.skip("Cython core not built")
    if p.module:
        pytest.importorskip(p.module)
    with p.activate():
        yield p


def _info(benchmark, peer, workload, ops):
    benchmark.group = f"peers: {workload}"
    benchmark.extra_info.update(peers_store=peer.name, workload=workload, ops=ops, n=N)


@pytest.fixture(scope="module")
def rows():
    """The seeded messages as a producer has them (peers.ROW), the same
    logical messages for every store."""
    out = [(TOPIC, body, qid, 0, tags, keys, uniq, born) for body, qid, tags, keys, uniq, born in message_fields(N)]
    assert all(len(r[1]) == BODY_SIZE for r in out[:10])
    return out


@pytest.fixture
def messages(peer, rows):
    """The rows as the store's API takes them, made outside any timing."""
    return [peer.prepare(r) for r in rows]


@pytest.fixture(scope="module")
def filled(tmp_path_factory, rows):
    """get(peer) -> (path, placed): a store of N messages written once per
    store (in batches of 1000, the clock advancing 1 ms per message) and
    (queue_offset, store_ts) of each message. Both rmqstore entries share one
    store: the files do not depend on the kernels."""
    built = {}

    def get(peer):
        key = "rmqstore" if peer.name.startswith("rmqstore-") else peer.name
        if key not in built:
            path = tmp_path_factory.mktemp(f"filled-{key}")
            clock = itertools.count(T0).__next__
            a = peer.open(path, clock=clock)
            try:
                placed = []
                for i in range(0, N, 1000):
                    placed.extend(peer.placed(r) for r in a.append_rows(rows[i : i + 1000]))
            finally:
                a.close()
            built[key] = path, placed
        return built[key]

    return get


def _fresh_stores(peer, tmp_path):
    """setup() for pedantic: close and delete the previous round's store, open
    a fresh one (all outside the timing); last() is the newest."""
    opened = []

    def setup():
        while opened:
            opened.pop().close()
            shutil.rmtree(tmp_path / "store")
        opened.append(peer.open(tmp_path / "store"))
        return (opened[-1],), {}

    return setup, opened


def _timed_writes(benchmark, run, setup, opened, tmp_path):
    """Time *run* on fresh stores, check what the last round wrote, clean up."""
    try:
        benchmark.pedantic(run, setup=setup, rounds=WRITE_ROUNDS)
        _check_appended(opened[-1])
    finally:
        for a in opened:
            a.close()
        shutil.rmtree(tmp_path / "store", ignore_errors=True)


def _check_appended(a):
    assert a.next_offsets() == {q: N // QUEUES for q in range(QUEUES)}


@pytest.mark.parametrize("peer", peers.STORES + peers.APPEND_ONLY, indirect=True)
def test_append(benchmark, peer, messages, tmp_path):
    _info(benchmark, peer, "append", N)
    setup, opened = _fresh_stores(peer, tmp_path)

    def run(a):
        append = a.append
        for m in messages:
            append(m)
        a.finish()

    _timed_writes(benchmark, run, setup, opened, tmp_path)


@pytest.mark.parametrize("peer", peers.STORES, indirect=True)
def test_append_batch(benchmark, peer, messages, tmp_path):
    _info(benchmark, peer, "append-batch", N)
    setup, opened = _fresh_stores(peer, tmp_path)
    batches = [messages[i : i + 1000] for i in range(0, N, 1000)]

    def run(a):
        for b in batches:
            a.append_batch(b)

    _timed_writes(benchmark, run, setup, opened, tmp_path)


@pytest.mark.parametrize("peer", peers.STORES + peers.APPEND_ONLY, indirect=True)
def test_append_built(benchmark, peer, rows, tmp_path):
    _info(benchmark, peer, "append-built", N)
    setup, opened = _fresh_stores(peer, tmp_path)

    def run(a):
        append_row = a.append_row
        for r in rows:
            append_row(r)
        a.finish()

    _timed_writes(benchmark, run, setup, opened, tmp_path)


@pytest.mark.parametrize("peer", peers.STORES, indirect=True)
def test_append_batch_built(benchmark, peer, rows, tmp_path):
    _info(benchmark, peer, "append-batch-built", N)
    setup, opened = _fresh_stores(peer, tmp_path)

    def run(a):
        for i in range(0, N, 1000):
            a.append_rows(rows[i : i + 1000])

    _timed_writes(benchmark, run, setup, opened, tmp_path)


@pytest.mark.parametrize("peer", peers.STORES, indirect=True)
def test_first_put(benchmark, peer, rows, tmp_path):
    """A new store: open (creating its files) and the first put, timed
    together; closed and deleted outside the timing."""
    _info(benchmark, peer, "first-put", 1)
    opened = []

    def setup():
        while opened:
            opened.pop().close()
        shutil.rmtree(tmp_path / "store", ignore_errors=True)
        return (), {}

    def run():
        a = peer.open(tmp_path / "store")
        opened.append(a)
        a.append_row(rows[0])
        a.finish()

    try:
        benchmark.pedantic(run, setup=setup, rounds=WRITE_ROUNDS * 3)
        assert opened[-1].next_offsets() == {rows[0][2]: 1}
    finally:
        for a in opened:
            a.close()
        shutil.rmtree(tmp_path / "store", ignore_errors=True)


@pytest.mark.parametrize("peer", peers.STORES, indirect=True)
def test_consume(benchmark, peer, filled):
    _info(benchmark, peer, "consume", N)
    path, _ = filled(peer)
    a = peer.open(path, read_only=True)

    def run():
        consume = a.consume
        n = 0
        for q in range(QUEUES):
            off = 0
            while True:
                got = consume(q, off, 32)
                if not got:
                    break
                n += len(got)
                off += len(got)
        assert n == N

    try:
        benchmark.pedantic(run, rounds=READ_ROUNDS)
    finally:
        a.close()


@pytest.mark.parametrize("peer", peers.STORES, indirect=True)
def test_key_lookup(benchmark, peer, filled):
    _info(benchmark, peer, "key-lookup", LOOKUPS)
    path, _ = filled(peer)
    keys = [f"key-{i}" for i in random.Random(7).sample(range(N), LOOKUPS)]
    a = peer.open(path, read_only=True)

    def run():
        lookup = a.lookup_key
        for key in keys:
            assert len(lookup(key)) == 1

    try:
        benchmark.pedantic(run, rounds=READ_ROUNDS)
    finally:
        a.close()


@pytest.mark.parametrize("peer", peers.STORES, indirect=True)
def test_time_lookup(benchmark, peer, filled):
    _info(benchmark, peer, "time-lookup", LOOKUPS)
    path, placed = filled(peer)
    # message i went to queue i % QUEUES; store times are unique (1 ms apart)
    picks = [(i % QUEUES, *placed[i]) for i in random.Random(9).sample(range(N), LOOKUPS)]
    a = peer.open(path, read_only=True)

    def run():
        lookup = a.lookup_time
        for qid, qo, ts in picks:
            assert lookup(qid, ts) == qo

    try:
        benchmark.pedantic(run, rounds=READ_ROUNDS)
    finally:
        a.close()


# --- answers, checked outside any timing ---------------------------------------------


def _expected(row, queue_offset, store_ts):
    topic, body, queue_id, flag, tags, keys, uniq, born = row
    return (topic, queue_id, queue_offset, flag, born, store_ts, tags, keys, uniq, body)


@pytest.mark.parametrize("peer", peers.STORES, indirect=True)
def test_answers(peer, filled, rows):
    """Every store answers a sample of consumes, key lookups (by key and by
    unique key) and time lookups exactly as the messages put into it say."""
    path, placed = filled(peer)
    a = peer.open(path, read_only=True)
    try:
        per_queue = N // QUEUES
        assert a.next_offsets() == {q: per_queue for q in range(QUEUES)}
        for i in random.Random(11).sample(range(N), min(N, 500)):
            m, (qo, ts) = rows[i], placed[i]
            q = i % QUEUES
            want = _expected(m, qo, ts)
            assert qo == i // QUEUES and ts == placed[0][1] + i
            got = a.consume(q, qo, 32)
            assert peer.describe(got[0]) == want
            assert len(got) == min(32, per_queue - qo)
            assert [peer.describe(x)[2] for x in got] == list(range(qo, qo + len(got)))
            for key in (m[5], m[6]):
                found = a.lookup_key(key)
                assert [peer.describe(x) for x in found] == [want], key
            assert a.lookup_time(q, ts) == qo
            # between two stored times: the next message of the queue (or the end)
            assert a.lookup_time(q, ts + 1) == min(qo + 1, per_queue)
        for q in range(QUEUES):
            assert a.consume(q, per_queue, 32) == []
            assert a.lookup_time(q, 0) == 0
            assert a.lookup_time(q, placed[-1][1] + 1000) == per_queue
        assert a.lookup_time(QUEUES + 1, T0) == 0
        assert a.lookup_key("no-such-key") == []
    finally:
        a.close()


@pytest.mark.parametrize("peer", peers.STORES + peers.APPEND_ONLY, indirect=True)
@pytest.mark.parametrize("form", ["append", "append-batch", "append-built", "append-batch-built"])
def test_append_answers(peer, messages, rows, tmp_path, form):
    """What the timed append paths write (wall clock, reopened) reads back whole."""
    n = min(N, 2000)
    msgs = rows[:n]
    prepared = messages[:n]
    a = peer.open(tmp_path / "s")
    try:
        if form == "append":
            placed = [peer.placed(a.append(m)) for m in prepared]
            a.finish()
        elif form == "append-built":
            placed = [peer.placed(a.append_row(r)) for r in msgs]
            a.finish()
        elif form == "append-batch":
            placed = [peer.placed(r) for i in range(0, n, 1000) for r in a.append_batch(prepared[i : i + 1000])]
        else:
            placed = [peer.placed(r) for i in range(0, n, 1000) for r in a.append_rows(msgs[i : i + 1000])]
    finally:
        a.close()
    a = peer.open(tmp_path / "s", read_only=True)
    try:
        for q in range(QUEUES):
            got = [peer.describe(x) for x in a.consume(q, 0, n)]
            want = [_expected(msgs[i], *placed[i]) for i in range(q, n, QUEUES)]
            assert got == want
            assert [qo for qo, _ in placed[q::QUEUES]] == list(range(len(want)))
    finally:
        a.close()
