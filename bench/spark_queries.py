"""What the Spark benchmarks share (``test_spark_bench.py`` and
``spark_floor.py``, whose floor is only a floor if both run the same
query the same way): the session's settings, the groupBy query and the
timing."""

from __future__ import annotations

import time

#: local[2]'s settings for both (no UI: it costs the driver while timing)
SPARK_CONF = {"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "4g", "spark.ui.enabled": "false",
              "spark.ui.showConsoleProgress": "false"}


def by_hour(df) -> list:
    """``groupBy(topic, hour(store_timestamp))`` with a count and a sum of
    body lengths, collected in hour order."""
    from pyspark.sql import functions as F

    return df.groupBy("topic", F.date_trunc("hour", "store_timestamp").alias("hour")) \
        .agg(F.count("*").alias("n"), F.sum(F.length("body")).alias("body_bytes")).orderBy("hour").collect()


def timed(run, rounds: int) -> list:
    """Seconds of *rounds* calls of *run*, after one untimed call (page
    cache, Python workers, JIT)."""
    run()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        run()
        out.append(time.perf_counter() - t0)
    return out
