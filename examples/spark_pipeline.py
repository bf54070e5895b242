"""A worked Spark pipeline over RocketMQ stores (one store directory per broker).

    python examples/spark_pipeline.py tests/data/golden/tiny/store tests/data/golden/basic/store
    rmqstore demo && python examples/spark_pipeline.py rmqstore-demo

Prints three reports, computed by Spark from the CommitLogs:

1. per topic and hour (UTC, by store time): messages, record bytes (the
   CommitLog space they take) and body bytes;
2. a key trace across brokers: every message whose KEYS or UNIQ_KEY holds
   the key (``--key``; default: the key seen on the most messages), in store
   time order, with the broker, queue and offsets that locate it;
3. messages per tag (TAGS), per topic.

Needs ``pip install 'rmqstore[spark]'`` and Java 17+. ``--master`` picks the
Spark master (default ``local[*]``); the same code runs on a cluster whose
executors see the store directories.
"""

from __future__ import annotations

import argparse
import sys

from pyspark.sql import functions as F

from rmqstore.spark.cli import session


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("stores", nargs="+", help="store directories, one per broker")
    p.add_argument("--key", help="key to trace (default: the most frequent key)")
    p.add_argument("--master", default="local[*]")
    p.add_argument("--rows", type=int, default=40, help="rows to show per report")
    args = p.parse_args(argv)

    spark = session(args.master, "rmqstore example pipeline")
    # the narrow schema: no bodies or property maps are decoded except where needed
    msgs = spark.read.format("rmqstore").option("schema", "narrow").load(args.stores).cache()

    print("== 1. messages and bytes per topic and hour (UTC)")
    bodies = spark.read.format("rmqstore").option("columns", "broker,physical_offset,body").load(args.stores)
    sized = msgs.join(bodies.select("broker", "physical_offset", F.length("body").alias("body_bytes")),
                      ["broker", "physical_offset"])
    (
        sized.groupBy("topic", F.date_trunc("hour", "store_timestamp").alias("hour"))
        .agg(F.count("*").alias("messages"), F.sum("store_size").alias("record_bytes"),
             F.sum("body_bytes").alias("body_bytes"))
        .orderBy("topic", "hour")
        .show(args.rows, truncate=False)
    )

    print("== 2. key trace across brokers")
    keyed = msgs.select(
        "*", F.explode(F.array_union(
            F.filter(F.split(F.coalesce("keys", F.lit("")), " "), lambda k: k != ""),
            F.filter(F.array(F.coalesce("unique_key", F.lit(""))), lambda k: k != ""),
        )).alias("key")
    )
    key = args.key
    if key is None:
        top = keyed.groupBy("key").count().orderBy(F.desc("count"), "key").first()
        key = top["key"] if top else None
    if key is None:
        print("no message has a key")
    else:
        print(f"key {key!r}:")
        (
            keyed.where(F.col("key") == key)
            .select("store_timestamp", "broker", "topic", "queue_id", "queue_offset", "physical_offset", "msg_id")
            .orderBy("store_timestamp", "broker", "physical_offset")
            .show(args.rows, truncate=False)
        )

    print("== 3. messages per tag")
    (
        msgs.groupBy("topic", F.coalesce("tags", F.lit("(no tag)")).alias("tag"))
        .count()
        .orderBy("topic", F.desc("count"), "tag")
        .show(args.rows, truncate=False)
    )
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
