"""Stores named by URI (``s3://``) read by byte ranges (rmqstore.arrow over
rmqstore.storage.uri), against an S3-compatible server the tests start
(moto). Every read is compared with the same read of the local copy: rows,
splits, damage reports. Spark's reads and writes of such stores are in
test_spark.py.
"""

from __future__ import annotations

import os
import shutil

import pytest

if os.environ.get("RMQSTORE_REQUIRE_SPARK") != "1":
    pytest.importorskip("pyarrow")

from conftest import golden_store
from rmqstore import arrow
from rmqstore.exceptions import CorruptedFileError
from rmqstore.storage import uri
from test_arrow import make_store, plain_rows


@pytest.fixture(scope="module")
def stores(tmp_path_factory, s3_server):
    """``{name: (local store, its copy's URI)}``: a golden store and a
    generated one of many small files."""
    out = {}
    mixed = tmp_path_factory.mktemp("uri") / "broker-x" / "store"
    make_store(mixed, count=600)
    for name, local in (("basic", golden_store("basic")), ("mixed", mixed)):
        u = s3_server.uri(f"stores/{name}/store")
        assert uri.upload(str(local), u) == sum(len(f) for _, _, f in os.walk(local))
        out[name] = (local, u)
    return out


def _without_broker(table):
    return table.drop_columns(["broker"])


def _ranges(splits: list) -> list:
    return [(s.file_offset, s.start, s.end) for s in splits]


@pytest.mark.parametrize("name", ["basic", "mixed"])
def test_a_uri_store_reads_as_its_local_copy(stores, name):
    local, u = stores[name]
    for split_bytes in (1 << 30, 4096):  # whole files; files cut at ConsumeQueue units
        assert _ranges(arrow.store_splits(u, split_bytes=split_bytes)) == \
            _ranges(arrow.store_splits(local, split_bytes=split_bytes))
        got = arrow.read_table(u, split_bytes=split_bytes)
        assert got.num_rows == len(plain_rows(local))
        assert _without_broker(got).equals(_without_broker(arrow.read_table(local, split_bytes=split_bytes)))
    # the broker is named from the URI's path as from a local one
    assert set(got.column("broker").to_pylist()) == {"basic" if name == "basic" else name}
    assert arrow.scan_end(u, 0) == arrow.scan_end(local, 0)
    assert arrow.min_offset(u) == arrow.min_offset(local)


def test_filters_prune_a_uri_store_as_a_local_one(stores):
    local, u = stores["mixed"]
    rows = plain_rows(local)
    mid = rows[len(rows) // 2].store_timestamp
    whole = len(arrow.store_splits(local, split_bytes=4096))
    for f in (arrow.ScanFilter(topics=frozenset({"TopicB"})),
              arrow.ScanFilter(min_store_timestamp=mid),
              arrow.ScanFilter(max_physical_offset=rows[100].physical_offset, queue_ids=frozenset({1}))):
        want = arrow.store_splits(local, split_bytes=4096, scan_filter=f)
        assert len(want) < whole or f.topics  # (each prunes, but every file holds TopicB)
        assert _ranges(arrow.store_splits(u, split_bytes=4096, scan_filter=f)) == _ranges(want)
        assert _without_broker(arrow.read_table(u, scan_filter=f, split_bytes=4096)).equals(
            _without_broker(arrow.read_table(local, scan_filter=f, split_bytes=4096)))
    # a lookup through the indexes is not served remotely: the scan's splits
    lookup = arrow.lookup_splits(u, "b", "keys", ["k7"])
    assert _ranges(lookup) == _ranges(arrow.store_splits(u))


def test_damage_in_a_uri_store_is_reported_where_it_is(tmp_path, stores, s3_server):
    """A zeroed record header in the middle of a split: the read fails at
    the same physical offset as the local read, naming the URI's file;
    skip reads the same rows past it; zeros at the end of a split read as
    a range are damage too (the next split starts at a record)."""
    local = tmp_path / "store"
    shutil.copytree(stores["mixed"][0], local)
    rows = plain_rows(local)
    victim = rows[len(rows) // 3]
    seg = max((n for n in os.listdir(local / "commitlog") if int(n) <= victim.physical_offset), key=int)
    with open(local / "commitlog" / seg, "r+b") as fh:
        fh.seek(victim.physical_offset - int(seg))
        fh.write(bytes(8))
    u = s3_server.uri("damaged/store")
    uri.upload(str(local), u)
    for split_bytes in (1 << 30, 4096):
        with pytest.raises(CorruptedFileError) as at_local:
            arrow.read_table(local, split_bytes=split_bytes)
        with pytest.raises(CorruptedFileError) as at_uri:
            arrow.read_table(u, split_bytes=split_bytes)
        assert at_uri.value.offset == at_local.value.offset
        assert f"physical offset {victim.physical_offset}" in str(at_uri.value)
        assert at_uri.value.path == uri.shown(uri.join(u, "commitlog", seg))
        assert "testing:testing" not in str(at_uri.value) and "***@" in at_uri.value.path
        stats_local: dict = {}
        stats_uri: dict = {}
        want = [b for s in arrow.store_splits(local, split_bytes=split_bytes)
                for b in arrow.read_split(s, on_corrupt="skip", stats=stats_local)]
        got = [b for s in arrow.store_splits(u, split_bytes=split_bytes)
               for b in arrow.read_split(s, on_corrupt="skip", stats=stats_uri)]
        assert sum(b.num_rows for b in got) == sum(b.num_rows for b in want) == len(rows) - 1
        assert stats_uri == stats_local and stats_uri["skipped_records"] == 1


def test_standard_environment_names_the_endpoint(stores, s3_server, monkeypatch):
    """No endpoint in the URI: AWS_ENDPOINT_URL and the key variables say where."""
    local, _u = stores["basic"]
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    uri._filesystem.cache_clear()  # (clients are kept per bucket: make one under this environment)
    try:
        plain = f"s3://{s3_server.bucket}/stores/basic/store"
        assert _without_broker(arrow.read_table(plain)).equals(_without_broker(arrow.read_table(local)))
    finally:
        uri._filesystem.cache_clear()


def test_no_store_at_a_uri_is_an_error(s3_server):
    with pytest.raises(FileNotFoundError, match="no store directory"):
        arrow.store_splits(s3_server.uri("nothing/here"))


def test_uri_names():
    assert uri.is_uri("s3://b/p") and uri.is_uri("hdfs://nn:8020/p") and uri.is_uri("gs://b")
    assert not uri.is_uri("/data/store") and not uri.is_uri("file:///data/store") and not uri.is_uri("rel/s3:x")
    q = "s3://k:s@b/a/store?endpoint_override=h:1&scheme=http"
    assert uri.join(q, "commitlog", "0") == "s3://k:s@b/a/store/commitlog/0?endpoint_override=h:1&scheme=http"
    assert uri.parent(q) == "s3://k:s@b/a?endpoint_override=h:1&scheme=http"
    assert uri.names(q) == ["b", "a", "store"]  # (no credentials in names)
    assert arrow.broker_name(q) == "a"
    assert uri.shown(q) == "s3://***@b/a/store?endpoint_override=h:1&scheme=http" and uri.shown("/x") == "/x"
    assert arrow.broker_name("s3://bucket/store") == "bucket"
    assert arrow.broker_name("s3://bucket/broker-b") == "broker-b"
