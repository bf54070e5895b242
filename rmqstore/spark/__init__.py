"""Apache Spark integration: RocketMQ stores as DataFrames (``rmqstore[spark]``).

* ``spark.read.format("rmqstore").load(store_dir)`` (or a list of store
  directories, one per broker) reads every CommitLog record; see
  :class:`~rmqstore.spark.source.RmqStoreDataSource` for columns and options.
* ``df.write.format("rmqstore").mode("append" | "overwrite").save(dir)``
  stores a DataFrame of messages.
* ``spark.readStream.format("rmqstore").load(store_dir)`` tails a live store.
* :func:`rebuild_consume_queues` and :func:`rebuild_index` (CLI:
  ``rmqstore spark rebuild-cq|rebuild-index <dir>``) rebuild a store's
  ConsumeQueues and IndexFiles from its CommitLog, byte-identical to what
  the store writes.

Call :func:`register` once per SparkSession before using the format name.
The rest of rmqstore never imports this package.
"""

from __future__ import annotations

try:
    import pyspark  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"rmqstore.spark needs PySpark: pip install 'rmqstore[spark]' ({e})") from e

from .rebuild import rebuild_consume_queues, rebuild_index
from .source import RmqStoreDataSource, register, spark_schema

__all__ = ["RmqStoreDataSource", "register", "spark_schema", "rebuild_consume_queues", "rebuild_index"]
