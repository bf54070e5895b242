"""The floor of a PySpark Python data source: what Spark itself costs to
take rows from a Python reader, with no store, no file and no decoding
(not a pytest suite; run it as a script).

A toy data source yields Arrow batches it built before the timing (the
shapes of ``bench/test_spark_bench.py``'s queries: one int64 column for
``count()``; ``topic``, ``store_timestamp`` and a 256-byte ``body`` for
``groupBy(topic, hour)`` with a count and a body-length sum), in as many
partitions as the ``rmqstore`` source plans for a store of that size. The
same rows are written to Parquet once, and each query is timed on both,
median of ``--rounds`` after a warm-up. Whatever the toy source costs
beyond Parquet is the Python Data Source API's hand-off (the worker's
Arrow stream, the JVM turning batches into rows), which no reader behind
that API avoids; the ``rmqstore`` source's own work comes on top.

    python bench/spark_floor.py                      # 11M rows, about 5 min
    python bench/spark_floor.py --rows 1000000 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile

import numpy as np
import pyarrow as pa

from spark_queries import SPARK_CONF, by_hour, timed

BODY = 256
BATCH = 65536
T0 = 1_700_000_000_000  # ms: the first row's store time; rows 10 ms apart


def _batches(part: int, parts: int, rows: int, shape: str):
    """The Arrow batches of partition *part*: its share of *rows*."""
    lo, hi = rows * part // parts, rows * (part + 1) // parts
    body = np.frombuffer(np.random.default_rng(part).bytes(BODY * BATCH), dtype=np.uint8)
    for s in range(lo, hi, BATCH):
        n = min(BATCH, hi - s)
        if shape == "count":
            yield pa.record_batch([pa.array(np.arange(s, s + n, dtype=np.int64))], names=["physical_offset"])
            continue
        offsets = pa.array(np.arange(0, BODY * (n + 1), BODY, dtype=np.int32))
        bodies = pa.Array.from_buffers(pa.binary(), n, [None, offsets.buffers()[1], pa.py_buffer(body[:BODY * n])])
        topic = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array(["BenchTopic"]))
        ts = pa.array((T0 + 10 * np.arange(s, s + n, dtype=np.int64)) * 1000, pa.timestamp("us", tz="UTC"))
        yield pa.record_batch([topic.cast(pa.string()), ts, bodies], names=["topic", "store_timestamp", "body"])


def _source():
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class FloorReader(DataSourceReader):
        def __init__(self, options):
            self.rows, self.parts, self.shape = int(options["rows"]), int(options["parts"]), options["shape"]

        def partitions(self):
            return [InputPartition(i) for i in range(self.parts)]

        def read(self, partition):
            yield from _batches(partition.value, self.parts, self.rows, self.shape)

    class FloorSource(DataSource):
        @classmethod
        def name(cls):
            return "rmqstore_floor"

        def schema(self):
            if self.options.get("shape") == "count":
                return "physical_offset long"
            return "topic string, store_timestamp timestamp, body binary"

        def reader(self, schema):
            return FloorReader(self.options)

    return FloorSource


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=11_000_000, help="rows (default 11,000,000)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds a query (default 3, after a warm-up)")
    ap.add_argument("--parts", type=int, default=0,
                    help="partitions (default: as the rmqstore source plans, 128 MiB of 420-byte records each)")
    ap.add_argument("--dir", default=None, help="where to write the Parquet copy (default: a temporary directory)")
    args = ap.parse_args(argv)
    parts = args.parts or max(1, -(-args.rows * 420 // (128 << 20)))

    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers: this interpreter
    from pyspark import cloudpickle
    from pyspark.sql import functions as F

    if __name__ != "__main__":  # (imported: workers cannot import this script, its source goes by value)
        cloudpickle.register_pickle_by_value(sys.modules[__name__])

    from rmqstore.spark.cli import session

    spark = session("local[2]", "rmqstore-floor", SPARK_CONF)
    spark.dataSource.register(_source())
    tmp = tempfile.mkdtemp(prefix="rmqstore-floor-", dir=args.dir)
    try:
        def toy(shape):
            return spark.read.format("rmqstore_floor").option("rows", args.rows).option("parts", parts) \
                .option("shape", shape).load()

        pq = os.path.join(tmp, "parquet")
        toy("group").withColumn("physical_offset", F.monotonically_increasing_id()).write.parquet(pq)

        def parquet(*columns):
            return spark.read.parquet(pq).select(*columns)

        cases = {
            "count()": (lambda: toy("count").count(), lambda: parquet("physical_offset").count()),
            "groupBy(topic, hour)": (lambda: by_hour(toy("group")),
                                     lambda: by_hour(parquet("topic", "store_timestamp", "body"))),
        }
        print(f"Python data source floor, {args.rows:,} rows in {parts} partitions, local[2], "
              f"median of {args.rounds}:")
        for name, (a, b) in cases.items():
            if a() != b():  # the same answer, outside the timing
                raise AssertionError(f"{name}: the toy source and Parquet disagree")
            ta, tb = statistics.median(timed(a, args.rounds)), statistics.median(timed(b, args.rounds))
            print(f"  {name:<22} toy source {ta:6.2f} s  parquet {tb:6.2f} s  toy / parquet {ta / tb:.2f}x")
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
