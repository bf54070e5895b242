"""Peer stores for ``bench/test_peers.py``: one adapter per store, one interface,
the same message-queue semantics in each.

Every adapter starts from what a producer has: a row ``(topic, body,
queue_id, flag, tags, keys, unique_key, born_timestamp)`` (``ROW``; the
seeded rows of ``benchdata.message_fields``), and implements a topic of
numbered queues:

``open(path, clock=None, read_only=False)``
    open (creating if needed) the store in directory *path*; *clock* returns
    the store time in ms (default: the wall clock, as rmqstore's), called once
    per appended message.
``prepare(row)``
    the message as this store's API takes it, made before any timing:
    rmqstore's ``Message``; the row itself for the others (they encode
    their record in ``append``).
``append(msg)``
    store one prepared message durably-as-configured and return where it
    went (see ``placed``); one transaction / write batch per message.
``append_batch(msgs)``
    the same for a list of prepared messages, in one transaction / write batch.
``append_row(row)``, ``append_rows(rows)``
    ``append`` and ``append_batch`` from rows, all the work a caller's code
    does inside the call: rmqstore makes each ``Message`` there, the others
    encode their record as in ``append``.
``finish()``
    commit whatever an append left pending (only ``sqlite3-tx1000`` has any).
``consume(queue_id, from_offset, n=32)``
    up to *n* messages of the queue from queue offset *from_offset*, in order.
``lookup_key(key)``
    every message whose unique key or one of whose keys is *key*.
``lookup_time(queue_id, ts)``
    queue offset of the first message stored at or after *ts* ms, clamped to
    the queue's [min, max] offsets (rmqstore's ``get_offset_in_queue_by_time``
    with the lower boundary); 0 for an unknown queue.
``close()``

Each append assigns the next queue offset of the message's queue (kept in
memory, recovered from the store on open), takes the store timestamp from the
clock, and writes the message (topic, queue id, queue offset, flag, born and
store timestamps, tags, keys, unique key, body) plus two indexes: key -> (queue,
offset) for the unique key and every key, and (queue, store time) -> offset.
Messages come back as tuples in the order of ``FIELDS`` (rmqstore's come back
as ``MessageExt``; ``describe`` turns either into a ``FIELDS`` tuple for checks).

Durability: every store is set up like rmqstore's default ASYNC_FLUSH: a
write is in the page cache when the call returns (a killed process loses
nothing), and nothing waits for the disk (a power loss can lose the newest
writes). See ``bench/README.md`` for the settings of each peer.
"""

from __future__ import annotations

import contextlib
import os
import struct
import time

from benchdata import CONFIG, TOPIC

# The decoded form of a stored message in every peer (sqlite3 rows have it too).
FIELDS = ("topic", "queue_id", "queue_offset", "flag", "born_timestamp", "store_timestamp",
          "tags", "keys", "unique_key", "body")
# A producer's message before any store sees it.
ROW = ("topic", "body", "queue_id", "flag", "tags", "keys", "unique_key", "born_timestamp")

_Q = struct.Struct(">I")
_QO = struct.Struct(">IQ")  # (queue_id, queue_offset): message key
_QT = struct.Struct(">IQ")  # (queue_id, store_ts): time index seek prefix
_QTO = struct.Struct(">IQQ")  # (queue_id, store_ts, queue_offset): time index key
# record header: queue_id, queue_offset, flag, born_ts, store_ts, then the
# lengths of topic, tags, keys, unique key (UTF-8) and body
_HDR = struct.Struct(">IQiqqHHHHI")
_HDR_SIZE = _HDR.size
_SEP = " "  # RocketMQ's KEY_SEPARATOR between keys


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def encode_record(row, queue_offset, store_ts) -> bytes:
    topic, body, queue_id, flag, tags, keys, uniq, born = row
    t = topic.encode()
    tg = tags.encode() if tags else b""
    ks = keys.encode() if keys else b""
    u = uniq.encode() if uniq else b""
    born = store_ts if born is None else born
    hdr = _HDR.pack(queue_id, queue_offset, flag, born, store_ts, len(t), len(tg), len(ks), len(u), len(body))
    return b"".join((hdr, t, tg, ks, u, body))


def decode_record(v) -> tuple:
    q, qo, flag, born, ts, lt, lg, lk, lu, lb = _HDR.unpack_from(v)
    a = _HDR_SIZE
    b = a + lt
    c = b + lg
    d = c + lk
    e = d + lu
    return (
        v[a:b].decode(), q, qo, flag, born, ts,
        v[b:c].decode() if lg else None, v[c:d].decode() if lk else None, v[d:e].decode() if lu else None,
        bytes(v[e : e + lb]),
    )


def index_keys(row) -> list:
    """The keys a message is found by: its unique key and each of its keys."""
    keys, uniq = row[5], row[6]
    out = [uniq] if uniq else []
    if keys:
        out.extend(k for k in keys.split(_SEP) if k)
    return out


class Peer:
    """Base of the adapters; see the module docstring for the interface."""

    name = "?"
    module: str | None = None  # what pytest.importorskip needs

    def activate(self):
        """Context in which this store's benchmark runs (rmqstore: its kernels)."""
        return contextlib.nullcontext()

    @staticmethod
    def placed(result) -> tuple:
        """(queue_offset, store_ts) of what ``append`` returned."""
        return result

    def prepare(self, row):
        return row

    def append_row(self, row):
        return self.append(row)

    def append_rows(self, rows):
        return self.append_batch(rows)

    @staticmethod
    def describe(m) -> tuple:
        return tuple(m)

    def finish(self) -> None:
        pass

    def _init(self, clock):
        self._clock = clock or wall_clock_ms
        self._next: dict = {}  # queue_id -> next queue offset

    def next_offsets(self) -> dict:
        return dict(self._next)


# --- rmqstore ---------------------------------------------------------------------------


class RmqStore(Peer):
    """rmqstore's MessageStore with benchdata.CONFIG (64 MiB CommitLog files,
    RocketMQ's defaults otherwise: ASYNC_FLUSH, index on)."""

    def __init__(self, kernels: str):
        self.kernels = kernels
        self.name = f"rmqstore-{kernels}"

    @contextlib.contextmanager
    def activate(self):
        from kernel_switch import select  # tests/kernel_switch.py (on sys.path: bench/conftest.py)

        previous = select(self.kernels)
        try:
            yield
        finally:
            select(previous)

    def open(self, path, clock=None, read_only=False):
        from rmqstore import MessageStore

        self.store = MessageStore.open(path, config=CONFIG, clock=clock, read_only=read_only)
        self._message = _message_class(self.kernels)
        return self

    def prepare(self, row):
        topic, body, queue_id, flag, tags, keys, uniq, born = row
        return _message_class(self.kernels)(topic, body, queue_id=queue_id, flag=flag, tags=tags, keys=keys,
                                            unique_key=uniq, born_timestamp=born)

    def append(self, m):
        return self.store.put_message(m)

    def append_batch(self, msgs):
        return self.store.put_messages(msgs)

    def append_row(self, row):
        topic, body, queue_id, flag, tags, keys, uniq, born = row
        return self.store.put_message(self._message(topic, body, queue_id=queue_id, flag=flag, tags=tags, keys=keys,
                                                    unique_key=uniq, born_timestamp=born))

    def append_rows(self, rows):
        message = self._message
        return self.store.put_messages([
            message(topic, body, queue_id=queue_id, flag=flag, tags=tags, keys=keys, unique_key=uniq,
                    born_timestamp=born)
            for topic, body, queue_id, flag, tags, keys, uniq, born in rows
        ])

    def consume(self, queue_id, from_offset, n=32):
        return self.store.get_messages(TOPIC, queue_id, from_offset, n).messages

    def lookup_key(self, key):
        return self.store.query_messages(TOPIC, key)

    def lookup_time(self, queue_id, ts):
        return self.store.get_offset_in_queue_by_time(TOPIC, queue_id, ts)

    def next_offsets(self) -> dict:
        return {q: self.store.get_max_offset_in_queue(t, q) for t, q in self.store.queues()}

    def close(self):
        self.store.close()

    @staticmethod
    def placed(r):
        return r.queue_offset, r.store_timestamp

    @staticmethod
    def describe(m):
        return (m.topic, m.queue_id, m.queue_offset, m.flag, m.born_timestamp, m.store_timestamp,
                m.tags, m.keys, m.unique_key, bytes(m.body))


# --- lmdb -------------------------------------------------------------------------------


class Lmdb(Peer):
    """py-lmdb. Three named databases: ``msg`` (queue, offset) -> record,
    ``key`` (dupsort) key -> (queue, offset), ``time`` (queue, store_ts, offset)
    -> empty. Durability like ASYNC_FLUSH: ``sync=False, metasync=False``
    (commits do not fsync), ``writemap=True, map_async=True`` (commits write
    through the shared map; the kernel writes it back; a killed process loses
    nothing, a power loss can lose, or with writemap corrupt, the newest
    transactions, as LMDB documents)."""

    name = "lmdb"
    module = "lmdb"
    MAP_SIZE = 1 << 30  # sparse with writemap; bench/test_peers.py sizes it to N

    def open(self, path, clock=None, read_only=False):
        import lmdb

        self._init(clock)
        os.makedirs(path, exist_ok=True)
        self.env = env = lmdb.open(
            str(path), map_size=self.MAP_SIZE, max_dbs=3, readonly=read_only,
            sync=False, metasync=False, writemap=True, map_async=True,
        )
        self._msg = env.open_db(b"msg", create=not read_only)
        self._key = env.open_db(b"key", dupsort=True, create=not read_only)
        self._time = env.open_db(b"time", create=not read_only)
        with env.begin(db=self._msg) as txn:
            cur = txn.cursor()
            ok = cur.first()
            while ok:  # the last offset of each queue: jump from queue to queue
                q = _Q.unpack_from(cur.key())[0]
                ok = cur.set_range(_QO.pack(q + 1, 0))
                if ok:
                    cur.prev()
                else:
                    cur.last()
                self._next[q] = _QO.unpack(cur.key())[1] + 1
                if ok:
                    cur.next()
        return self

    def _put(self, txn, m):
        q = m[2]
        qo = self._next.get(q, 0)
        ts = self._clock()
        qk = _QO.pack(q, qo)
        txn.put(qk, encode_record(m, qo, ts), db=self._msg)
        kdb = self._key
        for k in index_keys(m):
            txn.put(k.encode(), qk, db=kdb)
        txn.put(_QTO.pack(q, ts, qo), b"", db=self._time)
        self._next[q] = qo + 1
        return qo, ts

    def append(self, m):
        with self.env.begin(write=True) as txn:
            return self._put(txn, m)

    def append_batch(self, msgs):
        with self.env.begin(write=True) as txn:
            put = self._put
            return [put(txn, m) for m in msgs]

    def consume(self, queue_id, from_offset, n=32):
        end = _QO.pack(queue_id, from_offset + n)
        out = []
        with self.env.begin(db=self._msg) as txn:
            cur = txn.cursor()
            if cur.set_range(_QO.pack(queue_id, from_offset)):
                for k, v in cur:
                    if k >= end:
                        break
                    out.append(decode_record(v))
        return out

    def lookup_key(self, key):
        with self.env.begin(db=self._key) as txn:
            cur = txn.cursor()
            if not cur.set_key(key.encode()):
                return []
            refs = list(cur.iternext_dup())
            if len(refs) > 1:
                refs = list(dict.fromkeys(refs))  # unique key == a key: once
            get, mdb = txn.get, self._msg
            return [decode_record(get(r, db=mdb)) for r in refs]

    def lookup_time(self, queue_id, ts):
        with self.env.begin(db=self._time) as txn:
            cur = txn.cursor()
            if cur.set_range(_QT.pack(queue_id, ts)):
                q, _, qo = _QTO.unpack(cur.key())
                if q == queue_id:
                    return qo
        return self._next.get(queue_id, 0)

    def close(self):
        self.env.close()


# --- rocksdict (RocksDB) ----------------------------------------------------------------


class RocksDict(Peer):
    """rocksdict (RocksDB) in raw mode. Column families ``msg`` (queue,
    offset) -> record, ``key`` (len16, key, queue, offset) -> empty (a prefix
    scan finds every message of a key), ``time`` (queue, store_ts, offset) ->
    empty. One WriteBatch per message (atomic over the three families) or per
    batch. Durability like ASYNC_FLUSH: WAL on, ``sync=False`` (each write is in
    the WAL in the page cache when the call returns: a killed process loses
    nothing, a power loss the newest writes). WAL off would be weaker than
    ASYNC_FLUSH (a killed process would lose the memtable). No compression
    (bodies are random bytes, and rmqstore does not compress); a 512 MiB block
    cache so reads of the data set come from memory as they do for the
    mmap-based stores."""

    name = "rocksdict"
    module = "rocksdict"
    BLOCK_CACHE = 512 << 20

    def _options(self):
        from rocksdict import BlockBasedOptions, DBCompressionType, Options

        o = Options(raw_mode=True)
        o.create_if_missing(True)
        o.create_missing_column_families(True)
        o.set_compression_type(DBCompressionType.none())
        t = BlockBasedOptions()
        t.set_block_cache(self._cache)
        o.set_block_based_table_factory(t)
        return o

    def open(self, path, clock=None, read_only=False):
        from rocksdict import AccessType, Cache, Rdict, WriteOptions

        self._init(clock)
        self._cache = Cache(self.BLOCK_CACHE)
        cfs = {name: self._options() for name in ("msg", "key", "time")}
        access = AccessType.read_only() if read_only else AccessType.read_write()
        self.db = db = Rdict(str(path), options=self._options(), column_families=cfs, access_type=access)
        wo = WriteOptions()
        wo.sync = False
        wo.disable_wal = False
        db.set_write_options(wo)
        self._h = tuple(db.get_column_family_handle(n) for n in ("msg", "key", "time"))
        self._msg, self._key, self._time = (db.get_column_family(n) for n in ("msg", "key", "time"))
        it = self._msg.iter()
        it.seek_to_first()
        while it.valid():  # the last offset of each queue: jump from queue to queue
            q = _Q.unpack_from(it.key())[0]
            it.seek_for_prev(_QO.pack(q, (1 << 64) - 1))
            self._next[q] = _QO.unpack(it.key())[1] + 1
            it.seek(_QO.pack(q + 1, 0))
        del it
        return self

    def _put(self, wb, m):
        q = m[2]
        qo = self._next.get(q, 0)
        ts = self._clock()
        hm, hk, ht = self._h
        qk = _QO.pack(q, qo)
        wb.put(qk, encode_record(m, qo, ts), hm)
        for k in index_keys(m):
            kb = k.encode()
            wb.put(b"".join((len(kb).to_bytes(2, "big"), kb, qk)), b"", hk)
        wb.put(_QTO.pack(q, ts, qo), b"", ht)
        self._next[q] = qo + 1
        return qo, ts

    def append(self, m):
        from rocksdict import WriteBatch

        wb = WriteBatch(raw_mode=True)
        r = self._put(wb, m)
        self.db.write(wb)
        return r

    def append_batch(self, msgs):
        from rocksdict import WriteBatch

        wb = WriteBatch(raw_mode=True)
        put = self._put
        r = [put(wb, m) for m in msgs]
        self.db.write(wb)
        return r

    def consume(self, queue_id, from_offset, n=32):
        end = _QO.pack(queue_id, from_offset + n)
        out = []
        for k, v in self._msg.items(from_key=_QO.pack(queue_id, from_offset)):
            if k >= end:
                break
            out.append(decode_record(v))
        return out

    def lookup_key(self, key):
        kb = key.encode()
        prefix = len(kb).to_bytes(2, "big") + kb
        plen = len(prefix)
        refs = []
        for k in self._key.keys(from_key=prefix):
            if k[:plen] != prefix:
                break
            refs.append(k[plen:])
        if len(refs) > 1:
            refs = list(dict.fromkeys(refs))
        get = self._msg.get
        return [decode_record(get(r)) for r in refs]

    def lookup_time(self, queue_id, ts):
        it = self._time.iter()
        it.seek(_QT.pack(queue_id, ts))
        if it.valid():
            q, _, qo = _QTO.unpack(it.key())
            if q == queue_id:
                return qo
        return self._next.get(queue_id, 0)

    def close(self):
        for cf in (self._msg, self._key, self._time):
            cf.close()
        self.db.close()
        del self._msg, self._key, self._time, self._h, self.db


# --- sqlite3 ----------------------------------------------------------------------------

_SQL_COLS = "topic, queue_id, queue_offset, flag, born_ts, store_ts, tags, keys, uniq_key, body"
_SQL_SCHEMA = (
    (
        "CREATE TABLE IF NOT EXISTS messages (topic TEXT NOT NULL, queue_id INTEGER NOT NULL,"
        " queue_offset INTEGER NOT NULL, flag INTEGER NOT NULL, born_ts INTEGER NOT NULL,"
        " store_ts INTEGER NOT NULL, tags TEXT, keys TEXT, uniq_key TEXT, body BLOB NOT NULL,"
        " PRIMARY KEY (queue_id, queue_offset)) WITHOUT ROWID"
    ),
    "CREATE INDEX IF NOT EXISTS messages_uniq_key ON messages (uniq_key)",
    "CREATE INDEX IF NOT EXISTS messages_keys ON messages (keys)",
    # a WITHOUT ROWID index carries the primary key: (queue_id, store_ts, queue_offset)
    "CREATE INDEX IF NOT EXISTS messages_time ON messages (queue_id, store_ts)",
)
_SQL_INSERT = f"INSERT INTO messages ({_SQL_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_SQL_CONSUME = (
    f"SELECT {_SQL_COLS} FROM messages WHERE queue_id = ? AND queue_offset >= ? ORDER BY queue_offset LIMIT ?"
)
_SQL_KEY = f"SELECT {_SQL_COLS} FROM messages WHERE uniq_key = ?1 OR keys = ?1"
_SQL_TIME = (
    "SELECT queue_offset FROM messages WHERE queue_id = ? AND store_ts >= ?"
    " ORDER BY store_ts, queue_offset LIMIT 1"
)


class Sqlite(Peer):
    """sqlite3 (stdlib): WAL, ``synchronous=NORMAL`` (commits append to the WAL
    without fsync; checkpoints sync: a killed process loses nothing, a power
    loss the newest transactions, like ASYNC_FLUSH), a 256 MiB page cache and
    reads through a 1 GiB ``mmap_size``. One WITHOUT ROWID table
    keyed by (queue_id, queue_offset), indexes on uniq_key, keys and (queue_id,
    store_ts). ``append`` is one autocommit INSERT per message;
    ``append_batch`` one transaction of ``executemany``. The keys column is
    indexed as a whole (the workload has one key per message; several keys per
    message would need a side table)."""

    name = "sqlite3"
    module = None
    CACHE_KIB = 256 * 1024  # page cache of the connection
    MMAP_SIZE = 1 << 30  # reads through mmap, as the mmap-based stores do

    def open(self, path, clock=None, read_only=False):
        import sqlite3

        self._init(clock)
        os.makedirs(path, exist_ok=True)
        db = os.path.join(path, "messages.db")
        if read_only:
            self.con = con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
        else:
            self.con = con = sqlite3.connect(db, isolation_level=None)
            con.execute("PRAGMA journal_mode=WAL")
            for stmt in _SQL_SCHEMA:
                con.execute(stmt)
        con.execute("PRAGMA synchronous=NORMAL")
        con.execute(f"PRAGMA cache_size=-{self.CACHE_KIB}")
        con.execute(f"PRAGMA mmap_size={self.MMAP_SIZE}")
        for q, mx in con.execute("SELECT queue_id, MAX(queue_offset) FROM messages GROUP BY queue_id"):
            self._next[q] = mx + 1
        self._pending = 0
        return self

    def _row(self, m):
        topic, body, q, flag, tags, keys, uniq, born = m
        qo = self._next.get(q, 0)
        ts = self._clock()
        self._next[q] = qo + 1
        return (topic, q, qo, flag, ts if born is None else born, ts, tags, keys, uniq, body)

    def append(self, m):
        row = self._row(m)
        self.con.execute(_SQL_INSERT, row)
        return row[2], row[5]

    def append_batch(self, msgs):
        con = self.con
        rows = [self._row(m) for m in msgs]
        con.execute("BEGIN")
        con.executemany(_SQL_INSERT, rows)
        con.execute("COMMIT")
        return [(r[2], r[5]) for r in rows]

    def consume(self, queue_id, from_offset, n=32):
        return self.con.execute(_SQL_CONSUME, (queue_id, from_offset, n)).fetchall()

    def lookup_key(self, key):
        return self.con.execute(_SQL_KEY, (key,)).fetchall()

    def lookup_time(self, queue_id, ts):
        r = self.con.execute(_SQL_TIME, (queue_id, ts)).fetchone()
        return r[0] if r is not None else self._next.get(queue_id, 0)

    def close(self):
        self.finish()
        self.con.close()


class SqliteTx1000(Sqlite):
    """sqlite3 with ``append`` still one INSERT per call, committed every 1000
    rows (the issue's "188k/s in 1000-row transactions")."""

    name = "sqlite3-tx1000"

    def append(self, m):
        con = self.con
        if not self._pending:
            con.execute("BEGIN")
        row = self._row(m)
        con.execute(_SQL_INSERT, row)
        self._pending += 1
        if self._pending == 1000:
            con.execute("COMMIT")
            self._pending = 0
        return row[2], row[5]

    def append_batch(self, msgs):
        self.finish()
        return super().append_batch(msgs)

    def finish(self):
        if self._pending:
            self.con.execute("COMMIT")
            self._pending = 0


# --- registry ---------------------------------------------------------------------------

STORES = ["rmqstore-cython", "rmqstore-python", "lmdb", "rocksdict", "sqlite3"]
APPEND_ONLY = ["sqlite3-tx1000"]  # extra rows of the append workload
WORKLOADS = ["append", "append-batch", "append-built", "append-batch-built", "first-put", "consume", "key-lookup",
             "time-lookup"]


def _message_class(kernels: str):
    """The Message class of the kernels a store was opened with (the Cython
    core's own, or the pure twin's)."""
    if kernels == "cython":
        from rmqstore._core import Message
    else:
        from rmqstore._pure.message import Message
    return Message


def make(name: str) -> Peer:
    if name.startswith("rmqstore-"):
        return RmqStore(name.split("-", 1)[1])
    return {"lmdb": Lmdb, "rocksdict": RocksDict, "sqlite3": Sqlite, "sqlite3-tx1000": SqliteTx1000}[name]()


def summary_lines(benchmarks) -> list:
    """The peers table (median ops/s per store and workload) and the ratio of
    rmqstore-cython to each other store, from pytest-benchmark's results."""
    rates: dict = {}
    n = None
    for b in benchmarks:
        info = b.extra_info or {}
        store, workload = info.get("peers_store"), info.get("workload")
        if not store or not workload or not b.stats:
            continue
        rates[(store, workload)] = info.get("ops", 1) / b.stats.median
        n = info.get("n", n)
    if not rates:
        return []
    stores = [s for s in STORES + APPEND_ONLY if any(k[0] == s for k in rates)]
    width = max(len(s) for s in stores) + 2
    cols = [max(14, len(w) + 2) for w in WORKLOADS]
    head = f"{'store':<{width}}" + "".join(f"{w:>{c}}" for w, c in zip(WORKLOADS, cols))
    lines = [f"N = {n:,} messages of 256 B, 8 queues (median ops per second)", head]
    for s in stores:
        cells = [rates.get((s, w)) for w in WORKLOADS]
        lines.append(f"{s:<{width}}" + "".join(f"{v:>{c},.0f}" if v else f"{'-':>{c}}" for v, c in zip(cells, cols)))
    base = "rmqstore-cython"
    if any(k[0] == base for k in rates):
        lines.append("")
        lines.append(f"{base} / store (above 1: rmqstore-cython is faster)")
        for s in stores:
            if s == base:
                continue
            cells = []
            for w, width_w in zip(WORKLOADS, cols):
                c, p = rates.get((base, w)), rates.get((s, w))
                cells.append(f"{c / p:>{width_w - 1}.2f}x" if c and p else f"{'-':>{width_w}}")
            lines.append(f"{'vs ' + s:<{width}}" + "".join(cells))
    return lines
