"""Spark read throughput, queries and writes: the ``rmqstore`` data source
against Spark's Parquet reader and writer on the same messages, in one run.

Size knob: RMQSTORE_BENCH_SPARK_N (messages, default 2,000,000; 256-byte
random bodies, a tag, a key and a unique key each, 8 queues, the 4.1 MiB
CommitLog files of ``StoreConfig()``). The store is written once with the live
kernels; the Parquet copy is that store read through the data source and
written by Spark (snappy, its default). Each reader is timed over
RMQSTORE_BENCH_SPARK_ROUNDS rounds (default 3, after one warm-up) of a full
scan into Spark's ``noop`` sink, which materialises every column of every
row; the narrow variants read all columns but ``body`` and ``properties``
(the data source's ``schema=narrow``, Parquet's column pruning). Reported:
messages/s and MB/s (CommitLog bytes of the records, the same figure for
both) and the ratio. Speed is never asserted: the test checks that both
readers return the same rows (count, sums of offsets and sizes).

``test_key_lookup_vs_parquet`` times ``where keys = ...`` and ``where
unique_key = ...`` (the data source answers them through the IndexFile,
Parquet by its row-group statistics and a scan) over
RMQSTORE_BENCH_SPARK_LOOKUPS keys (default 5), each query once after a
warm-up, and checks both find the same one row.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import sys
import time

import pytest

from spark_support import require_spark

require_spark()

import rmqstore  # noqa: E402
from rmqstore import Message, MessageStore, StoreConfig  # noqa: E402
from rmqstore.spark.cli import session  # noqa: E402
from spark_queries import SPARK_CONF, by_hour, timed  # noqa: E402

N = int(os.environ.get("RMQSTORE_BENCH_SPARK_N", "2000000"))
ROUNDS = int(os.environ.get("RMQSTORE_BENCH_SPARK_ROUNDS", "3"))
LOOKUPS = int(os.environ.get("RMQSTORE_BENCH_SPARK_LOOKUPS", "5"))
NARROW = "physical_offset, topic, queue_id, queue_offset, store_timestamp, born_timestamp, born_host, " \
         "store_host, sys_flag, flag, reconsume_times, tags, keys, unique_key, msg_id, store_size, " \
         "prepared_transaction_offset, body_crc, broker"


@pytest.fixture(scope="module")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers: this interpreter
    s = session("local[2]", "rmqstore-bench", SPARK_CONF)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def stores(tmp_path_factory, spark):
    """(store dir, parquet dir): N seeded messages in both forms."""
    base = tmp_path_factory.mktemp("spark-bench")
    root = base / "broker-a" / "store"
    rnd = random.Random(4321)
    t = iter(range(1_700_000_000_000, 1_700_000_000_000 + 10 * N))
    # an embedded store's IndexFile geometry (StoreConfig()'s: 1.7 MB files):
    # the key lookups use it; a broker's 420 MB files would only cost disk here
    cfg = StoreConfig()
    with MessageStore.open(root, config=cfg, clock=lambda: next(t)) as st:
        for lo in range(0, N, 10_000):
            st.put_messages([
                Message("BenchTopic", rnd.randbytes(256), queue_id=i % 8, tags=f"Tag{i % 4}", keys=f"key-{i}",
                        unique_key=f"{4321:08X}{i:024X}", born_timestamp=1_700_000_000_000 + i)
                for i in range(lo, min(N, lo + 10_000))
            ])
    pq = base / "parquet"
    spark.read.format("rmqstore").load(str(root)).write.parquet(str(pq))
    return root, pq


def test_read_throughput_vs_parquet(spark, stores, capsys):
    root, pq = stores
    ours = spark.read.format("rmqstore").load(str(root))
    ours_narrow = spark.read.format("rmqstore").option("schema", "narrow").load(str(root))
    theirs = spark.read.parquet(str(pq))
    theirs_narrow = theirs.selectExpr(*NARROW.split(", "))

    # same rows in both (outside the timing)
    check = "count(*) AS n, sum(physical_offset) AS p, sum(store_size) AS s, sum(length(body)) AS b"
    a, b = ours.selectExpr(*check.split(", ")).first(), theirs.selectExpr(*check.split(", ")).first()
    assert a == b and a.n == N
    record_mb = a.s / 1e6

    results = {}
    for name, df in (("rmqstore", ours), ("parquet", theirs), ("rmqstore narrow", ours_narrow),
                     ("parquet narrow", theirs_narrow)):
        results[name] = statistics.median(timed(lambda df=df: df.write.format("noop").mode("overwrite").save(), ROUNDS))

    pq_mb = sum(f.stat().st_size for f in pq.rglob("*.parquet")) / 1e6
    lines = [
        f"Spark read, {N:,} messages ({record_mb:,.0f} MB of CommitLog records; Parquet files {pq_mb:,.0f} MB), "
        f"local[2], median of {ROUNDS}, kernels {rmqstore.IMPLEMENTATION}:",
    ]
    for name, secs in results.items():
        lines.append(f"  {name:<16} {secs:7.2f} s  {N / secs:>12,.0f} msgs/s  {record_mb / secs:8.1f} MB/s")
    for kind in ("", " narrow"):
        r = results["parquet" + kind] / results["rmqstore" + kind]
        lines.append(f"  rmqstore{kind} / parquet{kind}: {r:.2f}x (above 1: the data source is faster)")
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def test_key_lookup_vs_parquet(spark, stores, capsys):
    # lookups need Spark to push WHERE conditions to the source (off by
    # default: see rmqstore.spark.register); each query here loads anew
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        _key_lookup_vs_parquet(spark, stores, capsys)
    finally:
        spark.conf.unset("spark.sql.python.filterPushdown.enabled")


def _key_lookup_vs_parquet(spark, stores, capsys):
    root, pq = stores
    ours = spark.read.format("rmqstore").option("schema", "narrow").load(str(root))
    theirs = spark.read.parquet(str(pq)).selectExpr(*NARROW.split(", "))
    rnd = random.Random(99)
    picks = [rnd.randrange(N) for _ in range(LOOKUPS)]
    results: dict = {}
    for column, value in (("keys", lambda i: f"key-{i}"), ("unique_key", lambda i: f"{4321:08X}{i:024X}")):
        option = {"keys": "lookupKeys", "unique_key": "lookupUniqueKeys"}[column]
        for name, df in (("rmqstore", ours), ("option", None), ("parquet", theirs)):
            if df is None:  # the lookup option: a DataFrame loaded per lookup, as a caller's code does
                def q(i, option=option, value=value, column=column):
                    found = spark.read.format("rmqstore").option("schema", "narrow").option(option, value(i)) \
                        .load(str(root))
                    return found.where(f"{column} = '{value(i)}'").collect()
            else:
                q = lambda i, df=df, column=column, value=value: df.where(f"{column} = '{value(i)}'").collect()  # noqa: E731
            q(picks[0])  # warm-up
            times = []
            for i in picks:
                t0 = time.perf_counter()
                rows = q(i)
                times.append(time.perf_counter() - t0)
                assert [r.physical_offset for r in rows] == [r.physical_offset for r in theirs.where(
                    f"{column} = '{value(i)}'").select("physical_offset").collect()] and len(rows) == 1
            results[(column, name)] = statistics.median(times)
    lines = [f"Spark lookup of one message among {N:,}, local[2], median of {LOOKUPS} keys, "
             f"kernels {rmqstore.IMPLEMENTATION}:"]
    for column in ("keys", "unique_key"):
        a, o, b = results[(column, "rmqstore")], results[(column, "option")], results[(column, "parquet")]
        lines.append(f"  {column:<10} rmqstore WHERE {a:6.2f} s  lookup option {o:6.2f} s  parquet {b:6.2f} s  "
                     f"parquet / rmqstore {b / a:.2f}x, / option {b / o:.2f}x")
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def test_queries_vs_parquet(spark, stores, capsys):
    """count(), groupBy(topic, hour) with a body-length sum, and one topic
    over a tenth of the store's time span: the data source given the
    columns a query needs (the ``columns`` option; a Python source sees no
    column pruning from Spark 4.3) against Parquet pruning the same."""
    from pyspark.sql import functions as F

    root, pq = stores
    first, last = spark.read.parquet(str(pq)).selectExpr("unix_millis(min(store_timestamp))",
                                                         "unix_millis(max(store_timestamp))").first()
    lo = first + (last - first) // 2
    hi = lo + (last - first) // 10

    def ours(columns, **opts):
        r = spark.read.format("rmqstore").option("columns", columns)
        for k, v in opts.items():
            r = r.option(k, v)
        return r.load(str(root))

    def theirs(columns):
        return spark.read.parquet(str(pq)).select(*columns.split(","))

    window = f"topic = 'BenchTopic' AND store_timestamp >= timestamp_millis({lo}) " \
             f"AND store_timestamp <= timestamp_millis({hi})"
    cases = {
        "count()": (lambda: ours("physical_offset").count(), lambda: theirs("physical_offset").count()),
        "groupBy(topic, hour)": (lambda: by_hour(ours("topic,store_timestamp,body")),
                                 lambda: by_hour(theirs("topic,store_timestamp,body"))),
        "topic + time window": (
            lambda: ours("topic,store_timestamp,body", topics="BenchTopic", minStoreTimestamp=str(lo),
                         maxStoreTimestamp=str(hi)).where(window).agg(F.sum(F.length("body"))).first()[0],
            lambda: theirs("topic,store_timestamp,body").where(window).agg(F.sum(F.length("body"))).first()[0]),
    }
    lines = [f"Spark queries over {N:,} messages, local[2], median of {ROUNDS}, kernels {rmqstore.IMPLEMENTATION}:"]
    for name, (a, b) in cases.items():
        assert a() == b()  # the same answer (outside the timing)
        ta, tb = statistics.median(timed(a, ROUNDS)), statistics.median(timed(b, ROUNDS))
        lines.append(f"  {name:<22} rmqstore {ta:6.2f} s  parquet {tb:6.2f} s  rmqstore / parquet {ta / tb:.2f}x")
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def test_write_vs_parquet(spark, stores, tmp_path, capsys):
    """``df.write`` of the N messages (read from the Parquet copy, the
    message columns a producer sets) as a new rmqstore store (overwrite)
    and as Parquet; then the store's records are compared with the
    source's bodies and keys."""
    _root, pq = stores
    src = spark.read.parquet(str(pq)).select("topic", "queue_id", "tags", "keys", "unique_key", "born_timestamp",
                                             "body")
    runs: dict = {"rmqstore": 0, "parquet": 0}

    def write(fmt):
        def run():
            runs[fmt] += 1
            out = tmp_path / f"{fmt}{runs[fmt]}"
            w = src.write.mode("overwrite")
            w.format("rmqstore").save(str(out)) if fmt == "rmqstore" else w.parquet(str(out))
            shutil.rmtree(tmp_path / f"{fmt}{runs[fmt] - 1}", ignore_errors=True)  # (two on disk at most)
        return run

    ta, tb = statistics.median(timed(write("rmqstore"), ROUNDS)), statistics.median(timed(write("parquet"), ROUNDS))
    last = tmp_path / f"rmqstore{runs['rmqstore']}"
    check = ["count(*) AS n", "sum(length(body)) AS b", "sum(hash(keys, unique_key)) AS h"]
    assert spark.read.format("rmqstore").load(str(last)).selectExpr(*check).first() == \
        src.selectExpr(*check).first()
    lines = [f"Spark write of {N:,} messages, local[2], median of {ROUNDS}, kernels {rmqstore.IMPLEMENTATION}:",
             f"  rmqstore {ta:6.2f} s  {N / ta:>10,.0f} msgs/s   parquet {tb:6.2f} s  "
             f"rmqstore / parquet {ta / tb:.2f}x"]
    with capsys.disabled():
        print("\n" + "\n".join(lines))
