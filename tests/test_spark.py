"""The Spark data source, writer, rebuild jobs and streaming reader (rmqstore.spark).

One session-scoped SparkSession (local[2]); every result is compared with the
plain reader (``MessageStore.iter_messages``) or with files the store (or
RocketMQ itself, for the golden stores) wrote. Skipped when pyspark or Java
is missing, unless ``RMQSTORE_REQUIRE_SPARK=1`` (CI), which makes that an error.
"""

from __future__ import annotations

import contextlib
import datetime
import glob
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from spark_support import require_spark

require_spark()

from conftest import StepClock, copy_golden_store, golden_store, load_dump  # noqa: E402
from rmqstore import Message, MessageStore, StoreConfig  # noqa: E402
from rmqstore.exceptions import ConfigError, StoreLockedError  # noqa: E402
from rmqstore.spark.cli import session  # noqa: E402
from rmqstore.tools import recover_store  # noqa: E402
from test_arrow import SMALL, make_store, plain_rows  # noqa: E402

#: the mixed store's CommitLog file size: as splitBytes, one partition per file
FILE = SMALL["mapped_file_size_commit_log"]


@pytest.fixture(scope="session")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers: this interpreter
    s = session("local[2]", "rmqstore-tests", {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false",
                                               "spark.ui.showConsoleProgress": "false"})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    root = tmp_path_factory.mktemp("spark") / "broker-x" / "store"
    make_store(root)
    return root


def tree(root, sub: str) -> dict:
    """{relative path: bytes} of every file under root/sub."""
    base = pathlib.Path(root) / sub
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


def index_contents(root) -> list:
    """Index file contents in name order (names are creation times)."""
    return list(tree(root, "index").values())


def file_hashes(directory) -> dict:
    out = {}
    for p in sorted(pathlib.Path(directory).rglob("*")):
        if p.is_file():
            out[str(p.relative_to(directory))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def rows_by_offset(df) -> list:
    df = df.selectExpr("*", "unix_millis(store_timestamp) AS store_ms", "unix_millis(born_timestamp) AS born_ms")
    return [r.asDict(recursive=True) for r in df.orderBy("broker", "physical_offset").collect()]


def check_rows(rows: list, msgs: list, broker: str) -> None:
    assert len(rows) == len(msgs)
    for r, m in zip(rows, msgs):
        assert r["broker"] == broker
        for name in ("physical_offset", "topic", "queue_id", "queue_offset", "born_host", "store_host", "sys_flag",
                     "flag", "reconsume_times", "tags", "keys", "unique_key", "msg_id", "store_size",
                     "prepared_transaction_offset", "body_crc"):
            assert r[name] == getattr(m, name), (name, r["physical_offset"])
        assert bytes(r["body"]) == m.body
        assert r["properties"] == m.properties
        assert (r["store_ms"], r["born_ms"]) == (m.store_timestamp, m.born_timestamp)


# --- reading -------------------------------------------------------------------------------------


def test_read_matches_plain_reader(spark, mixed):
    paths = [str(golden_store("tiny")), str(golden_store("basic")), str(mixed)]
    df = spark.read.format("rmqstore").load(paths)
    # small files are read together up to splitBytes, never across stores
    assert df.rdd.getNumPartitions() == len(paths)
    for p in paths:  # a file's size as splitBytes: one partition per file
        sizes = [os.path.getsize(f) for f in glob.glob(os.path.join(p, "commitlog", "*"))]
        assert spark.read.format("rmqstore").option("splitBytes", max(sizes)).load(p).rdd.getNumPartitions() == \
            len(sizes)
    rows = rows_by_offset(df)
    by_broker: dict = {}
    for r in rows:
        by_broker.setdefault(r["broker"], []).append(r)
    assert sorted(by_broker) == ["basic", "broker-x", "tiny"]
    check_rows(by_broker["tiny"], plain_rows(golden_store("tiny")), "tiny")
    check_rows(by_broker["basic"], plain_rows(golden_store("basic")), "basic")
    check_rows(by_broker["broker-x"], plain_rows(mixed), "broker-x")


def test_narrow_schema_split_files_and_options(spark, mixed):
    from rmqstore.arrow import NARROW_COLUMNS

    narrow = spark.read.format("rmqstore").option("schema", "narrow").option("splitBytes", "2000").load(str(mixed))
    assert tuple(narrow.columns) == NARROW_COLUMNS
    assert narrow.rdd.getNumPartitions() > 2 * len(os.listdir(mixed / "commitlog"))
    got = [r.physical_offset for r in narrow.select("physical_offset").orderBy("physical_offset").collect()]
    assert got == [m.physical_offset for m in plain_rows(mixed)]
    cols = spark.read.format("rmqstore").option("columns", "topic,body").option("brokers", "x").load(str(mixed))
    assert cols.columns == ["topic", "body"]


@contextlib.contextmanager
def pushdown(spark, value: str = "true"):
    """Spark's filter pushdown for Python sources set to *value* meanwhile."""
    spark.conf.set("spark.sql.python.filterPushdown.enabled", value)
    try:
        yield
    finally:
        spark.conf.unset("spark.sql.python.filterPushdown.enabled")


def test_session_leaves_pushdown_off_and_keeps_ui_settings_it_is_given(spark):
    assert spark.conf.get("spark.sql.python.filterPushdown.enabled") != "true"  # (register() left it)
    assert spark.conf.get("spark.ui.showConsoleProgress") == "false"  # (the fixture asked for it)


def test_a_reused_dataframe_answers_each_query_in_full(spark, mixed):
    """Spark 4.1-4.3 keep a pushdown's planned partitions on the DataFrame
    and read them for its next query without conditions: with pushdown
    off (the default), a lookup or a topic query leaves later queries of
    the same DataFrame whole."""
    msgs = plain_rows(mixed)
    df = spark.read.format("rmqstore").load(str(mixed))
    assert df.count() == len(msgs)
    key = msgs[40].keys
    assert df.where(df["keys"] == key).count() == sum(1 for m in msgs if m.keys == key)
    assert df.count() == len(msgs)
    assert df.where("topic = 'TopicA'").count() == sum(1 for m in msgs if m.topic == "TopicA")
    assert df.count() == len(msgs)


def test_filter_options_prune_without_pushdown_conf(spark, mixed):
    with pushdown(spark, "false"):
        _filter_options_prune(spark, mixed)


def _filter_options_prune(spark, mixed):
    msgs = plain_rows(mixed)
    t0 = msgs[100].store_timestamp
    df = (
        spark.read.format("rmqstore").option("pushdown", "true").option("topics", "SCHEDULE_TOPIC_XXXX")
        .option("minStoreTimestamp", str(t0)).option("splitBytes", FILE).load(str(mixed))
    )
    all_parts = spark.read.format("rmqstore").option("splitBytes", FILE).load(str(mixed)).rdd.getNumPartitions()
    assert df.rdd.getNumPartitions() < all_parts
    got = [r.physical_offset for r in df.select("physical_offset").collect()]
    assert got == [m.physical_offset for m in msgs if m.topic == "SCHEDULE_TOPIC_XXXX" and m.store_timestamp >= t0]


def test_options_cannot_be_misspelt_and_times_may_be_iso(spark, mixed):
    """An unknown option is an error naming the valid ones (``topic`` for
    ``topics`` read everything before); a directory above ``store/`` is an
    error pointing below; store-time bounds take ISO-8601 as the CLI does."""
    with pytest.raises(Exception, match=r"unknown option\(s\) 'topic'.*valid: .*topics"):
        spark.read.format("rmqstore").option("topic", "TopicA").load(str(mixed)).count()
    with pytest.raises(Exception, match="unknown option"):
        spark.range(1).selectExpr("'T' AS topic", "'x' AS body").write.format("rmqstore").mode("append") \
            .option("storehost", "1.2.3.4:1").option("lockTimeOut", "1").option("config.maxIndexNum", "400") \
            .option("bodies", "x").save(str(mixed.parent / "out-misspelt"))
    assert not (mixed.parent / "out-misspelt").exists()  # (refused before anything was written)
    with pytest.raises(Exception, match=f"no rmqstore / RocketMQ store in {mixed.parent}.*the store is in {mixed}"):
        spark.read.format("rmqstore").load(str(mixed.parent)).count()
    msgs = plain_rows(mixed)
    t0 = msgs[100].store_timestamp
    iso = datetime.datetime.fromtimestamp(t0 / 1000, datetime.timezone.utc).isoformat(timespec="milliseconds")
    by_iso = spark.read.format("rmqstore").option("minStoreTimestamp", iso).load(str(mixed))
    by_ms = spark.read.format("rmqstore").option("minStoreTimestamp", str(t0)).load(str(mixed))
    assert by_iso.count() == by_ms.count() == sum(1 for m in msgs if m.store_timestamp >= t0)
    with pytest.raises(Exception, match="option maxStoreTimestamp: not a time: 'yesterday'"):
        spark.read.format("rmqstore").option("maxStoreTimestamp", "yesterday").load(str(mixed)).count()


def test_sql_filter_pushdown_prunes_files_when_the_session_allows(spark, mixed):
    with pushdown(spark):
        _sql_filter_pushdown_prunes_files(spark, mixed)


def _sql_filter_pushdown_prunes_files(spark, mixed):
    msgs = plain_rows(mixed)
    lo, hi = msgs[50].physical_offset, msgs[120].physical_offset
    df = spark.read.format("rmqstore").option("schema", "narrow").option("splitBytes", FILE).load(str(mixed))
    t = msgs[60].store_timestamp
    q = df.where(f"physical_offset >= {lo} AND physical_offset < {hi} AND queue_id IN (0, 2) AND topic = 'TopicA'"
                 f" AND store_timestamp >= timestamp_millis({t})")
    parts = q.rdd.getNumPartitions()
    got = [r.physical_offset for r in q.select("physical_offset").orderBy("physical_offset").collect()]
    off = spark.read.format("rmqstore").option("schema", "narrow").option("pushdown", "false") \
        .option("splitBytes", FILE).load(str(mixed))
    everything = off.where(f"physical_offset >= {lo}").rdd.getNumPartitions()
    assert parts < len(os.listdir(mixed / "commitlog")) == everything  # (pushdown=false: every file)
    assert got == [m.physical_offset for m in msgs if lo <= m.physical_offset < hi and m.queue_id in (0, 2)
                   and m.topic == "TopicA" and m.store_timestamp >= t]
    assert got


# --- writing ---------------------------------------------------------------------------------------


def test_write_round_trip_is_byte_identical(spark, mixed, tmp_path):
    out = tmp_path / "copy"
    # camelCase (RocketMQ's names) and snake_case option names both work
    sizes = {"config.mappedFileSizeCommitLog": SMALL["mapped_file_size_commit_log"],
             "config.mapped_file_size_consume_queue": SMALL["mapped_file_size_consume_queue"],
             "config.maxHashSlotNum": SMALL["max_hash_slot_num"], "config.maxIndexNum": SMALL["max_index_num"]}
    df = spark.read.format("rmqstore").load(str(mixed))
    df.write.format("rmqstore").mode("overwrite").options(**sizes).save(str(out))
    assert tree(out, "commitlog") == tree(mixed, "commitlog")
    assert tree(out, "consumequeue") == tree(mixed, "consumequeue")
    assert index_contents(out) == index_contents(mixed)
    assert not glob.glob(str(tmp_path / ".copy.rmqstore-*"))


def test_rows_keep_their_store_time_and_the_others_get_the_clock(spark, tmp_path):
    """A row's store_timestamp is its record's store time; a null one (or
    no such column) takes the wall clock at the put, in the rows' order."""
    t0, t1 = 1_600_000_000_000, 1_600_000_000_123
    rows = [("T", b"a", t0), ("T", b"b", None), ("T", b"c", t1), ("T", b"d", t1), ("T", b"e", t0), ("T", b"f", None)]
    mixed_times = spark.createDataFrame(rows, "topic string, body binary, store_timestamp long").coalesce(1)
    before = int(time.time() * 1000)
    mixed_times.write.format("rmqstore").mode("overwrite").save(str(tmp_path / "a"))
    mixed_times.drop("store_timestamp").write.format("rmqstore").mode("append").save(str(tmp_path / "a"))
    after = int(time.time() * 1000)
    got = [(m.body, m.store_timestamp) for m in plain_rows(tmp_path / "a")]
    assert [b for b, _ in got] == [b"a", b"b", b"c", b"d", b"e", b"f"] * 2
    assert [t for _, t in got[:6]][0::2] == [t0, t1, t0] and got[3][1] == t1
    clocked = [t for i, (_, t) in enumerate(got) if i in (1, 5) or i >= 6]
    assert all(before <= t <= after for t in clocked) and clocked == sorted(clocked)


def test_append_routes_rows_by_broker(spark, tmp_path):
    out = tmp_path / "stores"
    df = spark.read.format("rmqstore").option("schema", "full").load(
        [str(golden_store("tiny")), str(golden_store("basic"))]
    ).select("broker", "topic", "queue_id", "body", "properties", "tags", "keys", "unique_key")
    # not 1 GiB CommitLog files for a test (64 KiB: basic has a 30000-byte body)
    small = {f"config.{k}": v for k, v in {**SMALL, "mapped_file_size_commit_log": 65536}.items()}
    for _ in range(2):
        df.write.format("rmqstore").mode("append").option("brokerDirs", "true").options(**small).save(str(out))
    assert sorted(os.listdir(out)) == ["basic", "tiny"]
    for name in ("tiny", "basic"):
        src = [m for m in plain_rows(golden_store(name))]
        got = plain_rows(out / name)
        assert [m.body for m in got] == [m.body for m in src] * 2
        assert [m.topic for m in got] == [m.topic for m in src] * 2
        # sys_flag was not selected: every row became a plain message with a
        # queue offset, and the offsets go on across the two appends
        with MessageStore.open(out / name, read_only=True) as st:
            for (topic, qid) in {(m.topic, m.queue_id) for m in src}:
                n = sum(1 for m in src if (m.topic, m.queue_id) == (topic, qid))
                assert st.get_max_offset_in_queue(topic, qid) == 2 * n
                assert [m.queue_offset for m in got if (m.topic, m.queue_id) == (topic, qid)] == list(range(2 * n))


def test_failed_write_leaves_target_as_it_was_and_overwrite_replaces(spark, tmp_path):
    target = copy_golden_store("tiny", tmp_path / "target")
    before = file_hashes(target)
    bad = spark.createDataFrame(
        [("T", b"a"), (None, b"b")], "topic string, body binary"
    ).repartition(2)
    for mode in ("append", "overwrite"):
        with pytest.raises(Exception, match="no topic"):
            bad.write.format("rmqstore").mode(mode).save(str(target))
        assert file_hashes(target) == before
    # a row only the store refuses (a record larger than a 4 KiB CommitLog file):
    # an append checks every row in its commit before it writes any, an
    # overwrite's task fails as it puts the row into its part store
    huge = spark.createDataFrame([("T", b"ok"), ("T", b"x" * 5000)], "topic string, body binary").coalesce(1)
    for mode in ("append", "overwrite"):
        with pytest.raises(Exception, match="cannot fit"):
            huge.write.format("rmqstore").mode(mode).save(str(target))
        assert file_hashes(target) == before
    assert sorted(os.listdir(tmp_path)) == ["target"]  # no staged data left behind
    good = spark.createDataFrame([("T", b"new", 3)], "topic string, body binary, queue_id int")
    good.write.format("rmqstore").mode("overwrite").save(str(target))
    got = plain_rows(target)
    assert [(m.topic, m.body, m.queue_id) for m in got] == [("T", b"new", 3)]
    # the golden store's file sizes are kept for the new store
    assert os.listdir(target / "commitlog") == ["00000000000000000000"]
    assert os.path.getsize(target / "commitlog" / "00000000000000000000") == 4096
    assert sorted(os.listdir(tmp_path)) == ["target"]


# --- rebuild jobs --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tiny", "basic"])
def test_rebuild_golden_is_byte_identical_to_rocketmq(spark, tmp_path, name):
    from rmqstore.spark import rebuild_consume_queues, rebuild_index

    root = copy_golden_store(name, tmp_path / name)
    shutil.rmtree(root / "consumequeue")
    shutil.rmtree(root / "index")
    # with the files gone, their sizes come from the store config RocketMQ ran with
    config = load_dump(name)["storeConfig"]
    rep = rebuild_consume_queues(spark, root, config=config)
    assert tree(root, "consumequeue") == tree(golden_store(name), "consumequeue")
    assert rep["units"] == sum(1 for m in plain_rows(root) if m.transaction_type in (0, 8))
    rep = rebuild_index(spark, root, config=config)
    assert index_contents(root) == index_contents(golden_store(name))
    assert rep["files"] == len(os.listdir(golden_store(name) / "index"))
    assert not [n for n in os.listdir(root) if ".rebuild-" in n]


def test_rebuild_matches_store_and_local_rebuild(spark, mixed, tmp_path):
    from rmqstore.cli import main

    spark_copy = tmp_path / "spark"
    local_copy = tmp_path / "local"
    for d in (spark_copy, local_copy):
        shutil.copytree(mixed, d)
        shutil.rmtree(d / "consumequeue")
        shutil.rmtree(d / "index")
    recover_store(local_copy, StoreConfig(**SMALL))  # the local rebuild: recovery re-dispatches
    props = tmp_path / "broker.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in SMALL.items()))
    assert main(["spark", "rebuild-cq", str(spark_copy), "--config", str(props)]) == 0
    assert main(["spark", "rebuild-index", str(spark_copy), "--config", str(props)]) == 0
    assert tree(spark_copy, "consumequeue") == tree(mixed, "consumequeue") == tree(local_copy, "consumequeue")
    assert index_contents(spark_copy) == index_contents(mixed) == index_contents(local_copy)
    assert len(index_contents(mixed)) > 2


def test_rebuild_refuses_a_store_open_for_writing(spark, tmp_path, capsys):
    from rmqstore.cli import main
    from rmqstore.spark import rebuild_consume_queues

    root = copy_golden_store("tiny", tmp_path / "s")
    before = file_hashes(root / "consumequeue")
    with MessageStore.open(root, config=load_dump("tiny")["storeConfig"]):
        with pytest.raises(StoreLockedError):
            rebuild_consume_queues(spark, root)
        assert main(["spark", "rebuild-cq", str(root)]) == 2
    assert "open for writing" in capsys.readouterr().err
    # a writer in another process holds the fcntl lock
    holder = subprocess.Popen(
        [sys.executable, "-c", "import json, sys; from rmqstore import MessageStore; "
         "s = MessageStore.open(sys.argv[1], config=json.loads(sys.argv[2])); "
         "print('ready', flush=True); sys.stdin.read(); s.close()",
         str(root), json.dumps(load_dump("tiny")["storeConfig"])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(StoreLockedError, match="another process"):
            rebuild_consume_queues(spark, root)
    finally:
        holder.communicate("", timeout=60)
    assert file_hashes(root / "consumequeue") == before


# --- streaming -----------------------------------------------------------------------------------


def test_stream_reads_new_records_of_a_live_store(spark, tmp_path):
    root = tmp_path / "live"
    cfg = StoreConfig(**SMALL)
    with MessageStore.open(root, config=cfg, clock=StepClock()) as st:
        st.put_messages([Message("T", f"a{i}".encode() * 300, queue_id=i % 2) for i in range(30)])
        stream = (
            spark.readStream.format("rmqstore").option("schema", "narrow").load(str(root))
            .writeStream.format("memory").queryName("rmq_live").start()
        )
        try:
            stream.processAllAvailable()
            first = spark.sql("SELECT count(*) AS n FROM rmq_live").first().n
            st.put_messages([Message("U", f"b{i}".encode() * 300) for i in range(25)])
            stream.processAllAvailable()
            got = [(r.topic, r.physical_offset) for r in
                   spark.sql("SELECT topic, physical_offset FROM rmq_live ORDER BY physical_offset").collect()]
        finally:
            stream.stop()
        want = [(m.topic, m.physical_offset) for m in st.iter_messages()]
    assert first == 30
    assert got == want and len(os.listdir(root / "commitlog")) > 2


def _zero_header(root, m) -> None:
    """Zero the first 8 bytes of message *m*'s record: damage with valid records after it."""
    seg = max((n for n in os.listdir(root / "commitlog") if int(n) <= m.physical_offset), key=int)
    with open(root / "commitlog" / seg, "r+b") as fh:
        fh.seek(m.physical_offset - int(seg))
        fh.write(bytes(8))


def test_lookups_by_key_unique_key_and_msg_id_are_served_by_the_index(spark, mixed):
    """Equalities (and IN) on keys, unique_key and msg_id are answered
    through the store's indexes: one task reads the few records found (plus
    any tail the index does not cover), and the rows are the scan's
    (pushdown=false) exactly."""
    with pushdown(spark):
        _lookups_are_served_by_the_index(spark, mixed)


def _lookups_are_served_by_the_index(spark, mixed):
    from pyspark.sql.datasource import EqualTo

    from rmqstore.spark.source import RmqStoreReader, _PushdownReader

    rows = plain_rows(mixed)
    withkeys = [m for m in rows if m.keys and m.sys_flag & 0x0C != 0x0C]
    schema = spark.read.format("rmqstore").load(str(mixed)).schema
    reader = _PushdownReader({"path": str(mixed)}, schema)
    assert len(list(reader.pushFilters([EqualTo(("unique_key",), rows[10].unique_key)]))) == 1  # Spark checks it too
    [part] = reader.partitions()
    every_split = [s for p in RmqStoreReader({"path": str(mixed)}, schema).partitions() for s in p.value["splits"]]
    assert 1 <= len(part.value["lookup"]) < len(every_split)
    assert {s[3] + s[2] for s in part.value["lookup"]} >= {rows[10].physical_offset}
    on = spark.read.format("rmqstore").option("schema", "narrow").load(str(mixed))
    off = spark.read.format("rmqstore").option("schema", "narrow").option("pushdown", "false") \
        .option("splitBytes", FILE).load(str(mixed))
    for where in (
        f"unique_key = '{rows[10].unique_key}'",
        f"unique_key IN ('{rows[10].unique_key}', '{rows[40].unique_key}', 'no-such-key')",
        f"keys = '{withkeys[3].keys}' AND topic = '{withkeys[3].topic}'",
        "keys = 'shared'",  # (a key of many records, never a whole keys value)
        f"msg_id = '{rows[7].msg_id}'",
        "keys = '   '",  # (no key to look up: a scan)
    ):
        got = sorted(r.physical_offset for r in on.where(where).select("physical_offset").collect())
        assert got == sorted(r.physical_offset for r in off.where(where).select("physical_offset").collect()), where
        if "'   '" not in where:
            assert on.where(where).rdd.getNumPartitions() <= 1, where
    assert on.where(f"unique_key = '{rows[10].unique_key}'").count() == 1


def test_rebuilds_at_damage_fail_skip_or_stop(spark, tmp_path, mixed):
    """The rebuild jobs take onCorrupt as the reads do: by default they fail
    naming the offset and leave the store as it was; "skip" rebuilds every
    other record's unit and keys and counts the damaged region; "stop" ends
    that split there."""
    from rmqstore.exceptions import CorruptedFileError
    from rmqstore.spark import rebuild_consume_queues, rebuild_index

    cfg = StoreConfig(**SMALL)
    clean = tmp_path / "clean"
    shutil.copytree(mixed, clean)
    full = (rebuild_consume_queues(spark, clean, cfg), rebuild_index(spark, clean, cfg))
    root = tmp_path / "store"
    shutil.copytree(mixed, root)
    with MessageStore.open(root, read_only=True) as st:
        msgs = list(st.iter_messages())
    victim = msgs[len(msgs) // 3]
    assert victim.keys and not victim.sys_flag & 0x0C  # (a plain message: a unit and index entries)
    _zero_header(root, victim)
    before = tree(root, "consumequeue"), index_contents(root)
    for job in (rebuild_consume_queues, rebuild_index):
        with pytest.raises(CorruptedFileError, match=f"physical offset {victim.physical_offset}"):
            job(spark, root, cfg)
    assert (tree(root, "consumequeue"), index_contents(root)) == before
    assert not [n for n in os.listdir(root) if ".rebuild-" in n]
    cq = rebuild_consume_queues(spark, root, cfg, on_corrupt="skip")
    ix = rebuild_index(spark, root, cfg, on_corrupt="skip")
    assert cq["units"] == full[0]["units"] - 1
    assert full[1]["entries"] - ix["entries"] == 1 + len(victim.keys.split())  # its UNIQ_KEY and keys
    for rep in (cq, ix):
        assert (rep["skipped_records"], rep["skipped_bytes"]) == (1, victim.store_size)
    assert full[0]["skipped_records"] == full[1]["skipped_records"] == 0
    stopped = rebuild_consume_queues(spark, root, cfg, on_corrupt="stop")
    assert stopped["units"] < cq["units"] and stopped["skipped_records"] == 0
    with pytest.raises(ValueError, match="on_corrupt"):
        rebuild_consume_queues(spark, root, cfg, on_corrupt="ignore")
    from rmqstore.cli import main

    props = tmp_path / "broker.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in SMALL.items()))
    assert main(["spark", "rebuild-cq", str(root), "--broker-conf", str(props)]) == 3  # damage
    assert main(["spark", "rebuild-cq", str(root), "--broker-conf", str(props), "--on-corrupt", "skip"]) == 0


def test_damage_is_never_silent_in_a_query(spark, tmp_path, mixed):
    """A zeroed record header inside the data: the default read fails naming
    the offset, onCorrupt=skip reads every other record, stop ends the
    partition there (it used to end the split silently)."""
    root = tmp_path / "broker-x" / "store"
    shutil.copytree(mixed, root)
    with MessageStore.open(root, read_only=True) as st:
        msgs = list(st.iter_messages())
    victim = msgs[len(msgs) // 3]
    _zero_header(root, victim)
    with pytest.raises(Exception, match=f"damaged record at physical offset {victim.physical_offset}"):
        spark.read.format("rmqstore").option("schema", "narrow").load(str(root)).count()
    skipped = spark.read.format("rmqstore").option("schema", "narrow").option("onCorrupt", "skip").load(str(root))
    assert sorted(r.physical_offset for r in skipped.select("physical_offset").collect()) == [
        m.physical_offset for m in msgs if m is not victim]
    stopped = spark.read.format("rmqstore").option("onCorrupt", "stop").load(str(root)).count()
    assert stopped < len(msgs) - 1
    with pytest.raises(Exception, match="onCorrupt must be one of fail, skip, stop"):
        spark.read.format("rmqstore").option("onCorrupt", "ignore").load(str(root)).count()


def test_stream_limits_a_batch_and_fails_at_damage(tmp_path):
    """maxRecordsPerTrigger bounds each micro-batch; a damaged record fails
    the stream's next offset (onCorrupt=fail) or is skipped, never stalls it."""
    from rmqstore.exceptions import CorruptedFileError
    from rmqstore.spark.source import RmqStoreStreamReader, spark_schema

    root = tmp_path / "b1" / "store"
    with MessageStore.open(root, config=StoreConfig(**SMALL)) as st:
        st.put_messages([Message("T", b"m%d" % i) for i in range(25)])
        msgs = list(st.iter_messages())
    opts = {"path": str(root), "schema": "narrow", "maxRecordsPerTrigger": "10"}
    reader = RmqStoreStreamReader(opts, spark_schema(["topic"]))
    start = reader.initialOffset()
    ends = []
    for _ in range(4):
        end = reader.latestOffset(start, None)
        ends.append(end["b1"])
        start = end
    after = [m.physical_offset + m.store_size for m in msgs]
    assert ends == [after[9], after[19], after[24], after[24]]
    with pytest.raises(ValueError, match="maxRecordsPerTrigger"):
        RmqStoreStreamReader({**opts, "maxRecordsPerTrigger": "0"}, spark_schema(["topic"]))
    _zero_header(root, msgs[12])
    reader = RmqStoreStreamReader({**opts, "maxRecordsPerTrigger": "100"}, spark_schema(["topic"]))
    with pytest.raises(CorruptedFileError) as e:
        reader.latestOffset(reader.initialOffset(), None)
    assert e.value.offset == msgs[12].physical_offset
    skipping = RmqStoreStreamReader({**opts, "onCorrupt": "skip", "maxRecordsPerTrigger": "100"},
                                    spark_schema(["topic"]))
    assert skipping.latestOffset(skipping.initialOffset(), None) == {"b1": after[-1]}


def test_cli_help_lists_the_jobs(capsys):
    from rmqstore.spark.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "rebuild-cq" in out and "rebuild-index" in out


def test_stream_offsets_start_latest_and_follow_the_end(tmp_path):
    """The stream reader's offset logic, driven directly (no query)."""
    from rmqstore.spark.source import RmqStoreStreamReader, spark_schema

    root = tmp_path / "b1" / "store"
    with MessageStore.open(root, config=StoreConfig(**SMALL)) as st:
        st.put_messages([Message("T", b"old" * 2000) for _ in range(10)])
        old_end = st.max_physical_offset
        opts = {"path": str(root), "startingOffsets": "latest", "schema": "narrow"}
        reader = RmqStoreStreamReader(opts, spark_schema(["topic", "body"]))
        start = reader.initialOffset()
        assert start == {"b1": old_end}
        assert reader.latestOffset(start, None) == start  # nothing new
        st.put_messages([Message("T", b"new%d" % i) for i in range(3)])
        end = reader.latestOffset(start, None)
        assert end == {"b1": st.max_physical_offset}
        bodies = [b for p in reader.partitions(start, end) for batch in reader.read(p)
                  for b in batch.column("body").to_pylist()]
        assert bodies == [b"new0", b"new1", b"new2"]
        earliest = RmqStoreStreamReader({**opts, "startingOffsets": "earliest"}, spark_schema(["topic"]))
        assert earliest.initialOffset() == {"b1": 0}
        with pytest.raises(ValueError):
            RmqStoreStreamReader({**opts, "startingOffsets": "soon"}, spark_schema(["topic"]))


# --- storage every host shares -------------------------------------------------------------------


def test_a_task_stages_less_than_the_records_it_becomes(mixed, tmp_path):
    """An append's task keeps only a message's columns (not a read's
    offsets, sizes and ids) and compresses them: rows read from a store
    stage in fewer bytes than that store's records. An overwrite's task
    puts them into a part store instead, whose records are the output's."""
    from rmqstore import arrow
    from rmqstore.spark.source import RmqStoreWriter, spark_schema

    table = arrow.read_table(str(mixed))
    w = RmqStoreWriter({"path": str(tmp_path / "out")}, spark_schema(), overwrite=False)
    staged = w.write(iter(table.to_batches(100)))
    [(_store, path, rows, size, _cfg)] = staged.files
    assert rows == table.num_rows and os.path.getsize(path) == size
    assert size < sum(table.column("store_size").to_pylist())
    w.abort([staged])
    assert not os.path.exists(w.staging)

    w = RmqStoreWriter({"path": str(tmp_path / "out")}, spark_schema(), overwrite=True)
    staged = w.write(iter(table.to_batches(100)))
    [(_store, path, rows, _size, cfg)] = staged.files
    assert rows == table.num_rows and cfg is not None
    assert [m.body for m in plain_rows(path)] == table.column("body").to_pylist()
    w.abort([staged])
    assert not os.path.exists(w.staging)


def test_an_overwrite_by_broker_joins_each_store_from_its_own_parts(tmp_path):
    """brokerDirs=true with overwrite: a task puts each broker's rows into a
    part store of that broker; the commit joins each broker's parts into its
    store (here two tasks' worth, in partition order)."""
    import pyarrow as pa

    from rmqstore.spark.source import RmqStoreWriter, _Staged, spark_schema

    small = {f"config.{k}": v for k, v in SMALL.items()}
    w = RmqStoreWriter({"path": str(tmp_path / "out"), "brokerDirs": "true", **small},
                       spark_schema(("broker", "topic", "body", "keys")), overwrite=True)

    def task(rows):
        batch = pa.RecordBatch.from_pylist(rows, schema=pa.schema(
            [("broker", pa.string()), ("topic", pa.string()), ("body", pa.binary()), ("keys", pa.string())]))
        return w.write(iter([batch]))

    first = task([{"broker": b, "topic": "T", "body": f"{b}{i}".encode(), "keys": f"k{i}"}
                  for i in range(50) for b in ("b1", "b2")])
    # a second task (outside Spark every task is partition 0: rename its parts)
    moved = []
    for store, path, rows, size, cfg in first.files:
        os.rename(path, path + "-first")
        moved.append((store, path + "-first", rows, size, cfg))
    first = _Staged(0, moved)
    second = task([{"broker": "b2", "topic": "T", "body": f"late{i}".encode(), "keys": "late"} for i in range(30)])
    second = _Staged(1, second.files)
    w.commit([second, first])
    assert sorted(os.listdir(tmp_path / "out")) == ["b1", "b2"]
    assert [m.body for m in plain_rows(tmp_path / "out" / "b1")] == [f"b1{i}".encode() for i in range(50)]
    b2 = plain_rows(tmp_path / "out" / "b2")
    assert [m.body for m in b2] == [f"b2{i}".encode() for i in range(50)] + [f"late{i}".encode() for i in range(30)]
    assert [m.queue_offset for m in b2] == list(range(80))
    with MessageStore.open(tmp_path / "out" / "b2", config=StoreConfig(**SMALL)) as st:
        assert len(st.query_messages("T", "late", 100, 0, 1 << 62)) == 30
    assert not os.path.exists(w.staging)


def test_an_overwrite_whose_parts_hold_fewer_records_than_put_fails(tmp_path):
    """A shared file system that shows the driver a part with its files
    whole but stale contents: the join counts fewer records than the tasks
    put, and the commit fails with the target unchanged."""
    import pyarrow as pa

    from rmqstore.exceptions import OutputNotVisibleError
    from rmqstore.spark.source import RmqStoreWriter, _Staged, spark_schema

    target = copy_golden_store("tiny", tmp_path / "target")
    before = file_hashes(target)
    w = RmqStoreWriter({"path": str(target)}, spark_schema(("topic", "body")), overwrite=True)
    staged = w.write(iter([pa.RecordBatch.from_pydict({"topic": ["T", "T"], "body": [b"a", b"b"]})]))
    (store, path, rows, size, cfg), = staged.files
    with pytest.raises(OutputNotVisibleError, match="put 3 rows"):
        w.commit([_Staged(0, [(store, path, rows + 1, size, cfg)])])
    assert file_hashes(target) == before
    assert sorted(os.listdir(tmp_path)) == ["target"]


def test_relative_paths_are_made_absolute_on_the_driver(mixed, monkeypatch):
    """An executor resolves a relative path in its own working directory:
    the reader and the writer name stores absolutely before any task runs."""
    from rmqstore.spark.source import RmqStoreReader, RmqStoreWriter, spark_schema

    monkeypatch.chdir(mixed.parent)
    r = RmqStoreReader({"path": "store"}, spark_schema())
    assert r.paths == [str(mixed)]
    assert {arrow_split[1] for p in r.partitions() for arrow_split in p.value["splits"]} <= {
        str(mixed / "commitlog" / n) for n in os.listdir(mixed / "commitlog")}
    w = RmqStoreWriter({"path": "elsewhere"}, spark_schema(("topic", "body")), overwrite=True)
    assert w.target == str(mixed.parent / "elsewhere") and os.path.isabs(w.staging)


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_write_whose_staged_rows_the_driver_cannot_see_fails_and_changes_nothing(tmp_path, overwrite):
    """Executors that do not share the driver's disk stage rows the commit
    cannot see (missing, or another size): OutputNotVisibleError before the
    store changes, and the driver's staging is gone."""
    import pyarrow as pa

    from rmqstore.exceptions import OutputNotVisibleError
    from rmqstore.spark.source import RmqStoreWriter, spark_schema

    target = copy_golden_store("tiny", tmp_path / "target")
    before = file_hashes(target)
    batch = pa.RecordBatch.from_pydict({"topic": ["T", "T"], "body": [b"a", b"b"]})
    for seen in ("missing", "short"):
        w = RmqStoreWriter({"path": str(target)}, spark_schema(("topic", "body")), overwrite=overwrite)
        staged = w.write(iter([batch]))  # (outside Spark: partition 0)
        (store, path, rows, _size, cfg), = staged.files
        assert (store, rows) == (str(target), 2)
        # an append stages Arrow rows, an overwrite a part store
        assert os.path.isdir(path) == overwrite and (cfg is not None) == overwrite
        if seen == "missing":
            shutil.rmtree(path) if overwrite else os.remove(path)  # written on another host's disk
        else:
            victim = os.path.join(path, "commitlog", "0" * 20) if overwrite else path
            os.truncate(victim, os.path.getsize(victim) - 1)
        with pytest.raises(OutputNotVisibleError, match="do not share this disk"):
            w.commit([staged])
        assert file_hashes(target) == before
        assert sorted(os.listdir(tmp_path)) == ["target"]


def test_rebuilds_of_a_uri_store_match_the_local_rebuilds(spark, mixed, s3_server, tmp_path):
    """Both rebuilds of a store on S3 write what they write locally (the
    index geometry inferred from the files' size), and leave no staging."""
    from rmqstore.spark import rebuild_consume_queues, rebuild_index
    from rmqstore.storage import uri

    u = s3_server.uri("rebuild/broker-x/store")
    uri.upload(str(mixed), u)
    uri.delete_dir(uri.join(u, "consumequeue"))  # (a CommitLog-only copy)
    with MessageStore.open(mixed, read_only=True) as st:
        units = sum(st.get_max_offset_in_queue(t, q) for t, q in st.queues())
    # (the files' size comes from config: the copy has no ConsumeQueue to tell it)
    assert rebuild_consume_queues(spark, u, config=StoreConfig(**SMALL))["units"] == units
    with pytest.raises(ConfigError, match=r"index files of s3://\*\*\*@rmqstore-tests/.*fit no known geometry"):
        rebuild_index(spark, u)  # (SMALL's geometry is no default: it cannot be told from the size)
    assert rebuild_index(spark, u, config=StoreConfig(**SMALL))["files"] == len(os.listdir(mixed / "index"))
    got = tmp_path / "got"
    uri.download(u, str(got))
    assert tree(got, "consumequeue") == tree(mixed, "consumequeue")
    assert index_contents(got) == index_contents(mixed)
    assert tree(got, "commitlog") == tree(mixed, "commitlog")
    assert sorted(os.listdir(got)) == sorted(os.listdir(mixed))  # (no staging left)


def test_s3_store_reads_writes_and_appends(spark, mixed, s3_server):
    """A store on S3 (an S3-compatible server, endpoint and keys in the URI)
    reads as its local copy, a lookup by key included; a write and an
    append to S3 give the local round trip's CommitLog, byte for byte."""
    from rmqstore.storage import uri

    u = s3_server.uri("spark/broker-x/store")
    uri.upload(str(mixed), u)
    local = spark.read.format("rmqstore").load(str(mixed))
    remote = spark.read.format("rmqstore").option("splitBytes", 4096).load(u)
    assert rows_by_offset(remote) == rows_by_offset(local)
    key = plain_rows(mixed)[40].keys.split()[0]
    assert rows_by_offset(remote.where(remote["keys"].contains(key) & (remote["keys"] == plain_rows(mixed)[40].keys))) \
        == rows_by_offset(local.where(local["keys"] == plain_rows(mixed)[40].keys))
    out = s3_server.uri("spark/written")
    sizes = {"config." + k: v for k, v in SMALL.items()}
    local.write.format("rmqstore").mode("overwrite").options(**sizes).save(out)
    with tempfile.TemporaryDirectory() as tmp:
        uri.download(out, tmp)
        assert tree(tmp, "commitlog") == tree(mixed, "commitlog")
        assert tree(tmp, "consumequeue") == tree(mixed, "consumequeue")
    spark.createDataFrame([("T", b"more")], "topic string, body binary").write.format("rmqstore") \
        .mode("append").save(out)
    back = plain_rows_of_uri(out)
    assert len(back) == len(plain_rows(mixed)) + 1 and (back[-1].topic, back[-1].body) == ("T", b"more")
    # no staged data left beside it
    assert [n for n, _d, _s in uri.list_dir(s3_server.uri("spark")) if "rmqstore-write" in n] == []


def plain_rows_of_uri(u: str) -> list:
    from rmqstore.storage import uri

    with tempfile.TemporaryDirectory() as tmp:
        uri.download(u, tmp)
        return plain_rows(tmp)


def test_lookup_options_read_only_the_matching_records_through_the_index(spark, mixed):
    """lookupKeys (RocketMQ's query by key: one of KEYS, or UNIQ_KEY),
    lookupUniqueKeys and lookupMsgIds: the rows are exactly the scan's
    matches that RocketMQ indexes (not rollbacks), read by one task; being
    options they hold for every query of the DataFrame, pushdown or not."""
    rows = plain_rows(mixed)
    indexed = [m for m in rows if (m.sys_flag & 12) != 12]

    def offsets(df):
        return [r.physical_offset for r in df.select("physical_offset").orderBy("physical_offset").collect()]

    picks = [m for m in indexed if m.keys][3:5]
    uks = [m.unique_key for m in indexed if m.unique_key]
    cases = {
        "lookupKeys": ("shared," + picks[0].keys.split()[0] + "," + uks[5],
                       lambda m, v: bool(set(v) & set((m.keys or "").split())) or m.unique_key in v),
        "lookupUniqueKeys": (f"{uks[2]}, {uks[40]}", lambda m, v: m.unique_key in v),
        "lookupMsgIds": (f"{picks[1].msg_id},{indexed[7].msg_id}", lambda m, v: m.msg_id in v),
    }
    for name, (raw, match) in cases.items():
        values = [v.strip() for v in raw.split(",")]
        want = [m.physical_offset for m in indexed if match(m, values)]
        assert len(want) >= 2
        df = spark.read.format("rmqstore").option(name, raw).option("columns", "physical_offset,topic").load(str(mixed))
        assert df.rdd.getNumPartitions() == 1
        assert offsets(df) == want
        assert df.count() == len(want) and df.where("topic = 'TopicA'").count() == sum(
            1 for m in indexed if match(m, values) and m.topic == "TopicA") and offsets(df) == want
        with pushdown(spark):
            assert offsets(df.where(f"physical_offset >= {want[1]}")) == want[1:]
    with pytest.raises(Exception, match="lookupKeys and lookupMsgIds cannot be combined"):
        spark.read.format("rmqstore").option("lookupKeys", "a").option("lookupMsgIds", "b").load(str(mixed)).count()
    with pytest.raises(Exception, match="option lookupUniqueKeys names no value"):
        spark.read.format("rmqstore").option("lookupUniqueKeys", " , ").load(str(mixed)).count()
    from rmqstore.spark.source import RmqStoreDataSource, spark_schema

    with pytest.raises(ValueError, match=r"unknown option\(s\) 'lookupKeys'"):  # (a stream cannot look up)
        RmqStoreDataSource({"path": str(mixed), "lookupKeys": "a"}).streamReader(spark_schema())
