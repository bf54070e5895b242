"""The ``rmqstore`` Spark data source (PySpark's Python Data Source API).

Reading (``spark.read.format("rmqstore")``)
    ``.load(store_dir)`` or ``.load([dir_a, dir_b])``: every CommitLog record
    of the stores, one row per message, columns as :data:`rmqstore.arrow.COLUMNS`
    (``broker`` names the store, see :func:`rmqstore.arrow.broker_name`).
    A partition reads up to ``splitBytes`` of one store's CommitLog: a file
    larger than that is cut (only at record starts the ConsumeQueues know),
    smaller consecutive files are read by one task (a task costs Spark tens
    of milliseconds, a file of an embedded store holds 4.1 MiB). Rows come as
    Arrow record batches decoded by the bulk decoder of the core.

    Options: ``brokers`` (comma-separated names, one per path),
    ``schema`` (``full``, or ``narrow``: no ``body`` and ``properties``;
    Spark 4.3 does not prune columns for Python sources), ``columns``
    (comma-separated subset, in any order), ``splitBytes`` (default 128 MiB),
    ``batchRows`` (default 65536), ``checkCrc`` (verify body CRCs; default
    true, as the store's own reads; ``false`` is faster), ``onCorrupt`` at
    a damaged record (one that does not validate, or zeros with valid
    records after them): ``fail`` (default) raises CorruptedFileError
    naming the file and position; ``skip`` reads on from the next valid
    record, logging what it skipped; ``stop`` ends that partition there,
    logged. Streaming and the rebuild jobs behave the same.
    Filters, applied exactly and used to skip files (:class:`rmqstore.arrow.ScanFilter`):
    ``topics``, ``queueIds`` (comma-separated), ``minPhysicalOffset``,
    ``maxPhysicalOffset`` (bytes, inclusive), ``minStoreTimestamp``,
    ``maxStoreTimestamp`` (ms since epoch or ISO-8601, UTC unless a zone is
    given; inclusive). Lookups through the store's indexes (one of them,
    comma-separated values; only the matching records are read):
    ``lookupKeys`` (RocketMQ's query by key: one of a record's KEYS, or its
    UNIQ_KEY), ``lookupUniqueKeys``, ``lookupMsgIds``. An option not named
    here is an error listing the valid ones, and so is a directory that holds no store. WHERE conditions
    on topic, queue_id, physical_offset and store_timestamp prune the same
    way (Spark still evaluates them) under
    ``spark.sql.python.filterPushdown.enabled``, off unless the session
    turns it on (:func:`register` says why: Spark reuses a pushdown's plan
    for later queries of the same DataFrame); ``pushdown=false`` turns it
    off for one read (with the conf off, only the options prune).

Writing (``df.write.format("rmqstore")``)
    see :class:`RmqStoreWriter`.

Streaming (``spark.readStream.format("rmqstore")``)
    see :class:`RmqStoreStreamReader`.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .. import arrow
from ..exceptions import OutputNotVisibleError
from ..format.layout import KEY_SEPARATOR
from ..storage import uri
from ..store.args import time_ms

__all__ = ["RmqStoreDataSource", "RmqStoreWriter", "RmqStoreStreamReader", "register", "spark_schema"]

_SPARK_TYPES: dict = {
    "broker": StringType(), "physical_offset": LongType(), "topic": StringType(), "queue_id": IntegerType(),
    "queue_offset": LongType(), "store_timestamp": TimestampType(), "born_timestamp": TimestampType(),
    "born_host": StringType(), "store_host": StringType(), "sys_flag": IntegerType(), "flag": IntegerType(),
    "reconsume_times": IntegerType(), "tags": StringType(), "keys": StringType(), "unique_key": StringType(),
    "msg_id": StringType(), "properties": MapType(StringType(), StringType()), "body": BinaryType(),
    "store_size": IntegerType(), "prepared_transaction_offset": LongType(), "body_crc": IntegerType(),
}


def spark_schema(columns=None) -> StructType:
    """The Spark schema of *columns* (default: every column), all nullable.
    Raises ValueError for an unknown column."""
    cols = arrow.COLUMNS if columns is None else tuple(columns)
    arrow.arrow_schema(cols)  # validates the names
    return StructType([StructField(c, _SPARK_TYPES[c], True) for c in cols])


#: the Spark setting under which Spark hands WHERE conditions to a Python
#: source's reader; off unless the session turns it on (it only lets readers that offer
#: pushFilters see the conditions; Spark still evaluates them all)
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark) -> None:
    """Register the ``rmqstore`` format with *spark* (a SparkSession).

    WHERE conditions reach the reader (pruning files by topic, queue,
    physical offset and store time; keys, unique_key and msg_id looked up
    through the indexes) only under ``spark.sql.python.filterPushdown.enabled``,
    which this leaves as the session has it (off by default): Spark 4.1-4.3
    keep the partitions a pushdown planned on the DataFrame, and a later
    query of the same DataFrame without such a condition reads them, so
    ``df.where("topic = 'A'").count()`` then ``df.count()`` counts only
    topic A's files. A session that turns the conf on should load a new
    DataFrame for each query. The filter options (``topics``, ...) prune
    safely either way."""
    spark.dataSource.register(RmqStoreDataSource)


# --- options ----------------------------------------------------------------------------------------


def _truthy(value) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _paths(options) -> list:
    """Store directories from the ``path`` / ``paths`` options."""
    if options.get("paths"):
        raw = options["paths"]
        try:
            paths = json.loads(raw)
        except ValueError:
            paths = [p for p in raw.split(",") if p]
        if isinstance(paths, str):
            paths = [paths]
    elif options.get("path"):
        paths = [options["path"]]
    else:
        raise ValueError("no store directory: use .load(dir) or .load([dir, ...])")
    return [_where(p) for p in paths]


def _where(path: str) -> str:
    """A store's place as every host can name it: a URI as given
    (:mod:`rmqstore.storage.uri`), else an absolute path (made on the
    driver: a relative one would be looked up in each executor's own
    working directory)."""
    return path if uri.is_uri(path) else os.path.abspath(_local(path))


def _local(path: str) -> str:
    """A filesystem path from a path or a ``file:`` URI."""
    if path.startswith("file://"):
        return path[len("file://"):]
    if path.startswith("file:"):
        return path[len("file:"):]
    return path


def _columns(options) -> tuple:
    if options.get("columns"):
        return tuple(c.strip() for c in options["columns"].split(",") if c.strip())
    shape = options.get("schema", "full").lower()
    if shape == "narrow":
        return arrow.NARROW_COLUMNS
    if shape != "full":
        raise ValueError(f"option schema must be 'full' or 'narrow', got {shape!r}")
    return arrow.COLUMNS


def _int_opt(options, name):
    v = options.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"option {name} must be an integer, got {v!r}") from None


def _time_opt(options, name):
    """A store-time bound: ms since epoch or ISO-8601 (UTC unless a zone is given)."""
    v = options.get(name)
    if v is None or v == "":
        return None
    try:
        return time_ms(v)
    except ValueError as e:
        raise ValueError(f"option {name}: {e}") from None


#: the options of each direction (Spark's option names are case-insensitive)
READ_OPTIONS = frozenset({
    "path", "paths", "brokers", "schema", "columns", "splitBytes", "batchRows", "checkCrc", "onCorrupt",
    "topics", "queueIds", "minPhysicalOffset", "maxPhysicalOffset", "minStoreTimestamp", "maxStoreTimestamp",
    "pushdown", "lookupKeys", "lookupUniqueKeys", "lookupMsgIds",
})
#: each lookup option and the column arrow.lookup_splits searches for it
_LOOKUP_OPTIONS = {"lookupKeys": "keys", "lookupUniqueKeys": "unique_key", "lookupMsgIds": "msg_id"}
STREAM_OPTIONS = (READ_OPTIONS - set(_LOOKUP_OPTIONS)) | {"startingOffsets", "maxRecordsPerTrigger"}
WRITE_OPTIONS = frozenset({"path", "paths", "brokerDirs", "storeHost", "lockTimeout"})  # and config.<setting>


def check_options(options, valid, what: str, prefixes=()) -> None:
    """Refuse an option *valid* does not name (a misspelt ``topic`` for
    ``topics`` read everything before), listing the valid ones."""
    known = {o.lower() for o in valid}
    unknown = sorted(k for k in options if k.lower() not in known
                     and not any(k.lower().startswith(p) for p in prefixes))
    if unknown:
        extra = "".join(f", {p}<name>" for p in prefixes)
        raise ValueError(f"unknown option(s) {', '.join(map(repr, unknown))} for {what}; "
                         f"valid: {', '.join(sorted(valid, key=str.lower))}{extra}")


def _check_stores(paths: list) -> None:
    """A read's directories each hold a store (a directory above ``store/``
    read as an empty table before)."""
    for p in paths:
        if arrow._is_dir(arrow._under(p, "commitlog")) or arrow._is_dir(arrow._under(p, "consumequeue")):
            continue
        hint = ""
        below = arrow._under(p, "store")
        if arrow._is_dir(arrow._under(below, "commitlog")):
            hint = f"; the store is in {uri.shown(below)}"
        elif not arrow._is_dir(p):
            hint = "; no such directory"
        raise ValueError(f"no rmqstore / RocketMQ store in {uri.shown(p)} (no commitlog/ directory){hint}")


def _option_filter(options) -> arrow.ScanFilter:
    topics = options.get("topics")
    qids = options.get("queueIds")
    return arrow.ScanFilter(
        topics=frozenset(t for t in topics.split(",") if t) if topics else None,
        queue_ids=frozenset(int(q) for q in qids.split(",") if q.strip()) if qids else None,
        min_physical_offset=_int_opt(options, "minPhysicalOffset"),
        max_physical_offset=_int_opt(options, "maxPhysicalOffset"),
        min_store_timestamp=_time_opt(options, "minStoreTimestamp"),
        max_store_timestamp=_time_opt(options, "maxStoreTimestamp"),
    )


def _lookup_option(options) -> tuple | None:
    """``(column, values)`` of the one lookup option given, or None."""
    given = [(name, options[name]) for name in _LOOKUP_OPTIONS if options.get(name)]
    if len(given) > 1:
        raise ValueError(f"options {' and '.join(n for n, _ in given)} cannot be combined: give one lookup option")
    if not given:
        return None
    name, raw = given[0]
    values = tuple(v.strip() for v in raw.split(",") if v.strip())
    if not values:
        raise ValueError(f"option {name} names no value")
    return _LOOKUP_OPTIONS[name], values


def _brokers(options, paths: list) -> list:
    names = options.get("brokers")
    return arrow._broker_names(paths, [n.strip() for n in names.split(",")] if names else None)


# --- the data source ------------------------------------------------------------------------------


class RmqStoreDataSource(DataSource):
    """Format ``rmqstore``: RocketMQ store directories as a table (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return "rmqstore"

    def schema(self) -> StructType:
        return spark_schema(_columns(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        check_options(self.options, READ_OPTIONS, "reading an rmqstore table")
        if _truthy(self.options.get("pushdown", "true")) and _planning_with_pushdown():
            return _PushdownReader(self.options, schema)
        return RmqStoreReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> RmqStoreWriter:
        check_options(self.options, WRITE_OPTIONS, "writing an rmqstore table", prefixes=("config.",))
        return RmqStoreWriter(self.options, schema, overwrite)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        check_options(self.options, STREAM_OPTIONS, "streaming from an rmqstore table")
        return RmqStoreStreamReader(self.options, schema)


#: the worker module Spark plans a read in when it pushes filters down
_PUSHDOWN_WORKER = "pyspark.sql.worker.data_source_pushdown_filters"


def _planning_with_pushdown() -> bool:
    """Whether Spark asks for the reader to push filters into it. Spark plans
    a Python source in one of two worker modules, chosen by
    ``spark.sql.python.filterPushdown.enabled``; the other one fails any
    reader that implements ``pushFilters``, so the choice is made here, by
    the module this worker process runs (each process runs one: imported by
    Spark's daemon, or run as ``__main__`` with ``-m``)."""
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return _PUSHDOWN_WORKER in sys.modules or getattr(main_spec, "name", None) == _PUSHDOWN_WORKER


class RmqStoreReader(DataSourceReader):
    """Batch reader: a partition reads consecutive splits of one store
    (:func:`rmqstore.arrow.store_splits`), up to ``splitBytes`` in all."""

    def __init__(self, options, schema: StructType):
        self.paths = _paths(options)
        _check_stores(self.paths)
        self.brokers = _brokers(options, self.paths)
        self.columns = tuple(f.name for f in schema.fields)
        self.filter = _option_filter(options)
        self.split_bytes = int(options.get("splitBytes", 128 << 20))
        self.batch_rows = int(options.get("batchRows", arrow.DEFAULT_BATCH_ROWS))
        self.check_crc = _truthy(options.get("checkCrc", "true"))
        self.on_corrupt = options.get("onCorrupt", "fail").lower()
        if self.on_corrupt not in arrow.ON_CORRUPT:
            raise ValueError(f"option onCorrupt must be one of {', '.join(arrow.ON_CORRUPT)}, "
                             f"got {self.on_corrupt!r}")
        # (an option, unlike a WHERE, is part of the DataFrame: safe without pushdown)
        self.lookup_option = _lookup_option(options)

    def partitions(self) -> list:
        if self.lookup_option is not None:
            return self._lookup_partitions(*self.lookup_option)
        out: list = []
        for path, broker in zip(self.paths, self.brokers):
            out.extend(InputPartition({"splits": g})
                       for g in _packed(arrow.store_splits(path, broker, self.split_bytes, self.filter),
                                        self.split_bytes))
        return out

    def _lookup_partitions(self, column: str, values: tuple) -> list:
        """One partition reading every record :func:`rmqstore.arrow.lookup_splits` finds."""
        splits: list = []
        for path, broker in zip(self.paths, self.brokers):
            splits.extend(tuple(s) for s in arrow.lookup_splits(path, broker, column, values, self.filter))
        # the records found are few and scattered: one task reads them all
        return [InputPartition({"lookup": tuple(splits)})] if splits else []

    def read(self, partition: InputPartition) -> Iterator:
        if partition.value is None:  # a read of stores without records
            return iter(())
        if "lookup" in partition.value:
            return self._read_lookup(partition.value["lookup"])
        return (b for s in partition.value["splits"] for b in self._read(arrow.Split(*s)))

    def _read(self, split: arrow.Split, columns: tuple | None = None) -> Iterator:
        return arrow.read_split(
            split, columns or self.columns, self.batch_rows, self.filter, self.check_crc, self.on_corrupt
        )

    def _read_lookup(self, splits: tuple) -> Iterator:
        """The records an index lookup found, one small split each, in
        batches of up to ``batchRows`` rows; with a lookup option, only
        the records that match it (the splits hold a superset)."""
        import pyarrow as pa

        match = _lookup_match(*self.lookup_option) if self.lookup_option is not None else None
        columns = self.columns if match is None else tuple(dict.fromkeys(self.columns + _MATCH_COLUMNS))
        pending: list = []
        rows = 0
        for s in splits:
            for b in self._read(arrow.Split(*s), columns):
                if match is not None:
                    keep = [match(r) for r in b.select(list(_MATCH_COLUMNS)).to_pylist()]
                    b = b.filter(pa.array(keep, pa.bool_())).select(list(self.columns))
                pending.append(b)
                rows += b.num_rows
            if rows >= self.batch_rows:
                yield from pa.Table.from_batches(pending).combine_chunks().to_batches()
                pending, rows = [], 0
        if rows:
            yield from pa.Table.from_batches(pending).combine_chunks().to_batches()


def _packed(splits: list, limit: int) -> list:
    """*splits* (in CommitLog order) as tuples of consecutive ones, each
    ``limit`` bytes in all at most unless one split alone is larger."""
    groups: list = []
    size = 0
    for s in splits:
        n = s.end - s.start
        if groups and size + n <= limit:
            groups[-1].append(tuple(s))
            size += n
        else:
            groups.append([tuple(s)])
            size = n
    return [tuple(g) for g in groups]


#: the columns a lookup option's match is told by
_MATCH_COLUMNS = ("keys", "unique_key", "msg_id")


def _lookup_match(column: str, values: tuple):
    """Whether a row (a dict of :data:`_MATCH_COLUMNS`) matches a lookup
    option: for ``keys`` RocketMQ's query by key (one of the KEYS, or the
    UNIQ_KEY), else the column equal to one of *values*."""
    wanted = frozenset(values)
    if column == "keys":
        return lambda r: (r["unique_key"] in wanted
                          or not wanted.isdisjoint((r["keys"] or "").split(KEY_SEPARATOR)))
    return lambda r: r[column] in wanted


class _PushdownReader(RmqStoreReader):
    """The reader Spark hands WHERE conditions to (``pushdown=true``). An
    equality (or IN) on ``keys``, ``unique_key`` or ``msg_id`` is answered
    through the store's indexes: only the records they find are read
    (:func:`rmqstore.arrow.lookup_splits`)."""

    lookup: tuple | None = None  # (column, values) of the first lookup filter

    def pushFilters(self, filters: list) -> Iterator:
        for f in filters:
            got = _to_scan_filter(f)
            if got is not None:
                self.filter = self.filter.intersect(got)
            if self.lookup is None:
                self.lookup = _to_lookup(f)  # (one is enough: Spark checks the others on what it finds)
            # Spark evaluates every filter again: pruning here is only a shortcut
            yield f

    def partitions(self) -> list:
        if self.lookup is None or self.lookup_option is not None:
            return super().partitions()
        return self._lookup_partitions(*self.lookup)


def _to_lookup(f) -> tuple | None:
    """``(column, values)`` when the store's indexes can answer Spark filter
    *f* (EqualTo or In on a lookup column, non-empty strings), else None."""
    col = f.attribute[0] if len(f.attribute) == 1 else None
    if col not in arrow.LOOKUP_COLUMNS:
        return None
    values = [f.value] if isinstance(f, EqualTo) else list(f.value) if isinstance(f, In) else None
    if not values or not all(isinstance(v, str) and v for v in values):
        return None
    return col, tuple(values)


def _ms_bounds(value) -> tuple:
    """(floor, ceil) ms since epoch of a filter's timestamp literal; a naive
    datetime is widened by a day since its zone is not known here."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            base = value.replace(tzinfo=datetime.timezone.utc).timestamp()
            return int((base - 86400) * 1000), int((base + 86400) * 1000) + 1
        ts = value.timestamp() * 1000
        return int(ts // 1), int(-(-ts // 1))
    if isinstance(value, datetime.date):
        base = datetime.datetime(value.year, value.month, value.day, tzinfo=datetime.timezone.utc).timestamp()
        return int((base - 86400) * 1000), int((base + 2 * 86400) * 1000)
    return int(value), int(value)


def _to_scan_filter(f) -> arrow.ScanFilter | None:
    """The pruning a Spark filter allows (None: none)."""
    col = f.attribute[0] if len(f.attribute) == 1 else None
    if col == "topic":
        if isinstance(f, EqualTo) and isinstance(f.value, str):
            return arrow.ScanFilter(topics=frozenset([f.value]))
        if isinstance(f, In) and all(isinstance(v, str) for v in f.value):
            return arrow.ScanFilter(topics=frozenset(f.value))
        return None
    if col == "queue_id":
        if isinstance(f, EqualTo) and isinstance(f.value, int):
            return arrow.ScanFilter(queue_ids=frozenset([f.value]))
        if isinstance(f, In) and all(isinstance(v, int) for v in f.value):
            return arrow.ScanFilter(queue_ids=frozenset(f.value))
        return None
    if col not in ("physical_offset", "store_timestamp"):
        return None
    if not isinstance(f, (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)):
        return None
    try:
        lo, hi = _ms_bounds(f.value)
    except (TypeError, ValueError, OverflowError):
        return None
    if col == "physical_offset" and isinstance(f, GreaterThan):
        lo += 1
    if col == "physical_offset" and isinstance(f, LessThan):
        hi -= 1
    low = lo if isinstance(f, (EqualTo, GreaterThan, GreaterThanOrEqual)) else None
    high = hi if isinstance(f, (EqualTo, LessThan, LessThanOrEqual)) else None
    if col == "physical_offset":
        return arrow.ScanFilter(min_physical_offset=low, max_physical_offset=high)
    return arrow.ScanFilter(min_store_timestamp=low, max_store_timestamp=high)


# --- streaming ----------------------------------------------------------------------------------


class RmqStoreStreamReader(DataSourceStreamReader):
    """Tails live stores: each micro-batch holds the records appended since
    the previous one. The offset is ``{broker: physical offset}``, the end of
    the valid records found by walking the CommitLog from the last end
    (:func:`rmqstore.arrow.scan_end`; a record still being written does not
    validate and waits for the next batch). Options as for reading, plus
    ``startingOffsets``: ``earliest`` (default) or ``latest``, and
    ``maxRecordsPerTrigger`` (at most that many records per micro-batch,
    shared evenly by the stores, as Kafka's ``maxOffsetsPerTrigger``;
    default: all there is). Records removed by retention before they are
    read are skipped. A damaged record fails the query (``onCorrupt=fail``,
    the default) or is skipped (``skip``) rather than holding it back."""

    def __init__(self, options, schema: StructType):
        self.reader = RmqStoreReader(options, schema)
        self.starting = options.get("startingOffsets", "earliest").lower()
        limit = _int_opt(options, "maxRecordsPerTrigger")
        if limit is not None and limit < 1:
            raise ValueError(f"option maxRecordsPerTrigger must be 1 or more, got {limit}")
        # (per store: the limit shared evenly, each store getting at least one record)
        self.per_store = None if limit is None else max(1, -(-limit // max(1, len(self.reader.paths))))
        if self.starting not in ("earliest", "latest"):
            raise ValueError(f"option startingOffsets must be 'earliest' or 'latest', got {self.starting!r}")

    def initialOffset(self) -> dict:
        out = {}
        for path, broker in zip(self.reader.paths, self.reader.brokers):
            start = arrow.min_offset(path)
            out[broker] = arrow.scan_end(path, start, self.reader.on_corrupt) if self.starting == "latest" else start
        return out

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        # Spark >= 4.2 passes the batch's start and a read limit (always
        # ReadAllAvailable here: no option limits a batch); older Spark passes nothing
        prev = start or getattr(self, "_last", None) or self.initialOffset()
        out = {}
        for path, broker in zip(self.reader.paths, self.reader.brokers):
            # (damage, unlike a record still being written, fails the query, or is skipped, as onCorrupt says)
            out[broker] = arrow.scan_end(path, max(prev.get(broker, 0), arrow.min_offset(path)),
                                         self.reader.on_corrupt, self.per_store)
        self._last = out
        return out

    def partitions(self, start: dict, end: dict) -> list:
        r = self.reader
        out = []
        for path, broker in zip(r.paths, r.brokers):
            lo, hi = int(start.get(broker, 0)), int(end.get(broker, 0))
            for s in arrow.range_splits(path, broker, max(lo, arrow.min_offset(path)), hi):
                out.append(InputPartition((tuple(s), hi)))
        return out

    def read(self, partition: InputPartition) -> Iterator:
        split_values, end = partition.value
        r = self.reader
        return arrow.read_split(
            arrow.Split(*split_values), r.columns, r.batch_rows, r.filter, r.check_crc, r.on_corrupt, end
        )

    def commit(self, end: dict) -> None:
        pass


# --- writing ------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Staged(WriterCommitMessage):
    partition: int
    files: list  # [(store directory, staged Arrow file or part store, rows, bytes, part's StoreConfig or None)]


class RmqStoreWriter(DataSourceArrowWriter):
    """``df.write.format("rmqstore").mode(m).save(dir)``: one message per row.

    Columns used (others are ignored; store-assigned ones such as
    physical_offset, queue_offset, msg_id, store_size are recomputed):
    ``topic`` (string, required), ``body`` (binary or string, required),
    ``queue_id``, ``flag``, ``tags``, ``keys``, ``unique_key``,
    ``properties`` (map), ``born_timestamp`` (timestamp, or long ms),
    ``born_host``, ``store_host``, ``store_timestamp`` (kept as the record's
    store time when given, else the clock), ``reconsume_times``,
    ``sys_flag``, ``prepared_transaction_offset``, ``broker``.

    Nothing touches the target until ``commit``, which first checks that it
    sees everything the tasks wrote, whole (else OutputNotVisibleError: the
    executors do not share the driver's disk, and the target is left as it
    was). A mode is required (Spark refuses its default,
    ``errorifexists``, for Python sources):

    * ``mode("overwrite")``: each task puts its rows into a part store of
      its own beside the target, in parallel, through the store's put path
      (a row the store refuses fails its task). The commit joins the parts
      in partition order into a new store (:func:`rmqstore.tools.join.join_stores`:
      records copied, their offsets rewritten, ConsumeQueues moved, IndexFiles
      built; the same bytes a single writer would make) and swaps it with
      the target atomically (``renameat2(RENAME_EXCHANGE)`` where the OS has
      it). Rows without store times keep their task's clock, raised where
      needed so that times never go back across parts.
    * ``mode("append")`` (the store is created if missing): tasks stage
      their rows as Arrow files; the commit checks every row, then puts
      them in partition order under the store's writer lock (queue and
      physical offsets go on from the store's, so one writer per store).

    ``abort`` deletes what the tasks wrote: the target stays as it was.

    A target named by URI (``s3://bucket/stores/b1``, :mod:`rmqstore.storage.uri`)
    is staged there as Arrow rows (either mode); the commit builds the store in a local temporary
    directory (an existing store is downloaded first to append to it) and
    uploads its files. Object storage has no lock and no rename: keep to
    one writer per store, and readers see the upload file by file.

    Options: ``brokerDirs=true`` routes each row to ``<dir>/<broker>`` by its
    ``broker`` column (a store per broker); ``storeHost`` (default
    ``127.0.0.1:10911``); ``config.<name>`` store settings
    (:class:`rmqstore.StoreConfig` names, snake_case or RocketMQ's
    camelCase) for new stores — an existing store's file sizes are kept;
    ``lockTimeout`` seconds to wait for a store another writer holds
    (default 600).
    """

    def __init__(self, options, schema: StructType, overwrite: bool):
        self.target = _paths(options)[0]
        self.overwrite = overwrite
        self.route = _truthy(options.get("brokerDirs", "false"))
        self.store_host = options.get("storeHost", "127.0.0.1:10911")
        self.lock_timeout = float(options.get("lockTimeout", 600))
        self.config = {k[len("config."):]: v for k, v in options.items() if k.lower().startswith("config.")}
        _config_names(self.config)  # a misspelt setting fails now, before any task runs
        names = set(schema.fieldNames())
        for need in ("topic", "body"):
            if need not in names:
                raise ValueError(f"writing to rmqstore needs a {need!r} column; the DataFrame has {sorted(names)}")
        if self.route and "broker" not in names:
            raise ValueError("brokerDirs=true needs a 'broker' column")
        # rows may bring their store times: the commit then sets the store's clock
        self.stamped = "store_timestamp" in names
        self.job = uuid.uuid4().hex[:12]
        self.remote = uri.is_uri(self.target)
        if self.remote:
            self.staging = uri.join(uri.parent(self.target), f".{uri.basename(self.target)}.rmqstore-write-{self.job}")
        else:
            parent, base = os.path.split(self.target)
            self.staging = os.path.join(parent, f".{base}.rmqstore-write-{self.job}")

    def _store_of(self, broker) -> str:
        if broker is None:
            return self.target
        name = _safe_name(broker)
        return uri.join(self.target, name) if self.remote else os.path.join(self.target, name)

    def write(self, iterator) -> _Staged:
        import pyarrow.compute as pc
        from pyspark import TaskContext

        ctx = TaskContext.get()
        part = ctx.partitionId() if ctx is not None else 0
        attempt = ctx.attemptNumber() if ctx is not None else 0
        sinks: dict = {}  # store -> _RowSink | _PartSink
        done = False
        try:
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                batch = _normalise_batch(batch)
                if self.route:
                    brokers = batch.column("broker")
                    if brokers.null_count:
                        raise ValueError("a row has no broker (brokerDirs=true routes rows by the broker column)")
                    groups = [(b, batch.filter(pc.equal(brokers, b))) for b in pc.unique(brokers).to_pylist()]
                else:
                    groups = [(None, batch)]
                for broker, rows in groups:
                    store = self._store_of(broker)
                    sink = sinks.get(store)
                    if sink is None:
                        sink = sinks[store] = self._sink(store, f"part-{part:05d}-{attempt}-{len(sinks)}")
                    sink.add(rows)
            done = True
        finally:
            files = [(store, *sink.close(done)) for store, sink in sinks.items()]
        return _Staged(part, files)

    def _sink(self, store: str, name: str):
        """Where a task's rows for *store* go: on an overwrite of a local or
        shared-mount store, a part store the commit joins (the rows are put
        here, in parallel, by the store's own put path); else staged Arrow
        rows the commit puts."""
        if self.overwrite and not self.remote:
            from ..tools.join import part_config

            cfg = self._store_config(store)
            if not cfg.enabled_append_prop_crc:  # (__CRC32# covers offsets a join rewrites)
                os.makedirs(self.staging, exist_ok=True)
                return _PartSink(os.path.join(self.staging, name), cfg, part_config(cfg), self.store_host,
                                 self.stamped)
        path = uri.join(self.staging, name + ".arrow") if self.remote else os.path.join(self.staging, name + ".arrow")
        return _RowSink(path, self.remote)

    def commit(self, messages: list) -> None:
        try:
            staged: dict = {}
            for m in sorted((m for m in messages if m is not None), key=lambda m: m.partition):
                for store, path, rows, size, cfg in m.files:
                    staged.setdefault(store, []).append((path, rows, cfg))
                    _check_visible(path, size, f"task {m.partition}'s staged rows")
            for store, entries in staged.items():
                paths = [path for path, _rows, _cfg in entries]
                configs = [cfg for _path, _rows, cfg in entries]
                if any(c != configs[0] for c in configs):  # (tasks read the target's settings when they began)
                    raise RuntimeError(f"the store at {store} changed while the job wrote it; run it again")
                if configs[0] is not None:
                    rows = sum(r for _path, r, _cfg in entries)
                    self._replace(store, functools.partial(self._join, paths, configs[0], rows))
                elif self.remote:
                    self._publish(store, paths)
                elif self.overwrite:
                    self._replace(store, functools.partial(self._fill, paths, store))
                else:
                    self._append(store, paths, store)
            if self.overwrite and not self.route and not staged:
                # overwrite with no rows: an empty store
                if self.remote:
                    self._publish(self.target, [])
                else:
                    self._replace(self.target, functools.partial(self._fill, [], self.target))
        finally:
            self._drop_staging()

    def abort(self, messages: list) -> None:
        self._drop_staging()

    def _drop_staging(self) -> None:
        if self.remote:
            uri.delete_dir(self.staging)
        else:
            shutil.rmtree(self.staging, ignore_errors=True)

    # -- store side

    def _store_config(self, store: str):
        from ..config import StoreConfig
        from ..tools import infer_config

        cfg = StoreConfig.from_dict(_config_names(self.config)) if self.config else StoreConfig()
        if os.path.isdir(os.path.join(store, "commitlog")):
            cfg, _notes = infer_config(store, cfg)
        # the clock replays old store times while writing: no retention by it,
        # and no delayed delivery (delayed records stay for the store's next writer)
        return cfg.replace(clean_service_enable=False, schedule_service_enable=False)

    def _append(self, store: str, paths: list, config_from: str, check: bool = True) -> None:
        """Put the staged rows at *paths* into the store at *store*, in
        order. With *check*, every row is validated first (the store's own
        batch check, which writes nothing), so a row the store refuses fails
        the job before the store changes; without, the caller owns a fresh
        directory that a failure discards whole."""
        from ..exceptions import StoreLockedError
        from ..store import MessageStore

        cfg = self._store_config(config_from)
        clock = _RowClock()
        deadline = time.monotonic() + self.lock_timeout
        st = None
        while st is None:
            try:
                # (the store's own clock unless rows bring store times: a Python clock is a call per message)
                st = MessageStore.open(store, config=cfg, store_host=self.store_host,
                                       clock=clock if self.stamped else None)
            except StoreLockedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        try:
            for path in paths if check else ():
                for batch in _read_staged(path):
                    st.check_messages(_messages(batch)[0])
            for path in paths:
                for batch in _read_staged(path):
                    msgs, stamps = _messages(batch)
                    _put_rows(st, msgs, stamps, clock)
        finally:
            st.close()

    def _publish(self, store: str, paths: list) -> None:
        """Append to (or replace) the store at URI *store*: build it in a
        local temporary directory, then upload it."""
        with tempfile.TemporaryDirectory(prefix="rmqstore-write-") as tmp:
            local = os.path.join(tmp, "store")
            if not self.overwrite:
                uri.download(store, local)
            self._append(local, paths, local, check=False)  # (a failure leaves the URI as it was)
            if self.overwrite:
                uri.delete_dir(store)
            uri.upload(local, store)

    def _fill(self, paths: list, store: str, fresh: str) -> None:
        # (no check pass: a row the store refuses fails the job with the
        # fresh directory discarded, the target untouched)
        self._append(fresh, paths, store if os.path.isdir(store) else fresh, check=False)

    def _join(self, parts: list, cfg, rows: int, fresh: str) -> None:
        from ..tools.join import join_stores

        # rows without store times got their task's clock: joined, they get a writer's order
        got = join_stores(parts, fresh, cfg, keep_store_times=self.stamped)
        if got["records"] != rows:  # (a file system that showed this host stale contents)
            raise OutputNotVisibleError(
                f"the tasks put {rows} rows, the parts seen here hold {got['records']} records; "
                "the target was left unchanged")

    def _replace(self, store: str, build) -> None:
        """Make the store at *store* what ``build(fresh)`` writes into a
        new directory beside it, swapped in under the store's lock."""
        parent, base = os.path.split(store)
        os.makedirs(parent, exist_ok=True)
        fresh = os.path.join(parent, f".{base}.rmqstore-new-{self.job}")
        try:
            build(fresh)
            with _held_lock(store):
                if os.path.isdir(store):
                    _exchange(fresh, store)  # fresh now holds the old store
                    shutil.rmtree(fresh)
                else:
                    os.rename(fresh, store)
        finally:
            shutil.rmtree(fresh, ignore_errors=True)


class _RowSink:
    """A task's rows for one store, staged as an Arrow file the commit puts."""

    def __init__(self, path: str, remote: bool):
        self.path = path
        self.sink = uri.open_output(path) if remote else _local_output(path)
        self.writer: Any = None
        self.rows = 0

    def add(self, rows) -> None:
        if self.writer is None:
            import pyarrow as pa

            self.writer = pa.ipc.new_file(self.sink, rows.schema, options=_staging_ipc())
        self.writer.write_batch(rows)
        self.rows += rows.num_rows

    def close(self, _done: bool) -> tuple:
        """``(path, rows, bytes, None)`` for the commit message."""
        if self.writer is not None:
            self.writer.close()
        size = self.sink.tell()
        self.sink.close()
        return self.path, self.rows, size, None


def _local_output(path: str):
    import pyarrow as pa

    os.makedirs(os.path.dirname(path), exist_ok=True)
    return pa.OSFile(path, "wb")


class _PartSink:
    """A task's rows for one store, put into a part store (``tools.join``)
    that the commit lays end to end with the other tasks' parts."""

    def __init__(self, path: str, cfg, part_cfg, store_host: str, stamped: bool):
        from ..store import MessageStore

        self.path = path
        self.cfg = cfg
        self.rows = 0
        self.clock = _RowClock()
        self.st = MessageStore.open(path, config=part_cfg, store_host=store_host,
                                    clock=self.clock if stamped else None)

    def add(self, rows) -> None:
        msgs, stamps = _messages(rows)
        _put_rows(self.st, msgs, stamps, self.clock)
        self.rows += len(msgs)

    def close(self, done: bool) -> tuple:
        """``(path, rows, bytes, config)`` for the commit message (bytes: all the part's files)."""
        self.st.close()
        return self.path, self.rows, _tree_size(self.path) if done else 0, self.cfg


def _tree_size(path: str) -> int:
    """Bytes of the files under *path* (a part store, as the commit checks it sees it whole)."""
    total = 0
    for d, _dirs, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(d, name))
    return total


def _config_names(options: dict) -> dict:
    """Spark lower-cases option names: map them back to StoreConfig fields
    (``maxindexnum`` and ``max_index_num`` are both ``max_index_num``).
    Raises ConfigError for a name that is no field."""
    from ..config import StoreConfig
    from ..exceptions import ConfigError

    fields = {f.name.replace("_", ""): f.name for f in dataclasses.fields(StoreConfig)}
    out = {}
    for name, value in options.items():
        field = fields.get(name.lower().replace("_", ""))
        if field is None:
            raise ConfigError(f"unknown store config option config.{name}")
        out[field] = value
    return out


class _RowClock:
    """A store's clock while rows are put: the store time of the rows being
    put (``stamp``, ms), or the wall clock for rows without one."""

    def __init__(self):
        self.stamp: int | None = None

    def __call__(self) -> int:
        return self.stamp if self.stamp is not None else time.time_ns() // 1_000_000


def _safe_name(broker: str) -> str:
    if not broker or "/" in broker or broker in (".", ".."):
        raise ValueError(f"broker {broker!r} cannot name a store directory")
    return broker


def _normalise_batch(batch):
    """The columns a message is made of (others are dropped: a store's
    offsets, sizes and ids are its own), checked and converted (body as
    binary, timestamps as int64 ms) so bad input fails in the task, before
    commit."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = [n for n in batch.schema.names if n in _STAGED_COLUMNS]
    cols = {}
    for name in names:
        col = batch.column(name)
        if name == "body" and pa.types.is_string(col.type):
            col = col.cast(pa.binary())
        if name in ("born_timestamp", "store_timestamp"):
            if pa.types.is_timestamp(col.type):
                col = pc.divide(col.cast(pa.timestamp("us")).cast(pa.int64()), 1000)
            col = col.cast(pa.int64())
        cols[name] = col
    if batch.column("topic").null_count:
        raise ValueError("a row has no topic")
    return pa.RecordBatch.from_arrays(list(cols.values()), names=list(cols))


def _staging_ipc():
    """Arrow IPC options of the staged rows: LZ4 frames where pyarrow has
    the codec (the hosts, keys and names shrink, so the staging stays under
    the CommitLog it becomes; about 0.15 s of a task per million rows)."""
    import pyarrow as pa

    return pa.ipc.IpcWriteOptions(compression="lz4" if pa.Codec.is_available("lz4") else None)


def _check_visible(path: str, size: int, what: str) -> None:
    """Raise OutputNotVisibleError unless what a task wrote at *path* (a
    file, or a part store's directory: all its files) is there, *size*
    bytes, as this process sees it."""
    try:
        if uri.is_uri(path):
            seen = uri.file_size(path)
        else:
            seen = _tree_size(path) if os.path.isdir(path) else os.stat(path).st_size
    except (FileNotFoundError, NotADirectoryError):
        seen = None
    if seen != size:
        got = "missing" if seen is None else f"{seen} bytes, not {size}"
        raise OutputNotVisibleError(
            f"{what} at {uri.shown(path)} is {got} here: the executors do not share this disk with the driver. "
            "Put the target on storage every host shares (a shared mount, or a URI such as s3://bucket/path); "
            "the target was left unchanged"
        )


def _read_staged(path: str):
    import pyarrow as pa

    with (uri.open_input(path) if uri.is_uri(path) else pa.memory_map(path)) as source:
        reader = pa.ipc.open_file(source)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)


#: Message's arguments after topic and body, in its order (the int ones' defaults
#: stand in for nulls)
_MESSAGE_FIELDS = (
    "queue_id", "flag", "tags", "keys", "unique_key", "properties", "born_timestamp", "born_host", "store_host",
    "reconsume_times", "sys_flag", "prepared_transaction_offset",
)
_INT_DEFAULTS = {"queue_id": 0, "flag": 0, "reconsume_times": 0, "sys_flag": 0, "prepared_transaction_offset": 0}
#: what a writer's task stages of a row
_STAGED_COLUMNS = frozenset(("topic", "body", "store_timestamp", "broker", *_MESSAGE_FIELDS))


def _messages(batch) -> tuple:
    """``(a Message per row, their store times in ms or None)`` of a staged
    batch, the second None when no row has one. Raises MessageTypeError /
    IllegalMessageError for a bad row."""
    import pyarrow.compute as pc

    from ..message import Message

    n = batch.num_rows
    names = set(batch.schema.names)
    body = batch.column("body")
    # one Python list per column, the rows then made positionally (no dict per row)
    cols = [batch.column("topic").to_pylist(), (pc.fill_null(body, b"") if body.null_count else body).to_pylist()]
    for name in _MESSAGE_FIELDS:
        if name not in names:
            cols.append([_INT_DEFAULTS.get(name)] * n)
            continue
        col = batch.column(name)
        if name in _INT_DEFAULTS and col.null_count:
            col = pc.fill_null(col, _INT_DEFAULTS[name])
        values = col.to_pylist()
        if name == "properties":  # (a map arrives as (key, value) pairs)
            values = [None if p is None else dict(p) for p in values]
        cols.append(values)
    msgs = [Message(*args) for args in zip(*cols)]
    if "store_timestamp" not in names or batch.column("store_timestamp").null_count == n:
        return msgs, None
    return msgs, batch.column("store_timestamp").to_pylist()


def _put_rows(st, msgs: list, stamps: list | None, clock: _RowClock) -> None:
    """Put *msgs* into the open store *st*, in order; a message whose
    entry in *stamps* is not None keeps that store time (ms). One
    put_messages call per run of equal stamps (a broker stores many
    records in one millisecond), *clock* (the store's, when rows bring
    store times) set to the run's."""
    if stamps is None:
        clock.stamp = None
        st.put_messages(msgs)
        return
    i, n = 0, len(msgs)
    while i < n:
        ts = stamps[i]
        j = i + 1
        while j < n and stamps[j] == ts:
            j += 1
        clock.stamp = ts
        st.put_messages(msgs[i:j])
        i = j


class _held_lock:
    """The store's writer lock (:class:`rmqstore.store.StoreLock`) while a job
    rewrites its files or swaps its directory; nothing to hold for a store
    that does not exist yet. Raises StoreLockedError when a writer holds it."""

    def __init__(self, store: str):
        self.store = store
        self.lock: Any = None  # a StoreLock while held

    def __enter__(self):
        from ..store import StoreLock

        if os.path.isdir(self.store):
            self.lock = StoreLock(self.store).acquire()
        return self

    def __exit__(self, *exc):
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def _exchange(a: str, b: str) -> None:
    """Swap directories *a* and *b*: atomically with Linux ``renameat2
    (RENAME_EXCHANGE)``, else with three renames."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        renameat2 = None
    if renameat2 is not None:
        at_fdcwd, rename_exchange = -100, 2
        if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
            return
    tmp = b + ".rmqstore-swap"
    os.rename(b, tmp)
    os.rename(a, b)
    os.rename(tmp, a)
