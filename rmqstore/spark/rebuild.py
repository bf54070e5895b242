"""Rebuild a store's ConsumeQueues and IndexFiles from its CommitLog with Spark.

Both jobs scan the CommitLog splits in parallel (:mod:`rmqstore.arrow`),
shuffle what they found to the tasks that own each output file, and write
those files with the store's own code (``ConsumeQueue.put``,
``IndexFile.put_key``), so the result is byte-identical to what the store
writes when it dispatches the same records — and to a local rebuild
(delete ``consumequeue/`` or ``index/`` and run ``rmqstore recover``).
Index file names are creation times, as the store makes them.

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
import time
import uuid
from collections.abc import Iterator

from .. import _kernels as k
from .. import arrow
from ..dispatch import consume_queue_mask, index_key_rows, index_mask, tags_code, tags_hash
from ..exceptions import CorruptedFileError
from ..format.layout import SCHEDULE_TOPIC
from ..storage import uri
from .source import _check_visible, _exchange, _held_lock

__all__ = ["rebuild_consume_queues", "rebuild_index"]

_SCAN_COLUMNS = ("physical_offset", "store_size", "topic", "queue_id", "queue_offset", "sys_flag", "store_timestamp")
_UNITS_SCHEMA = "topic string, queue_id int, queue_offset long, physical_offset long, store_size int, tags_code long"
_ENTRIES_SCHEMA = "split int, seq long, physical_offset long, store_timestamp long, key string"


def _job_start(store_dir, config) -> tuple:
    """``(root, start time, StoreConfig)`` of a rebuild job over *store_dir*;
    FileNotFoundError when it is not a directory."""
    if uri.is_uri(store_dir):
        raise ValueError(f"cannot rebuild {store_dir} in place: rebuilds need the store on a disk every host "
                         "mounts (the new files are swapped in by renames); copy it there, rebuild, copy it back")
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
        buf = arrow._map(split.path)
        try:
            for i in sched:
                pos = int(phys[i]) - split.file_offset
                f = k.decode_record(buf, pos, False)
                props = k.parse_properties(f[16])
                codes[i] = tags_code(SCHEDULE_TOPIC, props, f[10], config)
        finally:
            if hasattr(buf, "close"):
                buf.close()
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

    def finish():
        if cq is not None:
            cq.flush()
            cq.close()
            rel = os.path.join(cq.topic, str(cq.queue_id))
            names = sorted(os.listdir(os.path.join(staging, rel)))
            files = [os.path.join(rel, n) for n in names]
            sizes = [os.path.getsize(os.path.join(staging, f)) for f in files]
            done.append((cq.topic, cq.queue_id, count, files, sizes))

    for b in batches:
        d = b.to_pydict()
        for topic, qid, qoff, phy, size, code in zip(
            d["topic"], d["queue_id"], d["queue_offset"], d["physical_offset"], d["store_size"], d["tags_code"]
        ):
            if cq is None or cq.topic != topic or cq.queue_id != qid:
                finish()
                cq = ConsumeQueue(staging, topic, qid, file_size)
                count = 0
            cq.put(phy, size, code, qoff)
            count += 1
    finish()
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
            _check_visible(os.path.join(staging, rel), size, "a rebuild task's output")


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
        ValueError: an unknown *on_corrupt*, or *store_dir* is a URI
            (rebuilds work on a store on a disk every host mounts).
    """
    damage = _damage(spark, on_corrupt)
    root, t0, cfg = _job_start(store_dir, config)
    with _held_lock(root), _task_errors():
        splits = arrow.store_splits(root)
        staging = os.path.join(root, f"consumequeue.rebuild-{uuid.uuid4().hex[:12]}")
        os.makedirs(staging)
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
            _swap_in(staging, os.path.join(root, "consumequeue"))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
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

    def finish():
        if current is not None:
            current.flush()
            current.close()
            written.append((file_no, names[file_no], os.path.getsize(os.path.join(staging, names[file_no]))))

    for b in batches:
        d = b.to_pydict()
        for g, phy, ts, key in zip(d["g"], d["physical_offset"], d["store_timestamp"], d["key"]):
            f = g // per_file
            if f != file_no:
                finish()
                file_no = f
                end_phy, end_ts = heads[f]
                current = IndexFile(
                    os.path.join(staging, names[f]), slots, entries, create=True,
                    end_phy_offset=end_phy, end_timestamp=end_ts,
                )
            if current is None or not current.put_key(key, phy, ts):
                raise RuntimeError(f"index file {names[f]} is full before its last entry")
    finish()
    if written:
        no, name, size = zip(*written)
        yield pa.RecordBatch.from_arrays(
            [pa.array(no, pa.int64()), pa.array([[f] for f in name], pa.list_(pa.string())),
             pa.array([[z] for z in size], pa.list_(pa.int64()))],
            names=["file", "files", "sizes"],
        )


def _index_names(count: int) -> list:
    """*count* ascending index file names from now (``yyyyMMddHHmmssSSS``,
    local time, as ``IndexService`` names them; +1 per file)."""
    now = time.time()
    first = time.strftime("%Y%m%d%H%M%S", time.localtime(now)) + f"{int(now * 1000) % 1000:03d}"
    return [str(int(first) + i) for i in range(count)]


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
        ValueError: an unknown *on_corrupt*, or *store_dir* is a URI
            (rebuilds work on a store on a disk every host mounts).
    """
    damage = _damage(spark, on_corrupt)
    root, t0, cfg = _job_start(store_dir, config)
    slots, entries = cfg.max_hash_slot_num, cfg.max_index_num
    per_file = entries - 1
    with _held_lock(root), _task_errors():
        splits = arrow.store_splits(root)
        staging = os.path.join(root, f"index.rebuild-{uuid.uuid4().hex[:12]}")
        os.makedirs(staging)
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
                    names = _index_names(files)
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
            _swap_in(staging, os.path.join(root, "index"))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return {"files": files, "entries": total, "splits": len(splits), "seconds": round(time.monotonic() - t0, 3),
            **_skipped(damage)}


def _empty_index_file(staging: str, name: str, slots: int, entries: int) -> None:
    """The file a store makes for its first record when no record has a key: header only."""
    from ..storage.index import IndexFile

    f = IndexFile(os.path.join(staging, name), slots, entries, create=True)
    f.flush()
    f.close()
