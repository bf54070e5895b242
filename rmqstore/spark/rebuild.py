"""Rebuild a store's ConsumeQueues and IndexFiles from its CommitLog with Spark.

Both jobs scan the CommitLog splits in parallel (:mod:`rmqstore.arrow`),
shuffle what they found to the tasks that own each output file, and write
those files with the store's own code (``ConsumeQueue.put``,
``IndexFile.put_key``), so the result is byte-identical to what the store
writes when it dispatches the same records — and to a local rebuild
(delete ``consumequeue/`` or ``index/`` and run ``rmqstore recover``).
Index file names are creation times, as the store makes them.

A store named by URI (``s3://``, ``hdfs://``...: :mod:`rmqstore.storage.uri`)
is rebuilt the same way: tasks write their files locally and upload them
to the staging directory under the URI; the swap deletes the old files and
moves the new ones in, file by file (object storage has neither a lock nor
a rename: no writer may run meanwhile, and readers see the swap happen).

The tasks report every file they wrote, with its size; before the swap the
driver checks it sees each one whole, and fails with OutputNotVisibleError,
the store unchanged, when it does not (executors that do not share the
driver's disk wrote them on their own).

The new files are built in a directory beside the old one and swapped in
at the end (atomically where the OS can exchange two directories); the
store's writer lock is held for the whole job, so no writer can run at the
same time. A record that does not validate stops the job with
CorruptedFileError (``on_corrupt="fail"``, the default: run ``rmqstore
recover`` first); ``"skip"`` reads on from the next valid record and
``"stop"`` ends that split there, as the data source's ``onCorrupt`` does,
and the report counts what was skipped (``skipped_records``,
``skipped_bytes``: damaged regions and their bytes, from Spark
accumulators). Files rebuilt past damage index records that a store's
recovery would cut off: for reading a damaged store, not for serving it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator

from .. import _kernels as k
from .. import arrow
from ..dispatch import consume_queue_mask, index_key_rows, index_mask, tags_code, tags_hash
from ..exceptions import CorruptedFileError
from ..format.layout import CQ_STORE_UNIT_SIZE, SCHEDULE_TOPIC
from ..storage import uri
from ..storage.index import new_file_names
from .source import _check_visible, _exchange, _held_lock

__all__ = ["rebuild_consume_queues", "rebuild_index"]

_SCAN_COLUMNS = ("physical_offset", "store_size", "topic", "queue_id", "queue_offset", "sys_flag", "store_timestamp")
_UNITS_SCHEMA = "topic string, queue_id int, queue_offset long, physical_offset long, store_size int, tags_code long"
_ENTRIES_SCHEMA = "split int, seq long, physical_offset long, store_timestamp long, key string"


def _job_start(store_dir, config, index: bool = False) -> tuple:
    """``(root, start time, StoreConfig)`` of a rebuild job over *store_dir*;
    FileNotFoundError when it is not a directory."""
    if uri.is_uri(store_dir):
        if not uri.is_dir(uri.join(store_dir, "commitlog")):
            raise FileNotFoundError(f"no store at {uri.shown(store_dir)} (no commitlog/)")
        return store_dir, time.monotonic(), _uri_config(store_dir, config, index)
    root = os.path.abspath(os.fspath(store_dir))
    if not os.path.isdir(root):
        raise FileNotFoundError(f"no store directory at {root}")
    return root, time.monotonic(), _config(root, config)


def _config(root: str, config):
    from ..config import StoreConfig
    from ..tools import infer_config

    if isinstance(config, dict):
        config = StoreConfig.from_dict(config)
    cfg, _notes = infer_config(root, config)
    return cfg


def _uri_config(root: str, config, index: bool):
    """:func:`_config` of a store named by URI, from its files' sizes (the
    index files are not read whole remotely). With *index*, the index
    geometry is the first of *config*'s, a broker's and ``StoreConfig()``'s
    that gives the index files' size; ConfigError when none does."""
    from ..config import StoreConfig
    from ..exceptions import ConfigError
    from ..storage.index import index_file_size
    from ..tools._common import _common_size

    cfg = StoreConfig.from_dict(config) if isinstance(config, dict) else (config or StoreConfig())
    changes: dict = {}
    cq = [size for rel, size in uri.list_files(uri.join(root, "consumequeue")) if size > 0]
    if cq and _common_size(cq) % CQ_STORE_UNIT_SIZE == 0:
        changes["mapped_file_size_consume_queue"] = _common_size(cq)
    sizes = [size for _name, is_dir, size in uri.list_dir(uri.join(root, "index")) if not is_dir and size > 0]
    if index and sizes:
        size = _common_size(sizes)
        fits = [c for c in (cfg, StoreConfig.broker_defaults(), StoreConfig())
                if index_file_size(c.max_hash_slot_num, c.max_index_num) == size]
        if not fits:
            raise ConfigError(f"the index files of {uri.shown(root)} ({size} bytes) fit no known geometry: "
                              "pass config with max_hash_slot_num and max_index_num")
        changes["max_hash_slot_num"], changes["max_index_num"] = fits[0].max_hash_slot_num, fits[0].max_index_num
    return cfg.replace(**changes) if changes else cfg


def _join(base: str, rel: str) -> str:
    """*rel* (``/``-separated) under directory *base*, a path or a URI."""
    return arrow._under(base, *rel.split("/"))


def _lock(root: str):
    """The store's writer lock for the job (object storage has none)."""
    return contextlib.nullcontext() if uri.is_uri(root) else _held_lock(root)


def _new_staging(root: str, kind: str) -> str:
    name = f"{kind}.rebuild-{uuid.uuid4().hex[:12]}"
    if uri.is_uri(root):
        return uri.join(root, name)
    staging = os.path.join(root, name)
    os.makedirs(staging)
    return staging


def _drop(staging: str) -> None:
    if uri.is_uri(staging):
        uri.delete_dir(staging)
    else:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _task_dir(staging: str) -> Iterator[tuple]:
    """``(directory, ship)`` for a task writing output files: *staging*
    itself when it is a path; for a URI a local temporary directory, and
    ``ship(rels)`` uploads those files to *staging* (and frees their room)."""
    if not uri.is_uri(staging):
        # (made here too: an executor without the driver's disk writes on
        # its own, and the driver's check then says so)
        os.makedirs(staging, exist_ok=True)
        yield staging, lambda rels: None
        return
    with tempfile.TemporaryDirectory(prefix="rmqstore-rebuild-") as local:
        def ship(rels) -> None:
            for rel in rels:
                path = _join(local, rel)
                uri.put_file(path, _join(staging, rel))
                os.remove(path)

        yield local, ship


def _splits_df(spark, splits: list):
    """A DataFrame with one row, in its own partition, per split."""
    rows = [(i, *s) for i, s in enumerate(splits)]
    schema = "split int, broker string, path string, file_offset long, start long, end long"
    rdd = spark.sparkContext.parallelize(rows, max(1, len(rows)))
    return spark.createDataFrame(rdd, schema)


def _split_rows(batches) -> Iterator:
    for b in batches:
        for row in b.to_pylist():
            yield row["split"], arrow.Split(row["broker"], row["path"], row["file_offset"], row["start"], row["end"])


def _swap_in(staging: str, target: str) -> None:
    if uri.is_uri(target):  # (no rename on object storage: the old files go, then the new ones move in)
        uri.delete_dir(target)
        uri.move_dir(staging, target)
        return
    if os.path.isdir(target):
        _exchange(staging, target)
        shutil.rmtree(staging)
    else:
        os.rename(staging, target)


# --- ConsumeQueues -------------------------------------------------------------------------------


def _tags_codes(split: arrow.Split, phys, topics, tags, config, cache: dict):
    """Tags code per row (docs/format.md#tags-code): Java hash of TAGS, or for SCHEDULE_TOPIC_XXXX
    with a DELAY level the delivery time."""
    import numpy as np
    import pyarrow.compute as pc

    codes = np.zeros(len(tags), dtype=np.int64)
    enc = pc.dictionary_encode(tags)
    values = enc.dictionary.to_pylist()
    hashes = np.array([cache.setdefault(v, tags_hash(v)) for v in values] or [0], dtype=np.int64)
    idx = enc.indices.to_numpy(zero_copy_only=False)
    valid = ~np.asarray(enc.indices.is_null().to_numpy(zero_copy_only=False))
    codes[valid] = hashes[idx[valid].astype(np.int64)]
    sched = np.flatnonzero(np.asarray(pc.equal(topics, SCHEDULE_TOPIC).fill_null(False).to_numpy(zero_copy_only=False)))
    if sched.size:
        with arrow._window(split.path, split.start, split.end) as (buf, base):
            for i in sched:
                pos = int(phys[i]) - split.file_offset - base
                f = k.decode_record(buf, pos, False)
                props = k.parse_properties(f[16])
                codes[i] = tags_code(SCHEDULE_TOPIC, props, f[10], config)
    return codes


def _read(split, columns, damage) -> Iterator:
    """``arrow.read_split`` of *split* under *damage* ``(on_corrupt,
    records accumulator, bytes accumulator)``; what it skipped is added to
    the accumulators."""
    on_corrupt, records, nbytes = damage
    stats: dict = {}
    yield from arrow.read_split(split, columns, check_crc=True, on_corrupt=on_corrupt, stats=stats)
    if stats.get("skipped_records"):
        records.add(stats["skipped_records"])
        nbytes.add(stats.get("skipped_bytes", 0))


#: how a task's CorruptedFileError reads inside Spark's PythonException
_TASK_CORRUPT = re.compile(r"rmqstore\.exceptions\.CorruptedFileError: ([^\n]+)")


@contextlib.contextmanager
def _task_errors():
    """Spark hands the driver what a task raised as a PythonException whose
    text is the worker's traceback: a damaged record comes out as the
    CorruptedFileError it was (its message naming file and offset), so a
    caller, and the CLI's exit code, see the store's error."""
    try:
        yield
    except Exception as e:
        found = _TASK_CORRUPT.search(str(e)) if type(e).__name__ == "PythonException" else None
        if found is None:
            raise
        raise CorruptedFileError(found.group(1)) from e


def _damage(spark, on_corrupt: str) -> tuple:
    arrow._check_on_corrupt(on_corrupt)
    sc = spark.sparkContext
    return on_corrupt, sc.accumulator(0), sc.accumulator(0)


def _skipped(damage: tuple) -> dict:
    return {"skipped_records": damage[1].value, "skipped_bytes": damage[2].value}


def _scan_units(batches, config, damage) -> Iterator:
    """mapInArrow: split rows in, one row per ConsumeQueue unit out."""
    import pyarrow as pa

    cache: dict = {}
    for _i, split in _split_rows(batches):
        for b in _read(split, _SCAN_COLUMNS + ("tags",), damage):
            keep = consume_queue_mask(b.column("sys_flag").to_numpy())
            if not keep.all():
                b = b.filter(pa.array(keep))
            if b.num_rows == 0:
                continue
            phys = b.column("physical_offset").to_numpy()
            codes = _tags_codes(split, phys, b.column("topic"), b.column("tags"), config, cache)
            yield pa.RecordBatch.from_arrays(
                [b.column("topic"), b.column("queue_id"), b.column("queue_offset"), b.column("physical_offset"),
                 b.column("store_size"), pa.array(codes, pa.int64())],
                names=["topic", "queue_id", "queue_offset", "physical_offset", "store_size", "tags_code"],
            )


def _write_queues(batches, staging: str, file_size: int) -> Iterator:
    """mapInArrow: units sorted by (topic, queue_id, physical_offset) in,
    ConsumeQueue files written, one summary row per queue out."""
    import pyarrow as pa

    from ..storage.consumequeue import ConsumeQueue

    cq = None
    done: list = []
    count = 0

    def finish(local: str, ship) -> None:
        if cq is not None:
            cq.flush()
            cq.close()
            rel = f"{cq.topic}/{cq.queue_id}"
            files = [f"{rel}/{n}" for n in sorted(os.listdir(os.path.join(local, rel)))]
            sizes = [os.path.getsize(_join(local, f)) for f in files]
            ship(files)
            done.append((cq.topic, cq.queue_id, count, files, sizes))

    with _task_dir(staging) as (local, ship):
        for b in batches:
            d = b.to_pydict()
            for topic, qid, qoff, phy, size, code in zip(
                d["topic"], d["queue_id"], d["queue_offset"], d["physical_offset"], d["store_size"], d["tags_code"]
            ):
                if cq is None or cq.topic != topic or cq.queue_id != qid:
                    finish(local, ship)
                    cq = ConsumeQueue(local, topic, qid, file_size)
                    count = 0
                cq.put(phy, size, code, qoff)
                count += 1
        finish(local, ship)
    if done:
        t, q, n, files, sizes = zip(*done)
        yield pa.RecordBatch.from_arrays(
            [pa.array(t, pa.string()), pa.array(q, pa.int32()), pa.array(n, pa.int64()),
             pa.array(files, pa.list_(pa.string())), pa.array(sizes, pa.list_(pa.int64()))],
            names=["topic", "queue_id", "units", "files", "sizes"],
        )


def _check_outputs(staging: str, rows) -> None:
    """OutputNotVisibleError unless this process sees every file the
    tasks report (``files``, ``sizes``: paths in *staging*, bytes)."""
    for r in rows:
        for rel, size in zip(r["files"], r["sizes"]):
            _check_visible(_join(staging, rel), size, "a rebuild task's output")


def rebuild_consume_queues(spark, store_dir, config=None, partitions: int | None = None,
                           on_corrupt: str = "fail") -> dict:
    """Rebuild every ConsumeQueue of the store in *store_dir* from its CommitLog.

    Args:
        spark: a SparkSession.
        store_dir (str | PathLike): the store root.
        config (StoreConfig | dict | None): settings (delay levels for
            ``SCHEDULE_TOPIC_XXXX`` tags codes); file sizes are inferred from
            the store's files, ``StoreConfig()``'s where there are none.
        partitions (int | None): write tasks (default: 2 x Spark's default
            parallelism, at most one per queue).
        on_corrupt (str): at a damaged record, ``"fail"`` (default),
            ``"skip"`` or ``"stop"`` (see the module's doc).

    Returns ``{"queues", "units", "splits", "seconds", "skipped_records",
    "skipped_bytes"}``.

    Raises:
        StoreLockedError: a writer has the store open.
        CorruptedFileError: a CommitLog record does not validate
            (``on_corrupt="fail"``), naming its file and offset.
        OutputNotVisibleError: the driver does not see the files the
            tasks wrote (executors that do not share its disk); the store
            is unchanged.
        FileNotFoundError: *store_dir* is not a directory.
        ValueError: an unknown *on_corrupt*.
        ConfigError: a URI's index files fit no known geometry (pass
            *config*).
    """
    damage = _damage(spark, on_corrupt)
    root, t0, cfg = _job_start(store_dir, config)
    with _lock(root), _task_errors():
        splits = arrow.store_splits(root)
        staging = _new_staging(root, "consumequeue")
        try:
            stats = []
            if splits:
                units = _splits_df(spark, splits).mapInArrow(
                    functools.partial(_scan_units, config=cfg, damage=damage), _UNITS_SCHEMA
                )
                n = partitions or 2 * spark.sparkContext.defaultParallelism
                stats = (
                    units.repartition(n, "topic", "queue_id")
                    .sortWithinPartitions("topic", "queue_id", "physical_offset")
                    .mapInArrow(
                        functools.partial(_write_queues, staging=staging, file_size=cfg.mapped_file_size_consume_queue),
                        "topic string, queue_id int, units long, files array<string>, sizes array<long>",
                    )
                    .collect()
                )
                _check_outputs(staging, stats)
            _swap_in(staging, _join(root, "consumequeue"))
        finally:
            _drop(staging)
    return {
        "queues": len(stats),
        "units": sum(r["units"] for r in stats),
        "splits": len(splits),
        "seconds": round(time.monotonic() - t0, 3),
        **_skipped(damage),
    }


# --- IndexFiles ----------------------------------------------------------------------------------


def _scan_entries(batches, damage) -> Iterator:
    """mapInArrow: split rows in, one row per index entry out (docs/format.md#building-the-index:
    ``topic#UNIQ_KEY`` first, then each non-empty space-separated key; none
    for rollback records), numbered from 0 in CommitLog order within the
    split (``seq``). A split whose records have no key at all yields one row
    with a null key and seq -1, so the driver knows the store has records."""
    import numpy as np
    import pyarrow as pa

    cols = ("physical_offset", "store_timestamp", "topic", "sys_flag", "keys", "unique_key")
    for i, split in _split_rows(batches):
        seq = 0
        records = 0
        for b in _read(split, cols, damage):
            keep = index_mask(b.column("sys_flag").to_numpy())
            if not keep.all():
                b = b.filter(pa.array(keep))
            n = b.num_rows
            records += n
            if n == 0:
                continue
            phy = b.column("physical_offset").to_numpy()
            ts = b.column("store_timestamp").cast(pa.int64()).to_numpy() // 1000
            owner, full = index_key_rows(b.column("topic"), b.column("unique_key"), b.column("keys"))
            m = owner.size
            if m == 0:
                continue
            yield pa.RecordBatch.from_arrays(
                [pa.array(np.full(m, i, dtype=np.int32)), pa.array(np.arange(seq, seq + m, dtype=np.int64)),
                 pa.array(phy[owner]), pa.array(ts[owner]), full],
                names=["split", "seq", "physical_offset", "store_timestamp", "key"],
            )
            seq += m
        if seq == 0 and records:
            yield pa.RecordBatch.from_arrays(
                [pa.array([i], pa.int32()), pa.array([-1], pa.int64()), pa.array([0], pa.int64()),
                 pa.array([0], pa.int64()), pa.array([None], pa.string())],
                names=["split", "seq", "physical_offset", "store_timestamp", "key"],
            )


def _number_entries(batches, bases: dict, per_file: int) -> Iterator:
    """mapInArrow: add the global entry number ``g`` (split base + seq) and its file."""
    import numpy as np
    import pyarrow as pa

    for b in batches:
        split = b.column("split").to_numpy()
        g = np.array([bases[int(s)] for s in split], dtype=np.int64) + b.column("seq").to_numpy()
        yield pa.RecordBatch.from_arrays(
            [pa.array(g), pa.array(g // per_file), b.column("physical_offset"), b.column("store_timestamp"),
             b.column("key")],
            names=["g", "file", "physical_offset", "store_timestamp", "key"],
        )


def _write_index_files(batches, staging: str, names: list, slots: int, entries: int, heads: list) -> Iterator:
    """mapInArrow: numbered entries sorted by number in, index files out."""
    import pyarrow as pa

    from ..storage.index import IndexFile

    per_file = entries - 1
    current = None
    file_no = -1
    written: list = []

    def finish(local: str, ship) -> None:
        if current is not None:
            current.flush()
            current.close()
            written.append((file_no, names[file_no], os.path.getsize(os.path.join(local, names[file_no]))))
            ship([names[file_no]])

    with _task_dir(staging) as (local, ship):
        for b in batches:
            d = b.to_pydict()
            for g, phy, ts, key in zip(d["g"], d["physical_offset"], d["store_timestamp"], d["key"]):
                f = g // per_file
                if f != file_no:
                    finish(local, ship)
                    file_no = f
                    end_phy, end_ts = heads[f]
                    current = IndexFile(
                        os.path.join(local, names[f]), slots, entries, create=True,
                        end_phy_offset=end_phy, end_timestamp=end_ts,
                    )
                if current is None or not current.put_key(key, phy, ts):
                    raise RuntimeError(f"index file {names[f]} is full before its last entry")
        finish(local, ship)
    if written:
        no, name, size = zip(*written)
        yield pa.RecordBatch.from_arrays(
            [pa.array(no, pa.int64()), pa.array([[f] for f in name], pa.list_(pa.string())),
             pa.array([[z] for z in size], pa.list_(pa.int64()))],
            names=["file", "files", "sizes"],
        )


def rebuild_index(spark, store_dir, config=None, partitions: int | None = None, on_corrupt: str = "fail") -> dict:
    """Rebuild the IndexFiles of the store in *store_dir* from its CommitLog.

    Entries are numbered in CommitLog order; entry *g* goes to file
    ``g // (max_index_num - 1)``, so every file is written by one task.
    Geometry (``max_hash_slot_num``, ``max_index_num``) comes from the
    existing index files, else from *config* (StoreConfig | dict; a
    broker's store: ``StoreConfig.broker_defaults()`` or its
    ``broker.properties``), else ``StoreConfig()``'s (1.68 MB files).
    *on_corrupt*: at a damaged record, ``"fail"`` (default), ``"skip"`` or
    ``"stop"`` (see the module's doc; the scan is computed once, persisted,
    so what it skipped is counted once).

    Returns ``{"files", "entries", "splits", "seconds", "skipped_records",
    "skipped_bytes"}``.

    Raises:
        StoreLockedError: a writer has the store open.
        CorruptedFileError: a CommitLog record does not validate
            (``on_corrupt="fail"``), naming its file and offset.
        OutputNotVisibleError: the driver does not see the files the
            tasks wrote (executors that do not share its disk); the store
            is unchanged.
        FileNotFoundError: *store_dir* is not a directory.
        ValueError: an unknown *on_corrupt*.
        ConfigError: a URI's index files fit no known geometry (pass
            *config*).
    """
    damage = _damage(spark, on_corrupt)
    root, t0, cfg = _job_start(store_dir, config, index=True)
    slots, entries = cfg.max_hash_slot_num, cfg.max_index_num
    per_file = entries - 1
    with _lock(root), _task_errors():
        splits = arrow.store_splits(root)
        staging = _new_staging(root, "index")
        files = total = 0
        try:
            if splits:
                found = _splits_df(spark, splits).mapInArrow(
                    functools.partial(_scan_entries, damage=damage), _ENTRIES_SCHEMA).persist()
                try:
                    from pyspark.sql import functions as F

                    per_split = found.groupBy("split").agg(F.expr("sum(CAST(seq >= 0 AS BIGINT)) AS n")).collect()
                    keyed_counts = {r["split"]: r["n"] for r in per_split}
                    any_record = bool(per_split)
                    bases, total = {}, 0
                    for i in range(len(splits)):
                        bases[i] = total
                        total += keyed_counts.get(i, 0)
                    files = -(-total // per_file) if total else int(any_record)
                    names = new_file_names(files)
                    if total:
                        numbered = found.where("seq >= 0").mapInArrow(
                            functools.partial(_number_entries, bases=bases, per_file=per_file),
                            "g long, file long, physical_offset long, store_timestamp long, key string",
                        )
                        # each file's header starts from the previous file's last entry (docs/format.md#index-put)
                        heads = [(0, 0)] * files
                        lasts = [f * per_file - 1 for f in range(1, files)]
                        if lasts:
                            for r in numbered.where(numbered.g.isin(lasts)).collect():
                                heads[(r["g"] + 1) // per_file] = (r["physical_offset"], r["store_timestamp"])
                        n = min(files, partitions or 2 * spark.sparkContext.defaultParallelism)
                        written = (
                            numbered.repartition(n, "file")
                            .sortWithinPartitions("g")
                            .mapInArrow(
                                functools.partial(
                                    _write_index_files, staging=staging, names=names, slots=slots,
                                    entries=entries, heads=heads,
                                ),
                                "file long, files array<string>, sizes array<long>",
                            )
                            .collect()
                        )
                        _check_outputs(staging, written)
                    elif any_record:
                        _empty_index_file(staging, names[0], slots, entries)
                finally:
                    found.unpersist()
            _swap_in(staging, _join(root, "index"))
        finally:
            _drop(staging)
    return {"files": files, "entries": total, "splits": len(splits), "seconds": round(time.monotonic() - t0, 3),
            **_skipped(damage)}


def _empty_index_file(staging: str, name: str, slots: int, entries: int) -> None:
    """The file a store makes for its first record when no record has a key: header only."""
    from ..storage.index import IndexFile

    with _task_dir(staging) as (local, ship):
        f = IndexFile(os.path.join(local, name), slots, entries, create=True)
        f.flush()
        f.close()
        ship([name])
